"""Ambient's private state (``.ambient/``) is never reached through a symlink, and no other
local user can read it (folders 0700, files 0600).

Each test attacks the way a same-user agent would: a real brain (``ambient init``, then one real daemon run), a
state folder or file swapped for a symlink to a folder of the attacker's, then the real daemon (``ambient run
--until-idle``) and real CLI commands as subprocesses. What must hold: nothing is written through the link (its
target stays as it was), the message names the link, and nobody sees a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ambient.human.escalation_store import EscalationStore
from ambient.human.escalations import EscalationDraft, new_escalation
from ambient.storage.paths import BrainPaths
from tests.e2e.helpers import PY, ambient_cli

pytestmark = pytest.mark.timeout(120)

PRECIOUS = b"the attacker's file: ambient must never write here\n"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A brain made by ``ambient init`` whose example workflow ran once: every state folder and file exists."""
    root = tmp_path_factory.mktemp("template") / "brain"
    init = subprocess.run([PY, "-m", "ambient", "init", str(root)], capture_output=True, text=True, timeout=60)
    assert init.returncode == 0, init.stderr
    first = ambient_cli(root, "run", "--until-idle", "--log-format", "json", timeout=90)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert (root / ".ambient" / "live" / "hello" / "log.jsonl").is_file()
    return root


@pytest.fixture
def brain(template: Path, tmp_path: Path) -> BrainPaths:
    """A copy of the template brain, the workflow's run forgotten (so that a daemon start runs it again)."""
    root = tmp_path / "brain"
    shutil.copytree(template, root, symlinks=True)
    return BrainPaths(root)


class Attack:
    """``rel`` (under the brain root) replaced by a symlink to the attacker's folder or file, which must stay as is."""

    def __init__(self, paths: BrainPaths, rel: str, tmp_path: Path) -> None:
        self.link = paths.root / rel
        self.target = tmp_path / "attacker" / rel.replace("/", "_")
        self.target.parent.mkdir(exist_ok=True)
        was_dir = self.link.is_dir()
        if was_dir:
            self.target.mkdir()
            self.target.chmod(0o755)
            shutil.rmtree(self.link)
        else:
            self.target.write_bytes(PRECIOUS)
            self.target.chmod(0o644)
            self.link.unlink(missing_ok=True)
        self.link.symlink_to(self.target, target_is_directory=was_dir)
        self.before = self.snapshot()

    def snapshot(self) -> list[tuple[str, int, bytes]]:
        """Every name, mode and content under the target (the target itself included)."""
        found = [
            ("", stat.S_IMODE(self.target.lstat().st_mode), b"" if self.target.is_dir() else self.target.read_bytes())
        ]
        if self.target.is_dir():
            for p in sorted(self.target.rglob("*")):
                found.append((str(p.relative_to(self.target)), stat.S_IMODE(p.lstat().st_mode), b""))
        return found

    def untouched(self) -> None:
        assert self.snapshot() == self.before, f"written through the link {self.link} -> {self.target}"
        assert self.link.is_symlink(), f"{self.link} was replaced (ambient removes nothing of the person's)"


def _refused(result: subprocess.CompletedProcess[str], attack: Attack, code: int = 2) -> str:
    """The command ended with ``code`` (2: stopped) and a clear message naming the link (no traceback)."""
    text = result.stdout + result.stderr
    assert "Traceback" not in text, text[-3000:]
    assert result.returncode == code, f"exit {result.returncode}: {text[-3000:]}"
    assert str(attack.link) in result.stderr, result.stderr[-2000:]
    assert "symlink" in result.stderr, result.stderr[-2000:]
    return result.stderr


# ---------------------------------------------------------------- 7. symlinked state at daemon start


