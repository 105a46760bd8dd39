"""Who a process is: its pid plus its start time (a recycled pid has another), and this host's name.

Lock files record their holder this way (RELIABILITY §1.2 rule 2: a lock whose process is provably dead is free
at once), and so do the runners and the orphan sweep for the agents they start. The start time is read from
``/proc/<pid>/stat`` (what psutil's ``create_time()`` returns, to a clock tick); psutil is the fallback where
/proc is missing.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Final

_START_TOLERANCE_S: Final = 0.05  # process start times are known to a clock tick (10 ms)

_BOOT: dict[str, float] = {}
_SELF: dict[int, float | None] = {}
_HOST: list[str] = []


def _boot_time() -> float:
    if "btime" not in _BOOT:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                _BOOT["btime"] = float(line.split()[1])
                break
        _BOOT["hz"] = float(os.sysconf("SC_CLK_TCK"))
    return _BOOT["btime"]


def process_start_time(pid: int) -> float | None:
    """Start time (epoch seconds, 10 ms resolution) of a live process; None if it is gone or a zombie.

    Reads field 22 of ``/proc/<pid>/stat`` (what psutil's ``create_time()`` returns); psutil is
    the fallback where /proc is missing.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        if Path("/proc/self/stat").exists():
            return None
        return _psutil_start(pid)
    rest = raw[raw.rindex(b")") + 2 :].split()
    if rest[0] in (b"Z", b"X", b"x"):  # zombie or dead: killed, not yet reaped
        return None
    btime = _boot_time()
    return round(btime + int(rest[19]) / _BOOT["hz"], 2)


def start_time_now() -> float | None:
    """The start time :func:`process_start_time` will give a process started now, without reading ``/proc/<pid>``.

    Same frame as /proc (boot time + time since boot, ``CLOCK_BOOTTIME`` like the kernel's start time), so the
    two agree to a clock tick plus the time the start takes. Reading ``/proc/<pid>/stat`` of a process that
    is still exec'ing waits for it: ~7 % of the loop in a fan-out of command agents (py-spy). None where the
    boot clock or ``/proc/stat`` is missing.
    """
    if not hasattr(time, "CLOCK_BOOTTIME"):
        return None
    return start_time_at(time.clock_gettime(time.CLOCK_BOOTTIME))


def start_time_at(boot_clock: float) -> float | None:
    """The start time of a process started when ``CLOCK_BOOTTIME`` read ``boot_clock`` (read by another process:
    the spawner)."""
    try:
        btime = _boot_time()
    except (OSError, KeyError, ValueError):
        return None
    return round(btime + boot_clock, 2)


def _psutil_start(pid: int) -> float | None:
    # Imported here: only where /proc is missing, and `ambient lock` (which reads start times) runs around every
    # write of a script.
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return round(proc.create_time(), 2)
    except psutil.Error:
        return None


def own_start_time() -> float | None:
    """This process's start time (read once per process: a forked child reads its own)."""
    pid = os.getpid()
    if pid not in _SELF:
        _SELF.clear()
        _SELF[pid] = process_start_time(pid)
    return _SELF[pid]


def hostname() -> str:
    """This host's name, as lock files write it in ``host:``."""
    if not _HOST:
        _HOST.append(socket.gethostname())
    return _HOST[0]


#: Whole seconds two readings of one process's start time may differ by: ``btime`` in ``/proc/stat`` is the wall
#: clock minus the time since boot, in whole seconds, so a clock slewed across a second's edge moves every start
#: time computed after it by one second (2026-12-08: a live lock holder judged dead by a process that read
#: ``btime`` a second off the holder's own reading; four lock tests failed in one minute on this VM).
_BTIME_STEPS_S: Final = 2


def same_start(recorded: float, now: float, tolerance: float = _START_TOLERANCE_S) -> bool:
    """Whether two start times of a pid are one process's: equal to a clock tick, or a whole number of seconds
    apart up to :data:`_BTIME_STEPS_S` (the ``btime`` each reading used moved). A recycled pid starts later by
    anything else; for it to fall within a tick of a whole second or two, the pid space must wrap that fast."""
    apart = now - recorded
    steps = round(apart)
    return abs(apart - steps) <= tolerance and abs(steps) <= _BTIME_STEPS_S


def process_alive(pid: int, start_time: float | None) -> bool:
    """Is the process that wrote (pid, start_time) still running on this host? A recycled pid is not."""
    now_start = process_start_time(pid)
    if now_start is None:
        return False
    return start_time is None or same_start(start_time, now_start)
