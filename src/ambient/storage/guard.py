"""A short mutex between processes and threads: ``flock`` on a file of ``.ambient/`` that is never unlinked.

Every read-modify-write of a shared file runs under one (the claims under ``claims.guard``, the circuit breakers
under ``breaker.guard``, the lock files under ``locks.guard``). The kernel drops the flock when its process dies,
so a guard never goes stale (RELIABILITY §1.2 rule 8); unlinking a flocked file would break the exclusion, so
guard files stay.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from ambient.storage.fsutil import open_private, private_dir


class FileGuard:
    """``flock`` on a file that is never unlinked: a short mutex between processes and threads.

    flock is per open file description, so each guard opens its own descriptor (reopened after a
    fork) and a re-entrant thread lock serialises the threads of one process. The kernel drops the
    lock when the process dies, so it never goes stale (RELIABILITY §1.2 rule 8). Use as
    ``with guard.hold() as fd:``; ``fd`` is the guard file's descriptor. Nested holds by the thread
    that holds it cost no syscall; ``generation`` counts the times this process took the flock, so a
    value read under the guard stays valid while the generation is the same.

    The guard file may carry a counter at its start (the lock manager's fencing tokens):
    ``token_due`` is written there once, when the outermost hold ends, however many values were
    drawn during it.
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
