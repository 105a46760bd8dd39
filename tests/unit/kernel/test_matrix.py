"""The access matrix: kernel defaults, gates, wildcards, zones, destinations, routing narrowing (DESIGN 2.3, S-10).

``reference_allows`` below is an independent re-statement of the documented rules, written from DESIGN 2.3
and the module docstring of ambient.kernel.matrix, over plain dicts read with ``yaml.safe_load``; the exhaustive
and property tests (here and in test_router.py) check the implementation against it.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from ambient.kernel.matrix import (
    KERNEL_DEFAULTS,
    AccessMatrix,
    IpcGate,
    Route,
    RoutingTable,
    apply_routing,
    decide,
    describe,
)
from ambient.kernel.packet import Signal
from ambient.kernel.zones import DEFAULT_RULES, ZoneRule, zones_below
from tests.conftest import EXAMPLE_BRAIN

ALL = [s.value for s in Signal]

# --- the independent reference -------------------------------------------------------------------

# ADR-026's table, typed again from the spec (not imported from ambient.kernel.matrix).
REFERENCE_KERNEL: dict[str, dict[str, list[str]]] = {
    "orchestrator": {"receives_from": ["human", "*"], "sends_to": ["*"], "zone_access": ["*"], "signals": ALL},
    "debug": {
        "receives_from": ["orchestrator", "human"],
        "sends_to": ["orchestrator"],
        "zone_access": ["project"],
        "signals": ["SPAWN", "RETURN", "BLOCKED_ON"],
    },
    "security": {
        "receives_from": ["orchestrator", "code-review"],
        "sends_to": ["orchestrator"],
        "zone_access": ["project"],
        "signals": ["SPAWN", "RETURN", "ESCALATE"],
    },
    "coach": {
        "receives_from": ["human"],
        "sends_to": ["human"],
        "zone_access": ["personal", "reference"],
        "signals": ["ESCALATE", "CHECKPOINT"],
    },
    "scribe": {
        "receives_from": ["orchestrator", "human"],
        "sends_to": ["orchestrator"],
        "zone_access": ["project"],
        "signals": ["SPAWN", "RETURN"],
    },
    "audit": {
        "receives_from": ["human"],
        "sends_to": ["human"],
        "zone_access": ["kernel"],
        "signals": ["RETURN", "ESCALATE"],
    },
}
REFERENCE_PRINCIPALS: dict[str, dict[str, list[str]]] = {
    "human": {"receives_from": ["*"], "sends_to": ["*"], "zone_access": ["*"], "signals": ALL},
    "ambient": {"receives_from": ["*"], "sends_to": ["*"], "zone_access": ["*"], "signals": ALL},
    "bsi": {"receives_from": ["*"], "sends_to": [], "zone_access": ["*"], "signals": []},
}


def _frontmatter(path: Path) -> dict[str, Any]:
    text = path.read_text()
    return yaml.safe_load(text.split("---")[1]) or {}


def reference_brain(root: Path) -> tuple[dict[str, dict[str, list[str]]], set[str], dict[str, Any] | None]:
    """Gates (kernel defaults overridden by frontmatter), agents without a gate, and the routing document."""
    gates = {k: dict(v) for k, v in REFERENCE_KERNEL.items()}
    ungated: set[str] = set()
    for path in sorted((root / "agents").glob("*.md")):
        fm = _frontmatter(path)
        name = fm.get("name", path.stem)
        ipc = (fm.get("brain") or {}).get("ipc")
        if ipc is None:
            if name not in gates:
                ungated.add(name)
            continue
        gates[name] = {
            k: [str(x) for x in (ipc.get(k) or [])] for k in ("receives_from", "sends_to", "zone_access", "signals")
        }
    scribe_file = root / "agents" / "scribe.md"  # a gate-less scribe: zones "as declared by scope" (ADR-026)
    if scribe_file.exists():
        brain = _frontmatter(scribe_file).get("brain") or {}
        if brain.get("ipc") is None and brain.get("scope") in ("kernel", "project", "personal"):
            gates["scribe"] = {**gates["scribe"], "zone_access": [brain["scope"]]}
    gates.update(REFERENCE_PRINCIPALS)
    routing_file = root / "profil" / "routing.yml"
    routing = yaml.safe_load(routing_file.read_text()) if routing_file.exists() else None
    return gates, ungated, routing


def _names(lst: Iterable[str], who: str) -> bool:
    lst = list(lst)
    return "*" in lst or who in lst or (who == "ambient" and "orchestrator" in lst)


def _named(lst: Iterable[str], who: str) -> bool:
    lst = list(lst)
    return who in lst or (who == "ambient" and "orchestrator" in lst)


def _reports_to(gates: Mapping[str, Mapping[str, list[str]]], child: str, parent: str) -> bool:
    """The child names the parent in sends_to and admits it in receives_from; not both ways."""
    c, p = gates[child], gates[parent]
    up = _named(c["sends_to"], parent) and _names(c["receives_from"], parent)
    down = _named(p["sends_to"], child) and _names(p["receives_from"], child)
    return up and not down


def _zone_ok(gate: Mapping[str, list[str]], zone: str) -> bool:
    return "*" in gate["zone_access"] or zone in gate["zone_access"]


def reference_allows(
    gates: Mapping[str, Mapping[str, list[str]]],
    routing: Mapping[str, Any] | None,
    frm: str,
    to: str,
    sig: str,
    zones: Iterable[str],
) -> bool:
    """DESIGN 2.3 restated: signal emitted, sends_to / receives_from, zones, destination rules, routing."""
    zones = set(zones)
    if sig not in ALL:
        return False
    if (sig == "CHECKPOINT") != (to == "bsi"):
        return False
    if sig == "HANDOFF" and to != frm:
        return False
    if to == "broadcast" and sig != "NOTIFY":
        return False
    if frm in ("bsi", "broadcast") or frm not in gates:
        return False
    fixed = to in ("bsi", "broadcast") or sig == "HANDOFF"
    if not fixed and to not in gates:
        return False
    g = gates[frm]
    if sig not in g["signals"]:
        return False
    if to == "broadcast":
        if "*" not in g["sends_to"] and "broadcast" not in g["sends_to"]:
            return False
    elif not fixed and not (_names(g["sends_to"], to) and _names(gates[to]["receives_from"], frm)):
        return False
    elif not fixed and sig == "SPAWN" and _reports_to(gates, frm, to):
        return False  # ADR-026: SPAWN goes parent → child
    elif not fixed and sig in ("RETURN", "ERROR", "ESCALATE", "BLOCKED_ON") and _reports_to(gates, to, frm):
        return False  # ADR-026: these go child → parent / agent → pilot
    if not all(_zone_ok(g, z) for z in zones):
        return False
    if not fixed and not all(_zone_ok(gates[to], z) for z in zones):
        return False
    if routing:
        routes = routing.get("routes") or []
        restricted = routing.get("default") == "deny" or any(r.get("from") == frm for r in routes)
        if restricted:
            return any(_route_ok(gates, r, to, sig, zones) for r in routes if r.get("from") == frm)
    return True


def _route_ok(
    gates: Mapping[str, Mapping[str, list[str]]], r: Mapping[str, Any], to: str, sig: str, zones: set[str]
) -> bool:
    as_list = lambda v: [v] if isinstance(v, str) else list(v or [])  # noqa: E731
    if not _names(as_list(r.get("to")), to):
        return False
    sigs = r.get("signals")
    if sigs is not None and "*" not in as_list(sigs) and sig not in as_list(sigs):
        return False
    rz = r.get("zones")
    return rz is None or "*" in as_list(rz) or zones <= set(as_list(rz))


# --- fixtures ---------------------------------------------------------------------------------------


def gate(rf: list[str], st: list[str], zones: list[str], signals: list[str], source: str = "test") -> IpcGate:
    """A gate from plain lists."""
    return IpcGate(
        receives_from=frozenset(rf),
        sends_to=frozenset(st),
        zone_access=frozenset(zones),
        signals=frozenset(Signal(s) for s in signals),
        source=source,
    )


@pytest.fixture
def kernel() -> AccessMatrix:
    """The kernel matrix alone (no agent files)."""
    return AccessMatrix.build({})


class TestKernelDefaults:
    def test_defaults_match_adr026(self) -> None:
        """The six kernel agents have ADR-026's rights."""
        for name, ref in REFERENCE_KERNEL.items():
            g = KERNEL_DEFAULTS[name]
            assert g.receives_from == set(ref["receives_from"]), name
            assert g.sends_to == set(ref["sends_to"]), name
            assert g.zone_access == set(ref["zone_access"]), name
            assert {s.value for s in g.signals} == set(ref["signals"]), name

    @pytest.mark.parametrize(
        ("frm", "to", "sig", "zone", "allowed", "rule"),
        [
            ("orchestrator", "debug", "SPAWN", "project", True, "allow"),
            ("human", "debug", "SPAWN", "project", True, "allow"),
            ("debug", "orchestrator", "RETURN", None, True, "allow"),
            ("debug", "orchestrator", "ESCALATE", None, False, "sender.signals"),
            ("debug", "human", "RETURN", None, False, "sender.sends_to"),
            ("orchestrator", "debug", "SPAWN", "kernel", False, "zone.receiver"),
            ("code-review", "security", "SPAWN", "project", False, "sender.unknown"),
            ("orchestrator", "security", "SPAWN", "project", True, "allow"),
            ("human", "security", "SPAWN", "project", False, "receiver.receives_from"),
            ("security", "orchestrator", "ESCALATE", None, True, "allow"),
            ("coach", "human", "ESCALATE", "personal", True, "allow"),
            ("coach", "human", "ESCALATE", "reference", True, "allow"),
            ("coach", "human", "ESCALATE", "project", False, "zone.sender"),
            ("orchestrator", "coach", "SPAWN", "personal", False, "receiver.receives_from"),
            ("coach", "bsi", "CHECKPOINT", "personal", True, "allow"),
            # scribe's zones are "as declared by scope": project when nothing declares them, never every zone
            ("scribe", "orchestrator", "RETURN", "project", True, "allow"),
            ("scribe", "orchestrator", "RETURN", "personal", False, "zone.sender"),
            # direction (ADR-026): SPAWN parent → child; RETURN/ERROR child → parent, ESCALATE/BLOCKED_ON → pilot
            ("debug", "orchestrator", "SPAWN", "project", False, "direction.spawn"),
            ("orchestrator", "debug", "RETURN", None, False, "direction.upward"),
            ("audit", "human", "RETURN", "kernel", True, "allow"),
            ("audit", "human", "RETURN", "project", False, "zone.sender"),
            ("orchestrator", "human", "ESCALATE", None, True, "allow"),
            ("human", "orchestrator", "ORCHESTRATE", None, True, "allow"),
        ],
    )
    def test_kernel_decisions(
        self, kernel: AccessMatrix, frm: str, to: str, sig: str, zone: str | None, allowed: bool, rule: str
    ) -> None:
        """Decisions on the kernel matrix follow ADR-026 and name the deciding rule."""
        d = decide(kernel, frm, to, sig, zone)
        assert (d.allowed, d.rule) == (allowed, rule), d.explain()


