"""R-04 and the journal's contract: torn tails and bad lines skipped and reported, group commit, kill -9 appends.

The kill test runs a real subprocess that appends 10,000 records through :class:`ambient.storage.journal.Journal`,
fsyncing every 25 and reporting each fsync'd id on a pipe, and SIGKILLs it at seeded random points: every
reported record must be on disk, ids stay unique and in order, a partial last line is skipped on read and
cut by ``RunManager.resume_all`` before a run journal is appended to again. Figures are printed (``-s``).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambient.engine.runstate import fold
from ambient.storage import journal as journal_mod
from ambient.storage.journal import Journal, append_line, iter_jsonl, read_jsonl, tail_jsonl
from ambient.storage.paths import BrainPaths
from tests.conftest import async_wait_until
from tests.unit.engine.test_runs import ITEMS, FakeDelegate, _manager

SEED = 4242


def _lines(records: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


# ---------------------------------------------------------------- reading


def test_torn_tail_is_skipped_and_reported(tmp_path: Path) -> None:
    """A last line without its newline (a crash mid-append) is not returned and is flagged as a torn tail."""
    path = tmp_path / "j.jsonl"
    path.write_bytes(_lines([{"i": 0}, {"i": 1}]) + b'{"i": 2, "pad": "xx')
    res = read_jsonl(path)
    assert [r["i"] for r in res.records] == [0, 1]
    assert res.torn_tail and res.bad_lines == []


def test_complete_last_line_is_not_a_torn_tail(tmp_path: Path) -> None:
    """A file ending in a newline has no torn tail; blank lines are ignored, not reported."""
    path = tmp_path / "j.jsonl"
    path.write_bytes(_lines([{"i": 0}]) + b"\n  \n" + _lines([{"i": 1}]))
    res = read_jsonl(path)
    assert [r["i"] for r in res.records] == [0, 1]
    assert not res.torn_tail and res.bad_lines == []


def test_bad_lines_are_skipped_with_their_numbers(tmp_path: Path) -> None:
    """Corrupt JSON and non-object lines are skipped and reported by line number; the rest is kept in order."""
    path = tmp_path / "j.jsonl"
    path.write_bytes(_lines([{"i": 0}]) + b"{not json\n" + b"[1, 2]\n" + b'"text"\n' + _lines([{"i": 1}]))
    res = read_jsonl(path)
    assert [r["i"] for r in res.records] == [0, 1]
    assert res.bad_lines == [2, 3, 4] and not res.torn_tail


def test_missing_file_reads_as_empty(tmp_path: Path) -> None:
    """A journal that does not exist yet is an empty history, not an error."""
    res = read_jsonl(tmp_path / "absent.jsonl")
    assert res.records == [] and not res.torn_tail
    assert list(iter_jsonl(tmp_path / "absent.jsonl")) == []


# ---------------------------------------------------------------- writing


def test_buffered_writes_reach_the_file_at_flush(tmp_path: Path) -> None:
    """Buffered records are whole lines on disk after flush (none before); unbuffered ones at once."""
    path = tmp_path / "j.jsonl"
    with Journal(path) as j:
        j.write({"i": 0})
        assert path.read_bytes() == b""
        j.flush()
        assert read_jsonl(path).records == [{"i": 0}]
    raw = tmp_path / "raw.jsonl"
    with Journal(raw, buffered=False) as j:
        j.write({"i": 1, "text": "é"})
        assert read_jsonl(raw).records == [{"i": 1, "text": "é"}]


def test_append_line_appends_one_whole_record(tmp_path: Path) -> None:
    """append_line adds exactly one line per call, creating the file and its folder."""
    path = tmp_path / "sub" / "log.jsonl"
    append_line(path, {"a": 1})
    append_line(path, {"a": 2}, durable=False)
    assert read_jsonl(path).records == [{"a": 1}, {"a": 2}]


def test_sync_without_new_records_does_not_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sync() fsyncs once for everything written so far, and not again until something new is written."""
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(journal_mod.os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    j = Journal(tmp_path / "j.jsonl")
    for i in range(10):
        j.write({"i": i})
    j.sync()
    j.sync()
    assert len(calls) == 1
    j.write({"i": 10})
    j.sync()
    assert len(calls) == 2
    j.close()


async def test_group_commit_coalesces_concurrent_commits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """200 concurrent write+commit callers share a handful of fsyncs, and every record is on disk after."""
    calls: list[int] = []
    real = os.fsync

    def slow_fsync(fd: int) -> None:
        calls.append(fd)
        time.sleep(0.005)  # a disk's fsync: long enough for the other committers to queue behind it
        real(fd)

    monkeypatch.setattr(journal_mod.os, "fsync", slow_fsync)
    path = tmp_path / "j.jsonl"
    j = Journal(path)

    async def writer(i: int) -> None:
        j.write({"i": i})
        await j.commit()

    await asyncio.gather(*(writer(i) for i in range(200)))
    # The round starts after all 200 writers have written (they run before the round's task): one fsync.
    assert len(calls) == 1, f"{len(calls)} fsyncs for 200 commits"
    assert sorted(r["i"] for r in read_jsonl(path).records) == list(range(200))
    await j.commit()  # nothing new: no fsync
    assert len(calls) == 1
    j.close()
    print(f"\nR-04 group commit: 200 commits -> {len(calls)} fsync(s)")


def test_failed_fsync_is_never_retried_as_success(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After an fsync error the journal refuses every later sync (pages may be lost; RELIABILITY [29])."""
    real = os.fsync
    failures = [OSError(errno.EIO, "Input/output error")]

    def flaky(fd: int) -> None:
        if failures:
            raise failures.pop()
        real(fd)

    monkeypatch.setattr(journal_mod.os, "fsync", flaky)
    j = Journal(tmp_path / "j.jsonl")
    j.write({"i": 0})
    with pytest.raises(OSError):
        j.sync()
    with pytest.raises(OSError):
        j.sync()  # fsync would "succeed" now, but the data of the failed one may be gone: never report it durable
    j.write({"i": 1})
    with pytest.raises(OSError):
        asyncio.run(j.commit())
    with pytest.raises(OSError):
        j.close()


# ---------------------------------------------------------------- kill -9 during 10k appends

_CHILD = r"""
import json, os, sys
from pathlib import Path
from ambient.storage.journal import Journal
path, pad, split = Path(sys.argv[1]), "x" * int(sys.argv[2]), sys.argv[3] == "split"
every = 1000 if split else 25
j = Journal(path)
fd = os.open(path, os.O_WRONLY | os.O_APPEND)
os.write(1, b"ready\n")
for i in range(10_000):
    if split:  # a writer that breaks the one-write-per-line rule: the kill can land between the halves
        data = (json.dumps({"i": i, "pad": pad}) + "\n").encode()
        os.write(fd, data[: len(data) // 2])
        os.write(fd, data[len(data) // 2 :])
    else:
        j.write({"i": i, "pad": pad})
    if i % every == every - 1:  # split mode fsyncs rarely, so the kill mostly lands among the writes
        j.sync()
        os.fsync(fd)
        os.write(1, b"%d\n" % i)  # reported only once fsync'd
j.close()
os.write(1, b"done\n")
"""


def _kill_appender(path: Path, pad: int, delay: float, *, split: bool = False) -> tuple[int, bool]:
    """Run the appender and SIGKILL it ``delay`` s after it has opened the journal; (last id reported fsync'd,
    finished by itself).

    Timed from its "ready" line, not from its start: on a loaded machine the interpreter's start-up alone took more
    than 0.3 s once, and the kill landed before the file existed (a fresh clone's test run, 2026-12-01).
    """
    argv = [sys.executable, "-c", _CHILD, str(path), str(pad), "split" if split else "whole"]
    # Unbuffered: the ready line is read byte by byte, so communicate() below gets everything after it.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    assert proc.stdout is not None
    if proc.stdout.readline() != b"ready\n":
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"the appender did not start: {err.decode(errors='replace')}")
    try:
        out, err = proc.communicate(timeout=delay)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode in (0, -signal.SIGKILL), err.decode(errors="replace")
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    done = b"done" in lines
    last = max((int(line) for line in lines if line != b"done"), default=-1)
    return last, done


@pytest.mark.slow
def test_kill9_during_10k_appends_loses_no_fsynced_record(tmp_path: Path) -> None:
    """R-04: kill -9 at random points of 10k appends: every fsync'd record survives, ids unique, tail skipped."""
    rng = random.Random(SEED)
    torn = 0
    lost = 0
    kills = 0
    for n in range(10):
        path = tmp_path / f"j{n}.jsonl"
        pad = rng.choice([16, 200, 3000])  # large records: a 64 KiB flush can be cut by the kill
        split = n % 2 == 1  # every other child writes lines in two halves, so torn tails really happen
        last, done = _kill_appender(path, pad, rng.uniform(0.07, 0.25) if split else rng.uniform(0.1, 0.6), split=split)
        kills += not done
        res = read_jsonl(path)
        ids = [r["i"] for r in res.records]
        assert ids == list(range(len(ids))), "ids must be unique and in order"
        assert res.bad_lines == []
        lost += max(0, last + 1 - len(ids))
        torn += res.torn_tail
        assert len(ids) >= last + 1, f"lost fsync'd records: {last + 1 - len(ids)}"
        if done:
            assert len(ids) == 10_000 and not res.torn_tail
    assert lost == 0
    print(f"\nR-04 seed={SEED} kills={kills} partial_tails_seen={torn} records_lost={lost}")


async def test_resume_cuts_a_torn_tail_before_appending(tmp_path: Path) -> None:
    """RunManager.resume_all truncates a run journal's partial last line, so new events start on their own line."""
    paths = BrainPaths(tmp_path)
    paths.run_journals.mkdir(parents=True)
    run_id = "sess-20261130-1200-w-beef"
    head = _lines(
        [
            {"ev": "started", "run_id": run_id, "workflow": "w", "form": "for_each", "spec": {}, "items": ITEMS[:3]},
            {"ev": "accepted", "item": ITEMS[0], "attempt": 1},
        ]
    )
    paths.run_journal(run_id).write_bytes(head + b'{"ev": "finished", "item": "instance-01", "torn-mark')
    mgr, _, _, _ = _manager(tmp_path, FakeDelegate())
    assert mgr.resume_all() == [run_id]
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "success"
    raw = paths.run_journal(run_id).read_bytes()
    assert raw.startswith(head) and b"torn-mark" not in raw  # the partial line is gone, the history before it kept
    res = read_jsonl(paths.run_journal(run_id))
    assert not res.torn_tail and res.bad_lines == []
    state2 = fold(res.records)
    # In flight at the crash: run again, as the same attempt (its idempotency key kept).
    assert state2.outcome == "success" and state2.item(ITEMS[0]).attempt == 1
    assert [r["attempt"] for r in res.records if r.get("ev") == "accepted" and r["item"] == ITEMS[0]] == [1, 1]


@pytest.mark.slow
def test_appending_after_a_kill_keeps_every_line_whole(tmp_path: Path) -> None:
    """After a kill -9 (and the resume cut), a new Journal appends whole lines: no bad line, ids stay unique."""
    path = tmp_path / "j.jsonl"
    last, _ = _kill_appender(path, 3000, 0.3)
    data = path.read_bytes()
    path.write_bytes(data[: data.rfind(b"\n") + 1])  # what resume_all does to a torn tail
    have = len(read_jsonl(path).records)
    assert have >= last + 1
    with Journal(path) as j:
        for i in range(have, have + 100):
            j.write({"i": i})
    res = read_jsonl(path)
    assert [r["i"] for r in res.records] == list(range(have + 100))
    assert res.bad_lines == [] and not res.torn_tail


async def test_commit_does_not_queue_behind_the_default_thread_pool(tmp_path: Path) -> None:
    """A commit's fsync has its own threads: with asyncio's default pool full of stuck jobs, it still lands."""
    import threading

    loop = asyncio.get_running_loop()
    release = threading.Event()
    stuck = [loop.run_in_executor(None, release.wait) for _ in range(64)]  # more than the default pool's workers
    try:
        j = Journal(tmp_path / "j.jsonl")
        j.write({"ev": "accepted", "item": "a"})
        await asyncio.wait_for(j.commit(), 10)
        assert j._synced == j._written == 1
        j.close()
    finally:
        release.set()
        await asyncio.gather(*stuck)


async def test_a_cancelled_committer_does_not_cancel_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Callers share a round: cancelling one leaves the round and the other callers alone; a later record gets
    its own round; a journal closed with a commit pending wakes it instead of hanging."""
    gate, entered = threading.Event(), threading.Event()
    real = os.fsync

    def held_fsync(fd: int) -> None:
        entered.set()
        assert gate.wait(10)
        real(fd)

    monkeypatch.setattr(journal_mod.os, "fsync", held_fsync)
    j = Journal(tmp_path / "j.jsonl")
    j.write({"i": 1})
    first = asyncio.ensure_future(j.commit())
    second = asyncio.ensure_future(j.commit())
    assert await async_wait_until(entered.is_set, 10)  # the round is in flight, held
    first.cancel()
    j.write({"i": 2})
    third = asyncio.ensure_future(j.commit())
    await asyncio.sleep(0)
    gate.set()
    await asyncio.wait_for(asyncio.gather(second, third), 10)
    assert first.cancelled() and j._synced == j._written == 2
    j.write({"i": 3})
    pending = asyncio.ensure_future(j.commit())
    j.close()  # before the round starts: close() syncs, the commit is answered
    await asyncio.wait_for(pending, 10)
    assert [r["i"] for r in read_jsonl(tmp_path / "j.jsonl").records] == [1, 2, 3]


async def test_a_round_writes_its_records_in_order_with_the_loops_own_flushes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit round writes its records in its thread; a flush on the loop before that thread runs writes them
    first, then its own: the file keeps the order of ``write`` calls, and nothing is written twice."""
    held: list[Any] = []

    class HeldPool:  # runs the round only when the test says so
        def submit(self, fn: Any, *args: Any) -> None:
            held.append((fn, args))

    monkeypatch.setattr(journal_mod, "_fsync_pool", lambda: HeldPool())
    path = tmp_path / "j.jsonl"
    j = Journal(path)
    j.write({"i": 1})
    committing = asyncio.ensure_future(j.commit())
    assert await async_wait_until(lambda: bool(held), 10)  # the round took record 1; its thread has not run
    assert path.read_bytes() == b""  # not written on the loop
    j.write({"i": 2})
    j.flush()  # on the loop, before the round's thread: writes 1 then 2
    assert [r["i"] for r in read_jsonl(path).records] == [1, 2]
    fn, args = held.pop()
    await asyncio.to_thread(fn, *args)  # the round: nothing left to write, fsync, wake the committer
    await asyncio.wait_for(committing, 10)
    j.write({"i": 3})
    committing = asyncio.ensure_future(j.commit())
    assert await async_wait_until(lambda: bool(held), 10)
    fn, args = held.pop()
    await asyncio.to_thread(fn, *args)  # this time the thread writes record 3
    await asyncio.wait_for(committing, 10)
    assert [r["i"] for r in read_jsonl(path).records] == [1, 2, 3] and j._synced == j._written == 3
    j.close()


async def test_a_round_that_cannot_write_fails_its_committers_and_keeps_their_records_for_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write error in the round's thread (disk full) fails the commit, but nothing is lost: the records stay
    in memory, in order, and the next commit once space is back writes them all."""
    j = Journal(tmp_path / "j.jsonl")
    real_write = os.write
    failing = [OSError(errno.ENOSPC, "No space left on device")]

    def full(fd: int, data: Any) -> int:
        if fd == j._fd and failing:
            raise failing.pop()
        return real_write(fd, data)

    monkeypatch.setattr(journal_mod.os, "write", full)
    j.write({"i": 1})
    with pytest.raises(OSError, match="No space"):
        await asyncio.wait_for(j.commit(), 10)
    assert read_jsonl(j.path).records == []
    j.write({"i": 2})
    await asyncio.wait_for(j.commit(), 10)
    assert [r["i"] for r in read_jsonl(j.path).records] == [1, 2]
    j.close()


async def test_a_write_cut_short_by_a_full_disk_leaves_none_of_its_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short write then ENOSPC: what it wrote is cut off at once, whole records too, so the next record does not
    glue onto half a record in the middle of the journal, and records written together (an attempt's ``finished``
    and the ``retry`` that routes it) never reach the file one without the other: a kill then left a failed
    attempt on disk whose retry was lost. The write is tried again later, whole."""
    j = Journal(tmp_path / "j.jsonl")
    real_write = os.write
    calls = {"n": 0}

    def short_then_full(fd: int, data: Any) -> int:
        if fd == j._fd and calls["n"] < 2:
            calls["n"] += 1
            if calls["n"] == 1:  # the first record and half of the second reach the disk
                first = bytes(data).index(b"\n") + 1
                return real_write(fd, bytes(data)[: first + 5])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(journal_mod.os, "write", short_then_full)
    j.write({"i": 1})
    j.write({"i": 2})
    with pytest.raises(OSError, match="No space"):
        await asyncio.wait_for(j.commit(), 10)
    assert j.path.read_bytes() == b""  # neither the first record nor half of the second
    j.write({"i": 3})
    await asyncio.wait_for(j.commit(), 10)
    res = read_jsonl(j.path)
    assert [r["i"] for r in res.records] == [1, 2, 3] and not res.torn_tail and res.bad_lines == []
    j.close()


# ---------------------------------------------------------------- tail_jsonl: the newest records, read from the end


_LINE = st.one_of(
    st.dictionaries(st.sampled_from(["run_id", "ev", "n", "é"]), st.integers() | st.text(max_size=30), max_size=3).map(
        lambda d: json.dumps(d, ensure_ascii=False).encode()
    ),
    st.just(b""),  # blank line
    st.just(b"{not json"),  # corrupt line
    st.just(b'xx{"ev": "only a suffix is a record"}'),  # corrupt, but a block may start inside it
    st.just(b"[1, 2]"),  # JSON, not a record
)


@given(
    lines=st.lists(_LINE, max_size=40),
    torn=st.sampled_from([b"", b'{"ev": "tor', b"x", b'{"ev": "whole, but no newline: torn all the same"}']),
    count=st.integers(min_value=0, max_value=45),
    block=st.integers(min_value=1, max_value=64),
)
@pytest.mark.slow
@settings(max_examples=300, deadline=None)
def test_tail_jsonl_is_the_end_of_read_jsonl(
    tmp_path_factory: pytest.TempPathFactory, lines: list[bytes], torn: bytes, count: int, block: int
) -> None:
    path = tmp_path_factory.mktemp("tail") / "runs.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines) + torn)
    whole = read_jsonl(path).records
    assert tail_jsonl(path, count, block=block) == (whole[-count:] if count else [])


class _CountingFile:
    """A file object that adds up what is read from it."""

    def __init__(self, fh: Any, reads: list[int]) -> None:
        self._fh, self._reads = fh, reads

    def read(self, n: int = -1) -> bytes:
        data: bytes = self._fh.read(n)
        self._reads.append(len(data))
        return data

    def seek(self, *args: int) -> int:
        return int(self._fh.seek(*args))

    def __enter__(self) -> _CountingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._fh.close()


def test_tail_jsonl_reads_only_the_end(tmp_path: Path) -> None:
    reads: list[int] = []

    class CountingPath(type(Path())):  # type: ignore[misc]
        def open(self, *args: Any, **kwargs: Any) -> Any:
            return _CountingFile(super().open(*args, **kwargs), reads)

    path = tmp_path / "runs.jsonl"
    rng = random.Random(7)
    with path.open("wb") as fh:
        for i in range(20_000):
            fh.write(json.dumps({"n": i, "pad": "x" * rng.randint(0, 200)}).encode() + b"\n")
    got = tail_jsonl(CountingPath(path), 50)
    assert [r["n"] for r in got] == list(range(19_950, 20_000))
    assert 0 < sum(reads) <= 64 * 1024 < path.stat().st_size // 10
    assert tail_jsonl(tmp_path / "missing.jsonl", 5) == []


@pytest.mark.slow
def test_runs_last_shows_the_newest(tmp_path: Path) -> None:
    from tests.e2e.helpers import ambient_cli

    log = tmp_path / ".ambient" / "runs.jsonl"
    log.parent.mkdir()
    with log.open("w") as fh:
        for i in range(30):
            fh.write(
                json.dumps(
                    {
                        "run_id": f"run-{i:02d}",
                        "workflow": "w" if i % 2 else "v",
                        "outcome": "success",
                        "completed_at": f"2026-12-01T10:{i:02d}:00",
                        "steps": [],
                    }
                )
                + "\n"
            )
    done = ambient_cli(tmp_path, "runs", "--last", "3")
    assert done.returncode == 0, done.stderr
    assert [line.split()[-1] for line in done.stdout.splitlines()] == ["run-27", "run-28", "run-29"]
    done = ambient_cli(tmp_path, "runs", "w", "--last", "2")  # filtered first, then the newest two
    assert [line.split()[-1] for line in done.stdout.splitlines()] == ["run-27", "run-29"]
    assert len(ambient_cli(tmp_path, "runs").stdout.splitlines()) == 30


def test_append_line_cuts_a_torn_tail_first(tmp_path: Path) -> None:
    """append_line (runs.jsonl): a torn last line is cut before the record goes on, so the record stays whole."""
    path = tmp_path / "runs.jsonl"
    path.write_bytes(b'{"kind": "run", "run_id": "a"}\n{"kind": "run", "run_id": "x", "workf')
    append_line(path, {"kind": "run", "run_id": "b"})
    res = read_jsonl(path)
    assert [r["run_id"] for r in res.records] == ["a", "b"] and not res.torn_tail and res.bad_lines == []
    path.write_bytes(b'{"torn": ')  # no newline at all: everything goes
    append_line(path, {"kind": "run", "run_id": "c"})
    assert [r["run_id"] for r in read_jsonl(path).records] == ["c"]


async def test_records_of_one_loop_step_go_to_the_file_in_one_write_past_the_flush_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A buffer over the flush size is flushed after the loop's step, not between two records of that step (an
    attempt's ``finished`` and its ``retry`` are written in one step): one write holds both, whole or not at all."""
    j = Journal(tmp_path / "j.jsonl")
    real_write = os.write
    writes: list[bytes] = []

    def recording(fd: int, data: Any) -> int:
        if fd == j._fd:
            writes.append(bytes(data))
        return real_write(fd, data)

    monkeypatch.setattr(journal_mod.os, "write", recording)
    j.write({"ev": "finished", "output": "x" * (70 * 1024)})  # past the flush size on its own
    j.write({"ev": "retry"})
    assert writes == []  # not in the middle of the step
    await asyncio.sleep(0)
    assert len(writes) == 1 and writes[0].count(b"\n") == 2
    assert [r["ev"] for r in read_jsonl(j.path).records] == ["finished", "retry"]
    j.close()


def test_records_written_together_reach_the_file_in_one_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A result and the question it raises: a full buffer never flushes one without the other (a kill could fall
    between the two writes); they are written together once the block ends."""
    monkeypatch.setattr("ambient.storage.journal._FLUSH_AT", 1)  # every record would flush at once
    path = tmp_path / "run.jsonl"
    j = Journal(path)
    writes: list[bytes] = []
    real = j._write
    monkeypatch.setattr(j, "_write", lambda data: (writes.append(data), real(data))[1])
    with j.together():
        j.write({"ev": "finished", "item": "a"})
        j.write({"ev": "asking", "item": "a"})
        assert path.read_bytes() == b""
    assert [r["ev"] for r in read_jsonl(path).records] == ["finished", "asking"]
    assert len(writes) == 1
    j.write({"ev": "accepted", "item": "b"})  # outside: flushed at once, as before
    assert len(writes) == 2
    j.close()
