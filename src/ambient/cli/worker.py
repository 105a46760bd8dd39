"""``ambient worker``: run the dispatched agents of a brain on this host, pulled from NATS JetStream
(docs/cluster.md). The daemon stays the only decider; a worker only runs agents and sends back their results."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from ambient.cli._common import EXIT_OK, add_command, brain_dir, fail

if TYPE_CHECKING:
    from ambient.config.brain import Brain

_AGENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient worker``."""
    p = add_command(
        sub,
        "worker",
        _worker,
        "run dispatched agents on this host (cluster: in profil/ambient.yml; the cluster extra)",
        description=(
            "Pull the SPAWNs of the named agents from NATS JetStream and run them here with the command runner, "
            "each under a lease, sending each result back once. --brain names this host's copy of the brain (a "
            "clone of its repository): agents run there. Stop with Ctrl-C or SIGTERM (the agents running are "
            "stopped; their items go to another worker)."
        ),
    )
    p.add_argument("--nats", action="append", required=True, metavar="URL", help="NATS server URL (repeatable)")
    p.add_argument("--creds", type=Path, default=None, metavar="FILE", help="NATS credentials file of this worker")
    p.add_argument("--agents", required=True, metavar="A,B", help="the agents this worker runs (comma separated)")
    p.add_argument("--slots", type=int, default=1, metavar="N", help="agents run at once (default 1)")
    p.add_argument("--name", default=None, help="this worker's name (default: host-pid)")
    p.add_argument("--log-format", choices=("auto", "json", "console"), default="auto", help="log lines format")
    p.add_argument(
        "--print-unit",
        action="store_true",
        help="print the systemd unit that runs this worker with these arguments, and exit (docs/cluster.md)",
    )


def _worker(args: argparse.Namespace) -> int:
    import importlib.util

    agents = [a.strip() for a in str(args.agents).split(",") if a.strip()]
    bad = [a for a in agents if not _AGENT.match(a)]
    if not agents or bad:
        return fail(f"--agents: {', '.join(bad) or 'none given'}: expected agent names, comma separated")
    if not 1 <= args.slots <= 256:
        return fail(f"--slots {args.slots}: expected 1 to 256")
    if args.print_unit:
        found = _brain(args, agents)  # a unit that would fail at each start is said now
        return fail(found) if isinstance(found, str) else _print_unit(args, agents)
    if importlib.util.find_spec("nats") is None:
        return fail("ambient worker needs the cluster extra: pip install 'ambient[cluster]'")
    if args.creds is not None and not args.creds.is_file():
        return fail(f"--creds {args.creds}: no such file")
    return _serve(args, agents)


def _print_unit(args: argparse.Namespace, agents: list[str]) -> int:
    """The unit for this host: the ``ambient`` of this installation, these arguments; the credentials file given is
    where systemd reads it from (it may be readable by root only, so it is not looked at here)."""
    import sys

    from ambient.cluster.unit import worker_unit

    try:
        text = worker_unit(
            str(Path(sys.executable).parent / "ambient"),
            str(brain_dir(args)),
            list(args.nats),
            agents,
            slots=args.slots,
            creds=str(args.creds.absolute()) if args.creds is not None else None,
        )
    except ValueError as exc:
        return fail(str(exc))
    sys.stdout.write(text)
    for problem in _unit_problems(str(Path(sys.executable).parent / "ambient"), str(brain_dir(args))):
        sys.stderr.write(f"warning: {problem}\n")  # the unit is right for a host set up as its header says
    return EXIT_OK


def _unit_problems(ambient: str, brain: str, user: str = "ambient") -> list[str]:
    """What this host lacks for the unit to start: its user, and folders on the way that user cannot enter."""
    import pwd
    import stat

    from ambient.cluster.unit import unit_problems

    try:
        entry: pwd.struct_passwd | None = pwd.getpwnam(user)
    except KeyError:
        entry = None
    closed: list[str] = []
    for target in (ambient, brain):
        for folder in reversed(Path(target).parents if target != brain else (Path(brain), *Path(brain).parents)):
            try:
                st = folder.stat()
            except OSError:
                continue
            mine = entry is not None and st.st_uid == entry.pw_uid
            if not (st.st_mode & (stat.S_IXUSR if mine else stat.S_IXOTH)) and str(folder) not in closed:
                closed.append(str(folder))
    return unit_problems(brain, user, entry is not None, closed)


