"""End to end: the real daemon (``python -m ambient run``) as a subprocess, observed on disk and on a fake
NOTIFY_SOCKET: drops, bad files, SIGTERM (R-07), SIGHUP and file watching (R-08), one instance per brain,
sd_notify order and the watchdog (R-09), ``--until-idle`` on the example brain, JSON logs.

Figures are printed (run with ``-s`` to see them); timing is never asserted beyond the budgets the
scenarios set (shutdown within the stop budget, watchdog pings within their interval).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import signal
import statistics
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from ambient.kernel.router import read_audit
from ambient.runners.process_group import group_alive
from ambient.storage.fsutil import atomic_write
from ambient.storage.paths import BrainPaths
from tests.e2e.helpers import (
    BAD_WORKFLOWS,
    DaemonProcess,
    NotifySocket,
    alive,
    ambient_cli,
    drop,
    events,
    finished_run,
    foreach_workflow,
    lock_files,
    make_brain,
    run_records,
    running,
    runs,
    stub_agent_md,
    wait_for,
    witness,
)

pytestmark = pytest.mark.timeout(120)

FAST = ["--sleep-ms", "0-5"]


def figure(name: str, value: Any) -> None:
    """Print one measured figure (visible with ``pytest -s``)."""
    print(f"\nFIGURE {name}: {value}")


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@pytest.fixture
def notify() -> Iterator[NotifySocket]:
    """A fake systemd notify socket."""
    ns = NotifySocket()
    try:
        yield ns
    finally:
        ns.close()


def _fast_brain(tmp_path: Path, *, config: str | None = None, stub_args: list[str] | None = None) -> BrainPaths:
    return make_brain(tmp_path / "brain", agents={"stub": stub_agent_md("stub", stub_args or FAST)}, config=config)


# ---------------------------------------------------------------- 1. drop → run


def test_dropped_workflow_runs_and_drop_latency_is_measured(tmp_path: Path) -> None:
    """A workflow file dropped into a running daemon's workflows/ starts a run (SPAWN recorded) that finishes."""
    paths = _fast_brain(tmp_path)
    latencies: list[float] = []
    with running(paths) as d:
        for n in range(7):
            name = f"drop-{n}"
            t_drop = drop(paths, f"{name}.yml", foreach_workflow(name, ["a", "b"]))
            state = wait_for(lambda name=name: finished_run(paths, name), 15, f"{name} finished")
            assert state.outcome == "success"
            accepted = events(paths, name, "accepted")
            assert {e["item"] for e in accepted} == {"a", "b"}
            latencies.append(min(_ts(e["at"]) for e in accepted) - t_drop)
        assert d.stop() == 0
    # The audit log holds the SPAWNs, as the router delivered them (flushed at the latest on stop).
    audit = [json.loads(line) for line in paths.audit.read_text().splitlines()]
    spawns = [p for rec in audit for p in rec.get("packets", []) if "SPAWN" in p and "stub" in p]
    assert len(spawns) == 14
    assert {r["workflow"] for r in run_records(paths)} == {f"drop-{n}" for n in range(7)}
    figure("drop→first accepted latency ms (median of 7)", round(statistics.median(latencies) * 1000, 1))
    figure("drop→first accepted latency ms (all)", [round(x * 1000, 1) for x in latencies])


# ---------------------------------------------------------------- 2. draft and bad files


