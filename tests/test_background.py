"""Fire-and-forget jobs off the event loop (ambient.background)."""

from __future__ import annotations

import threading

import structlog

from ambient.background import in_background
from tests.conftest import async_wait_until


async def test_background_jobs_run_and_failures_are_logged() -> None:
    """in_background runs a job off the loop without being awaited; a failing job is logged, not raised."""
    ran = threading.Event()
    in_background(ran.set)
    assert await async_wait_until(ran.is_set, 10)
    failed = threading.Event()

    def boom() -> None:
        failed.set()
        raise OSError("disk gone")

    with structlog.testing.capture_logs() as logs:
        in_background(boom)
        assert await async_wait_until(failed.is_set, 10)
        assert await async_wait_until(lambda: any(e["event"] == "background_job_failed" for e in logs), 10)
    assert any("disk gone" in e.get("error", "") for e in logs)
