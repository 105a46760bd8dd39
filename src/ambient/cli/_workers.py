"""The cluster's workers in ``ambient status`` (docs/cluster.md): read from the daemon's ``.ambient/workers.json``,
never from the server, so status imports nothing of ``nats``. No file (no ``cluster:``): nothing is shown."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ambient.cluster.rosterfile import workers_view
from ambient.storage.paths import BrainPaths


def workers_section(paths: BrainPaths, daemon_up: bool) -> dict[str, Any] | None:
    """``workers`` of ``ambient status --json``: each worker (host, agents, slots, items running, heartbeat age,
    lost), the dispatched agents no live worker serves; None without the file."""
    return workers_view(paths, daemon_up)


def print_workers(data: dict[str, Any], write: Callable[[str], None]) -> None:
    """The ``Workers:`` lines of ``ambient status``, one per worker (nothing when the brain has no cluster)."""
    section = data.get("workers")
    if not section:
        return
    rows = section["workers"]
    lost = sum(1 for w in rows if w["lost"])
    heard = "" if section["daemon_up"] else " (the daemon is down: as it last heard; `ambient cluster workers` asks)"
    write(f"Workers: {len(rows) - lost} alive, {lost} lost{heard}")
    if section.get("taken"):
        write(f"  nothing is dispatched: {section['taken']}")
    for w in rows:
        write(f"  {w['worker']}  host {w['host']}  agents {','.join(w['agents'])}  slots {w['slots']}  {doing(w)}")
    for agent in section["unserved"]:
        write(f"  no live worker serves {agent}: its items wait (`ambient worker --agents {agent}` on a host)")


def doing(w: dict[str, Any]) -> str:
    """What one worker does, as ``ambient status`` and ``ambient cluster workers`` say it: the items it runs (a lost
    one: it was running, as last heard), the agents it still waits to be dispatched, its last heartbeat."""
    running = w.get("running") or []
    was = w.get("was_running") or []
    age = w["heartbeat_age_s"]
    if w["lost"]:
        items = f"  was running {len(was)} ({', '.join(was)})" if was else ""
        return f"LOST: no heartbeat for {age:g} s{items}"
    listed = f" ({', '.join(running)})" if running else ""
    waiting = f"  waiting for dispatch of {', '.join(w['waiting'])}" if w.get("waiting") else ""
    return f"running {len(running)}{listed}{waiting}  heartbeat {age:g} s ago"
