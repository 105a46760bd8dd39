"""Claims core: the model, inference, human-gate transitions, TTL, the satellite conflict matrix."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from ambient.claims import claim as C
from ambient.claims.claim import Claim, apply, conflicts, mark_stale
from ambient.core.errors import TransitionError, UnsafePathError

NOW = datetime(2026, 3, 16, 21, 0, tzinfo=UTC)


def mk(sess_id: str = "s", status: str = "open", **fields: Any) -> Claim:
    doc: dict[str, Any] = {
        "sess_id": sess_id,
        "type": fields.pop("type", "satellite"),
        "scope": fields.pop("scope", "agents/"),
        "agent": "satellite-boot",
        "status": status,
        "opened_at": fields.pop("opened_at", "2026-03-16T20:46"),
    }
    doc.update(fields)
    return Claim.model_validate(doc)


def family(**statuses: str) -> dict[str, Claim]:
    """p (pilote) → d (domain) → l1, l2 (leaves); x unrelated. Statuses by name override 'open'."""
    spec = {
        "p": {"type": "pilote"},
        "d": {"satellite_type": "domain", "satellite_level": "domain", "parent_satellite": "p"},
        "l1": {"satellite_type": "code", "parent_satellite": "d"},
        "l2": {"satellite_type": "search", "parent_satellite": "d"},
        "x": {"satellite_type": "code"},
    }
    return {sid: mk(sid, statuses.get(sid, "open"), **dict(f)) for sid, f in spec.items()}


class TestModel:
    def test_spec_examples_load(self) -> None:
        """The four claim examples of spec/002 validate."""
        pilote = mk(
            "sess-20260316-2036-pilote-be5-wrap",
            type="pilote",
            scope="brain-engine/",
            handoff_level=0,
            story_angle="Pilote BE-5 wrap",
        )
        leaf = mk(
            "sess-20260316-2145-brain-engine-code",
            satellite_type="code",
            satellite_level="leaf",
            parent_satellite=pilote.sess_id,
            on_done="trigger → type:test scope:brain-engine/",
            on_partial="signal → CHECKPOINT pilote",
            on_fail="signal → BLOCKED_ON pilote",
        )
        assert pilote.close_tier == 3 and leaf.close_tier == 2
        assert leaf.on_done == "trigger → type:test scope:brain-engine/"

    def test_unknown_type_is_kept_with_a_warning(self) -> None:
        """type: explore (the real corpus) loads, is kept on rewrite, and is reported as a warning."""
        claim = mk(type="explore", zone="project", result_status="success")
        doc = claim.to_document()
        assert doc["type"] == "explore" and doc["zone"] == "project" and doc["result_status"] == "success"
        keys = [loc for loc, _ in claim.warnings()]
        assert ("type",) in keys and ("zone",) in keys

    def test_missing_required_field_fails(self) -> None:
        """A claim without scope is invalid (pydantic names the field)."""
        with pytest.raises(ValueError, match="scope"):
            Claim.model_validate({"sess_id": "s", "type": "solo", "agent": "a", "status": "open", "opened_at": "x"})

    @pytest.mark.parametrize("bad", ["", "a/b", ".hidden", "x\x00", " lead", "a" * 201, "new\nline"])
    def test_sess_id_must_be_a_file_name(self, bad: str) -> None:
        """sess_id becomes claims/<sess_id>.yml, so it cannot hold a path or control characters."""
        with pytest.raises(ValueError, match="sess_id"):
            mk(bad)

    def test_document_keeps_order_and_unknown_nested_keys(self) -> None:
        """to_document returns the user's keys in their order, including unknown keys inside result."""
        doc = {
            "zzz": 1,
            "sess_id": "s",
            "type": "solo",
            "scope": "x/",
            "agent": "a",
            "status": "closed",
            "opened_at": "2026-01-01T00:00",
            "result": {"status": "ok", "custom": [1, 2], "tests": {"failed": 0, "flaky": 2}},
        }
        assert Claim.model_validate(doc).to_document() == doc
        assert list(Claim.model_validate(doc).to_document()) == list(doc)

    @given(
        st.dictionaries(
            st.text("abcdefghij_", min_size=1, max_size=8).filter(lambda k: k not in Claim.model_fields),
            st.recursive(
                st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                lambda inner: (
                    st.lists(inner, max_size=3) | st.dictionaries(st.text("xyz", max_size=3), inner, max_size=3)
                ),
                max_leaves=6,
            ),
            max_size=5,
        )
    )
    @pytest.mark.slow
    def test_unknown_keys_survive_a_transition(self, extra: dict[str, Any]) -> None:
        """Whatever unknown keys a claim carries, a transition keeps them and their values unchanged."""
        claim = Claim.model_validate({**mk().to_document(), **extra})
        after = apply({"s": claim}, "s", "gate", "why", NOW)["s"].to_document()
        for key, value in extra.items():
            assert after[key] == value


