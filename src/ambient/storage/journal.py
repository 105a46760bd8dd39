"""Append-only JSON-lines files: the run records, the router's audit log, event histories.

Each record is one line written with ``O_APPEND``, so concurrent appenders never interleave
within a line. Lines are buffered and written in batches; :meth:`Journal.sync` and
:meth:`Journal.commit` make everything written so far durable with one fsync (group commit:
many completions, one fsync). A crash can leave a torn last line: :func:`read_jsonl` skips it
and reports it; a past line is never rewritten. Journals are ambient's private state: a file is created 0600 and
never opened through a symlink, its folder goes through :func:`~.fsutil.private_dir` (a real folder, 0700).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ambient.core.errors import JournalWriteError
from ambient.storage.fsutil import open_private, private_dir, write_all

if TYPE_CHECKING:
    import asyncio

_FLUSH_AT = 64 * 1024


def _running_loop() -> asyncio.AbstractEventLoop:
    """The running event loop (RuntimeError if none); asyncio imported here: short CLI writers never need it."""
    import asyncio

    return asyncio.get_running_loop()


# One encoder for every record: ``json.dumps`` with these options builds a new one per call (~2 µs of the ~10 a
# record costs; a fan-out item writes three run records and two audit records).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str)


def _dumps(record: Mapping[str, Any]) -> bytes:
    return (_ENCODER.encode(record) + "\n").encode()


_FSYNC_POOL: list[Any] = []


def _fsync_pool() -> Any:
    """The threads that run commits' fsyncs: their own, not asyncio's default pool.

    In the default pool an fsync queued behind the daemon's slow jobs (a scan of claims/, a batch of live
    turns): 6 fsync rounds took 35-48 ms each for fsyncs of 7-12 ms, and fan-out items waited ~130 ms per
    commit (bench/fanout.py, measured). Two threads: journals of different runs sync in parallel.
    """
    if not _FSYNC_POOL:
        from concurrent.futures import ThreadPoolExecutor

        _FSYNC_POOL.append(ThreadPoolExecutor(max_workers=2, thread_name_prefix="fsync"))
    return _FSYNC_POOL[0]


class Journal:
    """One JSONL file opened for appending. Not thread-safe; use it from one event loop or thread."""

    def __init__(self, path: Path, *, buffered: bool = True) -> None:
        self.path = path
        private_dir(path.parent)
        self._fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        self._buffered = buffered
        self._buf = bytearray()
        self._written = 0  # generation counters for group commit
        self._synced = 0
        self._syncing = False  # an fsync round is in flight (commit)
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []  # (records needed, waiter) of commit()
        self._failed: OSError | None = None  # a failed fsync: the journal stays failed (see _fsync)
        # A commit round's records, handed to its thread to write before its fsync, and the lock that keeps
        # writes in order: whoever holds it writes what is pending before anything newer.
        self._pending = b""
        self._io = threading.Lock()
        self._flush_soon = False  # a flush of a full buffer is scheduled for the end of the loop's step
        self._together = 0  # inside together(): no flush splits the records being written

    def together(self) -> _Together:
        """``with journal.together():`` the records written inside reach the file in one write, never some without
        the others: a kill can fall between two writes, and a result without the question it raised reads as a
        failure. (A class, not a generator: it wraps every item's result in a fan-out, bench/fanout.py.)"""
        return _Together(self)

    def _together_done(self) -> None:
        self._together -= 1
        if not self._together:
            self._written_some()

    def write(self, record: Mapping[str, Any]) -> None:
        """Queue one record; it reaches the file at the next flush (or at once when unbuffered).

        A full buffer is flushed once the event loop's current step is over, not in the middle of it: the records
        one step writes (an attempt's ``finished`` and the ``retry`` that routes it) go to the file in one write,
        which lands whole or not at all (:meth:`_write`). Without a running loop (the CLI), at once.
        """
        self._buf += _dumps(record)
        self._written += 1
        if not self._together:
            self._written_some()

    def _written_some(self) -> None:
        """Unbuffered, the records go to the file now; a full buffer, once the loop's step is over."""
        if not self._buffered:
            self.flush()
        elif len(self._buf) >= _FLUSH_AT and not self._flush_soon:
            try:
                loop = _running_loop()
            except RuntimeError:
                self._flush_full()
            else:
                self._flush_soon = True
                loop.call_soon(self._flush_full)

    def _flush_full(self) -> None:
        self._flush_soon = False
        if self._fd < 0:
            return
        with contextlib.suppress(JournalWriteError):
            self.flush()  # a full disk: the records wait in memory for the next commit, which says so to its caller

    def flush(self) -> None:
        """Write buffered lines to the file (whole lines only), without fsync. A write that fails (a full disk)
        raises :class:`JournalWriteError` and keeps what did not reach the file for the next try, in order."""
        if not self._buf and not self._pending:
            return
        with self._io:
            self._write_pending()
            if self._buf:
                data = bytes(self._buf)
                self._buf.clear()
                try:
                    self._write(data)
                except JournalWriteError as exc:
                    self._buf[:0] = exc.rest
                    raise

    def _write_pending(self) -> None:
        # Holding self._io.
        data, self._pending = self._pending, b""
        if data:
            try:
                self._write(data)
            except JournalWriteError as exc:
                self._pending = exc.rest + self._pending
                raise

    def _write(self, data: bytes) -> None:
        """Append ``data`` (whole lines) whole or not at all. When a write fails half-way (ENOSPC after a short
        write), what it wrote is cut off the file before anything else is appended, and all of ``data`` is raised
        back to the caller to be written again: a record glued onto a fragment would be lost with it, in the middle
        of a journal where no start-up repair looks, and the records written together in one step of
        the engine (an attempt's ``finished`` and the ``retry`` that routes it) must not reach the file one without
        the other: a kill on a full disk then left a failed attempt whose retry was lost."""
        view = memoryview(data)
        done = 0
        try:
            while done < len(data):
                done += os.write(self._fd, view[done:])
        except OSError as exc:
            if done:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, os.fstat(self._fd).st_size - done)
            raise JournalWriteError(exc, str(self.path), data) from exc

    def sync(self) -> None:
        """Flush and fsync: everything written so far survives a power cut. A failed fsync raises."""
        self.flush()
        target = self._written
        if self._synced < target:
            self._fsync()
            self._synced = target

    def _fsync(self) -> None:
        # A failed fsync can drop the dirty pages and mark them clean, so a retry "succeeds" without the data
        # (fsyncgate, RELIABILITY §1.3 [29]): after one failure every later sync fails too; crash and recover.
        if self._failed is not None:
            raise OSError(errno.EIO, f"{self.path}: an earlier fsync failed; records may be lost") from self._failed
        try:
            os.fsync(self._fd)
        except OSError as exc:
            self._failed = exc
            raise

    async def commit(self) -> None:
        """Like :meth:`sync` but off the event loop, and coalesced: concurrent callers share one fsync.

        One fsync round at a time, in the journal's own threads; a caller whose records are not covered by the
        round in flight waits for the next one. When a round ends, the thread hands its outcome to the loop and
        every caller it covers is woken in that same loop iteration.

        Performance (bench/fanout.py): an ``asyncio.Lock`` here released its waiters one per loop iteration
        (256 items waited 280 ms each for 35 fsyncs in all); then a round task and ``asyncio.shield`` cost five
        loop iterations per commit on top of the fsync (~6 ms per commit in a busy fan-out for 0.8 ms fsyncs);
        now a round starts at the end of the iteration and its callers wake in the iteration after it. The round's
        thread also writes its records: a write per commit on the loop was 7 % of a fan-out's loop (py-spy).
        """
        import asyncio  # here: short CLI writers of journals never start an event loop

        target = self._written
        if self._synced >= target:
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append((target, waiter))
        if not self._syncing:
            # Started once the current loop iteration is over, so that every commit of this iteration joins it.
            self._syncing = True
            loop.call_soon(self._start_round, loop)
        await waiter  # a cancelled caller drops only its own waiter; the round goes on for the others

    def _start_round(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._fd < 0:  # closed meanwhile: close() synced what it could
            unsynced = self._synced < self._written
            closed = OSError(errno.EBADF, f"{self.path}: closed before its records were committed")
            self._round_done(loop, self._synced, closed if unsynced else None)
            return
        if self._buf:
            with self._io:
                self._pending += self._buf
            self._buf.clear()
        _fsync_pool().submit(self._round, loop, self._written)

    def _round(self, loop: asyncio.AbstractEventLoop, upto: int) -> None:
        """In a journal thread: write the round's records (unless a flush on the loop did), fsync, then hand the
        outcome to the loop."""
        failure: OSError | None = None
        try:
            with self._io:
                self._write_pending()  # a failed write keeps its records pending: the next round tries again
            self._fsync()
        except OSError as exc:
            failure = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed (shutdown): nobody is waiting any more
            loop.call_soon_threadsafe(self._round_done, loop, upto, failure)

    def _round_done(self, loop: asyncio.AbstractEventLoop, upto: int, failure: OSError | None) -> None:
        self._syncing = False
        if failure is None:
            self._synced = max(self._synced, upto)
        waiting: list[tuple[int, asyncio.Future[None]]] = []
        for target, waiter in self._waiters:
            if waiter.done():  # its caller was cancelled
                continue
            if target <= self._synced:
                waiter.set_result(None)
            elif failure is not None:
                waiter.set_exception(failure)
            else:
                waiting.append((target, waiter))
        self._waiters = waiting
        if waiting:  # records written while the round ran: their own round, at once
            self._syncing = True
            self._start_round(loop)

    def close(self) -> None:
        """Flush, fsync and close."""
        if self._fd < 0:
            return
        try:
            self.sync()
        finally:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Together:
    """See :meth:`Journal.together`."""

    __slots__ = ("_journal",)

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    def __enter__(self) -> None:
        self._journal._together += 1

    def __exit__(self, *exc: object) -> None:
        self._journal._together_done()


def append_line(path: Path, record: Mapping[str, Any], *, durable: bool = True) -> None:
    """Append one record to ``path`` with a single write (for short-lived writers such as the CLI).

    A torn last line (a crash mid-append) is cut first, so the record starts a line of its own: appended onto the
    fragment it would be unreadable too (a torn runs.jsonl lost the next run's record). A write that fails
    half-way (a full disk) is cut back the same way, so no later record is glued to it.
    """
    private_dir(path.parent)
    fd = open_private(path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
    try:
        size = _cut_torn_tail(fd, path)
        try:
            write_all(fd, _dumps(record))
        except OSError:
            os.ftruncate(fd, size)
            raise
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def _cut_torn_tail(fd: int, path: Path) -> int:
    """Cut what follows the last newline of the file open at ``fd`` (a torn record); return the size after."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size
    end, block = size, 64 * 1024
    while end > 0:
        start = max(0, end - block)
        cut = os.pread(fd, end - start, start).rfind(b"\n")
        if cut >= 0:
            keep = start + cut + 1
            break
        end = start
    else:
        keep = 0
    os.ftruncate(fd, keep)
    import structlog  # here: the rare path; short CLI writers do not pay for it

    structlog.get_logger(__name__).warning("jsonl_torn_tail_cut", path=str(path), bytes=size - keep)
    return keep


@dataclass
class ReadResult:
    """Records read from a JSONL file, and what had to be skipped."""

    records: list[dict[str, Any]] = field(default_factory=list)
    torn_tail: bool = False
    bad_lines: list[int] = field(default_factory=list)


def iter_jsonl(path: Path, result: ReadResult | None = None) -> Iterator[dict[str, Any]]:
    """Yield the records of ``path`` in order; a torn last line or a corrupt line is skipped and noted."""
    res = result if result is not None else ReadResult()
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return
    with fh:
        lineno = 0
        for raw in fh:
            lineno += 1
            if not raw.endswith(b"\n"):
                res.torn_tail = True  # crash mid-append: the record never completed
                break
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except ValueError:
                res.bad_lines.append(lineno)
                continue
            if isinstance(rec, dict):
                yield rec
            else:
                res.bad_lines.append(lineno)


def read_first(path: Path) -> dict[str, Any] | None:
    """The first record of ``path`` (a run journal's ``started``, with the spec it is pinned to), or None."""
    return next(iter_jsonl(path), None)


def read_jsonl(path: Path) -> ReadResult:
    """All records of ``path`` (see :func:`iter_jsonl`)."""
    res = ReadResult()
    res.records = list(iter_jsonl(path, res))
    return res


def tail_jsonl(path: Path, count: int, *, block: int = 64 * 1024) -> list[dict[str, Any]]:
    """The last ``count`` records of ``path``: ``read_jsonl(path).records[-count:]``, read from the end.

    ``runs.jsonl`` gains a line per run for good (a run of 1,000 items writes ~200 KB); ``ambient status`` shows the
    newest few and read the whole file for them. Blocks of ``block`` bytes are read backwards, each line parsed
    once, until ``count`` records are found (a torn last line and corrupt lines are skipped, as in :func:`iter_jsonl`).
    """
    if count <= 0:
        return []
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return []
    newest_first: list[dict[str, Any]] = []
    with fh:
        pos = fh.seek(0, os.SEEK_END)
        pending = b""  # the start of the oldest line read so far (it begins in a block not read yet)
        past_tail = False  # the last newline was found: what follows it (a torn record, or nothing) is dropped
        while pos > 0 and len(newest_first) < count:
            step = min(block, pos)
            pos -= step
            fh.seek(pos)
            parts = (fh.read(step) + pending).split(b"\n")
            if not past_tail:
                if len(parts) == 1:
                    pending = parts[0]  # still inside a torn last line
                    continue
                parts.pop()
                past_tail = True
            pending = parts.pop(0) if pos > 0 else b""
            for raw in reversed(parts):
                rec = _record_of(raw)
                if rec is not None:
                    newest_first.append(rec)
                    if len(newest_first) == count:
                        break
    return newest_first[::-1]


def _record_of(raw: bytes) -> dict[str, Any] | None:
    if not raw.strip():
        return None
    try:
        rec = json.loads(raw)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None
