"""``/escalations``: pending and answered escalations, filtered by workflow, agent and status, and
``POST /escalations/{id}/decide``: the answer, through :func:`ambient.actions.decide.decide` (the rules of
``ambient decide``), its outcome as a notice."""

from __future__ import annotations

import sqlite3
from typing import Any, Final

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ambient.actions.decide import decide
from ambient.query import views
from ambient.storage.paths import BrainPaths
from ambient.web.render import redirect_back, render
from ambient.web.storethread import predictions, read

#: The statuses a person filters by ("" = pending and answered, each in its section).
STATUSES: Final = ("pending", "answered", "expired", "cancelled")
#: Settled escalations shown at most (the newest).
SETTLED_SHOWN: Final = 100


def _data(conn: sqlite3.Connection, workflow: str | None, agent: str | None, status: str | None) -> dict[str, Any]:
    every = views.escalations(conn)
    rows = [e for e in every if (workflow is None or e.workflow == workflow) and (agent is None or e.agent == agent)]
    if status:
        rows = [e for e in rows if e.status == status]
    settled = [e for e in rows if e.status != "pending"]
    settled.sort(key=lambda e: e.answered_at or e.created_at, reverse=True)
    return {
        "pending": [e for e in rows if e.status == "pending"],
        "settled": settled[:SETTLED_SHOWN],
        "settled_total": len(settled),
        "workflows": sorted({e.workflow for e in every}),
        "agents": sorted({e.agent for e in every if e.agent}),
        "problems": views.escalation_problems(conn),
    }


async def escalations_page(request: Request) -> Response:
    q = request.query_params
    workflow, agent = q.get("workflow") or None, q.get("agent") or None
    status = q.get("status") or None
    if status is not None and status not in STATUSES:
        status = None
    data = await read(request, lambda conn: _data(conn, workflow, agent, status))
    data["predictions"] = await predictions(request, data["pending"])
    filters = {"workflow": workflow or "", "agent": agent or "", "status": status or ""}
    return render(request, "escalations.html", {**data, "filters": filters, "statuses": STATUSES})


async def decide_action(request: Request) -> Response:
    """Answer one escalation; refusals come back as the CLI words them (already answered elsewhere, expired...)."""
    paths: BrainPaths = request.app.state.paths
    form = await request.form()
    esc_id = request.path_params["esc_id"]
    option = str(form.get("option") or "").strip()
    note = str(form.get("note") or "").strip() or None
    back = form.get("back") or "/escalations"

    def answer(notice: str, *, ok: bool = True) -> Response:
        return redirect_back(back, notice, ok=ok, default="/escalations")

    if not option:
        return answer(f"{esc_id}: choose one of its options.", ok=False)
    result = await run_in_threadpool(decide, paths, esc_id, option, channel="web", note=note)
    if result.kind == "settled":
        return answer(result.message, ok=False)  # "...already answered: skip by ana via cli...; nothing was changed"
    if result.kind == "refused":
        return answer(f"Refused, nothing changed: {result.message}", ok=False)
    if result.kind in ("ended", "failed"):  # its run ended (not applied), or the answer could not be written
        return answer(result.message, ok=False)
    return answer(result.message)


routes = [
    Route("/escalations", escalations_page, name="escalations"),
    Route("/escalations/{esc_id}/decide", decide_action, methods=["POST"], name="decide"),
]
