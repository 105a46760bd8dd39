"""Worker threads for the daemon's background writers, at a lower scheduling priority than the event loop.

The claims writer (item claim files, views of the run journal) and the live-context writer (the agents' turns) do
work no agent waits for, but each of their syscalls hands the GIL to the event loop and back. When both cores are
busy (a fan-out of command agents: the loop, the spawner and the agents), the kernel ran those threads as readily
as the loop, and the loop waited for the GIL at its own syscalls. With the writers ``BACKGROUND_NICE`` steps nicer
than the daemon, the kernel prefers the loop when they compete: bench/fanout.py (b), 10 interleaved pairs on a quiet
machine, 1.078 × the agents/s, the daemon's CPU per agent −6 % (bench/README.md, finding 49). On an idle core
they run as before.

What it costs: under a CPU the daemon shares with busier processes, claim views and live turns lag further behind
(the run journal stays the truth; a stop still waits for both). The fsync threads of the journals stay at the
daemon's priority: agents wait for them. Linux only (a thread's nice value is its own there); elsewhere a no-op.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from ambient.core.lazylog import get_logger

log = get_logger(__name__)

#: How many nice steps the background writers sit below the daemon (the kernel caps nice at 19).
BACKGROUND_NICE: Final = 10


def lower_priority(steps: int = BACKGROUND_NICE) -> int | None:
    """Make the calling thread ``steps`` nicer (capped at 19); its new nice value, or None where not done."""
    if not sys.platform.startswith("linux") or steps <= 0:
        return None
    tid = threading.get_native_id()
    try:
        nice = min(19, os.getpriority(os.PRIO_PROCESS, tid) + steps)
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError as exc:  # a sandbox that forbids it: the thread runs at the daemon's priority, as before
        log.debug("background_priority_unchanged", error=str(exc))
        return None
    return nice


def background_executor(name: str) -> ThreadPoolExecutor:
    """One worker thread named ``name``, ``BACKGROUND_NICE`` steps nicer than the daemon (writes stay in order)."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name, initializer=lower_priority)
