"""A full disk seen from a command (``ambient status``, ``ambient doctor``): the daemon cannot say so itself, since a
full disk is exactly when its ``health.json`` cannot be rewritten. Apart from :mod:`ambient.service.troubles` so
that ``ambient status`` checks the disk without importing the daemon's health model (pydantic)."""

from __future__ import annotations

import os
from pathlib import Path

#: Free space under which the disk counts as full for ``status`` and ``doctor`` (a record, a claim, a journal
#: round need a few KiB each).
DISK_FULL_BYTES = 256 * 1024


def disk_full(path: Path) -> str | None:
    """The "disk full" line when the filesystem holding ``path`` has less than :data:`DISK_FULL_BYTES` free for
    ambient's user, else None."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if free >= DISK_FULL_BYTES:
        return None
    from ambient.core.health import describe  # the wording of every trouble; only when there is one to say

    return describe("disk", f"{free // 1024} KiB left", str(path))
