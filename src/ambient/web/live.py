"""The live layer: one watcher per server process turns the files the daemon writes into topics, refreshes the
query store (in its own thread), then tells every open page which topics changed, by server-sent events.

**Why watchfiles (inotify), not stat polling.** A journal grows by appends, which leave its folder's mtime alone:
polling would have to stat every journal (thousands of finished runs) every tick, or guess which are live. inotify
names exactly the file that changed, costs nothing while the brain is quiet, and the daemon already relies on it
(:mod:`ambient.service.watch`). The watches are non-recursive, on a handful of folders (below); only the daemon's
liveness is polled (once a second: a ``kill -9`` writes no file, only the ``flock`` on ``daemon.lock`` tells).

Clients never touch the files: each has a bounded queue; one that falls behind gets a single ``resync`` (the page
re-fetches every live part) instead of an unbounded backlog, and past ``max_clients`` a new one gets 503.

**Why one teller, a frame late.** A dropped workflow makes the daemon write a burst of files (the journal, the
claims, ``runs.jsonl``, locks) over a few hundred ms, and every change told makes every open page fetch its live
parts. The watcher only notes what changed; one task, the teller, waits ``FRAME_S`` after the first change (the
engine's turn first: its SPAWN never waits on the console, and the rest of the burst joins), refreshes the store
once, moves the change generation, then hands every page the same pre-encoded bytes. Fifty tabs cost one refresh
and one render of each live part per frame (:mod:`ambient.web.fragcache`), no refresh per fetch, no task per event
per tab; heartbeats are one timer for all. The claims folder (20,000 names listed: most of the console's CPU during
a burst) is listed at most every ``CLAIMS_INTERVAL_S``, and ``claims`` is told once it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Final

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ambient.core.lazylog import get_logger
from ambient.service.instance import daemon_up
from ambient.storage.fsutil import TMP_MARK, private_dir
from ambient.storage.paths import BrainPaths
from ambient.web.storethread import StoreThread

log = get_logger(__name__)

#: Every topic a page may listen to (plus ``run:<run_id>``).
TOPICS: Final = frozenset(
    {"daemon", "runs", "escalations", "claims", "locks", "records", "now", "breakers", "grants", "workers"}
)
QUEUE_SIZE: Final = 32
HEARTBEAT_S: Final = 15.0
DAEMON_POLL_S: Final = 1.0
#: How long the teller waits after a change before it refreshes and tells: what a burst of the daemon's writes is
#: coalesced over, and the engine's head start over the console's work.
FRAME_S: Final = 0.1
#: The claims folder is listed for the pages at most this often (the daemon's keeper lists it every 2 s too).
CLAIMS_INTERVAL_S: Final = 2.0
HEARTBEAT: Final = b": heartbeat\n\n"
RESYNC: Final = b"event: resync\ndata: {}\n\n"
#: Files of ``.ambient/`` itself and the topic each one's change means.
_STATE_FILES: Final = {
    "runs.jsonl": ("records", "runs"),
    "daemon.json": ("daemon",),
    "now.json": ("now",),
    "breaker.json": ("breakers",),
    "workers.json": ("workers",),
}


def watched_dirs(paths: BrainPaths) -> list[Path]:
    """The folders watched (non-recursively): the state folder, the journals, escalations, claims, locks, and the AI
    runner's state (its ``grants.json``)."""
    return [paths.state, paths.run_journals, paths.escalations, paths.claims, paths.locks, _ai_state(paths)]


def _ai_state(paths: BrainPaths) -> Path:
    return paths.state / "claude"


def topics_of(paths: BrainPaths, changed: Iterable[str]) -> set[str]:
    """The topics a batch of changed paths means (a pure mapping; ambient's temp files and the store mean none)."""
    topics: set[str] = set()
    state, journals = str(paths.state), str(paths.run_journals)
    esc, claims, locks = str(paths.escalations), str(paths.claims), str(paths.locks)
    ai = str(_ai_state(paths))
    for raw in changed:
        folder, _, name = raw.rpartition("/")
        if TMP_MARK in name or name.startswith("."):
            continue
        if folder == journals and name.endswith(".jsonl"):
            topics |= {"runs", f"run:{name.removesuffix('.jsonl')}"}
        elif folder == esc:
            topics.add("escalations")
        elif folder == claims:
            topics.add("claims")
        elif folder == locks:
            topics.add("locks")
        elif folder == ai and name == "grants.json":
            topics.add("grants")
        elif folder == state and name in _STATE_FILES:
            topics.update(_STATE_FILES[name])
    return topics


