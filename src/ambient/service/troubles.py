"""The daemon's troubles as the person sees them: a log line, one notification, and ``.ambient/state/health.json``.

The rules (which errors are the daemon's, what to say) are :mod:`ambient.core.health`; this is the thin shell around
them. ``ambient status`` and ``ambient doctor`` read the file while the daemon runs (:func:`read_health`), and
check the disk themselves (:mod:`ambient.service.diskfree`), since a full disk is exactly when the file cannot be
rewritten.
:meth:`Troubles.held_up` guards the daemon's own writes: work a shortage holds up waits for the end of it, it does
not fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import cast, get_args

import structlog
from pydantic import ValidationError

from ambient.core.clock import Clock
from ambient.core.health import Health, Resource, cleared, describe, noted, resource_of
from ambient.storage.fsutil import PRIVATE_FILE, atomic_write
from ambient.storage.paths import BrainPaths

log = structlog.get_logger("ambient.service.troubles")

_RESOURCES = get_args(Resource)
_REWRITE_EVERY_S = 5.0  # a trouble seen again and again rewrites the file at most this often
#: After a write the disk had no room for (or a descriptor shortage), the engine looks again this soon.
_HELD_UP_RETRY_S = 2.0

Inform = Callable[[str, str], Awaitable[None]]


def health_file(paths: BrainPaths) -> Path:
    return paths.state / "health.json"


class Troubles:
    """What the daemon is short of now. ``trouble`` is called from the event loop (or a thread: it only logs and
    writes a small file); a new trouble is told once, its end is logged."""

    def __init__(
        self,
        paths: BrainPaths,
        clock: Clock,
        inform: Inform | None = None,
        retry: Callable[[], None] | None = None,
        *,
        on_recovered: Callable[[str], None] | None = None,
        on_short: Callable[[str], None] | None = None,
    ) -> None:
        self.paths = paths
        self.clock = clock
        self.inform = inform
        self.retry = retry  # wakes the engine: work held up by a shortage is looked at again (held_up)
        self.health = Health()
        self._written_at = 0.0
        self.on_recovered = on_recovered  # e.g. rewrite what a full disk kept unwritten
        self.on_short = on_short  # e.g. give back descriptors a cache holds

    def start(self) -> None:
        """A new daemon starts healthy: the last one's troubles are not ours."""
        self._write()

    def trouble(self, kind: str, message: str) -> None:
        if kind not in _RESOURCES:
            return
        if self.on_short is not None:
            self.on_short(kind)
        self.health, new = noted(self.health, cast(Resource, kind), message, self.clock.now())
        if new:
            log.error("daemon_trouble", kind=kind, message=message)
            self._tell(f"ambient: {message.split(';')[0]}", message)
        if new or time.monotonic() - self._written_at >= _REWRITE_EVERY_S:
            self._write()

    def recovered(self, kinds: Sequence[str]) -> None:
        ended = False
        for kind in kinds:
            if kind in self.health.conditions:
                self.health, cond = cleared(self.health, cast(Resource, kind))
                if cond is not None:
                    log.info("daemon_trouble_over", kind=kind, since=cond.since.isoformat(), seen=cond.count)
                    ended = True
                    if self.on_recovered is not None:
                        self.on_recovered(kind)
        if ended:
            self._write()

    def held_up(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the daemon ran out of something (a full disk, descriptors): then it is told once
        (log, status, doctor, a notification), the engine looks again shortly, and the caller leaves the work for
        then instead of failing it."""
        kind = resource_of(exc)
        if kind is None:
            return False
        where = getattr(exc, "filename", None)
        place = str(Path(where).parent) if isinstance(where, str) else str(self.paths.state)
        self.trouble(kind, describe(kind, getattr(exc, "strerror", None) or str(exc), place))
        log.warning("waiting_for_resources", resource=kind, error=str(exc))
        if self.retry is not None:
            asyncio.get_running_loop().call_later(_HELD_UP_RETRY_S, self.retry)
        return True

    def tried(self, job: Callable[[], object]) -> bool:
        """Run ``job``; False when it could not for want of a resource (:meth:`held_up`), other errors raised."""
        try:
            job()
        except OSError as exc:
            if not self.held_up(exc):
                raise
            return False
        self.recovered(["disk"])
        return True

    async def save_or_wait(self, save: Callable[[], None]) -> None:
        """A small state file (workflows.json): written, or left for the next save when the disk is full (what it
        records is in memory, and the runs it guards have their journals on disk already)."""
        try:
            await asyncio.to_thread(save)
        except OSError as exc:
            if not self.held_up(exc):
                raise

    def _tell(self, title: str, body: str) -> None:
        if self.inform is None:
            return
        with contextlib.suppress(RuntimeError):  # no running loop (a thread at shutdown): the log said it
            task = asyncio.get_running_loop().create_task(self._inform(title, body))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _inform(self, title: str, body: str) -> None:
        assert self.inform is not None
        try:
            await self.inform(title, body)
        except OSError as exc:  # the outbox is on the full disk too: the log line and status say it
            log.warning("daemon_trouble_not_notified", error=str(exc))

    def _write(self) -> None:
        self._written_at = time.monotonic()
        with contextlib.suppress(OSError):  # a full disk: status and doctor look at the disk themselves
            atomic_write(
                health_file(self.paths), self.health.model_dump_json(indent=1) + "\n", durable=False, mode=PRIVATE_FILE
            )


def read_health(paths: BrainPaths) -> Health:
    """The running daemon's troubles (empty when it wrote none or the file does not read)."""
    try:
        return Health.model_validate_json(health_file(paths).read_bytes())
    except (OSError, ValidationError, ValueError):
        return Health()