class TestInference:
    @pytest.mark.parametrize(
        ("ctype", "sat_type", "level", "tier"),
        [
            ("satellite", "brain-write", None, 1),
            ("satellite", "search", "leaf", 1),
            ("satellite", "deploy", None, 1),
            ("satellite", "code", None, 2),
            ("satellite", "test", "leaf", 2),
            ("satellite", "code", "domain", 3),
            ("satellite", "domain", None, 3),
            ("pilote", None, None, 3),
            ("solo", None, None, 1),
            ("explore", None, None, 1),
        ],
    )
    def test_close_tier(self, ctype: str, sat_type: str | None, level: str | None, tier: int) -> None:
        """close_tier follows spec/002 v1.4 (a domain satellite_type counts as a coordinator)."""
        assert mk(type=ctype, satellite_type=sat_type, satellite_level=level).close_tier == tier

    @pytest.mark.parametrize(
        ("scope", "zone"),
        [
            ("agents/", "kernel"),
            ("profil/capital.md", "personal"),
            ("todo/x.md", "project"),
            ("brain-engine/", "project"),
            ("progression/", "personal"),
            ("KERNEL.md", "kernel"),
        ],
    )
    def test_zone_from_scope(self, scope: str, zone: str) -> None:
        """zone is inferred from scope with the most specific rule (spec/002 v1.5)."""
        assert mk(scope=scope).zone == zone

    def test_escaping_scope(self) -> None:
        """An escaping scope has no zone (it raises) and is warned about."""
        bad = mk(scope="../outside/")
        with pytest.raises(UnsafePathError):
            _ = bad.zone
        assert any(loc == ("scope",) for loc, _ in bad.warnings())

    def test_written_close_tier_is_ignored_but_kept(self) -> None:
        """A close_tier written by hand is kept as-is in the document but never used."""
        claim = mk(satellite_type="code", close_tier=3)
        assert claim.close_tier == 2 and claim.to_document()["close_tier"] == 3


ALLOWED = {
    ("open", "gate"): "waiting_human",
    ("waiting_human", "approve"): "open",
    ("waiting_human", "reject"): "failed",
    ("open", "pause"): "paused",
    ("waiting_human", "pause"): "paused",
    ("paused", "resume"): "open",
    ("open", "abort"): "failed",
    ("waiting_human", "abort"): "failed",
    ("paused", "abort"): "failed",
    ("stale", "abort"): "failed",
    ("open", "close"): "closed",
    ("stale", "close"): "closed",
}


