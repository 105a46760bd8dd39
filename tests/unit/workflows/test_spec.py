"""Workflow specs: both forms, the corpus files and the examples, names, common keys, durations."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from ambient.config.workflows import load_workflow, load_workflows
from ambient.core.errors import WorkflowError
from ambient.storage.paths import BrainPaths
from ambient.storage.yamlfile import parse_yaml
from ambient.workflows.checks import spec_issues
from ambient.workflows.exit_actions import (
    EscalateAction,
    GateAction,
    LogAction,
    NextAction,
    NotifyAction,
    SignalAction,
    SpawnAction,
)
from ambient.workflows.fields import parse_duration
from ambient.workflows.spec import (
    DEFAULT_AGENT_BY_TYPE,
    ChainWorkflow,
    ForEachWorkflow,
    RetryPolicy,
    Schedule,
    detect_form,
    parse_workflow,
    spec_hash,
)
from tests.unit.workflows.documents import EXAMPLES, chain_doc, for_each_doc, step_doc

# --- the corpus and the examples -------------------------------------------------------------------


def test_corpus_workflows_load_and_brain_engine_is_draft(corpus: Path) -> None:
    """Both real workflow files load; brain-engine.yml is a draft (never runs) and keeps its unknown keys."""
    engine, problems = load_workflow(corpus / "workflows" / "brain-engine.yml")
    assert problems == [] and engine is not None
    spec = engine.spec
    assert isinstance(spec, ChainWorkflow)
    assert spec.status == "draft" and not spec.runnable
    assert [s.step for s in spec.chain] == [1, 2, 3, 4]
    assert [s.gate for s in spec.chain] == [None, "0-failures", None, "human"]
    assert spec.branch == "theme/brain-engine" and spec.pilote is None
    assert spec.model_extra == {"note": "À renseigner — définir la feature BE-X cible avant lancement"}
    template, problems = load_workflow(corpus / "workflows" / "_template.yml")
    assert problems == [] and template is not None
    assert isinstance(template.spec, ChainWorkflow)
    assert template.spec.runnable and template.spec.swarm_ready is False
    assert template.spec.chain[0].agents == [] and template.spec.chain[1].agents == ["testing"]


def test_corpus_template_step_without_agents_uses_the_type_default(corpus: Path) -> None:
    """The template's step 1 has agents: [] — the default agent of its type runs it."""
    wf, _ = load_workflow(corpus / "workflows" / "_template.yml")
    assert wf is not None and isinstance(wf.spec, ChainWorkflow)
    spec = wf.spec
    assert spec.agent_for(spec.chain[0]) == DEFAULT_AGENT_BY_TYPE["code"] == "coder"
    assert spec.agent_for(spec.chain[0], {"code": "satellite-boot"}) == "satellite-boot"
    assert spec.agent_for(spec.chain[1]) == "testing"


def test_brain_loader_skips_templates(corpus: Path) -> None:
    """load_workflows loads brain-engine and skips _template.yml (a file to copy, never run)."""
    workflows, problems = load_workflows(BrainPaths(corpus))
    assert list(workflows) == ["brain-engine"] and problems == []
    assert workflows["brain-engine"].source == "workflows/brain-engine.yml"


def test_example_deploy_batch() -> None:
    """The ADR-027 example: 10 items, the ADR's on_return parsed into actions, templated on_complete."""
    wf, problems = load_workflow(EXAMPLES / "deploy-batch.yml")
    assert problems == [] and wf is not None
    spec = wf.spec
    assert isinstance(spec, ForEachWorkflow) and spec.form == "for_each"
    fe = spec.for_each
    assert fe.items == [f"instance-{i:02d}" for i in range(1, 11)]
    assert fe.spawn == "deploy" and fe.concurrency == 4
    assert fe.scope.zone == "project" and fe.scope.files == ["infrastructure/vps/configs/{{item}}.yml"]
    assert fe.on_return.success == (NextAction(),)
    assert fe.on_return.fail == (EscalateAction(to="pilote"),)
    assert fe.on_return.error == (SignalAction(signal="ERROR"), LogAction(), EscalateAction(to="pilote"))
    assert spec.on_complete is not None and spec.on_complete.to == "orchestrator"
    assert spec.on_complete.payload == {"result": "{{success_count}}/{{total}} instances deployed"}
    assert spec.timeout == 300 and spec.retry == RetryPolicy(attempts=2, backoff=1, max_backoff=30)
    assert spec.sender == "ambient" and spec.supervisor == "human" and spec.mode == "assisted"
    assert wf.spec_hash == hashlib.sha256((EXAMPLES / "deploy-batch.yml").read_bytes()).hexdigest()


