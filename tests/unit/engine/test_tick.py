"""The engine's wake-up: made before the engine and handed to whoever wakes it, it says what the next tick looks at."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ambient.engine.tick import Tick, TriggerEngine, Wakeup


def test_changed_files_are_what_the_next_tick_looks_at(tmp_path: Path) -> None:
    wakeup = Wakeup()
    a, b = tmp_path / "a.yml", tmp_path / "b.yml"
    wakeup.wake([a])
    wakeup.file_changed(b)
    assert wakeup.take(timed_out=False) == frozenset({a, b})
    assert wakeup.take(timed_out=False) == frozenset()  # taken once: the slate is wiped


def test_a_wake_without_paths_or_a_timeout_is_a_full_look(tmp_path: Path) -> None:
    """An empty set of changes is a timed tick (Tick.timed): it looks at everything, whatever else changed."""
    wakeup = Wakeup()
    wakeup.file_changed(tmp_path / "a.yml")
    wakeup.wake()
    assert wakeup.take(timed_out=False) == frozenset()
    wakeup.file_changed(tmp_path / "a.yml")
    assert wakeup.take(timed_out=True) == frozenset()
    wakeup.file_changed(tmp_path / "b.yml")
    assert wakeup.take(timed_out=False) == frozenset({tmp_path / "b.yml"})  # the full look was taken with the rest


class _Seen:
    name = "seen"

    def __init__(self) -> None:
        self.ticks: list[Tick] = []
        self.changed = asyncio.Event()

    async def evaluate(self, tick: Tick) -> None:
        self.ticks.append(tick)
        self.changed.set()


async def test_the_engine_ticks_on_the_wakeup_it_was_given(tmp_path: Path) -> None:
    """Whoever holds the wake-up (built before the engine) wakes the engine, with the paths it names."""
    wakeup, seen, stop = Wakeup(), _Seen(), asyncio.Event()
    engine = TriggerEngine([seen], tick_seconds=3600.0, wakeup=wakeup)
    task = asyncio.create_task(engine.run(stop))
    try:
        await asyncio.wait_for(seen.changed.wait(), 30)  # the first tick, at once
        seen.changed.clear()
        wakeup.file_changed(tmp_path / "answer.yml")
        await asyncio.wait_for(seen.changed.wait(), 30)
        assert seen.ticks[-1].changes == frozenset({tmp_path / "answer.yml"})
        seen.changed.clear()
        engine.wake()  # the engine's own wake is the same wake-up
        await asyncio.wait_for(seen.changed.wait(), 30)
        assert seen.ticks[-1].timed
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert len(seen.ticks) == 3
