"""What a hostile file does to ambient, tried the way an attacker would.

A run journal edited between a kill -9 and a restart (8), a 1 MiB workflow of ~350k items dropped beside a small one
(10), item names carrying newlines and terminal escapes (11), and the service unit's limits against the
daemon-wide agent cap (11). The real daemon, real agent processes and real files throughout.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from configparser import ConfigParser
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ambient.config.workflows import load_workflow_bytes
from ambient.core.errors import HistoryError
from ambient.engine.runstate import RunState, fold
from ambient.human.escalation_store import EscalationStore
from ambient.human.escalations import EscalationDraft, new_escalation
from ambient.runners.orphans import by_journal
from ambient.storage.journal import read_jsonl
from ambient.storage.paths import BrainPaths
from tests.e2e.helpers import (
    PY,
    REPO,
    DaemonProcess,
    alive,
    ambient_cli,
    drop,
    events,
    finished_run,
    foreach_workflow,
    make_brain,
    runs,
    stub_agent_md,
    wait_for,
)

# ---------------------------------------------------------------- 8: a tampered run journal


def _journal_of(paths: BrainPaths, workflow: str) -> Path:
    """The (single) run journal of ``workflow``."""
    found = [p for p in paths.run_journals.glob("*.jsonl") if read_jsonl(p).records[0].get("workflow") == workflow]
    assert len(found) == 1, found
    return found[0]


def _tamper(journal: Path, ev: str, **changes: Any) -> int:
    """Rewrite the first ``ev`` record of ``journal`` with ``changes`` (a value ``...`` removes the key), as an
    attacker with an editor would; the record's line number."""
    lines = journal.read_text().splitlines(keepends=True)
    for n, line in enumerate(lines):
        rec = json.loads(line)
        if rec.get("ev") == ev:
            for key, value in changes.items():
                if value is ...:
                    rec.pop(key, None)
                else:
                    rec[key] = value
            lines[n] = json.dumps(rec, separators=(",", ":")) + "\n"
            journal.write_text("".join(lines))
            return n + 1
    raise AssertionError(f"no {ev} record in {journal}")


def _killed_with_an_agent_running(paths: BrainPaths, workflow: str) -> int:
    """A daemon that ran ``workflow``'s one slow item, killed with -9 while the agent runs; the agent's pid."""
    first = DaemonProcess(paths).start()
    try:
        first.wait_ready()
        drop(paths, f"{workflow}.yml", foreach_workflow(workflow, ["a"], agent="slow"))
        spawned = wait_for(lambda: events(paths, workflow, "spawned"), 20, "the agent to spawn")
        agent = int(spawned[0]["pid"])
        os.kill(first.pid, signal.SIGKILL)  # the daemon alone: its agent keeps running
        first.wait(10)
        first.known_children.add(agent)
    except BaseException:
        first.kill()
        raise
    assert alive(agent)
    return agent


def _brain_with_slow_and_fast(tmp_path: Path) -> BrainPaths:
    slow = stub_agent_md("slow", ["--sleep-ms", "60000-60000"])
    fast = stub_agent_md("fast", ["--sleep-ms", "1-5"])
    return make_brain(tmp_path / "brain", agents={"slow": slow, "fast": fast})


def test_a_spawned_pid_of_minus_one_is_a_problem_of_that_run_only(tmp_path: Path) -> None:
    """``spawned.pid: -1`` written into a journal between a kill -9 and the restart: the daemon starts, other
    workflows run, the run is reported at file:line by ``doctor`` and ``status``, its workflow does not start a second
    run, and its real agent is still stopped (found by its environment)."""
    paths = _brain_with_slow_and_fast(tmp_path)
    agent = _killed_with_an_agent_running(paths, "victim")
    journal = _journal_of(paths, "victim")
    line = _tamper(journal, "spawned", pid=-1)
    second = DaemonProcess(paths).start()
    try:
        second.wait_ready()
        drop(paths, "other.yml", foreach_workflow("other", ["x", "y"], agent="fast"))
        state = wait_for(lambda: _finished_despite(paths, "other", journal), 30, "the other workflow to finish")
        assert state is not None and state.outcome == "success"
        assert second.proc is not None and second.proc.poll() is None, second.tail()
        assert not alive(agent), "the victim's agent was left running"
        assert len([r for r in runs_of(paths) if r == "victim"]) == 1, "the victim workflow started a second run"
        where = f"{paths.rel(journal)}:{line}"
        unreadable = second.logged("run_history_unreadable")
        assert unreadable and unreadable[0].get("file") == paths.rel(journal) and unreadable[0].get("line") == line
        doctor = ambient_cli(paths.root, "doctor")
        assert where in doctor.stdout and "pid" in doctor.stdout, doctor.stdout
        status = ambient_cli(paths.root, "status")
        assert status.returncode == 0 and where in status.stdout, status.stdout
    finally:
        second.stop()
        second.kill()