def test_example_feature_chain() -> None:
    """The chain example: 4 steps, gates 0-failures and human, assisted mode, exit triggers."""
    wf, problems = load_workflow(EXAMPLES / "feature-chain.yml")
    assert problems == [] and wf is not None
    spec = wf.spec
    assert isinstance(spec, ChainWorkflow) and spec.form == "chain"
    assert [s.type for s in spec.chain] == ["code", "test", "brain-write", "deploy"]
    assert [spec.agent_for(s) for s in spec.chain] == ["coder", "tester", "scribe", "vps"]
    assert [s.gate for s in spec.chain] == [None, "0-failures", None, "human"]
    assert spec.mode == "assisted" and spec.status == "active"
    assert spec.chain[1].on_fail == (SignalAction(signal="BLOCKED_ON", to="pilote"),)
    assert spec.chain[2].on_partial == (GateAction(message="docs are partial, deploy anyway?"),)
    assert spec.chain[3].on_done == (NotifyAction(message="feature deployed"),)
    assert spec.retry_for(spec.chain[3]) == RetryPolicy(attempts=2)
    assert spec.on_escalate.timeout == 86400 and spec.on_escalate.remind_before == 3600


@pytest.mark.parametrize("name", ["deploy-batch.yml", "feature-chain.yml"])
def test_spec_round_trips_through_json(name: str) -> None:
    """model_dump(mode='json') validates back to an equal spec (runs store their spec this way)."""
    wf, _ = load_workflow(EXAMPLES / name)
    assert wf is not None
    assert parse_workflow(wf.spec.model_dump(mode="json")) == wf.spec


def test_corpus_round_trips_through_json(corpus: Path) -> None:
    """The corpus workflows also round trip, unknown keys included."""
    for name in ("brain-engine.yml", "_template.yml"):
        wf, _ = load_workflow(corpus / "workflows" / name)
        assert wf is not None
        dumped = wf.spec.model_dump(mode="json")
        assert parse_workflow(dumped) == wf.spec


# --- form detection, names, common keys ----------------------------------------------------------


def test_form_detection() -> None:
    """A for_each: key makes a for_each workflow, a chain: key a chain; both or neither is an error."""
    assert detect_form({"for_each": {}}) == "for_each"
    assert detect_form({"chain": []}) == "chain"
    with pytest.raises(WorkflowError, match="both"):
        detect_form({"for_each": {}, "chain": []})
    with pytest.raises(WorkflowError, match="neither"):
        detect_form({"name": "x"})
    with pytest.raises(WorkflowError, match="misspelling"):
        detect_form({"chian": []})


def test_not_a_mapping() -> None:
    """A document that is not a mapping is refused with what was found."""
    with pytest.raises(WorkflowError, match="got list"):
        parse_workflow([1, 2])
    with pytest.raises(WorkflowError, match="got empty"):
        parse_workflow(None)


def test_name_and_workflow_keys() -> None:
    """ADR-027's workflow: and the template's name: are the same key; two different values are an error."""
    assert parse_workflow(for_each_doc()).name == "wf"
    assert parse_workflow({**for_each_doc(), "name": "wf"}).name == "wf"
    with pytest.raises(WorkflowError, match="disagree"):
        parse_workflow({**for_each_doc(), "name": "other"})
    with pytest.raises(WorkflowError, match="workflow name"):
        parse_workflow(for_each_doc(workflow="a/b"))