class TestPrincipals:
    def test_human_may_do_anything_the_receiver_accepts(self, kernel: AccessMatrix) -> None:
        """human emits every signal to anyone, in any zone; the receiver's gate still decides."""
        assert decide(kernel, "human", "audit", "SPAWN", "kernel").allowed
        assert not decide(kernel, "human", "security", "SPAWN").allowed

    def test_ambient_acts_as_orchestrator(self) -> None:
        """ambient is admitted wherever a list names orchestrator (SPAWN out, RETURN back)."""
        m = AccessMatrix.build({"deploy": gate(["orchestrator"], ["orchestrator"], ["project"], ["RETURN"])})
        spawn = decide(m, "ambient", "deploy", "SPAWN", "project")
        assert spawn.allowed and any("as orchestrator" in r for r in spawn.reasons)
        assert decide(m, "deploy", "ambient", "RETURN").allowed
        assert not decide(m, "ambient", "coach", "SPAWN", "personal").allowed

    def test_reserved_names_cannot_be_redefined(self) -> None:
        """An agent gate named human, ambient, bsi or broadcast is ignored."""
        nothing = gate([], [], [], [])
        m = AccessMatrix.build({"human": nothing, "ambient": nothing, "bsi": nothing})
        assert decide(m, "human", "orchestrator", "SPAWN").allowed
        assert decide(m, "ambient", "orchestrator", "SPAWN").allowed

    def test_agent_gate_replaces_default(self) -> None:
        """A declared gate is the agent's whole entry, replacing the kernel default."""
        m = AccessMatrix.build({"debug": gate(["human"], ["human"], ["kernel"], ["ESCALATE"], "agents/debug.md:9")})
        assert not decide(m, "orchestrator", "debug", "SPAWN").allowed
        d = decide(m, "debug", "human", "ESCALATE", "kernel")
        assert d.allowed and d.source == "agents/debug.md:9"

    def test_agent_without_gate_is_inert(self) -> None:
        """An agent with no brain.ipc gate (and no kernel default) sends and receives nothing."""
        m = AccessMatrix.build({"loner": None, "debug": None})
        d = decide(m, "orchestrator", "loner", "SPAWN")
        assert (d.allowed, d.rule) == (False, "receiver.no-gate")
        assert decide(m, "loner", "orchestrator", "RETURN").rule == "sender.no-gate"
        # a kernel agent without a declaration keeps its default
        assert decide(m, "orchestrator", "debug", "SPAWN", "project").allowed

    def test_unknown_principal(self, kernel: AccessMatrix) -> None:
        """Names nobody declared are denied as unknown, in both roles."""
        assert decide(kernel, "ghost", "orchestrator", "RETURN").rule == "sender.unknown"
        assert decide(kernel, "orchestrator", "ghost", "SPAWN").rule == "receiver.unknown"


