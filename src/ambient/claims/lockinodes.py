"""The inodes behind one lock manager's lock files: the pinned ones of the locks it holds.

A lock is published whole (RELIABILITY §1.2 rule 1): its content is written to a private file which is then
hard-linked to the lock's name; the link fails if the name exists, and no reader ever sees half a lock. The private
files come from a pool of spare files (:mod:`ambient.storage.spares`): a released lock's inode goes back there and is
rewritten for the next grant. A held lock's inode stays open (pinned): while it is open its number cannot be
reused, so "the name still points at our inode" proves the lock is ours (rule 4, GHSA-fq56: inode reuse).

Every call here runs under the lock manager's guard. After a fork the pins belong to the parent: the child starts
with none (and its pool empty) and never writes into the parent's inodes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ambient.core.errors import LockError
from ambient.storage.spares import Spare, SparePool


@dataclass
class _Pinned:
    inode: Spare
    token: int
    holder: str


class LockInodes:
    """The pinned inodes of the locks one manager holds (by lock file), and the spare files they come from.

    Args:
        directory: ``locks/``.
        durable: fsync each inode written and the directory after each link.
    """

    def __init__(self, directory: Path, *, durable: bool) -> None:
        self.dir = directory
        self.durable = durable
        self._pinned: dict[str, _Pinned] = {}
        self._spares = SparePool(directory, durable=durable)
        self._pid = os.getpid()

    def publish(self, name: str, data: bytes, token: int, holder: str) -> bool:
        """Link a fully written spare file to the lock file ``name``; False if the name exists. Pins the inode."""
        for _ in range(3):
            ino = self._spares.take()
            try:
                ino.fill(data, durable=self.durable)
                ino.link_as(name)
            except FileExistsError:
                self._spares.give_back(ino, names_known=True)
                return False
            except FileNotFoundError:
                self._spares.discard(ino)  # its private name was swept: make another
                continue
            except BaseException:
                self._spares.discard(ino)
                raise
            self._spares.named()
            self._pin(name, ino, token, holder)
            return True
        raise LockError(f"cannot publish a lock in {self.dir}: spare files keep disappearing (a sweep loop?)")

    def replace(self, name: str, path: Path, data: bytes, token: int, holder: str) -> None:
        """Rewrite a lock we hold (refresh/renew): a fresh inode renamed over it."""
        ino = self._spares.take()
        try:
            ino.fill(data, durable=self.durable)
            ino.link_over(name, path)
        except BaseException:
            self._spares.discard(ino)
            raise
        self._spares.named()
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
        # Two names before the unlink (the lock's and the spare's): the spare's private name is the only one left.
        self._spares.give_back(pinned.inode, names_known=True, links=st.st_nlink - 1)
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
            self._spares.give_back(old.inode)

    def shed_spares(self) -> int:
        """Close the spare files' descriptors (a descriptor shortage: :meth:`SparePool.shed`). Returns how many went;
        the pool fills again as locks are released."""
        self._own()
        return self._spares.shed()

    def close(self) -> None:
        """Close every pinned and spare inode's descriptor (the spares' private names go too)."""
        self._own()
        for pinned in self._pinned.values():
            self._spares.discard(pinned.inode)
        self._pinned = {}
        self._spares.close()

    def _own(self) -> None:
        # After a fork the pins belong to the parent: never write into the parent's inodes.
        if self._pid != os.getpid():
            self._pinned = {}
            self._pid = os.getpid()

    def _pin(self, name: str, ino: Spare, token: int, holder: str) -> None:
        """Keep ``ino`` open as the inode of the held lock ``name`` (a pin it replaces goes back to the pool)."""
        self.unpin(name)
        self._pinned[name] = _Pinned(ino, token, holder)
