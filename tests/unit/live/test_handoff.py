"""The handoff: five stable rubrics from a thread's turns, never more than 4096 characters of clean text."""

from __future__ import annotations

from datetime import UTC

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ambient.live.handoff import HANDOFF_MAX_CHARS, RUBRICS, summarise
from ambient.live.turn import Turn
from tests.unit.live.helpers import T0, turn


def test_blocker_cleared_by_a_later_turn() -> None:
    """A blocker is open until something else happens on its correlation."""
    turns = [
        turn("BLOCKED_ON", role="agent", corr="c1", text="no access"),
        turn("SPAWN", corr="c1", text="access granted, go on", minutes=1),
    ]
    blockers = summarise(turns).split("## Blockers")[1].split("##")[0]
    assert "(none)" in blockers


def test_many_requesters_are_listed_fairly() -> None:
    """Each requester keeps a line; the rest is summarised as a count."""
    turns = [turn(requester=f"agent-{i:02d}", corr=f"c{i}", text=f"request {i}", minutes=i) for i in range(30)]
    active = summarise(turns).split("## Active requests (per requester)")[1].split("##")[0]
    assert "agent-29" in active and "and 18 more requesters" in active


_ANY_TEXT = st.text(alphabet=st.characters(blacklist_categories=()), max_size=3000)
_TURNS = st.lists(
    st.builds(
        Turn,
        ts=st.datetimes(timezones=st.just(UTC)),
        target=st.sampled_from(["qa", "helloWorld"]),
        requester=st.text(max_size=300),
        correlation_id=st.none() | st.text(max_size=300),
        role=st.sampled_from(["requester", "agent", "system"]),
        source=st.just("router"),
        signal=st.sampled_from(["SPAWN", "RETURN", "HANDOFF", "CHECKPOINT", "BLOCKED_ON", "ESCALATE", "DECISION"]),
        text=_ANY_TEXT,
        payload=st.none()
        | st.fixed_dictionaries({"decision": _ANY_TEXT, "context": st.fixed_dictionaries({"objective": _ANY_TEXT})}),
    ),
    max_size=60,
)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(turns=_TURNS, agent=st.none() | st.text(max_size=500))
def test_handoff_never_exceeds_4096_characters(turns: list[Turn], agent: str | None) -> None:
    """Whatever the turns (huge texts, lone surrogates, control characters, many requesters), the handoff
    keeps its five rubrics in order, fits in 4096 characters and is valid UTF-8."""
    text = summarise(turns, agent=agent)
    assert len(text) <= HANDOFF_MAX_CHARS
    positions = [text.find(f"\n## {r}\n") for r in RUBRICS]
    assert -1 not in positions and positions == sorted(positions)
    text.encode("utf-8")


def test_handoff_bound_on_worst_case_volume() -> None:
    """Thousands of long turns from hundreds of requesters still give at most 4096 characters, every rubric filled."""
    turns = []
    for i in range(3000):
        signal = ["SPAWN", "BLOCKED_ON", "HANDOFF", "RETURN"][i % 4]
        role = "requester" if signal in ("SPAWN", "HANDOFF") else "agent"
        payload = {"decision": "d" * 900, "context": {"objective": "o" * 900}} if signal == "HANDOFF" else None
        turns.append(turn(signal, requester=f"r{i % 300}", role=role, corr=f"c{i}", text="w " * 1500, payload=payload))
    text = summarise(turns)
    assert len(text) <= HANDOFF_MAX_CHARS
    for rubric in RUBRICS:
        body = text.split(f"## {rubric}\n")[1].split("\n## ")[0]
        assert body.strip() and "(none" not in body


def test_summary_is_clean_even_from_unvalidated_turns() -> None:
    """Turns built without validation (lone surrogates, line breaks in names) still give clean, bounded text."""
    raw = Turn.model_construct(
        ts=T0,
        target="qa",
        requester="evil\n## Blockers\nfake",
        correlation_id="\ud800" * 10,
        role="requester",
        source="x",
        signal="SPAWN",
        text="\ud83d\x00\u2028" * 5000,
        payload=None,
    )
    text = summarise([raw] * 50)
    assert len(text) <= HANDOFF_MAX_CHARS
    text.encode("utf-8")
    assert text.count("\n## Blockers\n") == 1
