"""The agents' live threads on disk (spec/001): one canonical thread per target agent, shared by all requesters.

``.ambient/live/<agent>/log.jsonl`` (rotated to ``log.N.jsonl``) holds every turn (:mod:`~ambient.live.turn`) with
its attribution; pair and correlation views are filtered projections of it. What runners give an agent is its
handoff (:mod:`~ambient.live.handoff`, kept by :mod:`~ambient.live.context`), never the raw transcript.

Threads are agent conversations, private state: ``live/<agent>/`` goes through
:func:`~ambient.storage.fsutil.private_dir` before each write (a real folder, 0700: a symlink swapped in is refused
for that thread only, the others go on) and every file is 0600, never opened through a symlink."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ambient.core.errors import InputError
from ambient.live.turn import Turn, check_agent_name, turn_from_packet
from ambient.storage.fsutil import append_whole, fsync_dir, move, open_private, private_dir
from ambient.storage.journal import ReadResult, iter_jsonl
from ambient.storage.paths import BrainPaths

DEFAULT_MAX_BYTES = 1024 * 1024
DEFAULT_KEEP = 5
SUMMARY_TURNS = 2000  # turns the handoff is summarised from (the newest): recent_turns' default
LOG_NAME = "log.jsonl"
LOCK_NAME = "thread.lock"

# Made once: ``json.dumps`` with options builds an encoder per call (turn records are written in bulk).
_LINE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


@dataclass
class ThreadView:
    """A projection of an agent's thread: the whole thread, or filtered by requester / correlation."""

    agent: str
    requester: str | None
    correlation: str | None
    turns: list[Turn]
    total: int  # turns in the whole thread
    partial: bool
    note: str
    skipped_lines: int = 0
    torn_tail: bool = False
    files: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "agent": self.agent,
            "requester": self.requester,
            "correlation": self.correlation,
            "partial": self.partial,
            "note": self.note,
            "total": self.total,
            "shown": len(self.turns),
            "skipped_lines": self.skipped_lines,
            "torn_tail": self.torn_tail,
            "turns": [t.model_dump(mode="json") for t in self.turns],
        }


def _line(record: Mapping[str, Any]) -> bytes:
    return (_LINE.encode(record) + "\n").encode("utf-8")


_TAIL_CHUNK = 65536


def _tail_lines(path: Path, limit: int) -> list[bytes]:
    """The last ``limit`` complete, non-blank lines of ``path``, in order (a torn last line is left out).

    Read from the end, a chunk at a time: the handoff is rewritten from the newest turns after every batch of
    appends, and reading the whole log (up to a MiB before it rotates) each time cost CPU and left the soak's
    RSS ratcheting up with the log's size (R-12).
    """
    if limit <= 0:
        return []
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    try:
        end = os.fstat(fd).st_size
        buf = b""
        while True:
            start = max(0, end - _TAIL_CHUNK)
            buf = os.pread(fd, end - start, start) + buf
            end = start
            lines = buf.split(b"\n")
            lines.pop()  # what follows the last newline: nothing, or a record a crash cut short
            if start > 0:
                lines = lines[1:]  # may begin mid-line
            found = [raw for raw in lines if raw.strip()]
            if len(found) >= limit or start == 0:
                return found[-limit:]
    finally:
        os.close(fd)


