"""The daemon's own troubles: resources it ran out of, told apart from an agent's failure.

An ``OSError`` with EMFILE raised while ambient starts an agent is not the agent's fault: blaming it (an item
escalated "the agent failed") sends the person to the wrong place, and an item task that dies of it left its item
"running" for ever. This module says which errors are the daemon's (:func:`resource_of`), how to
tell the person (:func:`describe`), and keeps the conditions the daemon is in (:class:`Health`), which it writes
to ``.ambient/state/health.json`` for ``ambient status`` and ``ambient doctor``. Pure rules; the daemon does the
I/O.
"""

from __future__ import annotations

import errno
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Resource = Literal["descriptors", "disk", "memory", "processes"]

_BY_ERRNO: dict[int, Resource] = {
    errno.EMFILE: "descriptors",
    errno.ENFILE: "descriptors",
    errno.ENOSPC: "disk",
    errno.EDQUOT: "disk",
    errno.ENOMEM: "memory",
    errno.EAGAIN: "processes",  # fork/posix_spawn: RLIMIT_NPROC or the pid table
}
_HINTS: dict[Resource, str] = {
    "descriptors": "raise its limit: LimitNOFILE= in the systemd unit, or `ulimit -n` before `ambient run`",
    "disk": "free space there: ambient waits and goes on by itself once writes succeed again",
    "memory": "free memory or lower `concurrency:` in profil/ambient.yml",
    "processes": "raise LimitNPROC= (or `ulimit -u`), or lower `concurrency:` in profil/ambient.yml",
}
_WHAT: dict[Resource, str] = {
    "descriptors": "ambient ran out of file descriptors",
    "disk": "disk full",
    "memory": "ambient ran out of memory",
    "processes": "ambient cannot start more processes",
}


def resource_of(exc: BaseException | None, *, spawning: bool = False) -> Resource | None:
    """The resource an error says the daemon ran out of, following ``__cause__``/``__context__``; None when it is
    something else. EAGAIN is a resource only where a process was being started (``spawning``)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in _BY_ERRNO:
            kind = _BY_ERRNO[exc.errno]
            if kind != "processes" or spawning:
                return kind
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def describe(kind: Resource, detail: str = "", where: str = "") -> str:
    """One line for the log, ``status``, ``doctor`` and a notification: what ran out, where, what to do."""
    head = _WHAT[kind] + (f": free space in {where}" if kind == "disk" and where else "")
    if detail:
        head += f" ({detail})"
    return f"{head}; {_HINTS[kind]}"


class Condition(BaseModel):
    """One trouble the daemon is in: since when, how often seen, the last words of it."""

    model_config = ConfigDict(extra="ignore")

    kind: Resource
    message: str
    since: datetime
    last: datetime
    count: int = Field(default=1, ge=1)


class Health(BaseModel):
    """The conditions the daemon is in now (empty: healthy)."""

    model_config = ConfigDict(extra="ignore")

    conditions: dict[str, Condition] = Field(default_factory=dict)


def noted(health: Health, kind: Resource, message: str, now: datetime) -> tuple[Health, bool]:
    """``health`` with ``kind`` seen at ``now``; True when the condition is new (tell the person once)."""
    old = health.conditions.get(kind)
    if old is None:
        cond = Condition(kind=kind, message=message, since=now, last=now)
    else:
        cond = old.model_copy(update={"message": message, "last": now, "count": old.count + 1})
    return Health(conditions={**health.conditions, kind: cond}), old is None


def cleared(health: Health, kind: Resource) -> tuple[Health, Condition | None]:
    """``health`` without ``kind``; the condition that ended, if it was there."""
    if kind not in health.conditions:
        return health, None
    rest = {k: v for k, v in health.conditions.items() if k != kind}
    return Health(conditions=rest), health.conditions[kind]
