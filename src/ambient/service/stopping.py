"""How long a stop may take once the daemon's agents are gone: ``STOP_BOUND_S``, whatever is left to write.

A SIGTERM first drains the agents (``shutdown_grace_s``, then SIGTERM and SIGKILL after ``kill_grace_s``). What
follows is the daemon's own writing: item claims coalesced by the claims writer, the agents' live threads, the
audit, the query store. Those are views of the run journals (the fsync'd truth), and their backlog grows with
history (a claims writer several fan-outs behind took 15 s), so a stop gives them ``WRITE_OUT_S`` and goes; the
next start writes again from the journals what was left (claims of unfinished runs, views of runs whose run claim
is older than their end). :class:`StopGuard` is the last resort: a stop still under way at ``STOP_BOUND_S`` (a
write stuck in the kernel, a thread that will not end) exits the process as a kill would, which every record
survives (RELIABILITY §1.3: atomic files, journals repaired at start).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Final

from ambient.core.lazylog import get_logger

log = get_logger(__name__)

#: docs/reliability.md: with no agent at work, a SIGTERM ends the daemon within this many seconds.
STOP_BOUND_S: Final = 10.0
#: What the daemon's own writes get of it (the rest: closing what is left and the exit itself).
WRITE_OUT_S: Final = 5.0
#: When the last resort strikes: early enough that the process is gone by ``STOP_BOUND_S``.
GUARD_AT_S: Final = STOP_BOUND_S - 0.5


def time_left(deadline: float, now: float, *, floor: float = 0.0) -> float:
    """Seconds until ``deadline`` (monotonic), never below ``floor``."""
    return max(deadline - now, floor)


class StopGuard:
    """Ends the process if the stop is still under way ``bound_s`` after :meth:`arm` (``exit_code()`` decides the
    code). A daemon thread: a process that ends first takes it along."""

    def __init__(self, bound_s: float, exit_code: Callable[[], int], *, exit_now: Callable[[int], None] = os._exit):
        self.bound_s = bound_s
        self.exit_code = exit_code
        self._exit_now = exit_now
        self._timer: threading.Timer | None = None
        self._armed_at = 0.0

    def arm(self) -> None:
        self._armed_at = time.monotonic()
        self._timer = threading.Timer(self.bound_s, self._overdue)
        self._timer.name = "ambient-stop-guard"
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _overdue(self) -> None:
        code = self.exit_code()
        log.error(
            "stop_overdue",
            after_s=round(time.monotonic() - self._armed_at, 1),
            exit_code=code,
            left_to="the run journals (written again from them at the next start)",
        )
        self._exit_now(code)