class Client:
    """One open page: a bounded queue of events (the bytes every page gets); overflow collapses into one
    ``resync``."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=QUEUE_SIZE)

    def offer(self, event: bytes | None) -> None:
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(RESYNC)

    def beat(self) -> None:
        """A heartbeat, unless events are waiting anyway (they keep the connection alive as well)."""
        if self.queue.empty():
            self.queue.put_nowait(HEARTBEAT)


def change_event(topics: Iterable[str]) -> bytes:
    """The ``change`` event naming ``topics``, encoded once for every page."""
    return f"event: change\ndata: {json.dumps({'topics': sorted(topics)})}\n\n".encode()


class Hub:
    """The one watcher of a server process and the open pages it tells."""

    def __init__(
        self,
        paths: BrainPaths,
        store: StoreThread,
        *,
        max_clients: int = 64,
        frame_s: float = FRAME_S,
        claims_interval_s: float = CLAIMS_INTERVAL_S,
    ) -> None:
        self.paths = paths
        self.store = store
        self.max_clients = max_clients
        self.frame_s = frame_s
        self.claims_interval_s = claims_interval_s
        self._pending: set[str] = set()  # topics noted and not told yet
        self._claims_owed = False  # claims changed and were not listed yet (the interval)
        self._wake = asyncio.Event()
        self._later: asyncio.TimerHandle | None = None
        self.tells = 0  # frames told (what the tests count)
        self.clients: set[Client] = set()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._daemon: bool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: How many changes were told (bumped before the pages hear of one): what a render is fresh for.
        self.changes = 0

    # -- clients --------------------------------------------------------------------------------------------------

    def subscribe(self) -> Client | None:
        """A new client, or None when ``max_clients`` are already connected."""
        if len(self.clients) >= self.max_clients or self._stop.is_set():
            return None
        client = Client()
        self.clients.add(client)
        return client

    def unsubscribe(self, client: Client) -> None:
        self.clients.discard(client)

    def publish(self, topics: Iterable[str]) -> None:
        """Tell every client that ``topics`` changed, now (never blocks: a full queue becomes a ``resync``); the
        change generation moves first, so the fetches this causes never get a render made before it. The watcher's
        changes go through :meth:`note` instead (coalesced, the store refreshed first)."""
        topics = set(topics)
        if not topics:
            return
        self.changes += 1
        event = change_event(topics)
        for client in list(self.clients):
            client.offer(event)

    def note(self, topics: Iterable[str]) -> None:
        """``topics`` changed: told with whatever else changes within the frame (:meth:`_tell`)."""
        self._pending.update(topics)
        if self._pending:
            self._wake.set()

    def close_clients(self) -> None:
        """End every open stream (server shutdown): their generators return, so the server can stop at once."""
        self._stop.set()
        for client in list(self.clients):
            client.offer(None)

    def close_clients_threadsafe(self) -> None:
        """:meth:`close_clients` from another thread or a signal handler."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                self._loop.call_soon_threadsafe(self.close_clients)

    def generation(self) -> int | None:
        """The change generation while the watcher runs (a render at one generation holds every change told by
        then); None when no watcher tells changes (unit tests, a brain without folders): then every read refreshes
        and nothing is shared."""
        tasks = self._tasks
        watching = bool(tasks) and not tasks[0].done()
        return self.changes if watching else None

    # -- the watcher ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the watcher and the daemon poll (once; the store is refreshed first so the first page is fresh)."""
        if self._tasks:
            return
        self._loop = asyncio.get_running_loop()
        await self.refresh()
        ready = asyncio.Event()
        self._tasks = [
            asyncio.create_task(self._watch(ready), name="ambient-web-watch"),
            asyncio.create_task(self._poll_daemon(), name="ambient-web-daemon"),
            asyncio.create_task(self._tell(), name="ambient-web-tell"),
            asyncio.create_task(self._heartbeat(), name="ambient-web-heartbeat"),
        ]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ready.wait(), 5)

    async def stop(self) -> None:
        self.close_clients()
        if self._later is not None:
            self._later.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []

    async def refresh(self, generation: int | None = None, *, claims: bool = True) -> set[str]:
        """Bring the query store up to date (in its own thread, never on the event loop); the topics it saw.
        ``generation``: what the refresh is fresh for (default: the generation now)."""
        try:
            return await self.store.refresh(self.generation() if generation is None else generation, claims=claims)
        except Exception as exc:  # noqa: BLE001 - a store that cannot refresh must not end the live layer
            log.warning("web_store_refresh_failed", error=str(exc))
            return set()

    async def _tell(self) -> None:
        """The one teller: a frame after the first change noted, one refresh of the store (the claims when they
        changed and their interval passed, else owed to a later frame), the generation moved to the one the
        refresh is fresh for, and one ``change`` event, the same bytes, queued for every page."""
        while True:
            await self._wake.wait()
            await asyncio.sleep(self.frame_s)  # the engine's burst first; the rest of it joins this frame
            self._wake.clear()
            topics, self._pending = self._pending, set()
            owed = self._claims_owed or "claims" in topics
            topics.discard("claims")
            wait = self.store.claims_wait(self.claims_interval_s) if owed else 0.0
            listed = owed and wait <= 0
            self._claims_owed = owed and not listed
            if self._claims_owed and self._later is None:
                self._later = asyncio.get_running_loop().call_later(wait, self._owed_due)
            if not topics and not listed:
                continue
            generation = self.changes + 1
            seen = await self.refresh(generation, claims=listed)
            if not listed:
                seen.discard("claims")  # a store just rebuilt says so: told once they are listed
            else:
                seen.add("claims")
            self.changes = max(self.changes, generation - 1)
            self.tells += 1
            self.publish(topics | seen)

    def _owed_due(self) -> None:
        self._later = None
        self._wake.set()

    async def _heartbeat(self) -> None:
        """A comment to every open stream every ``HEARTBEAT_S`` (one timer for all; proxies keep them open)."""
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), HEARTBEAT_S)
            if self._stop.is_set():
                return
            for client in list(self.clients):
                client.beat()

    async def _watch(self, ready: asyncio.Event) -> None:
        from watchfiles import awatch

        for folder in (self.paths.state, self.paths.run_journals, self.paths.escalations, _ai_state(self.paths)):
            private_dir(folder)  # the daemon makes them too (0700); watched from the start, not once they appear
        dirs = [d for d in watched_dirs(self.paths) if d.is_dir()]
        ready.set()
        if not dirs:
            return
        async for changes in awatch(
            *dirs,
            debounce=50,
            step=10,
            stop_event=self._stop,
            recursive=False,
            ignore_permission_denied=True,
            watch_filter=None,
        ):
            topics = topics_of(self.paths, (p for _, p in changes))
            if topics:
                self.note(topics)

    async def _poll_daemon(self) -> None:
        while not self._stop.is_set():
            up = await asyncio.to_thread(daemon_up, self.paths)
            if self._daemon is not None and up != self._daemon:
                self.note({"daemon", "runs"})
            self._daemon = up
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), DAEMON_POLL_S)

    # -- the SSE stream ---------------------------------------------------------------------------------------------

    async def stream(self, client: Client) -> AsyncIterator[bytes]:
        """The event stream of one client: a retry hint, then events and heartbeat comments until it goes."""
        try:
            yield b"retry: 2000\n\n"
            while True:
                event = await client.queue.get()
                if event is None:
                    return
                yield event
        finally:
            self.unsubscribe(client)


async def events(request: Request) -> Response:
    """``GET /events``: the server-sent events of the live layer (``change`` with topics, ``resync``)."""
    hub: Hub = request.app.state.hub
    client = hub.subscribe()
    if client is None:
        return PlainTextResponse("Too many live pages open; close some tabs.", status_code=503)
    return StreamingResponse(
        hub.stream(client),
        media_type="text/event-stream",
        headers={"X-Accel-Buffering": "no"},
    )


def events_route() -> Route:
    return Route("/events", events, name="events")
