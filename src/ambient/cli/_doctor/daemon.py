"""Doctor's checks of the daemon: is one holding the brain, with the settings of the file, short of resources;
down, is work waiting on it (runs in progress, packets in the inbox, notifications to send)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ambient.cli._doctor.findings import Finding, ago
from ambient.cli._doctor.state import unfinished_runs

if TYPE_CHECKING:
    from ambient.storage.paths import BrainPaths

# Each check imports what it reads inside its function (the start-up time of the CLI): building the whole parser
# (``ambient --help``, a mistyped command) imports every command module, and doctor's checks with it.


def daemon_keys(paths: BrainPaths) -> set[str] | None:
    """The model keys the running daemon has (names, from ``daemon.json``), or None when no daemon is up."""
    from ambient.service.instance import daemon_up

    if not daemon_up(paths):
        return None
    try:
        keys = json.loads((paths.state / "daemon.json").read_text()).get("model_keys")
    except (OSError, ValueError, AttributeError):
        return None
    return {str(k) for k in keys} if isinstance(keys, list) else None


def check_daemon(paths: BrainPaths, now: datetime, notified: bool) -> tuple[bool, int | None, list[Finding]]:
    """Is a daemon holding the brain? Down is a warning, an error when work waits on it (a notification only when
    ``notified``: a channel is configured; else the escalations check says nobody is told)."""
    from ambient.service.instance import daemon_up, running_pid

    if daemon_up(paths):
        pid = running_pid(paths)
        return True, pid, check_daemon_settings(paths, pid) + check_troubles(paths, True)
    waiting = _work_waiting(paths, notified)
    stopped = last_stop(paths)
    since = f" (stopped {ago(now - stopped)} ago)" if stopped is not None else ""
    message = f"the daemon is down{since}" + (f"; waiting on it: {', '.join(waiting)}" if waiting else "")
    hint = (
        f"start it: `systemctl --user start ambient` (system unit: `sudo systemctl start ambient`), or in a "
        f"terminal `ambient run --brain {paths.root}`; `journalctl -u ambient` says why it stopped"
    )
    return (
        False,
        None,
        [Finding("error" if waiting else "warning", "daemon", message, hint), *check_troubles(paths, False)],
    )


def check_daemon_settings(paths: BrainPaths, pid: int | None) -> list[Finding]:
    """A running daemon whose settings are not the file's: it did not reload (``--no-watch`` and no SIGHUP yet), or
    the file does not load now (the daemon keeps its last good settings; check_config says why)."""
    from ambient.config.brain import read_settings
    from ambient.config.settings import changed_keys

    try:
        running = json.loads((paths.state / "daemon.json").read_text()).get("settings")
    except (OSError, ValueError, AttributeError):
        return []
    if not isinstance(running, dict) or "digest" not in running:
        return []  # an older daemon: it does not say
    now = read_settings(paths, {})
    if now.digest == running.get("digest"):
        return []
    who = f"the daemon (pid {pid})" if pid else "the daemon"
    if now.settings is None:
        return [
            Finding(
                "warning",
                "config",
                f"{who} runs with the last profil/ambient.yml that loaded; the file does not load now (see above)",
                "fix the file: the daemon applies it when it changes",
            )
        ]
    keys = changed_keys(running.get("file") or {}, now.own or {})
    what = ", ".join(keys) if keys else "notify.urls (its URLs are masked here) or a comment"
    reload = f"`kill -HUP {pid}`" if pid else "`kill -HUP <pid>`"
    return [
        Finding(
            "warning",
            "config",
            f"{who} runs with other settings than profil/ambient.yml: {what} changed "
            f"since it read the file at {running.get('applied_at', '?')}",
            f"reload it: `systemctl reload ambient` or {reload} (it reloads by itself when the file "
            "changes, unless started with --no-watch)",
            paths.rel(paths.config),
        )
    ]


def check_troubles(paths: BrainPaths, up: bool) -> list[Finding]:
    """What the running daemon ran out of (descriptors, memory, processes: its health file) and a full disk
    (seen from here: the file cannot be rewritten then). Errors: work is held up until they end."""
    from ambient.service.diskfree import disk_full
    from ambient.service.troubles import read_health

    found = [
        Finding("error", "resources", c.message, f"since {c.since:%Y-%m-%d %H:%M:%S}, seen {c.count} time(s)")
        for c in (read_health(paths).conditions.values() if up else [])
        if c.kind != "disk"
    ]
    full = disk_full(paths.state if paths.state.is_dir() else paths.root)
    if full is not None:
        found.append(Finding("error", "resources", full, "the daemon holds its runs still and goes on by itself"))
    return found


def _work_waiting(paths: BrainPaths, notified: bool) -> list[str]:
    """What waits on a daemon: unfinished runs, packets in the inbox, notifications in the outbox (those it can
    send: with no channel configured they wait on a URL, not on the daemon)."""
    runs = len(unfinished_runs(paths))
    packets = len(list(paths.inbox.glob("*.json"))) if paths.inbox.is_dir() else 0
    outbox = paths.state / "outbox"
    notes = 0
    if notified and outbox.is_dir():
        notes = len([p for p in outbox.glob("*.json") if _still_to_send(paths, p)])
    parts = []
    if runs:
        parts.append(f"{runs} run(s) in progress")
    if packets:
        parts.append(f"{packets} packet(s) in the inbox")
    if notes:
        parts.append(f"{notes} notification(s) to send")
    return parts


def _still_to_send(paths: BrainPaths, entry: Path) -> bool:
    """An outbox entry the daemon will still send: a message about an escalation answered (or cancelled) since is
    dropped unsent, so it waits on nobody."""
    if entry.name.startswith("."):
        return False
    name = entry.name.removesuffix(".json")
    if not name.startswith("escalation-"):
        return True
    from ambient.human.escalation_store import EscalationStore

    try:
        return EscalationStore(paths).is_pending(name.removeprefix("escalation-"))
    except Exception:  # noqa: BLE001 - an unreadable escalation: doctor's escalations check reports it
        return True


def last_stop(paths: BrainPaths) -> datetime | None:
    """When the daemon last stopped cleanly (``.ambient/daemon-events.jsonl``)."""
    from ambient.storage.journal import read_jsonl

    events = paths.state / "daemon-events.jsonl"
    if not events.is_file():
        return None
    for rec in reversed(read_jsonl(events).records):
        if rec.get("ev") == "stopped":
            try:
                return datetime.fromisoformat(str(rec.get("at")))
            except ValueError:
                return None
    return None