def test_draft_never_runs_and_bad_workflows_are_reported_while_a_good_one_runs(tmp_path: Path) -> None:
    """Drafts never run; each malformed or invalid workflow is logged as file:line and the good one still runs."""
    paths = _fast_brain(tmp_path)
    bad = sorted(BAD_WORKFLOWS.glob("*.yml"))
    assert len(bad) >= 10
    with running(paths) as d:
        drop(paths, "drafty.yml", foreach_workflow("drafty", ["a"], status="draft"))
        for f in bad:
            drop(paths, f.name, f.read_bytes())
        drop(paths, "good.yml", foreach_workflow("good", ["a", "b", "c"]))
        assert wait_for(lambda: finished_run(paths, "good"), 15, "the good workflow finished").outcome == "success"
        problems = [str(r["problem"]) for r in d.logged("brain_problem")]
        for f in bad:
            mine = [p for p in problems if p.startswith(f"workflows/{f.name}:")]
            assert mine, f"{f.name} was not reported; problems: {problems}"
            if f.name != "oversized.yml":  # a size cap is a fault of the whole file: no line to name
                assert re.match(rf"workflows/{re.escape(f.name)}:\d+: \S", mine[0]), mine[0]
        # A reload (SIGHUP) looks at every file again: the draft still does not run.
        d.signal(signal.SIGHUP)
        d.wait_logged("reloaded", trigger="sighup")
        assert d.proc is not None and d.proc.poll() is None, "the daemon must stay up"
        assert d.stop() == 0
    assert [s.workflow for s in runs(paths)] == ["good"]
    figure("bad workflow files reported", f"{len(bad)}/{len(bad)}")


# ---------------------------------------------------------------- 3. SIGTERM during a run


def test_sigterm_during_a_fanout_stops_cleanly_and_the_run_resumes(tmp_path: Path, notify: NotifySocket) -> None:
    """SIGTERM mid-fan-out: STOPPING=1 first, exit 0 in budget, items interrupted, nothing left, rerun on restart."""
    wit = tmp_path / "witness.log"
    paths = make_brain(
        tmp_path / "brain",
        agents={
            # Long enough that none ends before the SIGTERM on a loaded machine: the ten agents start, a SIGHUP reload
            # happens, and under a parallel load (a soak beside the suite) that took more than the 2 s these slept.
            "stub": stub_agent_md("stub", ["--sleep-ms", "6000-7000", "--witness", str(wit)]),
            # Ignores SIGTERM: killed by SIGKILL after its 1 s grace, before its sleep ends.
            "stubborn": stub_agent_md(
                "stubborn", ["--sleep-ms", "7000-7500", "--witness", str(wit), "--ignore-term"], kill_grace_s=1
            ),
            # The daemon-wide cap (default 4) lets both runs' five agents run at once; a short shutdown grace interrupts
            # them (by default they get 10 s to finish their work).
        },
        config="concurrency: 10\nshutdown_grace_s: 0.2\n",
    )
    plan = {"slow": ["s0", "s1", "s2", "s3", "s4"], "stubborn": ["t0", "t1", "t2", "t3", "t4"]}
    items = sorted(plan["slow"] + plan["stubborn"])

    def of(kind: str) -> list[str]:
        return sorted(e["item"] for wf in plan for e in events(paths, wf, kind))

    with running(paths, env=notify.env()) as d:
        for wf, names in plan.items():
            drop(paths, f"{wf}.yml", foreach_workflow(wf, names, agent=wf.replace("slow", "stub"), concurrency=5))
        wait_for(lambda: len(of("accepted")) == 10, 15, "10 items accepted")
        pids = wait_for(lambda: len(d.agent_pids()) >= 10 and d.agent_pids(), 15, "10 agents running")
        assert len(lock_files(paths)) >= 10  # one lock per item scope is held while the agents run
        reloading = len(notify.messages)
        d.signal(signal.SIGHUP)  # a reload in the middle drops nothing: the same agents keep running
        d.wait_logged("reloaded", trigger="sighup")
        notify.wait_for("READY", "1", start=reloading)  # the reload's end as systemd is told it, read by the socket
        assert sorted(d.agent_pids()) == sorted(pids) and of("interrupted") == []
        first = len(notify.messages)
        t0 = time.monotonic()
        d.signal(signal.SIGTERM)
        code = d.wait(timeout=20)  # the stop budget (R-07: 20 s when TimeoutStopSec=30)
        shutdown_s = time.monotonic() - t0
        assert code == 0, d.tail()
    after = notify.messages[first:]
    assert after and after[0].has("STOPPING", "1"), [m.text for m in after]
    assert of("interrupted") == items  # recorded (fsync'd) before the daemon exited
    assert of("finished") == [], "no item could finish in 6 s"
    assert lock_files(paths) == [], "locks (and temp files) left in locks/"
    assert not [p for p in pids if group_alive(p)], "agents' process groups survived the daemon"
    # An agent may have done its work just before being killed (at least once); normally none got that far.
    killed_after_work = witness(wit)
    assert {attempt for _, attempt, _ in killed_after_work} <= {1}

    with running(paths, env=notify.env()) as d2:
        d2.wait_logged("run_resumed", count=2)
        for wf in plan:
            state = wait_for(lambda wf=wf: finished_run(paths, wf), 20, f"{wf} resumed and finished")
            assert state.outcome == "success"
        assert d2.stop() == 0
    rerun = witness(wit)[len(killed_after_work) :]
    assert sorted(item for item, _, _ in rerun) == items  # each interrupted item ran again, once...
    assert {attempt for _, attempt, _ in rerun} == {1}  # ... as the same attempt: the same AMBIENT_KEY
    assert len(witness(wit)) == len(items) + len(killed_after_work)
    done = [e for wf in plan for e in events(paths, wf, "finished") if e["result"] == "success"]
    assert sorted(e["item"] for e in done) == items  # exactly one completion per item
    assert sorted(r["outcome"] for r in run_records(paths)) == ["success", "success"]
    assert lock_files(paths) == []
    figure("SIGTERM→exit, 10 agents running, 5 ignoring SIGTERM (kill grace 1 s) (s)", round(shutdown_s, 3))