@pytest.mark.parametrize(
    "rel",
    [
        ".ambient",
        ".ambient/escalations",
        ".ambient/runs",
        ".ambient/run",
        ".ambient/inbox",
        ".ambient/channels",
        ".ambient/live",
        ".ambient/outbox",
    ],
)
def test_a_symlinked_state_folder_stops_the_daemon_at_start_naming_it(
    brain: BrainPaths, tmp_path: Path, rel: str
) -> None:
    """A state folder swapped for a link: ``ambient run`` exits 2 naming it, and nothing reaches the link's target."""
    attack = Attack(brain, rel, tmp_path)
    result = ambient_cli(brain.root, "run", "--until-idle", "--log-format", "json", timeout=60)
    _refused(result, attack)
    attack.untouched()


@pytest.mark.parametrize(
    "name", ["audit.jsonl", "runs.jsonl", "daemon.lock", "daemon-events.jsonl", "claims.guard", "locks.guard"]
)
def test_a_symlinked_state_file_stops_the_daemon_at_start_naming_it(
    brain: BrainPaths, tmp_path: Path, name: str
) -> None:
    """A state file swapped for a link (the audit log killed start-up with a traceback): exit 2 naming it."""
    attack = Attack(brain, f".ambient/{name}", tmp_path)
    result = ambient_cli(brain.root, "run", "--until-idle", "--log-format", "json", timeout=60)
    _refused(result, attack)
    attack.untouched()


def test_a_symlinked_live_thread_is_a_problem_of_that_thread_only(brain: BrainPaths, tmp_path: Path) -> None:
    """``live/hello/`` swapped for a link: the daemon runs the workflow to success, writes nothing through the
    link, and says which folder it refused (a thread is not worth stopping the daemon for)."""
    attack = Attack(brain, ".ambient/live/hello", tmp_path)
    runs_before = len(brain.runs_log.read_text().splitlines())
    again = (brain.workflows / "hello.yml").read_text().replace("workflow: hello", "workflow: hello-again")
    (brain.workflows / "hello-again.yml").write_text(again)
    result = ambient_cli(brain.root, "run", "--until-idle", "--log-format", "json", timeout=90)
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    records = [json.loads(line) for line in brain.runs_log.read_text().splitlines()]
    assert len(records) == runs_before + 1
    assert records[-1]["outcome"] == "success"
    assert str(attack.link) in text and "symlink" in text, text[-3000:]
    attack.untouched()


# ---------------------------------------------------------------- 7. symlinked state and the CLI


def _escalation(paths: BrainPaths) -> str:
    esc = new_escalation(
        EscalationDraft(
            workflow="hello", run_id="run-1", kind="fail", question="Item alpha failed", item="alpha", agent="hello"
        ),
        now=datetime.now(UTC),
    )
    return EscalationStore(paths).create(esc).id


@pytest.mark.parametrize(
    ("rel", "argv"),
    [
        (".ambient", ["lock", "acquire", "workspace/a.md", "sess-attack"]),
        (".ambient", ["preflight", "fail", "workspace/"]),
        (".ambient/escalations", ["decide", "{esc}", "retry"]),
        (".ambient/inbox", ["send", "{packet}"]),
        (".ambient/audit.jsonl", ["send", "{packet}"]),
        (".ambient/live/hello", ["thread", "hello", "--handoff"]),  # exit 0: an empty handoff, the link named
    ],
)
def test_cli_commands_refuse_a_symlinked_state_folder_naming_it(
    brain: BrainPaths, tmp_path: Path, rel: str, argv: list[str]
) -> None:
    """CLI commands that write state refuse a link in ``.ambient/`` with exit 2 and its name; the target stays.

    The escalation is made before the swap and its file moved behind the link: the attacker's copy is what a
    followed link would answer."""
    esc = _escalation(brain)
    esc_file = (brain.escalations / f"{esc}.yml").read_bytes()
    packet = tmp_path / "packet.yml"
    packet.write_text(
        "from: human\nto: hello\nsignal: SPAWN\nscope:\n  zone: project\n  files: [workspace/hello/x.md]\n"
    )
    (brain.live / "hello" / "handoff.md").unlink(missing_ok=True)  # `thread --handoff` writes it when missing
    attack = Attack(brain, rel, tmp_path)
    if rel == ".ambient/escalations":
        (attack.target / f"{esc}.yml").write_bytes(esc_file)
        attack.before = attack.snapshot()
    words = [w.format(esc=esc, packet=packet) for w in argv]
    result = ambient_cli(brain.root, *words, timeout=60)
    _refused(result, attack, code=0 if argv[0] == "thread" else 2)
    attack.untouched()


