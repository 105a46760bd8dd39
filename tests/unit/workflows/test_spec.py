"""Workflow specs: both forms, the corpus files, exit-trigger actions in every spelling, checks beyond the schema."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambient.core.errors import InputError
from ambient.storage.paths import BrainPaths
from ambient.storage.yamlfile import parse_yaml
from ambient.workflows.loading import LoadedWorkflow, check_workflow, load_workflow, load_workflow_bytes, load_workflows
from ambient.workflows.spec import (
    DEFAULT_AGENT_BY_TYPE,
    AbortAction,
    ActionError,
    ChainStep,
    ChainWorkflow,
    EscalateAction,
    ForEachWorkflow,
    GateAction,
    GotoAction,
    ItemScope,
    LogAction,
    NextAction,
    NotifyAction,
    RetryPolicy,
    Schedule,
    SignalAction,
    SpawnAction,
    WorkflowError,
    detect_form,
    format_action,
    format_actions,
    item_context,
    item_scope,
    item_values,
    parse_action,
    parse_actions,
    parse_duration,
    parse_workflow,
    spec_hash,
    spec_issues,
    step_values,
)
from ambient.workflows.templating import COMPLETE_VARS, ITEM_VARS, STEP_VARS, completion_values, render

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "brain" / "workflows"


def _for_each(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "workflow": "wf",
        "for_each": {"items": ["a", "b"], "spawn": "deploy", "scope": {"files": ["infrastructure/{{item}}.yml"]}},
    }
    data.update(over)
    return data


def _chain(*steps: dict[str, Any], **over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"name": "ch", "chain": list(steps)}
    data.update(over)
    return data


def _step(n: int | str, **over: Any) -> dict[str, Any]:
    step: dict[str, Any] = {"step": n, "type": "code", "scope": "projets/x/", "agents": ["coder"]}
    step.update(over)
    return step


def _yaml(text: str, name: str = "t.yml") -> tuple[LoadedWorkflow | None, list[Any]]:
    return load_workflow_bytes(text.encode(), source=name)


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
    assert parse_workflow(_for_each()).name == "wf"
    assert parse_workflow({**_for_each(), "name": "wf"}).name == "wf"
    with pytest.raises(WorkflowError, match="disagree"):
        parse_workflow({**_for_each(), "name": "other"})
    with pytest.raises(WorkflowError, match="workflow name"):
        parse_workflow(_for_each(workflow="a/b"))


def test_name_defaults_to_the_file_name(tmp_path: Path) -> None:
    """A file without name: or workflow: is named after itself."""
    path = tmp_path / "nightly.yml"
    path.write_text("for_each:\n  items: [a]\n  spawn: deploy\n  scope:\n    files: ['x/{{item}}']\n")
    wf, problems = load_workflow(path)
    assert problems == [] and wf is not None and wf.name == "nightly"


def test_theme_branch_alias_and_bad_branch() -> None:
    """theme_branch: is accepted for branch:; a branch git would read as an option is refused."""
    assert parse_workflow(_for_each(theme_branch="theme/x")).branch == "theme/x"
    for bad in ("-x", "a b", "a..b", "a~1"):
        with pytest.raises(WorkflowError, match="branch"):
            parse_workflow(_for_each(branch=bad))


def test_defaults_of_common_keys() -> None:
    """Defaults: active, assisted, supervisor human, sender ambient, no concurrency of its own (the daemon-wide cap
    applies), no retry/timeout stated."""
    spec = parse_workflow(_for_each())
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
        parse_workflow(_for_each(**over))
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
    assert parse_workflow(_for_each(schedule={"every": "15m"})).schedule == Schedule(every=900)


def test_items() -> None:
    """Items are names: numbers become text; booleans, nulls and duplicates are refused."""
    spec = parse_workflow(_for_each(for_each={**_for_each()["for_each"], "items": [1, 2.5, "c"]}))
    assert isinstance(spec, ForEachWorkflow) and spec.for_each.items == ["1", "2.5", "c"]
    for bad in ([True], [None], [], [{"a": 1}]):
        with pytest.raises(WorkflowError, match="items"):
            parse_workflow(_for_each(for_each={**_for_each()["for_each"], "items": bad}))
    dup = parse_workflow(_for_each(for_each={**_for_each()["for_each"], "items": ["a", "a"]}))
    assert [i.message for i in spec_issues(dup)] == ["item 'a' is listed twice (first as item 1)"]


def test_step_ids() -> None:
    """Steps are numbers or names; '3' is the number 3; 'next' and negatives are refused."""
    spec = parse_workflow(_chain(_step("3"), _step("deploy")))
    assert isinstance(spec, ChainWorkflow) and [s.step for s in spec.chain] == [3, "deploy"]
    assert spec.index_of("3") == 0 and spec.index_of("deploy") == 1 and spec.next_index(1) is None
    for bad in ("next", -1, "a b", True):
        with pytest.raises(WorkflowError, match="step"):
            parse_workflow(_chain(_step(bad)))


def test_chain_step_fields() -> None:
    """Step fields: one agent as a string is a list, gate null is absent, bad type/gate are refused."""
    spec = parse_workflow(_chain(_step(1, agents="coder", gate=None, story_angle=None)))
    assert isinstance(spec, ChainWorkflow)
    step = spec.chain[0]
    assert step.agents == ["coder"] and step.gate is None and step.story_angle == ""
    for over in ({"type": "build"}, {"gate": "1-failure"}, {"scope": "../x"}, {"scope": "/etc"}, {"agents": ["a/b"]}):
        with pytest.raises(WorkflowError):
            parse_workflow(_chain(_step(1, **over)))


def test_exit_action_defaults() -> None:
    """ok → on_done (default trigger:next); partial → on_partial, else on_done (the executor's one rule, in the
    planner); failed → on_fail, else signal BLOCKED_ON to the pilot."""
    from ambient.engine.compile import chain_steps
    from ambient.engine.planner import ChainAction, exit_actions

    bare = chain_steps(parse_workflow(_chain(_step(1))))[0]  # type: ignore[arg-type]
    assert exit_actions(bare, "ok") == (ChainAction("next"),)
    assert exit_actions(bare, "partial") == (ChainAction("next"),)
    assert exit_actions(bare, "failed") == (ChainAction("signal", target="pilote", signal="BLOCKED_ON"),)
    done = chain_steps(parse_workflow(_chain(_step(1, on_done="notify:ok"))))[0]  # type: ignore[arg-type]
    assert exit_actions(done, "partial") == (ChainAction("notify", message="ok"),)


def test_default_agents_of_a_workflow() -> None:
    """default_agents: maps a satellite type to the agent that runs steps with no agents:."""
    spec = parse_workflow(_chain(_step(1, agents=[]), default_agents={"code": "satellite-boot"}))
    assert isinstance(spec, ChainWorkflow) and spec.agent_for(spec.chain[0]) == "satellite-boot"
    spawn = SpawnAction(satellite_type="test")
    assert spec.agent_for_spawn(spawn) == "tester" and spec.agent_for_spawn(spawn, {"test": "qa"}) == "qa"


def test_spec_hash() -> None:
    """spec_hash is the sha256 of the bytes."""
    assert spec_hash(b"x") == hashlib.sha256(b"x").hexdigest()


# --- exit-trigger actions ------------------------------------------------------------------------------

ACTION_TABLE: list[tuple[str, tuple[Any, ...]]] = [
    # kernel-orchestrator (spec/004)
    ("trigger:next", (NextAction(),)),
    ("trigger:3", (GotoAction(step=3),)),
    ("trigger:deploy", (GotoAction(step="deploy"),)),
    ("trigger:brain-engine/2", (GotoAction(step=2, workflow="brain-engine"),)),
    ("trigger:brain-engine/deploy", (GotoAction(step="deploy", workflow="brain-engine"),)),
    ("signal:BLOCKED_ON", (SignalAction(signal="BLOCKED_ON"),)),
    ("signal:CHECKPOINT", (SignalAction(signal="CHECKPOINT"),)),
    ("signal:blocked_on pilote", (SignalAction(signal="BLOCKED_ON", to="pilote"),)),
    ('gate:human → "step N partiel — continuer ?"', (GateAction(message="step N partiel — continuer ?"),)),
    ('gate:human -> "tests verts — deploy ?"', (GateAction(message="tests verts — deploy ?"),)),
    ("gate:human", (GateAction(),)),
    ("gate:human → 'single quotes'", (GateAction(message="single quotes"),)),
    ("notify:deploy done", (NotifyAction(message="deploy done"),)),
    ('notify:"quoted + kept"', (NotifyAction(message="quoted + kept"),)),
    ("notify:l'étape 2 est finie", (NotifyAction(message="l'étape 2 est finie"),)),
    ("abort", (AbortAction(),)),
    ('abort → "no deploy on friday"', (AbortAction(message="no deploy on friday"),)),
    # claim schema v1.7 (spec/002)
    ("trigger → type:test scope:brain-engine/", (SpawnAction(satellite_type="test", scope="brain-engine/"),)),
    ("trigger -> type:code", (SpawnAction(satellite_type="code"),)),
    (
        'trigger → type:deploy scope:"infrastructure/vps/" agent:vps story_angle:"ship it"',
        (SpawnAction(satellite_type="deploy", scope="infrastructure/vps/", agent="vps", story_angle="ship it"),),
    ),
    ("signal → CHECKPOINT pilote", (SignalAction(signal="CHECKPOINT", to="pilote"),)),
    ("signal → BLOCKED_ON pilote", (SignalAction(signal="BLOCKED_ON", to="pilote"),)),
    ("signal -> BLOCKED_ON pilote", (SignalAction(signal="BLOCKED_ON", to="pilote"),)),
    ('signal → BLOCKED_ON pilote "lock busy"', (SignalAction(signal="BLOCKED_ON", to="pilote", message="lock busy"),)),
    ("notify → tests green", (NotifyAction(message="tests green"),)),
    # ADR-027 on_return
    ("→ next_item", (NextAction(),)),
    ("-> next_item", (NextAction(),)),
    ("next_item", (NextAction(),)),
    ("→ ESCALATE pilote", (EscalateAction(to="pilote"),)),
    ("signal:ESCALATE", (EscalateAction(),)),
    ("→ ERROR + log + ESCALATE pilote", (SignalAction(signal="ERROR"), LogAction(), EscalateAction(to="pilote"))),
    ("-> ERROR", (SignalAction(signal="ERROR"),)),
    ("  trigger  :  next  ", (NextAction(),)),
    ("TRIGGER:NEXT", (NextAction(),)),
    ("BLOCKED_ON pilote", (SignalAction(signal="BLOCKED_ON", to="pilote"),)),
    ("notify:C++ build ok", (NotifyAction(message="C++ build ok"),)),
    ("signal:CHECKPOINT pilote + trigger:next", (SignalAction(signal="CHECKPOINT", to="pilote"), NextAction())),
    ('gate:human → "a + b ?" + trigger:4', (GateAction(message="a + b ?"), GotoAction(step=4))),
    ("log → 'kept in the journal'", (LogAction(message="kept in the journal"),)),
]


@pytest.mark.parametrize(("text", "expected"), ACTION_TABLE, ids=[t for t, _ in ACTION_TABLE])
def test_every_spelling_of_the_sources(text: str, expected: tuple[Any, ...]) -> None:
    """Each spelling of spec/004, spec/002 and ADR-027 parses to structured actions, and round trips."""
    actions = parse_actions(text)
    assert actions == expected
    assert parse_actions(format_actions(actions)) == actions


BAD_ACTIONS = [
    "",
    "   ",
    "jump:2",
    "trigger",
    "trigger:",
    "trigger:a b",
    "trigger:../x/2",
    "trigger → type:build",
    "trigger → scope:x/",
    "trigger → type:test colour:red",
    "trigger → type:test scope:../x",
    "gate:0-failures",
    "gate:never",
    'gate:human → "unclosed',
    'notify:"a" b',
    "notify:",
    "signal:",
    "signal:123",
    "ERROR:pilote",
    "abort pilote",
    "next_item now",
    "trigger:next\nabort",
    "x" * 3000,
]


@pytest.mark.parametrize("text", BAD_ACTIONS, ids=repr)
def test_bad_actions_say_what_is_expected(text: str) -> None:
    """A bad action is an ActionError naming the text and the accepted forms."""
    with pytest.raises(ActionError) as info:
        parse_actions(text)
    message = str(info.value)
    assert "expected" in message or "at most" in message


def test_parse_action_single_and_lists() -> None:
    """parse_action wants one action; parse_actions also takes a YAML list of action strings."""
    assert parse_action("abort") == AbortAction()
    with pytest.raises(ActionError, match="single action"):
        parse_action("ERROR + log")
    assert parse_actions(["signal:ERROR", "log", "ESCALATE pilote"]) == parse_actions("→ ERROR + log + ESCALATE pilote")
    for bad in ([], [1], 3, None):
        with pytest.raises(ActionError):
            parse_actions(bad)


def test_actions_in_a_step_serialise_to_text() -> None:
    """Exit triggers dump as their canonical text (the step claim carries them as text)."""
    step = ChainStep.model_validate(_step(1, on_done="→ ERROR + log", on_fail="signal → BLOCKED_ON pilote"))
    dumped = step.model_dump()
    assert dumped["on_done"] == "signal:ERROR + log" and dumped["on_fail"] == "signal:BLOCKED_ON pilote"
    assert str(step.on_fail[0]) == "signal:BLOCKED_ON pilote"  # type: ignore[index]


def test_bad_exit_trigger_in_a_file_has_its_line() -> None:
    """A bad exit trigger in a file is reported at its own line."""
    wf, problems = _yaml("name: c\nchain:\n  - step: 1\n    type: code\n    scope: x/\n    on_done: jump:2\n")
    assert wf is None and len(problems) == 1
    assert problems[0].line == 6 and "jump" in problems[0].message and "expected" in problems[0].message


_WORDS = st.sampled_from(
    ["trigger", "signal", "gate", "notify", "abort", "log", "next_item", "ESCALATE", "ERROR", "human", "pilote",
     "type", "scope", "test", "next", "3", "wf/2", "CHECKPOINT", "x/"]
)  # fmt: skip
_SEPS = st.sampled_from([":", " ", " → ", "->", " + ", '"', "'", "", "  ", "→", "/", "\\", "\x00", "é"])


@settings(max_examples=600, deadline=None)
@given(st.one_of(st.text(max_size=80), st.lists(st.one_of(_WORDS, _SEPS), max_size=12).map("".join)))
def test_parse_actions_only_raises_action_error(text: str) -> None:
    """Fuzz: any text parses or raises ActionError (never another exception); what parses round trips."""
    try:
        actions = parse_actions(text)
    except ActionError:
        return
    assert actions
    assert parse_actions(format_actions(actions)) == actions


_MESSAGES = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40).filter(
    lambda s: s.strip() != ""
)
_NAMES = st.from_regex(r"[a-z][a-z0-9_-]{0,10}", fullmatch=True)
_STEP_NAMES = _NAMES.filter(lambda s: s not in ("next", "next_item", "next-item"))
ACTIONS = st.one_of(
    st.just(NextAction()),
    st.builds(GotoAction, step=st.one_of(st.integers(0, 999), _STEP_NAMES),
              workflow=st.one_of(st.none(), _NAMES)),
    st.builds(SpawnAction, satellite_type=st.sampled_from(["code", "test", "deploy"]),
              scope=st.one_of(st.none(), st.sampled_from(["x/", "a b/", "projets/{{workflow}}/"])),
              agent=st.one_of(st.none(), _NAMES), story_angle=st.one_of(st.none(), _MESSAGES)),
    st.builds(SignalAction, signal=st.sampled_from(["ERROR", "BLOCKED_ON", "CHECKPOINT", "DONE"]),
              to=st.one_of(st.none(), _NAMES), message=st.one_of(st.none(), _MESSAGES)),
    st.builds(EscalateAction, to=st.one_of(st.none(), _NAMES), message=st.one_of(st.none(), _MESSAGES)),
    st.builds(GateAction, message=st.one_of(st.none(), _MESSAGES)),
    st.builds(NotifyAction, message=_MESSAGES),
    st.builds(AbortAction, message=st.one_of(st.none(), _MESSAGES)),
    st.builds(LogAction, message=st.one_of(st.none(), _MESSAGES)),
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(ACTIONS, min_size=1, max_size=4))
def test_format_then_parse_is_identity(actions: list[Any]) -> None:
    """Property: the canonical text of any actions parses back to the same actions."""
    assert parse_actions(format_actions(actions)) == tuple(actions)
    for action in actions:
        assert parse_action(format_action(action)) == action


# --- checks beyond the schema -------------------------------------------------------------------------


def _issues(data: dict[str, Any]) -> list[tuple[str, str]]:
    from ambient.engine.compile import workflow_issues

    return [(i.severity, i.message) for i in workflow_issues(parse_workflow(data))]


def test_chain_structure_checks() -> None:
    """Duplicate steps, missing trigger targets and loops are errors, with the loop spelled out."""
    assert "declared twice" in _issues(_chain(_step(1), _step(1)))[0][1]
    assert "names no step" in _issues(_chain(_step(1, on_done="trigger:9")))[0][1]
    loop = _issues(_chain(_step(1), _step(2), _step(3, on_done="trigger:1")))
    assert loop == [("error", "on_done makes a loop (1 → 2 → 3 → 1); loops are not supported, use retry:")]
    self_loop = _issues(_chain(_step(1, on_fail="trigger:1")))
    assert self_loop[0][0] == "error" and "loop (1 → 1)" in self_loop[0][1]
    # A forward jump is fine, and the skipped step is unreachable (a warning)...
    assert _issues(_chain(_step(1, on_done="trigger:3", on_fail="abort"), _step(2), _step(3))) == [
        ("warning", "step 2 is never reached from the first step")
    ]
    # ... unless a failure of step 1 leads there: the person may skip it (the executor's rule).
    assert _issues(_chain(_step(1, on_done="trigger:3"), _step(2), _step(3))) == []
    # A partial result's default human gate continues to the next step: no loop, everything reachable.
    assert _issues(_chain(_step(1), _step(2, gate="human"))) == []
    # notify: decides nothing: the chain goes on (as the executor does), so the next step is reached (issue 23.10).
    assert _issues(_chain(_step(1), _step(2, on_done='notify:"deployed"'), _step(3))) == []
    # A failed step the person skips goes on too; abort and gate: never end the chain.
    assert _issues(_chain(_step(1, on_done="abort", on_partial="abort", on_fail="abort"), _step(2))) == [
        ("warning", "step 2 is never reached from the first step")
    ]


def test_chain_warnings() -> None:
    """Likely mistakes are warnings: 0-failures on a non-test step, gate never that goes on, swarm not ready."""
    assert ("warning", "gate 0-failures reads test results; step 1 is type code") in _issues(
        _chain(_step(1, gate="0-failures"))
    )
    never = _issues(_chain(_step(1, gate="never", on_done="trigger:next"), _step(2)))
    assert ("warning", "step 1 has gate: never (terminal) but on_done goes on") in never
    assert ("warning", "mode: swarm on a workflow not marked swarm_ready: true") in _issues(
        _chain(_step(1), mode="swarm")
    )
    contracts = _issues(_chain(_step(1), _step(2), swarm_ready=True))
    assert contracts == [("error", "step 2 has no input_contract; contracts are required before swarm_ready: true")]


def test_unknown_keys_are_kept_and_typos_flagged() -> None:
    """Unknown keys survive (extra=allow); close misspellings and misplaced keys are warnings."""
    spec = parse_workflow(_for_each(note="free text", spwan="x", on_timeout="approve"))
    assert spec.model_extra == {"note": "free text", "spwan": "x", "on_timeout": "approve"}
    messages = [i.message for i in spec_issues(spec)]
    assert messages == [
        "unknown key 'spwan' is kept but not used; did you mean 'for_each.spawn'?",
        "unknown key 'on_timeout' is kept but not used; did you mean 'on_escalate.on_timeout'?",
    ]
    # In a step (and a for_each block) every key changes how the work runs: an unknown key is an error.
    step_typo = _issues(_chain(_step(1, gaet="human")))
    assert len(step_typo) == 1 and step_typo[0][0] == "error", step_typo
    assert step_typo[0][1].startswith("unknown key 'gaet' in step 1: did you mean 'gate'? every key of step 1")
    fe = _for_each()
    concurency = _issues({**fe, "for_each": {**fe["for_each"], "concurency": 2}})
    assert concurency[0][0] == "error" and "did you mean 'concurrency'?" in concurency[0][1]


def test_for_each_checks() -> None:
    """for_each: local triggers and satellites in on_return are errors; an elided item list is a warning."""
    goto = _for_each(for_each={**_for_each()["for_each"], "on_return": {"fail": "trigger:2"}})
    assert "has no steps" in _issues(goto)[0][1]
    spawn = _for_each(for_each={**_for_each()["for_each"], "on_return": {"fail": "trigger → type:test"}})
    assert "chain step action" in _issues(spawn)[0][1]
    elided = _for_each(for_each={**_for_each()["for_each"], "items": ["instance-01", "...", "instance-10"]})
    assert ("warning", "item '...' looks like an elision; list every item") in _issues(elided)


def test_zone_must_match_the_files() -> None:
    """A declared scope.zone that the rendered files do not have is an error."""
    fe = {**_for_each()["for_each"], "scope": {"zone": "kernel", "files": ["infrastructure/{{item}}.yml"]}}
    issues = _issues(_for_each(for_each=fe))
    assert issues and "scope.zone is 'kernel'" in issues[0][1]


def test_template_variables_are_checked_per_place() -> None:
    """Each place has its own variables: {{item}} in a chain step or {{step}} in a scope file is an error."""
    assert "unknown template variable {{item}}" in _issues(_chain(_step(1, story_angle="do {{item}}")))[0][1]
    fe = {**_for_each()["for_each"], "scope": {"files": ["x/{{step}}.yml"]}}
    assert "unknown template variable {{step}}" in _issues(_for_each(for_each=fe))[0][1]
    done = _for_each(on_complete={"payload": {"result": "{{item}}"}})
    assert "unknown template variable {{item}} in on_complete" in _issues(done)[0][1]
    fine = _chain(_step(1, scope="projets/{{workflow}}/", story_angle="after {{prior.result.status}}"))
    assert _issues(fine) == []


def test_item_paths_are_checked_at_load() -> None:
    """S-01 at load: an item that would leave its folder is reported at that item's line."""
    text = (
        "workflow: w\nfor_each:\n  items:\n    - ok\n    - ../../etc/passwd\n"
        "  spawn: d\n  scope:\n    files: ['x/{{item}}']\n"
    )
    wf, problems = _yaml(text)
    assert wf is None and [(p.line, "may not contain '/'" in p.message) for p in problems] == [(5, True)]


