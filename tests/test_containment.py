"""Issue 25: agents are untrusted code; attacks as an agent would make them, against the real daemon.

Each test runs real agent processes under a real ``ambient run`` and checks what the agent could do afterwards
from the outside (process table, files, the daemon's answers).
"""

from __future__ import annotations

from pathlib import Path

from tests.e2e_helpers import (
    DaemonProcess,
    alive,
    drop,
    events,
    finished_run,
    foreach_workflow,
    make_brain,
    stub_agent_md,
    wait_for,
)


def _pids(pid_file: Path) -> list[int]:
    return [int(x) for x in pid_file.read_text().split()] if pid_file.exists() else []


def _escaping_agent(pid_file: Path, mode: str, **kw: float) -> str:
    return stub_agent_md("stub", ["--mode", mode, "--setsid", "--children", "2", "--pid-file", str(pid_file)], **kw)


def test_a_setsid_grandchild_ends_with_its_agent(tmp_path: Path) -> None:
    """Issue 25, 4: an agent answers and exits, leaving two children that called ``setsid()`` (one double-forked):
    outside its process group, a group kill never reached them, and they outlived the item for good. They end
    with their agent now."""
    pid_file = tmp_path / "grandchildren"
    paths = make_brain(tmp_path / "brain", example_agents=False, agents={"stub": _escaping_agent(pid_file, "orphan")})
    d = DaemonProcess(paths).start()
    try:
        d.wait_ready()
        drop(paths, "escape.yml", foreach_workflow("escape", ["a"]))
        wait_for(lambda: finished_run(paths, "escape") is not None, 30, "the run to finish")
        kids = wait_for(lambda: len(p := _pids(pid_file)) == 2 and p, 10, "the grandchildren's pids")
        d.known_children.update(kids)
        wait_for(lambda: not any(alive(p) for p in kids), 15, "the escaped grandchildren to end with their agent")
    finally:
        d.stop()
        d.kill()
    state = finished_run(paths, "escape")
    assert state is not None and state.outcome == "success"


def test_a_setsid_grandchild_of_a_timed_out_agent_ends_with_it(tmp_path: Path) -> None:
    """Issue 25, 4: the agent hangs past its timeout with two escaped children; the timeout kills its group, and
    the escaped ones end too."""
    pid_file = tmp_path / "grandchildren"
    agent = _escaping_agent(pid_file, "fork", timeout_s=1, kill_grace_s=0.2)
    paths = make_brain(tmp_path / "brain", example_agents=False, agents={"stub": agent})
    d = DaemonProcess(paths).start()
    try:
        d.wait_ready()
        drop(paths, "hang.yml", foreach_workflow("hang", ["a"]))
        kids = wait_for(lambda: len(p := _pids(pid_file)) == 2 and p, 20, "the grandchildren's pids")
        d.known_children.update(kids)
        wait_for(lambda: events(paths, "hang", "finished"), 30, "the timeout")
        wait_for(lambda: not any(alive(p) for p in kids), 15, "the escaped grandchildren to end")
    finally:
        d.stop()
        d.kill()


def test_a_setsid_grandchild_is_stopped_with_the_daemon(tmp_path: Path) -> None:
    """Issue 25, 4: a daemon stopped by SIGTERM while an agent runs leaves nothing of it behind, escaped children
    included (a kill -9 of the daemon is the other case: its agents are orphans the next start stops)."""
    pid_file = tmp_path / "grandchildren"
    paths = make_brain(tmp_path / "brain", example_agents=False, agents={"stub": _escaping_agent(pid_file, "fork")})
    d = DaemonProcess(paths).start()
    try:
        d.wait_ready()
        drop(paths, "hang.yml", foreach_workflow("hang", ["a"]))
        kids = wait_for(lambda: len(p := _pids(pid_file)) == 2 and p, 20, "the grandchildren's pids")
        d.known_children.update(kids)
        assert d.stop() == 0, d.tail()
        wait_for(lambda: not any(alive(p) for p in kids), 15, "the escaped grandchildren to end with the daemon")
    finally:
        d.kill()
