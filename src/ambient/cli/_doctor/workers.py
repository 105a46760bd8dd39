"""Doctor's check of the cluster's workers (docs/cluster.md), as the running daemon last heard them in
``.ambient/workers.json``: a lost worker (its heartbeat older than ``cluster.lost_after_s``), and an agent
dispatched to workers that no live worker serves (its items wait for ever)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ambient.cli._doctor.findings import Finding, capped

if TYPE_CHECKING:
    from ambient.storage.paths import BrainPaths


def check_workers(paths: BrainPaths, daemon_up: bool) -> list[Finding]:
    """Nothing without ``cluster:`` (no file) or without a daemon (nobody hears the workers: the daemon check says
    it is down)."""
    from ambient.cli._workers import workers_section

    section = workers_section(paths, daemon_up) if daemon_up else None
    if section is None:
        return []
    found = [
        Finding(
            "warning",
            "workers",
            f"worker {w['worker']} on {w['host']} is lost: no heartbeat for {w['heartbeat_age_s']:g} s "
            f"(bound {section['lost_after_s']:g} s)",
            f"look at that host (`systemctl status ambient-worker` there); its items go to another worker of "
            f"{', '.join(w['agents'])} once their lease lapses",
        )
        for w in section["workers"]
        if w["lost"]
    ]
    if section.get("taken"):
        found.append(
            Finding(
                "error",
                "workers",
                f"nothing is dispatched: {section['taken']}",
                "give this brain its own `cluster.namespace` in profil/ambient.yml (docs/cluster.md); a worker "
                "started for it now would serve the other brain",
            )
        )
    found += [
        Finding(
            "error",
            "workers",
            f"agent {agent!r} is dispatched to workers but no live worker serves it: its items wait",
            f"start one: `ambient worker --nats URL --agents {agent}` on a host (docs/cluster.md), or dispatch it "
            "local",
        )
        for agent in section["unserved"]
    ]
    return capped(found, "workers")
