"""What the run page reads from a journal: attempts per item, exit triggers taken, grid cell classes."""

from __future__ import annotations

from ambient.web.rundetail import cell_class, epoch, histories, item_title


def test_attempts_and_retries_per_item() -> None:
    """Each accepted starts an attempt, its finished closes it with result, error and duration."""
    events = [
        {"ev": "started", "at": "2026-03-01T10:00:00Z"},
        {"ev": "accepted", "item": "a", "attempt": 1, "at": "2026-03-01T10:00:01Z"},
        {
            "ev": "finished",
            "item": "a",
            "attempt": 1,
            "agent": "w",
            "result": "error",
            "error": "boom",
            "duration_ms": 900,
            "at": "2026-03-01T10:00:02Z",
        },
        {"ev": "retry", "item": "a", "attempt": 1, "not_before": "2026-03-01T10:00:05Z", "at": "2026-03-01T10:00:02Z"},
        {"ev": "accepted", "item": "a", "attempt": 2, "at": "2026-03-01T10:00:05Z"},
        {
            "ev": "finished",
            "item": "a",
            "attempt": 2,
            "agent": "w",
            "result": "success",
            "error": None,
            "duration_ms": 500,
            "at": "2026-03-01T10:00:06Z",
        },
        {"ev": "accepted", "item": "b", "attempt": 1, "at": "2026-03-01T10:00:01Z"},
    ]
    h = histories(events)
    a = h["a"]
    assert [(x.number, x.result, x.error) for x in a.attempts] == [(1, "error", "boom"), (2, "success", None)]
    assert a.agent == "w" and a.attempts[1].duration_ms == 500
    assert a.events[0][1].startswith("retry after 2026-03-01T10:00:05Z")
    assert h["b"].attempts[0].end is None  # still running


def test_chain_exit_trigger_taken() -> None:
    """The cursor after a step's finish names where its exit trigger sent the chain; a gate says so too."""
    events = [
        {"ev": "accepted", "item": "1", "attempt": 1, "at": "t1"},
        {"ev": "finished", "item": "1", "attempt": 1, "result": "fail", "at": "t2"},
        {"ev": "cursor", "index": 2, "at": "t2"},
        {"ev": "accepted", "item": "3", "attempt": 1, "at": "t3"},
        {"ev": "finished", "item": "3", "attempt": 1, "result": "success", "at": "t4"},
        {"ev": "gate", "item": "3", "state": "pending", "escalation": "e1", "at": "t4"},
        {"ev": "finished_run", "outcome": "aborted", "at": "t5"},
    ]
    h = histories(events, ["1", "2", "3"])
    assert h["1"].trigger == "→ 3"
    assert h["3"].trigger == "→ human gate"
    assert histories(events[:3], ["1", "2"])["1"].trigger == "→ the end of the chain"


def test_abort_by_exit_trigger() -> None:
    """An exit trigger's abort is a ``decided`` by the workflow: it reads as the step's trigger."""
    events = [
        {"ev": "finished", "item": "1", "attempt": 1, "result": "fail", "at": "t"},
        {
            "ev": "decided",
            "item": "1",
            "escalation": "",
            "option": "abort",
            "action": "abort",
            "by": "workflow",
            "channel": "trigger",
            "at": "t",
        },
    ]
    assert histories(events, ["1"])["1"].trigger == "→ abort (exit trigger)"


def test_cell_classes() -> None:
    """Every item status has a colour; a pending gate is waiting; an unknown status is pending grey."""
    assert cell_class("done") == "st-done"
    assert cell_class("running") == "st-running"
    assert cell_class("escalated") == "st-waiting"
    assert cell_class("failed") == "st-failed"
    assert cell_class("skipped") == "st-pending cell-skipped"
    assert cell_class("retry_wait") == "st-running cell-retry"
    assert cell_class("pending", "pending") == "st-waiting cell-gate"
    assert cell_class("whatever") == "st-pending"


def test_titles_and_times() -> None:
    """A cell's hover says status, attempt, duration and the first line of the error."""
    assert item_title("x", "failed", 2, 1500, "first\nsecond") == "x: failed, attempt 2, 1.5 s\nfirst"
    assert item_title("x", "pending", 0, 0, None) == "x: pending"
    assert epoch("2026-03-01T00:00:00Z") == 1772323200.0
    assert epoch("nope") is None and epoch(None) is None
