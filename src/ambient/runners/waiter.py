"""One waiter woken when something about a running agent changes: its output, its pipes, its exit.

Shared by the runner's own pipes (:class:`ambient.runners.pipes.Pipes`) and the agents the spawner reads for
(:class:`ambient.runners.spawner.SpawnedAgent`): supervision waits on conditions, not on events, so a change that
comes before anyone waits is never lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


def _set_if_pending(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Waiter:
    """Call :meth:`wake` when something changed; :meth:`until` waits for a condition with a deadline."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        """Something changed (a pipe closed, the cap was passed, the agent exited): the waiter looks again."""
        if self._waiter is not None:
            _set_if_pending(self._waiter)

    async def until(self, ready: Callable[[], bool], deadline: float) -> bool:
        """Wait until ``ready()`` holds or the loop's clock reaches ``deadline``; returns ``ready()``."""
        loop = self._loop
        while not ready():
            delay = deadline - loop.time()
            if delay <= 0:
                return False
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(delay, _set_if_pending, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        return True
