"""The workers as the daemon last heard them, kept in ``.ambient/workers.json`` for ``ambient status``, ``doctor`` and
the console (docs/cluster.md), and the rules read from it: a worker is lost when its last heartbeat is older than
``lost_after_s``; a dispatched agent is unserved when no live worker runs it. Pure: the daemon's keeper
(:mod:`ambient.cluster.keeper`) gives the records and the times, the readers give ``now``. Nothing here talks to
the server, so the readers never import ``nats``.

Times: ``seen`` is when the daemon received the worker's last heartbeat, by the daemon's clock (a heartbeat it
found already stored when it started: the server's time of that write, never later than the daemon's ``now``), so
a worker's own clock being off does not make it look alive or lost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

#: A worker says it is alive this often (s), and at once when the items it runs change.
HEARTBEAT_S: Final = 5.0
#: The default bound past which a silent worker is lost (``cluster.lost_after_s``).
LOST_AFTER_S: Final = 20.0
#: At most this many workers and running items per worker are kept in the file (a hostile record cannot grow it).
MAX_WORKERS: Final = 1024
MAX_RUNNING: Final = 256
#: A worker lost for longer than this (s) is no longer shown: a host retired without a clean stop does not linger.
FORGET_AFTER_S: Final = 3600.0


@dataclass(frozen=True, slots=True)
class Heard:
    """One worker's last heartbeat as the daemon received it."""

    worker: str
    host: str
    agents: tuple[str, ...]
    slots: int
    running: tuple[str, ...]  # the attempt keys (run/item/attempt) it runs now
    seen: float  # epoch seconds, the daemon's clock
    waiting: tuple[str, ...] = ()  # its agents the daemon has not dispatched yet (it waits for them)

    def record(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "host": self.host,
            "agents": list(self.agents),
            "slots": self.slots,
            "running": list(self.running),
            "waiting": list(self.waiting),
            "seen": self.seen,
        }


def heard(record: Any, seen: float) -> Heard | None:
    """A worker's record from the workers bucket (or the file) as :class:`Heard`; None when it is not one."""
    if not isinstance(record, Mapping):
        return None
    name, host = record.get("worker"), record.get("host")
    agents, slots = record.get("agents"), record.get("slots")
    running = record.get("running")
    if not isinstance(name, str) or not name or not isinstance(host, str):
        return None
    if not isinstance(agents, list) or not isinstance(slots, int) or isinstance(slots, bool):
        return None
    keys = running if isinstance(running, list) else []
    waiting = record.get("waiting")
    waits = waiting if isinstance(waiting, list) else []
    return Heard(
        worker=name[:200],
        host=host[:200],
        agents=tuple(str(a)[:200] for a in agents[:MAX_RUNNING]),
        slots=slots,
        running=tuple(str(k)[:500] for k in keys[:MAX_RUNNING]),
        seen=seen,
        waiting=tuple(str(a)[:200] for a in waits[:MAX_RUNNING]),
    )


def document(
    workers: Iterable[Heard], dispatched: Iterable[str], lost_after_s: float, now: float, taken: str | None = None
) -> dict[str, Any]:
    """The content of ``workers.json``: when it was written, the bound, the agents dispatched to workers, each
    worker's last heartbeat, and why nothing is dispatched when another brain holds the namespace."""
    rows = sorted(workers, key=lambda h: h.worker)[:MAX_WORKERS]
    doc: dict[str, Any] = {
        "v": 1,
        "written_at": now,
        "lost_after_s": lost_after_s,
        "dispatched": sorted(set(dispatched)),
        "workers": [h.record() for h in rows],
    }
    if taken is not None:
        doc["taken"] = taken
    return doc


@dataclass(frozen=True, slots=True)
class Roster:
    """``workers.json`` as read back."""

    written_at: float
    lost_after_s: float
    dispatched: tuple[str, ...]
    workers: tuple[Heard, ...]
    taken: str | None = None  # another brain's daemon holds the namespace: nothing is dispatched


def roster_from(data: Any) -> Roster | None:
    """The file's content as a :class:`Roster`; None when it is not one (an unreadable worker is left out)."""
    if not isinstance(data, Mapping) or data.get("v") != 1:
        return None
    written, bound = data.get("written_at"), data.get("lost_after_s")
    dispatched, workers = data.get("dispatched"), data.get("workers")
    if not isinstance(written, int | float) or not isinstance(bound, int | float):
        return None
    if not isinstance(dispatched, list) or not isinstance(workers, list):
        return None
    found = []
    for raw in workers[:MAX_WORKERS]:
        seen = raw.get("seen") if isinstance(raw, Mapping) else None
        one = heard(raw, float(seen)) if isinstance(seen, int | float) else None
        if one is not None:
            found.append(one)
    taken = data.get("taken")
    return Roster(
        float(written),
        float(bound),
        tuple(str(a) for a in dispatched),
        tuple(found),
        str(taken) if isinstance(taken, str) else None,
    )


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """One worker as ``status``, ``doctor`` and the console show it."""

    worker: str
    host: str
    agents: tuple[str, ...]
    slots: int
    running: tuple[str, ...]
    heartbeat_age_s: float
    lost: bool
    waiting: tuple[str, ...] = ()

    def record(self) -> dict[str, Any]:
        """A lost worker's items are what it ``was_running`` when last heard: they may have moved on since."""
        return {
            "worker": self.worker,
            "host": self.host,
            "agents": list(self.agents),
            "slots": self.slots,
            "running": [] if self.lost else list(self.running),
            "was_running": list(self.running) if self.lost else [],
            "waiting": list(self.waiting),
            "heartbeat_age_s": round(self.heartbeat_age_s, 1),
            "lost": self.lost,
        }


def rows(roster: Roster, now: float) -> list[WorkerRow]:
    """Each worker with the age of its last heartbeat and whether it is lost, by name; one lost for longer than
    :data:`FORGET_AFTER_S` is left out."""
    out = []
    for h in roster.workers:
        age = max(0.0, now - h.seen)
        if forgotten(age, roster.lost_after_s):
            continue
        lost = age > roster.lost_after_s
        out.append(WorkerRow(h.worker, h.host, h.agents, h.slots, h.running, age, lost, h.waiting))
    return out


def forgotten(age_s: float, lost_after_s: float) -> bool:
    """Whether a worker silent for ``age_s`` is no longer shown (``status``, ``doctor``, ``cluster workers``)."""
    return age_s > max(FORGET_AFTER_S, lost_after_s)


def unserved(roster: Roster, now: float) -> list[str]:
    """The agents dispatched to workers that no live worker serves: their items wait."""
    live = {a for r in rows(roster, now) if not r.lost for a in r.agents}
    return [a for a in roster.dispatched if a not in live]


def view(roster: Roster | None, now: float, *, daemon_up: bool) -> dict[str, Any] | None:
    """What ``ambient status --json`` shows under ``workers`` (None: no file, so no ``cluster:``)."""
    if roster is None:
        return None
    return {
        "daemon_up": daemon_up,
        "written_at": roster.written_at,
        "lost_after_s": roster.lost_after_s,
        "dispatched": list(roster.dispatched),
        "workers": [r.record() for r in rows(roster, now)],
        "unserved": [] if roster.taken else unserved(roster, now),
        "taken": roster.taken,
    }