# ---------------------------------------------------------------- 4. SIGHUP and file watching


def _sched(name: str = "sched") -> str:
    return foreach_workflow(name, ["x"], extra="schedule: 1s\n")


def test_sighup_applies_a_valid_config_and_keeps_the_old_one_when_broken(tmp_path: Path, notify: NotifySocket) -> None:
    """SIGHUP: RELOADING=1+MONOTONIC_USEC then READY=1; new tick_seconds applies; broken files keep the old version."""
    paths = _fast_brain(tmp_path, config="tick_seconds: 30\n")
    drop(paths, "sched.yml", _sched())
    # --no-watch and 30 s ticks: only SIGHUP can make the daemon see the first edit below in time.
    with running(paths, "--no-watch", env=notify.env()) as d:
        wait_for(lambda: finished_run(paths, "sched"), 15, "the first run of sched")
        first_hash = runs(paths, "sched")[0].spec_hash

        def hup() -> list[Any]:
            start = len(notify.messages)
            before = len(d.logged("reloaded", trigger="sighup"))
            d.signal(signal.SIGHUP)
            i = notify.wait_for("RELOADING", "1", start=start)
            usec = int(notify.messages[i].fields["MONOTONIC_USEC"])
            assert 0 < usec <= time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
            notify.wait_for("READY", "1", start=i + 1)
            return d.wait_logged("reloaded", trigger="sighup", count=before + 1)[-1]

        atomic_write(paths.config, "tick_seconds: 0.2\n")
        t_hup = time.monotonic()
        assert hup()["tick_seconds"] == 0.2
        # schedule: 1s is only checked on ticks: with 30 s ticks no second run could start in this test.
        wait_for(lambda: len(runs(paths, "sched")) >= 3, 15, "scheduled runs on the new tick")
        figure("SIGHUP→2 more scheduled runs (s)", round(time.monotonic() - t_hup, 2))

        atomic_write(paths.config, "tick_seconds: [0.5\n")
        reloaded = hup()
        assert reloaded["tick_seconds"] == 0.2  # the last good settings (the previous file's) are kept
        d.wait_logged("config_invalid_last_good_used")
        assert any(str(r["problem"]).startswith("profil/ambient.yml:") for r in d.logged("brain_problem"))
        count = len(runs(paths, "sched"))
        wait_for(lambda: len(runs(paths, "sched")) >= count + 1, 15, "a run after the broken config")

        (paths.workflows / "sched.yml").write_text("workflow: sched\nfor_each: [oops\n")  # in place, broken
        hup()
        assert any(str(r["problem"]).startswith("workflows/sched.yml:") for r in d.logged("brain_problem"))
        count = len(runs(paths, "sched"))
        wait_for(lambda: len(runs(paths, "sched")) >= count + 1, 15, "a run after the broken workflow")
        assert {s.spec_hash for s in runs(paths, "sched")} == {first_hash}  # the previous version kept its runs
        assert d.stop() == 0


