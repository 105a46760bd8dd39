"""What a run record says about its items' failures (the record's shape: ambient.engine.records)."""

from __future__ import annotations

from typing import Any

from ambient.engine.records import recovered
from ambient.web.pages.overview import last_errors


def _step(item: str, result: str, error: str | None = None) -> dict[str, Any]:
    return {"item": item, "result": result, "error": error}


STEPS = [
    _step("eu-1", "fail", "eu-1 is down"),
    _step("eu-2", "error", "timed out"),
    _step("eu-1", "success"),  # its retry did it
    _step("eu-3", "success"),
    _step("eu-2", "skipped"),  # the person skipped it: still not done
]


def test_an_item_whose_last_step_succeeded_has_recovered() -> None:
    assert recovered(STEPS) == {"eu-1", "eu-3"}
    assert recovered([]) == set()
    assert recovered([_step("a", "success"), _step("a", "error", "again")]) == set()  # failed again after


def test_the_consoles_last_errors_leave_out_what_recovered() -> None:
    record = {"run_id": "r1", "workflow": "rollout", "completed_at": "2026-12-08T00:00:00Z", "steps": STEPS}
    assert [(e.item, e.error) for e in last_errors([], [record])] == [("eu-2", "timed out")]
