"""Reading ``.ambient/workers.json``, the workers as the daemon last heard them (written by
:mod:`ambient.cluster.keeper`), for ``ambient status``, ``doctor`` and the console: one reader, and no ``nats``."""

from __future__ import annotations

import json
import time
from typing import Any

from ambient.cluster.roster import Roster, roster_from, view
from ambient.storage.paths import WORKERS_FILE, BrainPaths

#: The file is small (a line per worker); more than this is not the daemon's.
_CAP = 4 * 1024 * 1024


def read_roster(paths: BrainPaths) -> Roster | None:
    """The file's roster; None when there is none (no ``cluster:``) or it is unreadable."""
    try:
        with (paths.state / WORKERS_FILE).open("rb") as f:
            data = json.loads(f.read(_CAP))
    except (OSError, ValueError):
        return None
    return roster_from(data)


def workers_view(paths: BrainPaths, daemon_up: bool) -> dict[str, Any] | None:
    """The workers as ``status --json`` and the console show them (:func:`ambient.cluster.roster.view`), now."""
    return view(read_roster(paths), time.time(), daemon_up=daemon_up)
