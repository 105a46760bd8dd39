"""File events → engine wake-ups: ambient's own claim writes wake nothing; a person's edits do."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ambient.claims.claim import new_claim
from ambient.claims.store import ClaimStore
from ambient.engine.tick import Tick
from ambient.service.watch import watch_brain
from ambient.storage.fsutil import atomic_write
from ambient.storage.paths import BrainPaths
from tests.conftest import async_wait_until

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_touched_matches_folders_not_name_prefixes(tmp_path: Path) -> None:
    """``claims2/x`` is not under ``claims``; the folder itself and anything below it are."""
    claims = tmp_path / "claims"
    assert not Tick(1, NOW, frozenset({tmp_path / "claims2" / "x.yml"})).touched(claims)
    assert Tick(1, NOW, frozenset({claims / "a" / "x.yml"})).touched(claims)
    assert Tick(1, NOW, frozenset({claims})).touched(claims)
    assert Tick(1, NOW).touched(claims)  # a timed tick looks at everything


def test_own_write_is_known_until_someone_else_writes(tmp_path: Path) -> None:
    """is_own_write: true for the version the store wrote, false once a person rewrites the file."""
    (tmp_path / "claims").mkdir()
    store = ClaimStore(BrainPaths(tmp_path))
    path = store.write_claim(new_claim("sess-a", "satellite", "x.md", "coder", NOW), durable=False)
    assert store.is_own_write(str(path))
    path.write_text(path.read_text() + "note: edited by hand\n")
    assert not store.is_own_write(str(path))
    assert not store.is_own_write(str(tmp_path / "claims" / "never-written.yml"))


async def test_ignored_changes_wake_nothing(tmp_path: Path) -> None:
    """A batch of ignored changes calls nothing; other changes come through without them."""
    paths = BrainPaths(tmp_path)
    batches: list[list[Path]] = []
    stop = asyncio.Event()
    ready = asyncio.Event()
    task = asyncio.ensure_future(
        watch_brain(
            paths, lambda ch: batches.append(list(ch)), stop, ready=ready, ignore=lambda p: p.endswith("own.yml")
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), 10)
        (paths.claims / "own.yml").write_text("sess_id: own\n")
        await asyncio.sleep(0)  # let the watcher see it first (no assertion depends on timing)
        (paths.workflows / "new.yml").write_text("workflow: new\n")
        assert await async_wait_until(lambda: any(p.name == "new.yml" for b in batches for p in b), timeout=10)
        assert all(p.name != "own.yml" for b in batches for p in b)
        assert all(b for b in batches)  # never called with nothing
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def _watching(paths: BrainPaths, batches: list[list[Path]], stop: asyncio.Event) -> asyncio.Future[None]:
    ready = asyncio.Event()
    task = asyncio.ensure_future(watch_brain(paths, lambda ch: batches.append(list(ch)), stop, ready=ready))
    await asyncio.wait_for(ready.wait(), 10)
    return task


async def test_changes_are_read_by_the_event_loop_not_polled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On Linux the loop reads the inotify descriptor itself: a dropped workflow wakes the engine as the kernel
    reports it, with no thread looking every 10 ms and a step more to be sure nothing else came (15-20 ms of the
    drop → first SPAWN latency). watchfiles is not used at all."""
    import watchfiles

    def polled(*args: object, **kwargs: object) -> object:
        raise AssertionError("watchfiles polled")

    monkeypatch.setattr(watchfiles, "awatch", polled)
    paths = BrainPaths(tmp_path)
    batches: list[list[Path]] = []
    stop = asyncio.Event()
    task = await _watching(paths, batches, stop)
    try:
        atomic_write(paths.workflows / "new.yml", "workflow: new\n")
        assert await async_wait_until(lambda: any(p.name == "new.yml" for b in batches for p in b), timeout=10)
        assert all(".tmp." not in p.name for b in batches for p in b)  # the temp file of the atomic write: not news
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_a_folder_made_again_is_watched_again(tmp_path: Path) -> None:
    """A watched folder deleted (its watch ends with it) is watched again once it is back, and what it then holds
    wakes the engine."""
    paths = BrainPaths(tmp_path)
    batches: list[list[Path]] = []
    stop = asyncio.Event()
    task = await _watching(paths, batches, stop)
    try:
        paths.agents.rmdir()
        assert await async_wait_until(lambda: any(paths.agents in b for b in batches), timeout=10)  # look again
        paths.agents.mkdir()
        assert await async_wait_until(lambda: sum(b.count(paths.agents) for b in batches) >= 2, timeout=10)
        (paths.agents / "coder.md").write_text("# coder\n")
        assert await async_wait_until(lambda: any(p.name == "coder.md" for b in batches for p in b), timeout=10)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
