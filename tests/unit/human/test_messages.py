"""The text of a notification: readable on a phone, always fitting 4096 with how to answer, agent text plain (S-09)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambient.human.messages import (
    TELEGRAM_MAX_CHARS,
    Message,
    QuestionCard,
    clean_text,
    cut_text,
    escalation_message,
    format_escalation,
    text_length,
)

EVIL = '<a href="https://evil.example/approve">Approve now</a> '


def _message(question: str = "The summariser failed 3 times: timeout.") -> Message:
    return escalation_message(
        QuestionCard(
            escalation_id="e-abc123",
            what="item failed",
            question=question,
            options=["retry", "skip", "abort"],
            workflow="weekly-review",
            item="notes/a.md",
            step="summarise",
            agent="writer",
        )
    )


class TestFormat:
    def test_escalation_is_readable(self) -> None:
        """The body says what happened, where, the numbered options and the exact answer command."""
        title, body = format_escalation(
            QuestionCard(
                escalation_id="e-abc123",
                what="item failed",
                question="Timeout after 120 s.",
                options=["retry", "skip", "abort"],
                workflow="weekly-review",
                item="notes/a.md",
            )
        )
        assert title == "Decision needed: item failed"
        assert "Workflow: weekly-review" in body and "Item: notes/a.md" in body
        assert "1. retry\n2. skip\n3. abort" in body
        assert "ambient decide e-abc123 retry" in body and "Ref: e-abc123" in body
        assert "button" not in body

    def test_buttons_mentioned_when_enabled(self) -> None:
        """With Telegram buttons on, the message says the person can tap one."""
        _, body = format_escalation(
            QuestionCard(escalation_id="e-1", what="gate", question="ok?", options=["approve", "reject"]),
            telegram_buttons=True,
        )
        assert "tap one of the buttons under this message in Telegram" in body

    def test_options_with_spaces_are_quoted(self) -> None:
        """The answer command is shell-quoted."""
        _, body = format_escalation(QuestionCard(escalation_id="e-1", what="x", question="q", options=["retry later"]))
        assert "ambient decide e-1 'retry later'" in body

    def test_long_agent_text_is_cut_but_instructions_survive(self) -> None:
        """S-09: 5000 characters of agent text are cut so the message fits 4096; options and answer stay."""
        title, body = format_escalation(
            QuestionCard(escalation_id="e-abc123", what="x", question=EVIL + "y" * 5000, options=["retry", "skip"])
        )
        assert text_length(title) + 2 + text_length(body) <= TELEGRAM_MAX_CHARS
        assert "[cut:" in body and "2. skip" in body and "ambient decide e-abc123" in body
        assert body.endswith("Ref: e-abc123")  # the end of the message is never what gets cut
        assert EVIL.strip() in body  # kept as literal text; notifiers never render it

    @given(
        what=st.text(max_size=300),
        question=st.text(max_size=6000),
        options=st.lists(st.text(min_size=1, max_size=150), min_size=1, max_size=8),
        workflow=st.text(max_size=300),
    )
    def test_always_fits_and_keeps_the_answer(
        self, what: str, question: str, options: list[str], workflow: str
    ) -> None:
        """Whatever the agent wrote, the message fits 4096 and still ends with how to answer."""
        title, body = format_escalation(
            QuestionCard(escalation_id="e-1", what=what, question=question, options=options, workflow=workflow)
        )
        assert text_length(title) + 2 + text_length(body) <= TELEGRAM_MAX_CHARS
        assert "ambient decide e-1 OPTION" in body and body.endswith("Ref: e-1")

    def test_astral_characters_count_double(self) -> None:
        """Cutting counts UTF-16 units, as Telegram does, so emoji-heavy text still fits."""
        text = cut_text("😀" * 3000, 4096)
        assert text_length(text) <= 4096

    def test_control_and_bidi_characters_removed(self) -> None:
        """Agent text loses control and bidi-override characters (no visual spoofing)."""
        assert clean_text("ok\x00\x1b[31m\u202eevorppa\r\nnext") == "ok[31mevorppa\nnext"

    def test_needs_options(self) -> None:
        """An escalation without options is a programming error."""
        with pytest.raises(ValueError, match="at least one option"):
            format_escalation(QuestionCard(escalation_id="e-1", what="x", question="q", options=[]))

    def test_dedupe_id_defaults(self) -> None:
        """An escalation's dedupe id comes from its id; other messages from their content."""
        assert _message().dedupe_id == "escalation-e-abc123"
        a, b = Message(title="t", body="b"), Message(title="t", body="b")
        assert a.dedupe_id == b.dedupe_id != Message(title="t", body="c").dedupe_id
        assert a.silent and not _message().silent
