"""``/``: the overview — daemon up or down (and since when), runs in progress with live progress bars, the
escalations waiting (one button per option and a note), the last errors, the breakers tripped, the cost today."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ambient.query import views
from ambient.storage.paths import BrainPaths
from ambient.web.daemon import daemon_state
from ambient.web.render import render
from ambient.web.store import read

#: How many of the last errors the overview lists, and how many recent run records it looks through for them.
LAST_ERRORS = 8
RECENT_RECORDS = 50


@dataclass(frozen=True)
class ErrorRow:
    """One error a person may want to look at: where, when, what."""

    at: str | None
    workflow: str | None
    run_id: str | None
    item: str
    error: str


def last_errors(running: list[views.RunRow], recent: list[dict[str, Any]], limit: int = LAST_ERRORS) -> list[ErrorRow]:
    """The newest errors: items of runs in progress that hold one, then steps of recent finished runs."""
    rows: list[ErrorRow] = []
    for run in running:
        for item in run.items:
            if item.error:
                rows.append(
                    ErrorRow(item.ended_at or item.first_start, run.workflow, run.run_id, item.name, item.error)
                )
    for record in recent:
        steps = record.get("steps")
        for step in steps if isinstance(steps, list) else ():
            if isinstance(step, dict) and step.get("error"):
                rows.append(
                    ErrorRow(
                        str(record.get("completed_at") or "") or None,
                        str(record.get("workflow") or "") or None,
                        str(record.get("run_id") or "") or None,
                        str(step.get("item") or ""),
                        str(step["error"]),
                    )
                )
    rows.sort(key=lambda r: r.at or "", reverse=True)
    return rows[:limit]


def run_class(run: views.RunRow) -> str:
    """The colour of a run in progress: failed items show red, a wait amber, else blue."""
    if run.failed:
        return "failed"
    if run.waiting:
        return "waiting"
    return "running"


def _data(conn: sqlite3.Connection) -> dict[str, Any]:
    day = datetime.now(UTC).date().isoformat()
    running = views.runs_in_progress(conn)
    return {
        "counts": views.overview(conn, day),
        "runs": running,
        "unreadable": views.unreadable_runs(conn),
        "pending": views.escalations(conn, status="pending"),
        "errors": last_errors(running, views.records(conn, last=RECENT_RECORDS)),
        "breakers": [(r, r.tripped) for r in running if r.tripped],
    }


async def overview(request: Request) -> Response:
    paths: BrainPaths = request.app.state.paths
    data = await read(request, _data)
    return render(request, "overview.html", {**data, "daemon": daemon_state(paths), "run_class": run_class})


routes = [Route("/", overview, name="overview")]
