"""Run journal events (``.ambient/runs/<run>.jsonl``): a journal written before folds to the same state, and the
writers write the same bytes.

The fixtures under ``tests/fixtures/run-journals/`` were written by the code before the events got their types
(``*.jsonl``), with the state it folded them to (``*.state.json``): three from the demo brain (a real daemon, real
agents), the others by the scenarios below run on a fixed clock. Set ``AMBIENT_WRITE_GOLDEN=1`` to write them again
(only ever on purpose: the point is that they do not change).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import shutil
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, get_args, get_type_hints

import pytest

from ambient.engine.budget import Limits
from ambient.engine.chain import ChainExecutor, ChainSettings
from ambient.engine.events import Ruling, RunEvent
from ambient.engine.foreach import ForEachExecutor
from ambient.engine.manager import RunManager
from ambient.engine.planner import ChainAction, ChainStep, FanOut, ItemTemplate, RetryPolicy
from ambient.engine.ports import Attempt, AttemptResult, Ports
from ambient.engine.runs import RunExecutor
from ambient.engine.runstate import RunState, fold
from ambient.engine.spend import SpendMeter
from ambient.storage.journal import Journal, read_jsonl
from ambient.storage.paths import BrainPaths
from tests.conftest import async_wait_until
from tests.unit.engine.test_chain import Breaker
from tests.unit.engine.test_runs import FakeClaims, FakeEmitter, FakeEscalator, _render

FIXTURES = Path(__file__).parents[2] / "fixtures" / "run-journals"
WRITE = os.environ.get("AMBIENT_WRITE_GOLDEN") == "1"
T0 = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
NO_WAIT = RetryPolicy(attempts=2, base_s=0.0, jitter=False)


def snapshot(state: RunState) -> Any:
    """A folded state as plain JSON (sets sorted), to compare with the one the code before folded (which had no
    ``asking``: an empty one is left out). Fields the state gained since (an item's ``resumed``: why it runs again,
    tested in test_resumed.py; the run's ``abort_note``: who and why, tested in test_adapt.py; the run's
    ``spent_by_day`` and ``calls_by`` when empty) are left out."""
    data = json.loads(json.dumps(dataclasses.asdict(state), default=sorted))
    for name in ("asking", "spent_by_day", "calls_by"):
        if not data.get(name):
            data.pop(name, None)
    data.pop("abort_note", None)
    for item in data["items"]:
        item.pop("resumed", None)
    return data


def _journals() -> list[Path]:
    return sorted(FIXTURES.glob("*.jsonl"))


@pytest.mark.parametrize("path", _journals(), ids=lambda p: p.stem)
def test_a_journal_written_before_folds_to_the_same_state(path: Path) -> None:
    """Every fixture journal, folded now, gives the state the code before the event types gave."""
    state = snapshot(fold(read_jsonl(path).records))
    expected = path.with_suffix(".state.json")
    if WRITE:
        expected.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    assert state == json.loads(expected.read_text())


def test_the_fixtures_hold_every_kind_of_event() -> None:
    """The fixtures cover each event type (:data:`ambient.engine.events.RunEvent`), so the test above folds each."""
    kinds = {get_args(get_type_hints(t)["ev"])[0] for t in get_args(RunEvent)}
    assert len(kinds) == 23
    assert {r["ev"] for p in _journals() for r in read_jsonl(p).records} >= kinds


# ---------------------------------------------------------------- the writers, byte for byte


class FixedClock:
    def __init__(self, at: datetime = T0) -> None:
        self.at = at

    def now(self) -> datetime:
        return self.at

    def monotonic(self) -> float:
        return 0.0


class Scripted:
    """Answers each item's attempts from a script, in order (the last one repeats); ``on_attempt`` sees each."""

    def __init__(
        self, script: Mapping[str, list[AttemptResult]], on_attempt: Callable[[Attempt], None] | None = None
    ) -> None:
        self.script = {k: list(v) for k, v in script.items()}
        self.on_attempt = on_attempt
        self.gate: asyncio.Event | None = None

    async def attempt(self, a: Attempt) -> AttemptResult:
        if self.on_attempt is not None:
            self.on_attempt(a)
        if self.gate is not None:
            await self.gate.wait()
        outs = self.script.get(a.item) or [AttemptResult(result="success", output={"status": "ok"}, signal_in="RETURN")]
        return outs.pop(0) if len(outs) > 1 else outs[0]


