"""A daemon that starts while a CLI command writes: its start-up sweep leaves the command's temp file alone.

The daemon sweeps crash leftovers at start (temp files of atomic writes whose writer died). A fault harness
answered escalations with ``ambient decide`` while the daemon started: the sweep removed the temp file the answer
was being written to, the rename failed and the answer was lost with a traceback. Here each ``ambient decide`` is
held between writing its temp file and renaming it (``strace`` stops it at its first ``fsync``, the temp file's),
a daemon starts and comes up meanwhile, then the command goes on: every answer lands and the run applies it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from ambient.storage.fsutil import TMP_MARK
from ambient.storage.paths import BrainPaths
from tests.e2e.helpers import (
    DaemonProcess,
    ambient_cli,
    command_agent_md,
    drop,
    events,
    finished_run,
    foreach_workflow,
    make_brain,
    wait_for,
)

STRACE = shutil.which("strace")


def _asking_brain(root: Path) -> BrainPaths:
    """A brain whose agent asks the person on every item, then succeeds once it is given an answer."""
    script = root.parent / "asker.py"
    script.write_text(
        "import json, sys\n"
        "packet = json.load(sys.stdin)\n"
        "if packet['payload'].get('context', {}).get('decision'):\n"
        "    print(json.dumps({'signal': 'RETURN', 'result': {'status': 'ok'}}))\n"
        "else:\n"
        "    print(json.dumps({'signal': 'ESCALATE', 'question': 'Ship it?', 'options': ['yes', 'no']}))\n"
    )
    agent = command_agent_md("asker", ["{{python}}", str(script)])
    return make_brain(root, example_agents=False, agents={"asker": agent})


def _temp_files(paths: BrainPaths) -> list[str]:
    return sorted(p.name for p in paths.escalations.iterdir() if TMP_MARK in p.name)


def _held_decide(paths: BrainPaths, esc_id: str, trace: Path) -> tuple[subprocess.Popen[str], psutil.Process]:
    """``ambient decide ESC yes`` stopped at its first fsync (its temp file written, not yet renamed)."""
    argv = [STRACE or "strace", "-f", "-qq", "-o", str(trace), "-e", "trace=fsync"]
    argv += ["-e", "inject=fsync:signal=SIGSTOP:when=1"]
    argv += [sys.executable, "-m", "ambient", "--brain", str(paths.root), "decide", esc_id, "yes"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(
        lambda: trace.exists() and "stopped by SIGSTOP" in trace.read_text(),
        60,
        f"ambient decide {esc_id} held at its fsync",
    )
    [cli] = psutil.Process(proc.pid).children()
    return proc, cli


@pytest.mark.skipif(STRACE is None, reason="holding a CLI command mid-write needs strace")
def test_ambient_decide_answering_while_the_daemon_starts_is_never_lost(tmp_path: Path) -> None:
    """Three times over: ``ambient decide`` has written its temp file when a daemon starts and comes up; the temp
    file is still there once the daemon is ready, the command then exits 0 saying it decided, and the run applies
    every answer (each item asked, was answered "yes" and ends done)."""
    paths = _asking_brain(tmp_path / "brain")
    items = ["a", "b", "c"]
    drop(paths, "ask.yml", foreach_workflow("ask", items, agent="asker", concurrency=3))
    first = DaemonProcess(paths, "--until-idle").start()
    try:
        assert first.wait(60) == 0, first.tail()
    finally:
        first.kill()
    escalations = [e["escalation"] for e in events(paths, "ask", "escalated")]
    assert len(escalations) == 3, escalations

    for esc_id in escalations:
        proc, cli = _held_decide(paths, esc_id, tmp_path / f"strace-{esc_id}.txt")
        try:
            held = _temp_files(paths)
            assert held, "the held command has no temp file in escalations/"
            d = DaemonProcess(paths).start()
            try:
                d.wait_ready(60)
                assert _temp_files(paths) == held, "the daemon's start-up sweep removed a live writer's temp file"
                cli.send_signal(signal.SIGCONT)
                out, err = proc.communicate(timeout=60)
                assert proc.returncode == 0, (out, err)
                assert f"{esc_id}: yes" in out and "Traceback" not in err, (out, err)
                wait_for(
                    lambda esc_id=esc_id: any(e["escalation"] == esc_id for e in events(paths, "ask", "decided")),
                    30,
                    f"the daemon to apply the answer to {esc_id}",
                )
                assert d.stop() == 0, d.tail()
            finally:
                d.kill()
        finally:
            with contextlib.suppress(psutil.Error):
                cli.send_signal(signal.SIGCONT)
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    last = DaemonProcess(paths, "--until-idle").start()
    try:
        assert last.wait(60) == 0, last.tail()
    finally:
        last.kill()
    state = finished_run(paths, "ask")
    assert state is not None and {it.name: it.status for it in state.items} == dict.fromkeys(items, "done")
    listed = json.loads(ambient_cli(paths.root, "escalations", "--all", "--json").stdout or "[]")
    assert sorted((e["id"], e["decision"]) for e in listed) == sorted((e, "yes") for e in escalations), listed
