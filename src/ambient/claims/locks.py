"""The file-lock mutex of DESIGN 4 (spec/002 BSI-v3-7): ``locks/<percent-encoded path>.lock``, readable YAML.

How it stays correct (RELIABILITY §1.2, from py-filelock's bug history):

* A lock is published whole: its content is written to a private file (``.spare.tmp.<pid>.<hex>``)
  which is then hard-linked to the lock's name; the link fails if the name exists, and no
  reader ever sees half a lock (rule 1). Released inodes go back to a small per-manager pool
  and are rewritten (while no lock name points at them) for the next grant: on ext4 the cost
  of a create + unlink loop is the inode allocation, which this skips.
* Every decision that reads then changes ``locks/`` (take, refresh, take over, release,
  cleanup) runs under one ``flock`` on ``.ambient/locks.guard``, a file never unlinked (rule 8),
  and re-checks the lock once the guard is held: several contenders for one expired lock are
  serialised and exactly one wins. Readers (``check``/``list``) need no guard.
* The holder is ``holder`` (the source's session id) plus ``instance`` (random per manager),
  ``pid``, ``pid_start_time`` and ``host``; a ``pid_bound`` lock whose process is provably dead
  on this host (no such pid, a zombie, or a recycled pid with another start time) is free at
  once (rule 2). Locks taken through the CLI are not pid-bound: the CLI exits right away.
* Each grant carries a fencing ``token`` from a counter persisted in the guard file, strictly
  increasing across all paths (so tokens of different locks compare); claim writes carry it and
  :class:`ambient.claims.store.ClaimStore` refuses older ones (rule 3).
* Takeover renames the old file aside, re-reads it and deletes it only if it is still what was
  judged stale; release deletes only a lock whose token (or pinned inode) is the releaser's (rule 4).
* Lock files are hostile input: ``lstat`` first, never followed, 4 KiB cap; an empty, corrupt,
  oversized, symlinked or FIFO lock is reported and counts as held until a grace period has
  passed since its mtime, then as stale (rule 5).
* ``expires_at`` is wall-clock time (it must survive a restart), honoured ``grace_s`` late (rule 6).
* NFS/CIFS/FUSE are refused (rule 7); paths are percent-encoded so they cannot escape or collide (rule 9).

No fsync on acquire, deliberately (it would cost ~0.6 ms, 5-20x the whole cycle, measured
here): a killed process never leaves a torn lock (the content is written before the link), and
a power cut kills every holder anyway; an empty lock left by one is malformed, hence stale
after the grace period. ``durable=True`` fsyncs file and directory. The token counter is not
fsync'd either: after a power cut its wall-clock part keeps new tokens above the old ones.

The daemon's event loop runs lock operations inline while the guard is free, and keeps the guard
for the rest of its loop iteration, so that a fan-out's operations share one ``flock`` and one read
of the counter (see ``LockManager._enter_nowait``); the managers of one process share one guard.

Known limits: waiting is polling with backoff (no fairness; a process that releases and
re-acquires at once can starve waiters for a while); a process stopped (SIGSTOP) while inside
the guard's section stalls other lock operations until it resumes; another process waits up to
one iteration of the daemon's loop (usually well under a millisecond, a few under load).

This module imports neither pydantic nor PyYAML nor structlog at import time (the ``ambient
lock`` command runs around every write of a script); hostile or foreign lock files fall back to
the safe YAML reader, loaded on demand.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import json
import os
import random
import re
import resource
import secrets
import socket
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Final, Literal
from urllib.parse import quote, unquote

from ambient.core.errors import InputError, LockError, LockHeldError, LockNotHeldError, UnsafePathError
from ambient.storage.fsutil import (
    TMP_MARK,
    check_local_filesystem,
    check_relative,
    fsync_dir,
    open_private,
    private_dir,
    tmp_name,
)
from ambient.storage.paths import BrainPaths

LOCK_SUFFIX: Final = ".lock"
GUARD_NAME: Final = "locks.guard"
DEFAULT_TTL_S: Final = 3600.0  # spec/002: ttl_min defaults to 60
DEFAULT_GRACE_S: Final = 5.0
DEFAULT_MALFORMED_GRACE_S: Final = 30.0
MAX_LOCK_BYTES: Final = 4096  # same cap as ambient.storage.yamlfile.MAX_LOCK_BYTES (not imported: it pulls PyYAML)
MAX_HOLDER_LEN: Final = 200
_START_TOLERANCE_S: Final = 0.05  # process start times are known to a clock tick (10 ms)
_POLL_MIN_S: Final = 0.0005
_POLL_MAX_S: Final = 0.02
# Spare inodes kept per manager (each an open fd and a hidden file in locks/). At 4, a fan-out of 16 agents freed
# and re-created 69 % of its lock inodes (releases come in bursts): each a close that frees an inode and a create.
# At 64, a fan-out of 256 did the same at each burst, and on ext4 without a journal every inode freed makes the
# next creates slower for a minute (the allocator skips recently deleted inodes, one by one): 14 % of the event
# loop's samples sat in that create (py-spy, bench/fanout.py (a)). Now up to 512, or a quarter of the soft
# descriptor limit (256 under the usual 1,024): each held lock pins a descriptor too, and agents need pipes.
_SPARES_MAX: Final = 512


def spares_max() -> int:
    """How many spare inodes a manager keeps: :data:`_SPARES_MAX`, or a quarter of the descriptor limit."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return _SPARES_MAX
    return max(4, min(_SPARES_MAX, soft // 4))


_TMP_RE: Final = re.compile(r"^\..+\.(?:tmp|stale)\.(\d+)\.[0-9a-f]+$")

LockState = Literal["free", "held", "expired", "dead", "malformed", "stale"]
# States in which a contender may take the lock over (under the guard, after re-checking).
TAKEABLE: Final = frozenset({"expired", "dead", "stale"})


def _warn(event: str, **fields: Any) -> None:
    # structlog is imported only when something worth a warning happens (import cost, module docstring).
    import structlog

    structlog.get_logger(__name__).warning(event, **fields)


# -- names


_QUOTE_FREE: Final = re.compile(r"[A-Za-z0-9_.~/-]+")


@lru_cache(maxsize=1024)
def encode_path(file: str) -> tuple[str, str]:
    """(normalised brain-relative path, lock file name) for ``file``; refuses anything that could escape.

    ``agents/foo.md`` → ``agents%2Ffoo.md.lock``. A trailing ``/`` (a folder scope) is kept, so a
    folder and a file of the same name get different locks. ``%`` is encoded too, so two paths
    never share a name (RELIABILITY §1.2 rule 9, S-01).
    """
    if not isinstance(file, str):
        raise InputError(f"lock path must be a string, got {type(file).__name__}")
    folder = file.endswith("/")
    rel = check_relative(file)
    if not rel:
        raise InputError(f"lock path {file!r} is empty; expected a file or folder path relative to the brain root")
    if not rel.isprintable():  # control characters, and line breaks YAML would fold
        raise UnsafePathError(f"lock path {file!r} contains a control or line-break character")
    if folder:
        rel += "/"
    # quote() leaves letters, digits and "_.-~" as they are: a path of only those and "/" needs no scan.
    name = rel.replace("/", "%2F") if _QUOTE_FREE.fullmatch(rel) else quote(rel, safe="")
    if name.startswith("."):
        name = "%2E" + name[1:]  # a lock is never a hidden file (hidden names are temp files)
    name += LOCK_SUFFIX
    if len(name.encode()) > 255:
        raise InputError(f"lock path {file!r} is too long to lock (its encoded name is over 255 bytes)")
    return rel, name


def decode_name(name: str) -> str | None:
    """The path a lock file name stands for, or None for a name this module did not make."""
    if not name.endswith(LOCK_SUFFIX) or name.startswith("."):
        return None
    rel = unquote(name[: -len(LOCK_SUFFIX)])
    try:
        encode_path(rel)
    except (InputError, UnsafePathError):
        return None
    return rel


@lru_cache(maxsize=1024)
def check_holder(holder: str) -> str:
    """A holder (session id) must be printable text of at most 200 characters."""
    if not isinstance(holder, str) or not holder.strip():
        raise InputError("lock holder is empty; expected a session id such as sess-20260316-2036-x")
    # isprintable also refuses U+0085/U+2028/U+2029, which YAML and str.splitlines treat as line breaks.
    if len(holder) > MAX_HOLDER_LEN or not holder.isprintable():
        raise InputError(f"lock holder {holder[:40]!r} must be printable text of at most {MAX_HOLDER_LEN} characters")
    return holder


# -- processes (RELIABILITY §1.2 rule 2)

_BOOT: dict[str, float] = {}
_SELF: dict[int, float | None] = {}
_HOST: list[str] = []


def _boot_time() -> float:
    if "btime" not in _BOOT:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                _BOOT["btime"] = float(line.split()[1])
                break
        _BOOT["hz"] = float(os.sysconf("SC_CLK_TCK"))
    return _BOOT["btime"]


def process_start_time(pid: int) -> float | None:
    """Start time (epoch seconds, 10 ms resolution) of a live process; None if it is gone or a zombie.

    Reads field 22 of ``/proc/<pid>/stat`` (what psutil's ``create_time()`` returns); psutil is
    the fallback where /proc is missing.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        if Path("/proc/self/stat").exists():
            return None
        return _psutil_start(pid)
    rest = raw[raw.rindex(b")") + 2 :].split()
    if rest[0] in (b"Z", b"X", b"x"):  # zombie or dead: killed, not yet reaped
        return None
    btime = _boot_time()
    return round(btime + int(rest[19]) / _BOOT["hz"], 2)


def start_time_now() -> float | None:
    """The start time :func:`process_start_time` will give a process started now, without reading ``/proc/<pid>``.

    Same frame as /proc (boot time + time since boot, ``CLOCK_BOOTTIME`` like the kernel's start time), so the
    two agree to a clock tick plus the time the start takes. Reading ``/proc/<pid>/stat`` of a process that
    is still exec'ing waits for it: ~7 % of the loop in a fan-out of command agents (py-spy). None where the
    boot clock or ``/proc/stat`` is missing.
    """
    if not hasattr(time, "CLOCK_BOOTTIME"):
        return None
    return start_time_at(time.clock_gettime(time.CLOCK_BOOTTIME))


def start_time_at(boot_clock: float) -> float | None:
    """The start time of a process started when ``CLOCK_BOOTTIME`` read ``boot_clock`` (read by another process:
    the spawner)."""
    try:
        btime = _boot_time()
    except (OSError, KeyError, ValueError):
        return None
    return round(btime + boot_clock, 2)


def _psutil_start(pid: int) -> float | None:
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return round(proc.create_time(), 2)
    except psutil.Error:
        return None


def _own_start() -> float | None:
    pid = os.getpid()
    if pid not in _SELF:
        _SELF.clear()
        _SELF[pid] = process_start_time(pid)
    return _SELF[pid]


def hostname() -> str:
    """This host's name, as written in ``host:``."""
    if not _HOST:
        _HOST.append(socket.gethostname())
    return _HOST[0]


def process_alive(pid: int, start_time: float | None) -> bool:
    """Is the process that wrote (pid, start_time) still running on this host? A recycled pid is not."""
    now_start = process_start_time(pid)
    if now_start is None:
        return False
    return start_time is None or abs(now_start - start_time) <= _START_TOLERANCE_S


# -- the short kernel mutex


class FileGuard:
    """``flock`` on a file that is never unlinked: a short mutex between processes and threads.

    flock is per open file description, so each guard opens its own descriptor (reopened after a
    fork) and a re-entrant thread lock serialises the threads of one process. The kernel drops the
    lock when the process dies, so it never goes stale (RELIABILITY §1.2 rule 8). Use as
    ``with guard.hold() as fd:``; ``fd`` is the guard file's descriptor. Nested holds by the thread
    that holds it cost no syscall; ``generation`` counts the times this process took the flock, so a
    value read under the guard stays valid while the generation is the same.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._pid = 0
        self._thread_lock = threading.RLock()
        self._depth = 0
        self.generation = 0
        self.token_seen: tuple[int, int] | None = None  # (generation, last fencing token stored) for LockManager
        self.token_due: int | None = None  # a token to store in the guard file before the flock is let go

    def _after_fork(self) -> None:
        if self._pid and self._pid != os.getpid():
            self._thread_lock = threading.RLock()  # forked child: the parent's threads and holds are not here
            self._depth = 0
            self.token_due = None  # the parent's to store, under its own hold

    def _open(self) -> int:
        if self._fd is None or self._pid != os.getpid():
            private_dir(self.path.parent)  # the guards live in .ambient/
            self._fd = open_private(self.path, os.O_RDWR | os.O_CREAT)
            self._pid = os.getpid()
        return self._fd

    def hold(self) -> FileGuard:
        """The guard as a context manager (a plain class: this sits on the lock hot path)."""
        return self

    def __enter__(self) -> int:
        self._after_fork()
        self._thread_lock.acquire()
        try:
            fd = self._open()
            if self._depth == 0:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self.generation += 1
            self._depth += 1
        except BaseException:
            self._thread_lock.release()
            raise
        return fd

    def try_enter(self) -> int | None:
        """The guard without waiting (then leave with ``__exit__``); None if a thread or process holds it."""
        self._after_fork()
        if not self._thread_lock.acquire(blocking=False):
            return None
        try:
            fd = self._open()
            if self._depth == 0:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.generation += 1
            self._depth += 1
        except BlockingIOError:
            self._thread_lock.release()
            return None
        except BaseException:
            self._thread_lock.release()
            raise
        return fd

    def __exit__(self, *exc: object) -> None:
        try:
            if self._depth > 0:  # 0 only after close() dropped the flock with the descriptor
                self._depth -= 1
                if self._depth == 0 and self._fd is not None:
                    try:
                        if self.token_due is not None:  # one write per hold, however many grants it made
                            os.pwrite(self._fd, b"%020d\n" % self.token_due, 0)
                    finally:
                        self.token_due = None
                        fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()

    def close(self) -> None:
        """Close the descriptor (the file stays: unlinking a flocked file breaks exclusion)."""
        with self._thread_lock:
            if self._fd is not None and self._pid == os.getpid():
                os.close(self._fd)  # drops the flock too
            self._fd = None
            self._depth = 0


_GUARDS: dict[str, FileGuard] = {}
_GUARDS_LOCK = threading.Lock()


def shared_guard(path: Path) -> FileGuard:
    """The one guard of this process for ``path``.

    Every lock manager of a process shares it: the thread lock then orders the threads of the process and
    a thread may nest holds (the event loop keeps a hold for an iteration; a blocking call on the loop from
    another manager must not wait for it, which two guards of one file did: a deadlock found by the tests).
    """
    key = str(path)
    with _GUARDS_LOCK:
        guard = _GUARDS.get(key)
        if guard is None:
            guard = _GUARDS[key] = FileGuard(path)
        return guard


def sweep_stale_tmp(directory: Path, *, min_age_s: float = 600.0) -> list[Path]:
    """Delete leftover ``.<name>.tmp.<pid>.<hex>`` / ``.stale.`` files whose writer is dead.

    Only those names are touched, never a target file. A file whose pid is alive is kept unless
    it is older than ``min_age_s`` (the pid was recycled): a sweep at start-up never pulls a temp
    file from under a live writer (another CLI command, an agent).
    """
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return removed
    now = time.time()
    for entry in entries:
        m = _TMP_RE.match(entry.name)
        if m is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            continue
        pid = int(m.group(1))
        alive = pid == os.getpid() or process_start_time(pid) is not None
        if alive and now - st.st_mtime < min_age_s:
            continue
        with contextlib.suppress(FileNotFoundError):
            Path(entry.path).unlink()
            removed.append(Path(entry.path))
    return removed


# -- what a lock file says


@dataclass(frozen=True)
class LockInfo:
    """A parsed lock file: the source's keys (file, holder, claimed_at, expires_at, ttl_min) plus ours."""

    file: str
    holder: str
    expires_at: str
    expires: float  # epoch seconds
    claimed_at: str | None = None
    ttl_min: float | None = None
    token: int | None = None
    instance: str | None = None
    pid: int | None = None
    pid_start_time: float | None = None
    host: str | None = None
    pid_bound: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The lock's keys, for JSON output."""
        out: dict[str, Any] = {
            "file": self.file,
            "holder": self.holder,
            "claimed_at": self.claimed_at,
            "expires_at": self.expires_at,
            "ttl_min": self.ttl_min,
            "token": self.token,
            "instance": self.instance,
            "pid": self.pid,
            "pid_start_time": self.pid_start_time,
            "host": self.host,
            "pid_bound": self.pid_bound,
        }
        out.update(self.extra)
        return out


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


@dataclass(frozen=True)
class LockGrant:
    """A lock held: carry ``token`` on every claim write made under it."""

    file: str
    holder: str
    token: int
    expires: float  # epoch seconds
    ttl_s: float
    lock_file: str  # the lock file (see ``path``)
    instance: str
    refreshed: bool = False  # the same holder re-acquired: TTL refreshed, token kept
    took_over: LockStatus | None = None  # the expired/dead/stale lock that was replaced
    pid_bound: bool = True

    @property
    def path(self) -> Path:
        """The lock file (built on demand: a fan-out makes a grant per item and never looks)."""
        return Path(self.lock_file)

    @property
    def expires_at(self) -> datetime:
        """Expiry as an aware local datetime."""
        return datetime.fromtimestamp(self.expires).astimezone()


class LockBusyError(LockHeldError):
    """The lock is held by another holder (after waiting, if asked to wait)."""

    def __init__(self, message: str, status: LockStatus) -> None:
        super().__init__(message)
        self.status = status


# -- parsing

_LINE_RE: Final = re.compile(r"^([a-z_]+): (.*)$")


def _parse_fast(text: str) -> dict[str, Any] | None:
    """Our own format: one ``key: <JSON value>`` per line. None for anything else (then YAML)."""
    out: dict[str, Any] = {}
    for line in text.splitlines():
        m = _LINE_RE.match(line)
        if m is None or m.group(1) in out:
            return None
        try:
            out[m.group(1)] = json.loads(m.group(2))
        except ValueError:
            return None
    return out


def _parse_yaml(raw: bytes, source: str) -> dict[str, Any]:
    from ambient.storage.yamlfile import decode, parse_yaml

    data, _ = parse_yaml(decode(raw, source=source), source=source)
    if not isinstance(data, dict):
        raise InputError("is not a YAML mapping of lock keys (file, holder, expires_at, ...)", file=source, line=1)
    return data


def _time_text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _epoch(text: str) -> float | None:
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.astimezone()  # the source writes local time without an offset
    return dt.timestamp()


def _key_line(text: str, key: str) -> int:
    """The line on which ``key`` is set (1 when it cannot be told): where a bad value is reported."""
    m = re.search(rf"^[ \t{{]*[\"']?{re.escape(key)}[\"']?[ \t]*:", text, re.MULTILINE)
    return text.count("\n", 0, m.start()) + 1 if m else 1


def parse_lock(raw: bytes, source: str) -> LockInfo:
    """Parse and check a lock file's bytes; raises InputError saying what is wrong, at ``file:line`` (line 1 for the
    file as a whole: empty, not text, not a mapping, keys missing), as every other problem with a file is told."""
    if not raw.strip():
        raise InputError("is empty (a crash mid-write, or another tool); expected lock keys", file=source, line=1)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("is not UTF-8 text", file=source, line=1) from None
    data = _parse_fast(text)
    if data is None:
        data = _parse_yaml(raw, source)
    missing = [k for k in ("file", "holder", "expires_at") if k not in data]
    if missing:
        expected = "expected file, holder, claimed_at, expires_at, ttl_min"
        raise InputError(f"lacks {', '.join(missing)}; {expected}", file=source, line=1)
    file_, holder, expires_at = data["file"], data["holder"], data["expires_at"]
    if not isinstance(file_, str) or not isinstance(holder, str) or not holder:
        bad = "file" if not isinstance(file_, str) else "holder"
        raise InputError("file and holder must be text", file=source, line=_key_line(text, bad))
    if not isinstance(expires_at, str):
        raise InputError(
            f"expires_at must be an ISO date-time, got {expires_at!r}", file=source, line=_key_line(text, "expires_at")
        )
    expires = _epoch(expires_at)
    if expires is None:
        raise InputError(
            f"expires_at {expires_at!r} is not an ISO date-time (YYYY-MM-DDTHH:MM)",
            file=source,
            line=_key_line(text, "expires_at"),
        )

    def _num(key: str, kinds: tuple[type, ...]) -> Any:
        value = data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise InputError(f"{key} must be a number, got {value!r}", file=source, line=_key_line(text, key))
        return value

    token = _num("token", (int,))
    pid = _num("pid", (int,))
    start = _num("pid_start_time", (int, float))
    ttl_min = _num("ttl_min", (int, float))
    bound = data.get("pid_bound", False)
    known = {
        "file",
        "holder",
        "claimed_at",
        "expires_at",
        "ttl_min",
        "token",
        "instance",
        "pid",
        "pid_start_time",
        "host",
        "pid_bound",
    }
    return LockInfo(
        file=file_,
        holder=holder,
        expires_at=expires_at,
        expires=expires,
        claimed_at=_time_text(data.get("claimed_at")),
        ttl_min=float(ttl_min) if ttl_min is not None else None,
        token=token,
        instance=data["instance"] if isinstance(data.get("instance"), str) else None,
        pid=pid,
        pid_start_time=float(start) if start is not None else None,
        host=data["host"] if isinstance(data.get("host"), str) else None,
        pid_bound=bound is True,
        extra={k: v for k, v in data.items() if k not in known},
    )


@lru_cache(maxsize=1024)
def _q(text: str) -> str:
    # A JSON string is a valid YAML double-quoted scalar for printable text (holders and paths are checked).
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'  # what json.dumps gives for such text, without building an encoder (hot path)
    return json.dumps(text, ensure_ascii=False)


_SECONDS: dict[int, tuple[str, str]] = {}  # whole second → (date and time, UTC offset) in local time


def _local_iso(t: float) -> str:
    """ISO 8601 local time with milliseconds and the offset in force at t (a hand-made isoformat: hot path).

    Each lock renders two of these; the part that changes once a second is kept (``time.localtime`` and the
    formatting were ~6 µs a call, bench/fanout.py).
    """
    sec = int(t // 1)
    parts = _SECONDS.get(sec)
    if parts is None:
        lt = time.localtime(sec)
        off = lt.tm_gmtoff or 0
        sign = "-" if off < 0 else "+"
        off = abs(off)
        parts = (
            f"{lt.tm_year:04d}-{lt.tm_mon:02d}-{lt.tm_mday:02d}T{lt.tm_hour:02d}:{lt.tm_min:02d}:{lt.tm_sec:02d}",
            f"{sign}{off // 3600:02d}:{off % 3600 // 60:02d}",
        )
        if len(_SECONDS) >= 16:
            _SECONDS.clear()
        _SECONDS[sec] = parts
    ms = int((t % 1) * 1000)
    return f"{parts[0]}.{ms:03d}{parts[1]}"


def _ttl_min(ttl_s: float) -> int | float:
    minutes = ttl_s / 60.0
    return int(minutes) if minutes == int(minutes) else round(minutes, 4)


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


@dataclass
class _Inode:
    fd: int
    dev: int
    ino: int
    size: int
    spare: str | None  # our private name for it


class _Loc:
    """Where a lock lives: its brain-relative path and its lock file (a string for syscalls, a Path on demand)."""

    __slots__ = ("_path", "rel", "s")

    def __init__(self, rel: str, s: str, path: Path | None = None) -> None:
        self.rel = rel  # normalised brain-relative path
        self.s = s
        self._path = path

    @property
    def path(self) -> Path:
        if self._path is None:
            self._path = Path(self.s)
        return self._path


@dataclass
class _Pinned:
    inode: _Inode
    token: int
    holder: str


class LockManager:
    """Acquire / release / check / list / cleanup over ``locks/`` of one brain.

    Args:
        paths: the brain layout (``locks/``, and ``.ambient/locks.guard`` for the guard + token counter).
        grace_s: how long after ``expires_at`` a lock still counts as held (clock skew, late renewal).
        malformed_grace_s: how long after its mtime an unreadable lock counts as held.
        durable: fsync each published lock and its directory (slower; see the module docstring).
        check_filesystem: refuse NFS/CIFS/FUSE (RELIABILITY §1.2 rule 7).
        instance: this manager's identity in lock files (random by default).
        poll_min_s, poll_max_s: the waiting backoff (doubling, with jitter) between attempts.
    """

    def __init__(
        self,
        paths: BrainPaths,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        malformed_grace_s: float = DEFAULT_MALFORMED_GRACE_S,
        durable: bool = False,
        check_filesystem: bool = True,
        instance: str | None = None,
        poll_min_s: float = _POLL_MIN_S,
        poll_max_s: float = _POLL_MAX_S,
    ) -> None:
        self.paths = paths
        self.dir = paths.locks
        self.grace_s = grace_s
        self.malformed_grace_s = malformed_grace_s
        self.durable = durable
        self.instance = instance or secrets.token_hex(6)
        self.poll_min_s = poll_min_s
        self.poll_max_s = poll_max_s
        if not paths.root.is_dir():
            raise InputError(f"{paths.root} is not a directory; expected a brain (see --brain)")
        if self.dir.is_symlink():
            raise UnsafePathError("is a symlink; ambient never follows symlinks for locks/", file=str(self.dir))
        if check_filesystem:
            for where in (self.dir, paths.state):
                check_local_filesystem(where if where.exists() else paths.root)
        self._dir_s = str(self.dir)
        self._guard = shared_guard(paths.state / GUARD_NAME)
        self._locs: dict[str, _Loc] = {}
        self._pinned: dict[str, _Pinned] = {}
        self._spares: list[_Inode] = []
        self._spares_max = spares_max()
        self._pool_pid = os.getpid()
        self._tails: dict[tuple[int, bool], tuple[str, str]] = {}
        self._loop_hold = False  # the event loop holds the guard until its next iteration (see _enter_nowait)

    # -- public API

    def path_for(self, file: str) -> Path:
        """The lock file of ``file`` (``locks/<encoded>.lock``)."""
        return self._loc(file).path

    def check(self, file: str) -> LockStatus:
        """What holds ``file`` right now (no guard needed: locks are published whole)."""
        return self._inspect(self._loc(file), time.time())

    def list(self) -> list[LockStatus]:
        """Every lock in ``locks/`` (symlinks, FIFOs and unreadable files included, as malformed), by path."""
        out: list[LockStatus] = []
        try:
            names = sorted(os.listdir(self.dir))
        except FileNotFoundError:
            return out
        now = time.time()
        for name in names:
            if name.startswith(".") or not name.endswith(LOCK_SUFFIX):
                continue
            rel = decode_name(name) or unquote(name[: -len(LOCK_SUFFIX)])
            path = self.dir / name
            out.append(self._inspect(_Loc(rel, str(path), path), now))
        return out

    def try_acquire(
        self, file: str, holder: str, *, ttl_s: float = DEFAULT_TTL_S, pid_bound: bool = True
    ) -> LockGrant | LockStatus:
        """One attempt: a grant, or the status of the lock that keeps ``holder`` out."""
        loc = self._loc(file)
        check_holder(holder)
        if not ttl_s > 0:
            raise InputError(f"lock TTL must be positive, got {ttl_s}")
        return self._attempt(loc, holder, float(ttl_s), pid_bound)

    def acquire(
        self,
        file: str,
        holder: str,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        wait: float = 0.0,
        pid_bound: bool = True,
    ) -> LockGrant:
        """Take the lock of ``file`` for ``holder``, waiting up to ``wait`` seconds; raises LockBusyError.

        The same holder re-acquiring a live lock refreshes its TTL and keeps its token. An expired
        (or dead-holder, or stale malformed) lock is taken over with a new token and a warning.
        ``pid_bound=False`` for a lock that must outlive this process (a session's, as the CLI takes).
        """
        loc = self._loc(file)
        check_holder(holder)
        if not ttl_s > 0:
            raise InputError(f"lock TTL must be positive, got {ttl_s}")
        got = self._attempt(loc, holder, float(ttl_s), pid_bound, look_first=False)  # optimistic: usually free
        if isinstance(got, LockGrant):
            return got
        deadline = time.monotonic() + max(0.0, wait)
        delay = self.poll_min_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._busy(got, holder, wait)
            time.sleep(min(remaining, delay * random.uniform(0.5, 1.5)))
            delay = min(delay * 2, self.poll_max_s)
            got = self.try_acquire(file, holder, ttl_s=ttl_s, pid_bound=pid_bound)
            if isinstance(got, LockGrant):
                return got

    async def acquire_async(
        self,
        file: str,
        holder: str,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        wait: float = 0.0,
        pid_bound: bool = True,
    ) -> LockGrant:
        """:meth:`acquire` for the event loop: attempts run inline while the guard is free, else in a worker thread.

        Cancelled while a threaded attempt is in flight, it waits for that attempt and releases a lock
        it got, so a cancellation never leaks a lock.
        """
        import asyncio  # not at module level: `ambient lock` runs often and never needs it

        loc = self._loc(file)
        check_holder(holder)
        if not ttl_s > 0:
            raise InputError(f"lock TTL must be positive, got {ttl_s}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, wait)
        delay = self.poll_min_s
        while True:
            got = self._attempt_nowait(loc, holder, float(ttl_s), pid_bound)
            if got is None:  # the guard is busy: wait for it in a thread, not on the loop
                attempt = asyncio.ensure_future(
                    asyncio.to_thread(self.try_acquire, file, holder, ttl_s=ttl_s, pid_bound=pid_bound)
                )
                try:
                    got = await asyncio.shield(attempt)
                except asyncio.CancelledError:
                    late = await attempt
                    if isinstance(late, LockGrant) and not late.refreshed:
                        await asyncio.to_thread(self.release_grant, late)
                    raise
            if isinstance(got, LockGrant):
                return got
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise self._busy(got, holder, wait)
            await asyncio.sleep(min(remaining, delay * random.uniform(0.5, 1.5)))
            delay = min(delay * 2, self.poll_max_s)

    def renew(self, grant: LockGrant, *, ttl_s: float | None = None) -> LockGrant:
        """Push the expiry of a held lock (renew at TTL/3); same token. LockNotHeldError if the lease was lost."""
        ttl = float(ttl_s if ttl_s is not None else grant.ttl_s)
        loc = self._loc(grant.file)
        with self._guard.hold():
            now = time.time()
            if not self._is_ours(loc, grant.holder, grant.token, now):
                raise LockNotHeldError(
                    f"{loc.rel}: the lease of {grant.holder} (token {grant.token}) was lost (expired and taken over, "
                    "or released); stop writing"
                )
            self._replace(loc, grant.holder, grant.token, now, ttl, grant.pid_bound)
        return LockGrant(
            loc.rel,
            grant.holder,
            grant.token,
            now + ttl,
            ttl,
            loc.s,
            self.instance,
            refreshed=True,
            pid_bound=grant.pid_bound,
        )

    def release(self, file: str, holder: str, *, token: int | None = None) -> LockInfo | None:
        """Release ``file`` if ``holder`` (and ``token``, when given) is what is on disk; else LockNotHeldError.

        Never deletes a successor's lock: the check and the unlink happen under the guard, on the
        pinned inode or the exact bytes that were checked (RELIABILITY §1.2 rule 4). Returns what
        was released when it had to be read (None on the fast path of a lock this manager holds).
        """
        loc = self._loc(file)
        check_holder(holder)
        with self._guard.hold():
            return self._release_locked(loc, holder, token)

    async def release_async(self, grant: LockGrant) -> None:
        """:meth:`release_grant` from the event loop: inline when the guard is free, else in a worker thread.

        Same reasoning as :meth:`acquire_async`'s first attempt.
        """
        loc = self._loc(grant.file)
        if self._enter_nowait() is not None:
            try:
                self._release_locked(loc, grant.holder, grant.token)
            finally:
                self._guard.__exit__()
            return
        import asyncio

        await asyncio.to_thread(self.release_grant, grant)

    def _release_locked(self, loc: _Loc, holder: str, token: int | None) -> LockInfo | None:
        self._own_pool()
        pinned = self._pinned.get(loc.s)
        if pinned is not None and pinned.holder == holder and token in (None, pinned.token):
            try:
                st = os.lstat(loc.s)
            except FileNotFoundError:
                st = None
            if st is not None and st.st_ino == pinned.inode.ino and st.st_dev == pinned.inode.dev:
                os.unlink(loc.s)  # noqa: PTH108 - the hot path; str paths spare pathlib's cost
                del self._pinned[loc.s]
                # Two names before the unlink (the lock's and our spare's): the spare name is the only one left.
                self._recycle(pinned.inode, names_known=True, links=st.st_nlink - 1)
                return None
        status = self._inspect(loc, time.time())
        if status.state == "free":
            self._unpin(loc.s)
            raise LockNotHeldError(f"{loc.rel} is not locked (already released, or expired and taken over since)")
        info = status.info
        if info is None:
            raise LockNotHeldError(f"{loc.rel}: the lock file is unreadable ({status.problem}); release refused")
        if info.holder != holder:
            raise LockNotHeldError(f"{loc.rel} is held by {info.holder}, not by {holder}; release refused")
        if token is not None and info.token != token:
            raise LockNotHeldError(
                f"{loc.rel} is held by {holder} under token {info.token}, not {token}: it was taken over; "
                "release refused"
            )
        if not self._remove_if_unchanged(loc, status):
            raise LockNotHeldError(f"{loc.rel} changed while being released; release refused")
        self._unpin(loc.s)
        return info

    def release_grant(self, grant: LockGrant) -> None:
        """Release what :meth:`acquire` returned (token-checked)."""
        self.release(grant.file, grant.holder, token=grant.token)

    @contextlib.contextmanager
    def hold(self, file: str, holder: str, *, ttl_s: float = DEFAULT_TTL_S, wait: float = 0.0) -> Iterator[LockGrant]:
        """``with manager.hold(path, sess_id) as grant:`` acquire, then release at the end of the block.

        A lease lost meanwhile is logged at release, not raised: writes under it were fenced already.
        """
        grant = self.acquire(file, holder, ttl_s=ttl_s, wait=wait)
        try:
            yield grant
        finally:
            try:
                self.release_grant(grant)
            except LockNotHeldError as exc:
                _warn("lock_lease_lost", file=grant.file, holder=holder, token=grant.token, reason=str(exc))

    def cleanup(self) -> builtins.list[LockStatus]:
        """Remove expired, dead-holder and stale malformed locks, and dead writers' temp files; return what went."""
        removed: builtins.list[LockStatus] = []
        for status in self.list():
            if not status.takeable:
                continue
            loc = _Loc(status.file, str(status.path), status.path)
            with self._guard.hold():
                fresh = self._inspect(loc, time.time())
                if fresh.takeable and self._remove_if_unchanged(loc, fresh):
                    removed.append(fresh)
                    self._unpin(loc.s)
        self.sweep()
        return removed

    def sweep(self) -> builtins.list[Path]:
        """Delete temp and set-aside files left in ``locks/`` by dead processes (only those)."""
        return sweep_stale_tmp(self.dir)

    def close(self) -> None:
        """Close the pinned locks' descriptors; locks stay held on disk until released or expired.

        The guard's descriptor stays open: it is shared by the process's managers (:func:`shared_guard`).
        """
        self._own_pool()
        for pinned in self._pinned.values():
            self._discard(pinned.inode)
        for ino in self._spares:
            self._discard(ino)
        self._pinned, self._spares = {}, []

    # -- internals

    def _loc(self, file: str) -> _Loc:
        loc = self._locs.get(file)
        if loc is None:
            rel, name = encode_path(file)
            loc = _Loc(rel, f"{self._dir_s}/{name}")
            if len(self._locs) > 4096:
                self._locs.clear()
            self._locs[file] = loc
        return loc

    def _busy(self, status: LockStatus, holder: str, wait: float) -> LockBusyError:
        waited = f" after waiting {wait:g} s" if wait > 0 else ""
        if status.info is not None:
            info = status.info
            msg = (
                f"{status.file} is locked by {info.holder} until {info.expires_at}{waited}; "
                f"try again later or wait with --wait"
            )
        else:
            msg = f"{status.file} is locked: {status.problem}{waited} (it counts as stale after the grace period)"
        return LockBusyError(msg, status)

    def _attempt(
        self, loc: _Loc, holder: str, ttl_s: float, pid_bound: bool, *, look_first: bool = True
    ) -> LockGrant | LockStatus:
        # A look without the guard first: a live lock of someone else needs no guard (keeps waiting cheap).
        if look_first and os.path.lexists(loc.s):
            pre = self._inspect(loc, time.time())
            if pre.blocking and not (pre.info is not None and pre.info.holder == holder and pre.state == "held"):
                return pre
        with self._guard.hold() as gfd:
            return self._attempt_locked(gfd, loc, holder, ttl_s, pid_bound)

    def _attempt_nowait(self, loc: _Loc, holder: str, ttl_s: float, pid_bound: bool) -> LockGrant | LockStatus | None:
        """One attempt on the calling thread if the guard is free at once; None if it is not.

        Performance (bench/fanout.py): the event loop calls this directly. A lock cycle is a few syscalls on a
        local disk (tens of µs); handing it to a worker thread cost far more, because the worker must win the
        GIL from a busy loop (up to the 5 ms switch interval) while holding the guard every other lock
        operation waits for. A guard held elsewhere (another process, a worker thread) means "try in a thread".
        """
        gfd = self._enter_nowait()
        if gfd is None:
            return None
        try:
            return self._attempt_locked(gfd, loc, holder, ttl_s, pid_bound)
        finally:
            self._guard.__exit__()

    def _enter_nowait(self) -> int | None:
        """The guard for an operation on the event loop, without waiting; None if someone else holds it.

        The loop keeps one hold of its own until its next iteration (``call_soon``), so the lock
        operations of one iteration share one ``flock``/unlock pair and one read of the token counter
        (a fan-out does hundreds per second; each syscall was also a GIL hand-off). Another process
        waits at most one loop iteration for the guard.
        """
        gfd = self._guard.try_enter()
        if gfd is None or self._loop_hold:
            return gfd
        try:
            import asyncio

            loop = asyncio.get_running_loop()
        except RuntimeError:
            return gfd  # not on a loop: plain hold
        self._guard.try_enter()  # nested by this thread: cannot fail, costs no syscall
        self._loop_hold = True
        loop.call_soon(self._end_loop_hold)
        return gfd

    def _end_loop_hold(self) -> None:
        self._loop_hold = False
        self._guard.__exit__()

    def _attempt_locked(
        self, gfd: int, loc: _Loc, holder: str, ttl_s: float, pid_bound: bool
    ) -> LockGrant | LockStatus:
        status: LockStatus | None = None
        for _ in range(3):
            now = time.time()
            token = self._next_token(gfd)
            data = self._render(loc.rel, holder, token, now, ttl_s, pid_bound)
            if self._publish(loc, data, token, holder):
                self._store_token(gfd, token)
                took = status if status is not None and status.takeable else None
                if took is not None:
                    _warn(
                        "lock_taken_over",
                        file=loc.rel,
                        holder=holder,
                        previous=took.info.holder if took.info else None,
                        state=took.state,
                        problem=took.problem,
                    )
                return LockGrant(
                    loc.rel,
                    holder,
                    token,
                    now + ttl_s,
                    ttl_s,
                    loc.s,
                    self.instance,
                    took_over=took,
                    pid_bound=pid_bound,
                )
            status = self._inspect(loc, now)
            if status.state == "free":
                continue  # released between the link and the look: try again
            info = status.info
            if status.state == "held" and info is not None and info.holder == holder:
                # spec/002: the same holder re-acquiring refreshes the TTL; the token stays.
                kept = info.token if info.token is not None else token
                if info.token is None:
                    self._store_token(gfd, token)
                self._replace(loc, holder, kept, now, ttl_s, pid_bound)
                return LockGrant(
                    loc.rel,
                    holder,
                    kept,
                    now + ttl_s,
                    ttl_s,
                    loc.s,
                    self.instance,
                    refreshed=True,
                    pid_bound=pid_bound,
                )
            if not status.takeable:
                return status
            if not self._remove_if_unchanged(loc, status):
                return self._inspect(loc, time.time())
        assert status is not None
        return status

    def _render(self, rel: str, holder: str, token: int, now: float, ttl_s: float, pid_bound: bool) -> bytes:
        pid = os.getpid()
        parts = self._tails.get((pid, pid_bound))
        if parts is None:  # what does not change between grants of this process
            start = _own_start()
            parts = (
                f"instance: {_q(self.instance)}\npid: {pid}\npid_start_time: {'null' if start is None else start}\n",
                f"host: {_q(hostname())}\npid_bound: {'true' if pid_bound else 'false'}\n",
            )
            self._tails[(pid, pid_bound)] = parts
        claimed, expires = _local_iso(now), _local_iso(now + ttl_s)
        return (
            f'file: {_q(rel)}\nholder: {_q(holder)}\nclaimed_at: "{claimed}"\nexpires_at: "{expires}"\n'
            f"ttl_min: {_ttl_min(ttl_s)}\n{parts[0]}token: {token}\n{parts[1]}"
        ).encode()

    def _next_token(self, gfd: int) -> int:
        # Persisted counter, mixed with wall-clock microseconds: strictly increasing even if the
        # counter was lost in a power cut (the clock moved on) or the clock jumped back (the counter).
        # Read once per hold of the guard: while this process holds it, only this process writes it.
        guard = self._guard
        seen = guard.token_seen
        if seen is not None and seen[0] == guard.generation:
            stored = seen[1]
        else:
            raw = os.pread(gfd, 32, 0)
            try:
                stored = int(raw.split()[0]) if raw.strip() else 0
            except ValueError:
                stored = 0
            guard.token_seen = (guard.generation, stored)
        return max(stored + 1, time.time_ns() // 1000)

    def _store_token(self, gfd: int, token: int) -> None:
        # Written when the guard is let go (FileGuard.__exit__): the grants of one hold cost one pwrite, and
        # nobody reads the counter without the guard. A crash before that write loses nothing: the next
        # token is still above this one through its wall-clock part.
        del gfd
        self._guard.token_due = token
        self._guard.token_seen = (self._guard.generation, token)

    def _fill(self, ino: _Inode, data: bytes) -> None:
        _pwrite_all(ino.fd, data)
        if ino.size > len(data):
            os.ftruncate(ino.fd, len(data))
        ino.size = len(data)
        if self.durable:
            os.fsync(ino.fd)

    def _publish(self, loc: _Loc, data: bytes, token: int, holder: str) -> bool:
        """Link a fully written spare inode to the lock's name; False if the name exists. Pins the inode.

        Spare inodes are recycled: a released lock's inode goes back to this manager's pool under
        its private ``.spare.tmp.<pid>.<hex>`` name and is rewritten (while no lock name points at
        it) for the next grant. Measured here on ext4, allocating and freeing an inode is what a
        create + unlink loop pays for; link + unlink of a name on a live inode costs a tenth.
        """
        for _ in range(3):
            ino = self._take_spare()
            assert ino.spare is not None
            try:
                self._fill(ino, data)
                os.link(ino.spare, loc.s, follow_symlinks=False)
            except FileExistsError:
                self._recycle(ino, names_known=True)
                return False
            except FileNotFoundError:
                self._discard(ino)  # its private name was swept: make another
                continue
            except BaseException:
                self._discard(ino)
                raise
            if self.durable:
                fsync_dir(self.dir)
            self._pin(loc.s, ino, token, holder)
            return True
        raise LockError(f"cannot publish a lock in {self.dir}: spare files keep disappearing (a sweep loop?)")

    def _replace(self, loc: _Loc, holder: str, token: int, now: float, ttl_s: float, bound: bool) -> None:
        """Rewrite a lock we hold (refresh/renew): a second name for a fresh inode renamed over it."""
        data = self._render(loc.rel, holder, token, now, ttl_s, bound)
        ino = self._take_spare()
        assert ino.spare is not None
        second = tmp_name(loc.path)
        try:
            self._fill(ino, data)
            os.link(ino.spare, second, follow_symlinks=False)
            os.replace(second, loc.s)
        except BaseException:
            second.unlink(missing_ok=True)
            self._discard(ino)
            raise
        if self.durable:
            fsync_dir(self.dir)
        self._pin(loc.s, ino, token, holder)

    def _own_pool(self) -> None:
        # After a fork the pool and pins belong to the parent: never write into the parent's inodes.
        if self._pool_pid != os.getpid():
            self._spares = []
            self._pinned = {}
            self._pool_pid = os.getpid()

    def _take_spare(self) -> _Inode:
        # Pooled spares were checked to have our private name as their only name when they came
        # back; nobody else knows that name, so it is still so (a sweep deleting it makes link fail).
        self._own_pool()
        if self._spares:
            return self._spares.pop()
        name = f"{self._dir_s}/.spare{TMP_MARK}{os.getpid()}.{secrets.token_hex(4)}"
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, 0o644)
        except FileNotFoundError:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(name, flags, 0o644)
        st = os.fstat(fd)
        return _Inode(fd, st.st_dev, st.st_ino, 0, name)

    @staticmethod
    def _only_spare_name(ino: _Inode, names_known: bool, links: int | None = None) -> bool:
        """Is the inode reachable only through our private name (so nobody reads it as a lock)?

        ``names_known``: we just removed (or never added) its only other name under the guard, so
        one link left can only be the spare name; otherwise the spare name is checked too. ``links``:
        its link count, when the caller has just read it (it spares an ``fstat`` on the release path).
        """
        if ino.spare is None:
            return False
        if (links if links is not None else os.fstat(ino.fd).st_nlink) != 1:
            return False
        if names_known:
            return True
        try:
            st = os.lstat(ino.spare)
        except FileNotFoundError:
            return False
        return (st.st_dev, st.st_ino) == (ino.dev, ino.ino)

    def _recycle(self, ino: _Inode, *, names_known: bool = False, links: int | None = None) -> None:
        if len(self._spares) < self._spares_max and self._only_spare_name(ino, names_known, links):
            self._spares.append(ino)
        else:
            self._discard(ino)

    @staticmethod
    def _discard(ino: _Inode) -> None:
        if ino.spare is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(ino.spare)  # noqa: PTH108 - only our private name; a lock name stays
        os.close(ino.fd)

    def _pin(self, key: str, ino: _Inode, token: int, holder: str) -> None:
        # Keeping the descriptor open pins the inode: while it is open its number cannot be reused,
        # so "the name still points at our inode" proves the lock is ours (GHSA-fq56: inode reuse).
        self._unpin(key)
        self._pinned[key] = _Pinned(ino, token, holder)

    def _unpin(self, key: str) -> None:
        self._own_pool()
        old = self._pinned.pop(key, None)
        if old is not None:
            self._recycle(old.inode)

    def _is_ours(self, loc: _Loc, holder: str, token: int, now: float) -> bool:
        self._own_pool()
        pinned = self._pinned.get(loc.s)
        if pinned is not None and pinned.token == token:
            try:
                st = os.lstat(loc.s)
            except FileNotFoundError:
                return False
            if (st.st_dev, st.st_ino) == (pinned.inode.dev, pinned.inode.ino):
                return True
        info = self._inspect(loc, now).info
        return info is not None and info.holder == holder and info.token == token

    def _inspect(self, loc: _Loc, now: float, *, again: bool = True) -> LockStatus:
        """Judge the lock file of ``loc`` without following links or trusting its content."""
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
            return self._malformed(loc, problem, st.st_mtime, now, None, ident)
        try:
            fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return LockStatus(rel, path, "free", judged_at=now)
        except OSError as exc:
            return self._malformed(loc, f"{source} cannot be opened: {exc.strerror}", st.st_mtime, now, None, ident)
        try:
            fst = os.fstat(fd)
            ident = (fst.st_dev, fst.st_ino, stat.S_IFMT(fst.st_mode))
            if not stat.S_ISREG(fst.st_mode):
                return self._malformed(loc, f"{source} is {_file_kind(fst.st_mode)}", fst.st_mtime, now, None, ident)
            if fst.st_size > MAX_LOCK_BYTES:
                return self._malformed(
                    loc,
                    f"{source} is {fst.st_size} bytes; a lock file is at most {MAX_LOCK_BYTES}",
                    fst.st_mtime,
                    now,
                    None,
                    ident,
                )
            raw = os.read(fd, MAX_LOCK_BYTES + 1)
        finally:
            os.close(fd)
        if len(raw) > MAX_LOCK_BYTES:
            return self._malformed(loc, f"{source} grew over {MAX_LOCK_BYTES} bytes", fst.st_mtime, now, raw, ident)
        try:
            info = parse_lock(raw, source)
        except InputError as exc:
            return self._malformed(loc, str(exc), fst.st_mtime, now, raw, ident, exc.line)
        if info.instance is not None and info.file != rel:
            # Spare inodes are recycled: a reader that opened this name just before its release can
            # read the next grant's content. Look again; the name is then gone (or shows its own lock).
            if again:
                return self._inspect(loc, now, again=False)
            return self._malformed(loc, f"{source} names another file ({info.file!r})", fst.st_mtime, now, raw, ident)
        if now > info.expires + self.grace_s:
            state: LockState = "expired"
        elif self._holder_dead(info):
            state = "dead"
        else:
            state = "held"
        return LockStatus(rel, path, state, info=info, judged_at=now, raw=raw, ident=ident)

    def _malformed(
        self,
        loc: _Loc,
        problem: str,
        mtime: float,
        now: float,
        raw: bytes | None,
        ident: tuple[int, int, int] | None,
        line: int | None = None,
    ) -> LockStatus:
        state: LockState = "stale" if now - mtime > self.malformed_grace_s else "malformed"
        return LockStatus(loc.rel, loc.path, state, problem=problem, judged_at=now, raw=raw, ident=ident, line=line)

    @staticmethod
    def _holder_dead(info: LockInfo) -> bool:
        if not info.pid_bound or info.pid is None or info.host != hostname():
            return False  # another host, or a session-bound lock: only the TTL frees it
        if info.pid == os.getpid() and info.pid_start_time == _own_start():
            return False
        return not process_alive(info.pid, info.pid_start_time)

    def _remove_if_unchanged(self, loc: _Loc, judged: LockStatus) -> bool:
        """Rename the lock aside, re-check it is what was judged, then delete it (else put it back).

        Guards against writers that do not take our guard (other tools, people): what is deleted is
        exactly the file that was judged, never one that replaced it meanwhile.
        """
        path = loc.path
        aside = path.with_name(f".{path.name}.stale.{os.getpid()}.{secrets.token_hex(4)}")
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
            _warn("lock_changed_during_takeover", lock=str(path), kept=str(aside))
        return False


def _pwrite_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    offset = 0
    while offset < len(data):
        offset += os.pwrite(fd, view[offset:], offset)