def test_many_bad_items_are_summarised() -> None:
    """A hundred bad items give five reports and a count, not a hundred lines."""
    fe = {**_for_each()["for_each"], "items": [f"../{i}" for i in range(100)]}
    issues = spec_issues(parse_workflow(_for_each(for_each=fe)))
    assert len(issues) == 6 and issues[-1].message == "and 95 more bad item paths"


# --- check_workflow callbacks -----------------------------------------------------------------------


def test_check_workflow_agents_and_matrix() -> None:
    """Agents must exist; may_spawn gets (sender, agent, zone, files) and its reason becomes the problem."""
    wf, _ = load_workflow(EXAMPLES / "deploy-batch.yml")
    assert wf is not None
    calls: list[tuple[str, str, str, list[str]]] = []

    def may_spawn(sender: str, agent: str, zone: str, files: Any) -> str | None:
        calls.append((sender, agent, zone, list(files)))
        return "deploy may not work in zone project"

    assert check_workflow(wf, lambda name: True) == []
    problems = check_workflow(wf, lambda name: name != "deploy", may_spawn)
    assert [str(p) for p in problems] == [
        f"{wf.source}:9: spawn: agent 'deploy' does not exist in agents/",
    ]
    problems = check_workflow(wf, lambda name: True, may_spawn)
    assert calls == [("ambient", "deploy", "project", ["infrastructure/vps/configs/instance-01.yml"])]
    assert [p.message for p in problems] == [
        "'ambient' may not SPAWN 'deploy' in zone project: deploy may not work in zone project"
    ]


