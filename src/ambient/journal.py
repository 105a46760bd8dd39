"""Append-only JSON-lines files: the run records, the router's audit log, event histories.

Each record is one line written with ``O_APPEND``, so concurrent appenders never interleave
within a line. Lines are buffered and written in batches; :meth:`Journal.sync` and
:meth:`Journal.commit` make everything written so far durable with one fsync (group commit:
many completions, one fsync). A crash can leave a torn last line: :func:`read_jsonl` skips it
and reports it; a past line is never rewritten.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

_FLUSH_AT = 64 * 1024


def _dumps(record: Mapping[str, Any]) -> bytes:
    return (json.dumps(record, separators=(",", ":"), ensure_ascii=False, default=str) + "\n").encode()


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
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        self._buffered = buffered
        self._buf = bytearray()
        self._written = 0  # generation counters for group commit
        self._synced = 0
        self._round: asyncio.Future[None] | None = None  # the fsync round in flight (commit)
        self._failed: OSError | None = None  # a failed fsync: the journal stays failed (see _fsync)

    def write(self, record: Mapping[str, Any]) -> None:
        """Queue one record; it reaches the file at the next flush (or at once when unbuffered)."""
        self._buf += _dumps(record)
        self._written += 1
        if not self._buffered or len(self._buf) >= _FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        """Write buffered lines to the file (whole lines only), without fsync."""
        if not self._buf:
            return
        view = memoryview(bytes(self._buf))
        self._buf.clear()
        while view:
            view = view[os.write(self._fd, view) :]

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

        One fsync round at a time; a caller whose records are not covered by the round in flight waits for
        it and then starts (or joins) the next one. Every caller covered by a round wakes when it ends: an
        ``asyncio.Lock`` here released its waiters one per loop iteration, and 256 items committing at once
        waited 280 ms each for 35 fsyncs in all (bench/fanout.py, measured).
        """
        import asyncio  # here: short CLI writers of journals never start an event loop

        self.flush()
        target = self._written
        while self._synced < target:
            if self._round is None:
                self._round = asyncio.ensure_future(self._sync_round())
            await asyncio.shield(self._round)  # one caller cancelled does not cancel the others' fsync

    async def _sync_round(self) -> None:
        import asyncio

        try:
            self.flush()
            upto = self._written
            await asyncio.get_running_loop().run_in_executor(_fsync_pool(), self._fsync)
            self._synced = max(self._synced, upto)
        finally:
            self._round = None

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


def append_line(path: Path, record: Mapping[str, Any], *, durable: bool = True) -> None:
    """Append one record to ``path`` with a single write (for short-lived writers such as the CLI)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        data = _dumps(record)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


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


def read_jsonl(path: Path) -> ReadResult:
    """All records of ``path`` (see :func:`iter_jsonl`)."""
    res = ReadResult()
    res.records = list(iter_jsonl(path, res))
    return res
