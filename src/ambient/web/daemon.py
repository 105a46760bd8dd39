"""Whether the daemon runs, since when, and when it last stopped: read from its flock and files, for the overview."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from ambient.service.instance import daemon_up
from ambient.storage.paths import BrainPaths

#: How much of the end of ``daemon-events.jsonl`` is read for the last stop (the file only grows).
_TAIL = 16 * 1024


@dataclass(frozen=True)
class DaemonState:
    up: bool
    pid: int | None = None
    started_at: str | None = None
    version: str | None = None
    stopped_at: str | None = None


def daemon_state(paths: BrainPaths) -> DaemonState:
    """The daemon as the files say: up (a live flock), its pid, start time and version; else when it last stopped."""
    up = daemon_up(paths)
    info: dict[str, Any] = {}
    try:
        loaded = json.loads((paths.state / "daemon.json").read_text(encoding="utf-8"))
        info = loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError):
        pass
    pid = info.get("pid")
    return DaemonState(
        up=up,
        pid=pid if isinstance(pid, int) and up else None,
        started_at=str(info["started_at"]) if up and info.get("started_at") else None,
        version=str(info["version"]) if up and info.get("version") else None,
        stopped_at=None if up else _last_stop(paths),
    )


def _last_stop(paths: BrainPaths) -> str | None:
    path = paths.state / "daemon-events.jsonl"
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - _TAIL))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("ev") == "stopped" and rec.get("at"):
            return str(rec["at"])
    return None