def test_check_workflow_chain_calls() -> None:
    """For a chain, every step's agent is checked with the zone of its scope; drafts only warn."""
    wf, _ = load_workflow(EXAMPLES / "feature-chain.yml")
    assert wf is not None
    seen: list[tuple[str, str, list[str]]] = []

    def may_spawn(sender: str, agent: str, zone: str, files: Any) -> str | None:
        seen.append((agent, zone, list(files)))
        return None

    assert check_workflow(wf, {"coder", "tester", "scribe", "vps"}.__contains__, may_spawn) == []
    assert seen == [
        ("coder", "project", ["projets/feature/"]),
        ("tester", "project", ["projets/feature/"]),
        ("scribe", "project", ["projets/feature/README.md"]),
        ("vps", "project", ["infrastructure/vps/"]),
    ]
    draft, _ = _yaml("name: d\nstatus: draft\nchain:\n  - step: 1\n    type: code\n    scope: x/\n")
    assert draft is not None
    problems = check_workflow(draft, lambda name: False)
    assert [p.severity for p in problems] == ["warning"] and "default agent for type code, 'coder'" in problems[
        0
    ].message


def test_cross_workflow_triggers(tmp_path: Path) -> None:
    """trigger:<workflow>/<step> must name a loaded chain workflow and one of its steps."""
    wdir = tmp_path / "workflows"
    wdir.mkdir()
    (wdir / "a.yml").write_text("name: a\nchain:\n  - {step: 1, type: code, scope: x/, on_done: 'trigger:b/2'}\n")
    (wdir / "b.yml").write_text("name: b\nchain:\n  - {step: 1, type: code, scope: x/}\n")
    (wdir / "c.yml").write_text("name: c\nchain:\n  - {step: 1, type: code, scope: x/, on_done: 'trigger:zz/1'}\n")
    (wdir / "d.yml").write_text("name: d\nchain:\n  - {step: 1, type: code, scope: x/, on_done: 'trigger:b/1'}\n")
    workflows, problems = load_workflows(BrainPaths(tmp_path))
    assert sorted(workflows) == ["b", "d"]
    assert sorted(str(p) for p in problems) == [
        "workflows/a.yml:3: trigger:b/2: workflow 'b' has no step 2",
        "workflows/c.yml:3: trigger:zz/1: no workflow is named 'zz'",
    ]


