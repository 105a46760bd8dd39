"""``/``: the overview — daemon up or down (and since when), runs in progress with live progress bars, the
escalations waiting (one button per option and a note), the last errors, the breakers tripped (each with a "Reset"
button: ``POST /breakers/reset``, :func:`ambient.actions.breakers.reset_breaker`, the code of ``ambient preflight
reset``), the cost today, the cluster's workers (when the brain has ``cluster:``)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ambient.actions.breakers import TrippedBreaker, reset_breaker, tripped_breakers
from ambient.claims.preflight import breaker_key
from ambient.cluster.rosterfile import workers_view
from ambient.core.errors import AmbientError
from ambient.query import views
from ambient.storage.paths import BrainPaths
from ambient.web.daemon import daemon_state
from ambient.web.render import redirect_back, render
from ambient.web.storethread import predictions, read

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
    """The newest errors: items of runs in progress that hold one, then steps of recent finished runs (but those of
    an item a later attempt did: :func:`ambient.engine.records.recovered`)."""
    from ambient.engine.records import recovered

    rows: list[ErrorRow] = []
    for run in running:
        for item in run.items:
            if item.error:
                rows.append(
                    ErrorRow(item.ended_at or item.first_start, run.workflow, run.run_id, item.name, item.error)
                )
    for record in recent:
        steps = record.get("steps")
        steps = [step for step in steps if isinstance(step, dict)] if isinstance(steps, list) else []
        fine = recovered(steps)
        for step in steps:
            if step.get("error") and str(step.get("item")) not in fine:
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


@dataclass(frozen=True)
class BreakerRow:
    """A tripped breaker on the overview: its scope, failures and since when (None: only a run's journal says it
    tripped), and the runs in progress it stopped."""

    scope: str
    fails: int | None
    tripped_at: str | None
    runs: list[views.RunRow]


def breaker_rows(tripped: list[TrippedBreaker], running: list[views.RunRow]) -> list[BreakerRow]:
    """The persisted tripped breakers (``.ambient/breaker.json``) with the runs each stopped, then the scopes only a
    run in progress reports tripped (its own breaker), one row per scope."""
    rows = {breaker_key(b.scope): BreakerRow(b.scope, b.fails, b.tripped_at, []) for b in tripped}
    for run in running:
        for scope in run.tripped:
            row = rows.setdefault(breaker_key(scope), BreakerRow(scope, None, None, []))
            row.runs.append(run)
    return list(rows.values())


def _breakers(paths: BrainPaths) -> tuple[list[TrippedBreaker], str | None]:
    try:
        return tripped_breakers(paths), None
    except AmbientError as exc:  # an unreadable breaker.json: say so, never "no breaker tripped"
        return [], str(exc)


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
    }


async def overview(request: Request) -> Response:
    paths: BrainPaths = request.app.state.paths
    data = await read(request, _data, share=True)  # the same for each live part of the overview
    data["predictions"] = await predictions(request, data["pending"])
    tripped, problem = await run_in_threadpool(_breakers, paths)
    return render(
        request,
        "overview.html",
        {
            **data,
            "breakers": breaker_rows(tripped, data["runs"]),
            "breaker_problem": problem,
            "daemon": (daemon := daemon_state(paths)),
            "workers": await run_in_threadpool(workers_view, paths, daemon.up),  # cluster: (docs/cluster.md)
            "run_class": run_class,
        },
    )


async def reset_action(request: Request) -> Response:
    """``ambient preflight reset TARGET`` (form: ``scope``): clear a breaker, answer its chains' questions."""
    paths: BrainPaths = request.app.state.paths
    form = await request.form()
    back = form.get("back") or "/"
    scope = str(form.get("scope") or "").strip()
    try:
        done = await run_in_threadpool(
            lambda: reset_breaker(paths, scope, channel="web", note="reset from the console")
        )
    except AmbientError as exc:
        return redirect_back(back, f"Refused, nothing changed: {exc}", ok=False)
    return redirect_back(back, "; ".join(done.lines))


routes = [
    Route("/", overview, name="overview"),
    Route("/breakers/reset", reset_action, methods=["POST"], name="breaker_reset"),
]
