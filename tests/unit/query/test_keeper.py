"""The daemon's QueryKeeper lists claims/ (tens of thousands of files) at most every ``claims_interval_s``:
journals are refreshed at each tick, the claims caught up later, and at shutdown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ambient.query.store import QueryStore
from ambient.service.querykeeper import QueryKeeper
from ambient.storage.paths import BrainPaths


def _brain(tmp_path: Path) -> BrainPaths:
    paths = BrainPaths(tmp_path / "brain")
    for d in (paths.claims, paths.run_journals, paths.escalations):
        d.mkdir(parents=True)
    paths.state.chmod(0o700)
    return paths


def _claim(paths: BrainPaths, sid: str) -> None:
    tmp = paths.claims / f".{sid}.tmp"
    tmp.write_text(
        f'sess_id: {sid}\ntype: satellite\nscope: x.md\nagent: a\nstatus: open\nopened_at: "2026-11-30T10:00"\n'
    )
    tmp.replace(paths.claims / f"{sid}.yml")


def _journal(paths: BrainPaths, run_id: str) -> None:
    at = "2026-11-30T10:00:00.000+00:00"
    ev = {"ev": "started", "run_id": run_id, "workflow": "wf", "form": "for_each", "spec_hash": None, "spec": {},
          "items": ["a"], "mode": None, "trigger": "file", "context": {}, "at": at}  # fmt: skip
    (paths.run_journals / f"{run_id}.jsonl").write_text(json.dumps(ev) + "\n")


def _claims_in_store(paths: BrainPaths) -> int:
    store = QueryStore(paths)
    try:
        return int(store.conn.execute("SELECT count(*) FROM claims").fetchone()[0])
    finally:
        store.close()


def test_claims_are_refreshed_less_often_than_journals(tmp_path: Path) -> None:
    paths = _brain(tmp_path)
    _claim(paths, "sess-1")
    keeper = QueryKeeper(paths, claims_interval_s=3600)
    assert "claims" in keeper.refresh_once()  # the first refresh has them all
    _claim(paths, "sess-2")
    _journal(paths, "run-1")
    assert keeper.refresh_once() == {"runs", "run:run-1"}  # within the interval: the journals only
    assert _claims_in_store(paths) == 1
    assert keeper.refresh_once(claims=True) == {"claims"}
    _claim(paths, "sess-3")
    keeper.start()  # its thread's refreshes are within the interval: without the claims
    keeper.close()  # no last refresh at shutdown, which must end in time: readers refresh before they read
    assert _claims_in_store(paths) == 2
    reader = QueryKeeper(paths)
    assert "claims" in reader.refresh_once()  # what `ambient status` does first
    reader.close()
    assert _claims_in_store(paths) == 3


def test_without_an_interval_every_refresh_has_the_claims(tmp_path: Path) -> None:
    paths = _brain(tmp_path)
    keeper = QueryKeeper(paths, claims_interval_s=0)
    keeper.refresh_once()
    _claim(paths, "sess-1")
    assert keeper.refresh_once() == {"claims"}
    keeper.close()


def test_listing_the_claims_takes_a_bounded_share_of_a_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Listing claims/ costs more with every claim the brain keeps; the keeper lists them again only once their
    last listing's CPU time is at most ``claims_share`` of the time since, so a daemon with a long history spends
    no more of each run on it than a new one (on top of ``claims_interval_s``)."""
    paths = _brain(tmp_path)
    wall = [100.0]
    cpu = [0.0]
    keeper = QueryKeeper(paths, claims_interval_s=2.0, claims_share=0.05, clocks=(lambda: wall[0], lambda: cpu[0]))
    real = keeper.store.refresh
    listed: list[bool] = []

    def refresh(*, claims: bool = True, build: bool = True) -> set[str]:
        listed.append(claims)
        cpu[0] += 0.5 if claims else 0.01  # a big claims/: half a second of CPU to list it
        return real(claims=claims, build=build)

    monkeypatch.setattr(keeper.store, "refresh", refresh)
    for _ in range(12):  # a refresh a second for 12 s
        keeper.refresh_once()
        wall[0] += 1.0
    keeper.close()
    assert listed.count(True) == 2, listed  # at 0 s and at 10 s (0.5 s of CPU / 0.05), not every 2 s
    assert listed[0] and listed[10]
