"""The access matrix of ADR-026 (DESIGN 2.3): kernel defaults, agent gates, routing narrowing, decide().

Pure rules: :func:`decide` answers allow/deny for (from, to, signal, zone, files) with the rule that
decided and the reasons, and never raises on a deny. A packet from A to B is allowed only if:

1. the signal is one of the 16 of :class:`~ambient.kernel.packet.Signal` and its destination rule holds
   (CHECKPOINT only to ``bsi``, HANDOFF only to the sender itself, ``broadcast`` only for NOTIFY);
2. A and B are principals with a gate (``human``, ``ambient``, the kernel agents, and every agent
   whose frontmatter declares ``brain.ipc``); an agent file without a gate sends and receives nothing;
3. A emits the signal (A's ``signals``);
4. B is in A's ``sends_to`` and A is in B's ``receives_from`` (``"*"`` = anyone). Not checked for the
   fixed destinations: ``bsi`` (CHECKPOINT), the sender itself (HANDOFF); ``broadcast`` needs
   ``"*"`` or ``broadcast`` in A's ``sends_to``, and the fan-out filters receivers
   (:meth:`AccessMatrix.broadcast_recipients`);
5. the packet's zone and the zone of every scope file (folders: every zone below them) are in
   A's ``zone_access`` and in B's (only A's for bsi, broadcast and HANDOFF); ``"*"`` = every zone;
6. if the routing table restricts A, one of A's routes admits (B, signal, zones).

Deliberate decisions:

* ``human`` (the person, the pilot) and ``ambient`` (the daemon, acting for the workflow as the
  orchestrator does) are kernel principals with every right; no agent file can redefine them,
  ``bsi`` or ``broadcast``. Wherever a list names ``orchestrator``, ``ambient`` matches too, so the
  daemon's SPAWNs reach agents that accept the orchestrator and their RETURNs come back.
* Zones beyond kernel/project/personal (the corpus has ``reference``) load with a warning and are
  plain names: they grant only packets that name that zone, or files a ``profil/zones.yml`` rule
  puts in it; they never widen a kernel zone.
* ``signals`` may name the orchestration signals of spec/004 (STEP_DONE, ...): they are authorized
  exactly like the seven. A name that is no signal at all loads with a warning and grants nothing.
* The matrix has no read/write distinction (audit's "kernel (read)") and no claim scope (debug's
  "its scope only"): pre-flight checks those. scribe's "as declared by scope": the zone its agent file's
  ``brain.scope`` names (kernel, project, personal), else project (:func:`scribe_gate`).
* Direction (ADR-026's signal table): SPAWN flows parent → child, RETURN and ERROR child → parent,
  ESCALATE and BLOCKED_ON agent → pilot. The gates say who reports to whom: an agent reports to the
  principals its ``sends_to`` names ("to whom it may RETURN/ESCALATE"), unless they name it back (peers). So
  a leaf may not SPAWN its orchestrator, and nobody RETURNs or ESCALATEs to an agent that reports to it
  (check 5; the person and ambient name nobody, so agents report to them).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict

from ambient.core.errors import UnsafePathError
from ambient.core.problems import Problem
from ambient.kernel.packet import (
    AMBIENT,
    BROADCAST,
    BROADCAST_SIGNALS,
    CLAIMS_STORE,
    NAME_PATTERN,
    ZONE_PATTERN,
    Signal,
)
from ambient.kernel.zones import DEFAULT_RULES, KERNEL, KERNEL_ZONES, PERSONAL, PROJECT, ZoneRule, zones_below

WILDCARD: Final = "*"
HUMAN: Final = "human"
ORCHESTRATOR: Final = "orchestrator"
RESERVED: Final = frozenset({HUMAN, AMBIENT, CLAIMS_STORE, BROADCAST})
ALL_SIGNALS: Final = frozenset(Signal)

_NAME_RE = re.compile(NAME_PATTERN)
_ZONE_RE = re.compile(ZONE_PATTERN)

Severity = Literal["error", "warning"]
Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class GateIssue:
    """Something wrong or unusual in a declared gate; ``loc`` is relative to the ``ipc`` mapping."""

    loc: Loc
    message: str
    severity: Severity = "warning"


def _admits(names: frozenset[str], who: str) -> bool:
    """Whether a receives_from/sends_to list names ``who`` (``*`` = anyone; ``orchestrator`` admits ``ambient``)."""
    return WILDCARD in names or who in names or (who == AMBIENT and ORCHESTRATOR in names)


class IpcGate(BaseModel):
    """One principal's entry of the matrix (frontmatter ``brain.ipc`` or a kernel default)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    receives_from: frozenset[str] = frozenset()
    sends_to: frozenset[str] = frozenset()
    zone_access: frozenset[str] = frozenset()
    signals: frozenset[Signal] = frozenset()
    source: str = "kernel default"

    def admits_sender(self, name: str) -> bool:
        """``name`` may send to this principal."""
        return _admits(self.receives_from, name)

    def admits_receiver(self, name: str) -> bool:
        """This principal may send to ``name``."""
        return _admits(self.sends_to, name)

    def admits_zone(self, zone: str) -> bool:
        """This principal may work in ``zone``."""
        return WILDCARD in self.zone_access or zone in self.zone_access

    @classmethod
    def parse(cls, raw: Any, *, source: str) -> tuple[IpcGate, list[GateIssue]]:
        """Build a gate from a frontmatter ``brain.ipc`` mapping, leniently: bad items are dropped with an issue.

        A value that is not a mapping gives an empty gate (nothing allowed) and an error.
        """
        issues: list[GateIssue] = []
        if not isinstance(raw, Mapping):
            kind = "empty" if raw is None else type(raw).__name__
            issues.append(
                GateIssue((), f"brain.ipc must be a mapping, got {kind}; this agent is allowed nothing", "error")
            )
            return cls(source=source), issues
        for key in raw:
            if key not in _GATE_KEYS:
                issues.append(
                    GateIssue((str(key),), f"unknown key brain.ipc.{key} ignored; expected {', '.join(_GATE_KEYS)}")
                )
        values: dict[str, frozenset[Any]] = {}
        for key in _GATE_KEYS:
            items = _as_list(raw.get(key), key, issues)
            if key in ("receives_from", "sends_to"):
                values[key] = frozenset(_names(items, key, issues))
            elif key == "zone_access":
                values[key] = frozenset(_zones(items, issues))
            else:
                values[key] = frozenset(_signals(items, issues))
        return cls(source=source, **values), issues


