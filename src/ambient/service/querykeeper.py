"""The daemon keeps the query store (:mod:`ambient.query`) current, from a thread of its own.

After each tick (its last evaluator pokes it) and every ``idle_s`` (run tasks append to journals between ticks), the
keeper refreshes the store: at most every ``min_interval_s``, in its own thread with its own connection, so the event
loop never waits on SQLite. The claims folder (tens of thousands of files on a big brain: listing it is the costly
part, and the thread holds the GIL the loop needs meanwhile) at most every ``claims_interval_s``, and no more than
``claims_share`` of a core whatever their number; journals, records
and escalations (what a page of runs shows live) at every refresh. Readers (``ambient status``, the console) refresh
before they read anyway: the keeper only makes that refresh cheap. A store that cannot be written costs only speed:
the failure is logged once, the daemon goes on.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ambient.core.lazylog import get_logger
from ambient.query.store import QueryStore

if TYPE_CHECKING:
    from ambient.engine.tick import Tick
    from ambient.storage.paths import BrainPaths

log = get_logger(__name__)


class QueryKeeper:
    """A thread refreshing the query store when poked (debounced), and every ``idle_s`` otherwise."""

    name = "query_store"

    def __init__(
        self,
        paths: BrainPaths,
        *,
        min_interval_s: float = 0.2,
        idle_s: float = 1.0,
        claims_interval_s: float = 2.0,
        claims_share: float = 0.05,
        on_change: Callable[[set[str]], None] | None = None,
        clocks: tuple[Callable[[], float], Callable[[], float]] = (time.monotonic, time.thread_time),
    ) -> None:
        self.store = QueryStore(paths)
        self.min_interval_s = min_interval_s
        self.idle_s = idle_s
        self.claims_interval_s = claims_interval_s
        # The claims are listed whole (every name of claims/, compared with every row): a cost that grows with
        # every claim the brain keeps. A daemon of many fan-outs spent more of each run listing them than the one
        # before (bench/fanout.py: after 24 runs of 1,000 items, ~0.35 s of this thread's CPU per run against
        # ~0 for the third). So the gap between two refreshes with the claims is also at least their CPU time
        # over ``claims_share``: at most that share of a core, however many claims (``claims_interval_s=0``:
        # every refresh has them).
        self.claims_share = claims_share
        self._claims_gap = claims_interval_s
        self._monotonic, self._cpu = clocks
        self._claims_at = -claims_interval_s  # when the claims were last refreshed (monotonic)
        self.on_change = on_change  # called from the keeper's thread with the topics that changed
        self.refreshes = 0
        self._poked = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed = False

    def start(self) -> None:
        """Start the thread (a first refresh at once)."""
        self._poked.set()
        self._thread = threading.Thread(target=self._run, name="ambient-query-store", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """Something was written: refresh soon (thread-safe, never blocks)."""
        self._poked.set()

    async def evaluate(self, tick: Tick) -> None:
        """As the engine's last evaluator: each tick may have written, so the store is refreshed after it."""
        self.poke()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (waiting ``timeout`` at most for a refresh under way) and close the store.

        No last refresh: on a brain with a long history a full one (every claim file) took seconds of a stop that
        must end in time (service/stopping.py), and the store is a cache that every reader refreshes first. A
        refresh still under way at ``timeout`` keeps its store; the process's end takes both along.
        """
        self._stop.set()
        self._poked.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("query_store_left_refreshing", after_s=timeout)
                return
        self.store.close()

    def _run(self) -> None:
        last = 0.0
        while True:
            self._poked.wait(self.idle_s)
            if self._stop.is_set():
                break
            wait = last + self.min_interval_s - time.monotonic()
            if wait > 0 and self._stop.wait(wait):
                break
            self._poked.clear()
            last = time.monotonic()
            self.refresh_once()

    def refresh_once(self, *, claims: bool | None = None) -> set[str]:
        """One refresh (with the claims when ``claims``, or when None and ``claims_interval_s`` has passed since
        they were last refreshed); the topics that changed (none when the store could not be written)."""
        now = self._monotonic()
        if claims is None:
            claims = now - self._claims_at >= self._claims_gap
        cpu = self._cpu()
        try:
            changed = self.store.refresh(claims=claims)
        except (sqlite3.Error, OSError) as exc:
            if not self._failed:  # once: a read-only .ambient/ would say it every second
                log.warning("query_store_not_kept", error=str(exc), path=str(self.store.path))
                self._failed = True
            return set()
        self.refreshes += 1
        if claims:
            self._claims_at = now
            if self.claims_interval_s > 0:
                self._claims_gap = max(self.claims_interval_s, (self._cpu() - cpu) / self.claims_share)
        if changed and self.on_change is not None:
            try:
                self.on_change(changed)
            except Exception as exc:  # a listener's bug must not stop the keeper
                log.exception("query_store_listener_failed", error=str(exc))
        return changed