class TestWildcardsAndSignals:
    def test_wildcards(self) -> None:
        """'*' in receives_from / sends_to admits any principal."""
        m = AccessMatrix.build(
            {
                "hub": gate(["*"], ["*"], ["project"], ["SPAWN", "RETURN"]),
                "leaf": gate(["hub"], ["*"], ["project"], ["RETURN"]),
            }
        )
        assert decide(m, "hub", "leaf", "SPAWN", "project").allowed
        assert decide(m, "leaf", "hub", "RETURN").allowed
        assert decide(m, "leaf", "human", "RETURN").allowed
        assert not decide(m, "debug", "leaf", "RETURN").allowed

    def test_orchestration_signals_are_authorized_like_kernel_ones(self) -> None:
        """Extra signals (spec/004) pass only when the sender lists them."""
        m = AccessMatrix.build(
            {"kernel-orchestrator": gate(["human"], ["human"], ["kernel", "project"], ["STEP_DONE", "DONE"])}
        )
        assert decide(m, "kernel-orchestrator", "human", "STEP_DONE").allowed
        assert decide(m, "kernel-orchestrator", "human", "CIRCUIT_BREAK").rule == "sender.signals"

    def test_unknown_signal_is_a_deny_not_an_error(self, kernel: AccessMatrix) -> None:
        """decide never raises: an unknown signal string is a deny naming the rule."""
        d = decide(kernel, "human", "debug", "INFO")
        assert (d.allowed, d.rule) == (False, "signal.unknown")


