"""Agents of a brain: ``agents/*.md`` frontmatter read safely into :class:`AgentSpec` (gate + runner).

One malformed file becomes a :class:`~ambient.core.problems.Problem` with file:line and the others still
load. Files whose name starts with ``_`` (templates) are skipped; so are symlinks and hidden files.
The ``brain.ipc`` gate is parsed leniently (bad items dropped with a problem); ``ambient.runner`` is
kept raw for the runners module to validate.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from ambient.core.errors import InputError
from ambient.core.problems import Problem
from ambient.kernel.matrix import RESERVED, WILDCARD, IpcGate
from ambient.kernel.packet import BROADCAST, NAME_PATTERN
from ambient.storage.fsutil import iter_files, read_capped
from ambient.storage.paths import BrainPaths
from ambient.storage.yamlfile import MAX_AGENT_BYTES, LineMap, decode, parse_yaml, split_frontmatter
from ambient.storage.yamltext import misspelled

_NAME_RE = re.compile(NAME_PATTERN)


class AgentSpec(BaseModel):
    """One agent file: its name, where it is, its IPC gate (None = not declared) and its raw runner."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    path: Path
    source: str = ""  # the file as problems name it (brain-relative: agents/deploy.md)
    line: int = 1  # line of the ``name:`` key (1 when the name comes from the file name)
    ipc: IpcGate | None = None
    ipc_line: int | None = None
    runner: dict[str, Any] | None = None  # raw ``ambient.runner`` mapping, validated by the runners
    runner_line: int | None = None
    dispatch_line: int | None = None  # line of ``ambient.runner.dispatch`` (where the agent runs: docs/cluster.md)
    # The principals its gate names, as written: (list, name, line), for the check of names nobody holds.
    gate_names: tuple[tuple[str, str, int | None], ...] = ()
    extras: dict[str, Any] = Field(default_factory=dict)  # the rest of the frontmatter, kept as written
    lines: LineMap = Field(default_factory=LineMap)  # the line of each key of the frontmatter (a runner's typos)


def _rel(paths: BrainPaths, path: Path) -> str:
    return paths.rel(path)


def load_agent(path: Path, *, source: str) -> tuple[AgentSpec | None, list[Problem]]:
    """Read one agent file; (None, problems) when it cannot be used at all."""
    problems: list[Problem] = []
    try:
        text = decode(read_capped(path, MAX_AGENT_BYTES), source=source)
        yaml_text, offset, _body = split_frontmatter(text, source=source)
        data, lines = parse_yaml(yaml_text, source=source, line_offset=offset)
    except InputError as exc:
        return None, [Problem(file=source, line=exc.line, message=exc.message)]
    except OSError as exc:
        return None, [Problem(file=source, message=f"cannot be read: {exc.strerror}")]
    if not isinstance(data, dict):
        kind = "empty" if data is None else type(data).__name__
        return None, [Problem(file=source, line=2, message=f"frontmatter must be a YAML mapping, got {kind}")]

    name, line = _name(data, lines, path, source, problems)
    if name is None:
        return None, problems
    problems += _misspelt_blocks(data, lines, source)
    ipc, ipc_line = _gate(data, lines, name, source, problems)
    gate_names = _gate_names(data, lines) if ipc is not None else ()
    runner, runner_line = _runner(data, lines, source, problems)
    extras = {k: v for k, v in data.items() if k != "name"}
    spec = AgentSpec(
        name=name,
        path=path,
        source=source,
        line=line,
        ipc=ipc,
        ipc_line=ipc_line,
        runner=runner,
        runner_line=runner_line,
        dispatch_line=lines.line_for(("ambient", "runner", "dispatch")) if runner and "dispatch" in runner else None,
        extras=extras,
        gate_names=gate_names,
        lines=lines,
    )
    return spec, problems


def _gate_names(data: Mapping[str, Any], lines: LineMap) -> tuple[tuple[str, str, int | None], ...]:
    ipc = data.get("brain", {}).get("ipc")
    out: list[tuple[str, str, int | None]] = []
    if isinstance(ipc, Mapping):
        for key in ("receives_from", "sends_to"):
            names = ipc.get(key)
            for i, value in enumerate(names if isinstance(names, list) else []):
                if isinstance(value, str):
                    out.append((key, value, lines.line_for(("brain", "ipc", key, i))))
    return tuple(out)


