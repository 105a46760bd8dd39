"""Agents a dead daemon left running: found at restart and stopped before their items run again.

A daemon killed alone (kill -9 outside systemd) leaves its agents running: they lead their own sessions. Its
successor must stop them before it runs their items again, or one item runs twice at once (README: "never twice
at once"). Two ways find them, because either alone has a gap:

- the journal's ``spawned`` record (pid and start time, so a recycled pid is left alone), written once the agent
  runs; a kill between the agent's start and that record loses it;
- the agent's own environment: every agent carries ``AMBIENT_BRAIN`` and ``AMBIENT_RUN_ID`` (and its children
  inherit them), read from ``/proc/<pid>/environ`` (readable for the daemon's own user only). This finds an agent
  whose pid never reached the journal, and the descendants an agent left in other process groups.

Stopping is SIGTERM to every one at once, a bounded wait, then SIGKILL: N orphans cost one grace period, not N.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import structlog

from ambient.core.process import process_start_time

log = structlog.get_logger("ambient.runners.orphans")

_PROC = Path("/proc")
_POLL_S = 0.02
_START_TOLERANCE_S = 0.5


@dataclass(frozen=True)
class Orphan:
    """A process of a dead daemon's agent: the run and item it worked for, how it was found."""

    pid: int
    run_id: str
    item: str
    found_by: str  # "journal" or "environment"


def _environ(pid: int) -> dict[bytes, bytes] | None:
    try:
        raw = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:  # gone, another user's, or no /proc
        return None
    env: dict[bytes, bytes] = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep:
            env[name] = value
    return env


def by_environment(brain: Path, run_ids: Iterable[str]) -> list[Orphan]:
    """Live processes of this user whose environment names this brain and one of ``run_ids``, but those an
    ``ambient worker`` on this host runs for the daemon (``AMBIENT_WORKER``): they are not the dead daemon's."""
    wanted = {r.encode() for r in run_ids}
    if not wanted or not _PROC.is_dir():
        return []
    me = os.getpid()
    brain_b = os.fsencode(brain)
    found: list[Orphan] = []
    for entry in os.scandir(_PROC):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        env = _environ(int(entry.name))
        if env is None or env.get(b"AMBIENT_BRAIN") != brain_b or env.get(b"AMBIENT_RUN_ID") not in wanted:
            continue
        if b"AMBIENT_WORKER" in env:  # a worker's agent (cluster) on this host: the worker's to stop, not ours
            continue
        pid = int(entry.name)
        if process_start_time(pid) is None:  # a zombie: nothing runs
            continue
        run_id = env[b"AMBIENT_RUN_ID"].decode(errors="replace")
        found.append(Orphan(pid, run_id, env.get(b"AMBIENT_ITEM", b"").decode(errors="replace"), "environment"))
    return found


def by_journal(run_id: str, item: str, pid: int | None, started: float | None) -> Orphan | None:
    """The agent a ``spawned`` record names, if that very process (pid *and* start time) still runs.

    A pid without a recorded start time cannot be told from a recycled one (or from any process an edited journal
    names), so it is never signalled; nor is a pid of 1 or less (init, a group, every process). A real agent
    whose record lacks its start time is still found, by its environment (:func:`by_environment`).
    """
    if pid is None or pid <= 1 or started is None:
        return None
    now_start = process_start_time(pid)
    if now_start is None or abs(now_start - started) > _START_TOLERANCE_S:
        return None
    return Orphan(pid, run_id, item, "journal")


def _signal(pid: int, sig: signal.Signals) -> None:
    """To the agent's process group when it leads one (an agent does), else to the process alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def stop(orphans: Iterable[Orphan], grace_s: float = 5.0) -> list[Orphan]:
    """SIGTERM every orphan (its group), wait at most ``grace_s`` for all, SIGKILL the rest; those stopped.

    Blocking (start-up, before the loop runs): the items must not run again while one of these still runs.
    """
    unique = {o.pid: o for o in orphans if o.pid > 1}  # never a group, init, or "every process"
    if not unique:
        return []
    started = {pid: process_start_time(pid) for pid in unique}
    live = {pid: o for pid, o in unique.items() if started[pid] is not None}
    for o in live.values():
        log.warning("orphan_agent_reaped", run_id=o.run_id, item=o.item, pid=o.pid, found_by=o.found_by)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in live:
            _signal(pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if all(process_start_time(pid) != started[pid] for pid in live):
                return list(live.values())
            time.sleep(_POLL_S)  # bounded wait for processes we signalled
    still = [pid for pid in live if process_start_time(pid) == started[pid]]
    if still:
        log.error("orphan_agent_survived_sigkill", pids=still)
    return list(live.values())