_GATE_KEYS: Final = ("receives_from", "sends_to", "zone_access", "signals")


def _as_list(value: Any, key: str, issues: list[GateIssue]) -> list[tuple[int, Any]]:
    if value is None:
        issues.append(GateIssue((key,), f"brain.ipc.{key} is missing or empty; it allows nothing"))
        return []
    if isinstance(value, str):
        return [(0, value)]
    if not isinstance(value, list):
        issues.append(GateIssue((key,), f"brain.ipc.{key} must be a list, got {type(value).__name__}", "error"))
        return []
    return list(enumerate(value))


def _names(items: list[tuple[int, Any]], key: str, issues: list[GateIssue]) -> list[str]:
    out = []
    for i, item in items:
        if isinstance(item, str) and (item == WILDCARD or _NAME_RE.match(item)):
            out.append(item)
        else:
            issues.append(GateIssue((key, i), f'brain.ipc.{key}[{i}] is not an agent name or "*"; ignored', "error"))
    return out


def _zones(items: list[tuple[int, Any]], issues: list[GateIssue]) -> list[str]:
    out = []
    for i, item in items:
        if item == WILDCARD or item in KERNEL_ZONES:
            out.append(item)
        elif isinstance(item, str) and _ZONE_RE.match(item):
            out.append(item)
            close = difflib.get_close_matches(item, sorted(KERNEL_ZONES), n=1, cutoff=0.75)
            guess = f"did you mean {close[0]!r}? " if close else ""
            issues.append(
                GateIssue(
                    ("zone_access", i),
                    f"zone {item!r} is not a kernel zone (kernel, project, personal); {guess}it grants only packets "
                    f"and files in zone {item!r}",
                )
            )
        else:
            issues.append(
                GateIssue(("zone_access", i), f"brain.ipc.zone_access[{i}] is not a zone name; ignored", "error")
            )
    return out