def _finished_despite(paths: BrainPaths, workflow: str, tampered: Path) -> RunState | None:
    """The finished run of ``workflow``, the tampered journal (which does not fold) left out."""
    for p in paths.run_journals.glob("*.jsonl"):
        if p != tampered and (state := fold(read_jsonl(p).records)).workflow == workflow and state.finished:
            return state
    return None


def runs_of(paths: BrainPaths) -> list[str]:
    """The workflow of every run journal (read from its first record: a tampered journal does not fold)."""
    return [str(read_jsonl(p).records[0].get("workflow")) for p in paths.run_journals.glob("*.jsonl")]


def test_an_unrelated_pid_without_a_start_time_survives_the_restart(tmp_path: Path) -> None:
    """An unrelated long-running process (its own session) put into a ``spawned`` record with ``started`` removed:
    the restart never signals it; the run's real agent is still stopped (its environment) and the item runs again."""
    paths = _brain_with_slow_and_fast(tmp_path)
    agent = _killed_with_an_agent_running(paths, "victim")
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        journal = _journal_of(paths, "victim")
        _tamper(journal, "spawned", pid=bystander.pid, started=...)
        (paths.agents / "slow.md").write_text(stub_agent_md("slow", ["--sleep-ms", "1-5"]))
        second = DaemonProcess(paths, "--until-idle").start()
        try:
            assert second.wait(60) == 0, second.tail()
        finally:
            second.kill()
        assert bystander.poll() is None and alive(bystander.pid), "an unrelated process group was killed"
        assert not alive(agent)
        assert not second.logged("orphan_agent_reaped", found_by="journal")
        state = finished_run(paths, "victim")
        assert state is not None and state.outcome == "success"
    finally:
        bystander.kill()
        bystander.wait(10)


def _history(*events: dict[str, Any]) -> list[dict[str, Any]]:
    started = {"ev": "started", "run_id": "r1", "workflow": "w", "form": "for_each", "items": ["a"], "at": "t"}
    return [started, {"ev": "accepted", "item": "a", "attempt": 1}, *events]


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ({"ev": "spawned", "item": "a", "attempt": 1, "pid": -1, "started": 1.0}, "pid"),
        ({"ev": "spawned", "item": "a", "attempt": 1, "pid": 1, "started": 1.0}, "pid"),
        ({"ev": "spawned", "item": "a", "attempt": 1, "pid": [4242], "started": 1.0}, "pid"),
        ({"ev": "spawned", "item": "a", "attempt": 1, "pid": True, "started": 1.0}, "pid"),
        ({"ev": "spawned", "item": "a", "attempt": 1, "pid": 4242, "started": "soon"}, "started"),
        ({"ev": "spawned", "item": "a", "attempt": 1, "pid": 4242, "started": {"x": 1}}, "started"),
        ({"ev": "accepted", "item": "a", "attempt": None}, "attempt"),
        ({"ev": "accepted", "item": "a", "attempt": "2"}, "attempt"),
        ({"ev": "finished", "item": "a", "attempt": 1, "result": "success", "duration_ms": [1]}, "duration_ms"),
        ({"ev": "breaker", "scope": "s", "fails": "many"}, "fails"),
        ({"ev": "cursor", "index": -3}, "index"),
    ],
)
def test_a_journal_value_that_fails_validation_is_a_history_error_naming_its_record(
    record: dict[str, Any], field: str
) -> None:
    """Each value is checked where the fold reads it: a bad one is a :class:`HistoryError` (the run's problem, with
    the record's index), never a TypeError that escapes to the daemon."""
    with pytest.raises(HistoryError, match=field) as caught:
        fold(_history(record))
    assert caught.value.index == 2


