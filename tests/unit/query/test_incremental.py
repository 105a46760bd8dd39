"""The query store's incremental refresh (a listing compared with this process's copy of the ``files`` rows, by
(name, inode)) gives the same rows as a store built from the files, whatever happened between two refreshes:
a claim new, replaced by a rename, deleted, made again under its name, a folder where a claim should be, a new
process, another process's refresh, the claims left for later."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ambient.claims.index import census
from ambient.claims.store import ClaimStore
from ambient.query import store as store_module
from ambient.query import views
from ambient.query.store import QueryStore
from ambient.storage.paths import BrainPaths


def _claim(sid: str, status: str = "open") -> str:
    return (
        f"sess_id: {sid}\ntype: satellite\nscope: projects/{sid}.md\nagent: worker\nstatus: {status}\n"
        f'opened_at: "2026-11-30T10:00"\n'
    )


def _write(path: Path, text: str) -> None:
    """As ambient writes: a new file renamed over the old one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


@pytest.fixture
def brain(tmp_path: Path) -> BrainPaths:
    paths = BrainPaths(tmp_path / "brain")
    for d in (paths.claims, paths.run_journals, paths.escalations):
        d.mkdir(parents=True)
    paths.state.chmod(0o700)
    for n in range(5):
        _write(paths.claims / f"sess-{n}.yml", _claim(f"sess-{n}", "closed" if n % 2 else "open"))
    return paths


def _state(conn: sqlite3.Connection) -> tuple[list[Any], ...]:
    claims = conn.execute("SELECT * FROM claims ORDER BY file").fetchall()
    files = conn.execute("SELECT name, inode FROM files WHERE kind='claim' ORDER BY name").fetchall()
    dups = conn.execute("SELECT * FROM claim_dups ORDER BY file").fetchall()
    return claims, files, dups


def _scratch(paths: BrainPaths, tmp_path: Path) -> tuple[list[Any], ...]:
    """The rows of a store built from the files now."""
    db = tmp_path / f"scratch-{os.urandom(4).hex()}.sqlite3"
    store = QueryStore(paths, path=db)
    store.refresh()
    try:
        return _state(store.conn)
    finally:
        store.close()


def _new(p: BrainPaths) -> None:
    _write(p.claims / "sess-new.yml", _claim("sess-new"))


def _renamed_over(p: BrainPaths) -> None:
    _write(p.claims / "sess-0.yml", _claim("sess-0", "closed"))
    _write(p.claims / "sess-1.yml", _claim("sess-1", "open"))  # a closed claim, not looked at unless listed


def _deleted(p: BrainPaths) -> None:
    (p.claims / "sess-2.yml").unlink()
    (p.claims / "sess-3.yml").unlink()


def _made_again(p: BrainPaths) -> None:
    """Deleted and written again in place under the same name: another inode."""
    (p.claims / "sess-4.yml").unlink()
    (p.claims / "sess-4.yml").write_text(_claim("sess-4", "waiting_human"))


def _a_folder(p: BrainPaths) -> None:
    (p.claims / "sess-dir.yml").mkdir()


def _second_file(p: BrainPaths) -> None:
    """A second file of sess-0 (ignored: a problem), and a file of sess-1 named before sess-1.yml (now the first)."""
    _write(p.claims / "sess-0x.yml", _claim("sess-0"))
    _write(p.claims / "a-sess-1.yml", _claim("sess-1", "open"))


def _noise(p: BrainPaths) -> None:
    (p.claims / ".sess-0.yml.tmp").write_text("half")
    (p.claims / "README.md").write_text("not a claim")


STEPS: dict[str, Callable[[BrainPaths], None]] = {
    "new": _new,
    "renamed_over": _renamed_over,
    "deleted": _deleted,
    "made_again": _made_again,
    "a_folder": _a_folder,
    "second_file": _second_file,
    "noise": _noise,
}


@pytest.mark.parametrize("step", list(STEPS))
def test_an_incremental_refresh_gives_the_rows_of_a_rebuild(brain: BrainPaths, tmp_path: Path, step: str) -> None:
    store = QueryStore(brain)
    store.refresh()
    STEPS[step](brain)
    assert store.refresh() == (set() if step == "noise" else {"claims"})
    assert _state(store.conn) == _scratch(brain, tmp_path)
    # Nothing changed since. A folder named as a claim is read (and refused) again whenever claims/ is listed.
    assert store.refresh() in ([set(), {"claims"}] if step == "a_folder" else [set()])
    store.close()


