"""Replay (ambient.learning.replay): a workflow replayed over its own records meets exactly the escalations it met.

The property test runs real executors (ForEachExecutor, ChainExecutor) with fake agents whose answers, and a person
whose decisions, hypothesis draws; the run's own record, replayed through the same workflow, must give the same
number of escalations and route no step differently.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ambient.engine.chain import ChainExecutor, ChainSettings
from ambient.engine.compile import chain_steps, fanout, item_template, items_of, retry_policy
from ambient.engine.events import Ruling
from ambient.engine.foreach import ForEachExecutor
from ambient.engine.manager import RunManager
from ambient.engine.planner import FanOut
from ambient.engine.ports import Attempt, AttemptResult, EscalationRequest, Ports
from ambient.engine.runs import RunExecutor, run_record
from ambient.engine.runstate import RunState
from ambient.learning.replay import fates, replay, reply_of
from ambient.learning.rules import observe, situation_from_step
from ambient.storage.journal import Journal
from ambient.storage.paths import BrainPaths
from ambient.workflows.spec import ChainWorkflow, ForEachWorkflow, WorkflowSpec, parse_workflow
from tests.conftest import async_wait_until
from tests.unit.engine.test_runs import FakeClaims, FakeEmitter
from tests.unit.learning.test_rules import OPTED
from tests.unit.learning.test_stats import T0, run, step


def _render(template: str, variables: Mapping[str, Any]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: str(variables.get(m.group(1), "")), template)


class ScriptedAgent:
    """Answers from a drawn script, one answer per call; once it is used up, every call succeeds."""

    def __init__(self, script: Sequence[tuple[str, str | None, int | None]]) -> None:
        self.script = list(script)

    async def attempt(self, a: Attempt) -> AttemptResult:
        await asyncio.sleep(0)
        reply, status, failed = self.script.pop(0) if self.script else ("success", "ok", None)
        output: dict[str, Any] = {}
        if status is not None:
            output["status"] = status
        if failed is not None:
            output["tests"] = {"total": 2, "passed": 2 - failed, "failed": failed}
        if reply == "escalate":
            return AttemptResult(
                result="escalate", question="which one?", options=["left", "right"], signal_in="ESCALATE"
            )
        if reply == "blocked":
            return AttemptResult(result="blocked", error="missing key", signal_in="BLOCKED_ON")
        if reply == "error":
            return AttemptResult(result="error", error="crashed", signal_in="ERROR")
        if reply == "unrecoverable":  # the agent's own ERROR signal: never retried
            return AttemptResult(result="error", error="gone", signal_in="ERROR", retryable=False)
        if reply == "fail":
            return AttemptResult(result="fail", error="refused", output=output or None, signal_in="RETURN")
        return AttemptResult(result="success", output=output, signal_in="RETURN")


class Person:
    """Answers each escalation with a drawn option among those offered (what the decider draws is an index)."""

    def __init__(self, picks: Sequence[int]) -> None:
        self.picks = list(picks)
        self.requests: dict[str, EscalationRequest] = {}

    async def escalate(self, req: EscalationRequest) -> str:
        esc_id = f"esc-{len(self.requests) + 1}"
        self.requests[esc_id] = req
        return esc_id

    async def inform(self, title: str, body: str) -> None:
        return None

    def choose(self, req: EscalationRequest) -> tuple[str, str, str]:
        pick = self.picks.pop(0) if self.picks else 0
        return req.options[pick % len(req.options)]


def _executor_factory(spec: WorkflowSpec, root: Path, agent: ScriptedAgent, person: Person):
    paths = BrainPaths(root)
    ports = Ports(
        delegate=agent,
        escalator=person,
        claims=FakeClaims(),
        emitter=FakeEmitter(),
        render_text=_render,
        render_path=_render,
        rng=random.Random(0),
    )
    template = item_template(spec)

    def factory(state: RunState, journal: Journal) -> RunExecutor:
        if isinstance(spec, ForEachWorkflow):
            return ForEachExecutor(state, fanout(spec), template, ports, journal, paths)
        assert isinstance(spec, ChainWorkflow)
        chain = ChainSettings(steps=chain_steps(spec), mode=spec.mode, threshold=3)
        return ChainExecutor(
            state, FanOut(concurrency=1, retry=retry_policy(spec.retry)), template, ports, journal, paths, chain
        )

    return factory


async def _run(spec: WorkflowSpec, root: Path, agent: ScriptedAgent, person: Person) -> dict[str, Any]:
    """Run the workflow to its end, the person deciding each escalation; the run's record."""
    mgr = RunManager(BrainPaths(root), _executor_factory(spec, root, agent, person))
    mgr.slots.resize(8)
    run_id = mgr.start(
        workflow=spec.name,
        form=spec.form,
        spec=spec.model_dump(mode="json"),
        spec_hash=None,
        items=items_of(spec),
        mode=spec.mode,
    )
    task = mgr.tasks[run_id]
    ex = mgr.executors[run_id]
    decisions = 0
    while not task.done():
        assert await async_wait_until(lambda: task.done() or (mgr.idle and bool(ex.state.escalations)), 10), (
            "the run neither ends nor waits on the person"
        )
        if task.done():
            break
        for esc_id in list(ex.state.escalations):
            req = person.requests[esc_id]
            key, label, action = person.choose(req) if decisions < 12 else _abort_option(req)
            decisions += 1
            mgr.decide(Ruling(esc_id, key, action, by="human", channel="cli", answer=label))
    state = await task
    return run_record(state).to_json_dict()