def test_a_started_record_with_bad_fields_is_a_history_error() -> None:
    """The first record too: items must be a list of names, spec and context objects."""
    for bad in ({"items": "abc"}, {"items": [["x"]]}, {"spec": [1]}, {"context": "x"}, {"run_id": None}):
        with pytest.raises(HistoryError):
            fold([{**_history()[0], **bad}])


def test_a_pid_without_a_verifiable_start_time_is_never_signalled() -> None:
    """by_journal names a process only with pid > 1 *and* a start time that matches."""
    me = os.getpid()
    assert by_journal("r", "a", me, None) is None
    assert by_journal("r", "a", 1, None) is None
    assert by_journal("r", "a", -1, 0.0) is None
    assert by_journal("r", "a", 0, 0.0) is None


# ---------------------------------------------------------------- 10: a huge flow list


def _huge_workflow(name: str = "big") -> bytes:
    """1 MiB: a for_each whose flow list holds ~350k two-letter items (the issue's ~330k)."""
    import itertools
    import string

    two = ["".join(t) for t in itertools.product(string.ascii_lowercase, repeat=2) if "".join(t) not in ("no", "on")]
    head = f"workflow: {name}\nfor_each:\n  spawn: fast\n  items: [".encode()
    n = ((1 << 20) - len(head) - 2) // 3
    raw = head + ",".join(two[i % len(two)] for i in range(n)).encode() + b"]\n"
    assert len(raw) <= 1 << 20 and n > 330_000
    return raw


_MEASURE = """
import sys, time
from pathlib import Path
from ambient.config.workflows import load_workflow
t = time.monotonic()
wf, problems = load_workflow(Path(sys.argv[1]), source="workflows/big.yml")
took = time.monotonic() - t
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(took, hwm // 1024, wf is None, *[str(p) for p in problems], sep="\\n")
"""


def test_a_1_mib_flow_list_is_refused_at_its_item_cap_within_the_memory_budget(tmp_path: Path) -> None:
    """S-03: at most 200 MB for any brain file. The list is refused at the line that passes the item cap, before
    the rest of the file is built into nodes (measured: peak RSS of a fresh process)."""
    path = tmp_path / "big.yml"
    path.write_bytes(_huge_workflow())
    out = subprocess.run([PY, "-c", _MEASURE, str(path)], capture_output=True, text=True, timeout=120, check=True)
    took, peak_mb, refused, *problems = out.stdout.splitlines()
    print(f"1 MiB workflow: {float(took):.2f} s, peak RSS {peak_mb} MB")
    assert refused == "True"
    assert int(peak_mb) <= 200
    assert any(re.match(r"workflows/big\.yml:4: .*10000 items", p) for p in problems), problems


def test_a_1_mib_workflow_never_holds_up_a_small_one(tmp_path: Path) -> None:
    """The huge file dropped beside a small one: the small one runs to success; the huge one is reported with
    file:line; and a small one dropped after it runs too."""
    fast = stub_agent_md("fast", ["--sleep-ms", "1-5"])
    paths = make_brain(tmp_path / "brain", agents={"fast": fast})
    daemon = DaemonProcess(paths).start()
    try:
        daemon.wait_ready()
        drop(paths, "big.yml", _huge_workflow())
        drop(paths, "small.yml", foreach_workflow("small", ["a", "b"], agent="fast"))
        wait_for(lambda: finished_run(paths, "small"), 60, "the small workflow to finish")
        drop(paths, "after.yml", foreach_workflow("after", ["c"], agent="fast"))
        wait_for(lambda: finished_run(paths, "after"), 60, "the workflow dropped after it to finish")
        assert not runs(paths, "big")
        check = ambient_cli(paths.root, "validate")
        assert re.search(r"workflows/big\.yml:4: .*10000 items", check.stdout + check.stderr), check.stdout
    finally:
        daemon.stop()
        daemon.kill()


# ---------------------------------------------------------------- 11: names that break one-line views


HOSTILE = ["ok\nFAKE  done 10/10", "\x1b[31mred", "tab\there", "cr\rback"]


def test_item_names_with_control_characters_are_refused_with_file_and_line() -> None:
    """An item is a one-line name (it becomes a file name, a claim, AMBIENT_ITEM): a newline, a tab or an escape in
    one is refused at load, at the item's own line."""
    text = "workflow: w\nfor_each:\n  spawn: fast\n  items:\n    - fine\n" + "".join(
        f"    - {json.dumps(name)}\n" for name in HOSTILE
    )
    loaded, problems = load_workflow_bytes(text.encode(), source="workflows/w.yml")
    assert loaded is None
    lines = sorted(p.line for p in problems if p.line is not None and "control character" in p.message)
    assert lines == [6, 7, 8, 9], [str(p) for p in problems]
    assert all("\n" not in str(p) and "\x1b" not in str(p) for p in problems)