class TestDestinations:
    def test_checkpoint_and_claims_store(self, kernel: AccessMatrix) -> None:
        """CHECKPOINT only to bsi; bsi gets nothing else and never sends."""
        assert decide(kernel, "coach", "human", "CHECKPOINT").rule == "packet.destination"
        assert decide(kernel, "human", "bsi", "RETURN").rule == "packet.destination"
        assert decide(kernel, "bsi", "human", "RETURN").rule == "sender.unknown"
        assert decide(kernel, "debug", "bsi", "CHECKPOINT").rule == "sender.signals"

    def test_handoff_to_self_only(self) -> None:
        """HANDOFF goes to the sender's own next session; sends_to is not needed for it."""
        m = AccessMatrix.build({"scribe": gate([], [], ["kernel"], ["HANDOFF"])})
        assert decide(m, "scribe", "scribe", "HANDOFF", "kernel").allowed
        assert decide(m, "scribe", "orchestrator", "HANDOFF").rule == "packet.destination"
        assert decide(m, "scribe", "scribe", "HANDOFF", "personal").rule == "zone.sender"

    def test_broadcast(self) -> None:
        """broadcast: NOTIFY only, sender needs '*' or broadcast in sends_to; recipients filtered by receives_from."""
        m = AccessMatrix.build(
            {
                "herald": gate([], ["broadcast"], ["project"], ["NOTIFY"]),
                "mute": gate([], ["orchestrator"], ["project"], ["NOTIFY"]),
                "fan": gate(["herald"], [], ["project"], []),
            }
        )
        assert decide(m, "herald", "broadcast", "NOTIFY").allowed
        assert decide(m, "herald", "broadcast", "SPAWN").rule == "packet.destination"
        assert decide(m, "mute", "broadcast", "NOTIFY").rule == "sender.sends_to"
        recipients = m.broadcast_recipients("herald")
        assert "fan" in recipients and "orchestrator" in recipients and "debug" not in recipients
        assert "bsi" not in recipients and "herald" not in recipients