def _ports(delegate: Scripted, clock: FixedClock, meter: SpendMeter | None = None) -> Ports:
    return Ports(
        delegate=delegate,
        escalator=FakeEscalator(),
        claims=FakeClaims(),
        emitter=FakeEmitter(),
        render_text=_render,
        render_path=_render,
        clock=clock,
        rng=random.Random(7),
        budget=meter,
    )


def _fanout(root: Path, ports: Ports, clock: FixedClock) -> RunManager:
    paths = BrainPaths(root)
    template = ItemTemplate(agent="deploy", files=("vps/{{item}}.yml",), complete_to="orchestrator")

    def factory(state: RunState, journal: Journal) -> RunExecutor:
        return ForEachExecutor(state, FanOut(concurrency=1, retry=NO_WAIT), template, ports, journal, paths)

    return RunManager(paths, factory, clock)


def _usage(cost: float | None) -> dict[str, Any]:
    usage: dict[str, Any] = {"model": "m-1", "input_tokens": 10, "output_tokens": 5, "turns": 1}
    if cost is not None:
        usage["cost_usd"] = cost
    return usage


def _ok(cost: float | None = None, **extra: Any) -> AttemptResult:
    return AttemptResult(
        result="success",
        output={"status": "ok", **extra},
        signal_in="RETURN",
        duration_ms=12,
        usage=_usage(cost) if cost is not None else None,
    )


def _golden(root: Path, run_id: str, name: str) -> None:
    """The run's journal is byte for byte the one the code before wrote, and so is its summary in runs.jsonl."""
    paths = BrainPaths(root)
    written = paths.run_journal(run_id).read_bytes()
    path = FIXTURES / f"{name}.jsonl"
    lines = paths.runs_log.read_bytes().splitlines() if paths.runs_log.exists() else []
    summary = b"".join(line + b"\n" for line in lines if run_id.encode() in line)
    if WRITE:
        path.write_bytes(written)
        if summary:
            path.with_suffix(".summary.json").write_bytes(summary)
    assert written == path.read_bytes()
    if summary or path.with_suffix(".summary.json").exists():
        assert summary == path.with_suffix(".summary.json").read_bytes()


async def _until(mgr: RunManager, ports: Ports, n: int) -> None:
    esc = ports.escalator
    assert isinstance(esc, FakeEscalator)
    assert await async_wait_until(lambda: mgr.idle and len(esc.requests) == n, 5), esc.requests


async def test_a_fan_out_writes_its_journal_as_before(tmp_path: Path) -> None:
    """for_each: spawned pids, usage, a retry, a per-run budget hold raised, a provider hold, an agent's question, a
    permission, an unrecoverable error, decisions by a person and by a rule; the journal is the one written before."""
    clock = FixedClock()
    mgr: RunManager | None = None

    def spawned(a: Attempt) -> None:
        assert mgr is not None
        mgr.record_spawn(a.run_id, a.item, a.attempt, 4242 + a.index, started=100.25 if a.index % 2 else None)

    delegate = Scripted(
        {
            "a": [_ok(0.01, tests={"failed": 0})],
            "b": [AttemptResult(result="error", error="boom", duration_ms=3), _ok(0.01)],
            "c": [AttemptResult(result="fail", output={"status": "failed"}, error="refused", signal_in="RETURN")],
            "d": [
                AttemptResult(result="escalate", question="left or right?", options=["left", "right"], signal_in="ESC"),
                _ok(),
            ],
            "e": [
                AttemptResult(
                    result="escalate",
                    permission={"tool": "Bash", "signature": "Bash: ls -la"},
                    signal_in="ESCALATE",
                    usage=_usage(None),
                ),
                _ok(),
            ],
            "f": [AttemptResult(result="error", error="401: key refused", hold="provider_refused"), _ok()],
            "g": [AttemptResult(result="error", error="its own error", retryable=False, signal_in="ERROR")],
        },
        on_attempt=spawned,
    )
    ports = _ports(delegate, clock, SpendMeter(lambda: Limits(per_run_usd=0.015)))
    mgr = _fanout(tmp_path, ports, clock)
    run_id = mgr.start(
        workflow="golden-fanout",
        form="for_each",
        spec={"name": "golden-fanout"},
        spec_hash="h1",
        items=list("abcdefg"),
        context={"ticket": 7},
        run_id="sess-20260102-0304-golden-fanout-0001",
    )
    await _until(mgr, ports, 1)  # the per-run budget, reached after a and b
    assert mgr.decide(Ruling("esc-1", "raise", "raise", by="human", channel="cli", latency_s=3.5))
    await _until(mgr, ports, 5)  # c failed, d asks, e asks a permission, f's provider holds the run
    assert mgr.decide(
        Ruling("esc-5", "retry", "retry", by="human", channel="telegram", latency_s=1.25, note="key renewed")
    )
    await _until(mgr, ports, 6)  # g's own error
    assert mgr.decide(Ruling("esc-2", "skip", "skip", by="human", channel="cli"))
    assert mgr.decide(Ruling("esc-3", "left", "answer", by="human", channel="cli", answer="left"))
    assert mgr.decide(Ruling("esc-4", "deny", "answer", by="human", channel="cli", answer="deny"))
    assert mgr.decide(Ruling("esc-6", "skip", "skip", by="ambient", channel="rule", rule="r-1"))
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "partial"
    _golden(tmp_path, run_id, "golden-fanout")


