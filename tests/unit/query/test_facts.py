"""The brain's facts kept in the query store (``ambient.query.facts``): loaded once, kept while the files and
``AMBIENT_*`` variables they come from are unchanged, loaded again when one changes; never kept from files changed
too recently for their mtime to tell."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ambient.query.facts import BrainFacts, brain_facts, inputs
from ambient.query.store import QueryStore
from ambient.storage.paths import BrainPaths

OLD_NS = 1_700_000_000 * 10**9  # long ago: an mtime that tells a later change


def _age(paths: BrainPaths) -> None:
    """Every input file written long ago (a file written just now is racy: its facts are not kept)."""
    for folder in (paths.workflows, paths.agents, paths.profil):
        for name in os.listdir(folder):
            os.utime(folder / name, ns=(OLD_NS, OLD_NS), follow_symlinks=False)


@pytest.fixture
def paths(tmp_path: Path) -> BrainPaths:
    paths = BrainPaths(tmp_path / "brain")
    for folder in (paths.workflows, paths.agents, paths.profil, paths.state):
        folder.mkdir(parents=True)
    (paths.workflows / "ship.yml").write_text("workflow: ship\n")
    (paths.agents / "deploy.md").write_text("# deploy\n")
    (paths.config).write_text("notify: {}\n")
    _age(paths)
    return paths


@pytest.fixture
def store(paths: BrainPaths) -> Iterator[QueryStore]:
    store = QueryStore.fresh(paths)
    yield store
    store.close()


class Loader:
    """A stand-in for loading the brain: counts its calls, returns the facts it is given."""

    def __init__(self, facts: BrainFacts) -> None:
        self.facts = facts
        self.calls = 0

    def __call__(self) -> BrainFacts:
        self.calls += 1
        return self.facts


FACTS = BrainFacts(notifications=True, broken=(("workflows/ship.yml", ("ship", "ship-old")),))


def test_facts_are_loaded_once_and_kept_while_nothing_changed(paths: BrainPaths, store: QueryStore) -> None:
    load = Loader(FACTS)
    assert brain_facts(store, {}, load) == FACTS
    assert brain_facts(store, {}, load) == FACTS
    assert load.calls == 1
    store.close()
    again = QueryStore.fresh(paths)  # another command, the same store on disk
    try:
        assert brain_facts(again, {}, load) == FACTS
    finally:
        again.close()
    assert load.calls == 1


@pytest.mark.parametrize(
    "change",
    [
        lambda p: (p.workflows / "ship.yml").write_text("workflow: ship\nfor_each: {}\n"),
        lambda p: (p.workflows / "new.yml").write_text("workflow: new\n"),
        lambda p: (p.workflows / "ship.yml").unlink(),
        lambda p: (p.agents / "review.md").write_text("# review\n"),
        lambda p: p.config.write_text("notify: {urls: [x]}\n"),
        lambda p: (p.profil / "zones.yml").write_text("{}\n"),
    ],
    ids=["workflow edited", "workflow added", "workflow removed", "agent added", "settings edited", "zones added"],
)
def test_facts_are_loaded_again_when_a_file_they_come_from_changes(
    paths: BrainPaths, store: QueryStore, change: object
) -> None:
    first = Loader(FACTS)
    brain_facts(store, {}, first)
    change(paths)  # type: ignore[operator]
    _age(paths)
    second = Loader(BrainFacts(notifications=False, broken=()))
    assert brain_facts(store, {}, second) == second.facts
    assert second.calls == 1
    assert brain_facts(store, {}, second) == second.facts and second.calls == 1  # and those are kept


def test_facts_are_loaded_again_when_an_ambient_variable_changes(store: QueryStore) -> None:
    load = Loader(FACTS)
    brain_facts(store, {"HOME": "/a", "AMBIENT_NOTIFY_URLS": "x"}, load)
    brain_facts(store, {"HOME": "/b", "AMBIENT_NOTIFY_URLS": "x"}, load)  # not one of ambient's: same facts
    assert load.calls == 1
    brain_facts(store, {"AMBIENT_NOTIFY_URLS": "y"}, load)
    assert load.calls == 2


def test_facts_of_a_file_changed_just_now_are_not_kept(paths: BrainPaths, store: QueryStore) -> None:
    (paths.workflows / "ship.yml").write_text("workflow: ship\n# edited\n")  # its mtime is now
    assert inputs(paths, {}) is None
    load = Loader(FACTS)
    brain_facts(store, {}, load)
    brain_facts(store, {}, load)
    assert load.calls == 2


def test_kept_facts_that_do_not_parse_are_loaded_again(store: QueryStore) -> None:
    load = Loader(FACTS)
    brain_facts(store, {}, load)
    with store.writing() as conn:
        conn.execute("UPDATE brain_facts SET value='{\"broken\": 3}' WHERE key='facts'")
    assert brain_facts(store, {}, load) == FACTS
    assert load.calls == 2


def test_a_brain_without_its_folders_has_a_signature(tmp_path: Path) -> None:
    paths = BrainPaths(tmp_path / "empty")
    assert inputs(paths, {}) == inputs(paths, {})
    assert BrainFacts.from_json(BrainFacts(notifications=False, broken=()).to_json()) == BrainFacts(False, ())
    assert BrainFacts.from_json("not json") is None