# ---------------------------------------------------------------- 9. permissions


def _offenders(state: Path) -> list[str]:
    bad = []
    for p in [state, *sorted(state.rglob("*"))]:
        st = p.lstat()
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            if mode != 0o700:
                bad.append(f"{p.relative_to(state.parent)}/ {mode:o} (expected 700)")
        elif stat.S_ISSOCK(st.st_mode) or mode != 0o600:
            bad.append(f"{p.relative_to(state.parent)} {mode:o} (expected 600, a regular file)")
    return bad


def test_after_a_daemon_run_and_cli_writes_every_state_file_is_0600_and_folder_0700(tmp_path: Path) -> None:
    """Other local users read nothing of ambient's state: agent conversations, audit, journals, handoffs."""
    root = tmp_path / "brain"
    old = os.umask(0o022)  # what a login shell gives
    try:
        init = subprocess.run([PY, "-m", "ambient", "init", str(root)], capture_output=True, text=True, timeout=60)
        assert init.returncode == 0, init.stderr
        started = ambient_cli(root, "start", "hello")  # a packet in the inbox: the daemon files it under inbox/done
        assert started.returncode == 0, started.stderr
        run = ambient_cli(root, "run", "--until-idle", "--log-format", "json", timeout=90)
        assert run.returncode == 0, run.stderr[-2000:]
        paths = BrainPaths(root)
        assert list((paths.inbox / "done").iterdir()), "the start packet was consumed"
        assert "state_mode_restored" not in run.stderr, "ambient opened a state folder of its own to others"
        assert (paths.live / "hello" / "handoff.md").is_file() or (paths.live / "hello" / "log.jsonl").is_file()
        for argv in (
            ["lock", "acquire", "workspace/a.md", "sess-x"],
            ["preflight", "fail", "workspace/"],
            ["thread", "hello", "--handoff"],
        ):
            done = ambient_cli(root, *argv)
            assert done.returncode in (0, 3), done.stderr
        _escalation(paths)
    finally:
        os.umask(old)
    assert (paths.live / "hello" / "handoff.md").is_file()
    bad = _offenders(paths.state)
    assert bad == [], "state readable by others:\n" + "\n".join(bad)


def test_an_older_state_folder_open_to_others_is_narrowed_at_start(brain: BrainPaths) -> None:
    """A ``.ambient/`` made 0755 by an older ambient is narrowed to 0700 (with its folders) at the next start,
    and the daemon says so."""
    for d in (brain.state, brain.run_journals, brain.live, brain.live / "hello"):
        d.chmod(0o755)
    result = ambient_cli(brain.root, "run", "--until-idle", "--log-format", "json", timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    for d in (brain.state, brain.run_journals, brain.live):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    assert "state_mode_restored" in result.stdout + result.stderr


def test_private_dir_refuses_a_file_in_the_way_and_makes_missing_folders_0700(tmp_path: Path) -> None:
    """The one rule, directly: a file where a state folder belongs is named; missing folders come 0700."""
    from ambient.core.errors import UnsafePathError
    from ambient.storage.fsutil import private_dir

    state = tmp_path / "brain" / ".ambient"
    private_dir(state / "live" / "dev")
    assert [stat.S_IMODE(p.stat().st_mode) for p in (state, state / "live", state / "live" / "dev")] == [0o700] * 3
    (state / "runs").write_text("not a folder\n")
    with pytest.raises(UnsafePathError, match=r"\.ambient/runs: is not a folder"):
        private_dir(state / "runs")
    assert (state / "runs").read_text() == "not a folder\n"
