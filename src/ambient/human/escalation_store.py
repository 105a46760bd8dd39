"""The escalation files of a brain (``.ambient/escalations/<id>.yml``): written, read, answered and restored.

An escalation is on disk (fsync'd) before anyone is notified (DESIGN §6). :class:`EscalationStore` is the only writer
of those files and serialises every change under one ``flock`` guard, so the CLI and the daemon (Telegram) can never
both answer the same escalation; each change is a rule of :mod:`ambient.human.escalations` applied to what is on disk.
"""

from __future__ import annotations

import builtins
import fcntl
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

from pydantic import ValidationError

from ambient.core.clock import Clock, SystemClock
from ambient.core.errors import InputError, StateError, UnknownEscalationError
from ambient.core.problems import Problem
from ambient.human.escalations import (
    ID_RE,
    Channel,
    Escalation,
    Status,
    cancel,
    decide,
    describe_answer,
    find_asked,
    find_pending,
    mark_reminded,
    mark_unapplied,
    new_id,
    normalize_id,
    timeout_decision,
    with_attempt,
    with_id,
)
from ambient.storage.fsutil import atomic_write, iter_files, move, open_private, private_dir
from ambient.storage.paths import BrainPaths
from ambient.storage.yamlfile import KiB, dump_yaml, expect_mapping, load_file, problems_from_validation

#: Size cap of one escalation file (checked before parsing, RELIABILITY S-03).
MAX_ESCALATION_BYTES = 256 * KiB
_GUARD_NAME = "escalations.guard"

# Left out of the file while None, so a pending escalation reads short; extras are always kept.
_OMIT_WHEN_NONE = (
    "item",
    "step",
    "agent",
    "respawn",
    "scope",
    "deadline",
    "on_timeout",
    "remind_at",
    "timed_out_at",
    "decision",
    "by",
    "channel",
    "note",
    "answered_at",
    "latency_s",
    "unapplied",
)


def to_yaml(esc: Escalation) -> str:
    """The file text: a comment saying how to answer, then the fields in schema order."""
    data = esc.model_dump(mode="json")
    for key in _OMIT_WHEN_NONE:
        if data.get(key) is None:
            data.pop(key, None)
    if esc.status == "pending":
        head = f"# ambient escalation (pending). Answer with: ambient decide {esc.id} <option name or number>\n"
    else:
        head = f"# ambient escalation ({esc.status}): {describe_answer(esc).replace(' already', '')}\n"
    return head + dump_yaml(data)


class EscalationScan(NamedTuple):
    """Every readable escalation, and a :class:`Problem` for each file that is not."""

    escalations: builtins.list[Escalation]
    problems: builtins.list[Problem]


#: How many escalation files a store remembers as parsed (see ``EscalationStore._scan``).
PARSED_MAX = 4096