def test_rapid_saves_are_debounced_and_renamed_saves_are_seen(tmp_path: Path) -> None:
    """50 rapid in-place saves cause at most 3 reloads and the last one is loaded; an atomic-rename save is seen."""
    paths = _fast_brain(tmp_path)
    target = paths.workflows / "edit.yml"
    with running(paths) as d:
        drop(paths, "edit.yml", foreach_workflow("edit", ["a"]))
        wait_for(lambda: finished_run(paths, "edit"), 15, "the first run of edit")
        wait_for(lambda: d.logged("reloaded"), 5, "the drop's reload")
        before = len(d.logged("reloaded"))
        final = foreach_workflow("edit-final", ["a"]).encode()
        t0 = time.monotonic()
        for n in range(50):
            # In place, as some editors save: truncate then write (a reader can see an empty file).
            data = final if n == 49 else foreach_workflow("edit", ["a"], extra=f"description: v{n}\n").encode()
            with target.open("wb") as fh:
                fh.write(data)
            time.sleep(0.002)  # an editor's burst, not a wait: ~50 saves in ~0.15 s
        t_last = time.monotonic()
        state = wait_for(lambda: finished_run(paths, "edit-final"), 15, "a run of the last save")
        latency = time.monotonic() - t_last
        reloads = len(d.logged("reloaded")) - before
        assert state.spec_hash == hashlib.sha256(final).hexdigest()
        assert reloads <= 3, f"{reloads} reloads for 50 saves"

        renamed = foreach_workflow("edit-renamed", ["a"])
        atomic_write(target, renamed)
        state = wait_for(lambda: finished_run(paths, "edit-renamed"), 15, "a run of the renamed save")
        assert state.spec_hash == hashlib.sha256(renamed.encode()).hexdigest()
        assert d.stop() == 0
    figure("reloads for 50 in-place saves", f"{reloads} (burst {t_last - t0:.2f} s)")
    figure("last save→its run finished (s)", round(latency, 3))


def test_no_watch_picks_up_a_dropped_workflow_on_the_timed_tick(tmp_path: Path) -> None:
    """With --no-watch the timed tick notices a new workflow file (the directory listing changed) and runs it."""
    paths = _fast_brain(tmp_path, config="tick_seconds: 0.2\n")
    with running(paths, "--no-watch") as d:
        drop(paths, "late.yml", foreach_workflow("late", ["a"]))
        assert wait_for(lambda: finished_run(paths, "late"), 15, "late finished").outcome == "success"
        assert d.stop() == 0


# ---------------------------------------------------------------- 5. one daemon per brain


def test_start_up_removes_locks_of_dead_holders_and_keeps_live_ones(tmp_path: Path) -> None:
    """The reconciliation walks locks too: one left by a process that died holding it (or resurrected by a power
    cut that lost its release, R-03) is removed at start-up; a person's lease taken through the CLI stays."""
    import subprocess
    import sys

    from ambient.claims.locks import LockManager

    paths = _fast_brain(tmp_path)
    src = str(Path(__file__).resolve().parents[2] / "src")
    code = (
        f"import sys, os; sys.path.insert(0, {src!r}); from pathlib import Path; "
        "from ambient.claims.locks import LockManager; from ambient.storage.paths import BrainPaths; "
        f"LockManager(BrainPaths(Path({str(paths.root)!r}))).acquire('projets/dead.md', 'sess-dead', "
        "pid_bound=True); os._exit(0)"
    )  # dies holding it
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
    LockManager(paths).acquire("projets/lease.md", "sess-person", pid_bound=False)

    def held() -> list[str]:
        return [p.name for p in lock_files(paths) if p.name.endswith(".lock")]

    assert held() == ["projets%2Fdead.md.lock", "projets%2Flease.md.lock"]
    d = DaemonProcess(paths, "--until-idle").start()
    try:
        assert d.wait(timeout=60) == 0
        assert d.logged("locks_cleaned", count=1)
    finally:
        d.kill()
    assert held() == ["projets%2Flease.md.lock"]