def _signals(items: list[tuple[int, Any]], issues: list[GateIssue]) -> list[Signal]:
    out: list[Signal] = []
    for i, item in items:
        if item == WILDCARD:
            out.extend(ALL_SIGNALS)
        elif isinstance(item, str) and item in Signal.__members__:
            out.append(Signal(item))
        else:
            issues.append(
                GateIssue(
                    ("signals", i),
                    f"signal {item!r} is not one of {', '.join(Signal)}; ignored (it grants nothing)",
                )
            )
    return out


def _gate(
    rf: Iterable[str], st: Iterable[str], zones: Iterable[str], signals: Iterable[Signal], source: str
) -> IpcGate:
    return IpcGate(
        receives_from=frozenset(rf),
        sends_to=frozenset(st),
        zone_access=frozenset(zones),
        signals=frozenset(signals),
        source=source,
    )


S = Signal
_ADR = "kernel default (ADR-026)"
KERNEL_DEFAULTS: Final[Mapping[str, IpcGate]] = MappingProxyType(
    {
        ORCHESTRATOR: _gate([HUMAN, WILDCARD], [WILDCARD], [WILDCARD], ALL_SIGNALS, _ADR),
        "debug": _gate([ORCHESTRATOR, HUMAN], [ORCHESTRATOR], [PROJECT], [S.SPAWN, S.RETURN, S.BLOCKED_ON], _ADR),
        "security": _gate(
            [ORCHESTRATOR, "code-review"], [ORCHESTRATOR], [PROJECT], [S.SPAWN, S.RETURN, S.ESCALATE], _ADR
        ),
        "coach": _gate([HUMAN], [HUMAN], [PERSONAL, "reference"], [S.ESCALATE, S.CHECKPOINT], _ADR),
        # "selon scope déclaré": see scribe_gate; project when its file declares no zone as its scope
        "scribe": _gate([ORCHESTRATOR, HUMAN], [ORCHESTRATOR], [PROJECT], [S.SPAWN, S.RETURN], _ADR),
        "audit": _gate([HUMAN], [HUMAN], [KERNEL], [S.RETURN, S.ESCALATE], _ADR),
    }
)
KERNEL_PRINCIPALS: Final[Mapping[str, IpcGate]] = MappingProxyType(
    {
        HUMAN: _gate([WILDCARD], [WILDCARD], [WILDCARD], ALL_SIGNALS, "kernel principal: the person (pilot)"),
        AMBIENT: _gate(
            [WILDCARD], [WILDCARD], [WILDCARD], ALL_SIGNALS, "kernel principal: the daemon, acting as the orchestrator"
        ),
        CLAIMS_STORE: _gate(
            [WILDCARD], [], [WILDCARD], [], "kernel principal: the claims store, receives CHECKPOINT only"
        ),
    }
)


# --- routing narrowing (the data; the file format is ambient.kernel.routing_table) ---------------------------


@dataclass(frozen=True)
class Route:
    """One routing entry: ``sender`` may send ``signals`` (None = any) to ``receivers`` in ``zones`` (None = any)."""

    sender: str
    receivers: frozenset[str]
    signals: frozenset[Signal] | None = None
    zones: frozenset[str] | None = None
    file: str | None = None
    line: int | None = None

    @property
    def source(self) -> str:
        """``file:line`` of the entry."""
        return f"{self.file}:{self.line}" if self.line is not None else (self.file or "routing table")

    def admits(self, to: str, signal: Signal, zones: Iterable[str]) -> bool:
        """Whether this route carries the packet."""
        if not _admits(self.receivers, to):
            return False
        if self.signals is not None and signal not in self.signals:
            return False
        return self.zones is None or WILDCARD in self.zones or all(z in self.zones for z in zones)


