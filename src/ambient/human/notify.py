"""Notifications: phone-readable escalation text, delivery through apprise, and a durable retry outbox.

Delivers text and decides nothing about what or whether to send (DESIGN §6). A message is written to
``.ambient/outbox/`` (atomic, fsync'd) before any send is tried, retried with capped exponential
backoff and full jitter, and removed only once every target accepted it, so it survives restarts.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import shlex
import warnings
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import structlog
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from ambient.core.errors import InputError, NotifyError
from ambient.core.redact import SecretRegistry, redact_text, redact_url
from ambient.storage.fsutil import atomic_write, fsync_dir, private_dir, read_capped, sweep_tmp

if TYPE_CHECKING:
    from ambient.core.clock import Clock
    from ambient.storage.paths import BrainPaths

log = structlog.get_logger(__name__)

Kind = Literal["escalation", "info", "digest"]

TELEGRAM_MAX_CHARS = 4096  # Bot API sendMessage limit, after entity parsing (RELIABILITY S-09)
ENV_URLS = "AMBIENT_NOTIFY_URLS"
TOKEN_PLACEHOLDER = "{telegram_token}"  # noqa: S105 - a placeholder, not a secret
TOKEN_CREDENTIAL = "telegram-token"  # noqa: S105 - credential file name ($CREDENTIALS_DIRECTORY, LoadCredential=)
_MAX_CREDENTIAL_BYTES = 4096


# --------------------------------------------------------------------------------------------- messages


class Message(BaseModel):
    """One notification: what the person reads, plus what a notifier needs to offer answers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    title: str
    body: str
    kind: Kind = "info"
    escalation_id: str | None = None
    options: tuple[str, ...] = ()
    answer_hint: str | None = None  # e.g. "ambient decide e-12 OPTION"
    nonce: str | None = None  # per-escalation button token (Telegram callback_data); never shown
    dedupe_id: str = ""  # one pending message per id; default derived from the content

    @model_validator(mode="before")
    @classmethod
    def _default_dedupe_id(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("dedupe_id"):
            kind = data.get("kind", "info")
            if data.get("escalation_id"):
                ident = f"{kind}-{data['escalation_id']}"
            else:
                content = f"{kind}\0{data.get('title', '')}\0{data.get('body', '')}"
                ident = f"{kind}-{hashlib.sha256(content.encode()).hexdigest()[:20]}"
            data = {**data, "dedupe_id": ident}
        return data

    @property
    def silent(self) -> bool:
        """Only decisions make the phone buzz; results and digests arrive silently (issue 6)."""
        return self.kind != "escalation"


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def clean_text(text: str) -> str:
    """Agent text made plain and safe to show: control and bidi-override characters removed.

    Markup is left as literal characters; notifiers send it as plain text (apprise escapes it with
    ``body_format=TEXT``; the Bot API client sends no ``parse_mode``), so it is never rendered (S-09).
    """
    return _CONTROL.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))


def text_length(text: str) -> int:
    """Length as Telegram counts it (UTF-16 code units), with a newline counted twice.

    apprise sends each newline as ``\r\n`` to HTML targets, so this is an upper bound of what arrives.
    """
    return len(text.encode("utf-16-le")) // 2 + text.count("\n")


