"""The durable retry outbox of notifications (``.ambient/outbox/``, RELIABILITY R-10).

A message is written to the outbox (atomic, fsync'd) before any send is tried, retried with capped exponential
backoff and full jitter, and removed only once every target accepted it, so it survives restarts. Escalations are
never dropped; other messages are parked in ``expired/`` once the :class:`RetryPolicy` gives up. Sending is a
:class:`Notifier`'s (:mod:`ambient.human.notify`).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from ambient.core.errors import DeliveryError, NotifyError
from ambient.core.lazylog import get_logger
from ambient.core.redact import redact_text
from ambient.human.messages import Message
from ambient.human.notify import Notifier
from ambient.storage.fsutil import atomic_write, fsync_dir, move, private_dir, read_capped, sweep_stale_tmp

if TYPE_CHECKING:
    from ambient.core.clock import Clock
    from ambient.storage.paths import BrainPaths

log = get_logger(__name__)


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
        sweep_stale_tmp(directory)

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

    def put(
        self, message: Message, now: datetime, *, skip: frozenset[str] = frozenset(), hasten: bool = False
    ) -> OutboxEntry:
        """Queue ``message`` (durably) unless one with the same dedupe id is pending; return the entry.

        ``skip``: the keys of targets not to send it to (they had it already: a channel that came up late gets an
        escalation the others were told of). ``hasten``: a pending entry waiting out its backoff is made due now
        (the channel that failed it just came up)."""
        existing = self.get(message.dedupe_id)
        if existing is not None:
            if hasten and existing.next_at > now:
                existing = existing.model_copy(update={"next_at": now})
                self._write(existing)
            return existing
        entry = OutboxEntry(
            id=message.dedupe_id, message=message, created_at=now, next_at=now, delivered=tuple(sorted(skip))
        )
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
        move(src, dest_dir / src.name, durable=True)

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
        done = {r.display: r.ref for r in sent.results if r.ref}

        def settle() -> None:
            # One thread for both, the attempt recorded first: a stop (a cancelled drain) between the two awaits
            # would remove the entry and lose who got it (a channel that comes up later would be sent it again).
            if on_attempt is not None:
                on_attempt(entry.message, True, None, None, done)
            outbox.remove(entry.id)

        await asyncio.to_thread(settle)
        report.sent.append(entry.id)
        log.info("notification_delivered", message=entry.id, attempts=entry.attempts + 1, targets=len(sent.results))
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
