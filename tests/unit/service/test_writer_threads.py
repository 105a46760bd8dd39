"""The background writers' threads: nicer than the daemon, one at a time, in order."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from ambient.service.writer_threads import BACKGROUND_NICE, background_executor, lower_priority

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own nice value is Linux's")


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@linux_only
def test_the_worker_runs_nicer_than_the_daemon_and_the_daemon_does_not() -> None:
    before = _nice()
    pool = background_executor("test-bg")
    try:
        seen = pool.submit(_nice).result(timeout=10)
        order: list[int] = []
        for k in range(50):
            pool.submit(order.append, k)
        pool.submit(lambda: None).result(timeout=10)
    finally:
        pool.shutdown(wait=True)
    assert seen == min(19, before + BACKGROUND_NICE)
    assert _nice() == before  # only the worker thread moved
    assert order == list(range(50))


@linux_only
def test_lowering_is_relative_and_capped() -> None:
    results: list[int | None] = []

    def job() -> None:
        start = _nice()
        results.append(lower_priority(3))
        results.append(_nice() - start)
        results.append(lower_priority(30))  # past 19: capped
        results.append(lower_priority(0))  # nothing asked: nothing done

    t = threading.Thread(target=job)
    t.start()
    t.join(timeout=10)
    assert results[1] == 3 and results[0] is not None
    assert results[2] == 19 and results[3] is None


@linux_only
def test_the_claims_writer_thread_is_a_background_one(tmp_path: Path) -> None:
    from ambient.claims.store import ClaimStore
    from ambient.core.clock import SystemClock
    from ambient.service.claims_writer import ClaimsWriter
    from ambient.storage.paths import BrainPaths

    paths = BrainPaths(tmp_path)
    paths.claims.mkdir()
    clock = SystemClock()
    writer = ClaimsWriter(ClaimStore(paths, clock=clock), clock)
    try:
        assert writer._writer.submit(_nice).result(timeout=10) == min(19, _nice() + BACKGROUND_NICE)
    finally:
        writer.close()


def _thread_nices(pid: int) -> dict[int, int]:
    """Each thread's nice value, by thread id (the main thread's id is the pid)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        out[int(task.name)] = int(stat.rpartition(")")[2].split()[16])  # field 19, counted after the (comm)
    return out


@pytest.mark.slow
@linux_only
def test_the_daemon_runs_its_claims_and_live_writers_in_the_background(tmp_path: Path) -> None:
    """In the real daemon, after a fan-out: the claims writer and the live-context writer run BACKGROUND_NICE steps
    nicer than the daemon's event loop (the threads they start to fsync a round of claims together inherit it)."""
    from tests.e2e.helpers import events, foreach_workflow, make_brain, running, stub_agent_md, wait_for

    paths = make_brain(tmp_path / "brain", example_agents=False, agents={"stub": stub_agent_md("stub")})
    with running(paths) as d:
        (paths.root / "workflows" / "w.yml").write_text(foreach_workflow("w", ["a", "b", "c"], agent="stub"))
        wait_for(lambda: len(events(paths, "w", "finished_run")) == 1, 30, "the run finished")
        base = os.getpriority(os.PRIO_PROCESS, d.pid)
        nicer = min(19, base + BACKGROUND_NICE)
        nices = wait_for(
            lambda: list((n := _thread_nices(d.pid)).values()).count(nicer) >= 2 and n,
            10,
            "both writer threads started",
        )
        assert nices[d.pid] == base, nices  # the event loop is not one of them
        assert set(nices.values()) == {base, nicer}, nices
        assert d.stop() == 0
