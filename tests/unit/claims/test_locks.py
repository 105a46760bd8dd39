"""Lock-file mutex: names, format, exclusion between real processes (R-05), stale locks and leases (R-06)."""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from ambient.claims.claim import new_claim
from ambient.claims.lockfile import below_prefix, decode_name, encode_path, folders_above, parse_lock
from ambient.claims.locks import GUARD_NAME, LockGrant, LockManager
from ambient.claims.store import ClaimStore
from ambient.core.errors import (
    FencingError,
    InputError,
    LockBusyError,
    LockNotHeldError,
    UnsafePathError,
    UnsupportedFilesystemError,
)
from ambient.storage import fsutil
from ambient.storage.fsutil import sweep_stale_tmp
from ambient.storage.paths import BrainPaths
from ambient.testing.clock import ManualClock
from tests.conftest import async_wait_until, wait_until

SRC = Path(__file__).resolve().parents[3] / "src"


class _Ticks:
    """Counts turns of the event loop (a task sleeping 5 ms at a time): proof that the loop is not blocked."""

    def __init__(self) -> None:
        self.count = 0
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            self.count += 1
            await asyncio.sleep(0.005)

    def stop(self) -> None:
        self._task.cancel()


@pytest.fixture
def brain(tmp_path: Path) -> BrainPaths:
    """An empty brain with claims/ and locks/."""
    root = tmp_path / "brain"
    (root / "claims").mkdir(parents=True)
    (root / "locks").mkdir()
    return BrainPaths(root)


@pytest.fixture
def manager(brain: BrainPaths) -> Iterator[Callable[..., LockManager]]:
    """Factory of lock managers on the brain (short grace periods), closed at teardown."""
    made: list[LockManager] = []

    def _make(**kw: float | bool | str) -> LockManager:
        kw.setdefault("grace_s", 0.2)
        kw.setdefault("malformed_grace_s", 0.5)
        m = LockManager(brain, **kw)  # type: ignore[arg-type]
        made.append(m)
        return m

    yield _make
    for m in made:
        m.close()


def run_py(code: str, *args: str, **kw: object) -> subprocess.Popen[str]:
    """Start a real Python child running ``code`` (with ambient importable)."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kw
    )


def foreign_lock(path: Path, *, holder: str = "sess-old", expires: datetime, extra: str = "") -> None:
    """A lock written the way the original bash tool did (naive local minutes), published atomically."""
    local = expires.astimezone().replace(tzinfo=None)
    text = (
        f"file: {decode_name(path.name)}\nholder: {holder}\n"
        f"claimed_at: {local - timedelta(minutes=60):%Y-%m-%dT%H:%M}\n"
        f"expires_at: {local:%Y-%m-%dT%H:%M:%S}\nttl_min: 60\n{extra}"
    )
    fsutil.atomic_write(path, text)


# ---------------------------------------------------------------- names and format


class TestNames:
    @pytest.mark.parametrize(
        ("file", "name"),
        [
            ("agents/foo.md", "agents%2Ffoo.md.lock"),
            ("agents/", "agents%2F.lock"),
            ("./agents//foo.md", "agents%2Ffoo.md.lock"),
            (".hidden/x", "%2Ehidden%2Fx.lock"),
            ("100%/x y", "100%25%2Fx%20y.lock"),
            ("%2e%2e/", "%252e%252e%2F.lock"),
        ],
    )
    def test_encoding(self, file: str, name: str) -> None:
        """Paths are percent-encoded into one flat, non-hidden name; folders keep their slash."""
        assert encode_path(file)[1] == name
        assert decode_name(name) == encode_path(file)[0]

    @pytest.mark.parametrize(
        "file", ["../../etc/passwd", "/etc/passwd", "a/../../b", "..\\x", "x\x00y", "a" * 300, "", "a/\x07b"]
    )
    def test_escapes_are_refused(self, file: str) -> None:
        """S-01 lock paths: traversal, absolute, backslash, NUL, overlong, empty and control chars are refused."""
        with pytest.raises((UnsafePathError, InputError)):
            encode_path(file)

    @given(
        st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40),
        st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40),
    )
    @pytest.mark.slow
    def test_distinct_paths_never_share_a_name(self, a: str, b: str) -> None:
        """Encoding is injective on normalised paths and every name decodes back to its path."""
        try:
            ra, na = encode_path(a)
            rb, nb = encode_path(b)
        except (UnsafePathError, InputError):
            return
        assert (na == nb) == (ra == rb)
        assert "/" not in na and not na.startswith(".")
        assert decode_name(na) == ra

    @settings(max_examples=80)
    @given(holder=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=60))
    def test_our_format_parses_both_ways(self, holder: str, tmp_path_factory: pytest.TempPathFactory) -> None:
        """Any holder is refused or round-trips: the fast JSON-line form and the safe YAML reader agree."""
        from ambient.claims.lockfile import _parse_fast, _parse_yaml, check_holder

        try:
            check_holder(holder)
        except InputError:
            assert not holder.strip() or not holder.isprintable()
            return
        m = LockManager(BrainPaths(tmp_path_factory.mktemp("fmt")), check_filesystem=False)
        raw = m._render("agents/x.md", holder, 7, 1_800_000_000.0, 60.0, True)
        m.close()
        fast = _parse_fast(raw.decode())
        assert fast is not None and fast == _parse_yaml(raw, "x")
        info = parse_lock(raw, "x")
        assert info.holder == holder and info.token == 7 and info.pid_bound

    def test_foreign_bash_format_is_read(self, brain: BrainPaths, manager: Callable[..., LockManager]) -> None:
        """A lock in the source's format (naive local minutes, no token) is read through the YAML path."""
        m = manager()
        foreign_lock(m.path_for("agents/a.md"), expires=datetime.now(UTC) + timedelta(hours=1))
        status = m.check("agents/a.md")
        assert status.state == "held" and status.info is not None and status.info.holder == "sess-old"
        assert status.info.token is None


