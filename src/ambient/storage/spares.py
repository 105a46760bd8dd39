"""A pool of spare files: private files made ahead and reused, so a hot path that publishes a small file and later
removes it does not create and free an inode each time.

Why (bench/fanout.py (a), bench/locks.py; bench/README.md, findings 18, 23, 24 and "Spare files"): on ext4 the cost
of a create + unlink loop is the inode's allocation, and on ext4 without a journal (this machine's) every inode freed
makes the next creates slower for a minute or more (the allocator skips recently deleted inodes one by one). A
released lock's inode goes back here, still open under its private name, and is rewritten for the next lock.

A spare is a file of ours in the folder it serves, named ``.spare.tmp.<pid>.<start>.<hex>`` (the temp-file mark: a
sweep of a dead writer's leftovers takes it too), held open: its descriptor stays valid while no name points at it.
A caller gives a spare other names (:meth:`Spare.link_as`, :meth:`Spare.link_over`), and gives it back when it has
removed them; the pool keeps it only if its private name is its last one, so nobody can read it as theirs.

Each spare holds a descriptor: the pool is bounded by the descriptor limit (:func:`spares_max`), and
:meth:`SparePool.shed` gives every descriptor back on a shortage (the pool is a speed-up, a journal is not). After
a fork the pool belongs to the parent: the child starts empty and never writes into the parent's files.

Not thread-safe: its caller serialises (the lock manager's guard).
"""

from __future__ import annotations

import contextlib
import os
import resource
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ambient.storage.fsutil import TMP_MARK, fsync_dir, tmp_name, writer_mark

#: Spares kept per pool at most. At 4 a fan-out of 16 agents freed and re-created 69 % of its lock inodes (releases
#: come in bursts); at 64 a fan-out of 256 did the same at each burst (14 % of the loop's samples in that create).
_SPARES_MAX: Final = 512
#: What the daemon keeps open of its own (journals, sockets, the loop, the watcher): not for spares.
_DAEMON_OWN_FDS: Final = 64
#: The private names' prefix in their folder.
SPARE_PREFIX: Final = ".spare"


def spares_max() -> int:
    """How many spares a pool keeps: :data:`_SPARES_MAX`, or a quarter of what the soft descriptor limit leaves over
    the daemon's own (none under a very low limit: under ``ulimit -n 32`` eight spares held for ever took every
    descriptor the daemon had left, and no journal could be opened again)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return _SPARES_MAX
    return max(0, min(_SPARES_MAX, (soft - _DAEMON_OWN_FDS) // 4))


@dataclass
class Spare:
    """One file of a pool: its open descriptor, identity, size and private name (None once given up)."""

    fd: int
    dev: int
    ino: int
    size: int
    name: str | None

    def fill(self, data: bytes, *, durable: bool) -> None:
        """Make ``data`` the file's whole content (overwritten in place, then cut: no block freed and allocated
        again); fsync'd when ``durable``. Only while no other name points at it."""
        view, offset = memoryview(data), 0
        while offset < len(data):
            offset += os.pwrite(self.fd, view[offset:], offset)
        if self.size > len(data):
            os.ftruncate(self.fd, len(data))
        self.size = len(data)
        if durable:
            os.fsync(self.fd)

    def link_as(self, name: str) -> None:
        """Give the file the name ``name``, whole at once; FileExistsError if the name exists, FileNotFoundError if
        the private name was swept meanwhile."""
        assert self.name is not None
        os.link(self.name, name, follow_symlinks=False)

    def link_over(self, name: str, path: Path) -> None:
        """Put the file in the place of ``name`` (``path`` as a Path): a second name for it, renamed over."""
        assert self.name is not None
        second = tmp_name(path)
        try:
            os.link(self.name, second, follow_symlinks=False)
            os.replace(second, name)
        except BaseException:
            second.unlink(missing_ok=True)
            raise


class SparePool:
    """Spare files in one folder (see the module docs).

    Args:
        directory: the folder whose files the spares become (a link stays in one filesystem).
        durable: fsync the folder after each name given (:meth:`named`).
        limit: spares kept at most (default :func:`spares_max`; 0 makes and frees a file each time).
    """

    def __init__(self, directory: Path, *, durable: bool, limit: int | None = None) -> None:
        self.dir = directory
        self._dir_s = str(directory)
        self.durable = durable
        self._spares: list[Spare] = []
        self._limit = spares_max() if limit is None else limit
        self._pid = os.getpid()

    def take(self) -> Spare:
        """A spare whose only name is its private one: a kept one, or a new file."""
        # Kept spares were checked to have our private name as their only name when they came back; nobody else
        # knows that name, so it is still so (a sweep deleting it makes the next link fail).
        self._own()
        if self._spares:
            return self._spares.pop()
        name = f"{self._dir_s}/{SPARE_PREFIX}{TMP_MARK}{writer_mark()}.{secrets.token_hex(4)}"
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, 0o644)
        except FileNotFoundError:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(name, flags, 0o644)
        st = os.fstat(fd)
        return Spare(fd, st.st_dev, st.st_ino, 0, name)

    def named(self) -> None:
        """A spare was just given a name: the folder is fsync'd when the pool is durable."""
        if self.durable:
            fsync_dir(self.dir)

    def give_back(self, spare: Spare, *, names_known: bool = False, links: int | None = None) -> None:
        """Keep ``spare`` for a later :meth:`take` if there is room and its private name is its only name; else
        close it and remove its private name.

        ``names_known``: the caller just removed (or never added) its only other name under its own lock, so one
        link left can only be the private name; otherwise that name is checked too. ``links``: its link count,
        when the caller has just read it (it spares an ``fstat``).
        """
        self._own()
        if len(self._spares) < self._limit and _only_private_name(spare, names_known, links):
            self._spares.append(spare)
        else:
            self.discard(spare)

    @staticmethod
    def discard(spare: Spare) -> None:
        """Close ``spare`` and remove its private name (a name the caller gave it stays)."""
        if spare.name is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(spare.name)  # noqa: PTH108 - only our private name
        os.close(spare.fd)

    def shed(self) -> int:
        """Close every kept spare (a descriptor shortage). Returns how many went; the pool fills again as spares
        are given back."""
        self._own()
        shed = len(self._spares)
        for spare in self._spares:
            self.discard(spare)
        self._spares = []
        return shed

    def close(self) -> None:
        """Close every kept spare and remove its private name."""
        self.shed()

    def _own(self) -> None:
        # After a fork the spares belong to the parent: forgotten here, never written.
        if self._pid != os.getpid():
            self._spares = []
            self._pid = os.getpid()


def _only_private_name(spare: Spare, names_known: bool, links: int | None) -> bool:
    """Is ``spare`` reachable only through its private name (so nobody reads it as theirs)?"""
    if spare.name is None:
        return False
    if (links if links is not None else os.fstat(spare.fd).st_nlink) != 1:
        return False
    if names_known:
        return True
    try:
        st = os.lstat(spare.name)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (spare.dev, spare.ino)
