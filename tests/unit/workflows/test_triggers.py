"""When a workflow starts a run by itself: once when first seen, then by its schedule, never doubling a run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from ambient.workflows.spec import WorkflowSpec, parse_workflow
from ambient.workflows.triggers import start_due

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _spec(**more: Any) -> WorkflowSpec:
    return parse_workflow({"workflow": "nightly", "for_each": {"items": ["a"], "spawn": "coder"}, **more})


def _seen(ago: timedelta) -> dict[str, Any]:
    return {"first_hash": "h", "last_started": (NOW - ago).isoformat(), "runs": 1}


def test_a_workflow_first_seen_runs_once_then_waits() -> None:
    spec = _spec()
    assert start_due(spec, None, NOW, running=False) == "file"
    assert start_due(spec, _seen(timedelta(days=30)), NOW, running=False) is None  # no schedule: never again


def test_a_draft_never_starts() -> None:
    draft = _spec(status="draft", schedule="1h")
    assert not draft.runnable
    assert start_due(draft, None, NOW, running=False) is None
    assert start_due(draft, _seen(timedelta(days=1)), NOW, running=False) is None


def test_a_schedule_starts_the_next_run_when_due() -> None:
    spec = _spec(schedule="1h")
    assert start_due(spec, _seen(timedelta(minutes=59)), NOW, running=False) is None
    assert start_due(spec, _seen(timedelta(hours=1)), NOW, running=False) == "schedule"  # due at the instant
    assert start_due(spec, _seen(timedelta(days=2)), NOW, running=False) == "schedule"  # once, however late


def test_a_run_still_going_is_not_doubled() -> None:
    spec = _spec(schedule="1h")
    assert start_due(spec, _seen(timedelta(hours=3)), NOW, running=True) is None
    assert start_due(spec, None, NOW, running=True) == "file"  # first seen: the schedule does not apply yet