def test_second_instance_exits_at_once_naming_the_running_pid(tmp_path: Path) -> None:
    """A second ``ambient run`` on the same brain exits with code 2 and a message naming the running pid."""
    paths = _fast_brain(tmp_path)
    with running(paths) as d:
        t0 = time.monotonic()
        second = ambient_cli(paths.root, "run", "--log-format", "json", timeout=30)
        took = time.monotonic() - t0
        assert second.returncode == 2, second.stderr
        assert f"pid {d.pid}" in second.stderr, second.stderr
        assert d.proc is not None and d.proc.poll() is None  # the first one is untouched
        assert d.stop() == 0
    figure("second instance refused in (s)", round(took, 3))


def test_a_daemon_task_that_dies_stops_the_daemon_with_a_non_zero_exit(tmp_path: Path) -> None:
    """A daemon task that dies (the watcher: agents/ is a file) stops the daemon with a non-zero exit (restartable)."""
    root = tmp_path / "brain"
    (root / "workflows").mkdir(parents=True)
    (root / "agents").write_text("not a directory\n")
    d = DaemonProcess(BrainPaths(root)).start()
    try:
        code = d.wait(timeout=30)
    finally:
        d.kill()
    assert code != 0, d.tail()
    assert d.logged("daemon_task_failed", task="watch")


# ---------------------------------------------------------------- 6. sd_notify order and watchdog


def test_sd_notify_ready_after_recovery_then_watchdog_pings_then_stopping(tmp_path: Path, notify: NotifySocket) -> None:
    """READY=1 after the crashed run is recovered, then WATCHDOG=1 at most WATCHDOG_USEC/2 apart, then STOPPING=1."""
    wit = tmp_path / "witness.log"
    paths = _fast_brain(tmp_path, stub_args=["--sleep-ms", "1500-2000", "--witness", str(wit)])
    items = ["a", "b", "c", "d"]
    crashed = DaemonProcess(paths).start()
    try:
        crashed.wait_ready()
        drop(paths, "wd.yml", foreach_workflow("wd", items, concurrency=4))
        wait_for(lambda: len(events(paths, "wd", "accepted")) == 4, 15, "4 items accepted")
        wait_for(lambda: len(crashed.agent_pids()) >= 4, 15, "4 agents running")
    finally:
        crashed.kill()  # kill -9 the daemon and its agents: a crash, nothing recorded
    assert not events(paths, "wd", "interrupted")

    usec = 400_000
    with running(paths, env=notify.env(watchdog_usec=usec), ready=False) as d:
        notify.wait_for("READY", "1", timeout=15)
        # READY is sent after the reconciliation pass: the in-flight items are already recorded on disk.
        recovered = events(paths, "wd", "interrupted")
        assert sorted(e["item"] for e in recovered) == items and {e.get("reason") for e in recovered} == {"restart"}
        wait_for(lambda: finished_run(paths, "wd"), 20, "the resumed run finished")
        wait_for(lambda: sum(m.has("WATCHDOG", "1") for m in notify.messages) >= 10, 10, "10 watchdog pings")
        assert d.stop() == 0
    msgs = notify.messages
    kinds = [
        "READY"
        if m.has("READY", "1")
        else "WATCHDOG"
        if m.has("WATCHDOG", "1")
        else "STOPPING"
        if m.has("STOPPING", "1")
        else "other"
        for m in msgs
    ]
    assert kinds[0] == "READY", kinds
    stop_at = kinds.index("STOPPING")
    assert "WATCHDOG" not in kinds[stop_at:]
    assert set(kinds[1:stop_at]) <= {"WATCHDOG", "other"}
    assert all(m.has("EXTEND_TIMEOUT_USEC") or m.has("STOPPING") for m in msgs[stop_at:])
    pings = [m.t for m in msgs if m.has("WATCHDOG", "1")]
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    assert max(gaps) <= usec / 2 / 1e6, f"largest gap {max(gaps):.3f} s"
    assert [r["outcome"] for r in run_records(paths)] == ["success"]
    assert len(witness(wit)) == len(items)  # killed before their witness line: each ran once, on restart
    figure(
        "watchdog pings / largest gap ms / median gap ms (WATCHDOG_USEC=400000)",
        f"{len(pings)} / {max(gaps) * 1000:.1f} / {statistics.median(gaps) * 1000:.1f}",
    )


