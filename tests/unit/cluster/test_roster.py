"""The workers file's rules: a worker lost past the bound, an agent no live worker serves, a hostile file read as
nothing rather than a crash; and the daemon's keeper writing it on a change only, at a bounded rate."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ambient.cluster import keeper as keeper_module
from ambient.cluster.keeper import RosterKeeper
from ambient.cluster.protocol import dispatch_map
from ambient.cluster.roster import FORGET_AFTER_S, Heard, document, heard, roster_from, rows, unserved, view
from ambient.runners.runner_config import parse_runner_config


def _heard(name: str, agents: tuple[str, ...], seen: float, running: tuple[str, ...] = ()) -> Heard:
    return Heard(name, "h", agents, 2, running, seen)


def test_a_worker_is_lost_once_its_heartbeat_is_older_than_the_bound() -> None:
    doc = document([_heard("a", ("x",), 100.0), _heard("b", ("y",), 80.0)], ["x", "y", "z"], 20.0, now=100.0)
    roster = roster_from(json.loads(json.dumps(doc)))
    assert roster is not None
    at_110 = {r.worker: r.lost for r in rows(roster, 110.0)}
    assert at_110 == {"a": False, "b": True}
    assert unserved(roster, 110.0) == ["y", "z"]
    assert unserved(roster, 90.0) == ["z"]
    assert unserved(roster, 200.0) == ["x", "y", "z"]


def test_the_view_keeps_the_running_items_and_the_heartbeat_age() -> None:
    roster = roster_from(document([_heard("a", ("x",), 100.0, ("r/i/1",))], ["x"], 20.0, now=100.0))
    shown = view(roster, 103.0, daemon_up=True)
    assert shown is not None
    assert shown["workers"] == [
        {
            "worker": "a",
            "host": "h",
            "agents": ["x"],
            "slots": 2,
            "running": ["r/i/1"],
            "was_running": [],
            "waiting": [],
            "heartbeat_age_s": 3.0,
            "lost": False,
        }
    ]
    assert view(None, 0.0, daemon_up=True) is None


def test_a_lost_worker_shows_what_it_was_running_and_is_forgotten_after_an_hour() -> None:
    roster = roster_from(document([_heard("a", ("x",), 100.0, ("r/i/1",))], ["x"], 20.0, now=100.0))
    assert roster is not None
    [row] = [r.record() for r in rows(roster, 200.0)]
    assert (row["lost"], row["running"], row["was_running"]) == (True, [], ["r/i/1"])
    assert rows(roster, 100.0 + FORGET_AFTER_S - 1) and not rows(roster, 100.0 + FORGET_AFTER_S + 1)
    assert unserved(roster, 100.0 + FORGET_AFTER_S + 1) == ["x"]


def test_a_worker_waiting_for_dispatch_says_for_which_agents() -> None:
    record = {"worker": "w", "host": "h", "agents": ["x", "helo"], "slots": 1, "running": [], "waiting": ["helo"]}
    found = heard(record, 5.0)
    assert found is not None and found.waiting == ("helo",)
    roster = roster_from(document([found], ["x"], 20.0, now=5.0))
    assert roster is not None and [r.record()["waiting"] for r in rows(roster, 6.0)] == [["helo"]]
    assert heard({**record, "waiting": "helo"}, 5.0) == Heard("w", "h", ("x", "helo"), 1, (), 5.0)


@pytest.mark.parametrize(
    "data",
    [None, [], {"v": 2}, {"v": 1, "written_at": "x"}, {"v": 1, "written_at": 1, "lost_after_s": 1, "dispatched": 1}],
)
def test_a_file_that_is_not_a_roster_is_none(data: Any) -> None:
    assert roster_from(data) is None


def test_an_unreadable_worker_record_is_left_out() -> None:
    data = document([_heard("a", ("x",), 1.0)], [], 20.0, now=1.0)
    data["workers"] += [{"worker": 3}, "no", {"worker": "b", "host": "h", "agents": "x", "slots": 1, "seen": 1}]
    roster = roster_from(data)
    assert roster is not None and [h.worker for h in roster.workers] == ["a"]
    assert heard({"worker": "w", "host": "h", "agents": [], "slots": True}, 0.0) is None


def test_an_agents_own_dispatch_wins_over_the_settings() -> None:
    local = parse_runner_config({"kind": "command", "argv": ["x"], "dispatch": "local"})
    remote = parse_runner_config({"kind": "command", "argv": ["x"], "dispatch": "workers"})
    plain = parse_runner_config({"kind": "command", "argv": ["x"]})
    got = dispatch_map({"a": "workers", "c": "workers"}, {"a": local, "b": remote, "c": plain})
    assert got == {"a": "local", "b": "workers", "c": "workers"}


@dataclass
class _Entry:
    key: str
    value: bytes | None
    operation: str | None = None
    created: datetime | None = None


class _Dispatcher:
    def __init__(self) -> None:
        self.dispatch = {"x": "workers", "y": "local"}
        self.taken: str | None = None

    def dispatches(self, agent: str) -> bool:
        return self.dispatch.get(agent) == "workers"


def test_the_keeper_writes_on_a_change_only_and_forgets_a_stopped_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    mono = [0.0]
    monkeypatch.setattr(keeper_module.time, "monotonic", lambda: mono[0])
    path = tmp_path / "workers.json"
    k = RosterKeeper(path, _Dispatcher(), 20.0, clock=lambda: now[0])  # type: ignore[arg-type]
    k.write()
    assert json.loads(path.read_text())["dispatched"] == ["x"]
    record = {"worker": "w", "host": "h", "agents": ["x"], "slots": 1, "running": [], "at": 5.0}
    stored = datetime.fromtimestamp(990.0, tz=UTC)
    k.take(_Entry("w", json.dumps(record).encode(), created=stored), initial=True)
    k.write()  # within a second of the last write: held back
    assert json.loads(path.read_text())["workers"] == []
    mono[0] = 1.5
    k.write()
    [w] = json.loads(path.read_text())["workers"]
    assert w["seen"] == 990.0  # stored before the daemon looked: the server's time, not the worker's own clock
    before = path.stat().st_mtime_ns
    mono[0] = 3.0
    k.write()  # nothing changed: not written again
    assert path.stat().st_mtime_ns == before
    now[0] = 1010.0
    k.take(_Entry("w", json.dumps(record).encode()), initial=False)
    mono[0] = 4.5
    k.write()
    assert json.loads(path.read_text())["workers"][0]["seen"] == 1010.0
    k.take(_Entry("w", None, operation="DEL"), initial=False)
    mono[0] = 6.0
    k.write()
    assert json.loads(path.read_text())["workers"] == []


def test_a_namespace_another_brain_holds_is_said_instead_of_unserved_agents() -> None:
    said = "the cluster namespace 'default' on this NATS server is used by the brain /srv/a on vm"
    roster = roster_from(json.loads(json.dumps(document([], ["slow"], 20.0, 1_000.0, taken=said))))
    assert roster is not None and roster.taken == said
    shown = view(roster, 1_001.0, daemon_up=True)
    assert shown is not None and shown["taken"] == said and shown["unserved"] == []
    free = view(roster_from(document([], ["slow"], 20.0, 1_000.0)), 1_001.0, daemon_up=True)
    assert free is not None and free["taken"] is None and free["unserved"] == ["slow"]
