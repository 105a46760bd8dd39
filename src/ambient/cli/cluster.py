"""``ambient cluster workers``: the workers serving this brain's dispatched agents (docs/cluster.md), as each one
last said: host, agents, slots, agents running, and how long ago."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from ambient.cli._common import EXIT_NO, EXIT_OK, add_command, brain_dir, fail, out, out_json

#: A worker silent for longer than this is shown as stale (it says it is alive every 5 s).
STALE_S = 20.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient cluster workers``."""
    p = add_command(sub, "cluster", None, help="agents on other hosts: the workers (cluster: in profil/ambient.yml)")
    actions = p.add_subparsers(dest="cluster_action", metavar="ACTION", required=True)
    w = add_command(
        actions,
        "workers",
        _workers,
        help="the workers: host, agents, slots, agents running, last heartbeat",
        description=(
            "Ask the NATS server of `cluster:` which workers said they are alive: each one's host, agents, slots, "
            "agents running now and its last heartbeat (stale after 20 s: it died without saying so). Exit 1 "
            "when none is alive."
        ),
    )
    w.add_argument("--json", action="store_true", help="JSON output")


def _workers(args: argparse.Namespace) -> int:
    import asyncio
    import importlib.util

    from ambient.config.brain import load_settings
    from ambient.storage.paths import BrainPaths

    paths = BrainPaths(brain_dir(args))
    settings, _ = load_settings(paths, os.environ)
    cluster = settings.cluster if settings is not None else None
    if cluster is None:
        return fail("no cluster: in profil/ambient.yml (or it does not validate: ambient validate)")
    if importlib.util.find_spec("nats") is None:
        return fail("the cluster extra is not installed: pip install 'ambient[cluster]'")
    creds = str(paths.root / cluster.creds) if cluster.creds is not None else None

    async def read() -> list[dict[str, Any]]:
        from ambient.cluster.link import connect, workers

        link = await connect(list(cluster.urls), creds, name="ambient cluster workers", once=True)
        try:
            return await workers(link)
        finally:
            await link.close()

    try:
        found = asyncio.run(read())
    except Exception as exc:  # noqa: BLE001 - any failure to reach the server is said, not a traceback
        return fail(f"cannot reach {', '.join(cluster.urls)}: {exc or type(exc).__name__}", EXIT_NO)
    now = time.time()
    for w in found:
        age = now - float(w.get("at") or 0)
        w["age_s"] = round(age, 1)
        w["stale"] = age > STALE_S
    if args.json:
        out_json(found)
    elif not found:
        out("no worker has said it is alive")
    else:
        for w in found:
            agents = ",".join(str(a) for a in w.get("agents") or [])
            state = "stale" if w["stale"] else "alive"
            out(
                f"{w.get('worker')}  host {w.get('host')}  agents {agents}  slots {w.get('slots')}  "
                f"running {w.get('busy')}  {state}, {w['age_s']:g} s ago"
            )
    return EXIT_OK if any(not w["stale"] for w in found) else EXIT_NO
