"""A lock file on disk, judged: free, held, expired, dead, malformed or stale (RELIABILITY §1.2 rules 2, 4, 5).

Lock files are hostile input: ``lstat`` first, never followed, 4 KiB cap; an empty, corrupt,
oversized, symlinked or FIFO lock is reported and counts as held until a grace period has
passed since its mtime, then as stale (rule 5). A ``pid_bound`` lock whose process is provably
dead on this host (no such pid, a zombie, or a recycled pid with another start time) is free at
once (rule 2). ``expires_at`` is wall-clock time, honoured ``grace_s`` late (rule 6). Taking a
lock over removes exactly the file that was judged, never one that replaced it meanwhile (rule 4).

Reading needs no guard (locks are published whole); removing runs under the lock manager's guard.
"""

from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from ambient.claims.lockfile import MAX_LOCK_BYTES, LockInfo, parse_lock
from ambient.core.errors import InputError
from ambient.core.lazylog import get_logger
from ambient.core.process import hostname, own_start_time, process_alive
from ambient.storage.fsutil import writer_mark

log = get_logger(__name__)

LockState = Literal["free", "held", "expired", "dead", "malformed", "stale"]
# States in which a contender may take the lock over (under the guard, after re-checking).
TAKEABLE: Final = frozenset({"expired", "dead", "stale"})


class LockLocation:
    """Where a lock lives: its brain-relative path and its lock file (a string for syscalls, a Path on demand)."""

    __slots__ = ("_path", "rel", "s")

    def __init__(self, rel: str, s: str, path: Path | None = None) -> None:
        self.rel = rel  # normalised brain-relative path
        self.s = s
        self._path = path

    @property
    def path(self) -> Path:
        """The lock file as a Path (built once, on demand: the hot paths use ``s``)."""
        if self._path is None:
            self._path = Path(self.s)
        return self._path


@dataclass(frozen=True)
class LockStatus:
    """What is on disk for one path, judged at ``judged_at``.

    ``free``: no lock. ``held``: a valid lock (possibly expired but within the grace period).
    ``expired``: past ``expires_at`` + grace. ``dead``: pid-bound and its process is provably
    gone. ``malformed``: unreadable (problem says why), counted as held by an unknown holder until
    the malformed grace has passed since its mtime; then ``stale``.
    """

    file: str
    path: Path
    state: LockState
    info: LockInfo | None = None
    problem: str | None = None
    judged_at: float = 0.0
    raw: bytes | None = field(default=None, repr=False)
    ident: tuple[int, int, int] | None = field(default=None, repr=False)  # (dev, ino, file type)
    line: int | None = None  # of the problem in the file, when its content is what is wrong

    @property
    def takeable(self) -> bool:
        """May a contender take it over (after re-checking under the guard)?"""
        return self.state in TAKEABLE

    @property
    def blocking(self) -> bool:
        """Does it keep other holders out?"""
        return self.state in ("held", "malformed")

    def describe(self) -> str:
        """One human line: who holds it and until when, or why it is unreadable."""
        rel = self.file
        if self.state == "free":
            return f"{rel}: free"
        if self.info is None:
            return f"{rel}: {self.state}: {self.problem}"
        info = self.info
        tail = f"token {info.token}" if info.token is not None else "no token"
        return f"{rel}: {self.state}, holder {info.holder} until {info.expires_at} ({tail})"