def test_name_defaults_to_the_file_name(tmp_path: Path) -> None:
    """A file without name: or workflow: is named after itself."""
    path = tmp_path / "nightly.yml"
    path.write_text("for_each:\n  items: [a]\n  spawn: deploy\n  scope:\n    files: ['x/{{item}}']\n")
    wf, problems = load_workflow(path)
    assert problems == [] and wf is not None and wf.name == "nightly"


def test_theme_branch_alias_and_bad_branch() -> None:
    """theme_branch: is accepted for branch:; a branch git would read as an option is refused."""
    assert parse_workflow(for_each_doc(theme_branch="theme/x")).branch == "theme/x"
    for bad in ("-x", "a b", "a..b", "a~1"):
        with pytest.raises(WorkflowError, match="branch"):
            parse_workflow(for_each_doc(branch=bad))


def test_defaults_of_common_keys() -> None:
    """Defaults: active, assisted, supervisor human, sender ambient, no concurrency of its own (the daemon-wide cap
    applies), no retry/timeout stated."""
    spec = parse_workflow(for_each_doc())
    assert isinstance(spec, ForEachWorkflow)
    assert (spec.status, spec.mode, spec.supervisor, spec.sender) == ("active", "assisted", "human", "ambient")
    assert spec.for_each.concurrency is None and spec.retry is None and spec.timeout is None and spec.schedule is None
    assert spec.on_escalate.wait == "human_decision" and spec.on_escalate.on_timeout == "reject"


@pytest.mark.parametrize(
    ("over", "fragment"),
    [
        ({"status": "paused"}, "status"),
        ({"mode": "auto"}, "mode"),
        ({"supervisor": "a b"}, "principal"),
        ({"timeout": "soon"}, "not a duration"),
        ({"timeout": -1}, "greater than 0"),
        ({"retry": {"attempts": 0}}, "attempts"),
        ({"retry": {"attemps": 3}}, "attemps"),
        ({"retry": {"backoff": "10s", "max_backoff": "1s"}}, "shorter than backoff"),
        ({"retry": {"on": ["crash"]}}, "on"),
        ({"on_escalate": {"remind_before": "1h"}}, "needs a timeout"),
        ({"on_escalate": {"timeout": "1h", "remind_before": "2h"}}, "shorter than timeout"),
        ({"on_escalate": {"on_timeout": "ignore"}}, "on_timeout"),
        ({"on_escalate": {"wait": "forever"}}, "wait"),
        ({"schedule": {"every": "0s"}}, "schedule"),
        ({"on_complete": {"signal": "RETURN", "payload": {"context": {}}}}, "result only"),
    ],
)
def test_bad_common_keys(over: dict[str, Any], fragment: str) -> None:
    """Bad values of common keys are schema errors naming the key."""
    with pytest.raises(WorkflowError) as info:
        parse_workflow(for_each_doc(**over))
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(90, 90.0), (2.5, 2.5), ("90", 90.0), ("90s", 90.0), ("30m", 1800.0), ("1h30m", 5400.0), ("500ms", 0.5),
     ("2d", 172800.0), ("1h 30m", 5400.0)],
)  # fmt: skip
def test_durations(value: object, seconds: float) -> None:
    """Durations are numbers of seconds or unit strings (ms, s, m, h, d), compounds included."""
    assert parse_duration(value) == seconds


def test_retry_policy() -> None:
    """The YAML 1.1 key on: (read as true) is accepted; the delay doubles, is capped and jittered."""
    data, _ = parse_yaml("retry:\n  attempts: 3\n  backoff: 2s\n  max_backoff: 5s\n  on: [error, fail]\n")
    policy = RetryPolicy.model_validate(data["retry"])
    assert policy.on == ("error", "fail") and policy.retries("fail") and policy.attempts == 3
    assert [policy.model_copy(update={"jitter": False}).delay(n, 0.5) for n in (1, 2, 3, 10)] == [2, 4, 5, 5]
    assert policy.delay(2, 0.5) == 2.0 and policy.delay(10_000, 0.999) <= 5