def unknown_principals(agents: Mapping[str, AgentSpec], known: Iterable[str], paths: BrainPaths) -> list[Problem]:
    """Names in a gate that no principal holds (``sends_to: [orchestrater]``): they grant nothing, and every packet
    meant for them is denied at run time. A warning at the name's line, with the nearest name that exists."""
    import difflib

    names = sorted(set(known))
    problems: list[Problem] = []
    for spec in agents.values():
        for key, value, line in spec.gate_names:
            if value in names or value in (WILDCARD, BROADCAST):
                continue
            close = difflib.get_close_matches(value, names, n=1, cutoff=0.75)
            hint = f"; did you mean {close[0]!r}?" if close else " (no agent file has that name)"
            problems.append(
                Problem(
                    file=_rel(paths, spec.path),
                    line=line,
                    message=f"{spec.name}: brain.ipc.{key} names {value!r}, which is no principal, so "
                    f"it grants nothing{hint}",
                    severity="warning",
                )
            )
    return problems


def _name(
    data: Mapping[str, Any], lines: LineMap, path: Path, source: str, problems: list[Problem]
) -> tuple[str | None, int]:
    raw = data.get("name")
    line = lines.line_for(("name",)) or 1
    if raw is None:
        name = path.stem
    elif isinstance(raw, str) and _NAME_RE.match(raw):
        name = raw
        if name != path.stem:
            problems.append(
                Problem(
                    file=source,
                    line=line,
                    message=f"name {name!r} differs from the file name {path.stem!r}; the agent is known as {name!r}",
                    severity="warning",
                )
            )
    else:
        problems.append(
            Problem(file=source, line=line, message="name must be an agent name (letters, digits, '_', '.', '-')")
        )
        return None, line
    if not _NAME_RE.match(name):
        problems.append(Problem(file=source, line=1, message=f"file name {path.stem!r} is not a valid agent name"))
        return None, line
    if name in RESERVED:
        problems.append(
            Problem(
                file=source,
                line=line,
                message=f"{name!r} is a kernel principal (human, ambient, bsi, broadcast); no agent may take it",
            )
        )
        return None, line
    return name, line


def _gate(
    data: Mapping[str, Any], lines: LineMap, name: str, source: str, problems: list[Problem]
) -> tuple[IpcGate | None, int | None]:
    brain = data.get("brain")
    if brain is None:
        return None, None
    if not isinstance(brain, dict):
        problems.append(
            Problem(file=source, line=lines.line_for(("brain",)), message="brain must be a mapping; no gate read")
        )
        return None, None
    if "ipc" not in brain:
        return None, None
    ipc_line = lines.line_for(("brain", "ipc"))
    gate, issues = IpcGate.parse(brain["ipc"], source=f"{source}:{ipc_line}")
    for issue in issues:
        problems.append(
            Problem(
                file=source,
                line=lines.line_for(("brain", "ipc", *issue.loc)),
                message=f"{name}: {issue.message}",
                severity=issue.severity,
            )
        )
    return gate, ipc_line


#: The frontmatter blocks ambient reads; the rest of a frontmatter is the brain's own, kept and never judged.
_BLOCKS = ("name", "brain", "ambient")
#: The keys of the ``ambient:`` block (ambient's own: an unknown one is a mistake, not a key of the brain's).
_AMBIENT_KEYS = ("runner",)


def _misspelt_blocks(data: Mapping[str, Any], lines: LineMap, source: str) -> list[Problem]:
    """``brian:`` beside no ``brain:`` (the agent would silently get no gate), ``ambient: {runer: ...}`` (no
    runner): named at their line with the key they look like. Other keys of a frontmatter are the brain's own."""
    found: list[Problem] = []
    for key in data:
        if not isinstance(key, str) or key in _BLOCKS:
            continue
        close = difflib.get_close_matches(key, [b for b in _BLOCKS if b not in data], n=1, cutoff=0.8)
        if close:
            found.append(
                Problem(
                    file=source,
                    line=lines.line_for((key,)),
                    message=f"unknown key {key!r}; did you mean {close[0]!r}? (without it, ambient reads no "
                    f"{close[0]} block for this agent)",
                    severity="warning",
                )
            )
    amb = data.get("ambient")
    for key in amb if isinstance(amb, dict) else ():
        if key in _AMBIENT_KEYS:
            continue
        close = difflib.get_close_matches(str(key), _AMBIENT_KEYS, n=1, cutoff=0.6)
        guess = f"did you mean {close[0]!r}? " if close else ""
        found.append(
            Problem(
                file=source,
                line=lines.line_for(("ambient", key)),
                message=f"ambient.{key}: unknown key; {guess}the ambient block holds only: {', '.join(_AMBIENT_KEYS)}",
            )
        )
    return found


def _runner(
    data: Mapping[str, Any], lines: LineMap, source: str, problems: list[Problem]
) -> tuple[dict[str, Any] | None, int | None]:
    amb = data.get("ambient")
    if amb is None:
        return None, None
    line = lines.line_for(("ambient",))
    if not isinstance(amb, dict):
        problems.append(Problem(file=source, line=line, message="ambient must be a mapping (ambient.runner: ...)"))
        return None, None
    runner = amb.get("runner")
    if runner is None:
        return None, None
    rline = lines.line_for(("ambient", "runner"))
    if not isinstance(runner, dict):
        problems.append(Problem(file=source, line=rline, message="ambient.runner must be a mapping (kind: ...)"))
        return None, None
    return runner, rline