def test_load_workflows_isolates_bad_files(tmp_path: Path) -> None:
    """One bad file is reported and left out; duplicates keep the first file; _ files and dotfiles are skipped."""
    wdir = tmp_path / "workflows"
    wdir.mkdir()
    good = "for_each:\n  items: [a]\n  spawn: deploy\n  scope:\n    files: ['x/{{item}}']\n"
    (wdir / "a-good.yml").write_text("workflow: one\n" + good)
    (wdir / "b-dup.yaml").write_text("workflow: one\n" + good)
    (wdir / "c-bad.yml").write_text("workflow: two\nfor_each: [")
    (wdir / "_template.yml").write_text("not: [valid")
    (wdir / ".hidden.yml").write_text("not: [valid")
    (wdir / "notes.txt").write_text("ignored")
    (wdir / "link.yml").symlink_to(wdir / "a-good.yml")
    workflows, problems = load_workflows(BrainPaths(tmp_path))
    assert list(workflows) == ["one"] and workflows["one"].source == "workflows/a-good.yml"
    lines = sorted(str(p) for p in problems)
    assert len(lines) == 3
    assert lines[0].startswith("workflows/b-dup.yaml:1: workflow name 'one' is already used by workflows/a-good.yml")
    assert lines[1].startswith("workflows/c-bad.yml:2: ")
    assert lines[2].startswith("workflows/link.yml: is a symlink")


