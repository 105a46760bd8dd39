"""The service's limits against the daemon-wide agent cap: what ``concurrency:`` agents at once need
(:func:`ambient.engine.slots.unit_limits`) and what this process has (its descriptor limit, its cgroup's ``pids.max``).

Agents started past either limit fail with EMFILE or EAGAIN, blamed on nobody the person would look at; the daemon
says so at start and at each reload instead (issue 25, 11).
"""

from __future__ import annotations

import contextlib
import resource
from pathlib import Path

from ambient.engine.slots import unit_limits


def _pids_max() -> int | None:
    """This process's cgroup ``pids.max`` (the unit's TasksMax=), None where unlimited or unknown (cgroup v2)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                raw = (Path("/sys/fs/cgroup") / line[3:].lstrip("/") / "pids.max").read_text().strip()
                return None if raw == "max" else int(raw)
    return None


def limits_short(concurrency: int) -> dict[str, int]:
    """The limits of this process below what ``concurrency`` agents need (name → limit in force, with the need as
    ``need_<name>``): the daemon says so at start and at each reload, before agents fail to start."""
    tasks, fds = unit_limits(concurrency)
    short: dict[str, int] = {}
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < fds:
        short.update(descriptors=int(soft), need_descriptors=fds)
    pids = _pids_max()
    if pids is not None and pids < tasks:
        short.update(tasks=pids, need_tasks=tasks)
    return short
