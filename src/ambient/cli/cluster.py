"""``ambient cluster workers``: the workers serving this brain's dispatched agents (docs/cluster.md), as each one
last said: host, agents, slots, agents running, and how long ago."""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ambient.cli._common import EXIT_NO, EXIT_OK, add_command, brain_dir, fail, out, out_json

if TYPE_CHECKING:
    from ambient.config.settings import ClusterSettings


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
            "agents running now and its last heartbeat (LOST after cluster.lost_after_s, 20 s by default: it died "
            "without saying so). Exit 1 when none is alive."
        ),
    )
    w.add_argument("--json", action="store_true", help="JSON output")
    c = add_command(
        actions,
        "creds",
        _creds,
        help="a worker's NATS user, allowed only its agents' subjects: the server's entry and its password file",
        description=(
            "Write WORKER's password file (user:password, mode 0600; give it to `ambient worker --creds`) and print "
            "the entry to add to the users of the NATS server's authorization block: the worker may publish and "
            "subscribe to its agents' subjects only (their consumers, acks, the attempts bucket, its own record), "
            "so the server refuses it another agent's SPAWNs. Each agent must be an agent of this brain."
        ),
    )
    c.add_argument("worker", metavar="WORKER", help="the worker's name (its NATS user)")
    f = add_command(
        actions,
        "forget",
        _forget,
        help="remove the record of a lost worker (a host retired without a clean stop)",
        description=(
            "Delete WORKER's record from the workers bucket: `ambient cluster workers`, status and doctor no longer "
            "show it. Refused while it is alive (it would say it is again at its next heartbeat). A lost worker "
            "is no longer shown an hour after its last heartbeat anyway."
        ),
    )
    f.add_argument("worker", metavar="WORKER", help="the worker's name, as `ambient cluster workers` shows it")
    c.add_argument("--agents", required=True, metavar="A,B", help="the agents it runs (comma separated)")
    c.add_argument("--out", type=Path, required=True, metavar="FILE", help="where its password file goes (0600)")


def _cluster(args: argparse.Namespace) -> tuple[ClusterSettings, str | None] | str:
    """The brain's ``cluster:`` settings and the daemon's credentials file, or why there are none to use."""
    import importlib.util

    from ambient.config.brain import load_settings
    from ambient.storage.paths import BrainPaths

    paths = BrainPaths(brain_dir(args))
    settings, _ = load_settings(paths, os.environ)
    cluster = settings.cluster if settings is not None else None
    if cluster is None:
        return "no cluster: in profil/ambient.yml (or it does not validate: ambient validate)"
    if importlib.util.find_spec("nats") is None:
        return "the cluster extra is not installed: pip install 'ambient[cluster]'"
    return cluster, str(paths.root / cluster.creds) if cluster.creds is not None else None


def _forget(args: argparse.Namespace) -> int:
    import asyncio

    found = _cluster(args)
    if isinstance(found, str):
        return fail(found)
    cluster, creds = found

    async def forget() -> str | None:
        from ambient.cluster.link import connect, workers
        from ambient.cluster.protocol import name_token

        link = await connect(list(cluster.urls), creds, name="ambient cluster forget", names=cluster.names(), once=True)
        try:
            record = next((w for w in await workers(link) if w.get("worker") == args.worker), None)
            if record is None:
                return f"no record of worker {args.worker!r} (ambient cluster workers lists them)"
            age = time.time() - float(record.get("at") or 0)
            if age <= cluster.lost_after_s:
                return f"worker {args.worker!r} is alive (heartbeat {age:.0f} s ago): stop it, it then leaves at once"
            await link.workers.delete(name_token(args.worker))
            return None
        finally:
            await link.close()

    try:
        refused = asyncio.run(forget())
    except Exception as exc:  # noqa: BLE001 - any failure to reach the server is said, not a traceback
        return fail(f"cannot reach {', '.join(cluster.urls)}: {exc or type(exc).__name__}", EXIT_NO)
    if refused is not None:
        return fail(refused, EXIT_NO)
    out(f"forgot worker {args.worker}")
    return EXIT_OK


def _workers(args: argparse.Namespace) -> int:
    import asyncio

    from ambient.cluster.roster import forgotten

    found_cluster = _cluster(args)
    if isinstance(found_cluster, str):
        return fail(found_cluster)
    cluster, creds = found_cluster

    async def read() -> list[dict[str, Any]]:
        from ambient.cluster.link import connect, workers

        link = await connect(
            list(cluster.urls), creds, name="ambient cluster workers", names=cluster.names(), once=True
        )
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
        w["lost"] = age > cluster.lost_after_s  # the word `ambient status` and the console use
    found = [w for w in found if not forgotten(w["age_s"], cluster.lost_after_s)]
    if args.json:
        out_json(found)
    elif not found:
        out("no worker has said it is alive")
    else:
        for w in found:
            agents = ",".join(str(a) for a in w.get("agents") or [])
            running = [str(k) for k in w.get("running") or []]
            if w["lost"]:  # its last word: those items may have moved on since
                doing = f"was running {len(running)}" + (f" ({', '.join(running)})" if running else "")
            else:
                waiting = [str(a) for a in w.get("waiting") or []]
                doing = f"running {w.get('busy')}" + (
                    f"  waiting for dispatch of {', '.join(waiting)}" if waiting else ""
                )
            state = "LOST" if w["lost"] else "alive"
            out(
                f"{w.get('worker')}  host {w.get('host')}  agents {agents}  slots {w.get('slots')}  "
                f"{doing}  {state}, {w['age_s']:g} s ago"
            )
    return EXIT_OK if any(not w["lost"] for w in found) else EXIT_NO


_USER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _creds(args: argparse.Namespace) -> int:
    from ambient.cluster.protocol import Names, worker_permissions
    from ambient.config.brain import load_settings
    from ambient.kernel.agents import read_agents, why_absent
    from ambient.storage.fsutil import atomic_write
    from ambient.storage.paths import BrainPaths

    if not _USER.match(args.worker):
        return fail(f"{args.worker!r} is not a worker name: letters, digits, . _ - (64 at most)")
    agents = [a.strip() for a in str(args.agents).split(",") if a.strip()]
    paths = BrainPaths(brain_dir(args))
    settings, _ = load_settings(paths, os.environ)
    if settings is None:
        return fail("profil/ambient.yml does not validate (ambient validate): its cluster.namespace is unknown")
    names = settings.cluster.names() if settings.cluster is not None else Names()
    files = read_agents(paths)
    unknown = [a for a in agents if a not in files.agents]
    if not agents or unknown:
        said = [f"agent {a!r} {why_absent(a, files.unloaded)}" for a in unknown if a in files.unloaded]
        missing = [a for a in unknown if a not in files.unloaded]
        if missing or not agents:
            said.append(f"{', '.join(missing) or 'none given'}: not an agent of this brain (agents/NAME.md)")
        return fail(f"--agents: {'; '.join(said)}")
    password = secrets.token_urlsafe(32)
    atomic_write(args.out, f"{args.worker}:{password}\n", mode=0o600)
    entry = {"user": args.worker, "password": password, "permissions": worker_permissions(names, args.worker, agents)}
    out(
        f"# the NATS server's authorization block, users: [...] (worker {args.worker}, agents {', '.join(agents)}, "
        f"namespace {names.namespace})"
    )
    out(json.dumps(entry, indent=2))
    out(f"# on the worker: ambient worker --nats URL --creds {args.out} --agents {','.join(agents)}")
    return EXIT_OK
