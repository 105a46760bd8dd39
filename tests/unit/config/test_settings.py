"""Settings salvaged from a file that does not validate (pure: no I/O)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambient.config.settings import Settings, settings_salvaged


def test_a_typo_loses_only_itself() -> None:
    """An unknown key and a bad value fall back to their defaults; every other key of the file is kept."""
    s = settings_salvaged(
        {"concurency": 3, "tick_seconds": "soon", "notify": {"urls": ["json://127.0.0.1:9/x"], "digest": "maybe"}},
        {},
    )
    assert [u.get_secret_value() for u in s.notify.urls] == ["json://127.0.0.1:9/x"]
    assert (s.tick_seconds, s.notify.digest, s.concurrency) == (30.0, False, 4)


def test_a_bad_section_falls_back_whole_and_the_environment_still_wins() -> None:
    s = settings_salvaged({"telegram": "on", "concurrency": 0}, {"AMBIENT_CONCURRENCY": "7"})
    assert s.telegram.answers is False and s.concurrency == 7


_values = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 500), st.text(max_size=8), st.lists(st.integers(), max_size=2)
)
_keys = st.sampled_from(
    ["tick_seconds", "concurrency", "concurency", "log_level", "notify", "telegram", "runners", "x"]
)


@given(
    st.dictionaries(_keys, st.one_of(_values, st.dictionaries(st.text(max_size=6), _values, max_size=3)), max_size=6)
)
@pytest.mark.slow
def test_any_mapping_gives_settings_and_valid_ones_are_unchanged(data: dict[str, object]) -> None:
    """Whatever the file holds, salvage gives settings; a file that validates is taken as it is."""
    s = settings_salvaged(data, {})
    assert isinstance(s, Settings)
    try:
        valid = Settings.model_validate(data)
    except ValueError:
        return
    assert s == valid


def test_a_bad_environment_value_gives_the_files_own_back() -> None:
    """AMBIENT_CONCURRENCY=abc is dropped, not the file's valid `concurrency: 1` with it."""
    assert settings_salvaged({"concurrency": 1}, {"AMBIENT_CONCURRENCY": "abc"}).concurrency == 1


def test_learning_pattern_after_is_read_and_bounded() -> None:
    """How many commands of one shape before a pattern is offered: 3 by default, 0 turns offers off, a value out of
    bounds falls back to the default (and `ambient validate` names it)."""
    assert Settings().learning.pattern_after == 3
    assert settings_salvaged({"learning": {"pattern_after": 0}}, {}).learning.pattern_after == 0
    assert settings_salvaged({"learning": {"pattern_after": 5, "auto_repeats": 2}}, {}).learning.pattern_after == 5
    assert settings_salvaged({"learning": {"pattern_after": -1}}, {}).learning.pattern_after == 3