# ---------------------------------------------------------------- 7. --until-idle on the example brain


def _pending(paths: BrainPaths) -> list[dict[str, Any]]:
    status = json.loads(ambient_cli(paths.root, "status", "--json").stdout)
    return list(status["escalations"])


def test_until_idle_on_the_example_brain_then_decisions_finish_the_chain(tmp_path: Path) -> None:
    """run --until-idle exits 0 with runs done or waiting on escalations status shows; decide + rerun finishes all."""
    paths = make_brain(tmp_path / "brain", example_workflows=True)
    workflows = {p.stem for p in paths.workflows.glob("*.yml")}
    assert {"deploy-batch", "feature-chain"} <= workflows
    answered: list[dict[str, Any]] = []
    passes = 0
    while True:
        passes += 1
        assert passes <= 5, f"still not done after 4 decision rounds: {answered}"
        result = ambient_cli(paths.root, "run", "--until-idle", "--log-format", "json", timeout=60)
        assert result.returncode == 0, result.stderr[-2000:]
        status = json.loads(ambient_cli(paths.root, "status", "--json").stdout)
        assert status["daemon"]["up"] is False
        pending = status["escalations"]
        if passes == 1:
            # The first pass: both runs stop on the person; each waits on an escalation file status shows.
            by_workflow = {r["workflow"]: r for r in status["runs"]}
            assert {"deploy-batch", "feature-chain"} <= set(by_workflow)
            assert {e["workflow"] for e in pending} >= {"deploy-batch", "feature-chain"}
            for e in pending:
                assert (paths.escalations / f"{e['id']}.yml").is_file()
        if not pending:
            break
        for e in pending:
            option = "retry" if "retry" in e["options"] else "approve"
            decided = ambient_cli(paths.root, "decide", e["id"], option)
            assert decided.returncode == 0, decided.stderr
            answered.append({**e, "answer": option})
    outcomes = {r["workflow"]: r["outcome"] for r in run_records(paths)}
    assert outcomes["deploy-batch"] == "success"
    assert outcomes["feature-chain"] == "success"
    assert all(s.finished for s in runs(paths))
    gates = [e for e in answered if e["workflow"] == "feature-chain" and e["kind"] == "gate"]
    assert any("gate: human" in e["question"] for e in gates), gates  # step 4's declared gate was asked
    figure("until-idle passes to finish the example brain", f"{passes} ({len(answered)} decisions)")


# ---------------------------------------------------------------- 8. JSON logs


def test_json_logs_every_line_json_and_run_lines_carry_workflow_and_run_id(tmp_path: Path) -> None:
    """--log-format json: every line is JSON; run lines carry workflow and run_id, item lines also item."""
    paths = _fast_brain(tmp_path, stub_args=[*FAST, "--fail-items", "b"])
    with running(paths, "--log-level", "debug") as d:
        drop(paths, "logs.yml", foreach_workflow("logs", ["a", "b", "c"]))
        esc = wait_for(lambda: list(paths.escalations.glob("esc-*.yml")), 15, "the escalation of item b")[0].stem
        assert ambient_cli(paths.root, "decide", esc, "skip").returncode == 0
        wait_for(lambda: finished_run(paths, "logs"), 15, "the run finished")
        d.wait_logged("run_finished", workflow="logs")
        assert d.stop() == 0
    lines = d.lines()
    assert lines
    records = []
    for line in lines:
        rec = json.loads(line)  # raises on any non-JSON line (a stray print or traceback)
        assert isinstance(rec, dict) and {"event", "level", "timestamp"} <= set(rec), line
        records.append(rec)
    (ready,) = [r for r in records if r["event"] == "daemon_ready"]
    assert ready["frozen_objects"] > 10_000  # start-up's heap is kept out of later collections (freeze_startup_heap)
    about_run = [r for r in records if {"run_id", "item", "escalation"} & set(r)]
    events_seen = {r["event"] for r in about_run}
    assert {"run_started", "escalation_opened", "decision_applied", "run_finished"} <= events_seen
    for r in about_run:
        assert r.get("workflow") == "logs" and str(r.get("run_id", "")).startswith("sess-"), r
    item_lines = [r for r in records if r["event"] in ("escalation_opened", "agent_started", "agent_result")]
    assert item_lines
    for r in item_lines:
        assert r.get("item") in ("a", "b", "c"), r
    figure("JSON log lines / lines about the run", f"{len(records)} / {len(about_run)}")


