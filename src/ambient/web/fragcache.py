"""One render of a live part for every open page: the fragments (``?fragment=NAME``) that ``app.js`` fetches after a
change are the same bytes for every open page of a browser (one sign-in, one CSRF secret) until the data changes
again.

Why: after each change every open page fetches its live parts at once, and each fetch refreshed the query store and
rendered its Jinja block, in the console's process (the daemon's, when it hosts the console: the renders took the
GIL its loop needs). Here the first fetch of a (URL, fragment) at the hub's current change *generation* renders;
the others arriving meanwhile wait for that render (single flight) and every later one at the same generation gets
its bytes, so 50 pages cost one render per part per change.

Why never stale: the hub bumps its generation before it tells any page of a change (:meth:`ambient.web.live.Hub.
publish`), after the file was written. A render started at generation G refreshed the store after the bump, so it
holds every change told by G; a later change bumps to G+1 before the pages hear of it, and their fetches at G+1 miss
the cache. What no watcher tells (a relative time, a folder not watched) is bounded by ``max_age_s``; without a
running watcher (the generation is None) nothing is cached.

Only fragments are cached, and only plain ones: a GET of ``?fragment=`` without a notice or a kept form, answered
200 without a cookie. Whole pages, notices and actions always go through. The key holds everything a render reads
of the request (scheme, Host, path, the sign-in's CSRF secret, query without the token).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ambient.web.security import CSRF_SCOPE

#: Query fields that make a request someone's own (an action's notice, a refused form's fields): never cached.
_PERSONAL: Final = ("notice", "level", "form_")
#: Query fields left out of the key (the token is taken off by the security middleware before this runs anyway).
_UNKEYED: Final = frozenset({"token"})

Key = tuple[str, str, str, str, str, tuple[tuple[str, str], ...]]


def shared_fetch(fields: Iterable[str]) -> bool:
    """Whether a GET with these query fields is a live part's fetch that any open page could have made: a
    ``fragment``, without a notice or a kept form."""
    names = set(fields)
    return "fragment" in names and not any(k.startswith(_PERSONAL) for k in names)


def fragment_key(scope: Scope) -> Key | None:
    """The cache key of a request, or None when it must not be cached (not a GET of a fragment, or personal)."""
    if scope.get("type") != "http" or scope.get("method") != "GET":
        return None
    query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    if not shared_fetch(k for k, _ in query):
        return None
    host = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"host"), "")
    kept = tuple(sorted((k, v) for k, v in query if k not in _UNKEYED))
    csrf = str(scope.get(CSRF_SCOPE, ""))  # a fragment's forms carry their sign-in's CSRF secret: shared per browser
    return (scope.get("scheme", "http"), host, scope.get("root_path", ""), scope["path"], csrf, kept)


def _cacheable(start: Message) -> bool:
    headers = start.get("headers", ())
    return start.get("status") == 200 and not any(k.lower() == b"set-cookie" for k, _ in headers)


@dataclass
class _Entry:
    """One render: its generation, when it finished, and its messages once done (None: not to be shared)."""

    generation: int
    done: asyncio.Event = field(default_factory=asyncio.Event)
    messages: list[Message] | None = None
    at: float = 0.0


class FragmentCache:
    """ASGI middleware: identical fragment fetches at one change generation share one render (see the module)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        generation: Callable[[], int | None],
        max_entries: int = 128,
        max_age_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.generation = generation
        self.max_entries = max_entries
        self.max_age_s = max_age_s
        self.clock = clock
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()
        self.renders = 0  # renders this cache let through (what the tests count)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        generation = self.generation()
        key = fragment_key(scope) if generation is not None else None
        if key is None or generation is None:
            await self.app(scope, receive, send)
            return
        entry = self._entries.get(key)
        if entry is not None and entry.generation == generation:
            await entry.done.wait()
            if entry.messages is not None and self.clock() - entry.at <= self.max_age_s:
                self._entries.move_to_end(key)
                await _replay(entry.messages, send)
                return
            if entry.messages is None:  # that render was not to be shared (an error, a 400): render ours
                await self.app(scope, receive, send)
                return
        await self._render(key, generation, scope, receive, send)

    async def _render(self, key: Key, generation: int, scope: Scope, receive: Receive, send: Send) -> None:
        entry = _Entry(generation)
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        messages: list[Message] = []

        async def capture(message: Message) -> None:
            messages.append(message)

        self.renders += 1
        try:
            await self.app(scope, receive, capture)
            start = messages[0] if messages else {}
            if start.get("type") == "http.response.start" and _cacheable(start):
                entry.messages = messages
                entry.at = self.clock()
        finally:
            entry.done.set()
            if entry.messages is None and self._entries.get(key) is entry:
                del self._entries[key]
        await _replay(messages, send)


async def _replay(messages: list[Message], send: Send) -> None:
    """Send a captured response again (fresh header lists: the outer middlewares add theirs to each copy)."""
    for message in messages:
        copy = dict(message)
        if "headers" in copy:
            copy["headers"] = list(copy["headers"])
        await send(copy)
