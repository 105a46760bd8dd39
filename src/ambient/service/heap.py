"""The daemon's heap: start-up's objects kept out of the cyclic collector (:func:`freeze_startup_heap`), and the
memory the daemon freed given back to the system (glibc's ``malloc_trim``).

A long-running daemon frees as much as it allocates, but glibc keeps freed heap pages resident inside its
arenas (one per thread that allocated) until the top of a heap is free, which it rarely is: in R-12's soak,
once the Python objects stayed flat, the free space inside the arenas still went from 3 to 8-12 MB and made
RSS swing by as much. ``malloc_trim(0)`` hands whole free pages back (``madvise``), in every arena. It costs a
walk of the free lists (2 ms for 20 MB in 10,000 holes, measured here), so the daemon does it on its timed
ticks, at most every ``HeapTrimEvaluator.EVERY_S``, off the event loop. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import gc
import time
from collections.abc import Callable

from ambient.engine.tick import Tick


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        func: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    return func


def trim() -> bool:
    """Give free heap pages back to the system; False where there is no ``malloc_trim``."""
    func = _malloc_trim()
    if func is None:
        return False
    func(0)
    return True


class HeapTrimEvaluator:
    """On timed ticks, at most every ``EVERY_S``: :func:`trim` in a worker thread."""

    name = "heap"
    EVERY_S = 60.0

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._last: float | None = None
        self.trims = 0

    async def evaluate(self, tick: Tick) -> None:
        if not tick.timed:
            return
        now = self._monotonic()
        if self._last is not None and now - self._last < self.EVERY_S:
            return
        self._last = now
        if await asyncio.to_thread(trim):
            self.trims += 1


def freeze_startup_heap() -> int:
    """Keep what start-up built (modules, pydantic schemas, the loaded brain) out of every later collection.

    Performance (bench/fanout.py): the cyclic collector's full collections walked that whole heap while a
    fan-out ran, ~0.2 ms per item (three gen-2 passes of ~80 ms in a 2,000-item run, measured with
    ``gc.callbacks``). Frozen objects are still freed by reference counting; only cycles among them would
    stay, and start-up objects live as long as the daemon anyway.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
