"""``ambient doctor``: what is wrong with a brain and how to fix it, one line per finding.

Read-only: it writes nothing into the brain (``--notify`` sends one test message, nothing else).
Severities: ``error`` (broken, or something is being lost: exit 1), ``warning`` (left over or worth a
look; it does not change the exit code unless ``--strict``), ``info``. A daemon that is down is a
warning: it is the normal state before the first start, during maintenance and in CI; it becomes an
error when work waits on it (runs in progress, packets in the inbox, notifications to send).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ambient.cli._common import EXIT_NO, EXIT_OK, add_command, brain_dir, fail, out, out_json, quiet_logs

if TYPE_CHECKING:
    from ambient.config.settings import Settings
    from ambient.storage.paths import BrainPaths

Severity = Literal["error", "warning", "info"]

#: A notification that failed this many times "keeps failing".
FAILING_ATTEMPTS = 3
#: An escalation pending longer than this is reported (it waits on the person).
LONG_PENDING = timedelta(hours=24)
#: The Bot API keeps unconfirmed updates (button presses) this long.
TELEGRAM_RETENTION = timedelta(hours=24)
#: Past this much unread time, a Telegram backlog is close to the retention: an error.
TELEGRAM_CLOSE = timedelta(hours=12)
#: At most this many lines per check and kind; the rest is summed up in one line.
MAX_LINES = 10

_TMP_RE = re.compile(r"^\..+\.(?:tmp|stale)\.(\d+)\.[0-9a-f]+$")
_ORDER = {"error": 0, "warning": 1, "info": 2}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient doctor``."""
    p = add_command(
        sub,
        "doctor",
        _doctor,
        help="check the brain: what is wrong and how to fix it (exit 1 on an error)",
        description=(
            "Check a brain and print one line per finding with its severity and a fix: the daemon, the "
            "configuration, workflows, agents and routing that do not load (file:line), stale claims and locks, "
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


@dataclass(frozen=True)
class Finding:
    """One thing doctor found: how bad, what, where, and how to fix it."""

    severity: Severity
    check: str
    message: str
    hint: str = ""
    file: str | None = None
    line: int | None = None

    def text(self) -> str:
        """``severity  file:line: message | fix: hint`` on one line."""
        where = f"{self.file}:{self.line}: " if self.file and self.line else f"{self.file}: " if self.file else ""
        fix = f" | fix: {self.hint}" if self.hint else ""
        return f"{self.severity:<7}  {where}{self.message}{fix}"


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


# ------------------------------------------------------------------------------------------ helpers


def _ago(delta: timedelta) -> str:
    s = max(0, int(delta.total_seconds()))
    if s < 3600:
        return f"{s // 60} min"
    if s < 2 * 86400:
        return f"{s // 3600} h"
    days, hours = s // 86400, s % 86400 // 3600
    return f"{days} d {hours} h" if hours else f"{days} d"


def _capped(findings: list[Finding], what: str) -> list[Finding]:
    """At most MAX_LINES findings; the rest summed up in one line of the same severity and fix."""
    if len(findings) <= MAX_LINES:
        return findings
    rest = findings[MAX_LINES:]
    worst = min((f.severity for f in rest), key=_ORDER.__getitem__)
    return [*findings[:MAX_LINES], Finding(worst, rest[0].check, f"... and {len(rest)} more {what}", rest[0].hint)]


def _mtime(path: Path) -> float | None:
    try:
        return path.lstat().st_mtime
    except OSError:
        return None


# ------------------------------------------------------------------------------------------ checks


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
            hint = (
                "fix the file (`ambient config template` lists every setting with its default); until then "
                "`ambient run` starts with the keys that are valid (the others at their defaults) and a reload "
                "keeps the previous settings"
            )
        found.append(Finding("error", "config", p.message, hint, p.file, p.line))
    return cfg.settings or cfg.salvaged, found


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
    found += _check_programs(paths, brain)
    found += check_ai_runners(brain.runners, environ, daemon_keys=_daemon_keys(paths))
    return brain, found


def _check_programs(paths: BrainPaths, brain: Any) -> list[Finding]:
    """Command runners whose program (or ``{{python}}`` script) is not there
    (:func:`~ambient.config.brain.program_problems`, the check ``ambient validate`` reports too), with how to fix
    each."""
    from ambient.config.brain import program_problems

    found = []
    for p in program_problems(paths, brain.matrix, brain.runners):
        if p.severity == "warning":
            hint = "install it, or give its full path (the daemon's PATH under systemd may differ)"
        else:
            hint = "fix ambient.runner.argv (paths are relative to the brain, or to runner cwd), or install the program"
        found.append(Finding(p.severity, "runners", p.message, hint, p.file, p.line))
    return found


def _daemon_keys(paths: BrainPaths) -> set[str] | None:
    """The model keys the running daemon has (names, from ``daemon.json``), or None when no daemon is up."""
    from ambient.service.instance import daemon_up

    if not daemon_up(paths):
        return None
    try:
        keys = json.loads((paths.state / "daemon.json").read_text()).get("model_keys")
    except (OSError, ValueError, AttributeError):
        return None
    return {str(k) for k in keys} if isinstance(keys, list) else None


def check_ai_runners(
    runners: Mapping[str, Any], environ: Mapping[str, str], *, daemon_keys: set[str] | None = None
) -> list[Finding]:
    """AI agents: the Claude Code CLI is there, and the model's key is present (named, never shown): in the running
    daemon's environment when one is up (``daemon_keys``, what it recorded), else in this one or
    ``$CREDENTIALS_DIRECTORY``, which is what ``ambient run`` from here would get. A missing SDK is said by the brain
    check (``extra_problems``)."""

    def has(name: str) -> bool:
        return name in daemon_keys if daemon_keys is not None else credential(name, environ) is not None

    where = "the running daemon's environment" if daemon_keys is not None else "this environment"
    from ambient.runners import claude
    from ambient.runners.extras import missing_extra
    from ambient.runners.keys import credential, key_name

    found: list[Finding] = []
    by_kind: dict[str, list[str]] = {}
    for name, cfg in sorted(runners.items()):
        if getattr(cfg, "kind", None) in ("claude", "llm") and missing_extra(cfg) is None:
            by_kind.setdefault(cfg.kind if cfg.kind == "claude" else f"llm:{cfg.provider}", []).append(name)
    if "claude" in by_kind:
        agents = _agents(by_kind["claude"])
        cli = claude.bundled_cli()
        if cli is None:
            found.append(
                Finding("error", "ai", f"no Claude Code CLI for {agents}", "reinstall: pip install 'ambient[claude]'")
            )
        else:
            found.append(Finding("info", "ai", f"Claude Code CLI: {cli}", "", None, None))
        keys = [n for n in claude.KEY_NAMES if has(n)]
        if keys:
            found.append(Finding("info", "ai", f"model key for {agents}: {keys[0]} is set in {where}", "", None, None))
        else:
            found.append(
                Finding(
                    "error",
                    "ai",
                    f"no model key for {agents}: none of {', '.join(claude.KEY_NAMES)} is set in {where}",
                    "export ANTHROPIC_API_KEY in the daemon's environment, or put it in the file "
                    "$CREDENTIALS_DIRECTORY/anthropic_api_key (systemd: LoadCredential=anthropic_api_key:/etc/...)",
                )
            )
    for kind, names in sorted(by_kind.items()):
        if not kind.startswith("llm:"):
            continue
        needed = sorted({v for n in names if (v := key_name(runners[n])) is not None})
        for var in needed:
            users = _agents([n for n in names if key_name(runners[n]) == var])
            if has(var):
                found.append(Finding("info", "ai", f"model key for {users}: {var} is set in {where}", "", None, None))
            else:
                hint = f"export {var}, or put it in $CREDENTIALS_DIRECTORY/{var.lower()}"
                found.append(Finding("error", "ai", f"no model key for {users}: {var} is not set in {where}", hint))
    return found


def _agents(names: list[str]) -> str:
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"agent{'s' if len(names) > 1 else ''} {shown}"


def check_claims(paths: BrainPaths, settings: Settings, now: datetime) -> list[Finding]:
    """Unreadable claims, open claims past their TTL (stale) and claims already marked stale."""
    from ambient.claims import claim as rules
    from ambient.claims.index import census, read_claims
    from ambient.claims.store import ClaimStore

    if not paths.claims.is_dir():
        return []
    store = ClaimStore(paths, check_filesystem=False)
    seen = census(store, save=False)  # the index is used, not written; the stale candidates are read in full
    found = [
        Finding(
            "warning",
            "claims",
            p.message,
            "fix the file (ambient skips it and never rewrites it); `ambient validate` shows every problem",
            p.file,
            p.line,
        )
        for p in seen.problems
        if p.severity == "error"
    ]
    local = now.astimezone()  # naive claim times are local time
    tz = local.tzinfo
    assert tz is not None  # astimezone() always sets one
    default_ttl = timedelta(hours=settings.stale_claim_hours)
    due = [sid for sid, f in seen.facts.items() if (at := f.stale_at(tz, default_ttl)) is not None and local > at]
    candidates = read_claims(store, seen, due)
    stale = rules.mark_stale({sid: claim for sid, (_, claim) in candidates.items()}, local, default_ttl)
    running = set(_unfinished_runs(paths)) if stale else set()
    rows = []
    for sid in sorted(stale):
        claim = candidates[sid][1]
        ttl = rules.parse_ttl(claim.ttl) or timedelta(hours=settings.stale_claim_hours)
        last = rules.last_activity(claim, tz) or local
        run = next((r for r in (sid, claim.parent_satellite) if r in running), None)
        if run is not None:  # ambient's own mirror of a run that resumes: closing it by hand would lie
            hint = f"it mirrors run {run}, which resumes when the daemon starts: start the daemon, do not close it"
        else:
            hint = (
                f"if its agent is gone, close it: `ambient claim close {sid} --status failed --message "
                "abandoned`; a running daemon marks it stale at its next tick"
            )
        rows.append(
            Finding(
                "warning",
                "claims",
                f"claim {sid} (agent {claim.agent}, scope {claim.scope}) is open with no activity for "
                f"{_ago(local - last)}, past its TTL ({_ago(ttl)})",
                hint,
                paths.rel(candidates[sid][0]),
            )
        )
    found += _capped(rows, "stale claims")
    already = sorted(sid for sid, f in seen.facts.items() if f.status == rules.STALE)
    if already:
        names = ", ".join(already[:5]) + (f" and {len(already) - 5} more" if len(already) > 5 else "")
        found.append(
            Finding(
                "info",
                "claims",
                f"{len(already)} claim(s) marked stale (they block nobody): {names}",
                "close each once its work is settled: `ambient claim close SESS_ID --status ...`",
            )
        )
    return found


def check_locks(paths: BrainPaths) -> list[Finding]:
    """Locks whose holder is dead, whose TTL passed, or that cannot be read."""
    from ambient.claims.locks import LockManager

    if not paths.locks.is_dir():
        return []
    manager = LockManager(paths, check_filesystem=False)
    rows = []
    for st in manager.list():
        where = paths.rel(st.path)
        info = st.info
        holder = "holder ?"
        if info is not None:
            holder = f"holder {info.holder}" + (f" (pid {info.pid} on {info.host})" if info.pid else "")
        if st.state == "dead":
            rows.append(
                Finding(
                    "warning",
                    "locks",
                    f"lock on {st.file}: {holder} is dead",
                    "`ambient lock cleanup` removes it (the next acquire would take it over)",
                    where,
                )
            )
        elif st.state == "expired":
            rows.append(
                Finding(
                    "warning",
                    "locks",
                    f"lock on {st.file}: {holder}, TTL passed at {info.expires_at if info else '?'}",
                    "`ambient lock cleanup` removes it (the next acquire would take it over)",
                    where,
                )
            )
        elif st.state == "stale":
            rows.append(
                Finding(
                    "warning",
                    "locks",
                    f"lock on {st.file} is unreadable: {st.problem}",
                    "`ambient lock cleanup` removes it",
                    where,
                    st.line,
                )
            )
        elif st.state == "malformed":
            rows.append(
                Finding(
                    "warning",
                    "locks",
                    f"lock on {st.file} is unreadable and counts as held for "
                    f"{manager.malformed_grace_s:g} s: {st.problem}",
                    "if no process is writing it, `ambient lock cleanup` removes it once stale",
                    where,
                    st.line,
                )
            )
    return _capped(rows, "stale locks")


def check_runs(paths: BrainPaths) -> list[Finding]:
    """Run journals that do not fold (an edited value, a wrong type): each is that run's problem, at file:line."""
    from ambient.engine.journals import journal_problems

    rows = [
        Finding(
            "error",
            "runs",
            p.message,
            "mend or remove that record (the daemon resumes the run at its next start), or move the journal away",
            p.file,
            p.line,
        )
        for p in journal_problems(paths)
    ]
    return _capped(rows, "run journals that do not load")


def _unfinished(paths: BrainPaths) -> list[tuple[Path, Any]]:
    """Each run journal with no end, and its folded state (journals that do not fold are left to check_runs)."""
    from ambient.engine.runstate import fold
    from ambient.storage.journal import read_jsonl

    found = []
    if paths.run_journals.is_dir():
        for path in sorted(paths.run_journals.glob("*.jsonl")):
            try:
                state = fold(read_jsonl(path).records)
            except (ValueError, KeyError, TypeError, OSError):
                continue
            if not state.finished:
                found.append((path, state))
    return found


def _unfinished_runs(paths: BrainPaths) -> list[str]:
    """Ids of the runs whose journal has no end: they resume when the daemon starts."""
    return [state.run_id for _, state in _unfinished(paths)]


def _questions_kept(paths: BrainPaths) -> dict[str, str]:
    """Escalations an unfinished run waits on whose question its journal keeps (id → journal): the daemon rebuilds
    their file if it is lost or unreadable."""
    kept: dict[str, str] = {}
    for path, state in _unfinished(paths):
        kept.update((e, paths.rel(path)) for e in state.escalations if e in state.requests)
    return kept


def _work_waiting(paths: BrainPaths) -> list[str]:
    """What waits on a daemon: unfinished runs, packets in the inbox, notifications in the outbox."""
    runs = len(_unfinished_runs(paths))
    packets = len(list(paths.inbox.glob("*.json"))) if paths.inbox.is_dir() else 0
    outbox = paths.state / "outbox"
    notes = len([p for p in outbox.glob("*.json") if _still_to_send(paths, p)]) if outbox.is_dir() else 0
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
    dropped unsent (issue 23, 7), so it waits on nobody."""
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


def _last_stop(paths: BrainPaths) -> datetime | None:
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


def check_confinement() -> list[Finding]:
    """Whether agents run confined on this machine (Landlock), and what that means when they do not."""
    from ambient.runners.command import landlock_abi

    version = landlock_abi()
    if version > 0:
        return [
            Finding(
                "info",
                "confinement",
                f"command agents are confined (Landlock ABI {version}): they read the brain and write only their "
                "scope (Claude agents are held by ambient's judgement of each tool call instead)",
                "an agent with `ambient.runner.confine: false` runs unconfined",
            )
        ]
    return [
        Finding(
            "warning",
            "confinement",
            "agents run unconfined: this kernel has no Landlock (Linux 5.13+ with landlock in its LSM list)",
            "an agent can then do whatever your user can; run agents as another user (README, Security)",
        )
    ]


def check_troubles(paths: BrainPaths, up: bool) -> list[Finding]:
    """What the running daemon ran out of (descriptors, memory, processes: its health file) and a full disk
    (seen from here: the file cannot be rewritten then). Errors: work is held up until they end."""
    from ambient.service.troubles import disk_full, read_health

    found = [
        Finding("error", "resources", c.message, f"since {c.since:%Y-%m-%d %H:%M:%S}, seen {c.count} time(s)")
        for c in (read_health(paths).conditions.values() if up else [])
        if c.kind != "disk"
    ]
    full = disk_full(paths.state if paths.state.is_dir() else paths.root)
    if full is not None:
        found.append(Finding("error", "resources", full, "the daemon holds its runs still and goes on by itself"))
    return found


def check_daemon(paths: BrainPaths, now: datetime) -> tuple[bool, int | None, list[Finding]]:
    """Is a daemon holding the brain? Down is a warning, an error when work waits on it."""
    from ambient.service.instance import daemon_up, running_pid

    if daemon_up(paths):
        pid = running_pid(paths)
        return True, pid, check_daemon_settings(paths, pid) + check_troubles(paths, True)
    waiting = _work_waiting(paths)
    stopped = _last_stop(paths)
    since = f" (stopped {_ago(now - stopped)} ago)" if stopped is not None else ""
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


def check_escalations(paths: BrainPaths, settings: Settings, now: datetime) -> list[Finding]:
    """Unreadable escalations, notifications that keep failing, escalations waiting for long, nobody notified."""
    from ambient.human.escalation_store import EscalationStore

    if not paths.escalations.is_dir():
        return []
    scan = EscalationStore(paths).scan()
    kept = _questions_kept(paths) if scan.problems else {}
    found = []
    for p in scan.problems:
        journal = kept.get(Path(p.file).stem)
        if journal is None:
            hint = "fix or restore the file (ambient never rewrites it); `ambient escalations` lists the others"
            found.append(Finding("error", "escalations", p.message, hint, p.file, p.line))
        else:  # a run waits on it: the daemon writes it again from the run's journal (issue 24, 5)
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
                    f"{esc.id} ({esc.where}) has waited on you for {_ago(age)}{late}",
                    answer,
                    where,
                )
            )
    found += _capped(failing, "failing notifications") + _capped(waiting, "escalations waiting")
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
    if pending and not settings.notify.urls and not (settings.telegram.answers and settings.telegram.chat_id):
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

    from ambient.core.errors import InputError
    from ambient.core.redact import SecretRegistry
    from ambient.human.messages import Message
    from ambient.human.notify import AppriseNotifier, DeliveryError, notify_urls_from

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


def check_telegram(
    paths: BrainPaths, settings: Settings, up: bool, now: datetime, environ: Mapping[str, str] | None = None
) -> list[Finding]:
    """Telegram answers: a bot ambient cannot build (no token, a malformed one), presses saved but not acted upon,
    and a backlog close to the Bot API's 24-hour retention."""
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
    seen = [t for t in (_mtime(state_path), _mtime(paths.state / "daemon.json")) if t is not None]
    stopped = _last_stop(paths)
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
                f"Telegram button presses have not been read for {_ago(unread)}: the Bot API keeps them 24 h, "
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
                f"Telegram button presses have not been read for {_ago(unread)}: the Bot API drops them "
                f"after 24 h, the first at {lost_at} (in {_ago(last + TELEGRAM_RETENTION - now)})",
                "start the daemon before then; or answer with `ambient decide ID OPTION`",
            )
        )
    return found


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

    def daemon() -> list[Finding]:
        report.daemon_up, report.daemon_pid, found = check_daemon(paths, when)
        return found

    run("filesystem", lambda: check_filesystem(paths))
    run("config", config)
    effective = settings[0] if settings else settings_from({}, {})
    run("brain", lambda: check_brain(paths, environ)[1])
    run("daemon", daemon)
    up = report.daemon_up
    run("claims", lambda: check_claims(paths, effective, when))
    run("locks", lambda: check_locks(paths))
    run("runs", lambda: check_runs(paths))
    run("escalations", lambda: check_escalations(paths, effective, when))
    if notify:
        run("notify", lambda: check_notify_urls(paths, environ, timeout))
    run("telegram", lambda: check_telegram(paths, effective, up, when, environ))
    run("tmp", lambda: check_tmp(paths))
    run("confinement", check_confinement)
    # Last line of defence: a token inside a path, an argv or a notifier's error never reaches the output.
    report.findings = [replace(f, message=redact_text(f.message), hint=redact_text(f.hint)) for f in report.findings]
    report.findings.sort(key=lambda f: _ORDER[f.severity])  # stable: checks keep their order within a severity
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