class TestZones:
    def test_unknown_zone_is_a_plain_name(self, kernel: AccessMatrix) -> None:
        """'reference' grants only packets naming it; it never widens a kernel zone."""
        assert decide(kernel, "human", "coach", "SPAWN", "reference").allowed
        assert decide(kernel, "human", "coach", "SPAWN", "kernel").rule == "zone.receiver"
        assert decide(kernel, "human", "debug", "SPAWN", "reference").rule == "zone.receiver"

    def test_file_zones(self, kernel: AccessMatrix) -> None:
        """Every scope file's zone must be allowed; the most specific rule wins."""
        assert decide(kernel, "human", "debug", "SPAWN", "project", ["projets/app/main.py"]).allowed
        d = decide(kernel, "human", "debug", "SPAWN", "project", ["projets/a.py", "profil/capital.md"])
        assert (d.allowed, d.rule) == (False, "zone.receiver") and "personal" in d.reasons[-1]
        assert decide(kernel, "human", "coach", "SPAWN", None, ["profil/capital.md"]).allowed

    def test_folder_scope_touches_every_zone_below(self, kernel: AccessMatrix) -> None:
        """A folder scope (profil/) touches kernel and the personal files inside it."""
        assert zones_below("profil/") == {"kernel", "personal"}
        m = AccessMatrix.build({"k": gate(["human"], ["human"], ["kernel"], ["RETURN"])})
        assert decide(m, "human", "k", "SPAWN", None, ["profil/x.md"]).allowed
        assert decide(m, "human", "k", "SPAWN", None, ["profil/"]).rule == "zone.receiver"

    def test_unsafe_file_is_a_deny(self, kernel: AccessMatrix) -> None:
        """A path leaving the brain is in no zone: denied, never raised."""
        d = decide(kernel, "human", "debug", "SPAWN", "project", ["../etc/passwd"])
        assert (d.allowed, d.rule) == (False, "zone.unsafe-path")

    def test_brain_zone_rules(self, kernel: AccessMatrix) -> None:
        """A brain's own rules can put files in a named zone such as reference."""
        rules = (*DEFAULT_RULES, ZoneRule(prefix="reference/", zone="reference"))
        assert decide(kernel, "human", "coach", "SPAWN", None, ["reference/book.md"], rules).allowed
        assert not decide(kernel, "human", "coach", "SPAWN", None, ["reference/book.md"]).allowed

    def test_file_zones_override(self, kernel: AccessMatrix) -> None:
        """The router may pass zones computed after resolving symlinks."""
        d = decide(kernel, "human", "debug", "SPAWN", "project", ["projets/link"], file_zones={"personal"})
        assert d.rule == "zone.receiver"


class TestExplain:
    def test_decision_explains_itself(self, kernel: AccessMatrix) -> None:
        """A decision names its rule, its source and every check that passed before it."""
        d = decide(kernel, "debug", "orchestrator", "ESCALATE")
        text = d.explain()
        assert text.startswith("DENY by rule sender.signals (kernel default (ADR-026))")
        assert "debug emits BLOCKED_ON, RETURN, SPAWN; ESCALATE is not one of them" in text
        ok = decide(kernel, "orchestrator", "debug", "SPAWN", "project")
        assert ok.allowed and len(ok.reasons) == 4

    def test_describe_rows(self, kernel: AccessMatrix) -> None:
        """describe lists every principal and the agents without a gate."""
        m = AccessMatrix.build({"loner": None})
        names = [r.name for r in describe(m)]
        assert names[-1] == "loner" and {"human", "ambient", "bsi", "orchestrator"} <= set(names)


class TestGateParsing:
    def test_parse_lenient(self) -> None:
        """Bad items are dropped with a located issue; unknown zones are kept with a warning."""
        g, issues = IpcGate.parse(
            {
                "receives_from": ["human", 3, "*"],
                "sends_to": "orchestrator",
                "zone_access": ["project", "reference", "Bad Zone"],
                "signals": ["RETURN", "INFO", "STEP_DONE"],
                "color": "blue",
            },
            source="agents/x.md:5",
        )
        assert g.receives_from == {"human", "*"} and g.sends_to == {"orchestrator"}
        assert g.zone_access == {"project", "reference"}
        assert g.signals == {Signal.RETURN, Signal.STEP_DONE}
        by_loc = {i.loc: i for i in issues}
        assert by_loc[("receives_from", 1)].severity == "error"
        assert by_loc[("zone_access", 1)].severity == "warning"
        assert by_loc[("zone_access", 2)].severity == "error"
        assert "INFO" in by_loc[("signals", 1)].message
        assert ("color",) in by_loc

    def test_parse_not_a_mapping(self) -> None:
        """A gate that is not a mapping allows nothing (never the kernel default)."""
        g, issues = IpcGate.parse(["SPAWN"], source="x")
        assert not g.signals and issues[0].severity == "error"

    def test_missing_keys_allow_nothing(self) -> None:
        """A missing key is an empty list, with a warning."""
        g, issues = IpcGate.parse({"signals": ["RETURN"]}, source="x")
        assert not g.sends_to and len(issues) == 3

    def test_signal_wildcard(self) -> None:
        """signals: ['*'] means every signal."""
        g, _ = IpcGate.parse({"signals": ["*"], "receives_from": [], "sends_to": [], "zone_access": []}, source="x")
        assert g.signals == set(Signal)


def _route(
    sender: str, to: list[str], signals: list[str] | None = None, zones: list[str] | None = None, line: int = 1
) -> Route:
    return Route(
        sender,
        frozenset(to),
        None if signals is None else frozenset(Signal(s) for s in signals),
        None if zones is None else frozenset(zones),
        "profil/routing.yml",
        line,
    )


