"""The router: validate → authorize → deliver → record; identity from the channel; `ambient send` (S-04, S-05, S-10)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ambient.cli import main
from ambient.kernel.channels import TOKEN_ENV, Channel, ChannelRegistry
from ambient.kernel.matrix import AccessMatrix
from ambient.kernel.packet import MAX_PACKET_BYTES, Packet, Signal, make_packet
from ambient.kernel.router import SYMLINK_CHECK_TTL, Router, _symlink_free, read_audit
from ambient.kernel.routing_table import build_matrix
from ambient.kernel.zones import ZoneRule
from ambient.storage.journal import Journal
from ambient.storage.paths import BrainPaths
from tests.conftest import EXAMPLE_BRAIN, REPO
from tests.unit.kernel.test_matrix import reference_allows, reference_brain

NOW = datetime(2026, 3, 18, 10, 0, tzinfo=UTC)


def pkt(**kw: Any) -> dict[str, Any]:
    """A packet mapping from ambient to deploy (SPAWN) unless overridden; ``from_`` sets ``from``."""
    data: dict[str, Any] = {"from": "ambient", "to": "deploy", "signal": "SPAWN", "scope": {"zone": "project"}}
    if "from_" in kw:
        data["from"] = kw.pop("from_")
    data.update(kw)
    return data


class Inboxes:
    """Handlers that remember what each principal received."""

    def __init__(self) -> None:
        self.got: dict[str, list[Packet]] = {}

    def handler(self, name: str) -> Callable[[Packet], Any]:
        """An async handler appending to ``got[name]``."""

        async def receive(packet: Packet) -> None:
            self.got.setdefault(name, []).append(packet)

        return receive


@pytest.fixture
def brain(make_brain: Callable[..., Path]) -> Path:
    """A copy of the example brain."""
    return make_brain()


@pytest.fixture
def router(brain: Path) -> Router:
    """The example brain's router (audit log under .ambient/)."""
    r, problems = Router.for_brain(BrainPaths(brain))
    assert problems == []
    yield r
    r.close()


def audit(brain: Path, router: Router | None = None) -> list[dict[str, Any]]:
    """The audit records written so far."""
    if router is not None:
        router.flush()
    return list(read_audit(BrainPaths(brain).audit))


