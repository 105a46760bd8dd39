"""The instance routing table ``profil/routing.yml`` (who actually talks to whom) and the brain's matrix.

Format (version 1)::

    version: 1
    default: matrix        # senders with no route keep their matrix rights; "deny": they send nothing
    routes:
      - from: ambient                    # one sender (a principal name, no wildcard)
        to: [deploy, tester]             # receivers; "*" = whoever the matrix allows
        signals: [SPAWN]                 # optional; absent or "*" = whatever the matrix allows
        zones: [project]                 # optional; absent = whatever the matrix allows
        note: "workflow steps"           # optional free text

A sender named in any ``from`` may only send along its routes; the gates still apply on top
(routes only narrow). An entry claiming something the matrix denies is an error (file:line) and is
not applied; its sender stays restricted, so a bad entry can only narrow further. A file that
cannot be read at all fails closed: every sender is restricted to nothing until it is fixed.

Also here: ``profil/zones.yml`` (a brain's own zone rules, ``zone: [prefix, ...]``) and
:func:`build_matrix`, which loads agents, zones and routing into the effective matrix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ambient.core.errors import InputError, UnsafePathError
from ambient.core.problems import Problem
from ambient.kernel.agents import AgentSpec, agent_gates, agent_scopes, read_agents, unknown_principals
from ambient.kernel.matrix import WILDCARD, AccessMatrix, Route, RoutingTable, apply_routing
from ambient.kernel.packet import NAME_PATTERN, ZONE_PATTERN, Signal
from ambient.kernel.zones import DEFAULT_RULES, ZoneRule, merge_rules, normalize
from ambient.storage.paths import BrainPaths
from ambient.storage.yamlfile import MAX_CONFIG_BYTES, LineMap, load_file, problems_from_validation


def _listify(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


class RouteEntry(BaseModel):
    """One ``routes:`` item as written in the file."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    from_: str = Field(alias="from", pattern=NAME_PATTERN)
    to: list[str] = Field(min_length=1)
    signals: list[str] | None = None
    zones: list[str] | None = None
    note: str | None = None

    _list = field_validator("to", "signals", "zones", mode="before")(_listify)

    @field_validator("to")
    @classmethod
    def _receivers(cls, v: list[str]) -> list[str]:
        for name in v:
            if name != WILDCARD and not re.match(NAME_PATTERN, name):
                raise ValueError(f"{name!r} is not a principal name or '*'")
        return v

    @field_validator("signals")
    @classmethod
    def _signals(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return None
        for s in v:
            if s != WILDCARD and s not in Signal.__members__:
                raise ValueError(f"{s!r} is not a signal; expected one of {', '.join(Signal)} or '*'")
        return v

    @field_validator("zones")
    @classmethod
    def _zones(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return None
        for z in v:
            if z != WILDCARD and not re.match(ZONE_PATTERN, z):
                raise ValueError(f"{z!r} is not a zone name")
        return v

    def to_route(self, *, file: str, line: int | None) -> Route:
        """The core :class:`~ambient.kernel.matrix.Route`."""
        signals = None
        if self.signals is not None and WILDCARD not in self.signals:
            signals = frozenset(Signal(s) for s in self.signals)
        zones = None if self.zones is None or WILDCARD in self.zones else frozenset(self.zones)
        return Route(self.from_, frozenset(self.to), signals, zones, file, line)


class _Header(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    default: Literal["matrix", "deny"] = "matrix"
    routes: list[Any] = Field(default_factory=list)


def parse_routing(data: Any, lines: LineMap, *, file: str) -> tuple[RoutingTable, list[Problem]]:
    """Build a routing table from a parsed document; a bad entry is a problem, the others still apply."""
    if data is None:
        return RoutingTable(file=file), []
    try:
        header = _Header.model_validate(data)
    except ValidationError as exc:
        bad = problems_from_validation(exc, file=file, lines=lines)
        bad.append(Problem(file=file, line=1, message="routing table unusable: every sender is restricted to nothing"))
        return RoutingTable(default_deny=True, file=file), bad
    problems: list[Problem] = []
    routes: list[Route] = []
    restricted: set[str] = set()
    for i, raw in enumerate(header.routes):
        line = lines.line_for(("routes", i))
        if isinstance(raw, dict) and isinstance(raw.get("from"), str):
            restricted.add(raw["from"])  # restricted even if the entry is bad: failing closed
        try:
            entry = RouteEntry.model_validate(raw)
        except ValidationError as exc:
            for err in exc.errors(include_url=False, include_input=False):
                loc = tuple(p for p in err["loc"] if isinstance(p, str | int))
                where = ".".join(str(p) for p in ("routes", i, *loc))
                problems.append(
                    Problem(
                        file=file,
                        line=lines.line_for(("routes", i, *loc)),
                        message=f"{where}: {err['msg']}; entry not applied",
                    )
                )
            continue
        routes.append(entry.to_route(file=file, line=line))
    table = RoutingTable(
        routes=tuple(routes),
        restricted=frozenset(restricted),
        default_deny=header.default == "deny",
        file=file,
    )
    return table, problems


def load_routing(paths: BrainPaths) -> tuple[RoutingTable | None, list[Problem]]:
    """Read ``profil/routing.yml``; (None, []) when the brain has none."""
    path = paths.routing
    if not path.exists() and not path.is_symlink():
        return None, []
    file = paths.rel(path)
    try:
        data, lines = load_file(path, max_bytes=MAX_CONFIG_BYTES, source=file)
    except InputError as exc:
        return RoutingTable(default_deny=True, file=file), [
            Problem(file=file, line=exc.line, message=exc.message),
            Problem(file=file, message="routing table unusable: every sender is restricted to nothing until fixed"),
        ]
    return parse_routing(data, lines, file=file)


def load_zone_rules(paths: BrainPaths) -> tuple[tuple[ZoneRule, ...], list[Problem]]:
    """The default zone rules merged with ``profil/zones.yml`` (``zone: [prefix, ...]``), if any."""
    path = paths.zones
    if not path.exists():
        return DEFAULT_RULES, []
    file = paths.rel(path)
    try:
        data, lines = load_file(path, max_bytes=MAX_CONFIG_BYTES, source=file)
    except InputError as exc:
        return DEFAULT_RULES, [Problem(file=file, line=exc.line, message=f"{exc.message}; default zone rules used")]
    problems: list[Problem] = []
    extra: list[ZoneRule] = []
    if data is None:
        return DEFAULT_RULES, []
    if not isinstance(data, dict):
        return DEFAULT_RULES, [Problem(file=file, line=1, message="zones.yml must map zone names to lists of paths")]
    for zone, prefixes in data.items():
        line = lines.line_for((zone,))
        if not isinstance(zone, str) or not re.match(ZONE_PATTERN, zone):
            problems.append(Problem(file=file, line=line, message=f"{zone!r} is not a zone name; ignored"))
            continue
        items = [prefixes] if isinstance(prefixes, str) else prefixes
        if not isinstance(items, list) or not all(isinstance(p, str) and p for p in items):
            problems.append(Problem(file=file, line=line, message=f"{zone}: expected a list of paths; ignored"))
            continue
        for p in items:
            try:
                prefix = normalize(p)
            except UnsafePathError as exc:
                problems.append(Problem(file=file, line=line, message=f"{zone}: {exc.message}; ignored"))
                continue
            if prefix:
                extra.append(ZoneRule(prefix=prefix, zone=zone))
    return merge_rules(extra), problems


@dataclass
class BrainMatrix:
    """Everything the router needs from a brain, and every problem found loading it."""

    matrix: AccessMatrix
    zone_rules: tuple[ZoneRule, ...]
    agents: dict[str, AgentSpec]
    routing: RoutingTable | None
    problems: list[Problem] = field(default_factory=list)
    #: The files of agents/ that did not load, by the name a workflow calls them (``kernel.agents.why_absent``).
    unloaded: dict[str, Problem] = field(default_factory=dict)

    @property
    def errors(self) -> list[Problem]:
        """Problems of severity error."""
        return [p for p in self.problems if p.severity == "error"]


def build_matrix(paths: BrainPaths) -> BrainMatrix:
    """Load agents, zone rules and the routing table into the effective matrix (never raises on bad files)."""
    files = read_agents(paths)
    agents, problems = files.agents, list(files.problems)
    matrix = AccessMatrix.build(agent_gates(agents), scopes=agent_scopes(agents))
    problems += unknown_principals(agents, [*matrix.principals(), *matrix.ungated, *agents], paths)
    rules, zone_problems = load_zone_rules(paths)
    problems += zone_problems
    table, routing_problems = load_routing(paths)
    problems += routing_problems
    if table is not None:
        matrix, widening = apply_routing(matrix, table)
        problems += widening
    return BrainMatrix(
        matrix=matrix, zone_rules=rules, agents=agents, routing=table, problems=problems, unloaded=files.unloaded
    )