async def test_a_daily_hold_waits_for_the_next_day_and_an_abort_ends_a_run(tmp_path: Path) -> None:
    """A daily budget answered ``wait`` lifts on the next UTC day (``unhold``); an ABORT packet ends the run."""
    clock = FixedClock()
    delegate = Scripted({"x": [_ok(0.02)], "z": [AttemptResult(result="fail", error="no", signal_in="RETURN")]})
    ports = _ports(delegate, clock, SpendMeter(lambda: Limits(daily_usd=0.01)))
    mgr = _fanout(tmp_path, ports, clock)
    run_id = mgr.start(
        workflow="golden-daily",
        form="for_each",
        spec={},
        spec_hash=None,
        items=["x", "y", "z", "w"],
        trigger="schedule",
        run_id="sess-20260102-0304-golden-daily-0001",
    )
    await _until(mgr, ports, 1)
    assert mgr.decide(Ruling("esc-1", "wait", "wait", by="human", channel="cli", latency_s=0.5))
    await asyncio.sleep(0.05)
    clock.at = T0 + timedelta(days=1)
    mgr.executors[run_id].poke()
    await _until(mgr, ports, 2)  # y ran on the new day, z failed and asks
    mgr.executors[run_id].abort(by="pilot", reason="enough")
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "aborted"
    _golden(tmp_path, run_id, "golden-daily")


async def test_a_stop_and_a_restart_write_their_interruptions_as_before(tmp_path: Path) -> None:
    """A stop records the running item ``interrupted``; a crash leaves it running, and the restart records it so."""
    clock = FixedClock()
    delegate = Scripted({})
    delegate.gate = asyncio.Event()
    ports = _ports(delegate, clock)
    mgr = _fanout(tmp_path / "one", ports, clock)
    run_id = mgr.start(
        workflow="golden-stop", form="for_each", spec={}, spec_hash=None, items=["p"], run_id="sess-golden-stop"
    )
    journal = BrainPaths(tmp_path / "one").run_journal(run_id)
    assert await async_wait_until(lambda: b'"accepted"' in journal.read_bytes(), 5)
    crashed = BrainPaths(tmp_path / "two")
    crashed.run_journals.mkdir(parents=True)
    shutil.copyfile(journal, crashed.run_journal(run_id))  # what a kill -9 would have left
    await mgr.shutdown(0.0)
    _golden(tmp_path / "one", run_id, "golden-stop")
    mgr2 = _fanout(tmp_path / "two", _ports(Scripted({}), clock), clock)
    assert mgr2.resume_all() == [run_id]
    state = await asyncio.wait_for(mgr2.tasks[run_id], 5)
    assert state.outcome == "success"
    _golden(tmp_path / "two", run_id, "golden-restart")


def _chain(root: Path, ports: Ports, clock: FixedClock, steps: list[ChainStep], mode: str | None) -> RunManager:
    paths = BrainPaths(root)
    settings = ChainSettings(
        steps=steps,
        mode=mode,
        threshold=2,
        breaker=Breaker(),
        default_agents={"search": "finder"},
        start_workflow=lambda wf, step, ctx, trigger: f"sess-{wf}-{step}",
    )

    def factory(state: RunState, journal: Journal) -> RunExecutor:
        return ChainExecutor(
            state, FanOut(concurrency=1, retry=NO_WAIT), ItemTemplate(agent="coder"), ports, journal, paths, settings
        )

    return RunManager(paths, factory, clock)