class TestPath:
    async def test_delivered_to_registered_handler(self, router: Router, brain: Path) -> None:
        """An allowed packet reaches the receiver's handler, stamped with a fresh id and ts, and is recorded."""
        box = Inboxes()
        router.register("deploy", box.handler("deploy"))
        out = await router.send(pkt(id="pkt_ffffffffffffffff", payload={"context": {"item": "a"}}), Channel("ambient"))
        assert out.status == "delivered" and out.ok and out.decision is not None and out.decision.allowed
        assert box.got["deploy"] == [out.packet]
        assert out.packet is not None and out.packet.id != "pkt_ffffffffffffffff"
        rec = audit(brain, router)[-1]
        assert rec["status"] == "delivered" and rec["id"] == out.packet.id and rec["rule"] == "allow"
        assert "payload" not in rec and "item" not in json.dumps(rec)

    async def test_packet_objects_keep_their_id(self, router: Router) -> None:
        """A packet built by ambient's code (make_packet) keeps its id."""
        router.set_default(Inboxes().handler("any"))
        p = make_packet("ambient", "deploy", "SPAWN", now=NOW, zone="project", key="r/i/1")
        out = await router.send(p, Channel.internal("ambient"))
        assert out.status == "delivered" and out.packet is p

    async def test_default_handler_and_undeliverable(self, router: Router) -> None:
        """Without a handler for the receiver the default takes it; with neither, the outcome is undeliverable."""
        out = await router.send(pkt(), Channel("ambient"))
        assert (out.status, out.reason) == ("undeliverable", "no handler for deploy")
        box = Inboxes()
        router.set_default(box.handler("default"))
        assert (await router.send(pkt(), Channel("ambient"))).status == "delivered"
        assert len(box.got["default"]) == 1

    async def test_failing_handler_never_raises(self, router: Router, brain: Path) -> None:
        """A handler that raises makes the packet undeliverable; nothing reaches the caller's loop."""

        async def broken(packet: Packet) -> None:
            raise RuntimeError("disk on fire: SECRET")

        router.register("deploy", broken)
        out = await router.send(pkt(), Channel("ambient"))
        assert out.status == "undeliverable" and "RuntimeError" in out.reason and "SECRET" not in out.reason
        assert audit(brain, router)[-1]["status"] == "undeliverable"

    async def test_cancellation_is_not_swallowed(self, router: Router) -> None:
        """Cancelling the sender's task still cancels it."""

        async def slow(packet: Packet) -> None:
            raise asyncio.CancelledError

        router.register("deploy", slow)
        with pytest.raises(asyncio.CancelledError):
            await router.send(pkt(), Channel("ambient"))

    async def test_broadcast_fans_out(self, router: Router) -> None:
        """A NOTIFY broadcast reaches every registered principal that receives from the sender."""
        box = Inboxes()
        for name in ("deploy", "coach", "human"):
            router.register(name, box.handler(name))
        out = await router.send(
            pkt(to="broadcast", signal="NOTIFY", scope={}, payload={"context": {"message": "hi"}}), Channel("ambient")
        )
        assert out.status == "delivered"
        assert set(box.got) == {"deploy", "human"}  # coach receives from human only

    def test_check_is_sync_and_records(self, router: Router, brain: Path) -> None:
        """check() validates, authorizes and records without delivering."""
        out = router.check(json.dumps(pkt()).encode(), "ambient")
        assert out.status == "allowed" and out.ok
        rec = audit(brain, router)[-1]
        assert rec["status"] == "allowed" and rec["size"] > 0

    async def test_audit_commit(self, router: Router, brain: Path) -> None:
        """commit() makes the buffered audit lines durable and readable."""
        router.check(pkt(), "ambient")
        await router.commit()
        assert list(read_audit(BrainPaths(brain).audit))[-1]["status"] == "allowed"

    async def test_reload_swaps_the_matrix(self, router: Router) -> None:
        """update() applies a reloaded matrix to the next packets."""
        router.update(AccessMatrix.build({}))
        assert router.check(pkt(), "ambient").decision.rule == "receiver.unknown"  # type: ignore[union-attr]


