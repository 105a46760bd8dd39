"""``/matrix``: the effective access matrix (kernel defaults, agents' gates, the routing table) as what each
principal may send to each other one, and an explain form giving the verdict and the rule of ``ambient matrix
explain`` (:func:`ambient.actions.explain.explain`, the same code; a GET). And what AI agents may do beyond their
``allowed_tools``: the calls a person allowed for good, each forgotten by ``POST /grants/forget``
(:func:`ambient.actions.grants.forget_grant`, the code of ``ambient grants forget``); and what each agent's process
may reach by TCP (its runner's ``network:``, as ``ambient matrix`` says it).
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ambient.actions.explain import agent_networks, explain, load_matrix, sends
from ambient.actions.grants import forget_grant, list_grants
from ambient.core.errors import AmbientError, InputError
from ambient.kernel.packet import Signal
from ambient.storage.paths import BrainPaths
from ambient.web.render import redirect_back, render


def _data(paths: BrainPaths, ask: dict[str, str]) -> dict[str, Any]:
    bm = load_matrix(paths)
    data: dict[str, Any] = {
        "sends": sends(bm),
        "problems": [str(p) for p in bm.problems],
        "routing": bm.routing,
        "routes_applied": len(bm.matrix.routing.routes) if bm.matrix.routing else 0,
        "verdict": None,
        "error": None,
        "grants": sorted(list_grants(paths).items()),
        "networks": agent_networks(paths, bm),
    }
    if ask["from"] and ask["to"] and ask["signal"]:
        files = [f.strip() for f in ask["files"].split(",") if f.strip()]
        try:
            data["verdict"] = explain(
                paths, ask["from"], ask["to"], ask["signal"], zone=ask["zone"] or None, files=files, matrix=bm
            )
        except InputError as exc:
            data["error"] = str(exc)
    return data


async def matrix_page(request: Request) -> Response:
    paths: BrainPaths = request.app.state.paths
    q = request.query_params
    ask = {k: (q.get(k) or "").strip()[:500] for k in ("from", "to", "signal", "zone", "files")}
    data = await run_in_threadpool(_data, paths, ask)
    return render(request, "matrix.html", {**data, "ask": ask, "signals": [s.value for s in Signal]})


async def forget_action(request: Request) -> Response:
    """``ambient grants forget AGENT [CALL]`` (form: ``agent``, ``call``; no call: every grant of the agent)."""
    paths: BrainPaths = request.app.state.paths
    form = await request.form()
    back = form.get("back") or "/matrix"
    agent = str(form.get("agent") or "").strip()
    call = str(form.get("call") or "") or None
    if not agent:
        return redirect_back(back, "Say which agent's grant to forget.", ok=False)
    try:
        done = await run_in_threadpool(forget_grant, paths, agent, call)
    except AmbientError as exc:
        return redirect_back(back, f"Refused, nothing changed: {exc}", ok=False)
    return redirect_back(back, done.message)


routes = [
    Route("/matrix", matrix_page, name="matrix"),
    Route("/grants/forget", forget_action, methods=["POST"], name="grants_forget"),
]