class TestRouting:
    def test_routes_narrow(self, kernel: AccessMatrix) -> None:
        """A restricted sender may only send along its routes; others keep their rights."""
        table = RoutingTable(routes=(_route("human", ["debug"], ["SPAWN"], ["project"]),))
        m, problems = apply_routing(kernel, table)
        assert problems == []
        assert decide(m, "human", "debug", "SPAWN", "project").allowed
        d = decide(m, "human", "audit", "SPAWN", "kernel")
        assert (d.rule, d.source) == ("routing", "profil/routing.yml")
        assert decide(m, "human", "debug", "SPAWN", "kernel").rule in ("zone.receiver", "routing")
        assert decide(m, "orchestrator", "audit", "SPAWN").rule == "receiver.receives_from"
        assert decide(m, "orchestrator", "debug", "SPAWN").allowed

    def test_widening_entry_is_an_error_and_not_applied(self, kernel: AccessMatrix) -> None:
        """An entry claiming what the gates deny is an error at its line, and its sender stays restricted."""
        table = RoutingTable(
            routes=(
                _route("debug", ["orchestrator"], ["ESCALATE"], line=7),  # debug does not emit ESCALATE
                _route("coach", ["orchestrator"], line=9),  # coach may send nothing to orchestrator
                _route("audit", ["human"], ["RETURN"], ["personal"], line=11),  # audit has no personal zone
                _route("ghost", ["human"], line=13),
            )
        )
        m, problems = apply_routing(kernel, table)
        assert [p.line for p in problems] == [7, 9, 11, 13]
        assert all(p.severity == "error" and "widens the access matrix" in p.message for p in problems)
        assert "debug does not emit ESCALATE" in problems[0].message
        # debug is still restricted: its dropped route does not fall back to the full matrix
        assert decide(m, "debug", "orchestrator", "RETURN").rule == "routing"

    def test_product_with_impossible_pairs_is_fine(self, kernel: AccessMatrix) -> None:
        """Receivers x signals may contain pairs the matrix denies (bsi x RETURN) as long as each name is useful."""
        table = RoutingTable(routes=(_route("coach", ["human", "bsi"], ["ESCALATE", "CHECKPOINT"]),))
        m, problems = apply_routing(kernel, table)
        assert problems == []
        assert decide(m, "coach", "bsi", "CHECKPOINT", "personal").allowed
        assert not decide(m, "coach", "human", "CHECKPOINT").allowed

    def test_default_deny(self, kernel: AccessMatrix) -> None:
        """default: deny restricts every sender to its routes."""
        m, _ = apply_routing(kernel, RoutingTable(default_deny=True, routes=(_route("human", ["*"]),)))
        assert decide(m, "human", "debug", "SPAWN", "project").allowed
        assert decide(m, "orchestrator", "debug", "SPAWN").rule == "routing"

    def test_route_wildcards_and_alias(self) -> None:
        """'*' receivers/signals defer to the matrix; a route to orchestrator also carries ambient."""
        m0 = AccessMatrix.build({"deploy": gate(["orchestrator"], ["orchestrator"], ["project"], ["RETURN", "ERROR"])})
        m, problems = apply_routing(m0, RoutingTable(routes=(_route("deploy", ["orchestrator"], ["RETURN"]),)))
        assert problems == []
        assert decide(m, "deploy", "ambient", "RETURN").allowed
        assert decide(m, "deploy", "ambient", "ERROR").rule == "routing"


# --- S-10: every (sender, receiver, signal, zone) cell against the reference ---------------------------


@functools.lru_cache(maxsize=4)
def _matrix_of(root: Path) -> AccessMatrix:
    """The effective matrix of a brain on disk (cached: the corpus is read-only)."""
    from ambient.kernel.routing_table import build_matrix
    from ambient.storage.paths import BrainPaths

    return build_matrix(BrainPaths(root)).matrix


def _exhaustive(root: Path, zones: list[str | None]) -> int:
    matrix = _matrix_of(root)
    gates, ungated, routing = reference_brain(root)
    names = sorted(set(gates) | ungated | {"broadcast", "ghost"})
    cells = 0
    for frm, to, sig, zone in itertools.product(names, names, ALL, zones):
        zs = [] if zone is None else [zone]
        got = decide(matrix, frm, to, sig, zone).allowed
        want = reference_allows(gates, routing, frm, to, sig, zs)
        assert got == want, (
            f"{frm} → {to} {sig} zone {zone}: got {got}, reference {want}\n"
            + decide(matrix, frm, to, sig, zone).explain()
        )
        cells += 1
    return cells