class TestRejections:
    async def test_invalid_recorded_by_size_and_hash_only(self, router: Router, brain: Path) -> None:
        """S-04: a smuggling RETURN is invalid; the audit keeps its size and sha256, never its content."""
        box = Inboxes()
        router.register("deploy", box.handler("deploy"))
        raw = json.dumps(
            pkt(
                from_="deploy",
                to="ambient",
                signal="RETURN",
                payload={"result": "ok", "context": {"CANARY": "ssh-key"}},
            )
        ).encode()
        out = await router.send(raw, Channel("deploy"))
        assert out.status == "invalid" and "does not allow payload.context" in out.reason
        rec = audit(brain, router)[-1]
        assert rec["status"] == "invalid" and rec["size"] == len(raw)
        assert rec["sha256"] == hashlib.sha256(raw).hexdigest()
        assert rec["replied"] is True
        assert "CANARY" not in BrainPaths(brain).audit.read_text()
        # the sender is answered with an ERROR from ambient naming the rule, not the content
        (reply,) = box.got["deploy"]
        assert (reply.from_, reply.signal) == ("ambient", Signal.ERROR)
        assert reply.payload.context["rejected"]["sha256"] == rec["sha256"]
        assert "CANARY" not in reply.to_json()

    @pytest.mark.parametrize(
        ("raw", "expected"),
        [
            (pkt(from_="deploy", to="ambient", signal="RETURN", kind="RETURN"), "extra_forbidden"),
            (pkt(signal="REQUEST"), "[enum]"),
            (
                pkt(from_="deploy", to="ambient", signal="RETURN", payload={"result": "x" * (10 * 2**20)}),
                "string_too_long",
            ),
            (pkt(to=b"deploy"), "string_type"),
            (pkt(scope={"files": ["../../etc/passwd"]}), "unsafe_path"),
            (b"\xff" * 10, "not valid UTF-8"),
            (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
            (b"{" + b" " * MAX_PACKET_BYTES, "limit is"),
            ("from: [unclosed", "packet YAML line 1"),
        ],
    )
    def test_bad_input_is_invalid_never_raised(self, router: Router, raw: Any, expected: str) -> None:
        """Wrong types, unknown signals, oversize, traversal, garbage: each an 'invalid' outcome with a clear reason."""
        out = router.check(raw, "deploy" if isinstance(raw, dict) and raw.get("from") == "deploy" else "ambient")
        assert out.status == "invalid" and expected in out.reason, out.reason

    async def test_denied_recorded_and_answered(self, router: Router, brain: Path) -> None:
        """A matrix denial is recorded with its rule and reason and answered to the sender."""
        box = Inboxes()
        router.register("deploy", box.handler("deploy"))
        router.register("coach", box.handler("coach"))
        out = await router.send(
            pkt(from_="deploy", to="coach", signal="ESCALATE", scope={}, payload={"options": ["a"]}), Channel("deploy")
        )
        assert out.status == "denied" and out.decision is not None and out.decision.rule == "sender.sends_to"
        assert "coach" not in box.got
        rec = audit(brain, router)[-1]
        assert (rec["status"], rec["rule"], rec["from"], rec["to"]) == ("denied", "sender.sends_to", "deploy", "coach")
        assert box.got["deploy"][0].payload.context["rule"] == "sender.sends_to"

    async def test_return_by_a_role_not_allowed(self, router: Router) -> None:
        """S-04: a well-formed RETURN from a role the matrix does not allow is denied after validation."""
        out = await router.send(
            pkt(from_="coach", to="deploy", signal="RETURN", scope={}, payload={"result": 1}), Channel("coach")
        )
        assert out.status == "denied" and out.decision is not None and out.decision.rule == "sender.signals"

    def test_symlink_out_of_the_brain(self, router: Router, brain: Path, tmp_path: Path) -> None:
        """A scope file reaching outside through a symlink is denied, never given a zone (S-01/S-02)."""
        os.symlink(tmp_path, brain / "projets")
        out = router.check(pkt(scope={"files": ["projets/x"], "zone": "project"}), "ambient")
        assert out.status == "denied" and out.decision is not None and out.decision.rule == "zone.unsafe-path"

    def test_symlink_into_a_personal_file(self, router: Router, brain: Path) -> None:
        """The zone of a symlinked scope file is also the zone of its target."""
        (brain / "projets").mkdir()
        (brain / "profil" / "capital.md").write_text("money")
        os.symlink("../profil/capital.md", brain / "projets" / "cap.md")
        out = router.check(pkt(scope={"files": ["projets/cap.md"], "zone": "project"}), "ambient")
        assert out.decision is not None and out.decision.rule == "zone.receiver"
        assert "personal" in out.reason

    def test_folder_verdicts_are_reused_then_checked_again(
        self, brain: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A fan-out's new paths under known folders cost one look each (a new file: one access(), no
        exception); a folder swapped for a symlink is caught once its verdict is older than SYMLINK_CHECK_TTL
        (S-02)."""
        (brain / "projets" / "a").mkdir(parents=True)
        root = str(brain)
        seen: list[str] = []
        real_lstat, real_access = os.lstat, os.access

        def counting_lstat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
            seen.append(f"lstat {path}")
            return real_lstat(path, *args, **kwargs)

        def counting_access(path: Any, *args: Any, **kwargs: Any) -> bool:
            seen.append(f"access {path}")
            return real_access(path, *args, **kwargs)

        monkeypatch.setattr(os, "lstat", counting_lstat)
        monkeypatch.setattr(os, "access", counting_access)
        plain: dict[str, float] = {}
        assert _symlink_free(root, "projets/a/x1.md", plain, 10.0)
        assert seen == [
            f"access {root}/projets",
            f"lstat {root}/projets",
            f"access {root}/projets/a",
            f"lstat {root}/projets/a",
            f"access {root}/projets/a/x1.md",
        ]
        assert plain == {"projets/": 11.0, "projets/a/": 11.0}
        seen.clear()
        assert _symlink_free(root, "projets/a/x2.md", plain, 10.5)
        assert seen == [f"access {root}/projets/a/x2.md"]
        # projets/a becomes a symlink out of the brain: past the TTL the folder is looked at again.
        (brain / "projets" / "a").rename(brain / "projets" / "a.old")
        os.symlink(tmp_path, brain / "projets" / "a")
        seen.clear()
        assert not _symlink_free(root, "projets/a/x3.md", plain, 11.5)
        assert f"lstat {root}/projets/a" in seen
        # Without a memo nothing is remembered, and the symlink is found at once.
        assert not _symlink_free(root, "projets/a/x4.md")

    def test_missing_folders_end_the_walk_and_are_remembered_for_the_ttl(self, brain: Path, tmp_path: Path) -> None:
        """A folder that does not exist holds nothing, symlinks included: the walk ends there, and the verdict is
        kept for SYMLINK_CHECK_TTL like a plain folder's. A dangling symlink still counts as there (S-02)."""
        root = str(brain)
        plain: dict[str, float] = {}
        absent: dict[str, float] = {}
        assert _symlink_free(root, "nowhere/deep/x.md", plain, 10.0, absent)
        assert absent == {"nowhere/": 11.0} and plain == {}
        os.symlink(tmp_path / "gone", brain / "nowhere")  # dangling, and made within the TTL
        assert _symlink_free(root, "nowhere/deep/y.md", plain, 10.5, absent)  # the verdict holds until 11.0
        assert not _symlink_free(root, "nowhere/deep/z.md", plain, 11.5, absent)  # then the link is found
        assert not _symlink_free(root, "nowhere/deep/z.md")
        # A plain file where a folder should be: nothing below it either.
        (brain / "flat.md").write_text("x")
        assert _symlink_free(root, "flat.md/below/x.md", plain, 12.0, absent)

    def test_a_folder_turned_symlink_is_denied_after_the_ttl(self, brain: Path, tmp_path: Path) -> None:
        """Through the router: same path prefix, the swap is denied as an unsafe path once the TTL is over."""

        class Clock:
            t = 100.0

            def now(self) -> datetime:
                return NOW

            def monotonic(self) -> float:
                return self.t

        clock = Clock()
        r, _ = Router.for_brain(BrainPaths(brain), clock=clock)
        try:
            (brain / "projets" / "a").mkdir(parents=True)
            ok = r.check(pkt(scope={"files": ["projets/a/x1"], "zone": "project"}), "ambient")
            assert ok.decision is None or ok.decision.rule != "zone.unsafe-path"
            (brain / "projets" / "a").rename(brain / "projets" / "a.old")
            os.symlink(tmp_path, brain / "projets" / "a")
            clock.t += SYMLINK_CHECK_TTL + 0.1
            out = r.check(pkt(scope={"files": ["projets/a/x2"], "zone": "project"}), "ambient")
            assert out.status == "denied" and out.decision is not None and out.decision.rule == "zone.unsafe-path"
        finally:
            r.close()


class TestIdentity:
    async def test_spoofed_from_is_rejected(self, router: Router, brain: Path) -> None:
        """S-05: an agent's packet claiming to be human (a forged approval) is denied and recorded."""
        box = Inboxes()
        router.register("deploy", box.handler("deploy"))
        router.register("orchestrator", box.handler("orchestrator"))
        forged = pkt(
            from_="human", to="orchestrator", signal="RETURN", scope={}, payload={"result": {"approved": True}}
        )
        out = await router.send(forged, Channel("deploy"))
        assert out.status == "denied" and out.decision is not None and out.decision.rule == "identity"
        assert "orchestrator" not in box.got
        rec = audit(brain, router)[-1]
        assert (rec["rule"], rec["channel"], rec["from"]) == ("identity", "deploy", "human")
        assert box.got["deploy"][0].signal is Signal.ERROR

    async def test_token_must_match_principal(self, router: Router) -> None:
        """A channel presenting another principal's token, or a dead token, is denied before parsing."""
        assert router.registry is not None
        ch = router.registry.issue("deploy")
        ok = router.check(pkt(from_="deploy", to="ambient", signal="RETURN", scope={}), ch)
        assert ok.status == "allowed"
        stolen = router.check(pkt(from_="human", to="ambient", signal="RETURN", scope={}), Channel("human", ch.token))
        assert stolen.status == "denied" and stolen.decision is not None and stolen.decision.rule == "identity.token"
        router.registry.revoke(ch)
        dead = router.check(pkt(from_="deploy", to="ambient", signal="RETURN", scope={}), ch)
        assert dead.status == "denied" and dead.decision is not None and dead.decision.rule == "identity.token"


# --- S-10: a random packet is delivered iff the independent reference allows it ------------------------

FILE_ZONES = {
    "projets/a.py": {"project"},
    "infrastructure/vps/x.yml": {"project"},
    "todo/": {"project"},
    "profil/capital.md": {"personal"},
    "agents/x.md": {"kernel"},
    "profil/": {"kernel", "personal"},
}
# One valid payload per signal (typed here from DESIGN 2.2 / spec/004, not taken from ambient.kernel.packet).
PAYLOADS: dict[str, dict[str, Any]] = {
    "SPAWN": {"context": {"task": "t"}},
    "RETURN": {"result": {"status": "ok"}},
    "BLOCKED_ON": {"context": {"missing": "f"}},
    "ESCALATE": {"options": ["a", "b"]},
    "ERROR": {"context": {"error": "e"}},
    "CHECKPOINT": {"context": {"snapshot": 1}},
    "HANDOFF": {"context": {"a": 1}, "decision": "d"},
    "ORCHESTRATE": {"context": {"workflow": "w"}},
    "ADAPT": {"context": {"workflow": "w", "changes": {"skip": ["one"]}}},
    "ABORT": {"context": {"workflow": "w", "reason": "r"}},
    "STEP_DONE": {"context": {"step": 1, "result": "ok"}},
    "GATE_PENDING": {"context": {"step": 1, "message": "m"}},
    "BLOCKED": {"context": {"step": 1, "reason": "r"}},
    "DONE": {"context": {"workflow": "w", "summary": "s"}},
    "CIRCUIT_BREAK": {"context": {"step": 1, "fails": 3}},
    "NOTIFY": {"context": {"message": "m"}},
}
# A payload field each signal must refuse (DESIGN 2.2: RETURN never carries context, etc.).
POISON: dict[str, dict[str, Any]] = {s: {"result": "x"} for s in PAYLOADS} | {
    "RETURN": {"context": {"leak": 1}},
    "ESCALATE": {"decision": "x"},
}


@dataclass
class S10:
    """One copy of the example brain, its loaded matrix and its reference view, shared by the examples."""

    root: Path
    matrix: AccessMatrix
    zone_rules: tuple[ZoneRule, ...]
    gates: dict[str, dict[str, list[str]]]
    ungated: set[str]
    routing: dict[str, Any] | None

    def router(self) -> Router:
        """A fresh router over the shared matrix (the brain is not re-read for every example)."""
        return Router(self.matrix, zone_rules=self.zone_rules, brain_root=self.root)


@pytest.fixture(scope="module")
def s10_brain(tmp_path_factory: pytest.TempPathFactory) -> S10:
    """The shared example brain of the property tests."""
    root = tmp_path_factory.mktemp("s10") / "brain"
    shutil.copytree(EXAMPLE_BRAIN, root)
    bm = build_matrix(BrainPaths(root))
    gates, ungated, routing = reference_brain(root)
    return S10(root, bm.matrix, bm.zone_rules, gates, ungated, routing)


_SLOW_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]  # the conftest profile's, plus ours


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=_SLOW_OK)
@given(data=st.data())
def test_s10_delivered_iff_reference_allows(s10_brain: S10, data: st.DataObject) -> None:
    """S-10: for random (sender, receiver, signal, zone, files, payload, channel), delivery ⇔ reference check."""
    gates, ungated, routing = s10_brain.gates, s10_brain.ungated, s10_brain.routing
    names = sorted(set(gates) | ungated | {"ghost"})
    # Half the draws favour the combinations that can pass, so both answers are well represented.
    talkers = ["ambient", "human", "orchestrator", "deploy", "scribe", "coach", "vps"]
    frm = data.draw(st.sampled_from(talkers) | st.sampled_from(names), "from")
    sig = data.draw(st.sampled_from(sorted(PAYLOADS)), "signal")
    fixed = {"CHECKPOINT": "bsi", "HANDOFF": frm, "NOTIFY": "broadcast"}.get(sig)
    likely = st.just(fixed) if fixed else st.sampled_from(talkers)
    to = data.draw(likely | st.sampled_from([*names, "bsi", "broadcast"]), "to")
    zone = data.draw(st.sampled_from([None, "project", "kernel", "personal", "reference"]), "zone")
    some_files = st.lists(st.sampled_from(sorted(FILE_ZONES)), max_size=2, unique=True)
    files = data.draw(some_files if sig == "SPAWN" else st.sampled_from([[], [], [], ["projets/a.py"]]), "files")
    poisoned = data.draw(st.sampled_from([False, False, False, True]), "poisoned")
    channel = data.draw(st.sampled_from([frm, frm, frm, "human", "deploy"]), "channel")

    payload = dict(PAYLOADS[sig]) | (POISON[sig] if poisoned else {})
    raw: dict[str, Any] = {
        "from": frm,
        "to": to,
        "signal": sig,
        "scope": {"files": files, "zone": zone},
        "payload": payload,
    }
    if sig == "HANDOFF":
        raw["session_id"] = "sess-1"

    router = s10_brain.router()
    delivered: list[Packet] = []

    async def take(packet: Packet) -> None:
        delivered.append(packet)

    router.set_default(take)
    out = asyncio.run(router.send(json.dumps(raw).encode(), Channel(channel)))

    zones = set() if zone is None else {zone}
    for f in files:
        zones |= FILE_ZONES[f]
    expected = (
        not poisoned
        and (not files or sig == "SPAWN")
        and channel == frm
        and reference_allows(gates, routing, frm, to, sig, zones)
    )
    event(f"{out.status} ({out.decision.rule if out.decision else 'schema'})")
    assert (out.status == "delivered") == expected, (out.status, out.reason)
    assert bool(delivered) == expected


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20) | st.binary(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
KEYS = st.sampled_from(["from", "to", "signal", "scope", "payload", "id", "ts", "session_id", "x"])


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=_SLOW_OK)
@given(raw=st.one_of(st.binary(max_size=300), st.text(max_size=300), st.dictionaries(KEYS, JSONISH, max_size=6)))
def test_garbage_never_raises(s10_brain: S10, raw: Any) -> None:
    """Whatever arrives, check() answers an Outcome and never raises into the caller."""
    router = s10_brain.router()
    out = router.check(raw, "human")
    assert out.status in ("invalid", "denied", "allowed")


