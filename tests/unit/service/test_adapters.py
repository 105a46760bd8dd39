"""Adapters of the daemon tested alone: the digest, the shared handoff, item claims, channel-token revocation."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ambient.human.notify import Outbox
from ambient.service.adapters import Digest
from ambient.storage.paths import BrainPaths


class Clock:
    def __init__(self, now: datetime) -> None:
        self.t = now

    def now(self) -> datetime:
        return self.t

    def monotonic(self) -> float:
        return 0.0


def test_digest_batches_information_until_its_period(tmp_path: Path) -> None:
    """Results wait in the digest file; one digest message is queued per period, then the file rotates."""
    paths = BrainPaths(tmp_path)
    paths.state.mkdir()
    clock = Clock(datetime(2026, 11, 30, 12, 0, tzinfo=UTC))
    outbox = Outbox.for_brain(paths)
    digest = Digest(paths, outbox, clock, hours=24)
    assert digest.send_if_due() is False  # the first period starts now
    digest.add("deploy-batch: success", "10/10 done")
    digest.add("docs-refresh: decided by a learned rule", "retry")
    clock.t += timedelta(hours=23)
    assert digest.send_if_due() is False and outbox.entries() == []
    clock.t += timedelta(hours=2)
    assert digest.send_if_due() is True
    (entry,) = outbox.entries()
    assert entry.message.kind == "digest" and "10/10 done" in entry.message.body
    assert entry.message.title == "ambient digest of the last 24 h: 2 update(s)"
    assert not (paths.state / "digest.jsonl").exists() and (paths.state / "digest.sent.jsonl").exists()
    assert json.loads((paths.state / "digest.json").read_text())["last_sent"].startswith("2026-12-01")
    clock.t += timedelta(hours=25)  # a period without a result or an automatic decision sends nothing
    assert digest.send_if_due() is False and len(outbox.entries()) == 1


async def test_handoff_is_shared_by_a_runs_items_and_a_rewrite_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One handoff per (agent, run), not one per item; a rewritten handoff.md reaches the next attempts once the
    short recheck interval has passed (it is not stat'ed for every item)."""
    from ambient.engine.ports import Attempt
    from ambient.live.context import HANDOFF_NAME, LiveContext
    from ambient.service import adapters as services
    from ambient.service.adapters import AgentDelegate

    live = LiveContext(BrainPaths(tmp_path))
    calls: list[str] = []
    real = live.handoff_for

    def counting(agent: str) -> str:
        calls.append(agent)
        return real(agent)

    monkeypatch.setattr(live, "handoff_for", counting)
    delegate = AgentDelegate(None, None, None, None, None, live)  # type: ignore[arg-type]

    def attempt(k: int) -> Attempt:
        return Attempt(
            run_id="run-1",
            workflow="w",
            item=f"i{k}",
            index=k,
            attempt=1,
            key=f"run-1/i{k}/1",
            agent="coder",
            sender="ambient",
        )

    monkeypatch.setattr(services, "HANDOFF_RECHECK_S", 3600.0)
    first = [await delegate._handoff(attempt(k)) for k in range(5)]
    assert len(calls) == 1 and len(set(first)) == 1
    folder = live.thread_dir("coder")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / HANDOFF_NAME).write_text("# Handoff\nnew decisions\n")
    assert await delegate._handoff(attempt(6)) == first[0]  # within the recheck interval: not looked at yet
    monkeypatch.setattr(services, "HANDOFF_RECHECK_S", 0.0)
    assert await delegate._handoff(attempt(7)) == "# Handoff\nnew decisions\n"
    assert len(calls) == 2


async def test_a_short_items_claim_is_written_once_and_a_long_items_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """for_each item claims: an item that finishes soon after it started is written once, in its final state; an
    item still running after ``OPEN_DELAY_S`` gets its open claim then; finished ones follow within
    ``FLUSH_DELAY_S``; nothing is lost at ``flush``."""
    from ambient.claims.store import ClaimStore
    from ambient.engine.runstate import ItemState, RunState
    from ambient.service.adapters import ClaimsWriter
    from tests.conftest import async_wait_until

    paths = BrainPaths(tmp_path)
    paths.claims.mkdir()
    clock = Clock(datetime(2026, 11, 30, 12, 0, tzinfo=UTC))
    store = ClaimStore(paths, clock=clock)
    written: list[tuple[str, str]] = []
    real = store.write_claims

    def recording(claims: Any, *, durable: bool = True) -> Any:
        claims = list(claims)
        written.extend((c.sess_id, c.status) for c, _doc in claims)
        return real(claims, durable=durable)

    monkeypatch.setattr(store, "write_claims", recording)
    monkeypatch.setattr(ClaimsWriter, "OPEN_DELAY_S", 0.4)
    writer = ClaimsWriter(store, clock)
    short, long_ = ItemState(name="short", index=0), ItemState(name="long", index=1)
    state = RunState(run_id="run-1", workflow="w", form="for_each", spec_hash=None, spec={}, items=[short, long_])
    try:
        for item in (short, long_):
            item.status, item.attempt = "running", 1
            writer.item_changed(state, item)
        short.status = "done"
        writer.item_changed(state, short)
        assert await async_wait_until(lambda: len(written) == 1, 5)
        assert written == [("run-1-item-001", "closed")]  # one write, the final state; the long one not yet due
        assert await async_wait_until(lambda: len(written) == 2, 5)
        assert written[1] == ("run-1-item-002", "open")
        long_.status = "failed"
        writer.item_changed(state, long_)
        long_.attempt = 2
        long_.status = "running"
        writer.item_changed(state, long_)  # a change right after keeps the earlier promise (soon), not a later one
        assert await async_wait_until(lambda: len(written) == 3, 5)
        assert written[2] == ("run-1-item-002", "open")
        long_.status = "done"
        writer.item_changed(state, long_)
        writer.flush(wait=True)  # a run's end or shutdown: what is pending goes at once
        assert written[3:] == [("run-1-item-002", "closed")]
        assert {p.name for p in paths.claims.iterdir()} >= {"run-1-item-001.yml", "run-1-item-002.yml"}
    finally:
        writer.close()


