"""Doctor's checks of what waits on the person: escalations (unreadable, waiting for long, their notification
failing), notifications that keep failing or reach nobody, and Telegram answers (a bot that cannot be built, a
backlog close to the Bot API's 24-hour retention)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ambient.cli._common import quiet_logs
from ambient.cli._doctor.daemon import last_stop
from ambient.cli._doctor.findings import Finding, ago, capped, mtime
from ambient.cli._doctor.state import questions_kept

if TYPE_CHECKING:
    from ambient.config.settings import Settings
    from ambient.storage.paths import BrainPaths

#: A notification that failed this many times "keeps failing".
FAILING_ATTEMPTS = 3
#: An escalation pending longer than this is reported (it waits on the person).
LONG_PENDING = timedelta(hours=24)
#: The Bot API keeps unconfirmed updates (button presses) this long.
TELEGRAM_RETENTION = timedelta(hours=24)
#: Past this much unread time, a Telegram backlog is close to the retention: an error.
TELEGRAM_CLOSE = timedelta(hours=12)

# Each check imports what it reads inside its function (the start-up time of the CLI): building the whole parser
# (``ambient --help``, a mistyped command) imports every command module, and doctor's checks with it.


def check_escalations(paths: BrainPaths, settings: Settings, now: datetime) -> list[Finding]:
    """Unreadable escalations, notifications that keep failing, escalations waiting for long, nobody notified."""
    from ambient.human.escalation_store import EscalationStore

    if not paths.escalations.is_dir():
        return []
    scan = EscalationStore(paths).scan()
    kept = questions_kept(paths) if scan.problems else {}
    found = []
    for p in scan.problems:
        journal = kept.get(Path(p.file).stem)
        if journal is None:
            hint = "fix or restore the file (ambient never rewrites it); `ambient escalations` lists the others"
            found.append(Finding("error", "escalations", p.message, hint, p.file, p.line))
        else:  # a run waits on it: the daemon writes it again from the run's journal
            message = f"{p.message}; its run waits on it: rebuilt from {journal} when the daemon starts or reloads"
            hint = "start the daemon (or `systemctl reload ambient`); a file not empty is kept as <id>.yml.unreadable"
            found.append(Finding("error", "escalations", message, hint, p.file, p.line))
    pending = [e for e in scan.escalations if e.status == "pending"]
    outbox = _outbox_entries(paths)
    failing, waiting = [], []
    for esc in pending:
        entry = outbox.get(f"escalation-{esc.id}")
        tries = max(esc.notify.count, entry.attempts if entry is not None else 0)
        last_error = (
            entry.last_error
            if entry is not None and entry.last_error
            else next((a.error for a in reversed(esc.notify.attempts) if a.error), None)
        )
        answer = f"`ambient decide {esc.id} {'|'.join(o.key for o in esc.options)}`"
        where = paths.rel(paths.escalations / f"{esc.id}.yml")
        if esc.notify.delivered_at is None and tries >= FAILING_ATTEMPTS:
            failing.append(
                Finding(
                    "error",
                    "escalations",
                    f"notification of {esc.id} ({esc.where}) failed {tries} times"
                    + (f", last: {last_error}" if last_error else ""),
                    "check the URLs with `ambient notify test` (or `ambient doctor --notify`); "
                    f"answer meanwhile: {answer}",
                    where,
                )
            )
        age = now - esc.created_at
        if age >= LONG_PENDING:
            late = (
                f", past its deadline {esc.deadline.isoformat(timespec='minutes')}"
                if esc.deadline is not None and esc.deadline < now
                else ""
            )
            waiting.append(
                Finding(
                    "warning",
                    "escalations",
                    f"{esc.id} ({esc.where}) has waited on you for {ago(age)}{late}",
                    answer,
                    where,
                )
            )
    found += capped(failing, "failing notifications") + capped(waiting, "escalations waiting")
    for entry in outbox.values():
        if entry.message.kind != "escalation" and entry.attempts >= FAILING_ATTEMPTS:
            found.append(
                Finding(
                    "warning",
                    "notify",
                    f"notification {entry.id} ({entry.message.title[:60]}) failed {entry.attempts} times"
                    + (f", last: {entry.last_error[:200]}" if entry.last_error else ""),
                    "check the URLs with `ambient notify test`; it is given up after 24 h",
                )
            )
    parked = paths.state / "outbox" / "expired"
    gave_up = len(list(parked.glob("*.json"))) if parked.is_dir() else 0
    if gave_up:
        found.append(
            Finding(
                "warning",
                "notify",
                f"{gave_up} notification(s) were given up after 24 h of failures",
                f"check the URLs with `ambient notify test`; read then delete {paths.rel(parked)}/",
            )
        )
    if pending and not settings.tells_the_person():
        found.append(
            Finding(
                "warning",
                "notify",
                f"{len(pending)} escalation(s) wait on you and no notification URL is configured: nobody is told",
                "set notify.urls in profil/ambient.yml (or $AMBIENT_NOTIFY_URLS); `ambient escalations` lists them",
            )
        )
    return found


def _outbox_entries(paths: BrainPaths) -> dict[str, Any]:
    """Pending outbox entries by id, read without creating or sweeping anything."""
    from pydantic import ValidationError

    from ambient.human.outbox import OutboxEntry
    from ambient.storage.fsutil import read_capped

    directory = paths.state / "outbox"
    entries: dict[str, Any] = {}
    if not directory.is_dir():
        return entries
    for path in sorted(directory.glob("*.json")):
        if path.name.startswith("."):
            continue
        try:
            entry = OutboxEntry.model_validate_json(read_capped(path, 1024 * 1024))
        except (OSError, ValueError, ValidationError):
            continue
        entries[entry.id] = entry
    return entries


def check_notify_urls(paths: BrainPaths, environ: Mapping[str, str], timeout: float) -> list[Finding]:
    """Send one test message through each configured URL (``--notify`` only: never by default)."""
    import asyncio
    import logging
    import socket

    from ambient.core.errors import DeliveryError, InputError
    from ambient.core.redact import SecretRegistry
    from ambient.human.messages import Message
    from ambient.human.notify import AppriseNotifier, notify_urls_from

    registry = SecretRegistry()
    try:
        urls = notify_urls_from(paths, environ, registry)
    except InputError as exc:
        return [Finding("error", "notify", exc.message, "fix the notification configuration", exc.file, exc.line)]
    if not urls:
        return [
            Finding(
                "warning",
                "notify",
                "no notification URL is configured: escalations reach nobody",
                "set notify.urls in profil/ambient.yml or $AMBIENT_NOTIFY_URLS",
            )
        ]
    message = Message(
        title="ambient doctor: test notification",
        kind="info",
        dedupe_id="doctor-test",
        body=f"Test message from `ambient doctor` on {socket.gethostname()}: this URL works.",
    )
    quiet_logs(logging.ERROR)  # the findings say everything; the notifier's own lines would repeat them
    try:
        report = asyncio.run(AppriseNotifier(urls, timeout=timeout, registry=registry).send(message))
    except DeliveryError as exc:
        report = exc.report
    found = []
    for r in report.results:
        if r.ok:
            found.append(Finding("info", "notify", f"notification URL {r.display} works (a test message was sent)"))
        else:
            found.append(
                Finding(
                    "error",
                    "notify",
                    f"notification URL {r.display} does not work: {r.detail or 'refused'}",
                    "check the URL (apprise syntax), its token and the network; "
                    "`ambient notify test --url URL` tries one",
                )
            )
    return found


def check_channels(paths: BrainPaths, up: bool) -> tuple[list[Finding], bool]:
    """Each notification channel as the running daemon sees it (up, off and why), and whether it said: the daemon
    alone knows whether its bot was refused or its token file unreadable when it last read it (a file fixed since
    but not reloaded reads fine from here)."""
    from ambient.human.channelstate import describe
    from ambient.service.notifications import running_channels

    if not up:
        note = "the daemon is down: the notification channels are checked from the configuration alone"
        hint = "the daemon says how it reaches you once it runs (`ambient doctor` and `ambient notify test` ask it)"
        return [Finding("info", "channels", note, hint)], False
    report = running_channels(paths)
    if report is None:
        return [Finding("info", "channels", "the running daemon did not say how its notification channels are")], False
    found = []
    for state in report.channels:
        if state.state == "off":
            fix = (
                "fix the bot token (LoadCredential=telegram-token:... or telegram.token_file), then reload: "
                "`systemctl reload ambient` or `kill -HUP <pid>`"
                if state.channel == "telegram"
                else "check the URL with `ambient notify test`; it is retried by itself"
            )
            found.append(Finding("error", "channels", f"{describe(state)} (since {state.since:%Y-%m-%d %H:%M})", fix))
        else:
            found.append(Finding("info", "channels", describe(state)))
    return found, True


def check_telegram(
    paths: BrainPaths,
    settings: Settings,
    up: bool,
    now: datetime,
    environ: Mapping[str, str] | None = None,
    *,
    daemon_said: bool = False,
) -> list[Finding]:
    """Telegram answers: a bot ambient cannot build (no token, a malformed one: judged here only when the running
    daemon did not say, ``daemon_said``), presses saved but not acted upon, and a backlog close to the Bot API's
    24-hour retention."""
    from ambient.human.escalation_store import EscalationStore
    from ambient.human.telegram import STATE_FILE, token_problem
    from ambient.service.notifications import telegram_token
    from ambient.storage.fsutil import read_capped

    tg = settings.telegram
    state_path = paths.state / STATE_FILE
    exists = state_path.is_file()
    if not tg.answers and not exists:
        return []
    found: list[Finding] = []
    if daemon_said:  # the running daemon's word on its own bot (check_channels): the rest is for a daemon down
        return found
    token = telegram_token(settings, environ or {}) if tg.answers and tg.chat_id else None
    why = "no bot token was found" if token is None else token_problem(token)
    if tg.answers and tg.chat_id and why is not None and not (tg.token_file and not os.access(tg.token_file, os.R_OK)):
        found.append(
            Finding(
                "error",
                "telegram",
                f"telegram.answers is on but {why}: nothing is sent to Telegram",
                "put the bot token in LoadCredential=telegram-token:... (systemd) or in telegram.token_file",
                paths.rel(paths.config),
            )
        )
    if tg.token_file and not os.access(tg.token_file, os.R_OK):
        found.append(
            Finding(
                "error",
                "telegram",
                f"telegram.token_file {tg.token_file} cannot be read",
                "fix the path or its permissions, or use LoadCredential=telegram-token:... under systemd",
                paths.rel(paths.config),
            )
        )
    if up:
        return found
    pending_presses = 0
    if exists:
        try:
            data = json.loads(read_capped(state_path, 4 * 1024 * 1024))
            pending_presses = len(data.get("pending") or []) if isinstance(data, dict) else 0
        except (OSError, ValueError):
            found.append(
                Finding(
                    "warning",
                    "telegram",
                    "the Telegram state file cannot be read",
                    "the daemon starts over from Telegram's unconfirmed updates",
                    paths.rel(state_path),
                )
            )
    if pending_presses:
        found.append(
            Finding(
                "warning",
                "telegram",
                f"{pending_presses} Telegram button press(es) were received but not acted upon",
                "start the daemon: it applies them first",
                paths.rel(state_path),
            )
        )
    if not tg.answers:
        return found
    seen = [t for t in (mtime(state_path), mtime(paths.state / "daemon.json")) if t is not None]
    stopped = last_stop(paths)
    last = max([datetime.fromtimestamp(t).astimezone() for t in seen] + ([stopped] if stopped else []), default=None)
    if last is None:
        return found
    unread = now - last
    waiting = bool(paths.escalations.is_dir() and EscalationStore(paths).list(status="pending"))
    if unread >= TELEGRAM_RETENTION:
        found.append(
            Finding(
                "error",
                "telegram",
                f"Telegram button presses have not been read for {ago(unread)}: the Bot API keeps them 24 h, "
                f"so presses made before {(now - TELEGRAM_RETENTION).isoformat(timespec='minutes')} are lost",
                "start the daemon; answer the escalations with `ambient decide ID OPTION` "
                "(a lost press is not applied)",
            )
        )
    elif unread >= TELEGRAM_CLOSE:
        lost_at = (last + TELEGRAM_RETENTION).isoformat(timespec="minutes")
        found.append(
            Finding(
                "error" if waiting else "warning",
                "telegram",
                f"Telegram button presses have not been read for {ago(unread)}: the Bot API drops them "
                f"after 24 h, the first at {lost_at} (in {ago(last + TELEGRAM_RETENTION - now)})",
                "start the daemon before then; or answer with `ambient decide ID OPTION`",
            )
        )
    return found