def _file_kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def inspect_lock(
    loc: LockLocation, now: float, *, grace_s: float, malformed_grace_s: float, again: bool = True
) -> LockStatus:
    """Judge the lock file of ``loc`` without following links or trusting its content.

    ``grace_s``: how long after ``expires_at`` a lock still counts as held. ``malformed_grace_s``: how long after
    its mtime an unreadable lock counts as held.
    """
    rel, path, source = loc.rel, loc.path, loc.s
    try:
        st = os.lstat(source)
    except FileNotFoundError:
        return LockStatus(rel, path, "free", judged_at=now)
    ident = (st.st_dev, st.st_ino, stat.S_IFMT(st.st_mode))
    if not stat.S_ISREG(st.st_mode):
        problem = f"{source} is {_file_kind(st.st_mode)}; a lock must be a regular file (never followed)"
        if stat.S_ISDIR(st.st_mode):
            return LockStatus(
                rel, path, "malformed", problem=problem + "; remove it by hand", judged_at=now, ident=ident
            )
        return _malformed(loc, problem, st.st_mtime, now, None, ident, malformed_grace_s)
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return LockStatus(rel, path, "free", judged_at=now)
    except OSError as exc:
        problem = f"{source} cannot be opened: {exc.strerror}"
        return _malformed(loc, problem, st.st_mtime, now, None, ident, malformed_grace_s)
    try:
        fst = os.fstat(fd)
        ident = (fst.st_dev, fst.st_ino, stat.S_IFMT(fst.st_mode))
        if not stat.S_ISREG(fst.st_mode):
            problem = f"{source} is {_file_kind(fst.st_mode)}"
            return _malformed(loc, problem, fst.st_mtime, now, None, ident, malformed_grace_s)
        if fst.st_size > MAX_LOCK_BYTES:
            problem = f"{source} is {fst.st_size} bytes; a lock file is at most {MAX_LOCK_BYTES}"
            return _malformed(loc, problem, fst.st_mtime, now, None, ident, malformed_grace_s)
        raw = os.read(fd, MAX_LOCK_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_LOCK_BYTES:
        problem = f"{source} grew over {MAX_LOCK_BYTES} bytes"
        return _malformed(loc, problem, fst.st_mtime, now, raw, ident, malformed_grace_s)
    try:
        info = parse_lock(raw, source)
    except InputError as exc:
        return _malformed(loc, str(exc), fst.st_mtime, now, raw, ident, malformed_grace_s, exc.line)
    if info.instance is not None and info.file != rel:
        # Spare inodes are recycled: a reader that opened this name just before its release can
        # read the next grant's content. Look again; the name is then gone (or shows its own lock).
        if again:
            return inspect_lock(loc, now, grace_s=grace_s, malformed_grace_s=malformed_grace_s, again=False)
        problem = f"{source} names another file ({info.file!r})"
        return _malformed(loc, problem, fst.st_mtime, now, raw, ident, malformed_grace_s)
    if now > info.expires + grace_s:
        state: LockState = "expired"
    elif holder_dead(info):
        state = "dead"
    else:
        state = "held"
    return LockStatus(rel, path, state, info=info, judged_at=now, raw=raw, ident=ident)


def _malformed(
    loc: LockLocation,
    problem: str,
    mtime: float,
    now: float,
    raw: bytes | None,
    ident: tuple[int, int, int] | None,
    malformed_grace_s: float,
    line: int | None = None,
) -> LockStatus:
    state: LockState = "stale" if now - mtime > malformed_grace_s else "malformed"
    return LockStatus(loc.rel, loc.path, state, problem=problem, judged_at=now, raw=raw, ident=ident, line=line)


def holder_dead(info: LockInfo) -> bool:
    """Is the lock's holder provably gone: pid-bound, on this host, and its process (that very one) not running?"""
    if not info.pid_bound or info.pid is None or info.host != hostname():
        return False  # another host, or a session-bound lock: only the TTL frees it
    if info.pid == os.getpid() and info.pid_start_time == own_start_time():
        return False
    return not process_alive(info.pid, info.pid_start_time)


def remove_if_unchanged(loc: LockLocation, judged: LockStatus) -> bool:
    """Rename the lock aside, re-check it is what was judged, then delete it (else put it back).

    Guards against writers that do not take our guard (other tools, people): what is deleted is
    exactly the file that was judged, never one that replaced it meanwhile.
    """
    path = loc.path
    aside = path.with_name(f".{path.name}.stale.{writer_mark()}.{secrets.token_hex(4)}")
    try:
        path.rename(aside)
    except FileNotFoundError:
        return True  # gone already: nothing of anyone's was removed
    try:
        st = os.lstat(aside)
        same = judged.ident is not None and (st.st_dev, st.st_ino, stat.S_IFMT(st.st_mode)) == judged.ident
        if same and judged.raw is not None and stat.S_ISREG(st.st_mode):
            fd = os.open(aside, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                same = os.read(fd, MAX_LOCK_BYTES + 1) == judged.raw
            finally:
                os.close(fd)
    except OSError:
        same = False
    if same:
        aside.unlink()
        return True
    try:
        os.link(aside, path, follow_symlinks=False)
        aside.unlink()
    except FileExistsError:
        log.warning("lock_changed_during_takeover", lock=str(path), kept=str(aside))
    return False
