"""Escalations as a model and pure rules: ids, options, answers, and what a deadline decides (no disk)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambient.core.errors import AlreadyAnsweredError, InputError, InvalidOptionError, UnknownEscalationError
from ambient.human import escalations as esc_mod
from ambient.human.escalations import (
    Escalation,
    EscalationDraft,
    Option,
    decide,
    new_escalation,
    normalize_id,
    slug_key,
    timeout_decision,
    with_attempt,
)

T0 = datetime(2026, 3, 16, 20, 36, tzinfo=UTC)


def _fail(item: str = "instance-03", *, now: datetime = T0, **kw: Any) -> Escalation:
    return new_escalation(
        EscalationDraft(
            workflow="deploy-batch",
            run_id="run-1",
            kind="fail",
            question=f"Item {item} failed: exit code 1",
            item=item,
            agent="deploy",
            **kw,
        ),
        now=now,
    )


class TestCreate:
    def test_id_is_short_and_typable(self) -> None:
        """Ids are esc- plus 6 lowercase base32 characters; the prefix and case are optional when typed."""
        e = _fail()
        assert len(e.id) == 10 and e.id.startswith("esc-")
        assert set(e.id[4:]) <= set("abcdefghijklmnopqrstuvwxyz234567")
        assert normalize_id(e.id[4:].upper()) == e.id
        with pytest.raises(UnknownEscalationError):
            normalize_id("../../etc/passwd")

    def test_new_escalation_defaults(self) -> None:
        """Default options per kind, absolute deadline and reminder, timeout without on_timeout escalates."""
        e = _fail(timeout=timedelta(hours=2), remind_before=timedelta(minutes=30))
        assert [o.key for o in e.options] == ["retry", "skip", "abort"]
        assert e.deadline == T0 + timedelta(hours=2)
        assert e.remind_at == T0 + timedelta(hours=1, minutes=30)
        assert e.on_timeout == "escalate"
        gate = new_escalation(
            EscalationDraft(workflow="w", run_id="r", kind="gate", question="Ship?", step="release"), now=T0
        )
        assert [o.key for o in gate.options] == ["approve", "reject"] and gate.deadline is None
        big = new_escalation(EscalationDraft(workflow="w", run_id="r", kind="error", question="x" * 20000), now=T0)
        assert len(big.question) == esc_mod.MAX_QUESTION_CHARS and big.question.endswith("…")
        with pytest.raises(InputError):
            new_escalation(EscalationDraft(workflow="w", run_id="r", kind="question", question="?"), now=T0)

    def test_option_keys_are_checked(self) -> None:
        """Option keys are names (never only digits, so '2' always means the second option), unique in any case."""
        with pytest.raises(ValueError, match="key"):
            Option(key="2", label="two", action="retry")
        with pytest.raises(ValueError, match="key"):
            Option(key="yes, deploy", label="two", action="retry")
        e = new_escalation(
            EscalationDraft(
                workflow="w",
                run_id="r",
                kind="question",
                question="?",
                options=[("Redeploy", "Redeploy now", "answer"), ("v1.2", "Roll back to 1.2", "answer")],
            ),
            now=T0,
        )
        assert [o.key for o in e.options] == ["Redeploy", "v1.2"]  # kept as the workflow spells them
        assert decide(e, "redeploy", by="a", channel="cli", now=T0).decision == "Redeploy"
        with pytest.raises(ValueError, match="unique"):
            new_escalation(
                EscalationDraft(
                    workflow="w",
                    run_id="r",
                    kind="question",
                    question="?",
                    options=[
                        {"key": "a", "label": "A", "action": "continue"},
                        {"key": "A", "label": "B", "action": "x"},
                    ],
                ),
                now=T0,
            )

    @pytest.mark.parametrize(
        ("text", "key"), [("Yes, deploy!", "yes-deploy"), ("42", "opt-42"), ("???", "opt"), ("v1.2 ok", "v1.2-ok")]
    )
    def test_slug_key(self, text: str, key: str) -> None:
        """Free text (an agent's proposed answer) becomes a valid option key."""
        assert slug_key(text) == key
        Option(key=slug_key(text), label=text, action="answer")


class TestDecide:
    @pytest.mark.parametrize(("choice", "key"), [("retry", "retry"), ("SKIP", "skip"), ("1", "retry"), ("3", "abort")])
    def test_by_key_or_number(self, choice: str, key: str) -> None:
        """An option is chosen by its key (any case) or by its 1-based number."""
        e = _fail()
        done = decide(e, choice, by="alice", channel="telegram", now=T0 + timedelta(seconds=90), note="ok")
        assert (done.status, done.decision, done.by, done.channel, done.note) == (
            "answered",
            key,
            "alice",
            "telegram",
            "ok",
        )
        assert done.answered_at == T0 + timedelta(seconds=90) and done.latency_s == 90.0
        assert done.decided_action == key
        assert e.status == "pending"  # the input is never changed

    @given(
        keys=st.lists(st.from_regex(r"[a-z][a-z0-9_-]{0,8}", fullmatch=True), min_size=1, max_size=8, unique=True),
        data=st.data(),
    )
    @pytest.mark.slow
    def test_number_and_key_agree(self, keys: list[str], data: st.DataObject) -> None:
        """For any option list, answering with number n equals answering with the n-th key."""
        e = new_escalation(
            EscalationDraft(
                workflow="w",
                run_id="r",
                kind="question",
                question="?",
                options=[{"key": k, "label": k.upper(), "action": "continue"} for k in keys],
            ),
            now=T0,
        )
        n = data.draw(st.integers(min_value=1, max_value=len(keys)))
        by_number = decide(e, str(n), by="a", channel="cli", now=T0)
        by_key = decide(e, keys[n - 1], by="a", channel="cli", now=T0)
        assert by_number == by_key

    @pytest.mark.parametrize("choice", ["4", "0", "-1", "approve", "", "retry please"])
    def test_unknown_option_lists_the_offered_ones(self, choice: str) -> None:
        """An option not offered is refused with the list of those that are."""
        with pytest.raises(InvalidOptionError) as info:
            decide(_fail(), choice, by="a", channel="cli", now=T0)
        assert "1) retry (Run it again), 2) skip" in str(info.value) and "3) abort" in str(info.value)

    @pytest.mark.parametrize(
        ("choice", "hint"),
        [("retyr", "did you mean 'retry'?"), ("skp", "did you mean 'skip'?"), ("abrot", "did you mean 'abort'?")],
    )
    def test_a_misspelt_option_is_told_the_one_it_looks_like(self, choice: str, hint: str) -> None:
        """A misspelt option is told the offered one it looks like, beside the list; a far one or a number is not."""
        with pytest.raises(InvalidOptionError) as info:
            decide(_fail(), choice, by="a", channel="cli", now=T0)
        assert f"does not offer {choice!r} ({hint})" in str(info.value) and "3) abort" in str(info.value)
        for far in ("approve", "9"):
            with pytest.raises(InvalidOptionError) as info:
                decide(_fail(), far, by="a", channel="cli", now=T0)
            assert "did you mean" not in str(info.value)

    def test_second_answer_is_refused(self) -> None:
        """An answered escalation refuses another answer, saying who answered and how."""
        done = decide(_fail(), "skip", by="alice", channel="telegram", now=T0)
        with pytest.raises(AlreadyAnsweredError, match="already answered: skip by alice via telegram"):
            decide(done, "retry", by="bob", channel="cli", now=T0)


class TestTimeouts:
    @pytest.mark.parametrize(
        ("kind", "on_timeout", "decision"),
        [
            ("gate", "approve", "approve"),
            ("gate", "reject", "reject"),
            ("fail", "abort", "abort"),
            ("fail", "approve", "skip"),  # approve a failure: go on without the item
            ("blocked", "approve", "continue"),
        ],
    )
    def test_timeout_decisions(self, kind: Any, on_timeout: Any, decision: str) -> None:
        """on_timeout picks the offered option with that action (approve: approve, else continue, else skip)."""
        e = new_escalation(
            EscalationDraft(
                workflow="w", run_id="r", kind=kind, question="?", timeout=timedelta(minutes=1), on_timeout=on_timeout
            ),
            now=T0,
        )
        assert timeout_decision(e, T0 + timedelta(seconds=59)) is None
        out = timeout_decision(e, T0 + timedelta(minutes=1))
        assert out is not None and out.status == "expired" and out.decision == decision

    def test_timeout_escalate_keeps_waiting_and_notifies_again(self) -> None:
        """on_timeout escalate leaves it pending without an end and re-arms the notification."""
        e = _fail(timeout=timedelta(minutes=5))
        e = with_attempt(e, ok=True, now=T0)
        assert e.notify.delivered_at == T0  # delivered once
        out = timeout_decision(e, T0 + timedelta(minutes=5))
        assert out is not None and out.status == "pending" and out.deadline is None
        assert out.timed_out_at == T0 + timedelta(minutes=5)
        assert out.notify.delivered_at is None and out.notify.next_at == T0 + timedelta(minutes=5)  # told again
