"""The agent protocol (runners/answer.py): how any agent's JSON answer maps onto a result. How an AI
agent's reply is read into that answer: test_ai_answers.py."""

from __future__ import annotations

from typing import Any

import pytest

from ambient.runners import interpret_output


class TestProtocol:
    """interpret_output: how an agent's JSON answer maps onto a result."""

    @pytest.mark.parametrize(
        ("answer", "status", "result_status", "reason"),
        [
            (None, "success", "ok", None),
            ({}, "success", "ok", None),
            ({"status": "ok", "n": 1}, "success", "ok", None),
            ({"status": "partial"}, "success", "partial", None),
            ({"status": "failed"}, "fail", "failed", "agent_failed"),
            ({"status": "error", "error": "boom"}, "error", None, "agent_error"),
            ({"signal": "RETURN", "result": {"status": "ok"}}, "success", "ok", None),
            ({"signal": "RETURN", "result": {"status": "failed"}}, "fail", "failed", "agent_failed"),
            ({"signal": "ESCALATE", "options": ["a", "b"], "question": "?"}, "escalate", None, None),
            ({"signal": "ERROR", "context": {"error": "x"}}, "error", None, "agent_error"),
            ({"signal": "BLOCKED_ON", "context": {"missing": "key"}}, "blocked", None, None),
            ({"signal": "RETURN", "from": "deploy", "result": {}}, "success", "ok", None),
            ({"status": "done"}, "error", None, "bad_output"),
            ({"signal": "SPAWN"}, "error", None, "bad_output"),
            ({"signal": "RETURN", "result": "text"}, "error", None, "bad_output"),
            ({"signal": "ESCALATE", "options": []}, "error", None, "bad_output"),
            ({"signal": "RETURN", "result": {}, "to": "human"}, "error", None, "bad_output"),
            ({"signal": "RETURN", "from": "human", "result": {}}, "error", None, "sender_mismatch"),
            ({"sender": "orchestrator", "status": "ok"}, "error", None, "sender_mismatch"),
            ([1, 2], "error", None, "bad_output"),
        ],
    )
    def test_mapping(self, answer: Any, status: str, result_status: str | None, reason: str | None) -> None:
        """Each documented answer shape maps to its status, result status and reason."""
        res = interpret_output(answer, agent="deploy")
        assert (res.status, res.result_status, res.reason) == (status, result_status, reason)

    def test_escalate_fields(self) -> None:
        """An ESCALATE carries its options and question."""
        res = interpret_output({"signal": "ESCALATE", "options": ["retry", "skip"], "question": "Q?"}, agent="a")
        assert (res.options, res.question, res.signal) == (["retry", "skip"], "Q?", "ESCALATE")

    def test_limits(self) -> None:
        """Huge strings and deep nesting in an answer are rejected with where they are."""
        huge = interpret_output({"status": "ok", "blob": "A" * 70_000}, agent="a")
        assert huge.reason == "bad_output" and "blob" in (huge.error or "")
        deep: Any = {}
        for _ in range(80):
            deep = {"d": deep}
        assert interpret_output({"status": "ok", "x": deep}, agent="a").reason == "bad_output"