class TestTransitions:
    @pytest.mark.parametrize("status", C.STATUSES)
    @pytest.mark.parametrize("action", C.ACTIONS)
    def test_transition_table(self, status: str, action: str) -> None:
        """Every (status, action) pair either reaches the table's status or raises and changes nothing."""
        claim = mk(status=status, satellite_type="search")
        before = claim.to_document()
        result = {"status": "ok"} if action == "close" else None
        if (status, action) in ALLOWED:
            out = apply({"s": claim}, "s", action, "m", NOW, result=result)
            assert out["s"].status == ALLOWED[(status, action)]
            entry = out["s"].gate_history[-1]
            assert entry["action"] == action and entry["from"] == status and entry["message"] == "m"
            assert entry["at"] == "2026-03-16T21:00:00+00:00"
        else:
            with pytest.raises(TransitionError, match=f"cannot {action} claim s: it is"):
                apply({"s": claim}, "s", action, "m", NOW, result=result)
        assert claim.to_document() == before

    def test_unknown_claim_action_and_status(self) -> None:
        """Unknown ids, actions and statuses are refused with a message that says what is expected."""
        with pytest.raises(TransitionError, match="no claim 'nope'"):
            apply({}, "nope", "gate", None, NOW)
        with pytest.raises(TransitionError, match="expected one of gate, approve"):
            apply({"s": mk()}, "s", "launch", None, NOW)
        with pytest.raises(TransitionError, match="fix the file by hand"):
            apply({"s": mk(status="done")}, "s", "gate", None, NOW)

    def test_naive_now_is_refused(self) -> None:
        """Core rules need an aware now (claims hold local times)."""
        with pytest.raises(ValueError, match="aware"):
            apply({"s": mk()}, "s", "gate", None, datetime(2026, 1, 1))

    def test_pause_cascades_and_resume_brings_back_only_the_cascade(self) -> None:
        """Pause marks open/waiting descendants paused_by the root; resume restores those, not others."""
        claims = family(l2="waiting_human")
        claims["l1"] = apply(claims, "l1", "pause", "mine", NOW)["l1"]  # paused on its own, before
        paused = apply(claims, "p", "pause", "stop all", NOW)
        assert set(paused) == {"p", "d", "l2"}
        assert paused["d"].paused_by == "p" and paused["l2"].paused_from == "waiting_human"
        assert paused["d"].gate_history[-1]["cascade"] == "p"
        claims.update(paused)
        resumed = apply(claims, "p", "resume", None, NOW)
        assert set(resumed) == {"p", "d", "l2"}
        assert resumed["l2"].status == "waiting_human"  # a pending human gate is not skipped by pause/resume
        assert resumed["d"].status == "open" and resumed["d"].paused_by is None
        assert "paused_by" not in resumed["d"].to_document()
        claims.update(resumed)
        assert claims["l1"].status == "paused"

    def test_cascade_paused_child_cannot_resume_alone(self) -> None:
        """A child paused by its parent's pause resumes with the parent, not by itself."""
        claims = family()
        claims.update(apply(claims, "p", "pause", None, NOW))
        with pytest.raises(TransitionError, match="resume p instead"):
            apply(claims, "d", "resume", None, NOW)

    def test_abort_cascades_to_every_non_terminal_descendant(self) -> None:
        """Abort fails the claim and all non-terminal descendants; closed ones and strangers stay."""
        claims = family(l2="closed", l1="paused")
        out = apply(claims, "d", "abort", "wrong plan", NOW)
        assert set(out) == {"d", "l1"}
        assert all(c.status == "failed" for c in out.values())
        assert out["l1"].gate_history[-1]["cascade"] == "d"

    def test_cycles_in_parent_links_terminate(self) -> None:
        """a → b → a parent links do not loop forever."""
        claims = {"a": mk("a", parent_satellite="b"), "b": mk("b", parent_satellite="a")}
        out = apply(claims, "a", "pause", None, NOW)
        assert set(out) == {"a", "b"}

    def test_close_tier2_needs_green_tests(self) -> None:
        """A validated (code/test) claim closes ok only with result.tests.failed == 0."""
        claims = {"s": mk(satellite_type="code")}
        with pytest.raises(TransitionError, match=r"needs result\.tests"):
            apply(claims, "s", "close", None, NOW, result={"status": "ok"})
        with pytest.raises(TransitionError, match="failed is 2"):
            apply(claims, "s", "close", None, NOW, result={"status": "ok", "tests": {"total": 5, "failed": 2}})
        out = apply(claims, "s", "close", None, NOW, result={"status": "partial"})
        assert out["s"].status == "closed" and out["s"].closed_at == "2026-03-16T21:00:00+00:00"
        ok = apply(
            claims, "s", "close", None, NOW, result={"status": "ok", "tests": {"total": 5, "passed": 5, "failed": 0}}
        )
        assert ok["s"].result is not None and ok["s"].result.shape == 2

    def test_close_tier3_waits_for_children_and_aggregates(self) -> None:
        """An orchestrated claim closes only once its children are terminal; children are aggregated."""
        claims = family()
        with pytest.raises(TransitionError, match="l1 \\(open\\), l2 \\(open\\)"):
            apply(claims, "d", "close", None, NOW, result={"status": "ok"})
        claims = family(l1="closed", l2="failed")
        out = apply(claims, "d", "close", None, NOW, result={"status": "ok", "notes": "done"})
        assert out["d"].result is not None and out["d"].result.children == ["l1", "l2"]

    def test_close_needs_a_known_result_status(self) -> None:
        """close without a result, or with a result.status outside ok/partial/failed, is refused."""
        with pytest.raises(TransitionError, match="without a result"):
            apply({"s": mk()}, "s", "close", None, NOW)
        with pytest.raises(TransitionError, match="'done' is not one of"):
            apply({"s": mk()}, "s", "close", None, NOW, result={"status": "done"})


