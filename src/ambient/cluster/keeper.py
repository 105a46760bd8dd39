"""The daemon keeps ``.ambient/workers.json`` (:mod:`ambient.cluster.roster`): it watches the workers bucket and
writes the file when a heartbeat changes what it holds, at most once a second, so that ``ambient status``,
``doctor`` and the console show the workers without talking to the server (nor importing ``nats``).

A worker that stops deletes its record and leaves the file; one that dies stays in it, its heartbeat ageing, until
the readers call it lost. The watch is made again every 10 s and after any error: an update missed across a
reconnect costs at most that long.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ambient.cluster.dispatch import Dispatcher
from ambient.cluster.roster import HEARTBEAT_S, Heard, document, heard
from ambient.core.errors import NamespaceTakenError
from ambient.core.lazylog import get_logger
from ambient.storage.fsutil import atomic_write

log = get_logger(__name__)

#: The file is written at most this often (s).
WRITE_EVERY_S = 1.0
#: The watch is made again this often (s): a new watch delivers every record's latest state (a deletion too), so an
#: update a watch missed is made good within this (once, under load, a forgotten worker's deletion never reached
#: the file while the watch went on).
REWATCH_S = 10.0


class RosterKeeper:
    """Keeps the workers file of one dispatcher's server until cancelled."""

    def __init__(
        self, path: Path, dispatcher: Dispatcher, lost_after_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = path
        self.dispatcher = dispatcher
        self.lost_after_s = lost_after_s
        self.clock = clock
        self.heard: dict[str, Heard] = {}
        self._written: dict[str, Any] | None = None  # the last content written, without its time
        self._last = float("-inf")  # when it was written (monotonic)

    def dispatched(self) -> list[str]:
        return [a for a in self.dispatcher.dispatch if self.dispatcher.dispatches(a)]

    async def run(self) -> None:
        self.write()  # the dispatched agents are known before any worker is heard
        while True:
            try:
                await self._watch()
            except asyncio.CancelledError:
                raise
            except NamespaceTakenError:  # said once by the dispatcher; looked at again until the namespace is free
                self.write()
                await asyncio.sleep(HEARTBEAT_S)
            except Exception as exc:  # noqa: BLE001 - the server away: the heartbeats age, and the watch is made again
                log.warning("workers_watch_failed", error=str(exc))
                self.write()
                await asyncio.sleep(HEARTBEAT_S)

    async def _watch(self) -> None:
        from nats.errors import TimeoutError as NatsTimeout

        link = await self.dispatcher.link()
        await self.dispatcher.beat()  # every REWATCH_S: the namespace's holder record stays fresh
        watcher = await link.workers.watchall()
        started, initial = time.monotonic(), True
        try:
            while time.monotonic() - started < REWATCH_S:
                try:
                    update = await watcher.updates(timeout=WRITE_EVERY_S)
                except (TimeoutError, NatsTimeout):
                    update = False
                if update is None:
                    initial = False  # every stored record was delivered: the rest are live heartbeats
                elif update is not False:
                    self.take(update, initial)
                self.write()
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()

    def take(self, entry: Any, initial: bool) -> None:
        """One update of the bucket: a heartbeat, or a record deleted (the worker stopped)."""
        key = str(entry.key)
        if entry.operation in ("DEL", "PURGE") or not entry.value:
            self.heard.pop(key, None)
            return
        now = self.clock()
        seen = now
        created = getattr(entry, "created", None)
        if initial and created is not None and hasattr(created, "timestamp"):
            seen = min(now, float(created.timestamp()))  # stored before the daemon looked: when the server got it
        try:
            record = json.loads(entry.value)
        except ValueError:
            return
        found = heard(record, seen)
        if found is not None:
            self.heard[key] = found

    def write(self) -> None:
        """Write the file when what it holds changed (the heard workers, the dispatched agents), at most once every
        :data:`WRITE_EVERY_S`: a change held back is written by a later call (the watch calls at least that often)."""
        if time.monotonic() - self._last < WRITE_EVERY_S:
            return
        doc = document(self.heard.values(), self.dispatched(), self.lost_after_s, self.clock(), self.dispatcher.taken)
        content = {k: v for k, v in doc.items() if k != "written_at"}
        if content == self._written:
            return
        try:
            atomic_write(self.path, json.dumps(doc, separators=(",", ":")).encode(), mode=0o600, durable=False)
        except OSError as exc:  # a full disk: the next change tries again
            log.warning("workers_file_unwritten", error=str(exc))
            return
        self._written = content
        self._last = time.monotonic()


def forget(path: Path) -> None:
    """No ``cluster:`` any more: no workers to show."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