def test_every_step_in_a_row_then_a_new_process(
    brain: BrainPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All the changes one after another on one store object; then one more seen by a new process (no copy of the
    rows yet: read from SQLite)."""
    store = QueryStore(brain)
    store.refresh()
    for step in STEPS.values():
        step(brain)
        store.refresh()
        assert _state(store.conn) == _scratch(brain, tmp_path)
    store.close()
    (brain.claims / "sess-dir.yml").rmdir()  # the folder goes: its row too
    _write(brain.claims / "sess-later.yml", _claim("sess-later"))
    monkeypatch.setattr(store_module, "_COPIES", {})  # a new process
    again = QueryStore(brain)
    assert again.refresh() == {"claims"}
    assert _state(again.conn) == _scratch(brain, tmp_path)
    again.close()


def test_a_copy_made_stale_by_another_process_is_read_again(
    brain: BrainPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Process A knows sess-0 (inode I). It is moved away, process B refreshes (its rows go), it is moved back
    (inode I again, as ext4 may give a new file): A must not trust its copy, which still says sess-0 is I."""
    mine: dict[str, Any] = {}
    monkeypatch.setattr(store_module, "_COPIES", mine)
    a = QueryStore(brain)
    a.refresh()
    aside = tmp_path / "aside.yml"
    os.rename(brain.claims / "sess-0.yml", aside)
    monkeypatch.setattr(store_module, "_COPIES", {})  # another process
    b = QueryStore(brain)
    assert b.refresh() == {"claims"}
    os.rename(aside, brain.claims / "sess-0.yml")
    monkeypatch.setattr(store_module, "_COPIES", mine)
    assert a.refresh() == {"claims"}
    assert _state(a.conn) == _scratch(brain, tmp_path)
    a.close()
    b.close()


def test_store_objects_of_one_process_share_their_copy(brain: BrainPaths, tmp_path: Path) -> None:
    """The daemon's keeper and the console it hosts: each one's refresh keeps the other's copy current."""
    a, b = QueryStore(brain), QueryStore(brain)
    a.refresh()
    b.refresh()
    _new(brain)
    assert a.refresh() == {"claims"}
    _deleted(brain)
    _renamed_over(brain)
    assert b.refresh() == {"claims"}
    _made_again(brain)
    assert a.refresh() == {"claims"}
    assert _state(a.conn) == _state(b.conn) == _scratch(brain, tmp_path)
    a.close()
    b.close()


def test_claims_left_for_later_are_caught_up(brain: BrainPaths, tmp_path: Path) -> None:
    """``refresh(claims=False)`` (the keeper between its claims refreshes) leaves claims/ alone; the next full
    refresh sees what changed meanwhile. A store just built fills its claims anyway."""
    store = QueryStore(brain)
    assert "claims" in store.refresh(claims=False)  # built: every topic, the claims included
    assert _state(store.conn) == _scratch(brain, tmp_path)
    _new(brain)
    _deleted(brain)
    assert store.refresh(claims=False) == set()
    assert store.refresh() == {"claims"}
    assert _state(store.conn) == _scratch(brain, tmp_path)
    store.close()


def test_a_refresh_rolled_back_forgets_its_copy(
    brain: BrainPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refresh that fails midway is rolled back: the next one does not trust what the failed one noted."""
    store = QueryStore(brain)
    store.refresh()
    _new(brain)

    def boom(*args: object) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(store, "_seal_files", boom)  # after the claims were noted
    with pytest.raises(OSError, match="disk on fire"):
        store.refresh()
    monkeypatch.undo()
    assert store.refresh() == {"claims"}
    assert _state(store.conn) == _scratch(brain, tmp_path)
    store.close()


def test_claim_dups_follow_the_census(brain: BrainPaths, tmp_path: Path) -> None:
    """The files ignored as a second file of a sess_id, as the claims census says, through incremental refreshes
    and through a rebuild of many files at once."""
    store = QueryStore(brain)
    store.refresh()
    _second_file(brain)
    store.refresh()
    assert [r[0] for r in _state(store.conn)[2]] == ["claims/sess-0x.yml", "claims/sess-1.yml"]
    (brain.claims / "a-sess-1.yml").unlink()  # sess-1.yml is the first again
    (brain.claims / "sess-0.yml").unlink()  # the copy is now the only file of sess-0
    store.refresh()
    assert _state(store.conn)[2] == []
    for n in range(250):  # many at once: one pass over every sess_id
        _write(brain.claims / f"bulk-{n:03d}.yml", _claim(f"sess-{n % 7}"))
    store.refresh()
    got, built = _state(store.conn), _scratch(brain, tmp_path)
    assert got[1:] == built[1:]  # a rebuild seeds closed claims from the census: their facts only
    assert [r[:3] for r in got[0]] == [r[:3] for r in built[0]]
    seen = census(ClaimStore(brain, check_filesystem=False), save=False)
    with store.reading() as conn:
        counts = views.claim_counts(conn)
    assert [str(p) for p in counts.problems] == [str(p) for p in seen.problems]
    assert counts.count("open") == seen.count("open")
    store.close()
