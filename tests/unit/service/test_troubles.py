"""The daemon's troubles: a shortage is told once, written for status, and lets caches give back what they hold."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from ambient.service.troubles import Troubles, health_file
from ambient.storage.paths import BrainPaths
from ambient.testing.clock import ManualClock


def _troubles(tmp_path: Path) -> Troubles:
    paths = BrainPaths(tmp_path)
    paths.state.mkdir(parents=True)
    return Troubles(paths, ManualClock(datetime(2026, 12, 7, tzinfo=UTC)))


def test_a_descriptor_shortage_asks_the_caches_to_give_back_each_time(tmp_path: Path) -> None:
    """Every sighting calls ``on_short`` (a pool refilled since the last one is shed again); it is noted once."""
    troubles = _troubles(tmp_path)
    seen: list[str] = []
    troubles.on_short = seen.append
    troubles.trouble("descriptors", "ambient ran out of file descriptors")
    troubles.trouble("descriptors", "ambient ran out of file descriptors")
    assert seen == ["descriptors", "descriptors"]
    written = json.loads(health_file(troubles.paths).read_text())
    assert "descriptors" in json.dumps(written)


def test_a_kind_that_is_not_a_resource_is_ignored(tmp_path: Path) -> None:
    troubles = _troubles(tmp_path)
    seen: list[str] = []
    troubles.on_short = seen.append
    troubles.trouble("weather", "it rains")
    assert seen == []
    assert troubles.health.conditions == {}
