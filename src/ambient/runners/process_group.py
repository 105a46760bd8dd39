"""An agent's process group: signal it, tell whether anything of it still runs, end it (SIGTERM, grace, SIGKILL).

Every agent starts in its own session (``start_new_session``), so its pid is its process group id and the whole
tree it starts (unless a member calls ``setsid()``) goes with it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Protocol

from ambient.core.lazylog import get_logger

log = get_logger(__name__)

_POLL_S = 0.02
#: How long to wait for SIGKILLed members to be gone.
_KILL_WAIT_S = 5.0


class Proc(Protocol):
    """What the runner needs of an agent's process: asyncio's ``Process``, :class:`~ambient.runners.child.Child`
    or :class:`~ambient.runners.spawner.SpawnedAgent`."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False if the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member changed uid (setuid program); the others were still signalled
        return True
    return True


def group_alive(pgid: int) -> bool:
    """True while process group ``pgid`` has a member that is not a zombie.

    ``killpg(pgid, 0)`` alone is not enough: a killed grandchild reparented to a PID 1 that does not reap stays a
    zombie in the group forever, and zombies cannot be killed twice.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs: trust killpg
        return True
    for name in entries:
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        # fields: state, ppid, pgrp, ... (proc(5))
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


async def terminate_group(pgid: int, *, grace: float, leader: Proc | None = None) -> bool:
    """SIGTERM (and SIGCONT, for a stopped agent) the group, wait up to ``grace`` s, then SIGKILL what is left.

    Returns True when SIGKILL was needed. When ``leader`` is given (our child), it is waited for first, then the
    rest of the group is polled.
    """
    if not group_alive(pgid):
        return False
    signal_group(pgid, signal.SIGTERM)
    signal_group(pgid, signal.SIGCONT)
    deadline = time.monotonic() + grace
    if leader is not None and leader.returncode is None:
        waiter = asyncio.ensure_future(leader.wait())
        try:
            await asyncio.wait({waiter}, timeout=grace)
        finally:
            if not waiter.done():
                waiter.cancel()
    # Grandchildren are not our children: no event tells when they die, so their group is polled.
    while group_alive(pgid) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(_POLL_S)
    if not group_alive(pgid):
        return False
    signal_group(pgid, signal.SIGKILL)
    # SIGKILL is delivered asynchronously: wait (bounded) until the kernel has really ended every member, so that
    # "run() returned" means "nothing of the agent runs any more" (a process in uninterruptible I/O may lag).
    deadline = time.monotonic() + _KILL_WAIT_S
    while group_alive(pgid) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(_POLL_S / 4)
    if group_alive(pgid):
        log.error("agent_group_survived_sigkill", pgid=pgid)
    return True
