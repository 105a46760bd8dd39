"""The scope locks of running agents kept alive: renewed while their agents run, and an agent stopped when a lease
of its scope is lost anyway (a daemon held up past ``lock_ttl_min``, another holder took the lock over)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from ambient.claims.locks import LockGrant, LockManager
from ambient.core.errors import AmbientError
from ambient.core.lazylog import get_logger
from ambient.runners import AgentResult

log = get_logger(__name__)


class Leases:
    """The scope locks running agents hold, renewed at a third of their TTL while the agents run: an agent that runs
    longer than ``lock_ttl_min`` keeps its scope (a contender takes over an expired lock). One timer for all of
    them, not one task per agent (a fan-out holds a lock per item)."""

    def __init__(self, locks: LockManager, clock: Callable[[], float] = time.time) -> None:
        self.locks = locks
        self.clock = clock
        self._held: dict[tuple[str, int], LockGrant] = {}
        self._on_lost: dict[tuple[str, int], Callable[[str], None]] = {}
        self._task: asyncio.Task[None] | None = None

    def hold(self, grant: LockGrant, on_lost: Callable[[str], None] | None = None) -> None:
        """Renew ``grant`` while its agent runs; ``on_lost(file)`` if another holder took it over meanwhile."""
        key = (grant.file, grant.token)
        self._held[key] = grant
        if on_lost is not None:
            self._on_lost[key] = on_lost
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._renew(), name="leases")

    def current(self, grant: LockGrant) -> LockGrant:
        """The grant as last renewed."""
        return self._held.get((grant.file, grant.token), grant)

    def drop(self, grant: LockGrant) -> LockGrant:
        """Stop renewing; the grant as last renewed (its release must name the same token, which renewal keeps)."""
        self._on_lost.pop((grant.file, grant.token), None)
        return self._held.pop((grant.file, grant.token), grant)

    async def still_held(self, grant: LockGrant) -> bool:
        """Whether a lease is still ours at the end of its attempt. Only a lease past its expiry by our clock can
        have been taken over (a contender waits for expiry and grace), so only such a one is looked at: renewed if
        nobody took it (nothing happened meanwhile), lost if somebody did (a daemon held up past its lease)."""
        current = self.current(grant)
        if self.clock() < current.expires:
            return True
        try:
            renewed = await asyncio.to_thread(self.locks.renew, current)
        except (AmbientError, OSError):
            return False
        if (grant.file, grant.token) in self._held:
            self._held[(grant.file, grant.token)] = renewed
        return True

    def _due(self, grant: LockGrant) -> float:
        return grant.expires - grant.ttl_s * 2 / 3  # renewed once a third of the lease has gone by

    async def _renew(self) -> None:
        while self._held:
            wait = min(self._due(g) for g in self._held.values()) - self.clock()
            if wait > 0:
                await asyncio.sleep(min(wait, 60.0))  # a timer: re-read the set, grants come and go meanwhile
                continue
            now = self.clock()
            for key, grant in [(k, g) for k, g in self._held.items() if self._due(g) <= now]:
                try:
                    renewed = await asyncio.to_thread(self.locks.renew, grant)
                except (AmbientError, OSError) as exc:  # the lease is lost (taken over, released): stop renewing it
                    log.warning("lock_lease_lost", file=grant.file, holder=grant.holder, error=str(exc))
                    self._held.pop(key, None)
                    lost = self._on_lost.pop(key, None)
                    if lost is not None:
                        lost(grant.file)  # its agent is stopped: what it does now is no longer under a lease
                    continue
                if key in self._held:  # not dropped while renewing
                    self._held[key] = renewed
                log.debug("lock_lease_renewed", file=grant.file, holder=grant.holder)


class LeaseGuard:
    """One attempt's agent, stopped when a lease of its scope is lost while it runs: the lease
    renewal's callback cancels the attempt's own task while (and only while) the agent runs; the runner kills the
    agent's process group on cancellation, and the attempt goes on to give a void result. No task of its own:
    a fan-out makes one of these per item."""

    __slots__ = ("lost_files", "running", "task")

    def __init__(self) -> None:
        self.lost_files: list[str] = []
        self.task: asyncio.Task[object] | None = None
        self.running = False

    def lost(self, file: str) -> None:
        self.lost_files.append(file)
        if self.running and self.task is not None:
            self.task.cancel()

    async def run(self, work: Awaitable[AgentResult]) -> AgentResult | None:
        self.task = asyncio.current_task()
        self.running = True
        try:
            return await work
        except asyncio.CancelledError:
            if not self.lost_files or self.task is None:
                raise
            if self.task.uncancel() > 0:  # a stop cancelled it too: that one wins
                raise
            return None  # only our own cancel: the attempt goes on, with a void result
        finally:
            self.running = False