class _Runners:
    """Stands for the command runner: publishes the token as it does, then looks it up as another process would."""

    def __init__(self, paths: BrainPaths) -> None:
        self.paths = paths
        self.tokens: list[str] = []
        self.seen: list[str | None] = []

    async def run(self, req: Any, cfg: Any) -> Any:
        from ambient.kernel.router import ChannelRegistry
        from ambient.runners.base import AgentResult

        req.before_start()
        self.tokens.append(req.channel_token)
        self.seen.append(ChannelRegistry(self.paths).principal_for(req.channel_token))
        return AgentResult(status="success", output={})


async def test_a_command_agents_token_file_is_gone_when_its_attempt_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token is live for other processes while the agent runs, and its file is renamed aside by the time the
    delegate returns (on the loop, no thread hop: bench/README item 31). A rename that fails leaves the token
    void in the daemon all the same, and says so in the log."""
    from types import SimpleNamespace

    from structlog.testing import capture_logs

    from ambient.engine.ports import Attempt
    from ambient.kernel.packet import make_packet
    from ambient.kernel.router import ChannelRegistry
    from ambient.service.adapters import AgentDelegate

    paths = BrainPaths(tmp_path)
    paths.state.mkdir()
    registry = ChannelRegistry(paths)
    runners = _Runners(paths)
    ref = SimpleNamespace(brain=SimpleNamespace(paths=paths, matrix=SimpleNamespace(agents={})))
    delegate = AgentDelegate(ref, SimpleNamespace(registry=registry), runners, None, None)  # type: ignore[arg-type]
    a = Attempt(
        run_id="run-1", workflow="w", item="i1", index=0, attempt=1, key="run-1/i1/1", agent="coder", sender="ambient"
    )
    spawn = make_packet("ambient", "coder", "SPAWN", now=datetime.now(UTC), session_id="run-1")
    cfg = SimpleNamespace(kind="command")

    await delegate._run(a, spawn, cfg)
    assert runners.seen == ["coder"]  # another process's view, while the agent ran
    assert list(paths.channels.glob("*.json")) == []  # gone already: nothing is left to a thread

    def refuse(channel: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(registry, "revoke", refuse)
    with capture_logs() as logs:
        await delegate._run(a, spawn, cfg)
    assert runners.seen == ["coder", "coder"]
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["channel_revoke_failed"]
    assert len(list(paths.channels.glob("*.json"))) == 1  # the file could not go...
    assert registry.principal_for(runners.tokens[-1]) is None  # ...but the daemon never accepts the token again
    assert ChannelRegistry(paths).revoke_all() == 1  # and the next start-up removes it


async def test_leases_keep_a_running_agents_locks(tmp_path: Path) -> None:
    """Issue 23.15: a scope lock held for a running agent is renewed at a third of its TTL, so an agent that runs
    longer than the TTL keeps its scope; once dropped, its lease ends as before."""
    import asyncio
    import time

    from ambient.claims.locks import LockManager
    from ambient.core.errors import LockHeldError
    from ambient.service.adapters import Leases
    from tests.conftest import async_wait_until

    locks = LockManager(BrainPaths(tmp_path), grace_s=0.0)  # an expired lock is taken over at once
    leases = Leases(locks)
    grant = locks.acquire("projets/a.md", "sess-agent", ttl_s=0.6)
    leases.hold(grant)
    renewed = lambda: leases._held[(grant.file, grant.token)].expires > grant.expires + 0.5  # noqa: E731
    assert await async_wait_until(renewed, 5)
    assert await async_wait_until(lambda: time.time() > grant.expires + 0.1, 5)  # the first lease is over...
    # ... yet a contender still finds the lock held: it was renewed
    with pytest.raises(LockHeldError):
        await asyncio.to_thread(locks.acquire, "projets/a.md", "sess-contender", ttl_s=5, pid_bound=False)
    last = leases.drop(grant)
    assert last.token == grant.token
    locks.release_grant(last)
    assert locks.acquire("projets/a.md", "sess-contender", ttl_s=5).holder == "sess-contender"