# --- `ambient send` ---------------------------------------------------------------------------------


class TestSendCli:
    def test_delivered(self, brain: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A YAML packet from the person is delivered into the inbox: exit 0, the id on stdout."""
        f = brain / "p.yml"
        f.write_text(
            "from: human\nto: deploy\nsignal: SPAWN\nscope:\n  zone: project\n  files: [infrastructure/vps/a.yml]\n"
        )
        assert main(["send", "--brain", str(brain), str(f)]) == 0
        outtext = capsys.readouterr().out
        pid = outtext.split()[1].rstrip(":")
        assert outtext.startswith("delivered pkt_")
        [delivered] = BrainPaths(brain).inbox.glob(f"{pid}.*.json")
        assert json.loads(delivered.read_text())["to"] == "deploy"
        assert list(read_audit(BrainPaths(brain).audit))[-1]["status"] == "delivered"

    def test_denied_and_invalid(self, brain: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A spoofed sender exits 1, a bad packet exits 2; nothing reaches the inbox; both are recorded."""
        f = brain / "p.json"
        f.write_text(json.dumps(pkt(from_="deploy", to="human", signal="RETURN", scope={})))
        assert main(["send", "--brain", str(brain), str(f)]) == 1
        assert "denied" in capsys.readouterr().err
        f.write_text(json.dumps(pkt(from_="human", signal="RETURN", payload={"context": {"x": 1}})))
        assert main(["send", "--brain", str(brain), "--json", str(f)]) == 2
        assert json.loads(capsys.readouterr().out)["status"] == "invalid"
        assert not BrainPaths(brain).inbox.exists() or not list(BrainPaths(brain).inbox.iterdir())
        assert [r["status"] for r in list(read_audit(BrainPaths(brain).audit))] == ["denied", "invalid"]

    def test_stdin_and_token(
        self, brain: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """With a live token the sender is its agent; a dead token is denied; stdin is read with '-'."""
        import io

        ch = ChannelRegistry(BrainPaths(brain)).issue("deploy")
        body = json.dumps(pkt(from_="deploy", to="ambient", signal="RETURN", scope={}, payload={"result": "ok"}))
        monkeypatch.setenv(TOKEN_ENV, ch.token or "")
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(body.encode())))
        assert main(["send", "--brain", str(brain), "-"]) == 0
        monkeypatch.setenv(TOKEN_ENV, "Q" * 43)
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(body.encode())))
        assert main(["send", "--brain", str(brain)]) == 1
        assert list(read_audit(BrainPaths(brain).audit))[-1]["rule"] == "identity.token"
        capsys.readouterr()

    def test_bad_usage(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A missing brain or file is exit 2."""
        assert main(["send", "--brain", str(tmp_path / "nope"), "x"]) == 2
        assert main(["send", "--brain", str(tmp_path), str(tmp_path / "missing.json")]) == 2
        capsys.readouterr()

    @pytest.mark.slow
    def test_spawned_agent_subprocess(self, brain: Path) -> None:
        """S-05 end to end: a spawned process with its token sends as its agent; claiming 'human' is refused."""
        ch = ChannelRegistry(BrainPaths(brain)).issue("vps")
        env = {**os.environ, TOKEN_ENV: ch.token or "", "PYTHONPATH": str(REPO / "src")}
        ok = json.dumps(
            pkt(from_="vps", to="ambient", signal="ESCALATE", scope={}, payload={"options": ["retry", "skip"]})
        )
        forged = json.dumps(pkt(from_="human", to="ambient", signal="RETURN", scope={}, payload={"result": "approved"}))
        cmd = [sys.executable, "-m", "ambient", "send", "--brain", str(brain), "-"]
        done = subprocess.run(cmd, input=ok, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        done = subprocess.run(cmd, input=forged, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and "identity comes from the channel" in done.stderr
        records = list(read_audit(BrainPaths(brain).audit))
        assert [(r["status"], r["channel"]) for r in records] == [("delivered", "vps"), ("denied", "vps")]
        assert ch.token not in BrainPaths(brain).audit.read_text()


def test_router_without_audit_or_root() -> None:
    """A bare router (no audit, no brain root) still validates and authorizes."""
    r = Router(AccessMatrix.build({}))
    assert r.check(pkt(to="debug", scope={"files": ["projets/a"], "zone": "project"}), "ambient").status == "allowed"
    r.flush()
    r.close()


def test_journal_is_used_buffered(tmp_path: Path) -> None:
    """Audit lines stay in the buffer until flushed (the bench's 'record' cost)."""
    j = Journal(tmp_path / "audit.jsonl", buffered=True)
    r = Router(AccessMatrix.build({}), audit=j)
    r.check(pkt(to="debug"), "ambient")
    assert (tmp_path / "audit.jsonl").read_text() == ""
    r.close()
    (rec,) = read_audit(tmp_path / "audit.jsonl")
    assert (rec["status"], rec["to"], rec["rule"]) == ("allowed", "debug", "allow")


def test_audit_groups_allowed_packets_in_order(tmp_path: Path) -> None:
    """Allowed packets are grouped per line; a rejection writes the pending group first, so order is kept."""
    from ambient.kernel.router import AUDIT_BATCH

    r = Router(AccessMatrix.build({}), audit=Journal(tmp_path / "audit.jsonl"))
    for _ in range(AUDIT_BATCH + 3):
        r.check(pkt(to="debug"), "ambient")
    r.check(pkt(to="ghost"), "ambient")
    r.check(pkt(to="debug"), "ambient")
    r.close()
    lines = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [line["status"] for line in lines] == ["batch", "batch", "denied", "batch"]
    assert lines[0]["fields"][:3] == ["ts", "status", "id"] and len(lines[0]["packets"]) == AUDIT_BATCH
    records = list(read_audit(tmp_path / "audit.jsonl"))
    assert [r["status"] for r in records] == ["allowed"] * (AUDIT_BATCH + 3) + ["denied", "allowed"]
    assert records[0]["ts"].endswith("+00:00") and records[0]["channel"] == "ambient"
