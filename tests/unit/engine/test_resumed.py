"""Why an item runs again, folded from its run journal (ambient.engine.runstate): an answer to its question, a retry
after an error, a stop or a crash of ambient. The runner tells a resumed session exactly that."""

from __future__ import annotations

from typing import Any

import pytest

from ambient.engine.runstate import fold
from ambient.runners.result import Resumed

T0 = "2026-03-18T10:00:00+00:00"
ACCEPTED = {"ev": "accepted", "item": "a", "attempt": 1, "at": T0}
ASKED = {
    "ev": "asked",
    "escalation": "esc-1",
    "request": {"kind": "question", "question": "Ship the draft as it is?", "options": [], "item": "a"},
    "at": T0,
}
ESCALATED = {"ev": "escalated", "escalation": "esc-1", "item": "a", "kind": "question", "at": T0}
ASKS = {"ev": "finished", "item": "a", "attempt": 1, "result": "fail", "agent": "w", "at": T0}


def _decided(action: str, option: str, **more: Any) -> dict[str, Any]:
    return {"ev": "decided", "escalation": "esc-1", "item": "a", "option": option, "action": action, **more, "at": T0}


def _resumed(*events: dict[str, Any]) -> Resumed | None:
    start = {"ev": "started", "run_id": "r1", "workflow": "w", "form": "for_each", "items": ["a"], "at": T0}
    return fold([start, *events]).items[0].resumed


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ((), None),  # never ran
        ((ACCEPTED,), None),  # running its first attempt
        (
            (ACCEPTED, ASKS, ASKED, ESCALATED, _decided("answer", "ship", answer="ship it")),
            Resumed("answered", question="Ship the draft as it is?", answer="ship it"),
        ),
        (
            (ACCEPTED, ASKS, ASKED, ESCALATED, _decided("retry", "retry")),
            Resumed("answered", question="Ship the draft as it is?", answer="retry"),
        ),
        (  # an old journal without its asked record: the answer still said, the question unknown
            (ACCEPTED, ASKS, ESCALATED, _decided("answer", "ship")),
            Resumed("answered", answer="ship"),
        ),
        (
            (ACCEPTED, {**ASKS, "result": "error", "error": "exit 3: tests failed"}),
            Resumed("retry", error="exit 3: tests failed"),
        ),
        ((ACCEPTED, ASKS), Resumed("retry", error="the attempt ended with fail")),
        (  # a hold (the model provider refused the key): run again once lifted
            (ACCEPTED, {**ASKS, "result": "interrupted", "error": "401 invalid x-api-key"}),
            Resumed("retry", error="401 invalid x-api-key"),
        ),
        (
            (ACCEPTED, {"ev": "interrupted", "item": "a", "attempt": 1, "reason": "restart"}),
            Resumed("restart", crash=True),
        ),
        ((ACCEPTED, {"ev": "interrupted", "item": "a", "attempt": 1}), Resumed("restart")),  # a stop
        (  # answered, then ambient stopped during the attempt that followed: the stop is the latest
            (
                ACCEPTED,
                ASKS,
                ASKED,
                ESCALATED,
                _decided("answer", "ship"),
                {**ACCEPTED, "attempt": 2},
                {"ev": "interrupted", "item": "a", "attempt": 2},
            ),
            Resumed("restart"),
        ),
        (  # answered while ambient was down: still the answer once it starts again
            (ACCEPTED, ASKS, ASKED, ESCALATED, _decided("answer", "ship")),
            Resumed("answered", question="Ship the draft as it is?", answer="ship"),
        ),
        ((ACCEPTED, {**ASKS, "result": "success"}), None),
    ],
)
def test_why_an_item_runs_again(events: tuple[dict[str, Any], ...], expected: Resumed | None) -> None:
    assert _resumed(*events) == expected


def test_a_gate_before_a_first_attempt_resumes_nothing() -> None:
    gate = {"ev": "gate", "item": "a", "state": "pending", "escalation": "esc-1", "before": True, "at": T0}
    assert _resumed(gate, _decided("approve", "approve")) is None
