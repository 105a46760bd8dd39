"""The claims writer tested alone: a fan-out's item claims coalesced."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ambient.storage.paths import BrainPaths


class Clock:
    def __init__(self, now: datetime) -> None:
        self.t = now

    def now(self) -> datetime:
        return self.t

    def monotonic(self) -> float:
        return 0.0


@pytest.mark.slow
async def test_a_short_items_claim_is_written_once_and_a_long_items_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """for_each item claims: an item that finishes soon after it started is written once, in its final state; an
    item still running after ``OPEN_DELAY_S`` gets its open claim then; finished ones follow within
    ``FLUSH_DELAY_S``; nothing is lost at ``flush``."""
    from ambient.claims.store import ClaimStore
    from ambient.engine.runstate import ItemState, RunState
    from ambient.service.claims_writer import ClaimsWriter
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


async def test_a_stop_leaves_a_claims_backlog_to_the_journal_after_its_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``aclose`` writes what it can within its time, then stops between two chunks: the claims still queued are
    counted, never written after it returned (the next start writes them from the journals)."""
    import threading

    from ambient.claims.store import ClaimStore
    from ambient.engine.runstate import ItemState, RunState
    from ambient.service.claims_writer import ClaimsWriter

    paths = BrainPaths(tmp_path)
    paths.claims.mkdir()
    clock = Clock(datetime(2026, 11, 30, 12, 0, tzinfo=UTC))
    store = ClaimStore(paths, clock=clock)
    gate = threading.Event()
    chunks: list[int] = []
    real = store.write_claims

    def slow(claims: Any, *, durable: bool = True) -> Any:
        claims = list(claims)
        chunks.append(len(claims))
        gate.wait(10)  # a disk far behind: the first chunk is under way when the stop's time is up
        return real(claims, durable=durable)

    monkeypatch.setattr(store, "write_claims", slow)
    writer = ClaimsWriter(store, clock)
    items = [ItemState(name=f"i{n}", index=n, status="done", attempt=1) for n in range(3 * ClaimsWriter.CHUNK)]
    state = RunState(run_id="run-1", workflow="w", form="for_each", spec_hash=None, spec={}, items=items)
    for item in items:
        writer.item_changed(state, item)
    try:
        left = await writer.aclose(0.05)
    finally:
        gate.set()
    assert left == len(items)  # none was done when the time was up
    writer._writer.shutdown(wait=True)  # the chunk under way ends; nothing after it starts
    assert chunks == [ClaimsWriter.CHUNK]
    assert len(list(paths.claims.iterdir())) == ClaimsWriter.CHUNK
