"""Exit-trigger actions: every spelling of the sources, the errors, the canonical text that parses back."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambient.core.errors import ActionError
from ambient.workflows.exit_actions import (
    AbortAction,
    EscalateAction,
    GateAction,
    GotoAction,
    LogAction,
    NextAction,
    NotifyAction,
    SignalAction,
    SpawnAction,
    format_action,
    format_actions,
    parse_action,
    parse_actions,
)
from ambient.workflows.spec import ChainStep
from tests.unit.workflows.documents import load_text, step_doc

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
    step = ChainStep.model_validate(step_doc(1, on_done="→ ERROR + log", on_fail="signal → BLOCKED_ON pilote"))
    dumped = step.model_dump()
    assert dumped["on_done"] == "signal:ERROR + log" and dumped["on_fail"] == "signal:BLOCKED_ON pilote"
    assert str(step.on_fail[0]) == "signal:BLOCKED_ON pilote"  # type: ignore[index]


def test_bad_exit_trigger_in_a_file_has_its_line() -> None:
    """A bad exit trigger in a file is reported at its own line."""
    wf, problems = load_text("name: c\nchain:\n  - step: 1\n    type: code\n    scope: x/\n    on_done: jump:2\n")
    assert wf is None and len(problems) == 1
    assert problems[0].line == 6 and "jump" in problems[0].message and "expected" in problems[0].message


_WORDS = st.sampled_from(
    ["trigger", "signal", "gate", "notify", "abort", "log", "next_item", "ESCALATE", "ERROR", "human", "pilote",
     "type", "scope", "test", "next", "3", "wf/2", "CHECKPOINT", "x/"]
)  # fmt: skip
_SEPS = st.sampled_from([":", " ", " → ", "->", " + ", '"', "'", "", "  ", "→", "/", "\\", "\x00", "é"])


@pytest.mark.slow
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


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.lists(ACTIONS, min_size=1, max_size=4))
def test_format_then_parse_is_identity(actions: list[Any]) -> None:
    """Property: the canonical text of any actions parses back to the same actions."""
    assert parse_actions(format_actions(actions)) == tuple(actions)
    for action in actions:
        assert parse_action(format_action(action)) == action
