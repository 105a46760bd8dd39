"""README "Concepts", docs/workflows.md "When a workflow runs", docs/reliability.md "Durable by design": drop a
workflow and it runs, when a workflow runs, pinned specs, validation, durability."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import yaml

from tests.acceptance.harness import Brain, Daemon, wait

# A worker that notes each start (its idempotency key and the context it was given) in work/<item>.log, then
# waits for the brain file named by context.wait_for (if any) before it answers ok.
WORKER = """
    import json, os, pathlib, sys, time
    packet = json.load(sys.stdin)
    ctx = packet["payload"]["context"]
    brain = pathlib.Path(os.environ["AMBIENT_BRAIN"])
    item = os.environ["AMBIENT_ITEM"]
    log = brain / "work" / (item + ".log")
    log.parent.mkdir(exist_ok=True)
    with log.open("a") as f:
        f.write(json.dumps({"key": os.environ["AMBIENT_KEY"], "attempt": os.environ["AMBIENT_ATTEMPT"],
                            "run": os.environ["AMBIENT_RUN_ID"], "context": ctx}) + "\\n")
    if ctx.get("fail") == item:
        sys.exit(1)
    if ctx.get("crash_first") == item and os.environ["AMBIENT_ATTEMPT"] == "1":
        sys.exit(3)
    gate = ctx.get("wait_for")
    if gate and ctx.get("hold", item) == item:
        while not (brain / gate).exists():
            time.sleep(0.05)
    print(json.dumps({"status": "ok", "item": item}))
"""


def fan_out(name: str, items: list[str], *, extra: str = "", **context: str) -> str:
    """A for_each workflow of the worker over ``items``, its context given as strings."""
    ctx = ", ".join(f"{k}: {json.dumps(v)}" for k, v in {"item": "{{item}}", **context}.items())
    return (
        f"workflow: {name}\n"
        "for_each:\n"
        f"  items: {json.dumps(items)}\n"
        "  spawn: worker\n"
        '  scope: {zone: project, files: ["work/{{item}}.log"]}\n'
        f"  context: {{{ctx}}}\n"
        f"{extra}"
    )


def starts(brain: Brain, item: str) -> list[dict[str, Any]]:
    """What the worker noted each time it started on ``item``."""
    path = brain.path(f"work/{item}.log")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def sha256(brain: Brain, rel: str) -> str:
    return hashlib.sha256(brain.path(rel).read_bytes()).hexdigest()


def item_status(brain: Brain, workflow: str) -> dict[str, str]:
    """Item → status of the workflow's run in progress (`ambient status --json`), {} if none."""
    for run in brain.status()["runs"]:
        if run["workflow"] == workflow:
            return {i["name"]: i["status"] for i in run["items"]}
    return {}


def journal_started(brain: Brain, run_id: str) -> dict[str, Any]:
    """The `started` record of a run's event journal (.ambient/runs/<run>.jsonl)."""
    first = brain.path(f".ambient/runs/{run_id}.jsonl").read_text().splitlines()[0]
    record: dict[str, Any] = json.loads(first)
    return record


# ---------------------------------------------------------------- drop a workflow file and it runs


def test_a_workflow_dropped_into_a_running_daemon_runs(brain: Brain) -> None:
    """Drop a workflow file into `workflows/` and it runs: agents spawned, a claim per item, every event recorded."""
    brain.python_agent("worker", WORKER)
    with brain.daemon():
        brain.workflow("refresh", fan_out("refresh", ["api", "web"]))
        [record] = brain.wait_finished("refresh")
        # Live turns are written in batches a moment later: read the thread while the daemon runs.
        turns = wait(
            lambda: (t := brain.ok("thread", "worker", "--json", "--limit", "0").json()["turns"]) and len(t) >= 4 and t,
            "the four turns in the worker's thread",
        )
    assert record["outcome"] == "success", record
    assert {s["item"] for s in record["steps"]} == {"api", "web"}
    for item in ("api", "web"):
        assert [s["context"]["item"] for s in starts(brain, item)] == [item]
    run_id = record["run_id"]
    claims = sorted(p.name for p in brain.path("claims").glob(f"{run_id}*.yml"))
    assert len(claims) == 3, claims  # the run's claim and one per item
    events = [json.loads(line)["ev"] for line in brain.read(f".ambient/runs/{run_id}.jsonl").splitlines()]
    assert events[0] == "started" and events[-1] == "finished_run" and events.count("accepted") == 2, events
    delivered = sorted((t["signal"], t["correlation_id"]) for t in turns)  # every packet went through the router
    assert delivered == sorted((sig, f"{run_id}/{item}/1") for sig in ("SPAWN", "RETURN") for item in ("api", "web"))