class TestStale:
    def test_open_claim_past_ttl_goes_stale(self) -> None:
        """An open claim older than its TTL is stale; younger ones, waiting and paused ones are not."""
        claims = {
            "old": mk("old", ttl=30, opened_at="2026-03-16T20:00"),
            "young": mk("young", ttl="2h", opened_at="2026-03-16T20:00"),
            "wait": mk("wait", status="waiting_human", ttl=1),
            "nottl": mk("nottl"),
        }
        out = mark_stale(claims, NOW)
        assert set(out) == {"old"}
        assert out["old"].status == "stale" and "TTL (30 min)" in out["old"].gate_history[-1]["message"]
        assert set(mark_stale(claims, NOW, default_ttl=timedelta(minutes=10))) == {"old", "nottl"}

    def test_naive_times_are_read_in_nows_zone(self) -> None:
        """opened_at without an offset is local time: the same instant in another zone is not stale yet."""
        claim = {"s": mk(opened_at="2026-03-16T21:30", ttl=60)}
        paris = timezone(timedelta(hours=1))
        assert mark_stale(claim, datetime(2026, 3, 16, 21, 45, tzinfo=paris)) == {}
        assert set(mark_stale(claim, datetime(2026, 3, 16, 22, 45, tzinfo=paris))) == {"s"}

    def test_last_gate_activity_restarts_the_ttl(self) -> None:
        """An approval renews the claim: the TTL counts from the last gate_history entry."""
        claim = mk(
            opened_at="2026-03-16T10:00",
            ttl=60,
            gate_history=[{"at": "2026-03-16T20:30:00+00:00", "action": "approve"}],
        )
        assert mark_stale({"s": claim}, NOW) == {}

    @settings(max_examples=300, deadline=None)
    @given(
        status=st.sampled_from(["open", "closed", "waiting_human", "stale"]),
        ttl=st.sampled_from([None, 30, "2h", "45s", "x", 0]),
        opened=st.sampled_from(["2026-03-16T20:00", "2026-03-16T20:50:00+00:00", "not a time"]),
        gates=st.lists(
            st.sampled_from([{"at": "2026-03-16T20:40:00+00:00"}, {"at": 5}, "note", {"action": "x"}]), max_size=3
        ),
        minutes=st.integers(0, 180),
        default=st.sampled_from([None, timedelta(minutes=10)]),
    )
    @pytest.mark.slow
    def test_the_kept_facts_decide_staleness_as_the_rule_does(
        self, status: str, ttl: Any, opened: str, gates: list[Any], minutes: int, default: timedelta | None
    ) -> None:
        """ClaimFacts (what the store keeps instead of the model) give the stale-claims scan the same answer as
        mark_stale on the whole claim."""
        claim = mk(status=status, ttl=ttl, opened_at=opened, gate_history=gates or None)
        now = datetime(2026, 3, 16, 20, 0, tzinfo=UTC) + timedelta(minutes=minutes)
        at = C.ClaimFacts.of(claim).stale_at(UTC, default)
        assert (at is not None and now > at) == ("s" in mark_stale({"s": claim}, now, default_ttl=default))
        assert C.ClaimFacts.of(claim).last_activity(UTC) == C.last_activity(claim, UTC)

    @pytest.mark.parametrize(
        ("value", "minutes"),
        [
            (30, 30),
            (1.5, 1.5),
            ("90", 90),
            ("30m", 30),
            ("4h", 240),
            ("2d", 2880),
            ("45s", 0.75),
            ("x", None),
            ("-3", None),
            (0, None),
            (True, None),
        ],
    )
    def test_parse_ttl(self, value: Any, minutes: float | None) -> None:
        """TTL: minutes by default, or with a unit; nonsense is None."""
        got = C.parse_ttl(value)
        assert (got.total_seconds() / 60 if got else None) == minutes