def test_schedule_shorthands() -> None:
    """schedule: 1h, schedule: 'every 1h' and schedule: {every: 1h} are the same."""
    assert Schedule.model_validate("1h") == Schedule.model_validate("every 1h") == Schedule(every=3600)
    assert parse_workflow(for_each_doc(schedule={"every": "15m"})).schedule == Schedule(every=900)


def test_items() -> None:
    """Items are names: numbers become text; booleans, nulls and duplicates are refused."""
    spec = parse_workflow(for_each_doc(for_each={**for_each_doc()["for_each"], "items": [1, 2.5, "c"]}))
    assert isinstance(spec, ForEachWorkflow) and spec.for_each.items == ["1", "2.5", "c"]
    for bad in ([True], [None], [], [{"a": 1}]):
        with pytest.raises(WorkflowError, match="items"):
            parse_workflow(for_each_doc(for_each={**for_each_doc()["for_each"], "items": bad}))
    dup = parse_workflow(for_each_doc(for_each={**for_each_doc()["for_each"], "items": ["a", "a"]}))
    assert [i.message for i in spec_issues(dup)] == ["item 'a' is listed twice (first at position 1)"]


def test_step_ids() -> None:
    """Steps are numbers or names; '3' is the number 3; 'next' and negatives are refused."""
    spec = parse_workflow(chain_doc(step_doc("3"), step_doc("deploy")))
    assert isinstance(spec, ChainWorkflow) and [s.step for s in spec.chain] == [3, "deploy"]
    assert spec.index_of("3") == 0 and spec.index_of("deploy") == 1 and spec.next_index(1) is None
    for bad in ("next", -1, "a b", True):
        with pytest.raises(WorkflowError, match="step"):
            parse_workflow(chain_doc(step_doc(bad)))


def test_chain_step_fields() -> None:
    """Step fields: one agent as a string is a list, gate null is absent, bad type/gate are refused."""
    spec = parse_workflow(chain_doc(step_doc(1, agents="coder", gate=None, story_angle=None)))
    assert isinstance(spec, ChainWorkflow)
    step = spec.chain[0]
    assert step.agents == ["coder"] and step.gate is None and step.story_angle == ""
    for over in ({"type": "build"}, {"gate": "1-failure"}, {"scope": "../x"}, {"scope": "/etc"}, {"agents": ["a/b"]}):
        with pytest.raises(WorkflowError):
            parse_workflow(chain_doc(step_doc(1, **over)))


def test_exit_action_defaults() -> None:
    """ok → on_done (default trigger:next); partial → on_partial, else on_done (the executor's one rule, in the
    planner); failed → on_fail, else signal BLOCKED_ON to the pilot."""
    from ambient.engine.compile import chain_steps
    from ambient.engine.planner import ChainAction, exit_actions

    bare = chain_steps(parse_workflow(chain_doc(step_doc(1))))[0]  # type: ignore[arg-type]
    assert exit_actions(bare, "ok") == (ChainAction("next"),)
    assert exit_actions(bare, "partial") == (ChainAction("next"),)
    assert exit_actions(bare, "failed") == (ChainAction("signal", target="pilote", signal="BLOCKED_ON"),)
    done = chain_steps(parse_workflow(chain_doc(step_doc(1, on_done="notify:ok"))))[0]  # type: ignore[arg-type]
    assert exit_actions(done, "partial") == (ChainAction("notify", message="ok"),)


def test_default_agents_of_a_workflow() -> None:
    """default_agents: maps a satellite type to the agent that runs steps with no agents:."""
    spec = parse_workflow(chain_doc(step_doc(1, agents=[]), default_agents={"code": "satellite-boot"}))
    assert isinstance(spec, ChainWorkflow) and spec.agent_for(spec.chain[0]) == "satellite-boot"
    spawn = SpawnAction(satellite_type="test")
    assert spec.agent_for_spawn(spawn) == "tester" and spec.agent_for_spawn(spawn, {"test": "qa"}) == "qa"


def test_spec_hash() -> None:
    """spec_hash is the sha256 of the bytes."""
    assert spec_hash(b"x") == hashlib.sha256(b"x").hexdigest()