def test_a_draft_workflow_never_runs_by_itself(brain: Brain) -> None:
    """`status: draft`: a workflow seen for the first time starts one run, unless it is a draft (nor on a schedule)."""
    brain.config("tick_seconds: 0.2\n")
    brain.python_agent("worker", WORKER)
    brain.workflow("sketch", "status: draft\n" + fan_out("sketch", ["draft-item"], extra="schedule: {every: 1s}\n"))
    brain.workflow("ticker", fan_out("ticker", ["tick"], extra="schedule: {every: 1s}\n"))
    with brain.daemon():
        brain.wait_finished("ticker", count=2)  # the daemon saw both files, and its schedules came due
    assert brain.finished("sketch") == []
    assert starts(brain, "draft-item") == []
    assert brain.ok("validate").rc == 0  # a draft is loaded and validated all the same


def test_a_workflow_runs_once_when_first_seen_then_on_ambient_start(brain: Brain) -> None:
    """A workflow seen for the first time starts one run; after that a run starts with `ambient start NAME`."""
    brain.python_agent("worker", WORKER)
    brain.workflow("once", fan_out("once", ["only"]))
    brain.until_idle()
    assert len(brain.finished("once")) == 1
    brain.until_idle()  # the daemon again: it has seen the file, so nothing starts
    brain.workflow("once", fan_out("once", ["only"], note="edited"))  # nor does an edit of it
    brain.until_idle()
    assert len(brain.finished("once")) == 1
    assert len(starts(brain, "only")) == 1
    res = brain.ok("start", "once")
    assert "once" in res.out
    brain.until_idle()
    runs = brain.finished("once")
    assert len(runs) == 2 and all(r["outcome"] == "success" for r in runs), runs
    assert len(starts(brain, "only")) == 2


def test_ambient_start_starts_a_run_in_the_running_daemon(brain: Brain) -> None:
    """`ambient start NAME` starts a run of an already seen workflow in the running daemon."""
    brain.python_agent("worker", WORKER)
    brain.workflow("again", fan_out("again", ["x"]))
    with brain.daemon():
        brain.wait_finished("again")
        brain.ok("start", "again")
        runs = brain.wait_finished("again", count=2)
    assert len({r["run_id"] for r in runs}) == 2
    assert len(starts(brain, "x")) == 2


def test_an_orchestrate_packet_starts_a_run(brain: Brain, tmp_path: Path) -> None:
    """After the first run, a run starts with an ORCHESTRATE packet (`ambient send`) as with `ambient start`."""
    brain.python_agent("worker", WORKER)
    brain.workflow("ordered", fan_out("ordered", ["x"]))
    packet = tmp_path / "orchestrate.yml"
    packet.write_text("from: human\nto: ambient\nsignal: ORCHESTRATE\npayload: {context: {workflow: ordered}}\n")
    with brain.daemon():
        brain.wait_finished("ordered")
        sent = brain.cli("send", str(packet))
        assert sent.rc == 0, sent
        runs = brain.wait_finished("ordered", count=2)
    assert len({r["run_id"] for r in runs}) == 2 and all(r["outcome"] == "success" for r in runs), runs


