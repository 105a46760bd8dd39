"""Fire-and-forget jobs off the event loop: blocking clean-ups nobody waits for (a revoked channel's file).

An executor future chained back to the loop costs it a wake-up and callbacks per job for a result nobody
awaits; these jobs run in one thread of their own and report only their failures, in the log.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import structlog

log = structlog.get_logger(__name__)

_BACKGROUND: list[ThreadPoolExecutor] = []


def in_background(job: Callable[[], None]) -> None:
    """Run a blocking job in a thread of its own pool, never waited for; a failure is logged."""
    if not _BACKGROUND:
        _BACKGROUND.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="ambient-cleanup"))
    try:
        done = _BACKGROUND[0].submit(job)
    except RuntimeError:  # the pool is shut down (interpreter exit): do it here
        done = Future()
        try:
            job()
            done.set_result(None)
        except Exception as exc:  # noqa: BLE001 - logged below, like a failure in the pool
            done.set_exception(exc)
    done.add_done_callback(_log_job_failure)


def _log_job_failure(done: Future[None]) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.warning("background_job_failed", error=str(done.exception()))