def test_missing_workflows_dir(tmp_path: Path) -> None:
    """A brain without workflows/ has no workflows and no problems."""
    assert load_workflows(BrainPaths(tmp_path)) == ({}, [])


# --- helpers for the engine ------------------------------------------------------------------------


def test_item_scope_and_context() -> None:
    """item_scope renders the SPAWN scope of one item; item_context its payload.context."""
    wf, _ = load_workflow(EXAMPLES / "deploy-batch.yml")
    assert wf is not None and isinstance(wf.spec, ForEachWorkflow)
    assert item_scope(wf.spec, 2) == ItemScope("project", ("infrastructure/vps/configs/instance-03.yml",))
    assert item_context(wf.spec, 2) == {"instance": "instance-03", "position": "3/10"}
    hostile = parse_workflow(_for_each(for_each={**_for_each()["for_each"], "scope": {"files": ["x/{{run_id}}"]}}))
    assert isinstance(hostile, ForEachWorkflow)
    with pytest.raises(InputError):
        item_scope(hostile, 0, run_id="../../etc")


def test_step_and_completion_values() -> None:
    """step_values and completion_values give exactly the variables validation allows."""
    wf, _ = load_workflow(EXAMPLES / "feature-chain.yml")
    assert wf is not None and isinstance(wf.spec, ChainWorkflow)
    values = step_values(wf.spec, wf.spec.chain[1], "r1", {"result": {"status": "ok"}})
    assert set(values) == STEP_VARS
    assert render("{{workflow}} {{step}} {{prior.result.status}}", values) == "feature-chain 2 ok"
    done = completion_values(total=10, success=9, failed=1, errors=0, skipped=0, workflow="w", run_id="r")
    assert set(done) == COMPLETE_VARS
    fan = parse_workflow(_for_each())
    assert isinstance(fan, ForEachWorkflow)
    assert set(item_values(fan, 0)) == ITEM_VARS  # the values rendering uses are the names validation allows
    assert render("{{success_count}}/{{total}}, {{fail_count}} failed", done) == "9/10, 1 failed"