def test_s10_example_brain_every_cell() -> None:
    """S-10: every (sender, receiver, signal, zone) cell of the example brain matches the reference."""
    cells = _exhaustive(EXAMPLE_BRAIN, [None, "project", "kernel", "personal", "reference"])
    assert cells > 10_000


@pytest.mark.slow
def test_s10_corpus_every_cell(corpus: Path) -> None:
    """S-10: every cell of the 56-agent corpus matrix matches the reference (no routing table there)."""
    assert _exhaustive(corpus, [None, "project"]) > 100_000


class TestCorpusByHand:
    """Decisions on the real corpus, checked by hand against the agents' frontmatter."""

    @pytest.mark.parametrize(
        ("frm", "to", "sig", "zone", "allowed", "rule"),
        [
            # debug.md: signals [SPAWN, RETURN, BLOCKED_ON]
            ("debug", "orchestrator", "ESCALATE", None, False, "sender.signals"),
            # security.md: receives_from [orchestrator, code-review, human];
            # code-review.md: sends_to [orchestrator, security]
            ("code-review", "security", "SPAWN", "project", True, "allow"),
            # security.md: sends_to [orchestrator] only
            ("security", "code-review", "RETURN", None, False, "sender.sends_to"),
            # coach.md: zone_access [personal, reference]
            ("coach", "human", "ESCALATE", "reference", True, "allow"),
            ("coach", "human", "ESCALATE", "project", False, "zone.sender"),
            # learning-journal.md sends_to coach-scribe, but coach-scribe.md receives_from [human, coach]
            ("learning-journal", "coach-scribe", "RETURN", None, False, "receiver.receives_from"),
            # vps.md: sends_to [orchestrator], although pm2.md receives_from vps
            ("vps", "pm2", "SPAWN", "project", False, "sender.sends_to"),
            ("orchestrator", "pm2", "SPAWN", "project", True, "allow"),
            # integrator.md emits HANDOFF: only to itself (its next session)
            ("integrator", "context-broker", "HANDOFF", None, False, "packet.destination"),
            ("integrator", "integrator", "HANDOFF", "project", True, "allow"),
            # helloWorld.md: sends_to [human, orchestrator]
            ("helloWorld", "onboarding-guide", "SPAWN", None, False, "sender.sends_to"),
            # satellite-boot.md receives from kernel-orchestrator, which has no agent file in the corpus
            ("kernel-orchestrator", "satellite-boot", "SPAWN", "kernel", False, "sender.unknown"),
            # the daemon acts as orchestrator: debug.md receives_from [orchestrator, human]
            ("ambient", "debug", "SPAWN", "project", True, "allow"),
            ("ambient", "coach", "SPAWN", "personal", False, "receiver.receives_from"),
            # orchestrator.md zone_access [kernel, project, personal]: no 'reference' to receive in
            ("metabolism-scribe", "orchestrator", "RETURN", "reference", False, "zone.receiver"),
            ("metabolism-scribe", "orchestrator", "RETURN", "personal", True, "allow"),
            # time-anchor.md emits CHECKPOINT in kernel
            ("time-anchor", "bsi", "CHECKPOINT", "kernel", True, "allow"),
        ],
    )
    def test_corpus_decision(
        self, corpus: Path, frm: str, to: str, sig: str, zone: str | None, allowed: bool, rule: str
    ) -> None:
        """A decision on the corpus agrees with their frontmatter, read by hand."""
        d = decide(_matrix_of(corpus), frm, to, sig, zone)
        assert (d.allowed, d.rule) == (allowed, rule), d.explain()