# spec/002 "Matrice de conflit": row = active, column = incoming; True = blocks.
TYPES = ["code", "brain-write", "test", "deploy", "search", "domain"]
MATRIX = {
    "code": [True, False, True, True, False, True],
    "brain-write": [False, True, False, False, False, True],
    "test": [True, False, True, True, False, True],
    "deploy": [True, False, True, True, False, True],
    "search": [False] * 6,
    "domain": [True, True, True, True, False, True],
}
scopes = st.sampled_from(
    [
        "agents/",
        "agents/a.md",
        "agents/b.md",
        "agents/sub/c.md",
        "todo/",
        "todo/x.md",
        "README.md",
        "projets/p/",
        "projets/p/src/main.py",
    ]
)


class TestConflicts:
    @pytest.mark.parametrize("active", TYPES)
    @pytest.mark.parametrize("incoming", TYPES)
    def test_matrix_on_the_same_scope(self, active: str, incoming: str) -> None:
        """On one and the same scope the function reproduces the spec/002 table cell by cell."""
        assert conflicts(active, "agents/foo.md", incoming, "agents/foo.md") is MATRIX[active][TYPES.index(incoming)]

    def test_disjoint_scopes_never_conflict(self) -> None:
        """Different folders never conflict, whatever the types."""
        assert not conflicts("domain", "agents/", "domain", "todo/")

    def test_granularity(self) -> None:
        """brain-write is per file; code/test/deploy/domain are per folder; a folder covers its files."""
        assert not conflicts("brain-write", "agents/a.md", "brain-write", "agents/b.md")
        assert conflicts("brain-write", "agents/", "brain-write", "agents/b.md")
        assert conflicts("code", "src/a.py", "test", "src/b.py")
        assert conflicts("domain", "projets/p/", "brain-write", "projets/p/README.md")

    def test_outside_the_matrix(self) -> None:
        """No satellite type (pilote/solo) blocks nothing; an unknown type blocks like domain."""
        assert not conflicts(None, "agents/", "code", "agents/")
        assert conflicts("explore", "agents/", "brain-write", "agents/x.md")
        assert not conflicts("explore", "agents/", "search", "agents/x.md")

    @given(st.sampled_from([*TYPES, "weird"]), scopes, st.sampled_from([*TYPES, "weird"]), scopes)
    def test_properties(self, a: str, sa: str, b: str, sb: str) -> None:
        """Symmetric; search never conflicts; non-overlapping scopes never conflict; domain blocks non-search."""
        got = conflicts(a, sa, b, sb)
        assert got == conflicts(b, sb, a, sa)
        if "search" in (a, b):
            assert not got
        if not C.scopes_overlap(sa, sb):
            assert not got
        if a == "domain" and b != "search" and C.scopes_overlap(sa, sb):
            assert got

    def test_find_conflicts_skips_family_and_inactive(self) -> None:
        """Active strangers on the scope block; the claim's own parent, children and closed claims do not."""
        claims = family(x="open")
        claims["gone"] = mk("gone", status="closed", satellite_type="code")
        incoming = mk("new", satellite_type="test", scope="agents/x.md", parent_satellite="d")
        assert [c.sess_id for c in C.find_conflicts(claims, incoming)] == ["l1", "x"]
        claims["p"] = mk("p", satellite_type="domain", satellite_level="domain")  # a coordinating grandparent
        assert [c.sess_id for c in C.find_conflicts(claims, incoming)] == ["l1", "x"]
        claims["d"] = mk("d", status="paused", satellite_type="domain", parent_satellite="p")
        assert [c.sess_id for c in C.find_conflicts(claims, mk("new2", satellite_type="code"))] == ["d", "l1", "p", "x"]