async def test_a_chain_writes_its_journal_as_before(tmp_path: Path) -> None:
    """chain (swarm): the entry gate, a retry, a satellite, a loop back, an agent's question, another workflow
    started, a human gate before and after a step, the final gate; the journal is the one written before."""
    clock = FixedClock()
    tests_ok = {"status": "ok", "tests": {"total": 3, "passed": 3, "failed": 0}}
    steps = [
        ChainStep(
            name="1",
            type="code",
            scope="app/",
            agent="coder",
            retry=NO_WAIT,
            on_done=(
                ChainAction("notify", message="code written"),
                ChainAction("spawn", step_type="search", scope="docs/"),
            ),
        ),
        ChainStep(
            name="2",
            type="test",
            scope="app/",
            agent="tester",
            gate="0-failures",
            on_fail=(ChainAction("goto", target="2"),),
        ),
        ChainStep(
            name="3", type="brain-write", agent="scribe", on_done=(ChainAction("start", workflow="other", target="s1"),)
        ),
        ChainStep(name="4", type="code", scope="vps/", agent="vps", gate="human"),
    ]
    delegate = Scripted(
        {
            "1": [AttemptResult(result="error", error="crashed"), _ok(0.5, tests={"failed": 0})],
            "2": [_ok(tests={"failed": 2}), AttemptResult(result="success", output=tests_ok, signal_in="RETURN")],
            "3": [AttemptResult(result="escalate", question="publish now?", options=["yes", "no"]), _ok()],
            "4": [_ok()],
        }
    )
    ports = _ports(delegate, clock)
    mgr = _chain(tmp_path, ports, clock, steps, "swarm")
    run_id = mgr.start(
        workflow="golden-chain",
        form="chain",
        spec={"name": "golden-chain"},
        spec_hash="h2",
        items=[s.name for s in steps],
        mode="swarm",
        trigger="manual",
        run_id="sess-20260102-0304-golden-chain-0001",
    )
    await _until(mgr, ports, 1)  # the entry gate
    assert mgr.decide(Ruling("esc-1", "approve", "approve", by="human", channel="cli", latency_s=2.0))
    await _until(mgr, ports, 2)  # step 3's agent asks
    assert mgr.decide(Ruling("esc-2", "yes", "answer", by="human", channel="cli", answer="yes"))
    await _until(mgr, ports, 3)  # step 4 has gate: human
    assert mgr.decide(Ruling("esc-3", "approve", "approve", by="human", channel="cli"))
    await _until(mgr, ports, 4)  # step 4 closed without tests
    assert mgr.decide(Ruling("esc-4", "approve", "approve", by="human", channel="cli"))
    await _until(mgr, ports, 5)  # the final result
    assert mgr.decide(Ruling("esc-5", "approve", "approve", by="human", channel="cli", latency_s=9.0))
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "success"
    _golden(tmp_path, run_id, "golden-chain")


async def test_a_failing_chain_writes_its_journal_as_before(tmp_path: Path) -> None:
    """chain: a blocked step retried, the breaker tripped and reset, an exit trigger's abort."""
    clock = FixedClock()
    failed = AttemptResult(result="success", output={"status": "failed"}, signal_in="RETURN")
    steps = [
        ChainStep(name="build", type="deploy", scope="vps/", agent="vps"),
        ChainStep(name="ship", type="deploy", scope="vps/", agent="vps", on_fail=(ChainAction("abort"),)),
    ]
    delegate = Scripted({"build": [failed, failed, _ok()], "ship": [failed]})
    ports = _ports(delegate, clock)
    mgr = _chain(tmp_path, ports, clock, steps, None)
    run_id = mgr.start(
        workflow="golden-breaker",
        form="chain",
        spec={},
        spec_hash=None,
        items=[s.name for s in steps],
        run_id="sess-20260102-0304-golden-breaker-0001",
    )
    await _until(mgr, ports, 1)  # build blocked
    assert mgr.decide(Ruling("esc-1", "retry", "retry", by="human", channel="cli"))
    await _until(mgr, ports, 2)  # build failed twice on vps/: the breaker trips
    assert mgr.decide(Ruling("esc-2", "reset", "reset", by="human", channel="cli"))
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "aborted"
    _golden(tmp_path, run_id, "golden-breaker")
