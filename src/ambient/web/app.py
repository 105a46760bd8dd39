"""The console as one Starlette app: the pages of :mod:`ambient.web.pages`, the live events, the static files,
behind :class:`~ambient.web.security.SecurityMiddleware`.

The same app serves ``ambient web`` and the daemon's hosted console (:mod:`ambient.web.server`); it holds no
daemon object, only the brain's paths: everything it shows comes from the files, through the query store.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Final

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ambient.storage.paths import BrainPaths
from ambient.web import pages
from ambient.web.fragcache import FragmentCache
from ambient.web.live import Hub, events_route
from ambient.web.security import (
    SecurityMiddleware,
    SignIns,
    TokenFile,
    allowed_host_names,
    signins_path,
    token_path,
)
from ambient.web.storethread import StoreThread

STATIC: Final = Path(__file__).resolve().parent / "static"


class ServerTiming:
    """Adds ``Server-Timing: app;dur=<ms>`` to every HTTP response: the time from the request to its headers (a
    page's whole render), so ``bench/web.py`` can tell the server's time from the client's and the loopback's."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                dur = (time.perf_counter() - start) * 1000
                message["headers"] = [*message.get("headers", []), (b"server-timing", f"app;dur={dur:.1f}".encode())]
            await send(message)

        await self.app(scope, receive, timed)


def page_routes() -> list[BaseRoute]:
    """Every page module's ``routes``, in module name order (the overview's ``/`` included)."""
    routes: list[BaseRoute] = []
    for info in sorted(pkgutil.iter_modules(pages.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{pages.__name__}.{info.name}")
        routes.extend(getattr(module, "routes", ()))
    return routes


def create_app(
    paths: BrainPaths,
    *,
    token: str,
    secure_cookie: bool = False,
    bound_host: str = "127.0.0.1",
    extra_hosts: Iterable[str] = (),
    live: bool = True,
    max_clients: int = 64,
    persist_signins: bool = True,
) -> Starlette:
    """The console for the brain at ``paths``: every request needs ``token``, or the one that replaced it in the
    token file since (see :mod:`ambient.web.security`).

    ``bound_host`` is the address served (Host headers are checked against it), ``live`` starts the one file
    watcher of this server process (off in unit tests that only render), ``max_clients`` caps live connections,
    ``persist_signins`` keeps the browsers' sign-ins in ``.ambient/web/signins.json`` (else in memory only).
    """
    store = StoreThread(paths)
    hub = Hub(paths, store, max_clients=max_clients)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        if live:
            await hub.start()
        try:
            yield
        finally:
            await hub.stop()
            store.close()

    app = Starlette(
        routes=[
            *page_routes(),
            events_route(),
            Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
        ],
        middleware=[
            Middleware(ServerTiming),
            Middleware(
                SecurityMiddleware,
                tokens=TokenFile(token_path(paths), token),
                host_names=allowed_host_names(bound_host) | frozenset(extra_hosts),
                signins=SignIns(signins_path(paths) if persist_signins else None),
                secure_cookie=secure_cookie,
            ),
            Middleware(FragmentCache, generation=hub.generation),
        ],
        lifespan=lifespan,
    )
    app.state.paths = paths
    app.state.hub = hub
    app.state.store = store
    return app