class EscalationStore:
    """Escalation files of one brain. Every change is an atomic, fsync'd rewrite under one guard.

    Methods block (fsync, ``flock``): call them from the daemon through ``asyncio.to_thread``.
    Malformed files are reported as problems and skipped, never deleted or rewritten.
    """

    def __init__(self, paths: BrainPaths, *, clock: Clock | None = None) -> None:
        self.paths = paths
        self.dir = paths.escalations
        self.guard_path = paths.state / _GUARD_NAME
        self._clock: Clock = clock or SystemClock()
        # File name → (inode, size, mtime_ns, ctime_ns) and the escalation read from it: see _scan.
        self._parsed: dict[str, tuple[tuple[int, int, int, int], Escalation]] = {}

    def path_for(self, esc_id: str) -> Path:
        """The file of an escalation (the id is checked, so it never escapes the directory)."""
        return self.dir / f"{normalize_id(esc_id)}.yml"

    def create(self, esc: Escalation, *, since: datetime | None = None, settled: Iterable[str] = ()) -> Escalation:
        """Persist a new escalation durably (file and directory fsync'd) and return it.

        If a pending escalation with the same ``dedupe_key`` exists, nothing is written and that
        one is returned: compare ids (``store.create(e).id == e.id``) to know whether to notify.
        ``since``: the question is asked again after a crash; an escalation of its key made since then, answered or
        not (:func:`find_asked`), is returned the same way.
        """
        with self._guard():
            escs = self._scan().escalations
            existing = find_pending(escs, esc.dedupe_key)
            if existing is None and since is not None:
                existing = find_asked(escs, esc.dedupe_key, since, settled)
            if existing is not None:
                return existing
            while self.path_for(esc.id).exists():  # 30 random bits: a collision is rare, never fatal
                esc = with_id(esc, new_id())
            self._write(esc)
            return esc

    def get(self, esc_id: str) -> Escalation:
        """One escalation; :class:`UnknownEscalationError` if absent, :class:`InputError` if malformed."""
        path = self.path_for(esc_id)
        if not path.is_file():
            raise UnknownEscalationError(
                f"no escalation {normalize_id(esc_id)!r} in {self.paths.rel(self.dir)}; "
                "see the pending ones with: ambient escalations"
            )
        return self._read(path)

    def answer(
        self,
        esc_id: str,
        option: str,
        *,
        by: str,
        channel: Channel,
        note: str | None = None,
        now: datetime | None = None,
    ) -> Escalation:
        """Decide an escalation (see :func:`decide`). Of two concurrent answers exactly one wins;
        the other gets :class:`AlreadyAnsweredError`, and a refused answer leaves the file untouched."""
        when = now or self._clock.now()
        return self.update(esc_id, lambda e: decide(e, option, by=by, channel=channel, note=note, now=when))

    def apply_timeout(self, esc_id: str, now: datetime | None = None) -> Escalation | None:
        """Apply the deadline's decision if still due (None, nothing written, if answered meanwhile)."""
        when = now or self._clock.now()
        result: list[Escalation] = []

        def change(esc: Escalation) -> Escalation | None:
            new = timeout_decision(esc, when)
            if new is not None:
                result.append(new)
            return new

        self._modify(esc_id, change)
        return result[0] if result else None

    def mark_reminded(self, esc_id: str, now: datetime | None = None) -> Escalation:
        """Record that the reminder went due (the notifier then sends it once)."""
        when = now or self._clock.now()
        return self.update(esc_id, lambda e: mark_reminded(e, when))

    def record_attempt(
        self,
        esc_id: str,
        ok: bool,
        error: str | None = None,
        next_at: datetime | None = None,
        *,
        now: datetime | None = None,
        refs: Mapping[str, str] | None = None,
    ) -> Escalation:
        """Record a notification attempt (``error`` already redacted; ``next_at`` = next retry)."""
        when = now or self._clock.now()
        return self.update(esc_id, lambda e: with_attempt(e, ok=ok, now=when, error=error, next_at=next_at, refs=refs))

    def mark_unapplied(self, esc_id: str, reason: str) -> Escalation:
        """Record on an answered escalation that its answer was never applied, and why (see :func:`mark_unapplied`)."""
        return self.update(esc_id, lambda e: mark_unapplied(e, reason))

    def cancel(self, esc_id: str, reason: str, now: datetime | None = None) -> Escalation:
        """Withdraw a pending escalation; :class:`AlreadyAnsweredError` if it was settled first."""
        when = now or self._clock.now()
        return self.update(esc_id, lambda e: cancel(e, reason=reason, now=when))

    def pending_breaks(self, scope: str) -> builtins.list[Escalation]:
        """The pending circuit-break escalations of a scope (``ambient preflight reset`` answers them)."""
        return [
            e
            for e in self._scan().escalations
            if e.status == "pending" and e.kind == "circuit_break" and e.scope == scope
        ]

    def cancel_run(self, run_id: str, reason: str, now: datetime | None = None) -> builtins.list[Escalation]:
        """Withdraw every escalation of a run still pending (its run ended: an abort cascades, spec/002); an answer
        given to one of them later is refused (``decide`` exits 1 saying it was cancelled)."""
        when = now or self._clock.now()
        done: builtins.list[Escalation] = []
        with self._guard():
            for esc in self._scan().escalations:
                if esc.run_id == run_id and esc.status == "pending":
                    new = cancel(esc, reason=reason, now=when)
                    self._write(new)
                    done.append(new)
        return done

    def restore(self, esc: Escalation) -> str | None:
        """Write ``esc`` (see :func:`ambient.human.escalations.rebuild`) if its file is missing, empty or unreadable,
        and say which; None, nothing written, if a readable file is there (it may have appeared meanwhile). An
        unreadable file is kept beside, as ``<id>.yml.unreadable`` (a person may have written something in it)."""
        with self._guard():
            path = self.path_for(esc.id)
            try:
                size = os.lstat(path).st_size
            except FileNotFoundError:
                reason = "missing"
            else:
                try:
                    self._read(path)
                    return None
                except (InputError, OSError):
                    reason = "empty" if size == 0 else "unreadable"
                if reason == "unreadable":
                    move(path, path.with_name(path.name + ".unreadable"))
            self._write(esc)
            return reason

    def is_pending(self, esc_id: str) -> bool:
        """Whether an escalation still waits on the person (an unknown or unreadable one does not)."""
        try:
            return self.get(esc_id).status == "pending"
        except InputError:
            return False

    def update(self, esc_id: str, change: Callable[[Escalation], Escalation]) -> Escalation:
        """Atomic read-modify-write under the guard; an exception from ``change`` writes nothing."""
        result = self._modify(esc_id, change)
        assert result is not None
        return result

    def scan(self) -> EscalationScan:
        """Read every escalation file; malformed ones become problems."""
        return self._scan()

    def problems(self) -> builtins.list[Problem]:
        """The files that cannot be read as escalations (for ``ambient doctor`` / ``validate``)."""
        return self._scan().problems

    def list(self, status: Status | None = None) -> builtins.list[Escalation]:
        """Escalations, oldest first, all or only those with ``status``; malformed files skipped."""
        escs = self._scan().escalations
        return [e for e in escs if status is None or e.status == status]

    # -- internals

    def _modify(self, esc_id: str, change: Callable[[Escalation], Escalation | None]) -> Escalation | None:
        with self._guard():
            current = self.get(esc_id)
            new = change(current)
            if new is not None:
                if new.id != current.id:
                    raise StateError(f"an update may not change the id of {current.id}")
                self._write(new)
            return new

    @contextmanager
    def _guard(self) -> Iterator[None]:
        # One guard file, never unlinked (unlinking a flocked file splits waiters across inodes).
        self._ensure_dir()
        fd = open_private(self.guard_path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def _ensure_dir(self) -> None:
        private_dir(self.dir)  # a real folder (0700), never a symlink; a created one is fsync'd into its parent

    def _write(self, esc: Escalation) -> None:
        # 0600: the nonce in the file is what makes a Telegram button trustworthy.
        atomic_write(self.path_for(esc.id), to_yaml(esc), mode=0o600, durable=True)

    def _read(self, path: Path) -> Escalation:
        source = self.paths.rel(path)
        data, lines = load_file(path, max_bytes=MAX_ESCALATION_BYTES, source=source)
        mapping = expect_mapping(data, source=source, what="an escalation")
        try:
            esc = Escalation.model_validate(mapping)
        except ValidationError as exc:
            found = problems_from_validation(exc, file=source, lines=lines)
            detail = "; ".join(p.message for p in found)
            raise InputError(f"is not a valid escalation: {detail}", file=source, line=found[0].line) from None
        if path.stem != esc.id:
            raise InputError(f"holds id {esc.id!r}; the file must be named {esc.id}.yml", file=source, line=1)
        return esc

    def read_file(self, path: Path) -> Escalation | Problem:
        """One file of the folder as an escalation, or the :class:`Problem` that keeps it from being one (a name
        that is not ``<id>.yml``, unreadable, malformed): what :meth:`scan` and the query store both report."""
        source = self.paths.rel(path)
        if not ID_RE.match(path.stem):
            return Problem(file=source, message="is not named <escalation id>.yml; skipped")
        try:
            return self._read(path)
        except InputError as exc:
            return Problem(file=exc.file or source, line=exc.line, message=exc.message)
        except OSError as exc:
            return Problem(file=source, message=f"cannot be read: {exc.strerror}")

    def _scan(self) -> EscalationScan:
        """Every escalation file, each parsed again only if it changed since this store last read it.

        Decided escalations stay in the folder for good, and the daemon lists them all at every tick (deadlines,
        reminders, answers to apply): parsing each (2-3 ms with the safe YAML loader) made every tick cost more
        with every escalation ever made. A file is known by (inode, size, mtime_ns, ctime_ns); callers get a copy
        of what was read. At most ``PARSED_MAX`` files are remembered (a few KB each); the others are parsed.
        """
        escs: builtins.list[Escalation] = []
        problems: builtins.list[Problem] = []
        seen: dict[str, tuple[tuple[int, int, int, int], Escalation]] = {}
        for path in iter_files(self.dir, (".yml",)):
            try:
                st = os.lstat(path)
            except OSError as exc:
                problems.append(Problem(file=self.paths.rel(path), message=f"cannot be read: {exc.strerror}"))
                continue
            sig = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            hit = self._parsed.get(path.name)
            found = hit[1] if hit is not None and hit[0] == sig else self.read_file(path)
            if isinstance(found, Problem):
                problems.append(found)
                continue
            if len(seen) < PARSED_MAX:
                seen[path.name] = (sig, found)
            escs.append(found.model_copy(deep=True))
        self._parsed = seen  # files gone or changed are forgotten with this
        escs.sort(key=lambda e: (e.created_at, e.id))
        return EscalationScan(escs, problems)
