"""The console's access to the query store: one store (one SQLite connection) per server process, used from one
worker thread only, so that reading or refreshing never runs on the event loop and never contends with itself.

Every read refreshes first (cheap when nothing changed: a few ``stat`` calls), so a page is never stale even when
the watcher has not fired yet or no daemon runs; except a live part's fetch at a change generation the store was
already refreshed at (see :mod:`ambient.web.fragcache`): after a change, 50 open pages cost no refresh at all, the
hub's teller refreshed before it told them (:meth:`ambient.web.live.Hub._tell`).

The claims folder (tens of thousands of names on a big brain: listing it was most of the console's CPU while a
daemon ran workflows) is listed by the teller at most every ``CLAIMS_INTERVAL_S`` (:meth:`claims_wait`), and by a
whole page's read; the ``claims`` topic is told once they are.
"""

from __future__ import annotations

import asyncio
import copy
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar, cast

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from ambient.core.errors import AmbientError
from ambient.core.lazylog import get_logger
from ambient.query.store import QueryStore
from ambient.query.views import EscalationRow
from ambient.storage.paths import BrainPaths
from ambient.web.fragcache import shared_fetch

log = get_logger(__name__)

T = TypeVar("T")

#: How long a shared read serves the live parts of a page at one generation (as their shared render).
SHARED_MAX_AGE_S = 2.0


class StoreThread:
    """The query store of one server process and the single thread that uses it."""

    def __init__(self, paths: BrainPaths) -> None:
        self.paths = paths
        self._store: QueryStore | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._fresh_at: int | None = None  # the hub's change generation when the last refresh began
        self._claims_at = -float("inf")  # when the claims were last listed (monotonic)
        self._shared: tuple[int, object, object, float] | None = None  # the last shared read: (generation, fn,
        # result, when): what no watcher tells (the day of "today's cost") is bounded by SHARED_MAX_AGE_S

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ambient-web-store")
        return self._pool

    def _opened(self) -> QueryStore:
        if self._store is None:
            self._store = QueryStore.fresh(self.paths)
        return self._store

    def _refresh(self, generation: int | None = None, claims: bool = True) -> set[str]:
        self._fresh_at = generation  # set first: a refresh that fails leaves it as it was told, not older
        if claims:
            self._claims_at = time.monotonic()
        store = self._opened()
        try:
            return store.refresh(claims=claims)
        except sqlite3.Error as exc:  # a store that cannot be written: the reader still answers from the last state
            log.warning("web_store_refresh_failed", error=str(exc))
            return set()

    async def refresh(self, generation: int | None = None, *, claims: bool = True) -> set[str]:
        """Bring the store up to date (in the store's thread); the topics the store saw change. ``generation``:
        the generation the refresh is fresh for (it begins after every change told by then). ``claims=False``
        leaves the claims folder for a later refresh (a store just built lists it anyway)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor(), self._refresh, generation, claims)

    def claims_wait(self, interval_s: float) -> float:
        """Seconds until the claims may be listed again, at most every ``interval_s`` (0: now)."""
        return max(0.0, self._claims_at + interval_s - time.monotonic())

    def fresh_for(self, generation: int | None) -> bool:
        """Whether a refresh began at ``generation`` or later (it holds every change told by then)."""
        fresh = self._fresh_at
        return generation is not None and fresh is not None and fresh >= generation

    async def read(
        self, fn: Callable[[sqlite3.Connection], T], *, generation: int | None = None, share: bool = False
    ) -> T:
        """``fn(conn)`` on a freshly refreshed store, in one read transaction, in the store's thread. Given the
        hub's change ``generation`` (a live part's fetch), the refresh is skipped when one already began at it or
        later; with ``share``, the same ``fn`` read at the same generation is read once (each caller gets a shallow
        copy): the live parts of one page read the same data, one render each."""

        def run() -> T:
            if not self.fresh_for(generation):
                self._refresh(generation)
            elif self._kept(share, generation, fn):
                assert self._shared is not None
                return cast("T", copy.copy(self._shared[2]))
            with self._opened().reading() as conn:
                result = fn(conn)
            if share and generation is not None:
                self._shared = (generation, fn, result, time.monotonic())
                return copy.copy(result)
            return result

        return await asyncio.get_running_loop().run_in_executor(self._executor(), run)

    def _kept(self, share: bool, generation: int | None, fn: object) -> bool:
        """Whether the last shared read is ``fn``'s at ``generation``, young enough to serve again."""
        kept = self._shared
        if not share or kept is None or kept[:2] != (generation, fn):
            return False
        return time.monotonic() - kept[3] <= SHARED_MAX_AGE_S

    def close(self) -> None:
        """Stop the thread and close the connection (server shutdown)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._store is not None:
            self._store.close()
            self._store = None


async def read(request: Request, fn: Callable[[sqlite3.Connection], T], *, share: bool = False) -> T:
    """For a page: ``fn(conn)`` on the console's store, refreshed, off the event loop. A live part's fetch may
    skip the refresh when the store was refreshed at the current change generation; a whole page never does (it
    follows an action whose files the watcher may not have told yet). ``share``: ``fn`` reads the same for every
    live part of the page (a module function, not a closure over the request), so the parts fetched after one
    change read it once."""
    store: StoreThread = request.app.state.store
    live = request.method == "GET" and shared_fetch(request.query_params.keys())
    return await store.read(fn, generation=request.app.state.hub.generation() if live else None, share=live and share)


async def predictions(request: Request, rows: Sequence[EscalationRow]) -> dict[str, str]:
    """What learned rules would choose for the pending escalations among ``rows``, by id, shown on their cards; a
    rules file that cannot be read shows none (the questions are still there)."""
    from ambient.human.escalations import Escalation
    from ambient.learning.rulestore import escalation_predictions, rules_path

    paths: BrainPaths = request.app.state.paths
    pending = [r.data for r in rows if r.status == "pending"]
    if not pending:
        return {}

    def compute() -> dict[str, str]:
        try:
            return escalation_predictions(rules_path(paths), [Escalation.model_validate(d) for d in pending])
        except (AmbientError, OSError, ValueError):
            return {}

    return await run_in_threadpool(compute)