#: Where ambient reads an agent's runner in its frontmatter.
RUNNER_KEY: Final = ("ambient", "runner")

#: The matrix rules that refuse a packet because of an agent's own gate: whose gate (the packet's sender or its
#: receiver) and the frontmatter key that gate lacks or that says no.
GATE_KEY_OF_RULE: Final[Mapping[str, tuple[str, tuple[str, ...]]]] = {
    "sender.no-gate": ("sender", ("brain", "ipc")),
    "sender.signals": ("sender", ("brain", "ipc", "signals")),
    "sender.sends_to": ("sender", ("brain", "ipc", "sends_to")),
    "zone.sender": ("sender", ("brain", "ipc", "zone_access")),
    "receiver.no-gate": ("receiver", ("brain", "ipc")),
    "receiver.receives_from": ("receiver", ("brain", "ipc", "receives_from")),
    "zone.receiver": ("receiver", ("brain", "ipc", "zone_access")),
}


def lookalike(spec: AgentSpec, key: Sequence[str]) -> Problem | None:
    """The key of the agent's frontmatter that looks like a key ambient reads and the file lacks: ``key`` or a block
    on its way (``ambiant:`` for ``ambient:`` on the way to ``ambient.runner``, ``signal:`` for ``brain.ipc.signals``),
    at its line: ``agents/h3.md:5: 'ambiant' looks like 'ambient'``. None when every key on the way is there or none
    looks like the missing one. The one home of what makes a missing key a typo (docs/agents-and-runners.md,
    "Writing an agent")."""
    node: Any = {"name": spec.name, **spec.extras}
    for depth, part in enumerate(key):
        if not isinstance(node, Mapping):
            return None
        if part not in node:
            typo = misspelled(part, node)
            if typo is None:
                return None
            line = spec.lines.line_for((*key[:depth], typo))
            return Problem(file=spec.source or spec.path.name, line=line, message=f"{typo!r} looks like {part!r}")
        node = node[part]
    return None


@dataclass(frozen=True)
class AgentFiles:
    """The agents of a brain by name, the files of ``agents/`` that did not load (by file stem: the name a workflow
    calls such an agent by, with the first error that stopped it) and every problem found."""

    agents: dict[str, AgentSpec]
    unloaded: dict[str, Problem]
    problems: list[Problem]


def why_absent(name: str, unloaded: Mapping[str, Problem]) -> str:
    """Why there is no agent ``name``, to follow ``agent 'name'`` wherever one is named: its file is there but does
    not load (the cause at its file:line), or there is no such file. The one home of that distinction."""
    cause = unloaded.get(name)
    return f"does not load: {cause}" if cause is not None else "does not exist in agents/"


def read_agents(paths: BrainPaths) -> AgentFiles:
    """Every file of ``agents/`` read: the agents that load, the files that do not, the problems (errors and
    warnings)."""
    agents: dict[str, AgentSpec] = {}
    unloaded: dict[str, Problem] = {}
    problems: list[Problem] = []
    for path in iter_files(paths.agents, (".md",)):
        if path.name.startswith("_"):
            continue
        source = _rel(paths, path)
        spec, found = load_agent(path, source=source)
        problems += found
        if spec is None:
            cause = next((p for p in found if p.severity == "error"), None)
            if cause is not None:
                unloaded.setdefault(path.stem, cause)
            continue
        if spec.name in agents:
            first = agents[spec.name]
            problems.append(
                Problem(
                    file=source,
                    line=spec.line,
                    message=f"agent {spec.name!r} is already defined in {_rel(paths, first.path)}; file ignored",
                )
            )
            continue
        agents[spec.name] = spec
    return AgentFiles(agents, unloaded, problems)


def load_agents(paths: BrainPaths) -> tuple[dict[str, AgentSpec], list[Problem]]:
    """Every agent of the brain by name, and the problems found (errors and warnings)."""
    found = read_agents(paths)
    return found.agents, found.problems


def agent_gates(agents: Mapping[str, AgentSpec]) -> dict[str, IpcGate | None]:
    """The gates to build an :class:`~ambient.kernel.matrix.AccessMatrix` from."""
    return {name: spec.ipc for name, spec in agents.items()}


def agent_scopes(agents: Mapping[str, AgentSpec]) -> dict[str, str]:
    """Each agent's declared ``brain.scope`` (kernel, project...), where it declares one."""
    out: dict[str, str] = {}
    for name, spec in agents.items():
        brain = spec.extras.get("brain")
        if isinstance(brain, Mapping) and isinstance(brain.get("scope"), str):
            out[name] = brain["scope"]
    return out
