"""``/``: the overview (daemon, runs in progress, escalations waiting, last errors, breakers, cost today)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ambient.service.instance import daemon_up
from ambient.storage.paths import BrainPaths
from ambient.web.render import render


async def overview(request: Request) -> Response:
    paths: BrainPaths = request.app.state.paths
    return render(request, "overview.html", {"daemon": {"up": daemon_up(paths)}})


routes = [Route("/", overview, name="overview")]