def test_a_schedule_starts_runs_again(brain: Brain) -> None:
    """`schedule: {every: ...}` starts the next run when due, with nobody asking."""
    brain.config("tick_seconds: 0.2\n")
    brain.python_agent("worker", WORKER)
    brain.workflow("heartbeat", fan_out("heartbeat", ["beat"], extra="schedule: {every: 1s}\n"))
    with brain.daemon():
        runs = brain.wait_finished("heartbeat", count=3)
    assert len({r["run_id"] for r in runs}) >= 3
    assert all(r["outcome"] == "success" for r in runs)
    keys = [s["key"] for s in starts(brain, "beat")]
    assert len(keys) == len(set(keys)) >= 3  # each run its own key


def test_a_running_item_holds_the_lock_on_its_scope_and_has_its_claim(brain: Brain) -> None:
    """Ambient guards writes with the lock mutex and opens a claim per item: written within 1 s while it runs
    (a little more when the CPU is short), closed with its result when it ends."""
    brain.python_agent("worker", WORKER)
    brain.workflow("guarded", fan_out("guarded", ["held"], wait_for="release"))
    with brain.daemon():
        [started] = wait(lambda: starts(brain, "held"), "the agent to start")
        run_id = started["run"]
        claim = brain.path(f"claims/{run_id}-item-001.yml")
        wait(claim.exists, "the running item's claim")
        written_after = claim.stat().st_mtime - brain.path("work/held.log").stat().st_mtime
        view = yaml.safe_load(claim.read_text())
        assert view["status"] == "open" and view["agent"] == "worker" and view["scope"] == "work/held.log", view
        held = brain.cli("lock", "check", "work/held.log")
        assert held.rc == 1, held  # held by the running item
        brain.write("release", "go\n")
        brain.wait_finished("guarded")
        wait(lambda: yaml.safe_load(claim.read_text())["status"] == "closed", "the item's claim to close")
        free = brain.cli("lock", "check", "work/held.log")
        assert free.rc == 0, free
    assert written_after <= 3.0, written_after  # 1 s promised; slack for a loaded shared machine
    assert yaml.safe_load(claim.read_text())["result"]["status"] == "ok"


def test_blocked_on_waits_for_you_and_resumes_once_unblocked(brain: Brain) -> None:
    """blocked → `BLOCKED_ON` → you unblock → ambient resumes."""
    brain.python_agent(
        "needy",
        """
        import json, os, pathlib, sys
        json.load(sys.stdin)
        if not pathlib.Path(os.environ["AMBIENT_BRAIN"], "ssh-key").exists():
            print(json.dumps({"signal": "BLOCKED_ON", "context": {"missing": "ssh-key"}}))
        else:
            print(json.dumps({"status": "ok"}))
    """,
    )
    brain.workflow(
        "needs",
        """
        workflow: needs
        for_each:
          items: [vps-1]
          spawn: needy
          scope: {zone: project, files: ["work/{{item}}.log"]}
    """,
    )
    with brain.daemon():
        [esc] = brain.wait_escalation("the BLOCKED_ON")
        assert esc["kind"] == "blocked" and esc["item"] == "vps-1", esc
        assert brain.finished("needs") == []
        brain.write("ssh-key", "the key\n")  # the person unblocks it...
        assert brain.decide(esc["id"], "retry").rc == 0  # ...and says so
        [record] = brain.wait_finished("needs")
    assert record["outcome"] == "success", record


def thread_nices(pid: int) -> list[int]:
    """The nice value of each thread of a process (what `ps -L -o nice` shows)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out.append(int((task / "stat").read_text().rsplit(") ", 1)[1].split()[16]))
        except (OSError, IndexError, ValueError):
            continue
    return out


def test_the_claim_writer_and_the_live_context_writer_run_ten_nice_steps_below_the_daemon(brain: Brain) -> None:
    """The claims' writer thread and the live-context writer run ten nice steps below the daemon (Linux)."""
    brain.python_agent("worker", WORKER)
    brain.workflow("nice", fan_out("nice", ["a", "b"]))
    with brain.daemon() as daemon:
        brain.wait_finished("nice")
        base = int(Path(f"/proc/{daemon.pid}/stat").read_text().rsplit(") ", 1)[1].split()[16])
        wait(lambda: thread_nices(daemon.pid).count(base + 10) >= 2, "two threads ten nice steps below")
        assert thread_nices(daemon.pid).count(base) >= 1  # the event loop stays at the daemon's own priority


