"""The file-lock mutex of DESIGN 4 (spec/002 BSI-v3-7): ``locks/<percent-encoded path>.lock``, readable YAML.

How it stays correct (RELIABILITY §1.2, from py-filelock's bug history):

* A lock is published whole, a file written aside and linked to its name (:mod:`ambient.claims.lockinodes`,
  from :mod:`ambient.storage.spares`): no reader ever sees half a lock (rule 1).
* Every decision that reads then changes ``locks/`` (take, refresh, take over, release,
  cleanup) runs under one ``flock`` on ``.ambient/locks.guard``, a file never unlinked (rule 8,
  :class:`ambient.storage.guard.FileGuard`), and re-checks the lock once the guard is held: several
  contenders for one expired lock are serialised and exactly one wins. Readers (``check``/``list``)
  need no guard.
* The holder is ``holder`` (the source's session id) plus ``instance`` (random per manager),
  ``pid``, ``pid_start_time`` and ``host`` (:mod:`ambient.core.process`); a ``pid_bound`` lock whose
  process is provably dead on this host is free at once (rule 2). Locks taken through the CLI are
  not pid-bound: the CLI exits right away.
* Each grant carries a fencing ``token`` from a counter persisted in the guard file, strictly
  increasing across all paths (so tokens of different locks compare); claim writes carry it and
  :class:`ambient.claims.store.ClaimStore` refuses older ones (rule 3).
* Takeover renames the old file aside, re-reads it and deletes it only if it is still what was
  judged stale; release deletes only a lock whose token (or pinned inode) is the releaser's (rule 4).
* Lock files are hostile input, judged by :mod:`ambient.claims.lockstate` (rules 2, 5, 6); their
  format and names are :mod:`ambient.claims.lockfile`'s (rule 9).
* NFS/CIFS/FUSE are refused (rule 7).

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

The modules this one imports load neither pydantic nor PyYAML at import time (the ``ambient lock`` command
runs around every write of a script); hostile or foreign lock files fall back to the safe YAML reader, loaded
on demand.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import random
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Final
from urllib.parse import unquote

from ambient.claims.lockfile import (
    LOCK_SUFFIX,
    LockInfo,
    below_prefix,
    check_holder,
    decode_name,
    encode_path,
    folders_above,
    holder_lines,
    render_lock,
)
from ambient.claims.lockinodes import LockInodes
from ambient.claims.lockstate import LockLocation, LockStatus, inspect_lock, remove_if_unchanged
from ambient.core.errors import InputError, LockBusyError, LockNotHeldError, UnsafePathError
from ambient.core.lazylog import get_logger
from ambient.core.process import hostname, own_start_time
from ambient.storage.fsutil import check_local_filesystem, sweep_stale_tmp
from ambient.storage.guard import shared_guard
from ambient.storage.paths import BrainPaths

log = get_logger(__name__)

GUARD_NAME: Final = "locks.guard"
DEFAULT_TTL_S: Final = 3600.0  # spec/002: ttl_min defaults to 60
DEFAULT_GRACE_S: Final = 5.0
DEFAULT_MALFORMED_GRACE_S: Final = 30.0
_POLL_MIN_S: Final = 0.0005
_POLL_MAX_S: Final = 0.02


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
        now: the wall clock in seconds since the epoch, for leases, expiries and the fencing token's clock part
            (``time.time``; a test gives ``ManualClock.time``). A wait's deadline is real time (monotonic).
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
        now: Callable[[], float] = time.time,
    ) -> None:
        self.paths = paths
        self._now = now
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
        self._locs: dict[str, LockLocation] = {}
        self._inodes = LockInodes(self.dir, durable=durable)
        self._tails: dict[tuple[int, bool], tuple[str, str]] = {}
        self._loop_hold = False  # the event loop holds the guard until its next iteration (see _enter_nowait)

    # -- public API

    def path_for(self, file: str) -> Path:
        """The lock file of ``file`` (``locks/<encoded>.lock``)."""
        return self._loc(file).path

    def check(self, file: str) -> LockStatus:
        """What holds ``file`` right now (no guard needed: locks are published whole): its own lock, else a folder
        lock above it or, for a folder, a lock under it (:meth:`_covering`)."""
        loc, now = self._loc(file), self._now()
        own = self._inspect(loc, now)
        return own if own.state != "free" else (self._covering(loc, None, now) or own)

    def list(self) -> list[LockStatus]:
        """Every lock in ``locks/`` (symlinks, FIFOs and unreadable files included, as malformed), by path."""
        out: list[LockStatus] = []
        try:
            names = sorted(os.listdir(self.dir))
        except FileNotFoundError:
            return out
        now = self._now()
        for name in names:
            if name.startswith(".") or not name.endswith(LOCK_SUFFIX):
                continue
            rel = decode_name(name) or unquote(name[: -len(LOCK_SUFFIX)])
            path = self.dir / name
            out.append(self._inspect(LockLocation(rel, str(path), path), now))
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
        import asyncio  # the event loop's methods only: `ambient status` lists locks without it

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
            now = self._now()
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
        import asyncio

        loc = self._loc(grant.file)
        if self._enter_nowait() is not None:
            try:
                self._release_locked(loc, grant.holder, grant.token)
            finally:
                self._guard.__exit__()
            return
        await asyncio.to_thread(self.release_grant, grant)

    def _release_locked(self, loc: LockLocation, holder: str, token: int | None) -> LockInfo | None:
        if self._inodes.release(loc.s, holder, token):
            return None  # our pinned inode, still under its name: nothing to read
        status = self._inspect(loc, self._now())
        if status.state == "free":
            self._inodes.unpin(loc.s)
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
        if not remove_if_unchanged(loc, status):
            raise LockNotHeldError(f"{loc.rel} changed while being released; release refused")
        self._inodes.unpin(loc.s)
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
                log.warning("lock_lease_lost", file=grant.file, holder=holder, token=grant.token, reason=str(exc))

    def cleanup(self) -> builtins.list[LockStatus]:
        """Remove expired, dead-holder and stale malformed locks, and dead writers' temp files; return what went."""
        removed: builtins.list[LockStatus] = []
        for status in self.list():
            if not status.takeable:
                continue
            loc = LockLocation(status.file, str(status.path), status.path)
            with self._guard.hold():
                fresh = self._inspect(loc, self._now())
                if fresh.takeable and remove_if_unchanged(loc, fresh):
                    removed.append(fresh)
                    self._inodes.unpin(loc.s)
        self.sweep()
        return removed

    def sweep(self) -> builtins.list[Path]:
        """Delete temp and set-aside files left in ``locks/`` by dead processes (only those)."""
        return sweep_stale_tmp(self.dir)

    def shed(self) -> int:
        """Give back the descriptors of the spare inode pool (see :meth:`LockInodes.shed_spares`) if the guard is
        free now; 0 when it is not (the next shortage sheds). Safe from the event loop: it never waits."""
        gfd = self._guard.try_enter()
        if gfd is None:
            return 0
        try:
            return self._inodes.shed_spares()
        finally:
            self._guard.__exit__()

    def close(self) -> None:
        """Close the pinned locks' descriptors; locks stay held on disk until released or expired.

        The guard's descriptor stays open: it is shared by the process's managers (:func:`shared_guard`).
        """
        self._inodes.close()

    # -- internals

    def _loc(self, file: str) -> LockLocation:
        loc = self._locs.get(file)
        if loc is None:
            rel, name = encode_path(file)
            loc = LockLocation(rel, f"{self._dir_s}/{name}")
            if len(self._locs) > 4096:
                self._locs.clear()
            self._locs[file] = loc
        return loc

    def _busy(self, status: LockStatus, holder: str, wait: float) -> LockBusyError[LockStatus]:
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
        self, loc: LockLocation, holder: str, ttl_s: float, pid_bound: bool, *, look_first: bool = True
    ) -> LockGrant | LockStatus:
        # A look without the guard first: a live lock of someone else needs no guard (keeps waiting cheap).
        if look_first and os.path.lexists(loc.s):
            pre = self._inspect(loc, self._now())
            if pre.blocking and not (pre.info is not None and pre.info.holder == holder and pre.state == "held"):
                return pre
        with self._guard.hold() as gfd:
            return self._attempt_locked(gfd, loc, holder, ttl_s, pid_bound)

    def _attempt_nowait(
        self, loc: LockLocation, holder: str, ttl_s: float, pid_bound: bool
    ) -> LockGrant | LockStatus | None:
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
        import asyncio

        gfd = self._guard.try_enter()
        if gfd is None or self._loop_hold:
            return gfd
        try:
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

    def _covering(self, loc: LockLocation, holder: str | None, now: float) -> LockStatus | None:
        """A lock of another holder than ``holder`` (None: of anyone) that covers ``loc`` or that ``loc`` covers:
        on a folder above it, or, when ``loc`` is a folder, on anything under it. A folder lock guards what is in
        the folder: ``workspace/dir/`` held, ``workspace/dir/a.md`` and ``workspace/`` are not granted to
        another. Under the guard (acquire), two contenders of nested paths are serialised: never both win."""

        def keeps_out(status: LockStatus) -> bool:
            mine = holder is not None and status.info is not None and status.info.holder == holder
            return status.blocking and not mine

        for folder in folders_above(loc.rel):
            above = self._loc(folder)
            if os.path.lexists(above.s) and keeps_out(status := self._inspect(above, now)):
                return status
        own = loc.s.rsplit("/", 1)[-1]  # a string: the hot path of a fan-out's locks
        prefix = below_prefix(own)
        if prefix is None:
            return None
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return None
        for name in names:
            if name != own and name.startswith(prefix) and name.endswith(LOCK_SUFFIX):
                rel = decode_name(name) or unquote(name[: -len(LOCK_SUFFIX)])
                if keeps_out(status := self._inspect(LockLocation(rel, str(self.dir / name)), now)):
                    return status
        return None

    def _attempt_locked(
        self, gfd: int, loc: LockLocation, holder: str, ttl_s: float, pid_bound: bool
    ) -> LockGrant | LockStatus:
        covering = self._covering(loc, holder, self._now())
        if covering is not None:
            return covering
        status: LockStatus | None = None
        for _ in range(3):
            now = self._now()
            token = self._next_token(gfd)
            data = self._render(loc.rel, holder, token, now, ttl_s, pid_bound)
            if self._publish(loc, data, token, holder):
                self._store_token(gfd, token)
                took = status if status is not None and status.takeable else None
                if took is not None:
                    log.warning(
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
            if not remove_if_unchanged(loc, status):
                return self._inspect(loc, self._now())
        assert status is not None
        return status

    def _render(self, rel: str, holder: str, token: int, now: float, ttl_s: float, pid_bound: bool) -> bytes:
        pid = os.getpid()
        lines = self._tails.get((pid, pid_bound))
        if lines is None:  # what does not change between grants of this process
            lines = holder_lines(self.instance, pid, own_start_time(), hostname(), pid_bound)
            self._tails[(pid, pid_bound)] = lines
        return render_lock(rel, holder, token, now, ttl_s, lines)

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
        return max(stored + 1, int(self._now() * 1_000_000))

    def _store_token(self, gfd: int, token: int) -> None:
        # Written when the guard is let go (FileGuard.__exit__): the grants of one hold cost one pwrite, and
        # nobody reads the counter without the guard. A crash before that write loses nothing: the next
        # token is still above this one through its wall-clock part.
        del gfd
        self._guard.token_due = token
        self._guard.token_seen = (self._guard.generation, token)

    def _publish(self, loc: LockLocation, data: bytes, token: int, holder: str) -> bool:
        """Link the lock's content to its name (:meth:`LockInodes.publish`); False if the name exists."""
        return self._inodes.publish(loc.s, data, token, holder)

    def _replace(self, loc: LockLocation, holder: str, token: int, now: float, ttl_s: float, bound: bool) -> None:
        """Rewrite a lock we hold (refresh/renew): a second name for a fresh inode renamed over it."""
        data = self._render(loc.rel, holder, token, now, ttl_s, bound)
        self._inodes.replace(loc.s, loc.path, data, token, holder)

    def _is_ours(self, loc: LockLocation, holder: str, token: int, now: float) -> bool:
        pinned = self._inodes.points_at_pin(loc.s, token)
        if pinned is not None:
            return pinned
        info = self._inspect(loc, now).info
        return info is not None and info.holder == holder and info.token == token

    def _inspect(self, loc: LockLocation, now: float) -> LockStatus:
        """Judge the lock file of ``loc`` without following links or trusting its content."""
        return inspect_lock(loc, now, grace_s=self.grace_s, malformed_grace_s=self.malformed_grace_s)
