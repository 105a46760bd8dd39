"""The pool of spare files: a file is reused only while its private name is its only name, the pool stays within
its bound, a shortage sheds every descriptor, and a forked child never writes into its parent's files."""

from __future__ import annotations

import os
from pathlib import Path

from ambient.storage.spares import SPARE_PREFIX, SparePool


def _private(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(SPARE_PREFIX))


def test_a_spare_given_a_name_and_back_is_reused_in_place(tmp_path: Path) -> None:
    pool = SparePool(tmp_path, durable=False, limit=4)
    spare = pool.take()
    spare.fill(b"first content", durable=False)
    spare.link_as(str(tmp_path / "a.lock"))
    assert (tmp_path / "a.lock").read_bytes() == b"first content"
    (tmp_path / "a.lock").unlink()
    pool.give_back(spare, names_known=True)
    again = pool.take()
    assert (again.dev, again.ino) == (spare.dev, spare.ino)  # no inode made
    again.fill(b"2nd", durable=False)  # shorter: cut to size
    again.link_over(str(tmp_path / "b.lock"), tmp_path / "b.lock")
    assert (tmp_path / "b.lock").read_bytes() == b"2nd"
    assert [p.name for p in tmp_path.iterdir() if ".tmp." in p.name and not p.name.startswith(SPARE_PREFIX)] == []


def test_a_spare_with_another_name_left_or_past_the_bound_is_not_kept(tmp_path: Path) -> None:
    pool = SparePool(tmp_path, durable=False, limit=1)
    linked = pool.take()
    linked.link_as(str(tmp_path / "held.lock"))
    pool.give_back(linked)  # still named held.lock: someone could read it as theirs
    assert (tmp_path / "held.lock").exists() and _private(tmp_path) == []
    first, second = pool.take(), pool.take()
    pool.give_back(first)
    pool.give_back(second)  # past the bound of 1: closed, its private name gone
    assert len(_private(tmp_path)) == 1
    assert pool.take().ino == first.ino


def test_a_shortage_sheds_every_kept_descriptor(tmp_path: Path) -> None:
    pool = SparePool(tmp_path, durable=False, limit=8)
    spares = [pool.take() for _ in range(5)]
    for spare in spares:
        pool.give_back(spare, names_known=True)
    assert pool.shed() == 5 and _private(tmp_path) == []
    for spare in spares:
        try:
            os.fstat(spare.fd)
        except OSError:
            continue
        raise AssertionError(f"descriptor {spare.fd} still open")
    assert pool.take().ino > 0  # the pool goes on: a new file


def test_a_forked_child_starts_with_no_spares(tmp_path: Path) -> None:
    pool = SparePool(tmp_path, durable=False, limit=4)
    kept = pool.take()
    pool.give_back(kept, names_known=True)
    pid = os.fork()
    if pid == 0:  # the child: a spare of its own, never the parent's
        code = 0 if pool.take().ino != kept.ino else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert pool.take().ino == kept.ino  # the parent still has it