# ---------------------------------------------------------------- pinned specs, validation


def test_editing_a_workflow_never_disturbs_a_running_run(brain: Brain) -> None:
    """Editing a workflow never disturbs a running run: it is pinned (sha256 and content in the journal); new runs
    take the new version."""
    brain.python_agent("worker", WORKER)
    brain.workflow("pinned", fan_out("pinned", ["a"], version="v1", wait_for="release"))
    v1_hash = sha256(brain, "workflows/pinned.yml")
    with brain.daemon() as daemon:
        wait(lambda: starts(brain, "a"), "the agent of item a to start")
        reloads = len(daemon.logged("reloaded"))
        brain.workflow("pinned", fan_out("pinned", ["a", "b"], version="v2", wait_for="release"))
        v2_hash = sha256(brain, "workflows/pinned.yml")
        daemon.wait_log("reloaded", count=reloads + 1)
        brain.write("release", "go\n")
        [first] = brain.wait_finished("pinned")
        assert first["outcome"] == "success", first
        assert {s["item"] for s in first["steps"]} == {"a"}  # v2's item b is not part of it
        assert first["spec_hash"] == v1_hash
        started = journal_started(brain, first["run_id"])
        assert started["spec_hash"] == v1_hash
        assert started["spec"]["for_each"]["context"]["version"] == "v1"
        brain.ok("start", "pinned")
        runs = brain.wait_finished("pinned", count=2)
    second = next(r for r in runs if r["run_id"] != first["run_id"])
    assert second["spec_hash"] == v2_hash
    assert {s["item"] for s in second["steps"]} == {"a", "b"}
    assert [s["context"]["version"] for s in starts(brain, "a")] == ["v1", "v2"]
    assert [s["context"]["version"] for s in starts(brain, "b")] == ["v2"]


def test_a_workflow_that_fails_validation_is_reported_at_its_line_and_the_previous_version_keeps_serving(
    brain: Brain,
) -> None:
    """A file that fails validation is reported with file:line and never half-loaded; a previous good version keeps
    serving."""
    brain.python_agent("worker", WORKER)
    brain.workflow("served", fan_out("served", ["a"], version="v1"))
    v1_hash = sha256(brain, "workflows/served.yml")
    with brain.daemon() as daemon:
        brain.wait_finished("served")
        broken = fan_out("served", ["a", "b"], version="v2", extra="timeout: whenever\n")
        assert broken.splitlines()[6] == "timeout: whenever"  # line 7
        brain.workflow("served", broken)
        [problem] = daemon.wait_log("brain_problem")
        assert "workflows/served.yml:7" in problem["problem"], problem
        res = brain.cli("validate")
        assert res.rc == 1, res
        assert "workflows/served.yml:7:" in res.out, res
        started = brain.ok("start", "served")  # the version the daemon serves starts, and you are told so
        assert "workflows/served.yml:7" in started.err and f"loaded before (sha256 {v1_hash[:12]})" in started.err
        runs = brain.wait_finished("served", count=2)
    assert [r["spec_hash"] for r in runs] == [v1_hash, v1_hash]
    assert all(r["outcome"] == "success" for r in runs), runs
    assert [s["context"]["version"] for s in starts(brain, "a")] == ["v1", "v1"]
    assert starts(brain, "b") == []  # nothing of the broken version was loaded


