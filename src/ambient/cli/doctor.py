"""``ambient doctor``: what is wrong with a brain and how to fix it, one line per finding.

Read-only: it writes nothing into the brain (``--notify`` sends one test message, nothing else).
Severities: ``error`` (broken, or something is being lost: exit 1), ``warning`` (left over or worth a
look; it does not change the exit code unless ``--strict``), ``info``. A daemon that is down is a
warning: it is the normal state before the first start, during maintenance and in CI; it becomes an
error when work waits on it (runs in progress, packets in the inbox, notifications to send).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ambient.cli._common import EXIT_NO, EXIT_OK, add_command, brain_dir, fail, out, out_json
from ambient.cli._doctor.agents import check_agent_user, check_confinement
from ambient.cli._doctor.brain import check_brain, check_config, check_filesystem, check_state_modes, check_tmp
from ambient.cli._doctor.daemon import check_daemon
from ambient.cli._doctor.findings import ORDER, Finding, Severity
from ambient.cli._doctor.human import check_channels, check_escalations, check_notify_urls, check_telegram
from ambient.cli._doctor.state import check_claims, check_locks, check_runs
from ambient.cli._doctor.workers import check_workers

if TYPE_CHECKING:
    from ambient.config.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient doctor``."""
    p = add_command(
        sub,
        "doctor",
        _doctor,
        help="check the brain: what is wrong and how to fix it (exit 1 on an error)",
        description=(
            "Check a brain and print one line per finding with its severity and a fix: the daemon, the "
            "configuration, workflows, agents and routing that do not load (file:line), each notification channel "
            "as the running daemon sees it (up, or off and why), stale claims and locks, "
            "escalations whose notification keeps failing or that wait for long, a Telegram backlog close to the "
            "Bot API's 24-hour retention, the filesystem, leftover temp files. Writes nothing. Exit 0 when no "
            "error is found (warnings allowed unless --strict), 1 otherwise, 2 on bad usage."
        ),
    )
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--strict", action="store_true", help="warnings count as problems too (exit 1)")
    p.add_argument(
        "--notify",
        action="store_true",
        help="also send a test message to each notification URL and report those that fail",
    )
    p.add_argument(
        "--timeout", type=float, default=20.0, metavar="SECONDS", help="per-URL time limit of --notify (default 20)"
    )


@dataclass
class Report:
    """Every finding about one brain, and the daemon's state."""

    brain: str
    daemon_up: bool = False
    daemon_pid: int | None = None
    findings: list[Finding] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    def count(self, severity: Severity) -> int:
        """How many findings have this severity."""
        return sum(1 for f in self.findings if f.severity == severity)

    def ok(self, *, strict: bool = False) -> bool:
        """No error (and, when strict, no warning)."""
        return self.count("error") == 0 and not (strict and self.count("warning"))


# ------------------------------------------------------------------------------------------ the whole check


def diagnose(
    root: Path, environ: Mapping[str, str], *, now: datetime | None = None, notify: bool = False, timeout: float = 20.0
) -> Report:
    """Run every check on the brain at ``root``; a check that breaks becomes a finding, never a crash."""
    from ambient.config.settings import settings_from
    from ambient.core.errors import AmbientError
    from ambient.core.redact import redact_text
    from ambient.storage.paths import BrainPaths

    paths = BrainPaths(root)
    when = now or datetime.now().astimezone()
    report = Report(brain=str(root))
    if not any(d.is_dir() for d in (paths.agents, paths.workflows, paths.profil)):
        report.findings.append(
            Finding(
                "error",
                "brain",
                f"{root} does not look like a brain (no agents/, workflows/ or profil/)",
                f"create one with `ambient init {root}`, or pass --brain DIR",
            )
        )
        return report

    def run(name: str, check: Callable[[], Iterable[Finding]]) -> None:
        report.checked.append(name)
        try:
            report.findings.extend(check())
        except (AmbientError, OSError, ValueError) as exc:
            report.findings.append(
                Finding(
                    "error",
                    name,
                    f"could not be checked: {exc}",
                    "fix what the message names, then run `ambient doctor` again",
                )
            )

    settings: list[Settings] = []

    def config() -> list[Finding]:
        loaded, found = check_config(paths, environ)
        settings.append(loaded or settings_from({}, {}))
        return found

    run("filesystem", lambda: check_filesystem(paths))
    run("config", config)
    effective = settings[0] if settings else settings_from({}, {})

    def daemon() -> list[Finding]:
        report.daemon_up, report.daemon_pid, found = check_daemon(paths, when, effective.tells_the_person())
        return found

    loaded: list[Any] = []

    def brain() -> list[Finding]:
        found, rows = check_brain(paths, environ)
        loaded.append(found)
        return rows

    run("brain", brain)
    run("daemon", daemon)
    up = report.daemon_up
    run("claims", lambda: check_claims(paths, effective, when))
    run("locks", lambda: check_locks(paths))
    run("runs", lambda: check_runs(paths))
    run("escalations", lambda: check_escalations(paths, effective, when))
    if notify:
        run("notify", lambda: check_notify_urls(paths, environ, timeout))
    said: list[bool] = []

    def channels() -> list[Finding]:
        found, daemon_said = check_channels(paths, up)
        said.append(daemon_said)
        return found

    run("channels", channels)
    run("telegram", lambda: check_telegram(paths, effective, up, when, environ, daemon_said=any(said)))
    run("tmp", lambda: check_tmp(paths))
    run("state modes", lambda: check_state_modes(paths))
    run("confinement", check_confinement)
    runners = getattr(loaded[0], "runners", {}) if loaded else {}
    run("agent user", lambda: check_agent_user(paths, effective.agent_user, runners))
    if effective.cluster is not None:
        run("workers", lambda: check_workers(paths, up))
    # Last line of defence: a token inside a path, an argv or a notifier's error never reaches the output.
    report.findings = [replace(f, message=redact_text(f.message), hint=redact_text(f.hint)) for f in report.findings]
    report.findings.sort(key=lambda f: ORDER[f.severity])  # stable: checks keep their order within a severity
    return report


def _doctor(args: argparse.Namespace) -> int:
    root = brain_dir(args)
    if not root.is_dir():
        return fail(f"{root} is not a directory; run in a brain or pass --brain DIR (`ambient init DIR` creates one)")
    started = time.monotonic()
    report = diagnose(root, os.environ, notify=args.notify, timeout=args.timeout)
    ok = report.ok(strict=args.strict)
    if args.json:
        out_json(
            {
                "brain": report.brain,
                "ok": ok,
                "daemon": {"up": report.daemon_up, "pid": report.daemon_pid},
                "counts": {s: report.count(s) for s in ("error", "warning", "info")},
                "checked": report.checked,
                "findings": [asdict(f) for f in report.findings],
            }
        )
        return EXIT_OK if ok else EXIT_NO
    daemon = f"up (pid {report.daemon_pid})" if report.daemon_up else "down"
    out(f"ambient doctor: {report.brain} (daemon {daemon})")
    for finding in report.findings:
        out(finding.text())
    errors, warnings = report.count("error"), report.count("warning")
    checked = f" ({', '.join(report.checked)} checked in {time.monotonic() - started:.1f} s)" if report.checked else ""
    if errors or warnings:
        out(f"{errors} error(s), {warnings} warning(s){checked}")
    else:
        out(f"ok: nothing wrong found{checked}")
    return EXIT_OK if ok else EXIT_NO
