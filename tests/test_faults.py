"""Issue 24: the README's promises under faults, each scenario as a fault harness would drive it.

The witness of "never twice at once" is the stub agent's ``--overlap-dir``: every agent holds a ``flock`` on
``<dir>/<item>.lock`` while it runs (the kernel drops it when the process dies, kill -9 included), and a second
agent of the same item that finds it held writes a line to ``<dir>/overlaps.log``. Agents of an item that
overlap in time are seen whatever the journal says.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import psutil

from ambient.journal import read_jsonl
from ambient.paths import BrainPaths
from tests.e2e_helpers import (
    DaemonProcess,
    alive,
    drop,
    events,
    finished_run,
    foreach_workflow,
    is_spawner,
    make_brain,
    stub_agent_md,
    wait_for,
)


def overlaps(directory: Path) -> list[str]:
    log = directory / "overlaps.log"
    return log.read_text().splitlines() if log.exists() else []


def agents_started(directory: Path) -> set[str]:
    """Items an agent has started for (each agent creates its item's lock file first)."""
    return {p.stem for p in directory.glob("*.lock")}


def agent_processes(brain: Path) -> list[int]:
    """Live processes whose environment says they are an agent of ``brain`` (read with psutil, not ambient)."""
    out = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("AMBIENT_BRAIN") == str(brain) and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
    return out


def _spawner_of(d: DaemonProcess) -> psutil.Process:
    def find() -> psutil.Process | None:
        try:
            return next((p for p in psutil.Process(d.pid).children() if is_spawner(p)), None)
        except psutil.NoSuchProcess:
            return None

    found: psutil.Process = wait_for(find, 15, "the daemon's spawner process")
    return found


def _accepted(paths: BrainPaths, workflow: str) -> set[str]:
    return {e["item"] for e in events(paths, workflow, "accepted")}


def test_requests_queued_when_the_daemon_dies_start_no_agent(tmp_path: Path) -> None:
    """Issue 24, 1: the spawner keeps no SPAWN request of a dead daemon. The spawner is frozen while the daemon
    asks for 8 agents, the daemon is killed alone, the spawner thawed: it starts none of them (their pids could
    never reach a journal), and the restart runs every item once, never two agents of one item at once."""
    lockdir = tmp_path / "witness"
    lockdir.mkdir()
    stub = stub_agent_md("stub", ["--overlap-dir", str(lockdir), "--sleep-ms", "1500-1500"])
    paths = make_brain(tmp_path / "brain", example_agents=False, agents={"stub": stub}, config="concurrency: 8\n")
    items = [f"i{n}" for n in range(8)]
    first = DaemonProcess(paths).start()
    try:
        first.wait_ready()
        spawner = _spawner_of(first)
        spawner.suspend()
        drop(paths, "queued.yml", foreach_workflow("queued", items, concurrency=8))
        wait_for(lambda: _accepted(paths, "queued") == set(items), 20, "8 attempts accepted, their starts queued")
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        spawner.resume()
        wait_for(lambda: not alive(spawner.pid), 10, "the spawner to exit once its daemon is gone")
    finally:
        first.kill()
        with contextlib.suppress(psutil.Error):
            spawner.kill()
    assert agent_processes(paths.root) == [], "a request queued by a dead daemon started an agent"
    second = DaemonProcess(paths, "--until-idle").start()
    try:
        assert second.wait(60) == 0, second.tail()
    finally:
        second.kill()
    state = finished_run(paths, "queued")
    assert state is not None and state.outcome == "success"
    assert agents_started(lockdir) == set(items)
    assert overlaps(lockdir) == []


def test_an_agent_whose_pid_never_reached_the_journal_is_stopped_before_its_item_runs_again(tmp_path: Path) -> None:
    """Issue 24, 1: a kill between an agent's start and its ``spawned`` record leaves an agent no journal names.
    The restart finds it by its environment (AMBIENT_BRAIN, AMBIENT_RUN_ID) and stops it before the item runs."""
    lockdir = tmp_path / "witness"
    lockdir.mkdir()
    slow = stub_agent_md("stub", ["--overlap-dir", str(lockdir), "--sleep-ms", "60000-60000"])
    paths = make_brain(tmp_path / "brain", example_agents=False, agents={"stub": slow})
    first = DaemonProcess(paths).start()
    try:
        first.wait_ready()
        drop(paths, "lost.yml", foreach_workflow("lost", ["a", "b", "c"], concurrency=3))
        spawned = wait_for(lambda: len(e := events(paths, "lost", "spawned")) == 3 and e, 20, "3 agents spawned")
        pids = [int(e["pid"]) for e in spawned]
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        first.known_children.update(pids)
    except BaseException:
        first.kill()
        raise
    # As if the kill had come before the records: the journal no longer names those agents.
    journal = next(paths.run_journals.glob("*.jsonl"))
    kept = [line for line in journal.read_text().splitlines(keepends=True) if '"ev":"spawned"' not in line]
    journal.write_text("".join(kept))
    assert not [r for r in read_jsonl(journal).records if r.get("ev") == "spawned"]
    assert all(alive(p) for p in pids)
    (paths.agents / "stub.md").write_text(stub_agent_md("stub", ["--overlap-dir", str(lockdir), "--sleep-ms", "1-5"]))
    second = DaemonProcess(paths, "--until-idle").start()
    try:
        assert second.wait(60) == 0, second.tail()
        reaped = second.logged("orphan_agent_reaped", found_by="environment")
    finally:
        second.kill()
        first.kill()
    assert sorted(int(r["pid"]) for r in reaped) == sorted(pids)
    assert not any(alive(p) for p in pids)
    assert overlaps(lockdir) == []
    state = finished_run(paths, "lost")
    assert state is not None and state.outcome == "success"
