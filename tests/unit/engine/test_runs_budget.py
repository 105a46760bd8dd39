"""Budgets, run holds and permission escalations in the executors, with fake ports: one escalation per run and
hold, answers that continue or abort, holds kept across a restart (a new executor from the same journal)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ambient.engine.budget import Limits, day_of
from ambient.engine.chain import ChainExecutor, ChainSettings
from ambient.engine.events import CallFields, Ruling
from ambient.engine.foreach import ForEachExecutor
from ambient.engine.manager import RunManager
from ambient.engine.planner import ChainStep, FanOut, ItemTemplate
from ambient.engine.ports import Attempt, AttemptResult, Ports
from ambient.engine.runs import RunExecutor
from ambient.engine.runstate import RunState, fold
from ambient.engine.spend import SpendMeter
from ambient.storage.journal import Journal, read_jsonl
from ambient.storage.paths import BrainPaths
from tests.conftest import async_wait_until
from tests.unit.engine.test_runs import FakeClaims, FakeEmitter, FakeEscalator, _render

ITEMS = [f"i{n}" for n in range(1, 7)]


class CostlyDelegate:
    """Every attempt succeeds and costs ``cost`` (None: unknown); ``reply`` may answer otherwise per item."""

    def __init__(self, cost: float | None = 1.0, reply: Callable[[Attempt], AttemptResult | None] | None = None):
        self.cost = cost
        self.reply = reply
        self.calls: list[Attempt] = []
        self.gate: asyncio.Event | None = None

    async def attempt(self, a: Attempt) -> AttemptResult:
        self.calls.append(a)
        if self.gate is not None:
            await self.gate.wait()
        res = self.reply(a) if self.reply is not None else None
        if res is not None:
            return res
        usage: dict[str, Any] = {"model": "m", "input_tokens": 10, "output_tokens": 5, "turns": 1}
        if self.cost is not None:
            usage["cost_usd"] = self.cost
        return AttemptResult(result="success", output={"status": "ok"}, signal_in="RETURN", usage=usage)


class Clock:
    def __init__(self, now: datetime) -> None:
        self.at = now

    def now(self) -> datetime:
        return self.at

    def monotonic(self) -> float:
        return 0.0


def _manager(
    root: Path,
    delegate: CostlyDelegate,
    meter: SpendMeter | None,
    *,
    concurrency: int = 2,
    clock: Clock | None = None,
    escalator: FakeEscalator | None = None,
    chain: bool = False,
) -> tuple[RunManager, FakeEscalator]:
    paths = BrainPaths(root)
    esc = escalator or FakeEscalator()
    ports = Ports(
        delegate=delegate,
        escalator=esc,
        claims=FakeClaims(),
        emitter=FakeEmitter(),
        render_text=_render,
        render_path=_render,
        rng=random.Random(1),
        budget=meter,
        **({"clock": clock} if clock is not None else {}),
    )
    template = ItemTemplate(agent="coder", complete_to="orchestrator")

    def factory(state: RunState, journal: Journal) -> RunExecutor:
        if chain:
            steps = [ChainStep(name=i.name, type="search", agent="coder") for i in state.items]
            return ChainExecutor(
                state, FanOut(concurrency=1), template, ports, journal, paths, ChainSettings(steps=steps)
            )
        return ForEachExecutor(state, FanOut(concurrency=concurrency), template, ports, journal, paths)

    return RunManager(paths, factory, clock), esc


def _journal(root: Path, run_id: str) -> RunState:
    return fold(read_jsonl(BrainPaths(root).run_journal(run_id)).records)


async def test_per_run_budget_two_items_over_one_escalation_then_raise_continues(tmp_path: Path) -> None:
    """Two items finish together past the budget: one escalation, no third spawn; raise → spent plus a budget."""
    delegate = CostlyDelegate(cost=1.5)
    meter = SpendMeter(lambda: Limits(per_run_usd=2.0))
    mgr, esc = _manager(tmp_path, delegate, meter)
    run_id = mgr.start(workflow="deploy-batch", form="for_each", spec={}, spec_hash=None, items=ITEMS)
    assert await async_wait_until(lambda: mgr.idle and bool(esc.requests), 5)
    assert len(delegate.calls) == 2 and len(esc.requests) == 1
    req = esc.requests[0]
    assert req.kind == "budget" and req.item is None
    assert req.question.startswith(
        "deploy-batch reached its budget: $3.00 spent against per_run_usd $2.00; spent by coder $3.00;"
    )
    assert [o[0] for o in req.options] == ["raise", "raise-x2", "wait", "abort"]
    await asyncio.sleep(0.05)
    assert len(esc.requests) == 1 and len(delegate.calls) == 2  # held: asked once, nothing starts
    assert mgr.decide(Ruling("esc-1", "raise", "raise", by="human", channel="cli"))
    # $3.00 spent of $5.00 now: one more batch of two starts, then the run holds again
    assert await async_wait_until(lambda: mgr.idle and len(esc.requests) == 2, 5)
    assert len(delegate.calls) == 4
    assert "$6.00 spent against per_run_usd $2.00, $5.00 with what you allowed more" in esc.requests[1].question
    assert mgr.decide(Ruling("esc-2", "abort", "abort", by="human", channel="cli"))
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "aborted" and len(delegate.calls) == 4
    rec = read_jsonl(BrainPaths(tmp_path).runs_log).records[0]
    assert rec["cost_usd"] == 6.0 and rec["input_tokens"] == 40 and len(rec["steps"]) == 4
    assert rec["steps"][0]["usage"]["cost_usd"] == 1.5


async def test_a_hold_survives_a_restart(tmp_path: Path) -> None:
    """A new executor from the same journal stays held without asking again; the answer then goes to it."""
    delegate = CostlyDelegate(cost=1.0)
    mgr, esc = _manager(tmp_path, delegate, SpendMeter(lambda: Limits(per_run_usd=1.0)), concurrency=1)
    run_id = mgr.start(workflow="w", form="for_each", spec={}, spec_hash=None, items=ITEMS[:3])
    assert await async_wait_until(lambda: mgr.idle and bool(esc.requests), 5)
    mgr.tasks[run_id].cancel()
    await asyncio.gather(mgr.tasks[run_id], return_exceptions=True)
    mgr.executors[run_id].journal.close()

    delegate2 = CostlyDelegate(cost=1.0)
    mgr2, esc2 = _manager(tmp_path, delegate2, SpendMeter(lambda: Limits(per_run_usd=1.0)), concurrency=1)
    assert mgr2.resume_all() == [run_id]
    await asyncio.sleep(0.1)
    assert mgr2.idle and delegate2.calls == [] and esc2.requests == []  # held, and asked already
    assert mgr2.executors[run_id].state.holds["per_run"]["escalation"] == "esc-1"
    assert mgr2.decide(Ruling("esc-1", "raise", "raise", by="human", channel="cli"))
    assert await async_wait_until(lambda: mgr2.idle and bool(esc2.requests), 5)
    assert [a.item for a in delegate2.calls] == ["i2"]  # one more budget's worth, then held again
    assert [o[0] for o in esc2.requests[0].options] == ["raise", "raise-x2", "wait", "abort"]  # $2 spent of $2


async def test_wait_on_a_per_run_budget_asks_again_raise_or_abort(tmp_path: Path) -> None:
    delegate = CostlyDelegate(cost=1.0)
    mgr, esc = _manager(tmp_path, delegate, SpendMeter(lambda: Limits(per_run_usd=1.0)), concurrency=1)
    run_id = mgr.start(workflow="w", form="for_each", spec={}, spec_hash=None, items=ITEMS[:2])
    assert await async_wait_until(lambda: mgr.idle and bool(esc.requests), 5)
    assert mgr.decide(Ruling("esc-1", "wait", "wait", by="human", channel="cli"))
    assert await async_wait_until(lambda: len(esc.requests) == 2, 5)
    assert [o[0] for o in esc.requests[1].options] == ["raise", "abort"] and len(delegate.calls) == 1
    assert mgr.decide(Ruling("esc-2", "raise", "raise", by="human", channel="cli"))
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "success" and len(delegate.calls) == 2


async def test_daily_budget_wait_continues_by_itself_the_next_utc_day(tmp_path: Path) -> None:
    clock = Clock(datetime(2026, 3, 18, 23, 59, 59, 950000, tzinfo=UTC))
    meter = SpendMeter(lambda: Limits(daily_usd=1.0))
    meter.add(0.75, clock.now())  # another run spent this today
    delegate = CostlyDelegate(cost=0.5)
    mgr, esc = _manager(tmp_path, delegate, meter, concurrency=1, clock=clock)
    run_id = mgr.start(workflow="w", form="for_each", spec={}, spec_hash=None, items=ITEMS[:2])
    assert await async_wait_until(lambda: mgr.idle and bool(esc.requests), 5)
    assert (
        "reached the daily budget: $1.25 spent today by all runs (UTC day 2026-03-18) against daily_usd $1.00"
        in esc.requests[0].question
    )
    assert mgr.decide(Ruling("esc-1", "wait", "wait", by="human", channel="cli"))
    await asyncio.sleep(0.01)
    assert len(delegate.calls) == 1 and len(esc.requests) == 1  # a daily wait is not asked again
    clock.at = datetime(2026, 3, 19, 0, 0, 1, tzinfo=UTC)  # the executor's timer fires at 00:00 UTC
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "success" and len(delegate.calls) == 2
    events = [e["ev"] for e in read_jsonl(BrainPaths(tmp_path).run_journal(run_id)).records]
    assert "unhold" in events


async def test_daily_budget_raise_lifts_this_runs_cap_for_the_day(tmp_path: Path) -> None:
    meter = SpendMeter(lambda: Limits(daily_usd=1.0))
    delegate = CostlyDelegate(cost=1.0)
    mgr, esc = _manager(tmp_path, delegate, meter, concurrency=1)
    run_id = mgr.start(workflow="w", form="for_each", spec={}, spec_hash=None, items=ITEMS[:2])
    assert await async_wait_until(lambda: mgr.idle and bool(esc.requests), 5)
    assert mgr.decide(Ruling("esc-1", "raise", "raise", by="human", channel="cli"))
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "success" and len(esc.requests) == 1 and meter.spent(meter.day or "") == 2.0


async def test_unknown_cost_is_flagged_and_never_reaches_a_budget(tmp_path: Path) -> None:
    delegate = CostlyDelegate(cost=None)
    mgr, esc = _manager(tmp_path, delegate, SpendMeter(lambda: Limits(per_run_usd=0.01)))
    run_id = mgr.start(workflow="w", form="for_each", spec={}, spec_hash=None, items=ITEMS[:3])
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "success" and not esc.requests
    rec = read_jsonl(BrainPaths(tmp_path).runs_log).records[0]
    assert rec["cost_usd"] == 0 and rec["cost_unknown"] == 3 and rec["input_tokens"] == 30


def _refused(a: Attempt, refused: set[str]) -> AttemptResult | None:
    if a.item in refused:
        return AttemptResult(result="error", error="401 invalid x-api-key", hold="provider_refused")
    return None


async def test_provider_refusal_three_concurrent_items_one_escalation_attempts_unspent(tmp_path: Path) -> None:
    refused = set(ITEMS[:3])
    delegate = CostlyDelegate(reply=lambda a: _refused(a, refused))
    delegate.gate = asyncio.Event()
    mgr, esc = _manager(tmp_path, delegate, None, concurrency=3)
    run_id = mgr.start(workflow="w", form="for_each", spec={}, spec_hash=None, items=ITEMS[:4])
    assert await async_wait_until(lambda: len(delegate.calls) == 3, 5)
    delegate.gate.set()  # the three come back together
    assert await async_wait_until(lambda: mgr.idle and bool(esc.requests), 5)
    await asyncio.sleep(0.05)
    assert len(esc.requests) == 1 and len(delegate.calls) == 3  # one escalation; i4 did not start
    req = esc.requests[0]
    assert req.kind == "provider"
    assert req.question == "the model provider cannot be used, so this run waits: 401 invalid x-api-key"
    assert [o[0] for o in req.options] == ["retry", "abort"]
    state = _journal(tmp_path, run_id)
    assert [(i.status, i.attempt, i.fails) for i in state.items[:3]] == [("pending", 1, 0)] * 3
    assert state.error_count == 0 and state.steps == []
    refused.clear()
    assert mgr.decide(Ruling("esc-1", "retry", "retry", by="human", channel="cli"))
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "success" and state.escalation_count == 1
    again = [(a.item, a.attempt) for a in delegate.calls[3:]]
    assert sorted(again) == [("i1", 1), ("i2", 1), ("i3", 1), ("i4", 1)]  # the same attempt numbers: none spent


async def test_provider_hold_abort_aborts_the_run(tmp_path: Path) -> None:
    delegate = CostlyDelegate(reply=lambda a: _refused(a, {"i1"}))
    mgr, esc = _manager(tmp_path, delegate, None, concurrency=1)
    run_id = mgr.start(workflow="w", form="for_each", spec={}, spec_hash=None, items=ITEMS[:2])
    assert await async_wait_until(lambda: mgr.idle and bool(esc.requests), 5)
    assert mgr.decide(Ruling("esc-1", "abort", "abort", by="human", channel="cli"))
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "aborted" and len(delegate.calls) == 1


PERMISSION = {
    "tool": "Bash",
    "input": {"command": "rm -rf build/"},
    "signature": "Bash: rm -rf build/",
    "session_id": "s-1",
}


def _asks_permission(a: Attempt) -> AttemptResult | None:
    if "decision" in a.context:
        return None
    return AttemptResult(
        result="escalate",
        signal_in="ESCALATE",
        question="coder wants to run `rm -rf build/` in projets/feature",
        options=["allow", "allow always", "deny"],
        permission=PERMISSION,
        usage={"cost_usd": 0.1, "input_tokens": 3},
    )


async def test_permission_escalation_kind_options_and_what_replay_needs(tmp_path: Path) -> None:
    delegate = CostlyDelegate(cost=0.1, reply=_asks_permission)
    mgr, esc = _manager(tmp_path, delegate, None, concurrency=1)
    run_id = mgr.start(workflow="w", form="for_each", spec={}, spec_hash=None, items=ITEMS[:1])
    assert await async_wait_until(lambda: mgr.idle and bool(esc.requests), 5)
    req = esc.requests[0]
    assert req.kind == "permission" and req.detail == "Bash: rm -rf build/" and req.item == "i1"
    assert req.question == "coder wants to run `rm -rf build/` in projets/feature"
    assert [o[0] for o in req.options] == ["allow", "allow always", "deny", "skip", "abort"]
    assert mgr.decide(Ruling("esc-1", "allow", "answer", by="human", channel="cli", answer="allow"))
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "success" and delegate.calls[1].context["decision"] == "allow"
    rec = read_jsonl(BrainPaths(tmp_path).runs_log).records[0]
    assert rec["steps"][0]["permission_signature"] == "Bash: rm -rf build/"
    assert rec["asked"][0]["kind"] == "permission"
    assert rec["cost_usd"] == 0.2

    from ambient.learning.rules import situation_from_step, situation_of

    assert situation_from_step("w", rec["steps"][0]) == situation_of(
        "w", "coder", "permission", detail=req.detail, step="i1"
    )


async def test_a_chain_holds_on_the_provider_and_asks_permissions(tmp_path: Path) -> None:
    refused = {"s1"}

    def reply(a: Attempt) -> AttemptResult | None:
        if a.item in refused:
            return AttemptResult(result="error", error="403 forbidden", hold="provider_refused")
        if a.item == "s2":
            return _asks_permission(a)
        return None

    delegate = CostlyDelegate(cost=0.5, reply=reply)
    mgr, esc = _manager(tmp_path, delegate, SpendMeter(lambda: Limits(per_run_usd=10.0)), chain=True)
    run_id = mgr.start(workflow="c", form="chain", spec={}, spec_hash=None, items=["s1", "s2", "s3"])
    assert await async_wait_until(lambda: mgr.idle and bool(esc.requests), 5)
    assert esc.requests[0].kind == "provider" and len(delegate.calls) == 1
    refused.clear()
    assert mgr.decide(Ruling("esc-1", "retry", "retry", by="human", channel="cli"))
    assert await async_wait_until(lambda: mgr.idle and len(esc.requests) == 2, 5)
    assert esc.requests[1].kind == "permission" and esc.requests[1].detail == "Bash: rm -rf build/"
    assert [(a.item, a.attempt) for a in delegate.calls[:2]] == [("s1", 1), ("s1", 1)]
    assert mgr.decide(Ruling("esc-2", "allow", "answer", by="human", channel="cli", answer="allow"))
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "success" and round(state.usage.cost_usd, 6) == 1.6  # s1, s2 asking, s2, s3


async def test_a_chain_reaching_its_budget_starts_no_further_step(tmp_path: Path) -> None:
    delegate = CostlyDelegate(cost=1.0)
    mgr, esc = _manager(tmp_path, delegate, SpendMeter(lambda: Limits(per_run_usd=1.0)), chain=True)
    run_id = mgr.start(workflow="c", form="chain", spec={}, spec_hash=None, items=["s1", "s2"])
    assert await async_wait_until(lambda: mgr.idle and bool(esc.requests), 5)
    await asyncio.sleep(0.05)
    assert [a.item for a in delegate.calls] == ["s1"] and len(esc.requests) == 1
    assert esc.requests[0].kind == "budget"
    assert mgr.decide(Ruling("esc-1", "raise", "raise", by="human", channel="cli"))
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "success" and [a.item for a in delegate.calls] == ["s1", "s2"]


async def test_runs_and_status_show_the_cost_and_the_hold(tmp_path: Path, capsys: Any) -> None:
    from ambient.cli import main
    from ambient.cli.status import collect

    delegate = CostlyDelegate(cost=1.25)
    mgr, esc = _manager(tmp_path, delegate, SpendMeter(lambda: Limits(per_run_usd=1.0)), concurrency=1)
    run_id = mgr.start(workflow="w", form="for_each", spec={}, spec_hash=None, items=ITEMS[:2])
    assert await async_wait_until(lambda: mgr.idle and bool(esc.requests), 5)
    held = await asyncio.to_thread(collect, tmp_path)
    run = next(r for r in held["runs"] if r["run_id"] == run_id)
    assert run["cost_usd"] == 1.25 and run["held"] == ["per_run"]
    assert main(["runs", "--brain", str(tmp_path)]) == 0
    assert "running   1/2 done cost=$1.25" in capsys.readouterr().out
    from ambient.cli.status import print_status

    lines: list[str] = []
    await asyncio.to_thread(lambda: print_status(tmp_path, write=lines.append))
    assert any("cost=$1.25 HELD: its budget" in line for line in lines)
    mgr.decide(Ruling("esc-1", "abort", "abort", by="human", channel="cli"))
    await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert main(["runs", "--brain", str(tmp_path)]) == 0
    assert "cost=$1.25" in capsys.readouterr().out


class MeteredDelegate(CostlyDelegate):
    """Each attempt as the model gateway carries it out: every call recorded in the run's journal as it comes, the
    run asked before each one; past the budget the call is refused and the attempt comes back ``over_budget``."""

    def __init__(self) -> None:
        super().__init__()
        self.manager: RunManager | None = None
        self.verdicts: list[str | None] = []

    async def attempt(self, a: Attempt) -> AttemptResult:
        self.calls.append(a)
        assert self.manager is not None
        ex = self.manager.executors[a.run_id]
        for n in range(3):
            verdict = ex.over_budget()
            self.verdicts.append(verdict)
            if verdict is not None:
                break
            usage = {"model": "m", "input_tokens": 100, "output_tokens": 10, "cost_usd": 0.75, "turns": 1}
            fields: CallFields = {
                "item": a.item,
                "attempt": a.attempt,
                "agent": "coder",
                "key": a.key,
                "id": f"msg_{n}",
                "usage": usage,
                "sent": "2026-03-18T10:00:00.000+00:00",
            }
            await ex.record_call(fields)
        total = {"model": "m", "input_tokens": 200, "output_tokens": 20, "cost_usd": 1.5, "turns": 2}
        usage = {**total, "metered": True, "refused_calls": 1}
        return AttemptResult(result="error", error="a model call was refused", usage=usage, hold="over_budget")


async def test_calls_metered_by_the_gateway_count_at_once_and_a_refused_one_holds_the_run(tmp_path: Path) -> None:
    """The gateway records each model call as it happens and asks the run before the next one: past the budget the
    call is refused, the attempt does not count (its item pending again, no failure) and the run holds with the one
    budget question; the attempt's metered total is not counted again."""
    meter = SpendMeter(lambda: Limits(per_run_usd=1.0, daily_usd=10.0))
    delegate = MeteredDelegate()
    mgr, esc = _manager(tmp_path, delegate, meter, concurrency=1)
    delegate.manager = mgr
    run_id = mgr.start(workflow="deploy-batch", form="for_each", spec={}, spec_hash=None, items=ITEMS[:2])
    assert await async_wait_until(lambda: mgr.idle and bool(esc.requests), 5)
    refusal = delegate.verdicts[2]
    assert delegate.verdicts[:2] == [None, None] and refusal is not None and "budget is reached" in refusal
    assert len(delegate.calls) == 1 and len(esc.requests) == 1  # held: the second item never started
    [req] = esc.requests
    assert req.kind == "budget" and "$1.50" in req.question
    state = _journal(tmp_path, run_id)
    assert state.usage.cost_usd == pytest.approx(1.5)  # the two calls, not again with the metered total
    assert meter.spent(day_of(datetime.now(UTC))) == pytest.approx(1.5)
    first = state.items[0]
    assert first.status == "pending" and first.fails == 0
    assert state.calls_by["coder"]["m"]["calls"] == 2 and state.calls_by["coder"]["m"]["refused"] == 1