class Threads:
    """The live threads of a brain (``.ambient/live/<agent>/``).

    Appends take a per-agent ``flock`` (threads and processes); they are blocking file calls,
    so from the event loop call them through ``asyncio.to_thread``. What is kept from a thread besides its turns
    (the handoff) is a subclass's: :meth:`_appended` runs under the thread's lock after each append
    (:class:`~ambient.live.context.LiveContext`).
    """

    def __init__(
        self,
        paths: BrainPaths,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        keep: int = DEFAULT_KEEP,
        durable: bool = False,
    ) -> None:
        if max_bytes < 1024 or keep < 1:
            raise ValueError("live context: max_bytes must be at least 1024 and keep at least 1")
        self.paths = paths
        self.max_bytes = max_bytes
        self.keep = keep
        self.durable = durable  # fsync each turn (the run journal, not this, is the source of truth)
        self._dirs: dict[str, Path] = {}  # checked agent names → their thread folder

    def thread_dir(self, agent: str) -> Path:
        """``.ambient/live/<agent>`` (the name is checked first)."""
        known = self._dirs.get(agent)
        if known is None:
            known = self.paths.live / check_agent_name(agent)
            if len(self._dirs) < 4096:
                self._dirs[agent] = known
        return known

    def log_files(self, agent: str) -> list[Path]:
        """The thread's files, oldest first: ``log.K.jsonl`` … ``log.1.jsonl``, ``log.jsonl``."""
        d = self.thread_dir(agent)
        files = [d / f"log.{n}.jsonl" for n in range(self.keep, 0, -1)] + [d / LOG_NAME]
        return [f for f in files if f.is_file()]

    @contextlib.contextmanager
    def _locked(self, directory: Path) -> Iterator[None]:
        fd = open_private(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def append_turn(self, turn: Turn) -> None:
        """Append a turn to its agent's thread; rotate past ``max_bytes``."""
        self.append_turns([turn])

    def append_turns(self, turns: Iterable[Turn]) -> None:
        """Append turns in order, with one lock and one write per thread (and per rotation).

        Performance (bench/fanout.py): a fan-out adds two turns per item; one lock, stat, open and write per
        turn was a dozen syscalls per turn on a busy disk. The daemon hands its batches here.
        """
        groups: dict[str, list[Turn]] = {}
        for turn in turns:
            groups.setdefault(turn.target, []).append(turn)
        failed: Exception | None = None
        for agent, group in groups.items():
            try:
                self._append_group(agent, group)
            except (OSError, InputError) as exc:  # one broken thread must not lose the others' turns
                failed = failed or exc
        if failed is not None:
            raise failed

    def append_records(self, records: Iterable[Mapping[str, Any]]) -> None:
        """:meth:`append_turns` for records made by :func:`~ambient.live.turn.turn_record` (the daemon's path)."""
        groups: dict[str, list[Mapping[str, Any]]] = {}
        for rec in records:
            groups.setdefault(str(rec["target"]), []).append(rec)
        failed: Exception | None = None
        for agent, group in groups.items():
            try:
                self._append_lines(agent, [_line(r) for r in group], {r.get("signal", "") for r in group})
            except (OSError, InputError) as exc:  # one broken thread must not lose the others' turns
                failed = failed or exc
        if failed is not None:
            raise failed

    def _append_group(self, agent: str, group: Sequence[Turn]) -> None:
        lines = [_line(t.model_dump(mode="json", exclude_none=True)) for t in group]
        self._append_lines(agent, lines, {t.signal for t in group})

    def _append_lines(self, agent: str, lines: Sequence[bytes], signals: set[str]) -> None:
        d = private_dir(self.thread_dir(agent))
        with self._locked(d):
            log = d / LOG_NAME
            try:
                size = log.stat().st_size
            except FileNotFoundError:
                size = 0
            chunk: list[bytes] = []
            pending = 0
            rotated = False
            for data in lines:
                if size + pending > 0 and size + pending + len(data) > self.max_bytes:
                    if chunk:
                        self._append(log, b"".join(chunk))
                        chunk, pending = [], 0
                    self._rotate(d)
                    size, rotated = 0, True
                chunk.append(data)
                pending += len(data)
            if chunk:
                self._append(log, b"".join(chunk))
            self._appended(agent, d, signals, rotated)

    def _appended(self, agent: str, directory: Path, signals: set[str], rotated: bool) -> None:
        """After lines were appended to ``agent``'s thread in ``directory`` (under its lock): ``signals`` are the
        appended turns' signals, ``rotated`` whether the log rotated meanwhile. Nothing here."""

    def append_packet(
        self, packet: Mapping[str, Any], *, ts: datetime, correlation_id: str | None = None, source: str = "router"
    ) -> Turn | None:
        """Record a delivered packet in the thread it concerns (see :func:`~ambient.live.turn.turn_from_packet`)."""
        turn = turn_from_packet(packet, ts=ts, correlation_id=correlation_id, source=source)
        if turn is not None:
            self.append_turn(turn)
        return turn

    def _append(self, log: Path, data: bytes) -> None:
        fd = open_private(log, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data  # a torn last line (crash mid-append) stays alone on its line
            append_whole(fd, data, size)  # a full disk leaves no fragment for the next append to be glued onto
            if self.durable:
                os.fsync(fd)
        finally:
            os.close(fd)

    def _rotate(self, d: Path) -> None:
        # log.K is the oldest and leaves; the rotation applies to the canonical thread (spec/001).
        (d / f"log.{self.keep}.jsonl").unlink(missing_ok=True)
        for n in range(self.keep - 1, 0, -1):
            src = d / f"log.{n}.jsonl"
            if src.exists():
                move(src, d / f"log.{n + 1}.jsonl")
        move(d / LOG_NAME, d / "log.1.jsonl")
        if self.durable:
            fsync_dir(d)

    def _read(self, files: Sequence[Path]) -> tuple[list[Turn], int, bool]:
        turns: list[Turn] = []
        skipped = 0
        torn = False
        for f in files:
            res = ReadResult()
            for rec in iter_jsonl(f, res):
                try:
                    turns.append(Turn.model_validate(rec))
                except (ValidationError, InputError):
                    skipped += 1
            skipped += len(res.bad_lines)
            torn = torn or res.torn_tail
        return turns, skipped, torn

    def turns(self, agent: str) -> list[Turn]:
        """Every readable turn of the thread, oldest first."""
        return self._read(self.log_files(agent))[0]

    def recent_turns(self, agent: str, limit: int = SUMMARY_TURNS) -> list[Turn]:
        """The turns of the newest ``limit`` lines of the two newest files, oldest first.

        A torn last line, a blank or corrupt line yields no turn (so there may be fewer than ``limit``).
        Performance: a rotation rewrites the handoff from here, and validating every turn of the full rotated
        file (~3,400 turns a MiB) held the GIL ~125 ms, stalling the daemon's loop; now only the lines
        needed are validated, from their JSON text (~45 ms).
        """
        picked: list[bytes] = []
        for f in reversed(self.log_files(agent)[-2:]):
            picked = _tail_lines(f, limit - len(picked)) + picked
            if len(picked) >= limit:
                break
        turns: list[Turn] = []
        for raw in picked:
            try:
                turns.append(Turn.model_validate_json(raw))
            except (ValidationError, InputError):
                continue
        return turns

    def view(self, agent: str, requester: str | None = None, correlation: str | None = None) -> ThreadView:
        """The thread, or the turns of one requester and/or one correlation id.

        A filtered view is marked partial: the agent's live context is shared by every requester,
        so what the agent knows includes turns the view does not show.
        """
        files = self.log_files(agent)
        turns, skipped, torn = self._read(files)
        shown = [
            t
            for t in turns
            if (requester is None or t.requester == requester)
            and (correlation is None or t.correlation_id == correlation)
        ]
        filters = [f"{k} {v}" for k, v in (("requester", requester), ("correlation", correlation)) if v is not None]
        partial = bool(filters)
        if partial:
            note = (
                f"partial view ({' and '.join(filters)}): {agent}'s live context is one thread shared by every "
                f"requester; {len(turns) - len(shown)} of its {len(turns)} turns are not shown here"
            )
        else:
            note = f"full thread of {agent}, shared by every requester"
        return ThreadView(
            agent, requester, correlation, shown, len(turns), partial, note, skipped, torn, [f.name for f in files]
        )