def cut_text(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-16 units, ending with a marker saying it was cut."""
    if text_length(text) <= limit:
        return text
    marker = f"\n… [cut: {len(text)} characters in all]"
    budget = limit - text_length(marker)
    if budget <= 0:
        return marker[: max(limit, 0)]
    kept: list[str] = []
    used = 0
    for ch in text:
        width = 2 if ord(ch) > 0xFFFF or ch == "\n" else 1
        if used + width > budget:
            break
        kept.append(ch)
        used += width
    return "".join(kept) + marker


def fit_message(title: str, body: str, limit: int = TELEGRAM_MAX_CHARS) -> tuple[str, str]:
    """Title and body cut so that ``title + "\\r\\n" + body`` fits ``limit`` (apprise joins them so)."""
    title = cut_text(title, min(limit // 4, 250))
    room = limit - text_length(title) - 2
    return title, cut_text(body, max(room, 0))


def answer_command(escalation_id: str, option: str) -> str:
    """The exact CLI line that answers an escalation with an option (quoted for a shell)."""
    return f"ambient decide {shlex.quote(escalation_id)} {shlex.quote(option)}"


def format_escalation(
    *,
    escalation_id: str,
    what: str,
    question: str,
    options: Sequence[str],
    workflow: str | None = None,
    item: str | None = None,
    step: str | None = None,
    agent: str | None = None,
    deadline: str | None = None,
    telegram_buttons: bool = False,
    limit: int = TELEGRAM_MAX_CHARS,
    reminder: bool = False,
    prediction: str | None = None,
) -> tuple[str, str]:
    """Title and body of an escalation, readable on a phone.

    What happened, where (workflow / item / step / agent), the question (agent text, plain and cut in
    the middle of the message so the options and answer instructions always survive), the options
    numbered, what a learned rule in shadow would choose (``prediction``: you still decide), and exactly how to
    answer. Every field is treated as untrusted plain text.
    """
    if not options:
        raise ValueError("an escalation needs at least one option")
    opts = [clean_text(o).strip()[:100] or f"option {i}" for i, o in enumerate(options, 1)]
    head = "Reminder, decision still needed: " if reminder else "Decision needed: "
    title = head + (clean_text(what).strip().splitlines() or ["(no summary)"])[0][:120]
    where = [
        f"{label}: {clean_text(value).strip()[:200]}"
        for label, value in (("Workflow", workflow), ("Item", item), ("Step", step), ("Agent", agent))
        if value
    ]
    head = "\n".join(where)
    tail_lines = ["Options:", *(f"{i}. {o}" for i, o in enumerate(opts, 1)), ""]
    if prediction:
        tail_lines += [f"{clean_text(prediction).strip()[:300]}.", ""]
    tail_lines.append("To answer, run:")
    tail_lines.append(f"  {answer_command(escalation_id, 'OPTION')}")
    tail_lines.append(f"  e.g. {answer_command(escalation_id, opts[0])}")
    if telegram_buttons:
        tail_lines.append("or tap one of the buttons under this message in Telegram.")
    if deadline:
        tail_lines.append(f"Answer before {clean_text(deadline)[:60]}.")
    tail_lines.append(f"Ref: {escalation_id}")
    tail = "\n".join(tail_lines)
    title, _ = fit_message(title, "", limit)
    # Room left for the agent's question once title, header and instructions are placed.
    placed = [p for p in (head, tail) if p]
    fixed = text_length(title) + 2 + sum(text_length(p) for p in placed) + len(placed) * text_length("\n\n")
    question_text = cut_text(clean_text(question).strip() or "(no details)", max(limit - fixed, 40))
    body = "\n\n".join(part for part in (head, question_text, tail) if part)
    return fit_message(title, body, limit)


def escalation_message(
    *,
    escalation_id: str,
    what: str,
    question: str,
    options: Sequence[str],
    nonce: str | None = None,
    telegram_buttons: bool = False,
    workflow: str | None = None,
    item: str | None = None,
    step: str | None = None,
    agent: str | None = None,
    deadline: str | None = None,
    reminder: bool = False,
    prediction: str | None = None,
) -> Message:
    """A ready :class:`Message` for an escalation: :func:`format_escalation` text plus answer data.

    A ``reminder`` says so in its title and is a message of its own (its first message may still be queued).
    """
    title, body = format_escalation(
        escalation_id=escalation_id,
        what=what,
        question=question,
        options=options,
        workflow=workflow,
        item=item,
        step=step,
        agent=agent,
        deadline=deadline,
        telegram_buttons=telegram_buttons,
        reminder=reminder,
        prediction=prediction,
    )
    return Message(
        title=title,
        body=body,
        kind="escalation",
        escalation_id=escalation_id,
        options=tuple(options),
        answer_hint=answer_command(escalation_id, "OPTION"),
        nonce=nonce,
        dedupe_id=f"reminder-{escalation_id}" if reminder else "",
    )


# --------------------------------------------------------------------------------------------- delivery


@dataclass(frozen=True)
class TargetResult:
    """How one target (one apprise URL, one Telegram chat) took a message. Safe to log and store."""

    key: str  # stable, secret-free id of the target (a hash of its URL)
    display: str  # the target with secrets masked (apprise ``url(privacy=True)``)
    ok: bool
    detail: str = ""  # redacted reason on failure
    ref: str = ""  # delivery reference when the target gives one (the Telegram message id)


@dataclass(frozen=True)
class SendReport:
    """Per-target outcome of one send."""

    results: tuple[TargetResult, ...] = ()

    @property
    def ok(self) -> bool:
        """True when every attempted target accepted the message."""
        return all(r.ok for r in self.results)

    @property
    def delivered(self) -> frozenset[str]:
        """Keys of the targets that accepted the message."""
        return frozenset(r.key for r in self.results if r.ok)

    @property
    def failed(self) -> tuple[TargetResult, ...]:
        """The targets that did not accept it."""
        return tuple(r for r in self.results if not r.ok)

    def merge(self, other: SendReport) -> SendReport:
        """Both reports' results, in order."""
        return SendReport(self.results + other.results)


class DeliveryError(NotifyError):
    """At least one target did not accept a message; ``report`` says which did and which did not."""

    def __init__(self, report: SendReport, message: str | None = None) -> None:
        self.report = report
        if message is None:
            failed = report.failed
            parts = "; ".join(f"{r.display}: {r.detail or 'failed'}" for r in failed)
            message = f"{len(failed)} of {len(report.results)} notification targets failed: {parts}"
        super().__init__(message)


class Notifier(Protocol):
    """Sends a message to its targets, skipping those whose keys are in ``skip`` (already delivered).

    Returns the report when every attempted target accepted the message; raises :class:`DeliveryError`
    (carrying the report) otherwise. Never blocks the event loop.
    """

    async def send(self, message: Message, *, skip: Set[str] = frozenset()) -> SendReport: ...


def target_key(kind: str, ident: str) -> str:
    """A stable id for a target that does not reveal it (its URL may hold a token)."""
    return f"{kind}:{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


@dataclass
class _AppriseTarget:
    key: str
    display: str
    apobj: Any | None  # apprise.Apprise holding this URL only, None if the URL was refused


class AppriseNotifier:
    """Sends through apprise to each configured URL, each in its own ``Apprise`` so results map to URLs.

    apprise is imported on first send, in a thread (its import and plugin scan cost ~0.3 s). Sends use
    ``async_notify`` (apprise's worker threads; the loop never blocks) with ``body_format=TEXT`` so
    agent text is escaped for HTML targets such as Telegram (S-09). Only ``url(privacy=True)`` and
    redacted details are ever logged or reported.
    """

    def __init__(self, urls: Sequence[str], *, timeout: float = 30.0, registry: SecretRegistry | None = None) -> None:
        self._urls = list(urls)
        self._timeout = timeout
        self._registry = registry
        self._targets: list[_AppriseTarget] | None = None
        self._lock = asyncio.Lock()

    @property
    def keys(self) -> list[str]:
        """Target keys, in URL order."""
        return [target_key("apprise", u) for u in self._urls]

    def _build(self) -> list[_AppriseTarget]:
        import apprise  # lazy: see the class docstring

        targets = []
        for url in self._urls:
            apobj = apprise.Apprise()
            with warnings.catch_warnings():
                # apprise's first add() scans its plugins, and the email plugin imports the deprecated
                # stdlib imghdr: keep that DeprecationWarning out of the daemon (and of -W error runs).
                warnings.filterwarnings("ignore", message=".*imghdr.*", category=DeprecationWarning)
                added = apobj.add(url)
            if added:
                # privacy=True masks the token; the query string is apprise's defaults, noise on a phone.
                display = str(apobj[0].url(privacy=True)).split("?", 1)[0]  # type: ignore[no-untyped-call]
                targets.append(_AppriseTarget(target_key("apprise", url), display, apobj))
            else:
                targets.append(_AppriseTarget(target_key("apprise", url), redact_url(url, self._registry), None))
        return targets

    async def targets(self) -> list[_AppriseTarget]:
        """The loaded targets (apprise imported on first call, off the loop)."""
        async with self._lock:
            if self._targets is None:
                self._targets = await asyncio.to_thread(self._build)
            return self._targets

    async def _send_one(self, target: _AppriseTarget, message: Message, title: str, body: str) -> TargetResult:
        if target.apobj is None:
            return TargetResult(target.key, target.display, False, "not a valid apprise URL")
        from apprise import NotifyFormat, NotifyType

        notify_type = NotifyType.WARNING if message.kind == "escalation" else NotifyType.INFO
        try:
            result = await target.apobj.async_notify(
                body=body,
                title=title,
                notify_type=notify_type,
                body_format=NotifyFormat.TEXT,
                timeout=self._timeout,
            )
        except Exception as exc:  # noqa: BLE001 - one broken plugin must not stop the other targets
            return TargetResult(target.key, target.display, False, self._clean(f"{type(exc).__name__}: {exc}"))
        # AppriseResult (2.x) is truthy only on SUCCESS (RELIABILITY finding 7).
        if result:
            return TargetResult(target.key, target.display, True)
        warnings = [e.message for e in result.logs() if e.level in ("WARNING", "ERROR", "CRITICAL")]
        detail = warnings[-1] if warnings else f"apprise status {result.status.name}"
        return TargetResult(target.key, target.display, False, self._clean(detail))

    def _clean(self, text: str) -> str:
        return redact_text(text, self._registry)[:300]

    async def send(self, message: Message, *, skip: Set[str] = frozenset()) -> SendReport:
        """Send to every URL not in ``skip``; raise :class:`DeliveryError` if any refused it."""
        if not self._urls:
            raise DeliveryError(SendReport(), "no notification URL is configured")
        targets = [t for t in await self.targets() if t.key not in skip]
        title, body = fit_message(message.title, message.body)
        results = await asyncio.gather(*(self._send_one(t, message, title, body) for t in targets))
        report = SendReport(tuple(results))
        for r in report.results:
            if r.ok:
                log.info("notify_sent", target=r.display, message=message.dedupe_id)
            else:
                log.warning("notify_failed", target=r.display, message=message.dedupe_id, detail=r.detail)
        if not report.ok:
            raise DeliveryError(report)
        return report


class CompositeNotifier:
    """Several notifiers as one (e.g. apprise URLs plus the interactive Telegram bot)."""

    def __init__(self, notifiers: Sequence[Notifier]) -> None:
        self._notifiers = list(notifiers)

    async def send(self, message: Message, *, skip: Set[str] = frozenset()) -> SendReport:
        """Send through each notifier; raise :class:`DeliveryError` with the merged report if any failed."""
        outcomes = await asyncio.gather(*(n.send(message, skip=skip) for n in self._notifiers), return_exceptions=True)
        report, errors = SendReport(), list[DeliveryError]()
        for outcome in outcomes:
            if isinstance(outcome, DeliveryError):
                report, errors = report.merge(outcome.report), [*errors, outcome]
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                report = report.merge(outcome)
        if errors:
            raise DeliveryError(report) if report.results else errors[0]
        return report


# --------------------------------------------------------------------------------------------- retries


class _Uniform(Protocol):
    def uniform(self, a: float, b: float) -> float: ...


def next_attempt_at(attempts: int, now: datetime, base: timedelta, cap: timedelta, rng: _Uniform) -> datetime:
    """When to try again after ``attempts`` failed attempts: exponential backoff with full jitter.

    The delay is uniform in ``[0, min(cap, base * 2**(attempts-1))]`` (AWS "full jitter"), so it is
    bounded by ``cap`` and retries of many messages spread out instead of arriving together.
    """
    exp = min(max(attempts - 1, 0), 62)
    ceiling = min(cap.total_seconds(), base.total_seconds() * (2**exp))
    return now + timedelta(seconds=rng.uniform(0.0, max(ceiling, 0.0)))


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff bounds. Escalations are never dropped; other messages are parked after ``give_up_after``."""

    base: timedelta = timedelta(seconds=5)
    cap: timedelta = timedelta(minutes=15)
    give_up_after: timedelta | None = timedelta(hours=24)


class OutboxEntry(BaseModel):
    """A pending notification on disk: the message, its attempts and when to try next."""

    model_config = ConfigDict(extra="forbid")

    id: str
    message: Message
    created_at: datetime
    attempts: int = 0
    next_at: datetime
    delivered: tuple[str, ...] = ()  # keys of targets that already accepted it (not sent again)
    last_error: str | None = None
    last_attempt_at: datetime | None = None


_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class Outbox:
    """Pending notifications as one JSON file each under a directory (``.ambient/outbox/``).

    Written atomically and fsync'd before any send is tried, so a crash loses nothing; a file is
    removed only once every target accepted its message (so a crash in between may send it twice:
    duplicates are at most the number of crashes, R-10). Undeliverable non-escalation messages are
    moved to ``expired/``, never deleted.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        private_dir(directory)
        sweep_tmp(directory)

    @classmethod
    def for_brain(cls, paths: BrainPaths) -> Outbox:
        """The outbox of a brain: ``.ambient/outbox/``."""
        return cls(paths.state / "outbox")

    def _path(self, entry_id: str) -> Path:
        name = entry_id if _SAFE_ID.fullmatch(entry_id) else "h-" + hashlib.sha256(entry_id.encode()).hexdigest()[:32]
        return self.directory / f"{name}.json"

    def _write(self, entry: OutboxEntry) -> None:
        atomic_write(self._path(entry.id), entry.model_dump_json(indent=1) + "\n", mode=0o600)

    def get(self, entry_id: str) -> OutboxEntry | None:
        """The pending entry with this id, if any."""
        return self._read(self._path(entry_id))

    def _read(self, path: Path) -> OutboxEntry | None:
        try:
            raw = read_capped(path, 1024 * 1024)
        except FileNotFoundError:
            return None
        try:
            return OutboxEntry.model_validate_json(raw)
        except ValidationError as exc:
            log.error("outbox_entry_unreadable", file=str(path), errors=exc.error_count())
            return None

    def put(self, message: Message, now: datetime) -> OutboxEntry:
        """Queue ``message`` (durably) unless one with the same dedupe id is pending; return the entry."""
        existing = self.get(message.dedupe_id)
        if existing is not None:
            return existing
        entry = OutboxEntry(id=message.dedupe_id, message=message, created_at=now, next_at=now)
        self._write(entry)
        return entry

    def save(self, entry: OutboxEntry) -> None:
        """Rewrite an entry (after an attempt)."""
        self._write(entry)

    def remove(self, entry_id: str) -> None:
        """Forget a delivered entry."""
        self._path(entry_id).unlink(missing_ok=True)
        fsync_dir(self.directory)

    def park(self, entry_id: str) -> None:
        """Move an entry that will not be retried any more to ``expired/`` (kept for inspection)."""
        src = self._path(entry_id)
        dest_dir = self.directory / "expired"
        private_dir(dest_dir)
        src.replace(dest_dir / src.name)
        fsync_dir(dest_dir)
        fsync_dir(self.directory)

    def entries(self) -> list[OutboxEntry]:
        """Every pending entry, soonest first."""
        found = []
        for path in sorted(self.directory.glob("*.json")):
            if path.name.startswith("."):
                continue
            entry = self._read(path)
            if entry is not None:
                found.append(entry)
        return sorted(found, key=lambda e: (e.next_at, e.created_at))

    def due(self, now: datetime) -> list[OutboxEntry]:
        """Entries whose next attempt is at or before ``now``."""
        return [e for e in self.entries() if e.next_at <= now]

    def next_due(self) -> datetime | None:
        """When the soonest pending entry is due, or None when the outbox is empty."""
        entries = self.entries()
        return entries[0].next_at if entries else None


@dataclass
class DrainReport:
    """What one :func:`drain` did."""

    sent: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    parked: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    next_due: datetime | None = None


#: Whether a queued message is still worth sending (an escalation's is not once it was answered or cancelled).
StillWanted = Callable[[Message], bool]
#: Told of every attempt, off the loop: (message, delivered, error, next try, delivery references by target).
OnAttempt = Callable[[Message, bool, str | None, datetime | None, dict[str, str]], None]


def _due_wanted(
    outbox: Outbox,
    now: datetime,
    still_wanted: StillWanted | None,
    report: DrainReport,
) -> list[OutboxEntry]:
    """The entries due at ``now``; those no longer wanted are removed, never sent (blocking: run in a thread)."""
    due = outbox.due(now)
    if still_wanted is None:
        return due
    keep = []
    for entry in due:
        if still_wanted(entry.message):
            keep.append(entry)
        else:
            outbox.remove(entry.id)
            report.dropped.append(entry.id)
            log.info("notification_dropped", message=entry.id, reason="no longer pending")
    return keep


async def _attempt(
    outbox: Outbox,
    notifier: Notifier,
    entry: OutboxEntry,
    now: datetime,
    policy: RetryPolicy,
    rng: _Uniform,
    report: DrainReport,
    on_attempt: OnAttempt | None = None,
) -> None:
    delivered = set(entry.delivered)
    refs: dict[str, str] = {}
    try:
        sent = await notifier.send(entry.message, skip=frozenset(delivered))
    except DeliveryError as exc:
        delivered |= exc.report.delivered
        error = str(exc)
        refs = {r.display: r.ref for r in exc.report.results if r.ok and r.ref}
    except NotifyError as exc:
        error = str(exc)
    except Exception as exc:  # noqa: BLE001 - a broken notifier must not stop the drain loop
        error = redact_text(f"{type(exc).__name__}: {exc}")
    else:
        await asyncio.to_thread(outbox.remove, entry.id)
        report.sent.append(entry.id)
        log.info("notification_delivered", message=entry.id, attempts=entry.attempts + 1, targets=len(sent.results))
        if on_attempt is not None:
            done = {r.display: r.ref for r in sent.results if r.ref}
            await asyncio.to_thread(on_attempt, entry.message, True, None, None, done)
        return
    attempts = entry.attempts + 1
    if (
        entry.message.kind != "escalation"
        and policy.give_up_after is not None
        and now - entry.created_at >= policy.give_up_after
    ):
        await asyncio.to_thread(outbox.park, entry.id)
        report.parked.append(entry.id)
        log.warning("notification_expired", message=entry.id, attempts=attempts, error=error)
        return
    updated = OutboxEntry.model_validate(
        {
            **entry.model_dump(),
            "attempts": attempts,
            "next_at": next_attempt_at(attempts, now, policy.base, policy.cap, rng),
            "delivered": tuple(sorted(delivered)),
            "last_error": error[:500],
            "last_attempt_at": now,
        }
    )
    await asyncio.to_thread(outbox.save, updated)
    report.failed.append(entry.id)
    log.warning("notification_retry", message=entry.id, attempts=attempts, next_at=updated.next_at.isoformat())
    if on_attempt is not None:
        await asyncio.to_thread(on_attempt, entry.message, False, error, updated.next_at, refs)


async def drain(
    outbox: Outbox,
    notifier: Notifier,
    now: datetime,
    *,
    policy: RetryPolicy | None = None,
    rng: _Uniform | None = None,
    still_wanted: StillWanted | None = None,
    on_attempt: OnAttempt | None = None,
) -> DrainReport:
    """Send every entry due at ``now``; record failed attempts and the next try on disk.

    Entries are sent concurrently. A delivered entry is removed; a failed one keeps its attempt
    count, the targets that already accepted it (not sent again) and its next time. An entry that
    ``still_wanted`` refuses (asked just before each send, off the loop) is removed unsent: a "Decision
    needed" for an escalation answered meanwhile would only mislead.
    """
    policy = policy or RetryPolicy()
    rng = rng or random.Random()  # jitter, not security
    report = DrainReport()
    due = await asyncio.to_thread(_due_wanted, outbox, now, still_wanted, report)
    await asyncio.gather(*(_attempt(outbox, notifier, e, now, policy, rng, report, on_attempt) for e in due))
    report.next_due = await asyncio.to_thread(outbox.next_due)
    return report


async def run_outbox(
    outbox: Outbox,
    notifier: Notifier,
    *,
    clock: Clock,
    stop: asyncio.Event,
    wake: asyncio.Event | None = None,
    policy: RetryPolicy | None = None,
    idle: float = 300.0,
    still_wanted: StillWanted | None = None,
    on_attempt: OnAttempt | None = None,
) -> None:
    """Drain the outbox until ``stop`` is set: at each entry's due time, or at once when ``wake`` is set.

    Set ``wake`` after :meth:`Outbox.put` so a new message goes out immediately. A failing drain is
    logged and retried; it never ends the loop.
    """
    policy = policy or RetryPolicy()
    rng = random.Random()  # jitter, not security
    wake = wake or asyncio.Event()
    while not stop.is_set():
        wake.clear()
        try:
            report = await drain(
                outbox, notifier, clock.now(), policy=policy, rng=rng, still_wanted=still_wanted, on_attempt=on_attempt
            )
            next_due = report.next_due
        except (OSError, NotifyError) as exc:
            log.error("outbox_drain_failed", error=str(exc))
            next_due = clock.now() + policy.base
        delay = idle if next_due is None else (next_due - clock.now()).total_seconds()
        delay = min(max(delay, 0.0), idle)
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
        try:
            await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)


