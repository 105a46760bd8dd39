"""The service's limits against the daemon-wide agent cap: what ``concurrency:`` agents at once need
(:func:`ambient.engine.slots.unit_limits`) and what this process has (its descriptor limit, its cgroup's ``pids.max``).

Agents started past either limit fail with EMFILE or EAGAIN, blamed on nobody the person would look at; the daemon
raises its descriptor limit at start (:func:`raise_descriptor_limit`) and says what is still short at start and at
each reload.
"""

from __future__ import annotations

import contextlib
import resource
from pathlib import Path

from ambient.core.lazylog import get_logger
from ambient.engine.slots import unit_limits

log = get_logger(__name__)


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


def raise_descriptor_limit(want: int = 1 << 16) -> int:
    """Raise the soft limit on open files towards the hard one (to ``want``): a fan-out holds a few descriptors
    per agent, and 1024 (the usual soft default) ran out under load where the hard limit allowed far more.
    Returns the soft limit in force; logs when it stays low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft != resource.RLIM_INFINITY and soft < 256:
        log.warning(
            "descriptor_limit_low",
            limit=soft,
            hint="raise LimitNOFILE= in the systemd unit (or `ulimit -n`): agents need a few descriptors each",
        )
    return int(soft)