def _abort_option(req: EscalationRequest) -> tuple[str, str, str]:
    """Enough decisions: end the run (every escalation offers an abort or a reject)."""
    return next(o for o in req.options if o[2] in ("abort", "reject"))


REPLIES = st.tuples(
    st.sampled_from(["success", "success", "fail", "error", "unrecoverable", "escalate", "blocked"]),
    st.sampled_from(["ok", "ok", "partial", "failed", None]),
    st.sampled_from([None, 0, 1]),
)
RETRY = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {
            "attempts": st.integers(1, 3),
            "backoff": st.just("1ms"),
            "max_backoff": st.just("2ms"),
            "on": st.sampled_from([["error"], ["fail"], ["error", "fail"]]),
        }
    ),
)


@st.composite
def for_each_specs(draw: st.DrawFn) -> ForEachWorkflow:
    items = [f"i{n}" for n in range(draw(st.integers(1, 3)))]
    on_return: dict[str, str] = {}
    for outcome in ("fail", "error"):
        choice = draw(st.sampled_from([None, "→ ESCALATE pilote", "→ next_item", "abort"]))
        if choice:
            on_return[outcome] = choice
    doc: dict[str, Any] = {"workflow": "fan", "for_each": {"items": items, "spawn": "agent", "on_return": on_return}}
    retry = draw(RETRY)
    if retry:
        doc["retry"] = retry
    spec = parse_workflow(doc)
    assert isinstance(spec, ForEachWorkflow)
    return spec


@st.composite
def chain_specs(draw: st.DrawFn) -> ChainWorkflow:
    steps = []
    for n in range(1, draw(st.integers(1, 3)) + 1):
        step: dict[str, Any] = {
            "step": n,
            "type": draw(st.sampled_from(["code", "test", "brain-write", "deploy"])),
            "scope": f"work/{n}/",
            "agents": ["agent"],
        }
        gate = draw(st.sampled_from([None, None, "human", "0-failures", "never"]))
        if gate:
            step["gate"] = gate
        for field, choices in (
            ("on_done", [None, 'notify:"done"', "gate:human", "abort", "trigger:next"]),
            ("on_partial", [None, "gate:human", 'notify:"partial"']),
            ("on_fail", [None, "abort", "signal:BLOCKED_ON", 'notify:"failed"', "gate:human"]),
        ):
            value = draw(st.sampled_from(choices))
            if value:
                step[field] = value
        if draw(st.booleans()):
            step_retry = draw(RETRY)
            if step_retry:
                step["retry"] = step_retry
        steps.append(step)
    doc: dict[str, Any] = {
        "name": "chain",
        "mode": draw(st.sampled_from(["assisted", "manual", "swarm"])),
        "swarm_ready": True,
        "chain": steps,
    }
    retry = draw(RETRY)
    if retry:
        doc["retry"] = retry
    spec = parse_workflow(doc)
    assert isinstance(spec, ChainWorkflow)
    return spec


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    spec=st.one_of(for_each_specs(), chain_specs()),
    script=st.lists(REPLIES, max_size=12),
    picks=st.lists(st.integers(0, 5), max_size=12),
)
@pytest.mark.slow
def test_a_workflow_replayed_over_its_own_records_meets_the_same_escalations(
    tmp_path_factory: pytest.TempPathFactory,
    spec: WorkflowSpec,
    script: list[tuple[str, str | None, int | None]],
    picks: list[int],
) -> None:
    """Replaying an unchanged workflow over its own records reproduces them: the same escalations,
    no step routed differently (retries, gates, close tiers, questions and exit triggers included)."""
    root = tmp_path_factory.mktemp("brain")
    record = asyncio.run(_run(spec, root, ScriptedAgent(script), Person(picks)))
    report = replay([record], spec, [], workflow=spec.name, pinned=lambda _run_id: spec)
    assert report.would_escalate == record["escalations"], (record, [f for f in fates(spec, record["steps"])])
    assert report.routed_differently == 0


def test_retries_are_not_escalations() -> None:
    """An error the retry policy retries is no escalation (a replay that ignored retry: predicted one per error)."""
    spec = parse_workflow(
        {"workflow": "w", "retry": {"attempts": 3, "on": ["error"]}, "for_each": {"items": ["a"], "spawn": "x"}}
    )
    steps = [{"item": "a", "result": "error"}, {"item": "a", "result": "error"}, {"item": "a", "result": "success"}]
    assert [f.action for f in fates(spec, steps)[0]] == ["retry", "retry", "next"]