@dataclass(frozen=True)
class RoutingTable:
    """Who actually talks to whom in this brain. A sender named in any entry may send only along its routes;
    with ``default_deny`` every sender is restricted."""

    routes: tuple[Route, ...] = ()
    restricted: frozenset[str] = frozenset()
    default_deny: bool = False
    file: str = "profil/routing.yml"

    def restricts(self, sender: str) -> bool:
        """Whether ``sender``'s packets must follow a route."""
        return self.default_deny or sender in self.restricted

    def routes_of(self, sender: str) -> list[Route]:
        """The routes of one sender."""
        return [r for r in self.routes if r.sender == sender]


# --- decisions -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decision:
    """Allow or deny, the rule that decided (a stable check name) and the reasons, in words."""

    allowed: bool
    reasons: tuple[str, ...]
    rule: str
    source: str | None = None  # the gate or routing entry behind the rule (file:line or "kernel default")

    def explain(self) -> str:
        """Multi-line text: verdict, rule, reasons."""
        head = "ALLOW" if self.allowed else "DENY"
        src = f" ({self.source})" if self.source else ""
        return "\n".join([f"{head} by rule {self.rule}{src}", *(f"  - {r}" for r in self.reasons)])


def _deny(rule: str, reason: str, source: str | None = None, passed: Sequence[str] = ()) -> Decision:
    return Decision(False, (*passed, reason), rule, source)


class AccessMatrix:
    """The effective matrix: one gate per principal, the agents without a gate, and the routing table."""

    __slots__ = ("_cache", "_zcache", "gates", "routing", "ungated")

    def __init__(
        self,
        gates: Mapping[str, IpcGate],
        *,
        ungated: Iterable[str] = (),
        routing: RoutingTable | None = None,
    ) -> None:
        self.gates: Mapping[str, IpcGate] = dict(gates)
        self.ungated: frozenset[str] = frozenset(ungated) - self.gates.keys()
        self.routing = routing
        self._cache: dict[tuple[str, str, Signal], Decision] = {}
        self._zcache: dict[tuple[str, str, Signal, frozenset[str]], Decision] = {}

    @classmethod
    def build(
        cls, agent_gates: Mapping[str, IpcGate | None] | None = None, scopes: Mapping[str, str] | None = None
    ) -> AccessMatrix:
        """Kernel principals, kernel defaults, then each agent's declared gate (None = no declaration).

        A declared gate replaces the kernel default of the same name; reserved names are never overridden.
        ``scopes``: each agent file's ``brain.scope`` (the kernel scribe's zones follow it: :func:`scribe_gate`).
        """
        gates: dict[str, IpcGate] = dict(KERNEL_DEFAULTS)
        gates["scribe"] = scribe_gate((scopes or {}).get("scribe"))
        ungated: list[str] = []
        for name, gate in (agent_gates or {}).items():
            if name in RESERVED:
                continue
            if gate is not None:
                gates[name] = gate
            elif name not in gates:
                ungated.append(name)
        gates.update(KERNEL_PRINCIPALS)
        return cls(gates, ungated=ungated)

    def gate(self, name: str) -> IpcGate | None:
        """The gate of a principal, or None."""
        return self.gates.get(name)

    def principals(self) -> list[str]:
        """Every principal with a gate, sorted."""
        return sorted(self.gates)

    def with_routing(self, routing: RoutingTable | None) -> AccessMatrix:
        """The same gates narrowed by ``routing`` (unchecked: use :func:`apply_routing`)."""
        return AccessMatrix(self.gates, ungated=self.ungated, routing=routing)

    def broadcast_recipients(self, sender: str) -> list[str]:
        """Who receives a NOTIFY broadcast from ``sender``: principals whose receives_from admits it."""
        return sorted(n for n, g in self.gates.items() if n not in (sender, CLAIMS_STORE) and g.admits_sender(sender))

    def decision(self, from_: str, to: str, signal: Signal, zones: frozenset[str] = frozenset()) -> Decision:
        """The decision for a packet touching ``zones``, cached: the matrix is immutable, so one
        combination is decided (and explained) once. :func:`decide` is the general entry point."""
        key = (from_, to, signal, zones)
        hit = self._zcache.get(key)
        if hit is None:
            hit = _decide_zones(self, from_, to, signal, zones)
            if len(self._zcache) > 8192:
                self._zcache.clear()
            self._zcache[key] = hit
        return hit

    def gate_decision(self, from_: str, to: str, signal: Signal) -> Decision:
        """Checks 1-4 (no zones, no routing), cached: the gates are immutable."""
        key = (from_, to, signal)
        hit = self._cache.get(key)
        if hit is None:
            hit = _gate_check(self, from_, to, signal)
            if len(self._cache) > 8192:
                self._cache.clear()
            self._cache[key] = hit
        return hit


