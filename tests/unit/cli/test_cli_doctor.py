"""`ambient doctor`: a check-up that names what is wrong with a brain and how to fix it, and writes nothing."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ambient.cli import main
from ambient.storage.paths import BrainPaths

SRC = Path(__file__).resolve().parents[3] / "src"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AMBIENT_* or credentials from the developer's shell leak into these tests. Run as root, the daemon's
    agents run as root without any capability (``agent_user: root``): the unprivileged default user can reach
    neither pytest's temp folders (root's, 0700) nor an interpreter under /root (tests/attacks drive it)."""
    for var in list(os.environ):
        if var.startswith("AMBIENT_") or var in ("CREDENTIALS_DIRECTORY", "NOTIFY_SOCKET"):
            monkeypatch.delenv(var)
    if os.geteuid() == 0:
        monkeypatch.setenv("AMBIENT_AGENT_USER", "root")


def _files(root: Path) -> dict[str, bytes]:
    """Every regular file under root with its bytes (what a command must not change)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _doctor(capsys: pytest.CaptureFixture[str], root: Path, *extra: str) -> tuple[int, list[dict[str, Any]]]:
    """Run `ambient doctor --json` and return its exit code and findings."""
    code = main(["doctor", "--brain", str(root), "--json", *extra])
    data = json.loads(capsys.readouterr().out)
    return code, data["findings"]


def _one(findings: list[dict[str, Any]], check: str, fragment: str) -> dict[str, Any]:
    """The single finding of ``check`` whose message holds ``fragment``."""
    hits = [f for f in findings if f["check"] == check and fragment in f["message"]]
    assert len(hits) == 1, findings
    return hits[0]


def test_doctor_healthy_example_brain(make_brain: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    """The example brain: exit 0, the only finding a warning that the daemon is down, and nothing is written."""
    root = make_brain()
    before = _files(root)
    code, findings = _doctor(capsys, root)
    assert code == 0
    assert [(f["severity"], f["check"]) for f in findings if f["severity"] != "info"] == [("warning", "daemon")]
    assert "systemctl" in findings[0]["hint"] and "ambient run" in findings[0]["hint"]
    assert _files(root) == before
    assert main(["doctor", "--brain", str(root), "--strict"]) == 1  # --strict: warnings count
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("warning  the daemon is down | fix: start it:")
    assert out[-1].startswith("0 error(s), 1 warning(s)")


def test_doctor_no_finding_while_daemon_holds_the_brain(
    make_brain: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """With the daemon's flock held and its pid recorded, the example brain is all clear."""
    root = make_brain()
    paths = BrainPaths(root)
    paths.state.mkdir(mode=0o700)  # as the daemon makes them: private
    (paths.state / "daemon.json").write_text(json.dumps({"pid": os.getpid()}))
    (paths.state / "daemon.json").chmod(0o600)
    fd = os.open(paths.daemon_lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert main(["doctor", "--brain", str(root)]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0].endswith(f"(daemon up (pid {os.getpid()}))")
        assert out[-1].startswith("ok: nothing wrong found")
    finally:
        os.close(fd)


@pytest.fixture
def sick_brain(make_brain: Callable[..., Path]) -> Iterator[Path]:
    """The example brain with a dead holder's lock, a stale claim, a broken workflow and a failing notification."""
    root = make_brain()
    # A pid-bound lock whose process exited without releasing it.
    code = (
        "import sys; from pathlib import Path; from ambient.claims.locks import LockManager; "
        "from ambient.storage.paths import BrainPaths; "
        "LockManager(BrainPaths(Path(sys.argv[1]))).acquire('projets/x.md', 'sess-gone', pid_bound=True)"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    subprocess.run([sys.executable, "-c", code, str(root)], check=True, env=env, timeout=60)
    # A lock whose TTL passed long ago (as the source's file-lock.sh writes them).
    from ambient.claims.locks import LockManager

    expired = LockManager(BrainPaths(root), check_filesystem=False).path_for("projets/y.md")
    expired.write_text(
        "file: projets/y.md\nholder: sess-late\nclaimed_at: 2020-01-01T00:00\n"
        "expires_at: 2020-01-01T01:00\nttl_min: 60\n"
    )
    # A claim opened three days ago, never touched since (default TTL: stale_claim_hours = 24).
    opened = (datetime.now() - timedelta(days=3)).strftime("%Y-%m-%dT%H:%M")
    (root / "claims" / "sess-old.yml").write_text(
        f"sess_id: sess-old\ntype: solo\nscope: projets/old/\nagent: coder\nstatus: open\nopened_at: '{opened}'\n"
    )
    # A workflow that does not load.
    (root / "workflows" / "broken.yml").write_text(
        "workflow: broken\nfor_each:\n  spawn: deploy\n  scope:\n    files: ['projets/{{item}}.md']\n"
    )
    # An escalation two days old whose notification failed three times.
    from ambient.human.escalation_store import EscalationStore
    from ambient.human.escalations import EscalationDraft, new_escalation

    store = EscalationStore(BrainPaths(root))
    created = datetime.now().astimezone() - timedelta(days=2)
    esc = store.create(
        new_escalation(
            EscalationDraft(
                workflow="deploy-batch", run_id="run-1", kind="fail", item="instance-07", question="health check failed"
            ),
            now=created,
        )
    )
    for n in range(3):
        store.record_attempt(
            esc.id, ok=False, error="tgram://12****: 401 Unauthorized", now=created + timedelta(minutes=n)
        )
    yield root


@pytest.mark.slow
def test_doctor_names_each_problem_with_its_fix(sick_brain: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Dead lock holder, stale claim, broken workflow, failing notification, daemon down: each with its hint."""
    before = _files(sick_brain)
    code, findings = _doctor(capsys, sick_brain)
    assert code == 1
    lock = _one(findings, "locks", "lock on projets/x.md: holder sess-gone")
    assert lock["severity"] == "warning" and "is dead" in lock["message"]
    assert "ambient lock cleanup" in lock["hint"]
    late = _one(findings, "locks", "lock on projets/y.md: holder sess-late, TTL passed at 2020-01-01T01:00")
    assert "ambient lock cleanup" in late["hint"]
    claim = _one(findings, "claims", "claim sess-old")
    assert "past its TTL" in claim["message"] and "ambient claim close sess-old" in claim["hint"]
    assert claim["file"] == "claims/sess-old.yml"
    wf = _one(findings, "workflows", "for_each.items")
    assert (wf["severity"], wf["file"], wf["line"]) == ("error", "workflows/broken.yml", 2)
    assert "ambient validate" in wf["hint"]
    note = _one(findings, "escalations", "failed 3 times")
    assert note["severity"] == "error" and "401 Unauthorized" in note["message"]
    assert "ambient notify test" in note["hint"] and "ambient decide" in note["hint"]
    waiting = _one(findings, "escalations", "has waited on you for 2 d")
    assert waiting["hint"].startswith("`ambient decide ")
    daemon = _one(findings, "daemon", "the daemon is down")
    assert daemon["severity"] == "warning" and "ambient run --brain" in daemon["hint"]
    tmp = [f for f in findings if f["check"] == "tmp"]  # the dead lock holder's spare inodes, if it left any
    assert all("temp file(s) left by interrupted writes" in f["message"] for f in tmp)
    assert _files(sick_brain) == before  # doctor writes nothing
    assert main(["doctor", "--brain", str(sick_brain)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("error    ")
    assert "workflows/broken.yml:2: for_each.items: Field required | fix: fix the workflow" in lines[1] + lines[2]
    assert all(" | fix: " in line for line in lines[1:-1])


def test_doctor_daemon_down_with_work_waiting_is_an_error(
    make_brain: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A packet in the inbox and no daemon: the daemon-down finding becomes an error naming the waiting work."""
    root = make_brain()
    paths = BrainPaths(root)
    paths.inbox.mkdir(parents=True)
    (paths.inbox / "p-1.json").write_text("{}")
    code, findings = _doctor(capsys, root)
    assert code == 1
    daemon = _one(findings, "daemon", "the daemon is down")
    assert daemon["severity"] == "error" and "1 packet(s) in the inbox" in daemon["message"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_doctor_notify_sends_a_test_only_when_asked(
    make_brain: Callable[..., Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URL nobody listens on: not tried by default; with --notify an error naming the masked URL."""
    root = make_brain()
    monkeypatch.setenv("AMBIENT_NOTIFY_URLS", f"json://127.0.0.1:{_closed_port()}/hook")
    code, findings = _doctor(capsys, root)
    assert code == 0 and not [f for f in findings if f["check"] == "notify"]
    code, findings = _doctor(capsys, root, "--notify", "--timeout", "5")
    assert code == 1
    bad = _one(findings, "notify", "does not work")
    assert bad["severity"] == "error" and "json://127.0.0.1" in bad["message"]
    assert "ambient notify test" in bad["hint"]


def test_doctor_reports_config_errors_at_their_line(
    make_brain: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """An invalid profil/ambient.yml is an error at its line; the other checks still run on the defaults."""
    root = make_brain()
    (root / "profil" / "ambient.yml").write_text("tick_seconds: 30\nstale_claim_hours: never\n")
    code, findings = _doctor(capsys, root)
    assert code == 1
    bad = _one(findings, "config", "stale_claim_hours")
    assert (bad["file"], bad["line"]) == ("profil/ambient.yml", 2)
    assert "ambient config template" in bad["hint"]
    assert _one(findings, "daemon", "down")


def test_doctor_telegram_backlog_close_to_retention(
    make_brain: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Telegram answers on, daemon down for 13 h with an escalation pending and a saved press: errors with hints."""
    from ambient.human.escalation_store import EscalationStore
    from ambient.human.escalations import EscalationDraft, new_escalation

    root = make_brain()
    (root / "profil" / "ambient.yml").write_text("telegram:\n  answers: true\n  chat_id: '42'\n")
    paths = BrainPaths(root)
    EscalationStore(paths).create(
        new_escalation(
            EscalationDraft(workflow="w", run_id="r", kind="gate", question="deploy?"), now=datetime.now().astimezone()
        )
    )
    state = paths.state / "telegram.json"
    state.write_text(json.dumps({"offset": 7, "pending": [{"update_id": 6}]}))
    old = (datetime.now() - timedelta(hours=13)).timestamp()
    os.utime(state, (old, old))
    code, findings = _doctor(capsys, root)
    assert code == 1
    backlog = _one(findings, "telegram", "have not been read for 13 h")
    assert backlog["severity"] == "error" and "24 h" in backlog["message"]
    assert "start the daemon" in backlog["hint"]
    presses = _one(findings, "telegram", "1 Telegram button press(es)")
    assert "applies them first" in presses["hint"]
    old = (datetime.now() - timedelta(hours=30)).timestamp()
    os.utime(state, (old, old))
    _, findings = _doctor(capsys, root)
    assert "are lost" in _one(findings, "telegram", "have not been read for 30 h")["message"]


def test_doctor_leftover_temp_file_and_not_a_brain(
    make_brain: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dead writer's temp file is named (not removed); a folder that is no brain is refused with `init` (exit 2),
    as every command refuses it."""
    root = make_brain()
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True, timeout=30
    )
    leftover = root / "claims" / f".sess-x.yml.tmp.{proc.stdout.strip()}.0a1b2c3d"
    leftover.write_text("half")
    _, findings = _doctor(capsys, root)
    assert "claims/.sess-x.yml.tmp." in _one(findings, "tmp", "1 temp file(s)")["message"]
    assert leftover.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["doctor", "--brain", str(empty)]) == 2
    err = capsys.readouterr().err
    assert "is not a brain" in err and "ambient init" in err
    assert main(["doctor", "--brain", str(tmp_path / "missing")]) == 2