def test_a_chain_steps_validated_close_needs_the_person_without_tests() -> None:
    """A code step that returns no tests asks the person (close tier 2); with green tests it goes on."""
    spec = parse_workflow(
        {
            "name": "c",
            "chain": [
                {"step": 1, "type": "code", "scope": "a/", "agents": ["x"]},
                {"step": 2, "type": "deploy", "scope": "b/", "agents": ["y"], "gate": "human"},
            ],
        }
    )
    no_tests = [
        {"item": "1", "result": "success", "reply": "success", "status": "ok"},
        {"item": "2", "result": "success", "reply": "success"},
    ]
    green = [{"item": "1", "result": "success", "reply": "success", "tests": {"failed": 0}}, no_tests[1]]
    assert [(f.action, f.kind, f.gated) for f in fates(spec, no_tests)[0]] == [
        ("escalate", "gate", False),
        ("next", None, True),
    ]
    assert sum(f.escalations for f in fates(spec, green)[0]) == 1  # only the human gate before step 2


def test_older_records_are_read_from_their_signals() -> None:
    """Records without `reply` are read from signal_in and result."""
    assert reply_of({"result": "fail", "signal_in": "ESCALATE"}) == "escalate"
    assert reply_of({"result": "fail", "signal_in": "BLOCKED_ON"}) == "blocked"
    assert reply_of({"result": "fail", "signal_in": "RETURN"}) == "fail"
    assert reply_of({"result": "success", "reply": "success"}) == "success"


def test_a_changed_workflow_reports_what_it_would_do_differently() -> None:
    """A workflow that now goes on after a failure reports the recorded escalation as routed differently."""
    then = parse_workflow({"workflow": "w", "for_each": {"items": ["a", "b"], "spawn": "x"}})
    now = parse_workflow(
        {"workflow": "w", "for_each": {"items": ["a", "b"], "spawn": "x", "on_return": {"fail": "→ next_item"}}}
    )
    record = {
        "run_id": "r1",
        "workflow": "w",
        "started_at": "2026-03-01T10:00:00+00:00",
        "escalations": 1,
        "steps": [{"item": "a", "result": "success"}, {"item": "b", "result": "fail", "error": "no"}],
    }
    report = replay([record], now, [], workflow="w", pinned=lambda _run_id: then)
    assert (report.recorded_escalations, report.would_escalate, report.routed_differently) == (1, 0, 1)
    [moved] = report.items
    assert (moved.item, moved.recorded, moved.now, moved.change) == ("b", "escalate", "next", "rerouted")


# --- hand-written records -----------------------------------------------------------------------------


class TestReplay:
    """Replay over hand-written records (the property test is above)."""

    def _records(self) -> list[dict[str, Any]]:
        return [
            run(
                "r1",
                steps=[step("i1"), step("i2", result="fail", error="timeout after 30s on 'a.yml'")],
                escalations=1,
            ),
            run(
                "r2",
                started=T0 + timedelta(days=3),
                steps=[step("i1", result="error", error="disk full"), step("i2")],
                escalations=1,
            ),
            run("r3", workflow="other", steps=[step("i1", result="fail")]),
        ]

    def test_default_routing_lists_escalations(self) -> None:
        """Under the ADR-027 defaults every fail/error is escalated again; nothing is rerouted."""
        report = replay(self._records(), None, [], workflow="deploy-batch")
        assert (report.runs, report.steps, report.recorded_escalations) == (2, 4, 2)
        assert (report.would_escalate, report.decided_by_rule, report.routed_differently) == (2, 0, 0)
        assert report.unchanged == 2
        assert {i.item for i in report.items} == {"i2", "i1"}

    def test_opted_in_active_rule_decides(self) -> None:
        """A step whose situation has an active, opted-in rule would be decided by it; a shadow rule only suggests."""
        sit = situation_from_step("deploy-batch", self._records()[0]["steps"][1])
        rules: list[Any] = []
        for i in range(4):
            rules = observe(rules, sit, "retry", f"h{i}", T0)
        shadow = observe([], situation_from_step("deploy-batch", self._records()[1]["steps"][0]), "skip", "h", T0)
        report = replay(self._records(), None, [*rules, *shadow], workflow="deploy-batch", policy=OPTED)
        assert (report.would_escalate, report.decided_by_rule) == (1, 1)
        by_change = {i.change: i for i in report.items}
        assert by_change["rule"].rule_id == rules[0].id and by_change["rule"].option == "retry"
        assert by_change["escalate"].rule_id == shadow[0].id and by_change["escalate"].option == "skip"

    def test_since_and_invalid_records(self) -> None:
        """--since drops older runs; broken records are counted, not fatal."""
        recs = [*self._records(), {"kind": "run", "workflow": "deploy-batch", "started_at": 5}]
        report = replay(recs, None, [], workflow="deploy-batch", since=T0 + timedelta(days=1))
        assert (report.runs, report.invalid) == (1, 1)
        assert report.to_json()["items"][0]["run_id"] == "r2"
