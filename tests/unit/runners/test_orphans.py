"""R-01 K1: a daemon killed alone leaves its agents running; the restart stops them before their items run
again, so one item never runs twice at once (identified by pid and start time)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from ambient.storage.paths import BrainPaths
from tests.e2e.helpers import (
    DaemonProcess,
    alive,
    drop,
    events,
    finished_run,
    foreach_workflow,
    make_brain,
    stub_agent_md,
    wait_for,
    witness,
)


@pytest.mark.slow
def test_orphaned_agents_are_reaped_before_their_items_run_again(tmp_path: Path) -> None:
    """kill -9 of the daemon only: on restart the orphans are killed, then the items run again and finish."""
    wit = tmp_path / "witness.log"
    slow = stub_agent_md("slow", ["--witness", str(wit), "--sleep-ms", "60000-60000"])
    paths: BrainPaths = make_brain(tmp_path / "brain", agents={"slow": slow})
    first = DaemonProcess(paths).start()
    try:
        first.wait_ready()
        drop(paths, "orphans.yml", foreach_workflow("orphans", ["a", "b"], agent="slow"))
        spawned = wait_for(
            lambda: (e := events(paths, "orphans", "spawned")) and len(e) == 2 and e, 20, "two agents spawned"
        )
        pids = [int(e["pid"]) for e in spawned]
        assert all(alive(p) for p in pids)
        os.kill(first.pid, signal.SIGKILL)  # K1: the daemon only; its agents keep running
        first.wait(10)
        assert all(alive(p) for p in pids)
    except BaseException:
        first.kill()
        raise
    # The restart runs the same agent fast: only the orphans' sleep made them slow.
    (paths.agents / "slow.md").write_text(stub_agent_md("slow", ["--witness", str(wit), "--sleep-ms", "1-5"]))
    second = DaemonProcess(paths).start()
    try:
        second.wait_ready()
        assert second.logged("orphan_agent_reaped")
        assert not any(alive(p) for p in pids)
        wait_for(lambda: finished_run(paths, "orphans") is not None, 20, "the run to finish")
        state = finished_run(paths, "orphans")
        assert state is not None and state.outcome == "success"
        # The orphans were killed in their sleep: only the runs after the restart reached the witness, under the
        # interrupted attempt's own number (the same idempotency key).
        assert sorted((item, attempt) for item, attempt, _ in witness(wit)) == [("a", 1), ("b", 1)]
    finally:
        second.stop()
        second.kill()


def test_a_workers_agent_on_this_host_is_not_taken_for_an_orphan(tmp_path: Path) -> None:
    """Two processes name this brain and run in their environment; the one an ``ambient worker`` runs for the
    daemon (``AMBIENT_WORKER``) is not the dead daemon's orphan."""
    import subprocess
    import sys

    from ambient.runners import orphans

    base = {"PATH": os.environ.get("PATH", ""), "AMBIENT_BRAIN": str(tmp_path), "AMBIENT_RUN_ID": "run-1"}
    cmd = [sys.executable, "-c", "import time; time.sleep(60)"]
    own = subprocess.Popen(cmd, env={**base, "AMBIENT_ITEM": "mine"})
    remote = subprocess.Popen(cmd, env={**base, "AMBIENT_ITEM": "theirs", "AMBIENT_WORKER": "w1"})
    try:
        found = wait_for(lambda: orphans.by_environment(tmp_path, ["run-1"]), 10, "the daemon's own agent found")
        assert [(o.pid, o.item) for o in found] == [(own.pid, "mine")]
    finally:
        for p in (own, remote):
            p.kill()
            p.wait()
