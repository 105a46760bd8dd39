"""Giving freed heap back to the system (ambient.service.heap): the real malloc_trim, in a process of its own."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ambient.engine.tick import Tick
from ambient.service.heap import HeapTrimEvaluator, trim

GLIBC = bool(ctypes.util.find_library("c")) and hasattr(ctypes.CDLL(ctypes.util.find_library("c")), "malloc_trim")

_FRAGMENT = """
import sys
from ambient.service.heap import trim

def rss_anon_kb() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise SystemExit("no RssAnon")

before = rss_anon_kb()
blocks = [bytearray(64 * 1024) for _ in range(800)]  # 50 MiB in heap chunks (below the mmap threshold)
keep = blocks[-1]  # the top of the heap stays in use: free() alone cannot shrink it
del blocks
freed = rss_anon_kb()
assert trim()
trimmed = rss_anon_kb()
print(before, freed, trimmed)
"""


@pytest.mark.skipif(not GLIBC or not Path("/proc/self/status").exists(), reason="glibc's malloc_trim on Linux")
def test_trim_gives_freed_heap_pages_back(tmp_path: Path) -> None:
    """50 MiB allocated then freed below a block still in use stays resident; trim gives it back."""
    out = subprocess.run([sys.executable, "-c", _FRAGMENT], capture_output=True, text=True, timeout=60, check=True)
    before, freed, trimmed = (int(x) for x in out.stdout.split())
    assert freed - before > 40_000, (before, freed, trimmed)  # free() kept it
    assert freed - trimmed > 40_000, (before, freed, trimmed)  # trim gave it back


async def test_the_evaluator_trims_on_timed_ticks_at_most_every_minute() -> None:
    """File-event ticks never trim; timed ticks trim at most every EVERY_S (where malloc_trim exists)."""
    clock = [1000.0]
    ev = HeapTrimEvaluator(monotonic=lambda: clock[0])
    now = datetime(2026, 12, 1, tzinfo=UTC)
    await ev.evaluate(Tick(1, now, frozenset({Path("/brain/claims/x.yml")})))
    assert ev.trims == 0
    await ev.evaluate(Tick(2, now))
    assert ev.trims == (1 if GLIBC else 0)
    clock[0] += ev.EVERY_S - 1
    await ev.evaluate(Tick(3, now))
    assert ev.trims == (1 if GLIBC else 0)
    clock[0] += 2
    await ev.evaluate(Tick(4, now))
    assert ev.trims == (2 if GLIBC else 0) and trim() is GLIBC
