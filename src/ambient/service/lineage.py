"""Whose process is this: the daemon's agents are its descendants, whatever they say about themselves.

The send socket learns its peer's pid from the kernel (``SO_PEERCRED``). A peer that descends from the daemon is
one of its agents (the spawner, a subreaper, adopts what an agent orphans, so a ``setsid()`` or a double fork
does not leave the lineage); the person's own shell never does. An agent that unsets its channel token is
then not taken for the person.
"""

from __future__ import annotations

from pathlib import Path

_MAX_DEPTH = 64


def parent_of(pid: int) -> int | None:
    """The parent pid of a live process (None when it is gone or unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()
    return int(fields[1])


def descends_from(pid: int, ancestor: int) -> bool | None:
    """Whether ``ancestor`` is among the ancestors of ``pid``; None when that cannot be told (no /proc, gone)."""
    current = pid
    for _ in range(_MAX_DEPTH):
        parent = parent_of(current)
        if parent is None:
            return None
        if parent == ancestor:
            return True
        if parent <= 1:
            return False
        current = parent
    return None
