"""The test doubles shipped in ambient.testing: the manual clock and the fakes of the engine's ports, driving a
real run manager and executor in-process."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ambient.core.clock import Clock
from ambient.engine.events import Ruling
from ambient.engine.foreach import ForEachExecutor
from ambient.engine.manager import RunManager
from ambient.engine.planner import FanOut, ItemTemplate
from ambient.engine.ports import AttemptResult, Ports
from ambient.engine.runs import RunExecutor
from ambient.engine.runstate import RunState, fold
from ambient.storage.journal import Journal, read_jsonl
from ambient.storage.paths import BrainPaths
from ambient.testing.clock import EPOCH, ManualClock
from ambient.testing.ports import FakeClaims, FakeDelegate, FakeEmitter, FakeEscalator, fake_ports
from tests.conftest import async_wait_until

T0 = datetime(2026, 3, 16, 21, 0, tzinfo=UTC)


class TestManualClock:
    def test_it_is_the_shells_clock_and_stands_still_until_moved(self) -> None:
        clock: Clock = ManualClock(T0)  # the protocol the shell takes
        assert clock.now() == T0 and clock.now() == T0
        assert clock.monotonic() == clock.monotonic() == 0.0
        assert ManualClock().now() == EPOCH

    def test_advance_moves_both_clocks(self) -> None:
        clock = ManualClock(T0)
        assert clock.advance(90) == T0 + timedelta(seconds=90)
        clock.advance(timedelta(minutes=1))
        assert clock.now() == T0 + timedelta(seconds=150)
        assert clock.monotonic() == 150.0
        assert clock.time() == (T0 + timedelta(seconds=150)).timestamp()

    def test_set_jumps_the_wall_clock_only(self) -> None:
        """A wall clock may jump back (an NTP step); the monotonic one never does."""
        clock = ManualClock(T0)
        clock.advance(10)
        clock.set(T0 - timedelta(hours=1))
        assert clock.now() == T0 - timedelta(hours=1) and clock.monotonic() == 10.0

    def test_time_never_runs_backwards_and_is_aware(self) -> None:
        clock = ManualClock(T0)
        with pytest.raises(ValueError, match="forwards only"):
            clock.advance(-1)
        with pytest.raises(ValueError, match="aware"):
            ManualClock(datetime(2026, 1, 1))
        with pytest.raises(ValueError, match="aware"):
            clock.set(datetime(2026, 1, 1))
        assert clock.now() == T0


def _manager(root: Path, ports: Ports) -> RunManager:
    paths = BrainPaths(root)
    template = ItemTemplate(
        agent="deploy",
        files=("vps/{{item}}.yml",),
        zone="project",
        complete_to="orchestrator",
        complete_result="{{success_count}}/{{total}} deployed",
    )

    def factory(state: RunState, journal: Journal) -> RunExecutor:
        return ForEachExecutor(state, FanOut(concurrency=2), template, ports, journal, paths)

    return RunManager(paths, factory)


async def test_the_fake_ports_drive_a_run_to_its_end(tmp_path: Path) -> None:
    """Scripted answers (a failure, then a success once the person says retry), an escalation kept, claims,
    the completion packet, all read back from the fakes; the run's journal is the real one."""
    items = ["a", "b", "c"]
    delegate = FakeDelegate({"b": [AttemptResult(result="fail", error="refused"), AttemptResult(result="success")]})
    ports = fake_ports(delegate=delegate, clock=ManualClock(T0))
    mgr = _manager(tmp_path, ports)
    run_id = mgr.start(workflow="deploy-batch", form="for_each", spec={}, spec_hash="h", items=items)
    escalator = ports.escalator
    assert isinstance(escalator, FakeEscalator)
    assert await async_wait_until(lambda: mgr.idle and bool(escalator.requests), 5)
    assert escalator.requests[0].item == "b"
    assert mgr.decide(Ruling("esc-1", "retry", "retry", by="human", channel="cli", latency_s=1.0))
    await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert [a.item for a in delegate.calls].count("b") == 2
    assert sorted(a.item for a in delegate.calls) == ["a", "b", "b", "c"]
    claims, emitter = ports.claims, ports.emitter
    assert isinstance(claims, FakeClaims) and isinstance(emitter, FakeEmitter)
    assert claims.items == {"a": "done", "b": "done", "c": "done"} and claims.runs[run_id] is True
    assert emitter.sent[-1] == ("RETURN", "orchestrator", {"result": "3/3 deployed"})
    state = fold(read_jsonl(BrainPaths(tmp_path).run_journal(run_id)).records)
    assert state.outcome == "success" and state.escalation_count == 1