def _who(matrix: AccessMatrix, name: str, role: str) -> Decision | None:
    if name in matrix.gates:
        return None
    if name in matrix.ungated:
        return _deny(
            f"{role}.no-gate",
            f"{name} declares no brain.ipc gate in its frontmatter and is not a kernel agent; "
            "it sends and receives nothing until it declares one",
        )
    return _deny(f"{role}.unknown", f"{name} is not a known principal (no agent file, not a kernel principal)")


def _via(names: frozenset[str], who: str) -> str:
    """How a list admitted ``who``, when not by name."""
    if who in names:
        return ""
    if WILDCARD in names:
        return ' (by "*")'
    return " (as orchestrator: ambient acts for it)"


def _gate_check(matrix: AccessMatrix, from_: str, to: str, signal: Signal) -> Decision:
    passed: list[str] = []
    # 1. destinations fixed by the signal
    if signal is Signal.CHECKPOINT and to != CLAIMS_STORE:
        return _deny("packet.destination", f"CHECKPOINT goes to the claims store ({CLAIMS_STORE}) only, not {to}")
    if to == CLAIMS_STORE and signal is not Signal.CHECKPOINT:
        return _deny("packet.destination", f"the claims store ({CLAIMS_STORE}) receives CHECKPOINT only, not {signal}")
    if signal is Signal.HANDOFF and to != from_:
        return _deny("packet.destination", f"HANDOFF goes to the sender's next session only (to: {from_}), not {to}")
    if to == BROADCAST and signal not in BROADCAST_SIGNALS:
        return _deny("packet.destination", f"broadcast is only for NOTIFY; {signal} needs one receiver")
    if from_ in (CLAIMS_STORE, BROADCAST):
        return _deny("sender.unknown", f"{from_} is a destination, never a sender")
    # 2. principals
    denied = _who(matrix, from_, "sender")
    if denied is not None:
        return denied
    sender = matrix.gates[from_]
    fixed = to in (CLAIMS_STORE, BROADCAST) or signal is Signal.HANDOFF
    if not fixed:
        denied = _who(matrix, to, "receiver")
        if denied is not None:
            return denied
    # 3. the sender emits the signal
    if signal not in sender.signals:
        emits = ", ".join(sorted(sender.signals)) or "nothing"
        return _deny("sender.signals", f"{from_} emits {emits}; {signal} is not one of them", sender.source)
    passed.append(f"{from_} emits {signal} ({sender.source})")
    # 4. sends_to / receives_from
    if to == BROADCAST:
        if WILDCARD not in sender.sends_to and BROADCAST not in sender.sends_to:
            return _deny(
                "sender.sends_to",
                f'{from_} may not broadcast (its sends_to has neither "*" nor broadcast)',
                sender.source,
                passed,
            )
        passed.append(f"{from_} may broadcast; each receiver's receives_from filters the fan-out")
    elif to == CLAIMS_STORE:
        passed.append("CHECKPOINT to the claims store needs no sends_to entry (ADR-026: agent → BSI)")
    elif signal is Signal.HANDOFF:
        passed.append(f"HANDOFF to {from_}'s own next session needs no sends_to entry")
    else:
        if not sender.admits_receiver(to):
            targets = ", ".join(sorted(sender.sends_to)) or "nobody"
            return _deny(
                "sender.sends_to", f"{from_} sends to {targets}; {to} is not among them", sender.source, passed
            )
        passed.append(f"{from_} sends to {to}{_via(sender.sends_to, to)} ({sender.source})")
        receiver = matrix.gates[to]
        if not receiver.admits_sender(from_):
            sources = ", ".join(sorted(receiver.receives_from)) or "nobody"
            return _deny(
                "receiver.receives_from",
                f"{to} receives from {sources}; {from_} is not among them",
                receiver.source,
                passed,
            )
        passed.append(f"{to} receives from {from_}{_via(receiver.receives_from, from_)} ({receiver.source})")
        # 5. direction (ADR-026): SPAWN goes parent → child; RETURN, ERROR go child → parent, ESCALATE and
        # BLOCKED_ON agent → pilot. Who reports to whom is what the gates name (see reports_to).
        if signal is Signal.SPAWN and reports_to(matrix, from_, to):
            return _deny(
                "direction.spawn",
                f"{from_} reports to {to} (its sends_to names {to}): SPAWN goes parent "
                f"→ child (ADR-026), so {to} may SPAWN {from_}, not the other way",
                sender.source,
                passed,
            )
        if signal in UPWARD_SIGNALS and reports_to(matrix, to, from_):
            return _deny(
                "direction.upward",
                f"{to} reports to {from_} (its sends_to names {from_}): {signal} goes "
                f"child → parent or pilot (ADR-026); {from_} SPAWNs {to} instead",
                receiver.source,
                passed,
            )
    return Decision(True, tuple(passed), "allow", sender.source)


