"""The daemon runs out of something of its own (a full disk, no file descriptor left).

Driven as a fault harness would: a real daemon on a brain that lives on a small tmpfs filled to the last byte
(root is needed to mount it: CI runs as root; elsewhere these tests say why they skip), or a daemon started under
``RLIMIT_NOFILE``. The promises: it stays up, holds its runs still and says so (log, ``status``, ``doctor``), goes
on by itself once space returns, loses nothing that was acknowledged and leaves no torn record anywhere; what it
ran out of is named as its own trouble, never blamed on the agent; ``--until-idle`` never calls held-up work idle.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ambient.storage.journal import read_jsonl
from ambient.storage.paths import BrainPaths
from tests.e2e.helpers import (
    TEST_AGENT_ENV,
    DaemonProcess,
    ambient_cli,
    command_agent_md,
    drop,
    events,
    finished_run,
    foreach_workflow,
    make_brain,
    run_records,
    runs,
    stub_agent_md,
    wait_for,
)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 6 MiB tmpfs mounted at ``tmp_path/brain`` (logs of the daemon stay outside it, in ``tmp_path``)."""
    mount = tmp_path / "brain"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=6m,mode=0755", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"a full disk needs a tmpfs mount (root): {done.stderr.strip() or done.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


def fill(disk: Path) -> Path:
    """Fill the filesystem of ``disk`` to the last block; the file to delete to free it."""
    filler = disk / "filler.bin"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        chunk = b"\0" * 65536
        while True:
            try:
                os.write(fd, chunk)
            except OSError:
                if len(chunk) == 1:
                    break
                chunk = chunk[: len(chunk) // 2]
    finally:
        os.close(fd)
    assert os.statvfs(disk).f_bavail == 0
    return filler


def no_torn_records(paths: BrainPaths) -> list[str]:
    """Every JSONL file ambient keeps, read whole: the files with a bad line or a torn tail."""
    bad = []
    files = [*paths.run_journals.glob("*.jsonl"), paths.runs_log, paths.audit]
    for f in files:
        if f.exists():
            res = read_jsonl(f)
            if res.bad_lines or res.torn_tail:
                bad.append(f"{f.name}: bad lines {res.bad_lines}, torn tail {res.torn_tail}")
    return bad


def test_a_daemon_started_on_a_full_disk_waits_says_so_and_runs_once_space_returns(
    small_disk: Path, tmp_path: Path
) -> None:
    """No exit 1 with a traceback (a restart loop under systemd): the daemon comes up, says "disk full" in its
    log, in ``status`` and in ``doctor``, is not idle while the workflow waits, and runs it once space returns."""
    stub = stub_agent_md("stub", ["--sleep-ms", "1-5"])
    paths = make_brain(small_disk, example_agents=False, agents={"stub": stub})
    drop(paths, "held.yml", foreach_workflow("held", [f"i{n}" for n in range(10)]))
    filler = fill(small_disk)
    d = DaemonProcess(paths, "--until-idle").start()
    try:
        d.wait_logged("daemon_trouble", kind="disk", timeout=30)
        assert d.proc is not None and d.proc.poll() is None, d.tail()
        status = ambient_cli(paths.root, "status")
        assert "disk full: free space in" in status.stdout, status.stdout
        doctor = ambient_cli(paths.root, "doctor")
        assert doctor.returncode == 1 and "disk full" in doctor.stdout, doctor.stdout
        filler.unlink()
        assert d.wait(60) == 0, d.tail()
    finally:
        d.kill()
    assert d.logged("daemon_trouble_over", kind="disk")
    state = finished_run(paths, "held")
    assert state is not None and state.outcome == "success"
    assert no_torn_records(paths) == []
    runs = ambient_cli(paths.root, "runs")
    assert runs.returncode == 0 and "held" in runs.stdout and "success" in runs.stdout, runs.stdout


def test_a_disk_that_fills_mid_run_holds_the_run_still_then_it_finishes_with_every_item_once(
    small_disk: Path, tmp_path: Path
) -> None:
    """The disk fills while a fan-out runs: the daemon stays up and starts nothing more; freed, the run goes on
    by itself; every item finished exactly once, no journal holds a torn record, the summary is readable, and
    the item claims a full disk kept from being written are written after."""
    stub = stub_agent_md("stub", ["--sleep-ms", "20-60"])
    paths = make_brain(small_disk, example_agents=False, agents={"stub": stub})
    items = [f"i{n:03d}" for n in range(120)]
    d = DaemonProcess(paths).start()
    try:
        d.wait_ready()
        drop(paths, "mid.yml", foreach_workflow("mid", items, concurrency=4))
        wait_for(lambda: len(events(paths, "mid", "finished")) >= 10, 30, "ten items done")
        filler = fill(small_disk)
        d.wait_logged("waiting_for_resources", timeout=30)
        assert d.proc is not None and d.proc.poll() is None, d.tail()
        assert "disk full" in ambient_cli(paths.root, "status").stdout
        filler.unlink()
        wait_for(lambda: finished_run(paths, "mid") is not None, 90, "the run to finish once space returned")
        d.wait_logged("run_finished", timeout=30)
    finally:
        d.stop()
        d.kill()
    state = finished_run(paths, "mid")
    assert state is not None and state.outcome == "success"
    done = [e["item"] for e in events(paths, "mid", "finished") if e.get("result") == "success"]
    assert sorted(done) == items
    assert no_torn_records(paths) == []
    assert [r["workflow"] for r in run_records(paths)] == ["mid"]
    listed = ambient_cli(paths.root, "claim", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert '"open"' not in listed.stdout, "an item claim a full disk kept unwritten stayed open"


# ---------------------------------------------------------------- descriptors


def _run_with_nofile(paths: BrainPaths, soft: int, hard: int, log: Path) -> subprocess.Popen[bytes]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    env = {k: v for k, v in os.environ.items() if not k.startswith("AMBIENT_")}
    env.update(TEST_AGENT_ENV)
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ambient",
                "run",
                "--brain",
                str(paths.root),
                "--until-idle",
                "--log-format",
                "json",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=limit,
            env=env,
            start_new_session=True,
        )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 9)
    proc.wait(10)


def test_a_low_soft_descriptor_limit_is_raised_at_start(tmp_path: Path) -> None:
    """``ulimit -n 32`` with room under the hard limit: the daemon raises its soft limit and 16 agents at once run
    as they would anywhere (they crashed with EMFILE and held every slot for ever)."""
    stub = stub_agent_md("stub", ["--sleep-ms", "200-400"])
    paths = make_brain(tmp_path / "brain", example_agents=False, agents={"stub": stub}, config="concurrency: 16\n")
    drop(paths, "fds.yml", foreach_workflow("fds", [f"i{n}" for n in range(32)], concurrency=16))
    proc = _run_with_nofile(paths, 32, 4096, tmp_path / "daemon.log")
    try:
        assert proc.wait(90) == 0, (tmp_path / "daemon.log").read_text()[-2000:]
    finally:
        _kill(proc)
    state = finished_run(paths, "fds")
    assert state is not None and state.outcome == "success"


def test_running_out_of_descriptors_is_the_daemons_trouble_never_the_agents_nor_idle(tmp_path: Path) -> None:
    """``ulimit -n 32`` with no room to raise it: no item stays "running" with nothing behind it (they held every
    slot and ``--until-idle`` exited 0 on a stalled run); each attempt ends as ambient's error, named as such
    (never "the agent failed"), and reaches the person as a question; the log says what ran out."""
    stub = stub_agent_md("stub", ["--sleep-ms", "200-400"])
    paths = make_brain(tmp_path / "brain", example_agents=False, agents={"stub": stub}, config="concurrency: 16\n")
    drop(paths, "fds.yml", foreach_workflow("fds", [f"i{n}" for n in range(16)], concurrency=16))
    log = tmp_path / "daemon.log"
    proc = _run_with_nofile(paths, 32, 32, log)
    try:
        assert proc.wait(120) == 0, log.read_text()[-2000:]
    finally:
        _kill(proc)
    text = log.read_text()
    assert '"daemon_trouble"' in text and "ran out of file descriptors" in text
    [state] = runs(paths, "fds")
    counts = state.counts()
    assert counts.get("running", 0) == 0, counts
    asked = ambient_cli(paths.root, "escalations")
    assert asked.returncode == 0
    unfinished = [i for i in state.items if i.status != "done"]
    for item in unfinished:
        assert item.escalation, f"{item.name} is {item.status} with nobody asked"
        assert "ran out of file descriptors" in (item.error or ""), item.error
    if unfinished:
        assert "ambient hit an error on" in asked.stdout, asked.stdout
        assert "stub hit an error" not in asked.stdout, asked.stdout


# ---------------------------------------------------------------- a stop within its bound

STOP_BOUND_S = 10.0  # docs/reliability.md: a SIGTERM with no agent at work ends the daemon within this


def _stop_time(d: DaemonProcess) -> float:
    """SIGTERM the daemon and wait for its exit (no longer than a systemd stop timeout); the seconds it took."""
    assert d.proc is not None and d.proc.poll() is None, d.tail()
    t0 = time.monotonic()
    d.signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        d.proc.wait(60)
    took = time.monotonic() - t0
    assert d.proc.poll() is not None, f"still running {took:.1f} s after SIGTERM: {d.tail()}"
    return took


def test_sigterm_on_a_full_disk_stops_within_the_bound_and_a_restart_finishes_every_item_once(
    small_disk: Path, tmp_path: Path
) -> None:
    """The disk fills mid fan-out: journals, claims and the live threads wait for space, retrying. A SIGTERM then
    stops the daemon within the documented bound (no waiting on a disk that will not free itself; systemd would kill
    it at TimeoutStopSec); what it could not write is rebuilt from the journal: once space returns, a restart
    finishes the run with every item done exactly once and no torn record."""
    stub = stub_agent_md("stub", ["--sleep-ms", "20-60"])
    paths = make_brain(small_disk, example_agents=False, agents={"stub": stub})
    items = [f"i{n:03d}" for n in range(120)]
    d = DaemonProcess(paths).start()
    try:
        d.wait_ready()
        drop(paths, "full.yml", foreach_workflow("full", items, concurrency=4))
        wait_for(lambda: len(events(paths, "full", "finished")) >= 10, 30, "ten items done")
        filler = fill(small_disk)
        d.wait_logged("waiting_for_resources", timeout=30)
        took = _stop_time(d)
    finally:
        d.kill()
    assert took <= STOP_BOUND_S, f"SIGTERM on a full disk took {took:.1f} s: {d.tail()}"
    assert d.proc is not None and d.proc.returncode == 0, d.tail()
    filler.unlink()
    again = DaemonProcess(paths, "--until-idle").start()
    try:
        assert again.wait(120) == 0, again.tail()
    finally:
        again.kill()
    state = finished_run(paths, "full")
    assert state is not None and state.outcome == "success"
    done = [e["item"] for e in events(paths, "full", "finished") if e.get("result") == "success"]
    assert sorted(done) == items
    assert no_torn_records(paths) == []
    listed = ambient_cli(paths.root, "claim", "list", "--json")
    assert listed.returncode == 0 and '"open"' not in listed.stdout, listed.stdout[-2000:]


FULL_DISK_SITE = Path(__file__).resolve().parent / "fulldisk_site"


def test_a_retry_a_full_disk_cut_in_half_survives_a_kill(tmp_path: Path) -> None:
    """Every item fails its first attempt and succeeds its second (``retry: on: [fail]``). The disk fills in the
    middle of the journal write that holds a failed attempt's ``finished`` and the ``retry`` routing it (the
    daemon runs with ``tests/chaos/fulldisk_site``, a short write then ENOSPC); the daemon waits for space and is
    killed (-9). Once space returns, a restart runs every item to its end: none is left failed as if its retry had
    never been decided (a journal kept the ``finished`` that fitted and lost the ``retry``)."""
    flaky = tmp_path / "flaky.py"
    flaky.write_text(
        "import json, sys\n"
        "packet = json.load(sys.stdin)\n"
        "attempt = int(packet['key'].rsplit('/', 1)[1])\n"
        "status = 'failed' if attempt == 1 else 'ok'\n"
        "print(json.dumps({'signal': 'RETURN', 'result': {'status': status}}))\n"
    )
    agent = command_agent_md("flaky", ["{{python}}", str(flaky)])
    paths = make_brain(tmp_path / "brain", example_agents=False, agents={"flaky": agent})
    items = [f"i{n}" for n in range(6)]
    retry = "retry: {attempts: 3, backoff: 1s, max_backoff: 1s, on: [fail]}\n"
    full = tmp_path / "disk-full"
    site = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(FULL_DISK_SITE), os.environ.get("PYTHONPATH", "")])),
        "AMBIENT_TEST_FULL_DISK": str(full),
    }
    d = DaemonProcess(paths, env=site).start()
    try:
        d.wait_ready()
        drop(paths, "flaky.yml", foreach_workflow("flaky", items, agent="flaky", concurrency=2, extra=retry))
        wait_for(lambda: events(paths, "flaky", "accepted"), 30, "the first item accepted")
        full.touch()
        wait_for(lambda: Path(f"{full}.short").exists(), 30, f"a journal write cut short: {d.tail()}")
        d.wait_logged("waiting_for_resources", timeout=30)
    finally:
        d.kill()
    full.unlink()
    again = DaemonProcess(paths, "--until-idle").start()
    try:
        assert again.wait(120) == 0, again.tail()
    finally:
        again.kill()
    state = finished_run(paths, "flaky")
    assert state is not None
    statuses = {it.name: it.status for it in state.items}
    assert statuses == dict.fromkeys(items, "done"), {k: v for k, v in statuses.items() if v != "done"}
    assert no_torn_records(paths) == []
