"""What a resumed session is told (ambient.runners.prompt.resume_note): exactly what happened, never a guess."""

from __future__ import annotations

import pytest

from ambient.runners.prompt import resume_note
from ambient.runners.result import Resumed


@pytest.mark.parametrize(
    ("resumed", "says"),
    [
        (
            Resumed("answered", question="Ship the draft\nas it is?", answer="ship it"),
            'You are resumed because the person answered your question. You asked: "Ship the draft as it is?". '
            "They answered: ship it. Go on from where you asked, with their answer.",
        ),
        (
            Resumed("answered", answer="retry"),
            "You are resumed because the person answered your question. They answered: retry. Go on from where "
            "you asked, with their answer.",
        ),
        (
            Resumed("retry", error="exit 3: tests failed"),
            "You are resumed for a retry: your previous attempt did not succeed (exit 3: tests failed). Check what "
            "you already did, then finish the task.",
        ),
        (
            Resumed("restart", crash=True),
            "You are resumed after ambient stopped unexpectedly (a crash or a kill) while you worked: a tool call in "
            "progress may or may not have run. Check, then continue the task where you left off.",
        ),
        (
            Resumed("restart"),
            "You are resumed after ambient was stopped or restarted while you worked; continue where you left off.",
        ),
        (None, "You are resumed in your earlier session; continue the task where you left off."),
    ],
)
def test_a_resumed_session_is_told_what_happened(resumed: Resumed | None, says: str) -> None:
    assert resume_note(resumed) == says


@pytest.mark.parametrize(
    "resumed", [Resumed("answered", answer="go"), Resumed("restart"), Resumed("restart", crash=True), None]
)
def test_only_a_retry_speaks_of_a_failure_and_none_says_interrupted(resumed: Resumed | None) -> None:
    note = resume_note(resumed)
    assert "interrupted" not in note and "did not succeed" not in note


def test_a_long_error_is_one_bounded_line() -> None:
    note = resume_note(Resumed("retry", error="Traceback\n" + "x" * 5000))
    assert "\n" not in note and len(note) < 700 and "Traceback x" in note
