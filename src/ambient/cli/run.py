"""``ambient run``: the daemon in the foreground; ``ambient demo``: the daemon on a copy of the example brain."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ambient.cli._common import EXIT_OK, EXIT_USAGE, add_command, brain_dir, fail, out, say

if TYPE_CHECKING:
    from ambient.web.server import HostedConsole


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "run", _run, "run the daemon on the brain (foreground; use systemd to keep it running)")
    p.add_argument(
        "--until-idle",
        action="store_true",
        help="exit once nothing can move without you (all runs done or waiting on an escalation)",
    )
    p.add_argument("--no-watch", action="store_true", help="do not watch files; rely on the tick interval")
    p.add_argument("--log-level", default=None, help="debug|info|warning|error (default: profil/ambient.yml)")
    p.add_argument(
        "--log-format",
        choices=("auto", "json", "console"),
        default=None,
        help="JSON lines or console (default: console on a terminal, JSON otherwise)",
    )
    d = add_command(
        sub, "demo", _demo, "run the daemon on a fresh copy of the example brain and show the result", needs_brain=False
    )
    d.add_argument("--dir", default=None, help="where to put the copy (default: a new temporary directory)")


def _log_setup(args: argparse.Namespace, root: Path) -> None:
    from ambient.config.brain import load_settings
    from ambient.service.logsetup import configure_logging
    from ambient.storage.paths import BrainPaths

    settings, _ = load_settings(BrainPaths(root), os.environ)
    level = args.log_level or (settings.log_level if settings else "info")
    fmt = args.log_format or (settings.log_format if settings else "auto")
    configure_logging(level.upper(), json=None if fmt == "auto" else fmt == "json")


def _serve(
    root: Path,
    *,
    until_idle: bool,
    watch: bool,
    progress: bool,
    log_level: str | None = None,
    log_format: str | None = None,
) -> int:
    import asyncio

    from ambient.runners.child import use_pidfd_watcher
    from ambient.service.daemon import Daemon, DaemonOptions

    def show(line: str) -> None:
        say(f"{line}")

    options = DaemonOptions(
        until_idle=until_idle,
        watch=watch,
        progress=show if progress else None,
        log_level=log_level,
        log_format=log_format,
        exits_after=True,
        forget_secrets=True,
    )
    use_pidfd_watcher()
    console = None if until_idle else _hosted_console(root)
    try:
        return asyncio.run(Daemon(root, options).serve())
    finally:
        if console is not None:
            console.stop()


def _hosted_console(root: Path) -> HostedConsole | None:
    """The web console when ``web:`` is set: served in its own thread and event loop (the daemon's loop never
    runs a line of it; service/ knows nothing of the web). One that cannot start is logged; the daemon runs on."""
    import structlog

    from ambient.config.brain import load_settings
    from ambient.core.errors import AmbientError
    from ambient.storage.paths import BrainPaths
    from ambient.web.server import Bind, HostedConsole

    settings, _ = load_settings(BrainPaths(root), os.environ)
    web = settings.web if settings is not None else None
    if web is None:
        return None

    def pem(value: str | None) -> Path | None:
        return None if value is None else (root / value if not Path(value).is_absolute() else Path(value))

    bind = Bind(web.host, web.port, pem(web.tls_cert), pem(web.tls_key), web.insecure_bind)
    console = HostedConsole(BrainPaths(root), bind)
    try:
        console.start()
    except (AmbientError, OSError) as exc:
        structlog.get_logger(__name__).error("web_console_not_started", error=str(exc))
        return None
    return console


def _run(args: argparse.Namespace) -> int:
    root = brain_dir(args)  # a brain: main() refused anything else (the daemon would scaffold claims/, locks/... there)
    _log_setup(args, root)
    return _serve(
        root,
        until_idle=args.until_idle,
        watch=not args.no_watch,
        progress=sys.stderr.isatty(),
        log_level=args.log_level,
        log_format=args.log_format,
    )


def example_brain() -> Path | None:
    """The bundled example brain (``examples/brain`` of the source tree)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "examples" / "brain"
        if (candidate / "workflows").is_dir():
            return candidate
    return None


def _demo_as_root(root: Path, *, fresh: bool) -> Path | None:
    """Run as root, ambient runs agents as its agent user, which must reach the brain and this interpreter. The
    demo's own temp folder is made searchable (not listable) for it; where the interpreter (or a ``--dir`` the
    person chose) still stops it, e.g. Python under ``/root``, the demo's brain says ``agent_user: root`` (uid 0
    without any capability) instead of failing every agent. Returns the folder that stops it, or None."""
    from ambient.storage.fsutil import atomic_write

    if os.geteuid() != 0 or os.environ.get("AMBIENT_AGENT_USER"):
        return None
    if fresh:
        root.parent.chmod(0o711)
    for target in (root, Path(sys.executable)):
        for folder in [*reversed(target.resolve().parents), target.resolve()]:
            if folder.is_dir() and not folder.stat().st_mode & 0o001:
                config = root / "profil" / "ambient.yml"
                before = config.read_text() if config.exists() else ""
                atomic_write(
                    config,
                    before + "# Written by `ambient demo` run as root: its agent user cannot reach "
                    f"{folder},\n# so the agents run as uid 0 without any capability.\nagent_user: root\n",
                )
                return folder
    return None


def _demo(args: argparse.Namespace) -> int:
    from ambient.storage.fsutil import copy_tree

    src = example_brain()
    if src is None:
        return fail("the example brain (examples/brain) is not available in this installation", EXIT_USAGE)
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="ambient-demo-")) / "brain"
    if root.exists() and any(root.iterdir()):
        return fail(f"{root} exists and is not empty; choose another --dir")
    copy_tree(src, root)
    out(f"== ambient demo: a fresh copy of the example brain in {root}")
    blocked = _demo_as_root(root, fresh=not args.dir)
    if blocked is not None:
        out(
            f"== run as root: the agent user cannot reach {blocked}, so the demo's agents run as uid 0 without any "
            "capability (agent_user: root in its profil/ambient.yml; see docs/agents-and-runners.md, "
            "'Agents never run as root')"
        )
    out("== running the daemon until it is idle (everything done, or waiting on you)...")
    from ambient.service.logsetup import configure_logging

    configure_logging("WARNING", json=False)
    code = _serve(root, until_idle=True, watch=True, progress=True, log_level="warning", log_format="console")
    if code != EXIT_OK:
        return code
    from ambient.cli.status import print_status

    out("")
    data = print_status(root, verbose=True)
    out("")
    exe = sys.argv[0] if Path(sys.argv[0]).name == "ambient" else "ambient"
    out(f"Run records (JSON lines): {root / '.ambient' / 'runs.jsonl'}")
    out(f"Run journals:             {root / '.ambient' / 'runs'}/")
    out(f"Claims:                   {root / 'claims'}/")
    out("Answer the escalations (retry the failed instance, approve the chain's gate), then let the daemon finish:")
    out(f"  {exe} --brain {root} escalations")
    for esc in data["escalations"]:
        out(f"  {exe} --brain {root} decide {esc['id']} {esc['options'][0]}")
    out(f"  {exe} --brain {root} run --until-idle")
    out(f"  {exe} --brain {root} runs")
    out("Or watch and answer in a browser (docs/console.md):")
    out(f"  {exe} --brain {root} web")
    if not args.dir:  # a folder of the system's temp dir: the person's to remove once they have looked
        out(f"The demo's brain is yours to keep or remove: rm -rf {root.parent}")
    return EXIT_OK
