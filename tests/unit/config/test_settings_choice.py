"""Which settings a daemon runs with (choose_settings, pure), and the last good copy it falls back to."""

from __future__ import annotations

import stat
from datetime import UTC, datetime
from pathlib import Path

from ambient.config.brain import (
    LastGood,
    SettingsFile,
    choose_settings,
    keep_last_good,
    read_last_good,
    read_settings,
)
from ambient.config.settings import Settings, settings_salvaged
from ambient.core.problems import Problem
from ambient.storage.paths import BrainPaths

_WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
_SYNTAX = SettingsFile(None, [Problem(file="profil/ambient.yml", line=3, message="expected valid YAML")], "d")


def _file(**values: object) -> SettingsFile:
    return SettingsFile(Settings.model_validate(values), [], "digest")


def _typo(**values: object) -> SettingsFile:
    problem = Problem(file="profil/ambient.yml", line=1, message="concurency: unknown")
    return SettingsFile(None, [problem], "digest", salvaged=settings_salvaged(values, {}))


def _last_good(**values: object) -> LastGood:
    return LastGood(_file(**values), _WHEN, ".ambient/settings.last-good.yml")


def test_a_file_that_validates_wins_over_everything() -> None:
    chosen = choose_settings(
        _file(tick_seconds=5), {}, last_good=_last_good(tick_seconds=9), previous=(Settings(tick_seconds=7), None)
    )
    assert (chosen.origin, chosen.settings.tick_seconds, chosen.last_good) == ("file", 5, None)


def test_a_file_that_does_not_parse_runs_on_the_last_good_copy_at_start_and_at_reload() -> None:
    at_start = choose_settings(_SYNTAX, {}, last_good=_last_good(agent_user="root"))
    assert (at_start.origin, at_start.settings.agent_user) == ("last_good", "root")
    assert at_start.last_good is not None and at_start.last_good.saved_at == _WHEN
    assert at_start.source is at_start.last_good.file  # what daemon.json records: the copy's digest and values
    at_reload = choose_settings(_SYNTAX, {}, last_good=_last_good(agent_user="root"), previous=(Settings(), None))
    assert (at_reload.origin, at_reload.settings.agent_user) == ("last_good", "root")


def test_a_value_error_keeps_the_valid_keys_at_start_and_the_previous_settings_at_reload() -> None:
    """Only a file with nothing to salvage falls back to the last good copy."""
    at_start = choose_settings(_typo(tick_seconds=5), {}, last_good=_last_good(tick_seconds=9))
    assert (at_start.origin, at_start.settings.tick_seconds) == ("salvaged", 5)
    previous = Settings(tick_seconds=7)
    at_reload = choose_settings(
        _typo(tick_seconds=5), {}, last_good=_last_good(tick_seconds=9), previous=(previous, None)
    )
    assert (at_reload.origin, at_reload.settings) == ("previous", previous)


def test_without_a_last_good_copy_a_file_that_does_not_parse_leaves_the_defaults_and_the_environment() -> None:
    chosen = choose_settings(_SYNTAX, {"AMBIENT_CONCURRENCY": "7"})
    assert (chosen.origin, chosen.settings.concurrency, chosen.settings.tick_seconds) == ("defaults", 7, 30.0)
    assert choose_settings(_SYNTAX, {}, previous=(Settings(tick_seconds=7), None)).origin == "previous"


def _brain(tmp_path: Path, text: str) -> BrainPaths:
    paths = BrainPaths(tmp_path)
    paths.config.parent.mkdir(parents=True, exist_ok=True)
    paths.state.mkdir(mode=0o700, exist_ok=True)
    paths.config.write_text(text)
    return paths


def test_the_copy_is_the_files_bytes_private_written_only_when_they_change(tmp_path: Path) -> None:
    text = 'notify:\n  urls: ["json://127.0.0.1:9/x?token=s"]  # kept as written\n'
    paths = _brain(tmp_path, text)
    assert keep_last_good(paths, read_settings(paths, {})) is True
    assert paths.last_good_config.read_text() == text
    assert stat.S_IMODE(paths.last_good_config.stat().st_mode) == 0o600
    assert keep_last_good(paths, read_settings(paths, {})) is False  # the same bytes: not written again
    paths.config.write_text(text + "tick_seconds: [1\n")
    copy = read_last_good(paths, {"AMBIENT_CONCURRENCY": "7"})
    assert copy is not None and copy.source == ".ambient/settings.last-good.yml"
    assert copy.file.settings is not None and copy.file.settings.concurrency == 7  # the environment on top
    assert [u.get_secret_value() for u in copy.file.settings.notify.urls] == ["json://127.0.0.1:9/x?token=s"]


def test_an_absent_file_loads_as_defaults_and_drops_the_copy(tmp_path: Path) -> None:
    paths = _brain(tmp_path, "tick_seconds: 5\n")
    keep_last_good(paths, read_settings(paths, {}))
    paths.config.unlink()
    assert keep_last_good(paths, read_settings(paths, {})) is False
    assert read_last_good(paths, {}) is None
