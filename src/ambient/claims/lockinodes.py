"""The inodes behind one lock manager's lock files: the pinned ones of the locks it holds, and a pool of spares.

A lock is published whole (RELIABILITY §1.2 rule 1): its content is written to a private file
(``.spare.tmp.<pid>.<start>.<hex>`` in ``locks/``) which is then hard-linked to the lock's name; the link fails if the
name exists, and no reader ever sees half a lock. Released inodes go back to a small pool and are rewritten
(while no lock name points at them) for the next grant: on ext4 the cost of a create + unlink loop is the inode
allocation, which this skips. A held lock's inode stays open (pinned): while it is open its number cannot be
reused, so "the name still points at our inode" proves the lock is ours (rule 4, GHSA-fq56: inode reuse).

Every call here runs under the lock manager's guard. After a fork the pool and pins belong to the parent: the
child starts empty and never writes into the parent's inodes.
"""

from __future__ import annotations

import contextlib
import os
import resource
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ambient.core.errors import LockError
from ambient.storage.fsutil import TMP_MARK, fsync_dir, tmp_name, writer_mark

# Spare inodes kept per manager (each an open fd and a hidden file in locks/). At 4, a fan-out of 16 agents freed
# and re-created 69 % of its lock inodes (releases come in bursts): each a close that frees an inode and a create.
# At 64, a fan-out of 256 did the same at each burst, and on ext4 without a journal every inode freed makes the
# next creates slower for a minute (the allocator skips recently deleted inodes, one by one): 14 % of the event
# loop's samples sat in that create (py-spy, bench/fanout.py (a)). Now up to 512, or a quarter of what the soft
# descriptor limit leaves over the daemon's own (240 under the usual 1,024): each held lock pins a descriptor too,
# and agents need pipes. Under ``ulimit -n 32`` the daemon's own files, sockets and loop use about 24: 8 spares
# held for ever took the rest, and nothing (a journal, an escalation) could be opened again.
_SPARES_MAX: Final = 512
_DAEMON_OWN_FDS: Final = 64


