"""Chain runs with fake ports: gates, exit triggers, close tiers, breaker, modes, resume."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from ambient.claims.claim import Claim
from ambient.engine.chain import ChainExecutor, ChainSettings
from ambient.engine.events import Ruling
from ambient.engine.manager import RunManager
from ambient.engine.planner import ChainAction, ChainStep, FanOut, ItemTemplate, judge_step
from ambient.engine.ports import Attempt, AttemptResult, Ports
from ambient.engine.runs import RunExecutor
from ambient.engine.runstate import RunState
from ambient.storage.journal import Journal, read_jsonl
from ambient.storage.paths import BrainPaths
from ambient.workflows.fields import SATELLITE_TYPES
from ambient.workflows.variables import STEP_VARS
from tests.conftest import async_wait_until
from tests.unit.engine.test_runs import FakeClaims, FakeEmitter, FakeEscalator, _render


class StepDelegate:
    """Answers per step name from a script (a list of outputs consumed in order, last repeats)."""

    def __init__(self, script: dict[str, list[Any]] | None = None) -> None:
        self.script = script or {}
        self.calls: list[Attempt] = []

    async def attempt(self, a: Attempt) -> AttemptResult:
        self.calls.append(a)
        outs = self.script.get(a.item, [{"status": "ok"}])
        out = outs.pop(0) if len(outs) > 1 else outs[0]
        if out == "error":
            return AttemptResult(result="error", error="crashed")
        return AttemptResult(result="success", output=out, signal_in="RETURN")


class Breaker:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def fail(self, scope: str) -> int:
        self.counts[scope] = self.counts.get(scope, 0) + 1
        return self.counts[scope]

    def success(self, scope: str) -> None:
        self.counts[scope] = 0

    def reset(self, scope: str) -> None:
        self.counts[scope] = 0


STEPS = [
    ChainStep(name="1", type="code", scope="app/", agent="coder"),
    ChainStep(name="2", type="test", scope="app/", agent="tester", gate="0-failures"),
    ChainStep(name="3", type="brain-write", scope="docs/README.md", agent="scribe"),
    ChainStep(name="4", type="deploy", scope="vps/", agent="vps", gate="human"),
]
TESTS_OK = {"status": "ok", "tests": {"total": 3, "passed": 3, "failed": 0}}


def _chain(root: Path, delegate: StepDelegate, steps=STEPS, mode: str | None = None, breaker=None, render=_render):
    paths = BrainPaths(root)
    esc, claims, emitter = FakeEscalator(), FakeClaims(), FakeEmitter()
    ports = Ports(
        delegate=delegate,
        escalator=esc,
        claims=claims,
        emitter=emitter,
        render_text=render,
        render_path=render,
        rng=random.Random(3),
    )
    settings = ChainSettings(steps=steps, mode=mode, threshold=3, breaker=breaker)

    def factory(state: RunState, journal: Journal) -> RunExecutor:
        return ChainExecutor(state, FanOut(concurrency=1), ItemTemplate(agent="coder"), ports, journal, paths, settings)

    return RunManager(paths, factory), esc, emitter


def _start(mgr: RunManager, steps=STEPS) -> str:
    return mgr.start(workflow="feature", form="chain", spec={}, spec_hash=None, items=[s.name for s in steps])


async def _decide_last(mgr: RunManager, esc: FakeEscalator, option: str, n: int) -> None:
    assert await async_wait_until(lambda: len(esc.requests) >= n and mgr.idle, 5), esc.requests
    assert mgr.decide(Ruling(f"esc-{n}", option, option, by="human", channel="cli"))


async def test_chain_runs_in_order_and_stops_at_human_gate(tmp_path: Path) -> None:
    """Steps run in order; step 4 waits for approval; approval finishes the chain with DONE."""
    delegate = StepDelegate({"1": [{"status": "ok", "tests": {"failed": 0}}], "2": [TESTS_OK]})
    mgr, esc, emitter = _chain(tmp_path, delegate)
    run_id = _start(mgr)
    assert await async_wait_until(lambda: len(esc.requests) == 1 and mgr.idle, 5)
    assert [c.item for c in delegate.calls] == ["1", "2", "3"]
    assert esc.requests[0].kind == "gate" and "gate: human" in esc.requests[0].question
    assert ("GATE_PENDING", "human") in [(s, t) for s, t, _ in emitter.sent]
    await _decide_last(mgr, esc, "approve", 1)
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "success" and [c.item for c in delegate.calls] == ["1", "2", "3", "4"]
    signals = [s for s, _, _ in emitter.sent]
    assert signals.count("STEP_DONE") == 4 and signals[-1] == "DONE"
    assert delegate.calls[1].context["prior"]["tests"]["failed"] == 0


async def test_reject_at_gate_aborts_with_abort_signal(tmp_path: Path) -> None:
    """Rejecting the human gate aborts the chain and signals ABORT."""
    delegate = StepDelegate({"1": [{"status": "ok", "tests": {"failed": 0}}], "2": [TESTS_OK]})
    mgr, esc, emitter = _chain(tmp_path, delegate)
    run_id = _start(mgr)
    await _decide_last(mgr, esc, "reject", 1)
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "aborted" and emitter.sent[-1][0] == "ABORT"
    assert "4" not in [c.item for c in delegate.calls]


async def test_zero_failures_gate_blocks_on_failed_tests(tmp_path: Path) -> None:
    """gate 0-failures: failed tests route on_fail (default BLOCKED_ON) and wait for the person."""
    delegate = StepDelegate(
        {"1": [{"status": "ok", "tests": {"failed": 0}}], "2": [{"status": "ok", "tests": {"failed": 2}}, TESTS_OK]}
    )
    mgr, esc, emitter = _chain(tmp_path, delegate)
    _start(mgr)
    assert await async_wait_until(lambda: len(esc.requests) == 1 and mgr.idle, 5)
    assert esc.requests[0].kind == "blocked" and "2 test(s) failed" in esc.requests[0].question
    assert ("BLOCKED_ON", "human") in [(s, t) for s, t, _ in emitter.sent]
    await _decide_last(mgr, esc, "retry", 1)
    assert await async_wait_until(lambda: len(esc.requests) == 2 and mgr.idle, 5)  # now at step 4's gate
    assert [c.item for c in delegate.calls] == ["1", "2", "2", "3"]


async def test_breaker_trips_after_three_failures_and_never_restarts_alone(tmp_path: Path) -> None:
    """Three consecutive failures on a scope trip the breaker: CIRCUIT_BREAK, then wait; reset resumes."""
    steps = [ChainStep(name="1", type="deploy", scope="vps/", agent="vps", on_fail=(ChainAction("goto", target="1"),))]
    delegate = StepDelegate({"1": [{"status": "failed"}, {"status": "failed"}, {"status": "failed"}, {"status": "ok"}]})
    breaker = Breaker()
    mgr, esc, emitter = _chain(tmp_path, delegate, steps=steps, breaker=breaker)
    run_id = _start(mgr, steps)
    assert await async_wait_until(lambda: len(esc.requests) == 1 and mgr.idle, 5)
    assert esc.requests[0].kind == "circuit_break" and len(delegate.calls) == 3
    assert "CIRCUIT_BREAK" in [s for s, _, _ in emitter.sent] and breaker.counts["vps/"] == 3
    await _decide_last(mgr, esc, "reset", 1)
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "success" and len(delegate.calls) == 4 and breaker.counts["vps/"] == 0


async def test_manual_mode_gates_every_step(tmp_path: Path) -> None:
    """manual mode: a human gate before each step."""
    steps = STEPS[2:3]
    mgr, esc, _ = _chain(tmp_path, StepDelegate(), steps=steps, mode="manual")
    run_id = _start(mgr, steps)
    await _decide_last(mgr, esc, "approve", 1)
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "success" and "manual mode" in esc.requests[0].question


async def test_swarm_mode_gates_entry_and_final_result(tmp_path: Path) -> None:
    """swarm mode: the person gates the entry and the final result only."""
    steps = [ChainStep(name="a", type="brain-write", agent="scribe"), ChainStep(name="b", type="search")]
    mgr, esc, _ = _chain(tmp_path, StepDelegate(), steps=steps, mode="swarm")
    run_id = _start(mgr, steps)
    await _decide_last(mgr, esc, "approve", 1)
    await _decide_last(mgr, esc, "approve", 2)
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "success" and "final result" in esc.requests[1].question


async def test_exit_triggers_spawn_notify_and_signal(tmp_path: Path) -> None:
    """on_done spawns a satellite (trigger → type:test scope:X), notify is information, signal is emitted."""
    steps = [
        ChainStep(
            name="1",
            type="brain-write",
            agent="scribe",
            on_done=(
                ChainAction("notify", message="docs written"),
                ChainAction("spawn", step_type="search", scope="brain-engine/"),
            ),
        ),
        ChainStep(
            name="2",
            type="search",
            agent="scribe",
            on_done=(ChainAction("signal", signal="CHECKPOINT", target="pilote"), ChainAction("next")),
        ),
    ]
    mgr, _esc, emitter = _chain(tmp_path, StepDelegate(), steps=steps)
    run_id = _start(mgr, steps)
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "success"
    assert [i.name for i in state.items] == ["1", "2", "search@brain-engine/"]
    assert "docs written" in state.notes and ("CHECKPOINT", "human") in [(s, t) for s, t, _ in emitter.sent]


async def test_resume_after_kill_at_every_step_boundary(tmp_path: Path) -> None:
    """A history cut after each step resumes at the first step not done; no step runs twice."""
    delegate = StepDelegate({"1": [{"status": "ok", "tests": {"failed": 0}}], "2": [TESTS_OK]})
    steps = STEPS[:3]
    mgr, _, _ = _chain(tmp_path / "full", delegate, steps=steps)
    run_id = _start(mgr, steps)
    await asyncio.wait_for(mgr.tasks[run_id], 5)
    events = read_jsonl(BrainPaths(tmp_path / "full").run_journal(run_id)).records
    cuts = [i + 1 for i, e in enumerate(events) if e["ev"] == "cursor"]
    assert len(cuts) == 3
    for n, cut in enumerate(cuts[:-1], start=1):
        root = tmp_path / f"cut{n}"
        paths = BrainPaths(root)
        paths.run_journals.mkdir(parents=True)
        import json

        paths.run_journal(run_id).write_text("".join(json.dumps(e) + "\n" for e in events[:cut]))
        d2 = StepDelegate({"2": [TESTS_OK]})
        mgr2, _, _ = _chain(root, d2, steps=steps)
        mgr2.resume_all()
        state = await asyncio.wait_for(mgr2.tasks[run_id], 5)
        assert state.outcome == "success"
        assert [c.item for c in d2.calls] == [s.name for s in steps[n:]]


def test_judge_step_close_tiers() -> None:
    """Atomic closes at once; validated needs tests green or a person; failed tests fail the step."""
    assert judge_step(ChainStep(name="a", type="brain-write"), {"status": "ok"}, "success").needs_human is False
    assert judge_step(ChainStep(name="a", type="code"), {"status": "ok"}, "success").needs_human is True
    v = judge_step(ChainStep(name="a", type="test"), {"status": "ok", "tests": {"failed": 1}}, "success")
    assert v.status == "failed"
    assert judge_step(ChainStep(name="a", type="code"), {"status": "partial"}, "success").status == "partial"
    assert judge_step(ChainStep(name="a", type="domain", level="domain"), {"status": "ok"}, "success").status == "ok"


async def test_a_step_renders_with_the_names_validation_allows(tmp_path: Path) -> None:
    """One home for template variables (ambient.workflows.variables): a step's scope and story_angle are rendered
    with exactly the names `ambient validate` allows in a step; its runner gets the step, the workflow and the run."""
    seen: list[frozenset[str]] = []

    def recording(template: str, variables: Mapping[str, Any]) -> str:
        seen.append(frozenset(variables))
        return template

    steps = [
        ChainStep(name="1", type="brain-write", scope="docs/{{workflow}}/", agent="scribe", story_angle="{{step}}"),
        ChainStep(name="2", type="search", scope="docs/", agent="scout", story_angle="{{prior.status}}"),
    ]
    delegate = StepDelegate()
    mgr, _, _ = _chain(tmp_path, delegate, steps, render=recording)
    run_id = _start(mgr, steps)
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "success" and len(seen) == 4 and set(seen) == {STEP_VARS}  # 2 scopes, 2 angles
    assert [dict(c.vars) for c in delegate.calls] == [
        {"step": s.name, "workflow": "feature", "run_id": run_id} for s in steps
    ]


@pytest.mark.parametrize("level", ["leaf", "domain"])
@pytest.mark.parametrize("step_type", SATELLITE_TYPES)
def test_a_step_closes_with_the_tier_of_its_claim(step_type: str, level: str) -> None:
    """One home for the close tier (ambient.claims.claim.infer_close_tier): a step that says ok needs green tests or
    a person exactly when its claim, a satellite of the step's type and level, is tier 2 (validated)."""
    claim = Claim.model_validate(
        {"sess_id": "s", "type": "satellite", "scope": "app/", "agent": "coder", "status": "open",
         "opened_at": "2026-03-16T20:46", "satellite_type": step_type, "satellite_level": level}
    )  # fmt: skip
    verdict = judge_step(ChainStep(name="a", type=step_type, level=level), {"status": "ok"}, "success")
    assert verdict.needs_human is (claim.close_tier == 2)
    failed = judge_step(
        ChainStep(name="a", type=step_type, level=level), {"status": "ok", "tests": {"failed": 1}}, "success"
    )
    assert (failed.status == "failed") is (claim.close_tier == 2)
