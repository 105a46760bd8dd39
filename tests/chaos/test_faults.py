"""The README's promises under faults, each scenario as a fault harness would drive it.

The witness of "never twice at once" is the stub agent's ``--overlap-dir``: every agent holds a ``flock`` on
``<dir>/<item>.lock`` while it runs (the kernel drops it when the process dies, kill -9 included), and a second
agent of the same item that finds it held writes a line to ``<dir>/overlaps.log``. Agents of an item that
overlap in time are seen whatever the journal says.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
import yaml

from ambient.engine.planner import question_options
from ambient.engine.runstate import aborts_run
from ambient.human.escalations import EscalationDraft, new_escalation, timeout_decision
from ambient.storage.journal import read_jsonl
from ambient.storage.paths import BrainPaths
from tests.e2e.helpers import (
    DaemonProcess,
    alive,
    ambient_cli,
    command_agent_md,
    drop,
    events,
    finished_run,
    foreach_workflow,
    is_spawner,
    make_brain,
    stub_agent_md,
    wait_for,
    witness,
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
    """The spawner keeps no SPAWN request of a dead daemon. The spawner is frozen while the daemon
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
    """A kill between an agent's start and its ``spawned`` record leaves an agent no journal names.
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


# ---- questions and files a crash leaves behind


def _cli(paths: BrainPaths, *args: str) -> subprocess.CompletedProcess[str]:
    """``ambient --brain ROOT ARGS`` as a person types it."""
    return subprocess.run(
        [sys.executable, "-m", "ambient", "--brain", str(paths.root), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _dead_pid() -> int:
    """The pid of a process that has exited (what a crashed daemon leaves in ``daemon.json``)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_losing_daemon_names_the_pid_that_holds_the_brain(tmp_path: Path) -> None:
    """A daemon that loses the start race names the daemon that holds the brain, not the pid a crashed
    one left in ``daemon.json``. The window of the race (the lock taken, ``daemon.json`` not yet rewritten) is held
    open: this process holds the instance lock while ``daemon.json`` still names a dead daemon."""
    paths = make_brain(tmp_path / "brain", example_agents=False, agents={"stub": stub_agent_md("stub")})
    stale = _dead_pid()
    paths.state.mkdir(parents=True, exist_ok=True)
    (paths.state / "daemon.json").write_text(json.dumps({"pid": stale, "started_at": "2026-01-01T00:00:00+00:00"}))
    fd = os.open(paths.daemon_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        loser = DaemonProcess(paths).start()
        try:
            assert loser.wait(30) != 0, loser.tail()
        finally:
            loser.kill()
    finally:
        os.close(fd)
    said = "\n".join(loser.lines())
    assert "already running" in said, said
    assert f"pid {os.getpid()}" in said and f"pid {stale}" not in said, said


def test_two_daemons_started_at_once_the_loser_names_the_winner(tmp_path: Path) -> None:
    """The real race, after a crash left a stale ``daemon.json``: two daemons started together, exactly
    one runs and the other names its pid."""
    paths = make_brain(tmp_path / "brain", example_agents=False, agents={"stub": stub_agent_md("stub")})
    paths.state.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        (paths.state / "daemon.json").write_text(json.dumps({"pid": _dead_pid()}))
        pair = [DaemonProcess(paths).start(), DaemonProcess(paths).start()]
        try:
            loser = wait_for(lambda: next((d for d in pair if d.proc and d.proc.poll() is not None), None), 30, "loser")
            winner = pair[1] if loser is pair[0] else pair[0]
            winner.wait_ready(30)
            said = "\n".join(loser.lines())
            assert "already running" in said and f"pid {winner.pid})" in said, said
            assert winner.stop() == 0
        finally:
            for d in pair:
                d.kill()


def _asking_brain(root: Path, asks: str) -> BrainPaths:
    """A brain whose agent ``asker`` asks the person (its own ESCALATE) on item ``asks`` and succeeds on the others."""
    script = root.parent / "asker.py"
    script.write_text(
        "import json, os, sys\n"
        "json.load(sys.stdin)\n"
        f"if os.environ.get('AMBIENT_ITEM') == {asks!r}:\n"
        "    print(json.dumps({'signal': 'ESCALATE', 'question': 'Ship the risky one?', 'options': ['yes', 'no']}))\n"
        "else:\n"
        "    print(json.dumps({'signal': 'RETURN', 'result': {'status': 'ok'}}))\n"
    )
    agent = command_agent_md("asker", ["{{python}}", str(script)])
    return make_brain(root, example_agents=False, agents={"asker": agent})


def test_on_timeout_reject_of_an_agents_question_rejects_that_item_only(tmp_path: Path) -> None:
    """``on_timeout: reject`` on an agent's own question in a for_each rejects the item that asked (it
    fails), never the whole run: the other items run to their end and nothing is aborted."""
    paths = _asking_brain(tmp_path / "brain", "b")
    timeout = "on_escalate: {timeout: 1s, on_timeout: reject}\n"
    wf = foreach_workflow("ask", ["a", "b", "c", "d"], agent="asker", concurrency=1, extra=timeout)
    drop(paths, "ask.yml", wf)
    d = DaemonProcess(paths).start()
    try:
        state = wait_for(lambda: finished_run(paths, "ask"), 30, "the run to end once the deadline passed")
        assert d.stop() == 0, d.tail()
    finally:
        d.kill()
    statuses = {it.name: it.status for it in state.items}
    assert statuses == {"a": "done", "b": "failed", "c": "done", "d": "done"}, statuses
    assert state.outcome != "aborted" and not state.aborted
    [decided] = events(paths, "ask", "decided")
    assert (decided["item"], decided["action"], decided["by"]) == ("b", "reject", "timeout")


def _only_escalation(paths: BrainPaths) -> Path:
    found = sorted(paths.escalations.glob("esc-*.yml"))
    return found[0] if len(found) == 1 else None  # type: ignore[return-value]


def test_a_zero_byte_escalation_file_is_rebuilt_from_the_journal(tmp_path: Path) -> None:
    """An escalation file emptied by a crash no longer leaves its run waiting on a question nobody can
    see: the journal keeps the question and options, the daemon rebuilds the file at start and says so, and the
    person answers it as any other (``ambient escalations``, ``ambient decide``); ``doctor`` explains the empty file
    while the daemon is down."""
    paths = _asking_brain(tmp_path / "brain", "b")
    drop(paths, "ask.yml", foreach_workflow("ask", ["a", "b"], agent="asker", concurrency=1))
    first = DaemonProcess(paths, "--until-idle").start()
    try:
        assert first.wait(60) == 0, first.tail()
    finally:
        first.kill()
    esc_file = wait_for(lambda: _only_escalation(paths), 5, "the escalation file")
    esc_id = esc_file.stem
    esc_file.write_bytes(b"")  # what a crash between create and fsync can leave (ext4 data=writeback, XFS)
    doctor = _cli(paths, "doctor")
    assert f".ambient/escalations/{esc_id}.yml:1:" in doctor.stdout, doctor.stdout
    assert "rebuilt from" in doctor.stdout, doctor.stdout

    second = DaemonProcess(paths).start()
    try:
        second.wait_ready()
        [rebuilt] = second.wait_logged("escalation_rebuilt", escalation=esc_id)
        assert rebuilt["reason"] == "empty" and rebuilt["run_id"] == events(paths, "ask", "started")[0]["run_id"]
        listed = json.loads(_cli(paths, "escalations", "--json").stdout)
        [esc] = [e for e in listed if e["id"] == esc_id]
        assert esc["question"] == "Ship the risky one?" and esc["item"] == "b" and esc["status"] == "pending"
        assert [o["key"] for o in esc["options"]] == ["yes", "no", "skip", "abort"]
        assert _cli(paths, "decide", esc_id, "skip").returncode == 0
        wait_for(lambda: finished_run(paths, "ask"), 30, "the run to finish once answered")
    finally:
        second.stop()
        second.kill()
    state = finished_run(paths, "ask")
    assert state is not None and {it.name: it.status for it in state.items} == {"a": "done", "b": "skipped"}
    assert _cli(paths, "doctor").stdout.count(esc_id) == 0


def test_a_torn_journal_tail_is_reported_with_its_file_and_line(tmp_path: Path) -> None:
    """A run journal torn by a crash mid-append is reported as ``file:line`` (the line cut), like every
    other problem with a file."""
    slow = stub_agent_md("stub", ["--sleep-ms", "60000-60000"])
    paths = make_brain(tmp_path / "brain", example_agents=False, agents={"stub": slow})
    first = DaemonProcess(paths).start()
    try:
        first.wait_ready()
        drop(paths, "torn.yml", foreach_workflow("torn", ["a"], concurrency=1))
        wait_for(lambda: events(paths, "torn", "spawned"), 20, "the agent spawned")
        first.agent_pids()
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    finally:
        first.kill()
    journal = next(paths.run_journals.glob("*.jsonl"))
    lines = journal.read_bytes().count(b"\n")
    with journal.open("ab") as fh:
        fh.write(b'{"ev":"finished","item":"a","resu')
    (paths.agents / "stub.md").write_text(stub_agent_md("stub", ["--sleep-ms", "1-5"]))
    second = DaemonProcess(paths, "--until-idle").start()
    try:
        assert second.wait(60) == 0, second.tail()
    finally:
        second.kill()
    [cut] = second.logged("journal_torn_tail_cut")
    assert cut["problem"].startswith(f"{paths.rel(journal)}:{lines + 1}: "), cut


def test_a_junk_lock_is_reported_with_its_file_and_line(tmp_path: Path) -> None:
    """A junk lock file (text, binary, empty, keys missing) is reported as ``file:line`` by
    ``ambient lock list`` and ``ambient doctor``."""
    paths = make_brain(tmp_path / "brain", example_agents=False)
    junk = {
        "text.lock": b"junk",
        "binary.lock": bytes(range(256))[::-1],
        "empty.lock": b"",
        "keys.lock": b"holder: me\nfile: keys\nexpires_at: soon\n",
    }
    for name, raw in junk.items():
        (paths.locks / name).write_bytes(raw)
    listed = _cli(paths, "lock", "list")
    doctor = _cli(paths, "doctor")
    for name in junk:
        line = 3 if name == "keys.lock" else 1  # expires_at is on line 3
        assert f"{paths.locks / name}:{line}: " in listed.stdout + listed.stderr, (name, listed)
        assert f"locks/{name}:{line}: " in doctor.stdout, (name, doctor.stdout)


def test_reject_at_a_deadline_is_the_items_own_on_a_for_each_question() -> None:
    """The pure rules: at the deadline, ``reject`` of an agent's question about a for_each item decides
    ``reject`` (that item fails), not the ``abort`` option offered beside the answers; a chain step's question and a
    failed item keep ``reject`` → ``abort``, which ends the run."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def expired(**where: str) -> str | None:
        kind = "question" if "fail" not in where else "fail"
        esc = new_escalation(
            EscalationDraft(
                workflow="w",
                run_id="r",
                kind=kind,
                question="?",
                options=question_options(["yes", "no"]) if kind == "question" else None,
                timeout=timedelta(seconds=1),
                on_timeout="reject",
                **{k: v for k, v in where.items() if k != "fail"},
            ),
            now=t0,
        )
        out = timeout_decision(esc, t0 + timedelta(seconds=1))
        return out.decided_action if out is not None else None

    assert expired(item="b") == "reject"
    assert expired(step="deploy") == "abort"
    assert expired(item="b", fail="yes") == "abort"
    assert not aborts_run("for_each", "reject", "b") and aborts_run("for_each", "abort", "b")
    assert aborts_run("chain", "reject", "deploy") and aborts_run("for_each", "reject", None)


# ---- fencing


def _guards_free(paths: BrainPaths) -> bool:
    """Whether neither the claims' nor the locks' guard is held now (each taken and given back at once)."""
    for name in ("claims.guard", "locks.guard"):
        guard = paths.state / name
        if not guard.exists():
            continue
        fd = os.open(guard, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # closing gives a lock taken back
    return True


def test_a_daemon_held_up_past_its_lease_stops_its_agent_voids_its_result_and_cannot_overwrite_the_claim(
    tmp_path: Path,
) -> None:
    """As the fault harness drove it: SIGSTOP the daemon past its scope lease, another holder takes
    the lock and closes the item's claim under its newer token, SIGCONT. The daemon notices the lost lease, stops
    its agent (which never reaches its answer), counts the attempt as void, and its claim write is refused: the
    newer holder's close stays on disk."""
    wit = tmp_path / "witness.log"
    stub = stub_agent_md("stub", ["--witness", str(wit), "--sleep-ms", "60000-60000"], timeout_s=300)
    paths = make_brain(
        tmp_path / "brain", example_agents=False, agents={"stub": stub}, config="lock_ttl_min: 0.02\n"
    )  # a 1.2 s lease; taken over 5 s (the grace) after it expires
    d = DaemonProcess(paths).start()
    try:
        d.wait_ready()
        drop(paths, "fence.yml", foreach_workflow("fence", ["a"], concurrency=1, files="projets/fence/{{item}}.md"))
        [spawned] = wait_for(lambda: events(paths, "fence", "spawned"), 20, "the agent to start")
        agent = int(spawned["pid"])
        run_id = next(paths.run_journals.glob("*.jsonl")).stem
        wait_for(lambda: (paths.claims / f"{run_id}-item-001.yml").exists(), 20, "the item's claim")
        # Stopped while it holds the claims' or the locks' guard (a write's few milliseconds), the daemon would hold
        # every command's write with it: the stop is meant to land past its lease, not inside a write.
        wait_for(lambda: _guards_free(paths), 20, "the daemon's writes of the item to end")
        os.kill(d.pid, signal.SIGSTOP)
        try:
            taken = wait_for(
                lambda: (
                    (r := ambient_cli(paths.root, "lock", "acquire", "projets/fence/a.md", "sess-other"))
                    and r.returncode == 0
                    and r
                ),
                30,
                "the lock to expire and go to another holder",
                interval=0.2,
            )
            token = int(taken.stdout.rsplit("token ", 1)[1].rstrip(")\n"))
            closed = ambient_cli(
                paths.root, "claim", "close", f"{run_id}-item-001", "--status", "partial", "--token", str(token)
            )
            assert closed.returncode == 0, closed.stderr
        finally:
            os.kill(d.pid, signal.SIGCONT)
        d.wait_logged("attempt_void_lease_lost", timeout=30)
        wait_for(lambda: not alive(agent), 30, "the stale agent to be stopped")
        wait_for(
            lambda: any("lease" in str(e.get("error")) for e in events(paths, "fence", "finished")),
            30,
            "the void attempt in the journal",
        )
        d.wait_logged("claim_write_failed", timeout=30)
    finally:
        d.stop()
        d.kill()
    assert witness(wit) == [], "the stale agent reached its answer"
    claim = yaml.safe_load((paths.claims / f"{run_id}-item-001.yml").read_text())
    assert claim["status"] == "closed" and claim["fence"] == token and claim["result"]["status"] == "partial"
    assert any("older than" in str(r.get("error")) for r in d.logged("claim_write_failed"))