_YAML_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=12), st.sampled_from(
        ["trigger:next", "→ ESCALATE pilote", "{{item}}", "x/{{item}}", "human", "0-failures", "code", "deploy", "1h"]
    )),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(
            ["name", "workflow", "for_each", "chain", "items", "spawn", "scope", "files", "zone", "step", "type",
             "on_done", "on_fail", "gate", "agents", "retry", "on", "timeout", "on_return", "success", "schedule",
             "every", "on_complete", "payload", "result", "status", "mode", "context", "on_escalate"]
        ), inner, max_size=5),
    ),
    max_leaves=20,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(_YAML_VALUES)
def test_loading_never_raises(data: Any) -> None:
    """Fuzz: any YAML document becomes a workflow or problems; the loader never raises."""
    from ambient.storage.yamlfile import dump_yaml

    raw = dump_yaml(data).encode()
    wf, problems = load_workflow_bytes(raw, source="fuzz.yml")
    assert (wf is None) == any(p.severity == "error" for p in problems)
    if wf is not None:
        assert parse_workflow(wf.spec.model_dump(mode="json")) == wf.spec


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_loading_bytes_never_raises(raw: bytes) -> None:
    """Fuzz: arbitrary bytes give problems, never an exception."""
    wf, problems = load_workflow_bytes(raw, source="fuzz.yml")
    assert wf is None and problems