def spares_max() -> int:
    """How many spare inodes a manager keeps: :data:`_SPARES_MAX`, or a quarter of what the descriptor limit leaves
    over the daemon's own (none at all under a very low limit)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return _SPARES_MAX
    return max(0, min(_SPARES_MAX, (soft - _DAEMON_OWN_FDS) // 4))


@dataclass
class _Inode:
    fd: int
    dev: int
    ino: int
    size: int
    spare: str | None  # our private name for it


@dataclass
class _Pinned:
    inode: _Inode
    token: int
    holder: str


class LockInodes:
    """The pinned inodes of the locks one manager holds (by lock file), and its pool of spare inodes.

    Args:
        directory: ``locks/``.
        durable: fsync each inode written and the directory after each link.
    """

    def __init__(self, directory: Path, *, durable: bool) -> None:
        self.dir = directory
        self._dir_s = str(directory)
        self.durable = durable
        self._pinned: dict[str, _Pinned] = {}
        self._spares: list[_Inode] = []
        self._spares_max = spares_max()
        self._pid = os.getpid()

    def publish(self, name: str, data: bytes, token: int, holder: str) -> bool:
        """Link a fully written spare inode to the lock file ``name``; False if the name exists. Pins the inode.

        Spare inodes are recycled: a released lock's inode goes back to the pool under
        its private ``.spare.tmp.<pid>.<hex>`` name and is rewritten (while no lock name points at
        it) for the next grant. Measured here on ext4, allocating and freeing an inode is what a
        create + unlink loop pays for; link + unlink of a name on a live inode costs a tenth.
        """
        for _ in range(3):
            ino = self._take()
            assert ino.spare is not None
            try:
                self._fill(ino, data)
                os.link(ino.spare, name, follow_symlinks=False)
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
            self._pin(name, ino, token, holder)
            return True
        raise LockError(f"cannot publish a lock in {self.dir}: spare files keep disappearing (a sweep loop?)")

    def replace(self, name: str, path: Path, data: bytes, token: int, holder: str) -> None:
        """Rewrite a lock we hold (refresh/renew): a second name for a fresh inode renamed over it."""
        ino = self._take()
        assert ino.spare is not None
        second = tmp_name(path)
        try:
            self._fill(ino, data)
            os.link(ino.spare, second, follow_symlinks=False)
            os.replace(second, name)
        except BaseException:
            second.unlink(missing_ok=True)
            self._discard(ino)
            raise
        if self.durable:
            fsync_dir(self.dir)
        self._pin(name, ino, token, holder)

    def release(self, name: str, holder: str, token: int | None) -> bool:
        """Unlink the lock file ``name`` if it still points at the inode pinned for ``holder`` (and ``token``, when
        given): True if done. False means "read the file to decide" (nothing was changed)."""
        self._own()
        pinned = self._pinned.get(name)
        if pinned is None or pinned.holder != holder or token not in (None, pinned.token):
            return False
        try:
            st = os.lstat(name)
        except FileNotFoundError:
            return False
        if st.st_ino != pinned.inode.ino or st.st_dev != pinned.inode.dev:
            return False
        os.unlink(name)  # noqa: PTH108 - the hot path; str paths spare pathlib's cost
        del self._pinned[name]
        # Two names before the unlink (the lock's and our spare's): the spare name is the only one left.
        self._recycle(pinned.inode, names_known=True, links=st.st_nlink - 1)
        return True

    def points_at_pin(self, name: str, token: int) -> bool | None:
        """Does the lock file ``name`` point at the inode pinned under ``token``? None when no such pin (then the
        file's content tells); False when the name is gone."""
        self._own()
        pinned = self._pinned.get(name)
        if pinned is None or pinned.token != token:
            return None
        try:
            st = os.lstat(name)
        except FileNotFoundError:
            return False
        if (st.st_dev, st.st_ino) == (pinned.inode.dev, pinned.inode.ino):
            return True
        return None

    def unpin(self, name: str) -> None:
        """Forget the pin of ``name`` (its lock was released or taken over); its inode goes back to the pool."""
        self._own()
        old = self._pinned.pop(name, None)
        if old is not None:
            self._recycle(old.inode)

    def shed_spares(self) -> int:
        """Close the spare inodes' descriptors (a descriptor shortage: the pool is a speed-up, the journal and the
        person's questions are not). Returns how many went; the pool fills again as locks are released."""
        self._own()
        shed = len(self._spares)
        for ino in self._spares:
            self._discard(ino)
        self._spares = []
        return shed

    def close(self) -> None:
        """Close every pinned and spare inode's descriptor (the spares' private names go too)."""
        self._own()
        for pinned in self._pinned.values():
            self._discard(pinned.inode)
        for ino in self._spares:
            self._discard(ino)
        self._pinned, self._spares = {}, []

    # -- internals

    def _own(self) -> None:
        # After a fork the pool and pins belong to the parent: never write into the parent's inodes.
        if self._pid != os.getpid():
            self._spares = []
            self._pinned = {}
            self._pid = os.getpid()

    def _pin(self, name: str, ino: _Inode, token: int, holder: str) -> None:
        """Keep ``ino`` open as the inode of the held lock ``name`` (a pin it replaces goes back to the pool)."""
        self.unpin(name)
        self._pinned[name] = _Pinned(ino, token, holder)

    def _fill(self, ino: _Inode, data: bytes) -> None:
        _pwrite_all(ino.fd, data)
        if ino.size > len(data):
            os.ftruncate(ino.fd, len(data))
        ino.size = len(data)
        if self.durable:
            os.fsync(ino.fd)

    def _take(self) -> _Inode:
        # Pooled spares were checked to have our private name as their only name when they came
        # back; nobody else knows that name, so it is still so (a sweep deleting it makes link fail).
        self._own()
        if self._spares:
            return self._spares.pop()
        name = f"{self._dir_s}/.spare{TMP_MARK}{writer_mark()}.{secrets.token_hex(4)}"
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


def _pwrite_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    offset = 0
    while offset < len(data):
        offset += os.pwrite(fd, view[offset:], offset)