def scribe_gate(scope: str | None) -> IpcGate:
    """The kernel scribe's gate: ADR-026 gives it the zones "as declared by scope", so a scribe without a gate of its
    own works in the zone its agent file's ``brain.scope`` names (kernel, project or personal), else in project
    only: never everywhere (a gate-less scribe with ``scope: project`` is never SPAWNed on a personal path)."""
    base = KERNEL_DEFAULTS["scribe"]
    if scope in KERNEL_ZONES:
        return base.model_copy(
            update={"zone_access": frozenset({scope}), "source": f"{_ADR}, zones from its brain.scope: {scope}"}
        )
    return base


#: Signals that flow up, child → parent (RETURN, ERROR) or agent → pilot (ESCALATE, BLOCKED_ON): ADR-026.
UPWARD_SIGNALS: Final = frozenset({Signal.RETURN, Signal.ERROR, Signal.ESCALATE, Signal.BLOCKED_ON})


def _names_itself(names: frozenset[str], who: str) -> bool:
    """Whether a list names ``who`` itself, not through ``"*"`` (ambient is named where orchestrator is)."""
    return who in names or (who == AMBIENT and ORCHESTRATOR in names)


def reports_to(matrix: AccessMatrix, child: str, parent: str) -> bool:
    """Whether ``child`` reports to ``parent``, in ADR-026's words for the gate: ``parent`` is among those "who may
    SPAWN it" (its ``receives_from``) and among those it "may RETURN/ESCALATE to" (its ``sends_to`` names it), and
    the relation is not mutual (two agents in that relation both ways are peers: no direction). An agent naming
    another in ``sends_to`` only, to SPAWN it (the corpus's code-review → security), does not report to it. The
    person and ambient name nobody ("*"): agents report to them, never the other way."""
    c, p = matrix.gates.get(child), matrix.gates.get(parent)
    if c is None or p is None:
        return False
    up = _names_itself(c.sends_to, parent) and c.admits_sender(parent)
    down = _names_itself(p.sends_to, child) and p.admits_sender(child)
    return up and not down