def test_a_workflow_broken_from_the_start_never_runs(brain: Brain) -> None:
    """A file that fails validation is never half-loaded: it does not run and says file:line why; fixed, it runs."""
    brain.python_agent("worker", WORKER)
    brain.workflow("bad", fan_out("bad", ["a"], extra="retry: {attempts: 2, on: [error], sometimes: true}\n"))
    brain.workflow("good", fan_out("good", ["g"]))
    res = brain.until_idle()
    assert "workflows/bad.yml:7" in res.err, res
    assert len(brain.finished("good")) == 1
    assert brain.finished("bad") == []
    assert starts(brain, "a") == []
    validate = brain.cli("validate")
    assert validate.rc == 1 and "workflows/bad.yml:7:" in validate.out, validate
    brain.workflow("bad", fan_out("bad", ["a"]))  # fixed: now it is seen for the first time, and runs once
    brain.until_idle()
    assert [r["outcome"] for r in brain.finished("bad")] == ["success"]


# ---------------------------------------------------------------- durable by design


def test_each_spawn_carries_the_idempotency_key_run_item_attempt(brain: Brain) -> None:
    """Each SPAWN carries an idempotency key `run/item/attempt` in AMBIENT_KEY."""
    brain.python_agent("worker", WORKER)
    brain.workflow(
        "keys",
        fan_out(
            "keys", ["steady", "flaky"], crash_first="flaky", extra="retry: {attempts: 2, backoff: 0.1s, on: [error]}\n"
        ),
    )
    brain.until_idle()
    [record] = brain.finished("keys")
    run_id = record["run_id"]
    assert record["outcome"] == "success", record
    assert [s["key"] for s in starts(brain, "steady")] == [f"{run_id}/steady/1"]
    assert [s["key"] for s in starts(brain, "flaky")] == [f"{run_id}/flaky/1", f"{run_id}/flaky/2"]
    assert {s["key"] for s in record["steps"]} == {f"{run_id}/steady/1", f"{run_id}/flaky/1", f"{run_id}/flaky/2"}


def kill_9(daemon: Daemon) -> None:
    """`kill -9 PID` of the daemon alone (its agents and spawner are left to fend for themselves)."""
    os.kill(daemon.pid, signal.SIGKILL)
    assert daemon.proc is not None
    daemon.proc.wait(timeout=30)


def test_kill_9_mid_run_then_start_again_resumes_without_redoing_completed_items(brain: Brain) -> None:
    """Durable by design: kill -9 the daemon and start it again: the run resumes, completed items are not run again,
    a running item is run again at most once, pending escalations are still pending."""
    brain.python_agent("worker", WORKER)
    items = ["quick-1", "quick-2", "broken", "hold"]
    brain.workflow("durable", fan_out("durable", items, fail="broken", hold="hold", wait_for="release"))
    with brain.daemon() as first:
        [esc] = brain.wait_escalation("the broken item's escalation")
        wait(lambda: starts(brain, "hold"), "the held agent to start")
        wait(
            lambda: (
                {k: v for k, v in item_status(brain, "durable").items() if k.startswith("quick")}
                == {"quick-1": "done", "quick-2": "done"}
            ),
            "the quick items to be done",
        )
        run_id = esc["run_id"]
        kill_9(first)
    assert [e["id"] for e in brain.escalations()] == [esc["id"]]  # still pending, daemon down
    assert brain.status()["daemon"]["up"] is False
    with brain.daemon() as second:
        second.wait_log("run_resumed", run_id=run_id)
        assert [e["id"] for e in brain.escalations()] == [esc["id"]]
        brain.write("release", "go\n")
        wait(lambda: item_status(brain, "durable").get("hold") == "done", "the held item to finish")
        assert brain.decide(esc["id"], "skip").rc == 0
        [record] = brain.wait_finished("durable")
    assert record["run_id"] == run_id
    for quick in ("quick-1", "quick-2"):
        assert [s["key"] for s in starts(brain, quick)] == [f"{run_id}/{quick}/1"]
    assert len(starts(brain, "broken")) == 1
    held = starts(brain, "hold")
    assert len(held) == 2, held  # the start before the kill, and at most one more after it
    assert all(s["key"].startswith(f"{run_id}/hold/") for s in held)
    assert brain.escalations() == []
    assert brain.escalations(all=True)[0]["decision"] == "skip"