class GateMachine(RuleBasedStateMachine):
    """Random gate actions over a small family of claims, checked against the rules' invariants."""

    IDS = ("p", "d", "l1", "l2", "x")

    def __init__(self) -> None:
        super().__init__()
        self.claims: dict[str, Claim] = family()
        self.minute = 0

    def _now(self) -> datetime:
        self.minute += 1
        return NOW + timedelta(minutes=self.minute)

    @rule(sid=st.sampled_from(IDS), action=st.sampled_from(C.ACTIONS), result=st.sampled_from(["ok", "failed"]))
    def act(self, sid: str, action: str, result: str) -> None:
        """Apply an action; illegal ones must raise and leave every claim as it was."""
        before = {k: v.to_document() for k, v in self.claims.items()}
        claim = self.claims[sid]
        try:
            changed = apply(self.claims, sid, action, "m", self._now(), result={"status": result})
        except TransitionError:
            assert {k: v.to_document() for k, v in self.claims.items()} == before
            return
        assert claim.status in C.TRANSITIONS[action][0]
        assert sid in changed
        for k, new in changed.items():
            assert len(new.gate_history or []) == len(self.claims[k].gate_history or []) + 1
            assert not self.claims[k].terminal  # terminal claims never change
            if k != sid:
                assert new.gate_history[-1]["cascade"] == sid
        if action == "pause":
            for k in C.descendants(self.claims, sid):
                status = changed.get(k, self.claims[k]).status
                assert status not in ("open", "waiting_human")
        if action == "resume":
            for k in changed:
                if k != sid:
                    assert self.claims[k].paused_by == sid
        self.claims.update(changed)

    @invariant()
    def statuses_are_known_and_marks_consistent(self) -> None:
        """Every status is known; paused_by/paused_from only ever sit on paused claims."""
        for claim in self.claims.values():
            assert claim.status in C.STATUSES
            if claim.status != "paused":
                assert claim.paused_by is None and claim.paused_from is None


TestGateMachine = pytest.mark.slow(GateMachine.TestCase)
TestGateMachine.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)


def test_new_claim_and_sess_id() -> None:
    """new_claim writes the schema's keys in order with opened_at from now; sess ids follow spec/002."""
    claim = C.new_claim("sess-1", "satellite", "agents/", "helloWorld", NOW, satellite_type="code", story_angle=None)
    assert list(claim.to_document()) == ["sess_id", "type", "scope", "agent", "status", "opened_at", "satellite_type"]
    assert C.make_sess_id(NOW, "Brain Engine/BE-6!") == "sess-20260316-2100-brain-engine-be-6"