# --------------------------------------------------------------------------------------------- configuration


def read_credential(name: str, environ: Mapping[str, str]) -> str | None:
    """A secret from ``$CREDENTIALS_DIRECTORY/<name>`` (systemd ``LoadCredential=``), or None if absent."""
    directory = environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return None
    path = Path(directory) / name
    try:
        raw = read_capped(path, _MAX_CREDENTIAL_BYTES)
    except FileNotFoundError:
        return None
    value = raw.decode("utf-8", "replace").strip()
    return value or None


def split_urls(text: str) -> list[str]:
    """URLs separated by commas and/or whitespace."""
    return [u for u in re.split(r"[,\s]+", text) if u]


def notify_urls_from(
    paths: BrainPaths, environ: Mapping[str, str], registry: SecretRegistry | None = None
) -> list[str]:
    """The notification URLs of a brain: ``$AMBIENT_NOTIFY_URLS`` if set, else ``notify.urls`` in
    ``profil/ambient.yml``.

    ``{telegram_token}`` in a URL is replaced by ``$CREDENTIALS_DIRECTORY/telegram-token``. Every secret
    found (the token, passwords and tokens inside URLs) is added to ``registry``.
    """
    from ambient.storage.yamlfile import MAX_CONFIG_BYTES, expect_mapping, load_file

    source = f"${ENV_URLS}"
    env_value = environ.get(ENV_URLS, "").strip()
    if env_value:
        urls = split_urls(env_value)
    elif paths.config.is_file():
        name = str(paths.config)
        data, lines = load_file(paths.config, max_bytes=MAX_CONFIG_BYTES)
        source = name
        if data is None:
            return []
        notify = expect_mapping(data, source=name, what="profil/ambient.yml").get("notify")
        if notify is None:
            return []
        if not isinstance(notify, dict):
            raise InputError("notify must be a mapping with a 'urls' list", file=name, line=lines.line_for(("notify",)))
        raw = notify.get("urls", [])
        if isinstance(raw, str):
            raw = split_urls(raw)
        if not isinstance(raw, list) or not all(isinstance(u, str) for u in raw):
            raise InputError(
                "notify.urls must be a list of apprise URLs (strings)",
                file=name,
                line=lines.line_for(("notify", "urls")),
            )
        urls = [u.strip() for u in raw if u.strip()]
    else:
        return []
    return expand_urls(urls, environ, registry, source=source)


def expand_urls(
    urls: Sequence[str], environ: Mapping[str, str], registry: SecretRegistry | None = None, *, source: str = "URL"
) -> list[str]:
    """Replace ``{telegram_token}`` by the credential and register every secret of the URLs."""
    urls = list(urls)
    if any(TOKEN_PLACEHOLDER in u for u in urls):
        token = read_credential(TOKEN_CREDENTIAL, environ)
        if token is None:
            raise InputError(
                f"a notification URL uses {TOKEN_PLACEHOLDER} but no credential file "
                f"$CREDENTIALS_DIRECTORY/{TOKEN_CREDENTIAL} was found; under systemd add "
                f"'LoadCredential={TOKEN_CREDENTIAL}:/etc/ambient/{TOKEN_CREDENTIAL}' to the unit, elsewhere "
                f"export CREDENTIALS_DIRECTORY=<a 0700 directory holding the file {TOKEN_CREDENTIAL}>",
                file=source,
            )
        if registry is not None:
            registry.add(token)
        urls = [u.replace(TOKEN_PLACEHOLDER, token) for u in urls]
    if registry is not None:
        for u in urls:
            registry.add_url(u)
    return urls
