"""``/matrix``: the effective access matrix (kernel defaults, agents' gates, the routing table) as what each
principal may send to each other one, and an explain form giving the verdict and the rule of ``ambient matrix
explain`` (:func:`ambient.actions.explain.explain`, the same code). Read-only: the form is a GET.
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ambient.actions.explain import explain, load_matrix, sends
from ambient.core.errors import InputError
from ambient.kernel.packet import Signal
from ambient.storage.paths import BrainPaths
from ambient.web.render import render


def _data(paths: BrainPaths, ask: dict[str, str]) -> dict[str, Any]:
    bm = load_matrix(paths)
    data: dict[str, Any] = {
        "sends": sends(bm),
        "problems": [str(p) for p in bm.problems],
        "routing": bm.routing,
        "routes_applied": len(bm.matrix.routing.routes) if bm.matrix.routing else 0,
        "verdict": None,
        "error": None,
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


routes = [Route("/matrix", matrix_page, name="matrix")]