def test_a_run_keeps_its_pinned_spec_across_a_kill_and_an_edit(brain: Brain) -> None:
    """A run is pinned to the spec it started with, also when the daemon is killed, the file edited, and the daemon
    started again: the run resumes with its own version."""
    brain.python_agent("worker", WORKER)
    brain.workflow("pinned", fan_out("pinned", ["a"], version="v1", wait_for="release"))
    with brain.daemon() as first:
        [started] = wait(lambda: starts(brain, "a"), "the agent of item a to start")
        kill_9(first)
    brain.workflow("pinned", fan_out("pinned", ["a", "b"], version="v2", wait_for="release"))
    brain.write("release", "go\n")
    with brain.daemon():
        [record] = brain.wait_finished("pinned")
    assert record["run_id"] == started["run"] and record["outcome"] == "success", record
    assert {s["item"] for s in record["steps"]} == {"a"}
    assert [s["context"]["version"] for s in starts(brain, "a")] == ["v1", "v1"]
    assert starts(brain, "b") == []


CHAIN_AGENT = """
    cat > /dev/null
    mkdir -p "$AMBIENT_BRAIN/work"
    echo "$AMBIENT_KEY" >> "$AMBIENT_BRAIN/work/step-$AMBIENT_ITEM.log"
    if [ "$AMBIENT_ITEM" = "2" ]; then
        while [ ! -e "$AMBIENT_BRAIN/release" ]; do sleep 0.05; done
    fi
    echo '{"status": "ok"}'
"""


def test_kill_9_mid_chain_then_start_again_resumes_at_the_running_step(brain: Brain) -> None:
    """Durable by design, for a chain: after kill -9 and a start, the done step is not run again, the running one is
    run again, and the chain goes on to its end."""
    brain.shell_agent("stepper", CHAIN_AGENT)
    brain.workflow(
        "steps",
        """
        name: steps
        chain:
          - {step: 1, type: brain-write, scope: work/one.md, agents: [stepper]}
          - {step: 2, type: brain-write, scope: work/two.md, agents: [stepper]}
          - {step: 3, type: brain-write, scope: work/three.md, agents: [stepper]}
    """,
    )

    def log(step: str) -> list[str]:
        path = brain.path(f"work/step-{step}.log")
        return path.read_text().split() if path.exists() else []

    with brain.daemon() as first:
        wait(lambda: log("2"), "step 2 to start")
        kill_9(first)
    assert log("3") == []
    with brain.daemon():
        wait(lambda: len(log("2")) == 2, "step 2 to run again")
        brain.write("release", "go\n")
        [record] = brain.wait_finished("steps")
    assert record["outcome"] == "success", record
    run_id = record["run_id"]
    assert log("1") == [f"{run_id}/1/1"]
    assert len(log("2")) == 2 and all(k.startswith(f"{run_id}/2/") for k in log("2"))
    assert log("3") == [f"{run_id}/3/1"]


def test_an_item_run_again_after_a_crash_carries_the_same_idempotency_key(brain: Brain) -> None:
    """Agents run at least once: each SPAWN carries an idempotency key (`run/item/attempt`, in AMBIENT_KEY) so an agent
    can refuse to do the same thing twice: the item run again after kill -9 is recognisable by its key."""
    brain.python_agent("worker", WORKER)
    brain.workflow("once-only", fan_out("once-only", ["deploy"], wait_for="release"))
    with brain.daemon() as first:
        wait(lambda: starts(brain, "deploy"), "the agent to start")
        kill_9(first)
    brain.write("release", "go\n")
    with brain.daemon():
        brain.wait_finished("once-only")
    keys = [s["key"] for s in starts(brain, "deploy")]
    assert len(keys) == 2 and keys[0] == keys[1], keys