# ---------------------------------------------------------------- in-process behaviour


class TestBasics:
    def test_acquire_release_refresh(self, manager: Callable[..., LockManager]) -> None:
        """Acquire publishes the source keys plus ours; same holder refreshes the TTL and keeps the token."""
        m = manager()
        g = m.acquire("agents/foo.md", "sess-a", ttl_s=60)
        text = m.path_for("agents/foo.md").read_text()
        for key in (
            "file",
            "holder",
            "claimed_at",
            "expires_at",
            "ttl_min",
            "instance",
            "pid",
            "pid_start_time",
            "token",
            "host",
        ):
            assert f"\n{key}: " in "\n" + text
        assert "ttl_min: 1\n" in text
        g2 = m.acquire("agents/foo.md", "sess-a", ttl_s=600)
        assert g2.refreshed and g2.token == g.token and g2.expires > g.expires
        assert m.check("agents/foo.md").info.ttl_min == 10  # type: ignore[union-attr]
        m.release("agents/foo.md", "sess-a")
        assert m.check("agents/foo.md").state == "free"
        assert [p.name for p in m.dir.iterdir() if not p.name.startswith(".spare")] == []

    @pytest.mark.slow
    def test_other_holder_is_refused_then_waits(self, manager: Callable[..., LockManager]) -> None:
        """A second holder gets LockBusyError at once, and the lock after the first releases it while waiting."""
        a, b = manager(), manager()
        ga = a.acquire("x.md", "sess-a")
        with pytest.raises(LockBusyError, match="locked by sess-a"):
            b.acquire("x.md", "sess-b")
        timer = threading.Timer(0.2, a.release_grant, args=(ga,))
        timer.start()
        gb = b.acquire("x.md", "sess-b", wait=5)
        timer.join()
        assert gb.token > ga.token and b.check("x.md").info.holder == "sess-b"  # type: ignore[union-attr]

    def test_release_rules(self, manager: Callable[..., LockManager]) -> None:
        """Release by the wrong holder, with a wrong token, or of a free lock is refused and changes nothing."""
        m = manager()
        g = m.acquire("x.md", "sess-a")
        with pytest.raises(LockNotHeldError, match="held by sess-a, not by sess-b"):
            m.release("x.md", "sess-b")
        with pytest.raises(LockNotHeldError, match="under token"):
            manager().release("x.md", "sess-a", token=g.token - 1)
        assert m.check("x.md").state == "held"
        manager().release("x.md", "sess-a")  # another process of the same session may release (source semantics)
        with pytest.raises(LockNotHeldError, match="not locked"):
            m.release("x.md", "sess-a")

    def test_threads_exclude_each_other(self, manager: Callable[..., LockManager], tmp_path: Path) -> None:
        """8 threads (some sharing a manager) × 60 cycles: the O_EXCL witness never collides, the count is exact."""
        shared = manager()
        witness, counter = tmp_path / "witness", [0]
        errors: list[BaseException] = []

        def work(i: int) -> None:
            m = shared if i % 2 else manager()
            try:
                for _ in range(60):
                    g = m.acquire("t.md", f"sess-{i}", wait=30)
                    os.close(os.open(witness, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                    counter[0] += 1
                    os.unlink(witness)
                    m.release_grant(g)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and counter[0] == 480

    @pytest.mark.slow
    async def test_async_acquire_does_not_block_the_loop(self, manager: Callable[..., LockManager]) -> None:
        """acquire_async waits in a thread: the loop keeps ticking, and the lock comes once released."""
        a, b = manager(), manager()
        ga = a.acquire("y.md", "sess-a")
        ticks = _Ticks()
        waiter = asyncio.ensure_future(b.acquire_async("y.md", "sess-b", wait=5))
        # Ten turns of the loop while b waits (a loop blocked by the wait turns only once it gave up, done).
        assert await async_wait_until(lambda: ticks.count >= 10, timeout=10)
        assert not waiter.done()
        a.release_grant(ga)
        gb = await asyncio.wait_for(waiter, 5)
        ticks.stop()
        assert gb.holder == "sess-b"
        with pytest.raises(LockBusyError):
            await a.acquire_async("y.md", "sess-a", wait=0.05)

    async def test_async_paths_wait_for_a_busy_guard_off_the_loop(
        self, brain: BrainPaths, manager: Callable[..., LockManager]
    ) -> None:
        """Inline attempts need the guard at once; held by another process, they go to a thread, loop free."""
        import fcntl

        m = manager()
        brain.state.mkdir(parents=True, exist_ok=True)
        fd = os.open(brain.state / GUARD_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)  # what an `ambient lock` command holds for a few microseconds
        ticks = _Ticks()
        try:
            getting = asyncio.ensure_future(m.acquire_async("g.md", "sess-g", wait=5))
            assert await async_wait_until(lambda: ticks.count >= 10, timeout=5)
            assert not getting.done()  # it waits on the guard, in a thread
            fcntl.flock(fd, fcntl.LOCK_UN)
            grant = await asyncio.wait_for(getting, 5)
            assert m.check("g.md").info.token == grant.token  # type: ignore[union-attr]
            fcntl.flock(fd, fcntl.LOCK_EX)
            releasing = asyncio.ensure_future(m.release_async(grant))
            before = ticks.count
            assert await async_wait_until(lambda: ticks.count >= before + 5, timeout=5)
            assert not releasing.done() and m.check("g.md").state == "held"
            fcntl.flock(fd, fcntl.LOCK_UN)
            await asyncio.wait_for(releasing, 5)
            assert m.check("g.md").state == "free"
            # Guard free: both run inline (no thread), and the token still moves forward.
            again = await m.acquire_async("g.md", "sess-g")
            assert again.token > grant.token
            await m.release_async(again)
            assert m.check("g.md").state == "free"
        finally:
            ticks.stop()
            os.close(fd)

    async def test_loop_operations_of_one_iteration_share_one_flock(
        self, brain: BrainPaths, manager: Callable[..., LockManager], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Lock operations run by the loop in one iteration take the guard's flock once; it is free again (for
        other processes) by the next iterations, and the token counter is re-read after it was let go."""
        import fcntl

        from ambient.storage import guard as guard_mod

        m = manager()
        taken: list[int] = []
        real_flock = fcntl.flock

        def counting(fd: int, op: int) -> None:
            if op & fcntl.LOCK_EX:
                taken.append(fd)
            real_flock(fd, op)

        monkeypatch.setattr(guard_mod.fcntl, "flock", counting)
        grants = [await m.acquire_async(f"batch/{k}.md", "sess-b") for k in range(10)]  # inline: no yield
        for g in grants:
            await m.release_async(g)
        assert len(taken) == 1
        assert await async_wait_until(lambda: not m._loop_hold, timeout=5)
        fd = os.open(brain.state / GUARD_NAME, os.O_RDWR)
        try:
            real_flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another process could take it now
            far = time.time_ns() // 1000 + 10**12  # a token another process stored meanwhile, far ahead
            os.pwrite(fd, b"%020d\n" % far, 0)
            real_flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        after = await m.acquire_async("batch/after.md", "sess-b")
        assert after.token > far > max(g.token for g in grants)
        await m.release_async(after)

    async def test_a_hold_stores_the_token_counter_once(
        self, brain: BrainPaths, manager: Callable[..., LockManager], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The grants of one hold of the guard write the token counter once, before the guard is let go: another
        process reading it under the guard then sees the newest token."""
        from ambient.storage import guard as guard_mod

        m = manager()
        guard_file = brain.state / GUARD_NAME
        stores: list[bytes] = []
        real_pwrite = os.pwrite

        def counting(fd: int, data: bytes, offset: int) -> int:
            if os.path.samestat(os.fstat(fd), os.stat(guard_file)):
                stores.append(bytes(data))
            return real_pwrite(fd, data, offset)

        monkeypatch.setattr(guard_mod.os, "pwrite", counting)
        grants = [await m.acquire_async(f"many/{k}.md", "sess-t") for k in range(10)]  # one loop iteration
        assert await async_wait_until(lambda: not m._loop_hold, timeout=5)
        assert len(stores) == 1 and int(stores[0]) == max(g.token for g in grants)
        assert int(guard_file.read_bytes().split()[0]) == max(g.token for g in grants)
        for g in grants:
            await m.release_async(g)

    def test_an_inode_with_a_foreign_name_is_not_reused(self, manager: Callable[..., LockManager]) -> None:
        """A released lock's inode goes back to the pool only when our spare name is its last name: an extra hard
        link made meanwhile (by someone else) keeps it out, so what that name shows is never rewritten."""
        m = manager()
        grant = m.acquire("a.md", "sess-x")
        foreign = m.dir / "elsewhere.txt"
        os.link(m.path_for("a.md"), foreign)
        before = foreign.read_bytes()
        m.release_grant(grant)
        for k in range(6):  # enough grants to use every pooled inode
            m.release_grant(m.acquire(f"b{k}.md", f"sess-{k}"))
        assert foreign.read_bytes() == before

    def test_a_burst_larger_than_the_old_pool_reuses_every_inode(
        self, manager: Callable[..., LockManager], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A fan-out of 100 releases then takes 100 locks again: no file is created or deleted the second time
        (ext4 without a journal makes each freed inode cost the next creates for a minute; the pool was 64)."""
        m = manager()
        grants = [m.acquire(f"burst/{k}.md", f"sess-{k}") for k in range(100)]
        for g in grants:
            m.release_grant(g)
        calls: list[str] = []
        real_open, real_unlink = os.open, os.unlink

        def counting_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            if flags & os.O_CREAT:
                calls.append(f"create {path}")
            return real_open(path, flags, *args, **kwargs)

        def counting_unlink(path: Any, *args: Any, **kwargs: Any) -> None:
            if ".spare" in str(path):
                calls.append(f"unlink {path}")
            real_unlink(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", counting_open)
        monkeypatch.setattr(os, "unlink", counting_unlink)
        again = [m.acquire(f"next/{k}.md", f"sess-n{k}") for k in range(100)]
        for g in again:
            m.release_grant(g)
        assert [c for c in calls if "locks.guard" not in c] == []

    def test_the_spare_pool_follows_the_descriptor_limit(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Each spare holds a descriptor: a quarter of what the soft limit leaves over the daemon's own (64), 512 at
        most, none under a very low limit (8 spares under ``ulimit -n 32`` left no descriptor for a journal)."""
        import resource

        from ambient.storage.spares import spares_max

        for soft, expected in ((1024, 240), (65536, 512), (96, 8), (32, 0), (resource.RLIM_INFINITY, 512)):
            monkeypatch.setattr(resource, "getrlimit", lambda _which, s=soft: (s, resource.RLIM_INFINITY))
            assert spares_max() == expected

    def test_a_shortage_gives_the_spares_descriptors_back(self, manager: Callable[..., LockManager]) -> None:
        """``shed`` closes the pool's descriptors and removes their private names; locks held stay held, and the
        next grants work (creating inodes again)."""
        m = manager()
        held = m.acquire("kept.md", "sess-k")
        grants = [m.acquire(f"s/{k}.md", f"sess-{k}") for k in range(6)]
        for g in grants:
            m.release_grant(g)

        def spare_names() -> list[str]:
            return [p.name for p in m.dir.iterdir() if p.name.startswith(".spare")]

        assert len(spare_names()) == 7  # six in the pool, one behind the held lock
        assert m.shed() == 6
        assert len(spare_names()) == 1
        assert m.check("kept.md").info.holder == "sess-k"  # type: ignore[union-attr]
        again = m.acquire("s/0.md", "sess-again")
        assert m.check("s/0.md").info.holder == "sess-again"  # type: ignore[union-attr]
        m.release_grant(again)
        m.release_grant(held)

    async def test_async_cancel_never_leaks_a_lock(self, manager: Callable[..., LockManager]) -> None:
        """Cancelling acquire_async mid-wait leaves no lock held by the cancelled caller."""
        a, b = manager(), manager()
        ga = a.acquire("z.md", "sess-a")
        task = asyncio.ensure_future(b.acquire_async("z.md", "sess-b", wait=5))
        await asyncio.sleep(0.05)
        a.release_grant(ga)
        task.cancel()
        try:
            got = await task
        except asyncio.CancelledError:
            got = None
        status = b.check("z.md")
        assert status.state == "free" or (isinstance(got, LockGrant) and status.info.holder == "sess-b")  # type: ignore[union-attr]

    def test_refuses_network_filesystems(self, brain: BrainPaths, monkeypatch: pytest.MonkeyPatch) -> None:
        """NFS/CIFS/FUSE state directories are refused with a message saying what to do."""
        for fstype in ("nfs4", "cifs", "fuse.sshfs"):
            monkeypatch.setattr(fsutil, "filesystem_type", lambda _p, f=fstype: f)
            with pytest.raises(UnsupportedFilesystemError, match="local filesystem"):
                LockManager(brain)
            with pytest.raises(UnsupportedFilesystemError):
                ClaimStore(brain)

    def test_symlinked_locks_dir_is_refused(self, tmp_path: Path) -> None:
        """locks/ and claims/ must not be symlinks (they would move every lock or claim elsewhere)."""
        root = tmp_path / "b"
        root.mkdir()
        (tmp_path / "elsewhere").mkdir()
        (root / "locks").symlink_to(tmp_path / "elsewhere")
        (root / "claims").symlink_to(tmp_path / "elsewhere")
        with pytest.raises(UnsafePathError, match="symlink"):
            LockManager(BrainPaths(root))
        with pytest.raises(UnsafePathError, match="symlink"):
            ClaimStore(BrainPaths(root))

    def test_write_failure_publishes_nothing(
        self, manager: Callable[..., LockManager], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """R-02: ENOSPC while writing a lock fails loudly and publishes nothing; the next acquire works."""
        m = manager()

        def full(fd: int, data: object, offset: int) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "pwrite", full)
        with pytest.raises(OSError, match="No space"):
            m.acquire("w.md", "sess-a")
        monkeypatch.undo()
        assert m.check("w.md").state == "free"
        assert m.acquire("w.md", "sess-a").holder == "sess-a"

    def test_fsync_failure_in_durable_mode(
        self, manager: Callable[..., LockManager], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """R-02: with durable=True an EIO from fsync fails the acquire (never retried) and publishes nothing."""
        m = manager(durable=True)
        m.release_grant(m.acquire("v.md", "sess-a"))  # durable path works

        def broken(fd: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "fsync", broken)
        with pytest.raises(OSError, match="Input/output"):
            m.acquire("v.md", "sess-a")
        monkeypatch.undo()
        assert m.check("v.md").state == "free"

    def test_content_naming_another_file(self, manager: Callable[..., LockManager]) -> None:
        """Ambient content under the wrong name (a recycled inode read late) is never read as that name's lock."""
        m = manager()
        m.acquire("x.md", "sess-a")
        m.path_for("y.md").write_bytes(m.path_for("x.md").read_bytes())
        status = m.check("y.md")
        assert status.state == "malformed" and "names another file" in (status.problem or "")

    def test_missing_brain_is_refused(self, tmp_path: Path) -> None:
        """A mistyped brain directory is an error, never created by a lock or claim write."""
        paths = BrainPaths(tmp_path / "typo")
        with pytest.raises(InputError, match="not a directory"):
            LockManager(paths)
        with pytest.raises(InputError, match="not a directory"):
            ClaimStore(paths)
        assert not (tmp_path / "typo").exists()


# ---------------------------------------------------------------- contention between real processes

R05_WORKER = r"""
import os, random, sys, time
from pathlib import Path
from ambient.claims.locks import LockManager
from ambient.storage.paths import BrainPaths
root, idx, cycles = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
m = LockManager(BrainPaths(root), check_filesystem=False)
rng = random.Random(idx)
counter, witness = root / "counter.txt", root / "witness.excl"
hist = []
while not (root / "go").exists():
    time.sleep(0.001)
for _ in range(cycles):
    t_inv = time.monotonic_ns()
    g = m.acquire("shared/counter.txt", f"w{idx}", ttl_s=60, wait=120)
    t0 = time.monotonic_ns()
    os.close(os.open(witness, os.O_CREAT | os.O_EXCL | os.O_WRONLY))  # EEXIST = two holders at once
    counter.write_text(str(int(counter.read_text()) + 1))
    if rng.random() < 0.25:
        time.sleep(rng.uniform(0, 0.002))
    os.unlink(witness)
    t1 = time.monotonic_ns()
    m.release_grant(g)
    hist.append(f"{t_inv} {t0} {t1} {g.token}")
(root / f"hist-{idx}.txt").write_text("\n".join(hist) + "\n")
"""


@pytest.mark.slow
def test_r05_processes_never_overlap(brain: BrainPaths) -> None:
    """R-05: 8 processes × 300 acquire/write/release cycles: exact counter, no overlap, tokens increase."""
    procs, cycles = 8, 300
    root = brain.root
    (root / "counter.txt").write_text("0")
    workers = [run_py(R05_WORKER, str(root), str(i), str(cycles)) for i in range(procs)]
    time.sleep(0.05)
    (root / "go").touch()
    start = time.monotonic()
    for w in workers:
        _, err = w.communicate(timeout=150)
        assert w.returncode == 0, err
    elapsed = time.monotonic() - start
    assert int((root / "counter.txt").read_text()) == procs * cycles
    intervals = []
    for i in range(procs):
        for row in (root / f"hist-{i}.txt").read_text().splitlines():
            t_inv, t0, t1, token = map(int, row.split())
            intervals.append((t0, t1, token, t0 - t_inv))
    intervals.sort()
    assert len(intervals) == procs * cycles
    for (_, end, tok, _), (start_next, _, tok_next, _) in itertools.pairwise(intervals):
        assert start_next > end, "two holders inside the critical section at once"
        assert tok_next > tok, "fencing tokens must increase with each grant"
    waits = sorted(w for *_, w in intervals)
    p50, p99 = waits[len(waits) // 2] / 1e6, waits[int(len(waits) * 0.99)] / 1e6
    print(
        f"\nR-05: {procs}x{cycles} cycles in {elapsed:.2f}s = {len(intervals) / elapsed:.0f} acq/s, "
        f"wait p50 {p50:.2f} ms p99 {p99:.2f} ms, overlaps 0"
    )


RACE_WORKER = r"""
import sys, time
from pathlib import Path
from ambient.claims.locks import LockGrant, LockManager
from ambient.storage.paths import BrainPaths
root, idx, rounds = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
m = LockManager(BrainPaths(root), grace_s=0.0, check_filesystem=False)
with open(root / f"race-{idx}.txt", "a") as out:
    for r in range(rounds):
        go = root / f"go-{r}"
        while not go.exists():
            time.sleep(0.0002)
        got = m.try_acquire("race/target.md", f"w{idx}-r{r}", ttl_s=60)
        won = isinstance(got, LockGrant)
        out.write(f"{r} {int(won)} {got.token if won else 0} {got.took_over.state if won and got.took_over else '-'}\n")
        out.flush()
"""


def _dead_pid() -> tuple[int, float | None]:
    from ambient.core.process import process_start_time

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    start = process_start_time(child.pid)
    child.kill()
    child.wait()
    return child.pid, start


@pytest.mark.slow
def test_r05_race_for_one_expired_lock(brain: BrainPaths, manager: Callable[..., LockManager]) -> None:
    """Several processes find the same expired (or dead-holder) lock at once: exactly one wins, every round."""
    procs, rounds = 6, 40
    root = brain.root
    m = manager()
    lock = m.path_for("race/target.md")
    dead_pid, dead_start = _dead_pid()
    workers = [run_py(RACE_WORKER, str(root), str(i), str(rounds)) for i in range(procs)]
    winners: list[int] = []
    try:
        for r in range(rounds):
            lock.unlink(missing_ok=True)
            if r % 2:
                foreign_lock(lock, expires=datetime.now(UTC) - timedelta(minutes=5))
            else:  # a live-looking lease, but its process is gone: provably dead on this host
                foreign_lock(
                    lock,
                    expires=datetime.now(UTC) + timedelta(hours=1),
                    extra=(
                        f"pid: {dead_pid}\npid_start_time: {dead_start}\n"
                        f"host: {socket.gethostname()}\npid_bound: true\n"
                    ),
                )
            (root / f"go-{r}").touch()

            def done(r: int = r) -> bool:
                return all(
                    sum(1 for line in (root / f"race-{i}.txt").read_text().splitlines() if line.split()[0] == str(r))
                    for i in range(procs)
                    if (root / f"race-{i}.txt").exists()
                ) and all((root / f"race-{i}.txt").exists() for i in range(procs))

            assert wait_until(done, timeout=20), f"round {r}: workers did not answer"
            rows = [
                line.split()
                for i in range(procs)
                for line in (root / f"race-{i}.txt").read_text().splitlines()
                if line.split()[0] == str(r)
            ]
            won = [row for row in rows if row[1] == "1"]
            assert len(won) == 1, f"round {r}: {len(won)} winners"
            assert won[0][3] == ("expired" if r % 2 else "dead")
            winners.append(int(won[0][2]))
    finally:
        for w in workers:
            w.communicate(timeout=30)
    assert all(w.returncode == 0 for w in workers)
    assert winners == sorted(winners) and len(set(winners)) == rounds
    print(f"\nR-05 race: {procs} processes x {rounds} rounds, exactly one winner every round")


# ---------------------------------------------------------------- stale locks and leases

HOLDER = r"""
import sys, time
from pathlib import Path
from ambient.claims.locks import LockManager
from ambient.storage.paths import BrainPaths
root, bound, ttl = Path(sys.argv[1]), sys.argv[2] == "1", float(sys.argv[3])
m = LockManager(BrainPaths(root), check_filesystem=False)
g = m.acquire("agents/held.md", "sess-holder", ttl_s=ttl, pid_bound=bound)
print(g.token, flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("reap", [True, False], ids=["reaped", "zombie"])
def test_r06a_killed_holder_is_reclaimed_at_once(
    brain: BrainPaths, manager: Callable[..., LockManager], reap: bool
) -> None:
    """R-06a: a pid-bound holder killed with -9 (reaped or zombie) is provably dead: the lock is free at once."""
    holder = run_py(HOLDER, str(brain.root), "1", "60")
    token = int(holder.stdout.readline())  # type: ignore[union-attr]
    m = manager()
    assert m.check("agents/held.md").state == "held"
    holder.send_signal(signal.SIGKILL)
    if reap:
        holder.wait()
    else:
        assert wait_until(lambda: m.check("agents/held.md").state == "dead", timeout=5)
    t0 = time.monotonic()
    g = m.acquire("agents/held.md", "sess-next", wait=5)
    reclaim = time.monotonic() - t0
    holder.communicate()
    assert g.took_over is not None and g.took_over.state == "dead" and g.token > token
    print(f"\nR-06a ({'reaped' if reap else 'zombie'}): reclaimed {reclaim * 1000:.1f} ms after kill -9 (TTL 60 s)")


@pytest.mark.slow
def test_r06a_session_lock_waits_for_ttl_and_grace(brain: BrainPaths, manager: Callable[..., LockManager]) -> None:
    """R-06a: a session-bound lock (as the CLI takes) outlives its process until TTL + grace, then is taken over."""
    holder = run_py(HOLDER, str(brain.root), "0", "1.0")
    holder.stdout.readline()  # type: ignore[union-attr]
    holder.send_signal(signal.SIGKILL)
    holder.communicate()
    t_kill = time.monotonic()
    m = manager(grace_s=0.3)
    assert m.check("agents/held.md").state == "held"
    g = m.acquire("agents/held.md", "sess-next", wait=10)
    waited = time.monotonic() - t_kill
    assert g.took_over is not None and g.took_over.state == "expired"
    assert waited <= 1.0 + 0.3 + 0.5
    print(f"\nR-06a (session-bound): reclaimed {waited:.2f} s after kill -9 (TTL 1 s + grace 0.3 s)")


@dataclass
class Op:
    """One history entry (Jepsen-style): who, what, token, when, outcome."""

    proc: str
    op: str
    token: int
    t: float
    ok: bool
    expires: float = 0.0


def check_history(history: list[Op]) -> None:
    """No two ok lock intervals overlap unless the earlier lease expired and its later writes were fenced."""
    intervals: dict[int, tuple[str, float, float, float]] = {}
    for op in history:
        if op.op == "acquire" and op.ok:
            intervals[op.token] = (op.proc, op.t, float("inf"), op.expires)
        elif op.op == "release" and op.ok:
            proc, start, _, exp = intervals[op.token]
            intervals[op.token] = (proc, start, op.t, exp)
    spans = sorted(intervals.items(), key=lambda kv: kv[1][1])
    for (tok_a, (_, a0, a1, a_exp)), (tok_b, (_, b0, _, _)) in itertools.pairwise(spans):
        if b0 < a1:  # overlap: only allowed after a's lease ran out, and a's later writes must all be fenced
            assert b0 >= a_exp, "a holder was granted a lock whose lease had not expired"
            late = [op for op in history if op.op == "write" and op.token == tok_a and op.t >= b0]
            assert all(not op.ok for op in late), "a write under an outlived lease was accepted"
            assert tok_b > tok_a


STOPPED_HOLDER = r"""
import sys, time
from pathlib import Path
from ambient.claims.store import ClaimStore
from ambient.core.errors import FencingError, LockNotHeldError
from ambient.claims.locks import LockManager
from ambient.storage.paths import BrainPaths
root = Path(sys.argv[1])
paths = BrainPaths(root)
m = LockManager(paths, grace_s=0.2, check_filesystem=False)
store = ClaimStore(paths, check_filesystem=False)
g = m.acquire("agents/foo.md", "sess-h", ttl_s=0.8)
store.update("sess-x", {"story_angle": "written by the first holder"}, token=g.token)
print(g.token, g.expires, time.time(), flush=True)
while not (root / "go").exists():
    time.sleep(0.01)
t = time.time()
try:
    store.update("sess-x", {"story_angle": "late write of a paused holder"}, token=g.token)
    print("WROTE", t, flush=True)
except FencingError as exc:
    print("FENCED", t, exc, flush=True)
try:
    m.release_grant(g)
    print("RELEASED", time.time(), flush=True)
except LockNotHeldError:
    print("RELEASE_REFUSED", time.time(), flush=True)
"""


@pytest.mark.slow
def test_r06b_paused_holder_is_fenced(brain: BrainPaths, manager: Callable[..., LockManager]) -> None:
    """R-06b: a SIGSTOP'd holder outlives its lease; after SIGCONT its write is fenced and its release refused."""
    store = ClaimStore(brain)
    store.open(new_claim("sess-x", "satellite", "agents/", "a", datetime.now(UTC)))
    holder = run_py(STOPPED_HOLDER, str(brain.root))
    token, expires, t_acq = holder.stdout.readline().split()  # type: ignore[union-attr]
    history = [
        Op("h", "acquire", int(token), float(t_acq), True, float(expires)),
        Op("h", "write", int(token), float(t_acq), True),
    ]
    holder.send_signal(signal.SIGSTOP)
    try:
        m = manager(grace_s=0.2)
        stopped_at = time.monotonic()
        g = m.acquire("agents/foo.md", "sess-g", ttl_s=30, wait=10)
        outlived = time.monotonic() - stopped_at
        history.append(Op("g", "acquire", g.token, time.time(), True, g.expires))
        assert g.took_over is not None and g.took_over.state == "expired" and g.token > int(token)
        store.update("sess-x", {"story_angle": "written by the successor"}, token=g.token)
        history.append(Op("g", "write", g.token, time.time(), True))
        (brain.root / "go").touch()
    finally:
        holder.send_signal(signal.SIGCONT)
    out, err = holder.communicate(timeout=30)
    lines = out.split("\n")
    assert lines[0].startswith("FENCED"), err
    history.append(Op("h", "write", int(token), float(lines[0].split()[1]), False))
    assert lines[1].startswith("RELEASE_REFUSED")
    assert store.get("sess-x").story_angle == "written by the successor"
    assert store.get("sess-x").fence == g.token
    assert m.check("agents/foo.md").info.holder == "sess-g"  # type: ignore[union-attr]
    m.release_grant(g)
    history.append(Op("g", "release", g.token, time.time(), True))
    check_history(history)
    print(
        f"\nR-06b: holder stopped {outlived:.2f} s (TTL 0.8 s + grace 0.2 s); stale writes attempted 1, rejected 1, "
        "overlaps outside an expired lease 0"
    )


def test_r06c_release_spares_a_successor(manager: Callable[..., LockManager]) -> None:
    """R-06c: a holder whose lease ran out cannot delete the successor's lock, even under the same holder name."""
    a, b = manager(grace_s=0.0), manager(grace_s=0.0)
    ga = a.acquire("c.md", "sess-same", ttl_s=0.05)
    assert wait_until(lambda: a.check("c.md").state == "expired", timeout=5)
    gb = b.acquire("c.md", "sess-same", ttl_s=30)  # a takeover: new grant, new token, same holder name
    assert not gb.refreshed and gb.took_over is not None and gb.token > ga.token
    with pytest.raises(LockNotHeldError, match="taken over"):
        a.release_grant(ga)
    with pytest.raises(LockNotHeldError):
        a.renew(ga)
    assert b.check("c.md").info.token == gb.token  # type: ignore[union-attr]
    b.release_grant(gb)
    assert b.check("c.md").state == "free"


def _make_bad(kind: str, path: Path, outside: Path) -> None:
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "malformed":
        path.write_text("holder: [unclosed\n")
    elif kind == "missing-keys":
        path.write_text("holder: sess-x\n")
    elif kind == "oversized":
        path.write_text("file: x\nholder: y\nexpires_at: 2099-01-01T00:00\n" + "#" * 5000)
    elif kind == "binary":
        path.write_bytes(b"\xff\xfe\x00garbage")
    elif kind == "symlink":
        # The target holds a perfectly valid-looking lock: it must still never be followed.
        outside.write_text("file: x\nholder: sess-evil\nexpires_at: 2099-01-01T00:00\n")
        path.symlink_to(outside)
    elif kind == "dangling":
        path.symlink_to(outside.parent / "nowhere")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()


BAD_KINDS = ["empty", "malformed", "missing-keys", "oversized", "binary", "symlink", "dangling", "fifo", "directory"]


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_r06d_hostile_lock_files(manager: Callable[..., LockManager], tmp_path: Path, kind: str) -> None:
    """R-06d: bad lock files are reported, count as held within the grace period, then are taken over safely."""
    m = manager(malformed_grace_s=30)
    path = m.path_for("d.md")
    outside = tmp_path / "outside.txt"
    _make_bad(kind, path, outside)
    before = outside.read_bytes() if outside.exists() else None
    status = m.check("d.md")
    assert status.state == "malformed" and status.problem
    assert status.blocking
    with pytest.raises(LockBusyError):
        m.acquire("d.md", "sess-a")  # never free without checking
    assert any(s.file == "d.md" and s.state == "malformed" for s in m.list())
    old = time.time() - 60
    os.utime(path, (old, old), follow_symlinks=False)  # past the grace period, without sleeping
    if kind == "directory":  # never removed by ambient: a person must look
        assert m.check("d.md").state == "malformed"
        with pytest.raises(LockBusyError, match="remove it by hand"):
            m.acquire("d.md", "sess-a")
        return
    assert m.check("d.md").state == "stale"
    g = m.acquire("d.md", "sess-a")
    assert g.took_over is not None and g.took_over.state == "stale"
    assert not path.is_symlink() and m.check("d.md").info.holder == "sess-a"  # type: ignore[union-attr]
    if before is not None:
        assert outside.read_bytes() == before  # the symlink's target was never touched


def test_r06e_clock_jumps(brain: BrainPaths, manager: Callable[..., LockManager]) -> None:
    """R-06e: +1 h makes a lease expire (takeover, old writes fenced); -1 h never double-grants, tokens still rise."""
    store = ClaimStore(brain)
    store.open(new_claim("sess-x", "satellite", "agents/", "a", datetime.now(UTC)))
    clock = ManualClock(datetime.now(UTC))
    start = clock.now()
    a, b = manager(now=clock.time), manager(now=clock.time)
    ga = a.acquire("e.md", "sess-a", ttl_s=60)
    store.update("sess-x", {"story_angle": "a"}, token=ga.token)
    clock.set(start + timedelta(hours=1))
    assert b.check("e.md").state == "expired"
    gb = b.acquire("e.md", "sess-b", ttl_s=60)
    assert gb.token > ga.token
    store.update("sess-x", {"story_angle": "b"}, token=gb.token)
    clock.set(start)
    with pytest.raises(FencingError):
        store.update("sess-x", {"story_angle": "a again"}, token=ga.token)
    with pytest.raises(LockNotHeldError):
        a.release_grant(ga)
    # Back at the start gb's lease (taken "in the future") still holds: nobody else gets it.
    assert b.check("e.md").state == "held"
    with pytest.raises(LockBusyError):
        a.acquire("e.md", "sess-a")
    b.release_grant(gb)
    clock.set(start - timedelta(hours=1))
    gc = a.acquire("e.md", "sess-c", ttl_s=60)
    assert gc.token > gb.token  # the persisted counter, not the clock, keeps tokens rising
    with pytest.raises(LockBusyError):
        b.acquire("e.md", "sess-d")
    # After the clock comes back, gc looks expired an hour early: that is the lease's risk, and fencing covers it.
    clock.set(start)
    gd = b.acquire("e.md", "sess-d")
    assert gd.took_over is not None and gd.token > gc.token
    store.update("sess-x", {"story_angle": "d"}, token=gd.token)
    with pytest.raises(FencingError):
        store.update("sess-x", {"story_angle": "c"}, token=gc.token)


def test_cleanup_removes_only_what_is_free_to_take(manager: Callable[..., LockManager], tmp_path: Path) -> None:
    """cleanup removes expired, dead and stale locks and dead writers' temp files; held locks stay."""
    m = manager()
    m.acquire("held.md", "sess-a", ttl_s=60)
    foreign_lock(m.path_for("expired.md"), expires=datetime.now(UTC) - timedelta(minutes=1))
    m.path_for("bad.md").write_text("")
    os.utime(m.path_for("bad.md"), (0, 0))
    dead_pid, _ = _dead_pid()
    leftover = m.dir / f".x.lock.tmp.{dead_pid}.abcd1234"
    leftover.write_text("half")
    mine = m.dir / f".y.lock.tmp.{os.getpid()}.abcd1234"
    mine.write_text("in progress")
    removed = {s.file for s in m.cleanup()}
    assert removed == {"expired.md", "bad.md"}
    assert m.check("held.md").state == "held"
    assert not leftover.exists() and mine.exists()
    assert sweep_stale_tmp(tmp_path / "nope") == []


@dataclass
class _Owner:
    holder: str
    token: int
    expires: float


class LockMachine(RuleBasedStateMachine):
    """Three managers (as three processes would) race over two paths while a frozen clock moves on."""

    HOLDERS = ("sess-a", "sess-b", "sess-c")
    PATHS = ("p/one.md", "p/two/")
    GRACE = 0.5

    def __init__(self) -> None:
        super().__init__()
        import shutil
        import tempfile

        self._rmtree = shutil.rmtree
        self.root = Path(tempfile.mkdtemp(prefix="lockmachine-"))
        (self.root / "locks").mkdir()
        self.clock = ManualClock(datetime(2026, 3, 16, 21, 0, tzinfo=UTC))
        self.managers = {
            h: LockManager(BrainPaths(self.root), grace_s=self.GRACE, check_filesystem=False, now=self.clock.time)
            for h in self.HOLDERS
        }
        self.model: dict[str, _Owner | None] = dict.fromkeys(self.PATHS)
        self.old_grants: list[LockGrant] = []
        self.last_token = 0

    def _expired(self, owner: _Owner) -> bool:
        return self.clock.time() > owner.expires + self.GRACE

    @rule(holder=st.sampled_from(HOLDERS), path=st.sampled_from(PATHS), ttl=st.sampled_from([1.0, 5.0, 60.0]))
    def acquire(self, holder: str, path: str, ttl: float) -> None:
        """An attempt succeeds exactly when the model says the lock is free, expired or the holder's own."""
        owner = self.model[path]
        got = self.managers[holder].try_acquire(path, holder, ttl_s=ttl)
        if owner is None or self._expired(owner):
            assert isinstance(got, LockGrant) and not got.refreshed
            assert got.token > self.last_token
            self.last_token = got.token
        elif owner.holder == holder:
            assert isinstance(got, LockGrant) and got.refreshed and got.token == owner.token
        else:
            assert not isinstance(got, LockGrant) and got.info is not None and got.info.holder == owner.holder
            return
        self.model[path] = _Owner(holder, got.token, self.clock.time() + ttl)
        self.old_grants.append(got)

    @rule(holder=st.sampled_from(HOLDERS), path=st.sampled_from(PATHS))
    def release(self, holder: str, path: str) -> None:
        """Release by holder name works only for the holder on disk; anyone else is refused."""
        owner = self.model[path]
        if owner is not None and owner.holder == holder:
            self.managers[holder].release(path, holder)
            self.model[path] = None
        else:
            with pytest.raises(LockNotHeldError):
                self.managers[holder].release(path, holder)

    @rule(data=st.data())
    def release_an_old_grant(self, data: st.DataObject) -> None:
        """A grant whose token is no longer on disk never releases the current lock."""
        if not self.old_grants:
            return
        grant = data.draw(st.sampled_from(self.old_grants))
        owner = self.model[grant.file]
        if owner is not None and owner.token == grant.token and owner.holder == grant.holder:
            return  # still current: covered by `release`
        with pytest.raises(LockNotHeldError):
            self.managers[grant.holder].release_grant(grant)

    @rule(seconds=st.sampled_from([0.2, 1.0, 3.0, 30.0, 120.0]))
    def time_passes(self, seconds: float) -> None:
        """The wall clock moves on (frozen between steps, so judgements are exact)."""
        self.clock.advance(seconds)

    @invariant()
    def disk_matches_model(self) -> None:
        """What check() reads is the model's owner (holder and token), or nothing."""
        for path, owner in self.model.items():
            status = self.managers["sess-a"].check(path)
            if owner is None:
                assert status.state == "free"
            else:
                assert status.info is not None and (status.info.holder, status.info.token) == (
                    owner.holder,
                    owner.token,
                )
                assert status.state == ("expired" if self._expired(owner) else "held")

    def teardown(self) -> None:
        for m in self.managers.values():
            m.close()
        self._rmtree(self.root, ignore_errors=True)


TestLockMachine = pytest.mark.slow(LockMachine.TestCase)
TestLockMachine.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


@pytest.mark.parametrize(
    ("rel", "above"),
    [
        ("a.md", []),
        ("a/b/c.md", ["a/", "a/b/"]),
        ("a/b/", ["a/"]),
        ("a/", []),
    ],
)
def test_the_folders_whose_lock_covers_a_path(rel: str, above: list[str]) -> None:
    assert folders_above(rel) == above


def test_every_lock_name_under_a_folder_starts_with_its_prefix() -> None:
    """The encoding keeps each character's: the names of what a folder holds start with the folder's own stem."""
    folder = encode_path("projets/x y/")[1]
    prefix = below_prefix(folder)
    assert prefix is not None
    for inside in ("projets/x y/a.md", "projets/x y/sub/", "projets/x y/%odd.md"):
        assert encode_path(inside)[1].startswith(prefix), inside
    for beside in ("projets/x yz.md", "projets/x/", "projets/"):
        assert not encode_path(beside)[1].startswith(prefix), beside
    assert below_prefix(encode_path("projets/a.md")[1]) is None