def test_helpers_clean_up_agents(tmp_path: Path) -> None:
    """The harness leaves no agent behind when a test kills a daemon mid-run (guards the other tests)."""
    paths = _fast_brain(tmp_path, stub_args=["--sleep-ms", "5000-5000"])
    d = DaemonProcess(paths).start()
    try:
        d.wait_ready()
        drop(paths, "bg.yml", foreach_workflow("bg", ["a", "b"]))
        pids = wait_for(lambda: len(d.agent_pids()) >= 2 and d.agent_pids(), 15, "2 agents")
    finally:
        d.kill()
    assert not [p for p in pids if alive(p)]
    assert os.path.exists(d.log_path)


# ---------------------------------------------------------------- 8. an agent's channel token


CHECK_TOKEN = """
import json, os, subprocess, sys
from pathlib import Path
from ambient.storage.paths import BrainPaths
from ambient.kernel.channels import token_digest
token, brain = os.environ["AMBIENT_CHANNEL_TOKEN"], Path(os.environ["AMBIENT_BRAIN"])
has_file = (BrainPaths(brain).channels / f"{token_digest(token)}.json").exists()
# A packet claiming to come from the person: the router must know this agent by its token, and refuse it.
# (dict() calls: two closing braces in a row in an argv would be taken for a broken placeholder)
forged = dict(to="ambient", signal="RETURN", payload=dict(result="approved"))
forged["from"] = "human"
done = subprocess.run([sys.executable, "-m", "ambient", "--brain", str(brain), "send", "--json", "-"],
                      input=json.dumps(forged), capture_output=True, text=True, timeout=60)
answer = json.loads(done.stdout)
with open(sys.argv[1], "a") as fh:
    fh.write(f"{os.environ['AMBIENT_ITEM']} {answer['status']} {'file' if has_file else 'nofile'}\\n")
print("{}")
"""


@pytest.mark.parametrize("socket", ["served", "unavailable"])
def test_each_agent_is_known_by_its_channel_token_and_leaves_no_token_behind(tmp_path: Path, socket: str) -> None:
    """S-05 through the daemon: each command agent's ``ambient send`` is identified by its token, whatever its
    packet's ``from`` says (a forged ``from: human`` is denied, and recorded under the agent's channel).

    The token files are the decision of ChannelRegistry's docs: while the daemon serves its send socket the
    agent's command hands the packet to the daemon, which knows the token in memory, and no file is written;
    when it cannot (a brain path too long for a unix socket) the command routes by itself and checks the token
    against its file. Either way no file is left once the agents are done.
    """
    seen = tmp_path / "seen.txt"
    agent = stub_agent_md("talker").replace(
        'argv: ["{{python}}", "-m", "ambient.testing.stub_agent"]',
        f"argv: {json.dumps(['{{python}}', '-c', CHECK_TOKEN, str(seen)])}",
    )
    root = tmp_path / ("brain" if socket == "served" else "b" * 110)
    paths = make_brain(root, agents={"talker": agent})
    (paths.root / "workflows" / "talk.yml").write_text(foreach_workflow("talk", ["a", "b", "c"], agent="talker"))
    result = ambient_cli(paths.root, "run", "--until-idle", timeout=90)
    assert result.returncode == 0, result.stderr[-2000:]
    state = finished_run(paths, "talk")
    assert state is not None and state.outcome == "success"
    kind = "nofile" if socket == "served" else "file"
    assert sorted(seen.read_text().split("\n")[:-1]) == [f"{i} denied {kind}" for i in "abc"]
    forged = [r for r in read_audit(paths.audit) if r["status"] == "denied"]
    assert [(r["channel"], r["from"]) for r in forged] == [("talker", "human")] * 3
    assert "identity comes from the channel" in forged[0]["reason"]
    assert list(paths.channels.glob("*.json")) == []
