"""``/claims``: claims open, waiting for a person, paused, stale (open past their TTL, by the claims rule) and the
problems of claim files, each with the gate actions legal for its status (:func:`ambient.actions.gates.
gate_actions_for`); the locks held under ``locks/`` with their holder and expiry. And ``POST /claims/{sess_id}/gate``:
a gate moved through :func:`ambient.actions.gates.move_gate`, the code of ``ambient gate`` (a run's waiting gate is
answered as ``ambient decide`` would).
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ambient.actions.gates import GATE_ACTIONS, gate_actions_for, move_gate
from ambient.actions.locks import release_lock
from ambient.claims.locks import LockManager
from ambient.config.brain import read_settings
from ambient.core.errors import AmbientError
from ambient.query import views
from ambient.storage.paths import BrainPaths
from ambient.web.render import redirect_back, render
from ambient.web.storethread import read

#: How each gate action reads on its button, and its colour (a primary move, a neutral one, or a destructive one).
GATE_BUTTONS: Final = {
    "approve": ("Approve", "primary"),
    "reject": ("Reject", "danger"),
    "gate": ("Hold at a gate", ""),
    "pause": ("Pause", ""),
    "resume": ("Resume", "primary"),
    "abort": ("Abort", "danger"),
}
OPEN_SHOWN: Final = 200


@dataclass(frozen=True)
class LockRow:
    """A lock as a person reads it: the file, its state, holder, expiry and token."""

    file: str
    state: str
    holder: str | None
    expires: float | None
    claimed_at: str | None
    token: int | None
    problem: str | None


def locks(paths: BrainPaths) -> list[LockRow]:
    """Every lock under ``locks/`` as :meth:`LockManager.list` judges it (held, expired, dead, malformed)."""
    if not paths.locks.is_dir():
        return []
    manager = LockManager(paths, check_filesystem=False)
    try:
        rows = []
        for s in manager.list():
            info = s.info
            rows.append(
                LockRow(
                    s.file,
                    str(s.state),
                    info.holder if info else None,
                    info.expires if info else None,
                    info.claimed_at if info else None,
                    info.token if info else None,
                    s.problem,
                )
            )
        return rows
    finally:
        manager.close()


def _default_ttl(paths: BrainPaths) -> timedelta:
    found = read_settings(paths, os.environ)
    settings = found.settings or found.salvaged
    hours = settings.stale_claim_hours if settings is not None else 24.0
    return timedelta(hours=hours)


def _data(conn: sqlite3.Connection, default_ttl: timedelta) -> dict[str, Any]:
    local = datetime.now(UTC).astimezone()
    tz = local.tzinfo
    assert tz is not None  # astimezone() always sets one
    stale = views.stale_claims(conn, local, tz, default_ttl)
    stale_ids = {row.sess_id for row, _ in stale}
    open_rows = [c for c in views.claims(conn, ("open",)) if c.sess_id not in stale_ids]
    return {
        "waiting": views.claims(conn, ("waiting_human",)),
        "paused": views.claims(conn, ("paused",)),
        "open": open_rows[-OPEN_SHOWN:],
        "open_total": len(open_rows),
        "stale": stale,
        "marked_stale": views.claims(conn, ("stale",)),
        "counts": views.claim_counts(conn),
        # A run's item waiting on its agent's question (or a failure) is answered there, not approved here.
        "questions": _questions_by_run(views.escalations(conn, status="pending")),
    }


def _questions_by_run(pending: list[views.EscalationRow]) -> dict[str, list[str]]:
    """run id → the ids of its pending questions that are not gates (a gate is answered by its claim's buttons)."""
    out: dict[str, list[str]] = {}
    for esc in pending:
        if esc.kind != "gate" and esc.run_id:
            out.setdefault(esc.run_id, []).append(esc.id)
    return out


async def claims_page(request: Request) -> Response:
    paths: BrainPaths = request.app.state.paths
    ttl = await run_in_threadpool(_default_ttl, paths)
    data = await read(request, lambda conn: _data(conn, ttl))
    held = await run_in_threadpool(locks, paths)
    return render(
        request,
        "claims.html",
        {
            **data,
            "locks": held,
            "now": time.time(),
            "default_ttl_h": ttl.total_seconds() / 3600,
            "gate_actions": gate_actions_for,
            "gate_buttons": GATE_BUTTONS,
        },
    )


async def gate_action(request: Request) -> Response:
    """``ambient gate ACTION SESS_ID [MESSAGE]`` (approve, reject, gate, pause, resume, abort); a refusal (the claim
    moved meanwhile: the action is no longer legal) reads like the CLI's."""
    paths: BrainPaths = request.app.state.paths
    form = await request.form()
    sess_id = request.path_params["sess_id"]
    action = str(form.get("action") or "").strip()
    message = str(form.get("message") or "").strip() or None
    back = form.get("back") or "/claims"
    if action not in GATE_ACTIONS:
        return redirect_back(
            back, f"{sess_id}: unknown action {action!r}; expected one of {', '.join(GATE_ACTIONS)}.", ok=False
        )
    try:
        outcome = await run_in_threadpool(move_gate, paths, sess_id, action, message, channel="web")
    except AmbientError as exc:
        return redirect_back(back, f"Refused, nothing changed: {exc}", ok=False)
    return redirect_back(back, outcome.message)


async def release_action(request: Request) -> Response:
    """``ambient lock release FILE HOLDER --token N`` (form: ``file``, ``holder``, ``token`` as the page read them):
    a lock that changed hands since the page was drawn is refused with the CLI's message."""
    paths: BrainPaths = request.app.state.paths
    form = await request.form()
    back = form.get("back") or "/claims"
    file = str(form.get("file") or "").strip()
    holder = str(form.get("holder") or "").strip()
    raw_token = str(form.get("token") or "").strip()
    if not file or not holder:
        return redirect_back(back, "Say which lock to release: its file and its holder.", ok=False)
    if raw_token and not raw_token.isdigit():
        return redirect_back(back, f"Refused, nothing changed: token {raw_token!r} is not a number.", ok=False)
    token = int(raw_token) if raw_token else None
    try:
        text = await run_in_threadpool(lambda: release_lock(paths, file, holder, token=token))
    except AmbientError as exc:
        return redirect_back(back, f"Refused, nothing changed: {exc}", ok=False)
    return redirect_back(back, text)


routes = [
    Route("/claims", claims_page, name="claims"),
    Route("/locks/release", release_action, methods=["POST"], name="lock_release"),
    Route("/claims/{sess_id}/gate", gate_action, methods=["POST"], name="gate"),
]