def test_status_runs_and_escalations_stay_one_line_per_entry(tmp_path: Path) -> None:
    """Names from files an attacker can write (a run journal, ``runs.jsonl``, an escalation file) with newlines and
    escapes: every entry of ``status [WORKFLOW]``, ``runs`` and ``escalations`` is one line, escapes shown, not
    acted on."""
    paths = make_brain(tmp_path / "brain")
    paths.run_journals.mkdir(parents=True, exist_ok=True)
    started = {"ev": "started", "run_id": "run-x", "workflow": "w", "form": "for_each", "items": HOSTILE}
    (paths.run_journals / "run-x.jsonl").write_text(json.dumps(started) + "\n")
    summary = {"run_id": "run-y", "workflow": "\x1b[31mw\nFAKE", "outcome": "success", "completed_at": "2026"}
    paths.runs_log.write_text(json.dumps(summary) + "\n")
    esc = new_escalation(
        EscalationDraft(workflow="w\nFAKE", run_id="run-x", kind="fail", question="q", item=HOSTILE[0]),
        now=datetime.now(UTC),
    )
    EscalationStore(paths).create(esc)
    for args, entries in (
        (("status", "w"), HOSTILE),
        (("status",), ["run-x", esc.id]),
        (("runs",), ["run-x", "run-y"]),
        (("escalations",), [esc.id]),
    ):
        res = ambient_cli(paths.root, *args)
        assert res.returncode == 0, res.stderr
        assert "\x1b" not in res.stdout and "\r" not in res.stdout and "\t" not in res.stdout
        assert not any(line.lstrip().startswith("FAKE") for line in res.stdout.splitlines()), res.stdout
        for entry in entries:
            shown = entry.replace("\n", "\\n").replace("\x1b", "\\x1b").replace("\t", "\\t").replace("\r", "\\r")
            assert [line for line in res.stdout.splitlines() if shown in line], (args, shown, res.stdout)


# ---------------------------------------------------------------- 11: the unit's limits and the agent cap


@pytest.mark.parametrize("unit", ["ambient.service", "ambient-user.service"])
def test_the_units_limits_hold_the_daemon_wide_agent_cap(unit: str) -> None:
    """``concurrency:`` at its maximum (256 agents at once) fits the unit's TasksMax and LimitNOFILE, with the
    daemon's own threads and descriptors on top (the budgets are ambient.engine.slots')."""
    from ambient.config.settings import Settings
    from ambient.engine.slots import unit_limits

    cap = Settings.model_fields["concurrency"].metadata
    most = next(m.le for m in cap if getattr(m, "le", None) is not None)
    assert most == 256
    parser = ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(REPO / "examples" / "systemd" / unit)
    service = parser["Service"]
    tasks, nofile = unit_limits(most)
    assert int(service["TasksMax"]) >= tasks > most
    hard = service["LimitNOFILE"].rpartition(":")[2]  # soft:hard; the daemon raises its soft limit to the hard one
    assert int(hard) >= nofile > most


def test_the_daemon_warns_when_its_limits_cannot_hold_its_cap(tmp_path: Path) -> None:
    """A descriptor limit below what ``concurrency:`` needs is said at start, with the number to set."""
    paths = make_brain(tmp_path / "brain", config="concurrency: 256\n")
    code = (
        "import resource, subprocess, sys\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))\n"
        "sys.exit(subprocess.call(sys.argv[1:]))\n"
    )
    d = DaemonProcess(paths, "--until-idle")
    argv = [PY, "-m", "ambient", "run", "--brain", str(paths.root), "--log-format", "json", "--until-idle"]
    with d.log_path.open("wb") as log:
        d.proc = subprocess.Popen(
            [sys.executable, "-c", code, *argv], stdout=log, stderr=subprocess.STDOUT, env=d.env, start_new_session=True
        )
    try:
        assert d.wait(60) == 0, d.tail()
    finally:
        d.kill()
    warned = d.logged("limits_below_concurrency")
    assert warned and warned[0].get("concurrency") == 256, d.tail()