def _zones_of(zone: str | None, files: Iterable[str], rules: Iterable[ZoneRule]) -> tuple[set[str], str | None]:
    """The zones a packet touches, or an error text for an unsafe path."""
    zones: set[str] = set()
    if zone is not None:
        zones.add(zone)
    rules = tuple(rules)
    for i, f in enumerate(files):
        try:
            zones |= zones_below(f, rules)
        except UnsafePathError:
            return zones, f"scope.files[{i}] leaves the brain root; it is in no zone"
    return zones, None


def decide(
    matrix: AccessMatrix,
    from_: str,
    to: str,
    signal: Signal | str,
    zone: str | None = None,
    files: Iterable[str] = (),
    zone_rules: Iterable[ZoneRule] = DEFAULT_RULES,
    *,
    file_zones: Iterable[str] | None = None,
) -> Decision:
    """Allow or deny one packet (see the module docstring for the rules). Never raises on a deny.

    ``file_zones``, when given, replaces the zones computed from ``files`` (the router passes the zones
    of the paths after resolving symlinks).
    """
    if not isinstance(signal, Signal):
        if signal not in Signal.__members__:
            return _deny("signal.unknown", f"{signal!r} is not a signal; expected one of {', '.join(Signal)}")
        signal = Signal(signal)
    zones, unsafe = _zones_of(zone, files if file_zones is None else (), zone_rules)
    if unsafe is not None:
        base = matrix.gate_decision(from_, to, signal)
        return base if not base.allowed else _deny("zone.unsafe-path", unsafe, None, base.reasons)
    if file_zones is not None:
        zones.update(file_zones)
    return matrix.decision(from_, to, signal, frozenset(zones))


def _decide_zones(matrix: AccessMatrix, from_: str, to: str, signal: Signal, zones: frozenset[str]) -> Decision:
    """Checks 1-6 for a packet touching ``zones`` (the zones of its scope and files)."""
    base = matrix.gate_decision(from_, to, signal)
    if not base.allowed:
        return base
    reasons = list(base.reasons)
    if zones:
        sender = matrix.gates[from_]
        for z in sorted(zones):
            if not sender.admits_zone(z):
                return _deny(
                    "zone.sender", f"{from_} may work in {_fmt_zones(sender)}; not in zone {z}", sender.source, reasons
                )
        receiver = matrix.gates.get(to)
        check_receiver = receiver is not None and to not in (CLAIMS_STORE, BROADCAST) and signal is not Signal.HANDOFF
        if check_receiver and receiver is not None:
            for z in sorted(zones):
                if not receiver.admits_zone(z):
                    return _deny(
                        "zone.receiver",
                        f"{to} may work in {_fmt_zones(receiver)}; not in zone {z}",
                        receiver.source,
                        reasons,
                    )
        reasons.append(f"zones {', '.join(sorted(zones))} allowed")
    routing = matrix.routing
    if routing is not None and routing.restricts(from_):
        for route in routing.routes:
            if route.sender == from_ and route.admits(to, signal, zones):
                reasons.append(f"routing entry {route.source} carries it")
                return Decision(True, tuple(reasons), "allow", route.source)
        why = "default: deny" if from_ not in routing.restricted else f"{from_} is restricted to its routes"
        where = f" in zone {', '.join(sorted(zones))}" if zones else ""
        return _deny(
            "routing",
            f"no entry of {routing.file} carries {from_} → {to} {signal}{where} ({why})",
            routing.file,
            reasons,
        )
    if not zones:
        return base
    return Decision(True, tuple(reasons), "allow", base.source)


def _fmt_zones(gate: IpcGate) -> str:
    return ", ".join(sorted(gate.zone_access)) or "no zone"