def test_a_reload_parses_only_the_files_that_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every change in workflows/ reloads the folder: unchanged bytes are not parsed again (bench/README item 32),
    a changed file is, and a file that is broken stays reported on every load, lines included."""
    from ambient.workflows import loading as workflowload

    paths = BrainPaths(tmp_path)
    paths.workflows.mkdir(parents=True)
    good = (
        "name: w{k}\nfor_each:\n  items: [a, b]\n  spawn: coder\n"
        '  scope:\n    zone: project\n    files: ["projects/{{{{item}}}}.md"]\n'
    )
    for k in range(3):
        (paths.workflows / f"w{k}.yml").write_text(good.format(k=k))
    (paths.workflows / "bad.yml").write_text("name: bad\nfor_each:\n  items: [a]\n  spawn: coder\n  concurrency: -2\n")
    parsed: list[str] = []
    real = workflowload.parse_yaml

    def counting(text: str, *, source: str) -> Any:
        parsed.append(source)
        return real(text, source=source)

    monkeypatch.setattr(workflowload, "parse_yaml", counting)
    workflowload._PARSED.clear()
    first, first_problems = load_workflows(paths)
    assert sorted(first) == ["w0", "w1", "w2"] and len(parsed) == 4
    again, again_problems = load_workflows(paths)
    assert len(parsed) == 4  # nothing changed, nothing parsed
    assert again == first and again_problems == first_problems
    assert any(p.file == "workflows/bad.yml" and p.line == 5 for p in again_problems)

    (paths.workflows / "w1.yml").write_text(good.format(k=1).replace("[a, b]", "[a, b, c]"))
    changed, _ = load_workflows(paths)
    assert parsed[4:] == ["workflows/w1.yml"]
    assert changed["w1"].spec.for_each.items == ["a", "b", "c"]  # type: ignore[union-attr]
    assert changed["w0"] is first["w0"]  # the same frozen result, shared
    # The problems handed out are copies: a caller extending them does not change what the next load reports.
    again_problems.append(again_problems[0])
    assert load_workflows(paths)[1] == first_problems


def test_a_reload_renders_no_item_again_but_asks_the_matrix_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checking a for_each renders every item's scope; a reload of unchanged bytes renders none (a 1,000-item file
    cost ~10 ms per reload), while the SPAWN it stands for is put to the matrix at every load: a decision that
    changed between loads is seen, and a changed file is rendered again."""
    from ambient.workflows import loading as workflowload
    from ambient.workflows import templating

    paths = BrainPaths(tmp_path)
    paths.workflows.mkdir(parents=True)
    text = (
        "name: big\nfor_each:\n  items: [{items}]\n  spawn: coder\n"
        '  scope:\n    zone: project\n    files: ["projects/{{{{item}}}}.md"]\n'
    )
    (paths.workflows / "big.yml").write_text(text.format(items=", ".join(f"i{n}" for n in range(50))))
    renders: list[str] = []
    real = templating.render_path

    def counting(template: str, values: Any, rules: Any = None) -> Any:
        renders.append(template)
        return real(template, values, rules) if rules is not None else real(template, values)

    monkeypatch.setattr(templating, "render_path", counting)
    workflowload._PARSED.clear()
    workflowload._FOR_EACH_SCOPES.clear()
    asked: list[tuple[str, str]] = []
    verdict: list[str | None] = [None]

    def may_spawn(sender: str, agent: str, zone: str, files: Any) -> str | None:
        asked.append((agent, zone))
        return verdict[0]

    first, problems = load_workflows(paths, may_spawn=may_spawn)
    assert "big" in first and problems == [] and asked == [("coder", "project")]
    rendered = len(renders)
    assert rendered >= 100  # the parse's own check and the SPAWN check, each item once
    verdict[0] = "coder is not allowed in project"
    again, problems = load_workflows(paths, may_spawn=may_spawn)
    assert len(renders) == rendered  # nothing rendered again
    assert asked == [("coder", "project")] * 2 and "big" not in again
    assert [p.message for p in problems] == [
        "'ambient' may not SPAWN 'coder' in zone project: coder is not allowed in project"
    ]
    (paths.workflows / "big.yml").write_text(text.format(items="i0, i1, i2"))
    verdict[0] = None
    changed, _ = load_workflows(paths, may_spawn=may_spawn)
    assert changed["big"].spec.for_each.items == ["i0", "i1", "i2"]  # type: ignore[union-attr]
    assert len(renders) > rendered


def test_the_parse_memo_is_bounded_in_entries_and_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Least recently used results go first, past MAX_ENTRIES or MAX_BYTES; a document over MAX_BYTES is not kept."""
    from ambient.workflows.loading import _Parsed

    memo = _Parsed()
    monkeypatch.setattr(_Parsed, "MAX_ENTRIES", 3)
    monkeypatch.setattr(_Parsed, "MAX_BYTES", 100)
    for k in range(4):
        memo.put((k,), None, [], 10)
    assert memo.get((0,)) is None and memo.get((1,)) is not None  # 0 went first; 1 is now the most recent
    memo.put((9,), None, [], 60)  # 10 + 10 + 10 + 60 = 90: fits; 4 entries > 3: the least recent (2) goes
    assert memo.get((2,)) is None and memo.get((1,)) is not None
    memo.put((10,), None, [], 50)  # over 100 bytes: entries go, least recent first, until it fits
    assert memo.get((3,)) is None and memo.get((9,)) is None and memo.get((10,)) is not None
    memo.put((11,), None, [], 101)
    assert memo.get((11,)) is None