def _namespace(root: Path) -> tuple[str | None, str]:
    """The cluster namespace of this host's copy of the brain (its ``profil/ambient.yml``, as the daemon reads its
    own): the daemon and its workers agree on it without a flag. None, and the first problem, when the settings do
    not validate."""
    from ambient.cluster.protocol import DEFAULT_NAMESPACE
    from ambient.config.brain import load_settings
    from ambient.storage.paths import BrainPaths

    settings, problems = load_settings(BrainPaths(root), os.environ)
    if settings is None:
        return None, str(problems[0]) if problems else "profil/ambient.yml does not validate"
    return (settings.cluster.namespace if settings.cluster is not None else DEFAULT_NAMESPACE), ""


def _brain(args: argparse.Namespace, agents: list[str]) -> tuple[Brain, str] | str:
    """This host's copy of the brain, loaded as the daemon loads it, and its cluster namespace; or what stops the
    worker from running its agents (an agent it cannot run is said now, not at each item it would fail)."""
    from ambient.config.brain import load_brain, worker_refusals
    from ambient.storage.paths import BrainPaths

    namespace, problem = _namespace(brain_dir(args))
    if namespace is None:
        return f"{problem} (in {brain_dir(args)}: ambient validate); the brain's cluster.namespace is unknown"
    brain = load_brain(BrainPaths(brain_dir(args)), os.environ)  # its settings validated just above
    refusals = worker_refusals(brain, agents)
    if refusals:
        return f"this worker cannot run its agents ({brain.paths.root}):\n  " + "\n  ".join(refusals)
    return brain, namespace


def _serve(args: argparse.Namespace, agents: list[str]) -> int:
    # The worker's modules (and nats) are imported here only: a brain without a cluster never loads them.
    import asyncio
    import signal

    from ambient.cluster.worker import Worker, WorkerOptions
    from ambient.runners.command import CommandRunner
    from ambient.runners.confinement import AGENT_USER, default_agent_user, ensure_agent_user
    from ambient.runners.spawner import Spawner
    from ambient.runners.spawner import available as spawner_available
    from ambient.service.logsetup import configure_logging

    found = _brain(args, agents)
    if isinstance(found, str):
        return fail(found)
    brain, namespace = found
    configure_logging("INFO", json=None if args.log_format == "auto" else args.log_format == "json")
    options = WorkerOptions(
        urls=list(args.nats),
        creds=str(args.creds) if args.creds is not None else None,
        brain=brain_dir(args),
        agents=agents,
        slots=args.slots,
        name=args.name or "",
        namespace=namespace,
    )

    async def main() -> None:
        spawner = Spawner(end_with_parent=True) if spawner_available() else None
        # A worker run as root runs its agents as the brain's agent_user setting (AMBIENT_AGENT_USER overrides it,
        # ambient-agent by default), as the daemon does.
        agent_user = default_agent_user(os.geteuid(), brain.settings.agent_user)
        if agent_user == AGENT_USER:
            ensure_agent_user()
        runner = CommandRunner(spawner=spawner, agent_user=agent_user)
        worker = Worker(options, runner)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        try:
            await worker.serve()
        finally:
            await runner.terminate_all(2.0)
            runner.close()

    os.umask(0o077)
    try:
        asyncio.run(main())
    except Exception as exc:  # noqa: BLE001 - the server refused or cannot be used: said, exit 1
        # A permission the server refuses shows as a timeout of the JetStream call (docs/cluster.md).
        return fail(f"the worker stopped: {exc or type(exc).__name__} (are its credentials allowed its agents?)", 1)
    return EXIT_OK
