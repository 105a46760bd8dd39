"""Doctor's checks of the brain's files: the filesystem it lives on, ``profil/ambient.yml``, the agents, zones,
routing, runners and workflows as the daemon loads them, and temp files left by interrupted writes."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ambient.cli._doctor.agents import check_ai_runners, check_programs
from ambient.cli._doctor.daemon import daemon_keys
from ambient.cli._doctor.findings import Finding, Severity, capped

if TYPE_CHECKING:
    from ambient.cli.config import EffectiveConfig
    from ambient.config.settings import Settings
    from ambient.storage.paths import BrainPaths

_TMP_RE = re.compile(r"^\..+\.(?:tmp|stale)\.(\d+)\.[0-9a-f]+$")

# Each check imports what it reads inside its function (the start-up time of the CLI): building the whole parser
# (``ambient --help``, a mistyped command) imports every command module, and doctor's checks with it.


def check_filesystem(paths: BrainPaths) -> list[Finding]:
    """The brain and its state on a filesystem whose locks and renames can be trusted."""
    from ambient.core.errors import UnsupportedFilesystemError
    from ambient.storage.fsutil import check_local_filesystem

    found: list[Finding] = []
    for where in (paths.root, paths.state):
        if not where.is_dir():
            continue
        try:
            check_local_filesystem(where)
        except UnsupportedFilesystemError as exc:
            found.append(
                Finding(
                    "error",
                    "filesystem",
                    str(exc),
                    "move the brain (or its .ambient/) to a local filesystem: ext4, xfs, btrfs, tmpfs",
                )
            )
    return found


def check_config(paths: BrainPaths, environ: Mapping[str, str]) -> tuple[Settings | None, list[Finding]]:
    """``profil/ambient.yml`` with the environment applied: every problem at its line or variable."""
    from ambient.cli.config import effective_config

    cfg = effective_config(paths, environ)
    found = []
    for p in cfg.problems:
        if p.file.startswith("$"):
            hint = f"fix or unset {p.file[1:]} (`ambient config show` prints the effective settings)"
        else:
            hint = "fix the file (`ambient config template` lists every setting with its default); " + _until_fixed(cfg)
        found.append(Finding("error", "config", p.message, hint, p.file, p.line))
    return cfg.settings or cfg.salvaged, found


def _until_fixed(cfg: EffectiveConfig) -> str:
    """What ``ambient run`` does until the file is fixed, as choose_settings decides it."""
    if cfg.last_good is not None:
        when = f"{cfg.last_good.saved_at:%Y-%m-%d %H:%M:%S} UTC"
        return (
            f"until then `ambient run` runs with the last good settings, from {when} "
            f"({cfg.last_good.source}: the last {cfg.file} a daemon loaded)"
        )
    if cfg.runs_with == "defaults":
        return (
            "until then `ambient run` starts on defaults (nothing of the file parses and no last good settings were "
            "kept: no daemon loaded it before) and a reload keeps the previous settings"
        )
    return (
        "until then `ambient run` starts with the keys that are valid (the others at their defaults) and a reload "
        "keeps the previous settings"
    )


_LOAD_HINTS: tuple[tuple[str, str, str], ...] = (
    (
        "workflows/",
        "workflows",
        "fix the workflow (`ambient validate` lists every problem); the daemon does not run "
        "a file that does not load (a reload keeps its last good version)",
    ),
    ("agents/", "agents", "fix the agent's frontmatter; `ambient validate` lists every problem"),
    (
        "profil/routing.yml",
        "routing",
        "fix the route; a route that does not load is not applied (`ambient matrix` shows the effective access matrix)",
    ),
    ("profil/zones.yml", "zones", "fix the zone rule; `ambient validate` lists every problem"),
)


def _load_hint(file: str, message: str = "") -> tuple[str, str]:
    for prefix, check, hint in _LOAD_HINTS:
        if file.startswith(prefix):
            return check, hint
    if file.endswith("ambient.yml") and not message.startswith("runner of "):
        return "config", "fix the setting (`ambient config template` lists every setting with its meaning)"
    return "runners", "fix the agent's `ambient.runner` (or `runners:` in profil/ambient.yml); `ambient validate`"


def check_brain(paths: BrainPaths, environ: Mapping[str, str]) -> tuple[Any, list[Finding]]:
    """Agents, zones, routing, runners and workflows as the daemon loads them."""
    from ambient.config.brain import load_brain, read_settings

    brain = load_brain(paths, environ)
    reported = {str(p) for p in read_settings(paths, environ).problems}  # by check_config already
    found = []
    for p in brain.problems:
        if str(p) in reported:
            continue
        check, hint = _load_hint(p.file, p.message)
        severity: Severity = "error" if p.severity == "error" else "warning"
        if severity == "warning":  # it loads all the same: say what it is, not that it does not run
            hint = "a warning: the file loads and runs; `ambient validate --strict` treats warnings as errors"
        found.append(Finding(severity, check, p.message, hint, p.file, p.line))
    found += check_programs(paths, brain)
    found += check_ai_runners(brain.runners, environ, daemon_keys=daemon_keys(paths))
    return brain, found


def check_tmp(paths: BrainPaths) -> list[Finding]:
    """Temp files of interrupted writes whose writer is dead (only named, never removed here)."""
    from ambient.core.process import process_start_time

    dirs = [
        paths.root,
        paths.agents,
        paths.claims,
        paths.locks,
        paths.profil,
        paths.workflows,
        paths.state,
        paths.inbox,
        paths.escalations,
        paths.run_journals,
        paths.channels,
        paths.state / "outbox",
    ]
    left: list[str] = []
    for d in dirs:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in sorted(names):
            m = _TMP_RE.match(name)
            if m is None or (d / name).is_dir():
                continue
            pid = int(m.group(1))
            if pid != os.getpid() and process_start_time(pid) is None:
                left.append(paths.rel(d / name))
    if not left:
        return []
    shown = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
    return [
        Finding(
            "warning",
            "tmp",
            f"{len(left)} temp file(s) left by interrupted writes: {shown}",
            "harmless: `ambient run` removes them at start (`ambient lock cleanup` in locks/); they are never "
            "a real file, so deleting them by hand is safe too",
        )
    ]


def check_state_modes(paths: BrainPaths) -> list[Finding]:
    """What in ``.ambient/`` is open to others now (the daemon closes it at its next check), and what the daemon
    found open and closed again lately (someone, an agent run as root or a person's ``chmod``, opened it)."""
    from ambient.service.statemodes import NOT_OURS, read_restored
    from ambient.storage.fsutil import keep_state_modes

    if not paths.state.is_dir():
        return []
    owner = (os.geteuid(), os.getegid()) if os.geteuid() == 0 else None
    rows = [
        Finding(
            "error",
            "state modes",
            f"{paths.rel(Path(r.path))} is {r.was}, open to other users"
            + (f" (owned by {r.owner})" if r.owner else "")
            + f"; ambient's private state is {r.now}",
            f"a running daemon closes it at its next check; else `chmod {r.now[1:]} {r.path}`",
            paths.rel(Path(r.path)),
        )
        for r in keep_state_modes(paths.state, owner, fix=False, skip=NOT_OURS)
    ]
    rows += [
        Finding(
            "warning",
            "state modes",
            f"ambient closed {paths.rel(Path(str(r.get('path'))))} again at {r.get('at')}: it was {r.get('was')}"
            + (f", owned by {r['owner']}" if r.get("owner") else "")
            + f" (now {r.get('now')})",
            "something opened ambient's private state: an agent run as root (`user: root`) or a chmod by hand",
            paths.rel(Path(str(r.get("path")))),
        )
        for r in read_restored(paths)
    ]
    return capped(rows, "state entries open to others")