def apply_routing(matrix: AccessMatrix, table: RoutingTable) -> tuple[AccessMatrix, list[Problem]]:
    """Narrow ``matrix`` by ``table``. An entry that would widen the matrix is an error and is not applied
    (its sender stays restricted, so dropping it can only narrow further)."""
    problems: list[Problem] = []
    kept: list[Route] = []
    for route in table.routes:
        wider = _widening(matrix, route)
        if wider:
            problems.append(
                Problem(
                    file=route.file or table.file,
                    line=route.line,
                    message="routing entry widens the access matrix and is not applied: " + "; ".join(wider),
                )
            )
        else:
            kept.append(route)
    narrowed = RoutingTable(
        routes=tuple(kept),
        restricted=table.restricted | {r.sender for r in table.routes},
        default_deny=table.default_deny,
        file=table.file,
    )
    return matrix.with_routing(narrowed), problems


def _widening(matrix: AccessMatrix, route: Route) -> list[str]:
    """What a route claims that the gates never allow (empty when it only narrows).

    A route is a product (receivers x signals); pairs the matrix denies inside it stay denied and are
    fine (``to: [ambient, bsi]`` with ``[RETURN, CHECKPOINT]``). It widens when one of its names is
    useless: a signal the sender does not emit or no listed receiver may get, a receiver that may get
    none of the listed signals, a zone the sender may not work in, or a sender without a gate.
    """
    sender = matrix.gates.get(route.sender)
    if sender is None:
        denied = _who(matrix, route.sender, "sender")
        return [f"from {route.sender}: {denied.reasons[-1] if denied else 'unknown'}"]
    out: list[str] = []
    signals = sorted(route.signals) if route.signals is not None else sorted(sender.signals)
    receivers = sorted(route.receivers - {WILDCARD})
    any_receiver = WILDCARD in route.receivers
    for sig in signals if route.signals is not None else ():
        if sig not in sender.signals:
            out.append(f"{route.sender} does not emit {sig} ({sender.source})")
        elif receivers and not any_receiver:
            verdicts = [matrix.gate_decision(route.sender, to, sig) for to in receivers]
            if not any(d.allowed for d in verdicts):
                why = "; ".join(f"→ {to}: {d.reasons[-1]}" for to, d in zip(receivers, verdicts, strict=True))
                out.append(f"{route.sender} may send {sig} to none of its receivers ({why})")
    for to in receivers:
        verdicts = [matrix.gate_decision(route.sender, to, sig) for sig in signals]
        if not any(d.allowed for d in verdicts):
            last = verdicts[-1].reasons[-1] if verdicts else "no signal"
            out.append(f"{route.sender} may send none of its signals to {to} (e.g. {last})")
    if route.zones is not None:
        for z in sorted(route.zones - {WILDCARD}):
            if not sender.admits_zone(z):
                out.append(f"{route.sender} may not work in zone {z} ({sender.source})")
    return out


@dataclass
class MatrixRow:
    """One principal's effective entry, for ``ambient matrix``."""

    name: str
    receives_from: list[str]
    sends_to: list[str]
    zone_access: list[str]
    signals: list[str]
    source: str
    routes: list[str] = field(default_factory=list)


def describe(matrix: AccessMatrix) -> list[MatrixRow]:
    """The effective matrix as rows (principals with a gate, then agents without one)."""
    rows = []
    for name in matrix.principals():
        g = matrix.gates[name]
        routes: list[str] = []
        if matrix.routing is not None and matrix.routing.restricts(name):
            routes = [
                f"→ {', '.join(sorted(r.receivers))} "
                f"[{', '.join(sorted(r.signals)) if r.signals is not None else '*'}]"
                + (f" zones {', '.join(sorted(r.zones))}" if r.zones is not None else "")
                + f" ({r.source})"
                for r in matrix.routing.routes_of(name)
            ] or ["(no route: sends nothing)"]
        rows.append(
            MatrixRow(
                name,
                sorted(g.receives_from),
                sorted(g.sends_to),
                sorted(g.zone_access),
                [str(s) for s in Signal if s in g.signals],
                g.source,
                routes,
            )
        )
    for name in sorted(matrix.ungated):
        rows.append(MatrixRow(name, [], [], [], [], "no brain.ipc gate: sends and receives nothing"))
    return rows