class TestCli:
    """`ambient matrix` and `ambient matrix explain` (exit 0 allow, 1 deny, 2 bad input)."""

    def test_show(self, make_brain: Any, capsys: pytest.CaptureFixture[str]) -> None:
        """The effective matrix lists principals, gates with their source and the routes."""
        from ambient.cli import main

        root = make_brain()
        assert main(["matrix", "--brain", str(root)]) == 0
        text = capsys.readouterr().out
        assert "routing table: profil/routing.yml (default: matrix, 5 routes applied)" in text
        assert "deploy  [agents/deploy.md:10]" in text and "route:         → ambient, human, orchestrator" in text
        assert "human  [kernel principal: the person (pilot)]" in text

    def test_show_json_and_problems(self, make_brain: Any, capsys: pytest.CaptureFixture[str]) -> None:
        """--json prints rows and problems; problems also go to stderr with file:line."""
        from ambient.cli import main

        root = make_brain()
        (root / "agents" / "bad.md").write_text("---\nname: [x\n---\n")
        assert main(["matrix", "--brain", str(root), "--json"]) == 0
        captured = capsys.readouterr()
        data = yaml.safe_load(captured.out)
        assert any(r["name"] == "vps" for r in data["principals"])
        assert data["problems"][0].startswith("agents/bad.md:3:")
        assert "agents/bad.md:3:" in captured.err

    @pytest.mark.parametrize(
        ("argv", "code", "expected"),
        [
            (["ambient", "deploy", "SPAWN", "--zone", "project"], 0, "ALLOW by rule allow"),
            (["ambient", "deploy", "SPAWN", "--file", "infrastructure/vps/a.yml", "--file", "todo/"], 0, "ALLOW"),
            (["deploy", "coach", "RETURN"], 1, "DENY by rule sender.sends_to (agents/deploy.md:10)"),
            (["scribe", "ambient", "RETURN", "--zone", "kernel"], 1, "DENY by rule routing (profil/routing.yml)"),
            (["ambient", "deploy", "SPAWN", "--file", "profil/capital.md"], 1, "not in zone personal"),
            (["ghost", "deploy", "SPAWN"], 1, "DENY by rule sender.unknown"),
        ],
    )
    def test_explain(
        self, make_brain: Any, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, expected: str
    ) -> None:
        """explain prints the verdict with the exact rule and its source; the exit code says allow or deny."""
        from ambient.cli import main

        root = make_brain()
        assert main(["matrix", "explain", "--brain", str(root), *argv]) == code
        assert expected in capsys.readouterr().out

    @pytest.mark.parametrize(
        ("argv", "expected"),
        [
            (["ambient", "deploy", "SPOON"], "unknown signal 'SPOON'"),
            (["ambient", "deploy", "SPAWN", "--zone", "Not A Zone"], "is not a zone name"),
            (["ambient", "deploy", "SPAWN", "--file", "../etc/passwd"], "contains '..'"),
            (["ambient", "deploy", "SPAWN", "--file", "/etc/passwd"], "is absolute"),
            (["ambient", "deploy"], ""),
        ],
    )
    def test_explain_bad_input(
        self, make_brain: Any, capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
    ) -> None:
        """Bad input exits 2 with a clear message."""
        from ambient.cli import main

        root = make_brain()
        assert main(["matrix", "explain", "--brain", str(root), *argv]) == 2
        assert expected in capsys.readouterr().err

    def test_explain_symlink_out(self, make_brain: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A file that leaves the brain through a symlink is bad input, not a zone."""
        import os

        from ambient.cli import main

        root = make_brain()
        os.symlink(tmp_path, root / "projets")
        assert main(["matrix", "explain", "--brain", str(root), "human", "deploy", "SPAWN", "--file", "projets/x"]) == 2
        assert "outside the brain root" in capsys.readouterr().err

    def test_explain_json_and_missing_brain(
        self, make_brain: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--json gives allowed, rule, source and reasons; a missing brain is exit 2."""
        from ambient.cli import main

        root = make_brain()
        assert main(["matrix", "explain", "--brain", str(root), "--json", "coach", "bsi", "CHECKPOINT"]) == 0
        data = yaml.safe_load(capsys.readouterr().out)
        assert data["allowed"] is True and data["rule"] == "allow" and data["reasons"]
        assert main(["matrix", "--brain", str(tmp_path / "none")]) == 2
        assert main(["matrix", "explain", "--brain", str(tmp_path / "none"), "a", "b", "RETURN"]) == 2


def test_a_gate_less_scribes_zones_follow_its_declared_scope(tmp_path: Path) -> None:
    """ADR-026: scribe works in the zones "as declared by scope": its file's brain.scope, else project; a scribe
    with scope: project is never SPAWNed on a personal path."""
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "scribe.md").write_text("---\nname: scribe\nbrain: {scope: project}\n---\n")
    from ambient.kernel.routing_table import build_matrix
    from ambient.storage.paths import BrainPaths

    bm = build_matrix(BrainPaths(tmp_path))
    assert decide(bm.matrix, "orchestrator", "scribe", "SPAWN", files=["MYSECRETS"]).rule == "zone.receiver"
    assert decide(bm.matrix, "orchestrator", "scribe", "SPAWN", files=["projets/x/README.md"]).allowed
    (tmp_path / "agents" / "scribe.md").write_text("---\nname: scribe\nbrain: {scope: kernel}\n---\n")
    kernel = build_matrix(BrainPaths(tmp_path)).matrix
    assert decide(kernel, "orchestrator", "scribe", "SPAWN", files=["agents/x.md"]).allowed
    assert not decide(kernel, "orchestrator", "scribe", "SPAWN", files=["projets/x/README.md"]).allowed
