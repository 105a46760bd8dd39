"""docs/service.md, docs/reliability.md and docs/troubleshooting.md: the daemon as systemd and a person meet it."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import pty
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.acceptance.harness import AMBIENT, OK_AGENT, Brain, Daemon, Webhook, ambient, clean_env, wait

UNITS = Path(__file__).resolve().parents[2] / "examples" / "systemd"
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed on this machine")

TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"  # Telegram's shape: bot id, colon, 35 characters


# Notes each start (item, attempt, pid) and waits until the brain holds workspace/go, then succeeds.
WAITING_AGENT = """
    import json, os, pathlib, sys, time
    brain = pathlib.Path(os.environ["AMBIENT_BRAIN"])
    work = brain / "workspace"
    work.mkdir(exist_ok=True)
    with open(work / "starts.log", "a") as f:
        f.write(f"{os.environ['AMBIENT_ITEM']} {os.environ['AMBIENT_ATTEMPT']} {os.getpid()}\\n")
    deadline = time.monotonic() + 120
    while not (work / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps({"status": "ok"}))
"""


def _fanout(brain: Brain, name: str, agent: str, items: list[str], extra: str = "") -> None:
    brain.workflow(
        name,
        f"""
        workflow: {name}
        for_each:
          items: [{", ".join(items)}]
          spawn: {agent}
          scope: {{zone: project, files: ["infrastructure/{{{{item}}}}.yml"]}}
        {extra}
    """,
    )


def _starts(brain: Brain) -> list[tuple[str, int, int]]:
    path = brain.path("workspace/starts.log")
    if not path.exists():
        return []
    return [(p[0], int(p[1]), int(p[2])) for p in (ln.split() for ln in path.read_text().splitlines()) if len(p) == 3]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                found.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
    return found


@contextlib.contextmanager
def _released_agents(brain: Brain) -> Iterator[None]:
    """At the end, agents that wait for workspace/go are let go (an orphan of a killed daemon ends too)."""
    try:
        yield
    finally:
        brain.path("workspace").mkdir(exist_ok=True)
        brain.path("workspace/go").write_text("")


# ---------------------------------------------------------------- the systemd units


def _installed_system_unit(tmp_path: Path) -> Path:
    """examples/systemd/ambient.service as installed beside this ambient (its ExecStart names the real command)."""
    text = (UNITS / "ambient.service").read_text()
    assert "ExecStart=/opt/ambient/venv/bin/ambient run --brain /srv/brain" in text
    unit = tmp_path / "units" / "ambient.service"
    unit.parent.mkdir()
    unit.write_text(text.replace("/opt/ambient/venv/bin/ambient", AMBIENT[0]))
    return unit


@needs_analyze
def test_the_system_unit_verifies(tmp_path: Path) -> None:
    """examples/systemd/ambient.service passes `systemd-analyze verify` with no warning about it."""
    assert ANALYZE is not None
    unit = _installed_system_unit(tmp_path)
    res = subprocess.run([ANALYZE, "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False)
    ours = [line for line in (res.stdout + res.stderr).splitlines() if "ambient" in line]
    assert res.returncode == 0 and ours == [], res.stdout + res.stderr


@needs_analyze
def test_the_user_unit_verifies(tmp_path: Path) -> None:
    """examples/systemd/ambient-user.service passes `systemd-analyze --user verify` (venv and brain in ~)."""
    assert ANALYZE is not None
    home = tmp_path / "home"
    venv_bin = home / ".local" / "share" / "ambient" / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "ambient").symlink_to(AMBIENT[0])
    Brain.init(home / "brain")
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    unit = tmp_path / "units" / "ambient.service"
    unit.parent.mkdir()
    unit.write_text((UNITS / "ambient-user.service").read_text())
    env = {**os.environ, "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)}
    res = subprocess.run(
        [ANALYZE, "--user", "verify", str(unit)], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    if "Failed to initialize manager" in res.stderr:
        pytest.skip(f"systemd-analyze cannot simulate a user manager here: {res.stderr.strip()[:200]}")
    ours = [line for line in (res.stdout + res.stderr).splitlines() if "ambient" in line]
    assert res.returncode == 0 and ours == [], res.stdout + res.stderr


@needs_analyze
def test_the_system_unit_scores_1_7_in_systemd_analyze_security(tmp_path: Path) -> None:
    """The shipped unit scores 1.7 in `systemd-analyze security`."""
    assert ANALYZE is not None
    unit = _installed_system_unit(tmp_path)
    res = subprocess.run(
        [ANALYZE, "security", "--offline=true", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", res.stdout)
    assert match is not None, res.stdout[-600:] + res.stderr
    assert float(match.group(1)) <= 1.7, match.group(0)


def _unit_settings(name: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in (UNITS / name).read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


@pytest.mark.parametrize("name", ["ambient.service", "ambient-user.service"])
def test_the_units_are_type_notify_drain_with_kill_mode_mixed_and_take_the_token_as_a_credential(name: str) -> None:
    """Both units: Type=notify, KillMode=mixed, the bot token through LoadCredential= (never argv nor Environment=)."""
    unit = _unit_settings(name)
    assert unit["Type"] == ["notify"]
    assert unit["KillMode"] == ["mixed"]
    assert any(v.startswith("telegram-token:") for v in unit["LoadCredential"]), unit["LoadCredential"]
    assert "WatchdogSec" in unit and unit["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    for key in ("Environment", "ExecStart"):
        assert not any("token" in v.lower() for v in unit.get(key, [])), (key, unit.get(key))


# ---------------------------------------------------------------- Type=notify


class NotifySocket:
    """What systemd listens on for a Type=notify service: an AF_UNIX datagram socket; messages kept with their time."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="ns-", dir="/tmp")  # short: a unix socket path has ~108 bytes
        self.path = os.path.join(self.dir, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            self.messages.append((time.monotonic(), data.decode()))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def states(self) -> list[str]:
        """Every message but the watchdog pings, in order."""
        return [m for _, m in list(self.messages) if m != "WATCHDOG=1"]

    def index(self, prefix: str, start: int = 0) -> int | None:
        states = self.states()
        return next((i for i in range(start, len(states)) if states[i].startswith(prefix)), None)


def test_type_notify_ready_reload_watchdog_and_stopping(brain: Brain) -> None:
    """Type=notify: READY=1 once state is recovered and watchers run, RELOADING=1 + MONOTONIC_USEC then READY=1
    around a reload, WATCHDOG=1 pings from the loop, STOPPING=1 on shutdown; agents never see NOTIFY_SOCKET."""
    brain.python_agent(
        "spy",
        """
        import json, os, pathlib, sys
        json.load(sys.stdin)
        out = pathlib.Path(os.environ["AMBIENT_BRAIN"], "workspace")
        out.mkdir(exist_ok=True)
        (out / "env.json").write_text(json.dumps(sorted(os.environ)))
        print(json.dumps({"status": "ok"}))
    """,
    )
    ns = NotifySocket()
    try:
        daemon = brain.daemon(env={"NOTIFY_SOCKET": ns.path, "WATCHDOG_USEC": "1000000"}).start(ready=False)
        try:
            wait(lambda: ns.index("READY=1") is not None, "READY=1")
            ready_at, ready = next((t, m) for t, m in ns.messages if m.startswith("READY=1"))
            assert re.search(r"^STATUS=.+", ready, re.M), ready  # the line `systemctl status` shows
            assert not any(m == "WATCHDOG=1" and t < ready_at for t, m in ns.messages)
            assert daemon.logged("daemon_ready")
            _fanout(brain, "probe", "spy", ["one"])  # dropped right after READY=1: the watchers already run
            brain.wait_finished("probe", timeout=10)
            daemon.signal(signal.SIGHUP)
            reloading = wait(lambda: ns.index("RELOADING=1"), "RELOADING=1")
            assert re.search(r"^MONOTONIC_USEC=\d+$", ns.states()[reloading], re.M), ns.states()[reloading]
            wait(lambda: ns.index("READY=1", reloading + 1) is not None, "READY=1 after the reload")
            wait(lambda: sum(m == "WATCHDOG=1" for _, m in ns.messages) >= 8, "watchdog pings")
            assert daemon.stop() == 0
        finally:
            daemon.kill()
        stopping = ns.index("STOPPING=1")
        assert stopping is not None, ns.states()
        pings = [t for t, m in ns.messages if m == "WATCHDOG=1" and t > ready_at]
        gaps = [b - a for a, b in itertools.pairwise(pings)]
        assert max(gaps) < 1.0, max(gaps)  # WATCHDOG_USEC: systemd would restart a daemon silent this long
    finally:
        ns.close()
    seen = json.loads(brain.read("workspace/env.json"))
    assert not [v for v in seen if v in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")], seen


# ---------------------------------------------------------------- one daemon per brain, SIGTERM


def test_a_second_run_exits_at_once_naming_the_running_pid(brain: Brain) -> None:
    """One daemon per brain: a second `ambient run` exits at once naming the running pid; `kill -TERM N` stops it
    (Troubleshooting, "ambient is already running on … (pid N)")."""
    with brain.daemon() as daemon:
        second = brain.cli("run", "--log-format", "json", timeout=30)
        assert second.rc != 0, second
        assert re.search(rf"already running on .*\(pid {daemon.pid}\)", second.err), second
        os.kill(daemon.pid, signal.SIGTERM)
        assert daemon.proc is not None and daemon.proc.wait(timeout=60) == 0
    with brain.daemon() as again:
        assert brain.status()["daemon"] == {"up": True, "pid": again.pid}


def test_sigterm_with_running_agents_exits_0_and_their_items_run_again_at_the_next_start(brain: Brain) -> None:
    """SIGTERM with agents running: exit 0, no lock left, and the interrupted items run again at the next start."""
    brain.python_agent("deploy", WAITING_AGENT)
    _fanout(brain, "rollout", "deploy", ["eu-1", "eu-2", "eu-3"])
    with _released_agents(brain):
        with brain.daemon() as daemon:
            wait(lambda: len(_starts(brain)) == 3, "three agents running")
            assert daemon.stop() == 0
        assert brain.ok("lock", "list", "--json").json() == []
        assert brain.finished("rollout") == []
        first_pids = [pid for _, _, pid in _starts(brain)]
        assert not any(_alive(pid) for pid in first_pids)
        brain.path("workspace/go").write_text("")
        with brain.daemon():
            [record] = brain.wait_finished("rollout")
    assert record["outcome"] == "success", record
    starts = _starts(brain)
    assert sorted(item for item, _, _ in starts) == ["eu-1", "eu-1", "eu-2", "eu-2", "eu-3", "eu-3"], starts


def test_sigterm_again_while_it_stops_still_ends_in_a_clean_exit_0(brain: Brain) -> None:
    """A stop under way finishes cleanly however many SIGTERMs arrive meanwhile (an impatient operator, a
    supervisor repeating its signal): exit 0, not death by the signal once the event loop has closed."""
    brain.python_agent("deploy", WAITING_AGENT)
    _fanout(brain, "rollout", "deploy", ["eu-1"])
    with _released_agents(brain), brain.daemon("--log-level", "debug") as daemon:
        wait(lambda: len(_starts(brain)) == 1, "the agent running")
        assert daemon.proc is not None
        for _ in range(100_000):  # bounded: the daemon ends within shutdown_grace_s + the agent's kill grace
            if daemon.proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                daemon.proc.send_signal(signal.SIGTERM)
            time.sleep(0.001)
        assert daemon.stop() == 0
    assert "daemon_stopped" in daemon.log_path.read_text()


# ---------------------------------------------------------------- hostile input

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
)
DEEP = "x: " + "[" * 5000 + "]" * 5000 + "\n"


def _huge(first: str) -> str:
    return first + "items:\n" + "".join(f"  - item-{i:07d}-{'p' * 40}\n" for i in range(60_000))


def test_hostile_yaml_in_workflows_is_a_file_line_problem_and_never_stops_the_daemon(brain: Brain) -> None:
    """Hostile workflow YAML (an aliases bomb, duplicate keys, deep nesting, a huge file) is a file:line problem;
    the daemon goes on."""
    brain.python_agent("ok", OK_AGENT)
    hostile = {
        "bomb": ("workflow: bomb\n" + BOMB, r"workflows/bomb\.yml:\d+: .*alias"),
        "dup": (
            "workflow: dup\nfor_each:\n  items: [a]\n  spawn: ok\n  spawn: ok\n"
            '  scope: {zone: project, files: ["x/{{item}}.md"]}\n',
            r"workflows/dup\.yml:5: .*duplicate",
        ),
        "deep": ("workflow: deep\n" + DEEP, r"workflows/deep\.yml:\d+: .*nesting"),
        "huge": (_huge("workflow: huge\n"), r"workflows/huge\.yml:(\d+:)? .*(limit|bytes)"),
    }
    with brain.daemon() as daemon:
        for name, (text, _) in hostile.items():
            brain.write(f"workflows/{name}.yml", text)
        for name, (_, pattern) in hostile.items():
            wait(
                lambda p=pattern: any(re.match(p, str(r.get("problem"))) for r in daemon.logged("brain_problem")),
                f"the problem of {name}.yml in the log",
            )
        _fanout(brain, "after", "ok", ["a"])
        brain.wait_finished("after")
        assert daemon.proc is not None and daemon.proc.poll() is None
    res = brain.cli("validate")
    assert res.rc == 1
    for _, pattern in hostile.values():
        assert re.search("^" + pattern, res.out, re.M), (pattern, res.out)
    assert {r["workflow"] for r in brain.finished()} == {"after"}


def test_hostile_yaml_in_claims_and_agents_is_a_file_line_problem_and_never_stops_the_daemon(brain: Brain) -> None:
    """Hostile claim and agent files become file:line problems; the daemon starts, runs and goes on."""
    brain.python_agent("ok", OK_AGENT)
    brain.write("claims/bomb.yml", "sess_id: bomb\n" + BOMB)
    brain.write("claims/dup.yml", "sess_id: dup\nstatus: open\nstatus: closed\n")
    brain.write("claims/deep.yml", "sess_id: deep\n" + DEEP)
    brain.write("claims/huge.yml", _huge("sess_id: huge\n"))
    brain.write("agents/twice.md", "---\nname: twice\nname: again\ntype: agent\n---\n# twice\n")
    res = brain.cli("validate")
    assert res.rc == 1, res
    for pattern in (
        r"claims/bomb\.yml:\d+: .*alias",
        r"claims/dup\.yml:3: .*duplicate",
        r"claims/deep\.yml:\d+: .*nesting",
        r"claims/huge\.yml:(\d+:)? .*(limit|bytes)",
        r"agents/twice\.md:3: .*duplicate",
    ):
        assert re.search("^" + pattern, res.out, re.M), (pattern, res.out)
    with brain.daemon() as daemon:
        _fanout(brain, "after", "ok", ["a"])
        brain.wait_finished("after")
        brain.write("claims/late.yml", "sess_id: late\n" + BOMB)
        assert "unreadable" in brain.ok("status").out
        assert daemon.proc is not None and daemon.proc.poll() is None
    for name in ("bomb", "dup", "deep", "huge"):
        assert brain.path(f"claims/{name}.yml").exists()  # never rewritten or deleted


# ---------------------------------------------------------------- agent text, secrets

EVIL = "disk \x1b[31mFULL\x1b[0m on \u202egnp.exe\u202c see \x9b2J"


def test_agent_text_never_drives_the_terminal(brain: Brain) -> None:
    """Agent text is shown with control, C1 and bidi characters escaped (`\\x1b`, `\\u202e`) by the CLI and the
    console logs; `--json` keeps the values, as JSON escapes."""
    brain.python_agent(
        "evil",
        f"""
        import sys
        print({EVIL!r}, file=sys.stderr)
        sys.exit(3)
    """,
    )
    _fanout(brain, "evil", "evil", ["a"])
    console = brain.cli("run", "--until-idle", "--log-format", "console")
    assert console.rc == 0, console
    failed = [line for line in console.text.splitlines() if "item_failed" in line]
    assert failed and "FULL" in failed[0] and "x1b[31m" in failed[0] and "u202e" in failed[0], console.text
    shown = {
        "escalations": brain.ok("escalations").out,
        "status": brain.ok("status").out,
        "status WORKFLOW": brain.ok("status", "evil").out,
    }
    for what, out in shown.items():
        assert "FULL" in out, (what, out)
        assert "\\x1b[31m" in out and "\\u202e" in out, (what, out)
        assert not re.search("[\x1b\x9b\u202e\u202c]", out), what
    assert not re.search("[\x1b\x9b\u202e\u202c]", console.out + console.err)
    raw = brain.ok("escalations", "--json")
    assert not re.search("[\x1b\x9b\u202e\u202c]", raw.out)
    [esc] = raw.json()
    assert EVIL in esc["question"]


def _everything(brain: Brain, *extra: str) -> str:
    """Every file of the brain and the given outputs, as one text (to look for a secret)."""
    texts = list(extra)
    for p in brain.root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            texts.append(p.read_bytes().decode(errors="replace"))
    return "\n".join(texts)


def test_the_bot_token_never_reaches_logs_records_or_agents(brain: Brain, tmp_path: Path) -> None:
    """The bot token ({telegram_token} from $CREDENTIALS_DIRECTORY) never reaches logs, records, claims, errors,
    the CLI or the agents' environment, even while its notifications fail."""
    creds = tmp_path / "creds"
    creds.mkdir(mode=0o700)
    (creds / "telegram-token").write_text(TOKEN)
    env = {"CREDENTIALS_DIRECTORY": str(creds)}
    brain.python_agent(
        "spy",
        """
        import json, os, pathlib, sys
        out = pathlib.Path(os.environ["AMBIENT_BRAIN"], "workspace")
        out.mkdir(exist_ok=True)
        (out / "env.json").write_text(json.dumps(dict(os.environ)))
        print("the instance is down", file=sys.stderr)
        sys.exit(1)
    """,
    )
    _fanout(brain, "spy", "spy", ["a"])
    with Webhook() as hook:
        hook.fail_next = 10_000
        brain.config(f"""
            notify:
              urls: ["json://bot:{{telegram_token}}@{hook.address}/hook"]
              retry_base_s: 0.1
              retry_cap_s: 0.2
        """)
        with brain.daemon(env=env) as daemon:
            brain.wait_escalation("the failed item")
            daemon.wait_log("notify_failed", count=3)
            outputs = [
                brain.cli(*args, env=env).text
                for args in (
                    ["status"],
                    ["status", "--json"],
                    ["escalations"],
                    ["escalations", "--json"],
                    ["config", "show"],
                    ["doctor"],
                    ["doctor", "--json"],
                    ["runs"],
                    ["validate"],
                )
            ]
        log = daemon.log_path.read_text()
    assert "notify_failed" in log
    agent_env = json.loads(brain.read("workspace/env.json"))
    assert "CREDENTIALS_DIRECTORY" not in agent_env
    everything = _everything(brain, log, *outputs)
    assert TOKEN not in everything
    assert TOKEN.split(":")[1] not in everything


def test_a_bot_token_in_agent_text_is_masked_in_records_and_errors(brain: Brain) -> None:
    """Tokens are masked in logs, errors, records and `ambient status`: also when an agent's error carries one."""
    brain.python_agent(
        "leaky",
        f"""
        import sys
        print("POST https://api.telegram.org/bot{TOKEN}/sendMessage failed", file=sys.stderr)
        sys.exit(1)
    """,
    )
    _fanout(brain, "leaky", "leaky", ["a"])
    res = brain.cli("run", "--until-idle", "--log-format", "json")
    assert TOKEN.split(":")[1] not in brain.ok("status").out  # status masks it
    shown = [res.text, brain.ok("escalations").out, brain.ok("escalations", "--json").out]
    state = [p.read_text(errors="replace") for p in brain.path(".ambient").rglob("*") if p.is_file()]
    claims = [p.read_text(errors="replace") for p in brain.path("claims").rglob("*.yml")]
    assert TOKEN.split(":")[1] not in "\n".join(shown + state + claims)


# ---------------------------------------------------------------- Troubleshooting


def test_a_workflow_that_does_not_start(brain: Brain) -> None:
    """ "A workflow does not start": `ambient validate` gives file:line; it runs by itself only the first time its
    file is seen, then `ambient start NAME`."""
    brain.python_agent("ok", OK_AGENT)
    with brain.daemon() as daemon:
        brain.write(
            "workflows/ship.yml",
            "workflow: ship\nfor_each:\n  items: [a]\n  spawn: okk\n"
            '  scope: {zone: project, files: ["x/{{item}}.md"]}\n',
        )
        wait(
            lambda: any("workflows/ship.yml:4" in str(r.get("problem")) for r in daemon.logged("brain_problem")),
            "the problem in the log",
        )
        res = brain.cli("validate")
        assert res.rc == 1 and re.search(r"^workflows/ship\.yml:4: .*okk", res.out, re.M), res
        assert brain.finished("ship") == [] and brain.status()["runs"] == []
        brain.write("workflows/ship.yml", brain.read("workflows/ship.yml").replace("okk", "ok"))
        brain.wait_finished("ship")
        reloads = len(daemon.logged("reloaded"))
        brain.write("workflows/ship.yml", brain.read("workflows/ship.yml") + "# edited\n")
        daemon.wait_log("reloaded", count=reloads + 1)
        assert len(daemon.logged("run_started", workflow="ship")) == 1  # an edit does not start it again
        brain.ok("start", "ship")
        brain.wait_finished("ship", count=2)


def test_an_escalation_that_was_never_notified(brain: Brain) -> None:
    """ "An escalation was never notified": `ambient status` says so; `ambient doctor` lists notifications that keep
    failing; the escalation stays answerable meanwhile and is delivered once the URL works."""
    brain.python_agent(
        "deploy",
        """
        import sys
        sys.exit(1)
    """,
    )
    _fanout(brain, "rollout", "deploy", ["eu-1"])
    with Webhook() as hook:
        hook.fail_next = 10_000
        brain.config(f"""
            notify:
              urls: ["{hook.url}"]
              retry_base_s: 0.1
              retry_cap_s: 0.2
        """)
        with brain.daemon() as daemon:
            [esc] = brain.wait_escalation("the failed item")
            [opened] = daemon.wait_log("escalation_opened")  # journalctl: one event a line, workflow/run_id/item
            assert (opened["workflow"], opened["item"], opened["run_id"]) == ("rollout", "eu-1", esc["run_id"])
            daemon.wait_log("notify_failed", count=6)
            assert "notification not delivered yet" in brain.ok("status").out
            assert brain.status()["escalations"][0]["notified"] is False

            def failing() -> list[dict[str, Any]]:
                found = brain.cli("doctor", "--json").json()["findings"]
                return [f for f in found if esc["id"] in f["message"] and "fail" in f["message"]]

            [finding] = wait(failing, "doctor to list the failing notification")
            assert finding["severity"] in ("error", "warning") and finding["hint"]
            hook.fail_next = 0
            wait(lambda: any(esc["id"] in t for t in hook.texts()), "the escalation delivered")
            assert brain.decide(esc["id"], "skip").rc == 0  # answerable all along


def test_status_tells_a_delivered_escalation_from_one_never_notified(brain: Brain) -> None:
    """The escalation file holds its notification attempts; `ambient status` counts them and says when an escalation
    was never notified, not once it was."""
    brain.python_agent("deploy", "import sys\nsys.exit(1)\n")
    _fanout(brain, "rollout", "deploy", ["eu-1"])
    with Webhook() as hook:
        hook.fail_next = 10_000
        brain.config(f"""
            notify:
              urls: ["{hook.url}"]
              retry_base_s: 0.1
              retry_cap_s: 0.2
        """)
        with brain.daemon() as daemon:
            [esc] = brain.wait_escalation("the failed item")
            daemon.wait_log("notify_failed", count=4)
            failing = brain.status()["escalations"][0]
            stored = yaml.safe_load(brain.read(f".ambient/escalations/{esc['id']}.yml"))
            hook.fail_next = 0
            wait(lambda: any(esc["id"] in t for t in hook.texts()), "the escalation delivered")
            wait(brain.outbox_empty, "the outbox to be empty")
            delivered = brain.ok("status")
    assert failing["attempts"] >= 3, failing
    assert stored["notify"]["count"] >= 3 and stored["notify"]["attempts"], stored["notify"]
    assert "not delivered" not in delivered.out, delivered.out


def _killed_mid_fanout(brain: Brain) -> tuple[Daemon, list[int]]:
    """A daemon killed -9 while two agents hold their scope locks; the daemon and its orphaned agents' pids."""
    brain.python_agent("deploy", WAITING_AGENT)
    _fanout(brain, "rollout", "deploy", ["eu-1", "eu-2"])
    daemon = brain.daemon().start()
    wait(lambda: len(_starts(brain)) == 2, "two agents running")
    wait(lambda: len(brain.ok("lock", "list", "--json").json()) == 2, "their two locks")
    assert daemon.proc is not None
    daemon.proc.kill()
    daemon.proc.wait(timeout=30)
    return daemon, [pid for _, _, pid in _starts(brain)]


def test_a_lock_whose_holder_died_is_free_to_a_contender_and_cleaned_up(brain: Brain) -> None:
    """ "A lock stays held": `ambient lock check FILE`; a lock whose holder died on this host is free at once to a
    contender; `ambient lock cleanup` removes it."""
    with _released_agents(brain):
        daemon, _ = _killed_mid_fanout(brain)
        try:
            check = brain.cli("lock", "check", "infrastructure/eu-1.yml")
            assert check.rc == 0 and "dead" in check.out, check
            took = brain.cli("lock", "acquire", "infrastructure/eu-1.yml", "sess-person")
            assert took.rc == 0, took
            held = brain.cli("lock", "check", "infrastructure/eu-1.yml")
            assert held.rc == 1 and "sess-person" in held.out, held
            assert brain.cli("lock", "release", "infrastructure/eu-1.yml", "sess-person").rc == 0
            assert brain.cli("lock", "cleanup").rc == 0
            assert brain.ok("lock", "list", "--json").json() == []
        finally:
            daemon.kill()


def test_a_dead_holders_lock_is_removed_when_the_daemon_starts(brain: Brain) -> None:
    """A lock whose holder died is removed when the daemon starts; the orphaned agent is stopped before its item runs
    again (never twice at once), and the run finishes."""
    with _released_agents(brain):
        daemon, orphans = _killed_mid_fanout(brain)
        daemon.kill()
        with brain.daemon() as again:
            cleaned = again.wait_log("locks_cleaned")
            assert set(cleaned[0]["files"]) >= {"infrastructure/eu-1.yml", "infrastructure/eu-2.yml"}, cleaned
            wait(lambda: len(_starts(brain)) == 4, "both items started again")
            assert not any(_alive(pid) for pid in orphans)
            brain.path("workspace/go").write_text("")
            [record] = brain.wait_finished("rollout")
        assert record["outcome"] == "success"
        assert brain.ok("lock", "list", "--json").json() == []


def _tripped_chain(brain: Brain) -> dict[str, Any]:
    """A chain whose step failed three times in a row (answered `retry` twice): its CIRCUIT_BREAK escalation."""
    brain.python_agent(
        "coder",
        """
        import json, os, pathlib, sys
        json.load(sys.stdin)
        if pathlib.Path(os.environ["AMBIENT_BRAIN"], "workspace", "fixed").exists():
            print(json.dumps({"status": "ok"}))
            sys.exit(0)
        print("3 tests failed", file=sys.stderr)
        sys.exit(1)
    """,
    )
    brain.workflow(
        "feature",
        """
        name: feature
        chain:
          - {step: 1, type: brain-write, scope: projets/feature/, agents: [coder]}
    """,
    )
    for _ in range(2):
        [esc] = brain.wait_escalation("the failed step", where=lambda e: e["kind"] != "circuit_break")
        assert brain.decide(esc["id"], "retry").rc == 0
        wait(lambda e=esc: esc["id"] not in {x["id"] for x in brain.escalations()}, "the answer to be taken")
    [brk] = brain.wait_escalation("the circuit breaker", where=lambda e: e["kind"] == "circuit_break")
    assert "reset" in [o["key"] for o in brk["options"]], brk
    shown = brain.ok("status", "feature").out
    assert "TRIPPED" in shown and "projets/feature/" in shown, shown
    pre = brain.cli("preflight", "status", "projets/feature/")
    assert pre.rc == 3 and "TRIPPED" in pre.out, pre
    return brk


def test_a_circuit_break_answered_with_reset(brain: Brain) -> None:
    """ "The chain stopped with CIRCUIT_BREAK": inspect, then answer the escalation with `reset`: the chain goes on."""
    with brain.daemon():
        brk = _tripped_chain(brain)
        brain.write("workspace/fixed", "")
        assert brain.decide(brk["id"], "reset").rc == 0
        [record] = brain.wait_finished("feature")
    assert record["outcome"] == "success", record
    assert "closed" in brain.ok("preflight", "status", "projets/feature/").out


def test_a_circuit_break_reset_with_preflight_reset(brain: Brain) -> None:
    """ "The chain stopped with CIRCUIT_BREAK": … or `ambient preflight reset SCOPE`: the chain goes on."""
    with brain.daemon():
        _tripped_chain(brain)
        brain.write("workspace/fixed", "")
        assert brain.cli("preflight", "reset", "projets/feature/").rc == 0
        [record] = brain.wait_finished("feature", timeout=5)
    assert record["outcome"] == "success", record


def _on_a_terminal(brain: Brain, *args: str) -> str:
    """`ambient run --until-idle ARGS` with a terminal as its output; what the terminal showed."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [*AMBIENT, "--brain", str(brain.root), "run", "--until-idle", *args],
        stdout=follower,
        stderr=follower,
        stdin=subprocess.DEVNULL,
        env=clean_env(),
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other side closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert proc.wait(timeout=120) == 0
    return b"".join(chunks).decode(errors="replace")


def test_log_format_console_on_a_terminal_json_under_systemd(brain: Brain) -> None:
    """ "JSON logs on a terminal / console logs under systemd": auto is console on a terminal and JSON lines
    otherwise; `--log-format console|json` chooses."""
    brain.python_agent("ok", OK_AGENT)
    _fanout(brain, "hello", "ok", ["a"])

    def is_json(line: str) -> bool:
        with contextlib.suppress(ValueError):
            return isinstance(json.loads(line), dict)
        return False

    tty_auto = [ln for ln in _on_a_terminal(brain).splitlines() if "daemon_ready" in ln]
    assert tty_auto and not any(is_json(ln) for ln in tty_auto), tty_auto
    brain.ok("start", "hello")
    tty_json = [ln for ln in _on_a_terminal(brain, "--log-format", "json").splitlines() if "daemon_ready" in ln]
    assert tty_json and all(is_json(ln) for ln in tty_json), tty_json
    brain.ok("start", "hello")
    piped = ambient("--brain", str(brain.root), "run", "--until-idle")
    assert any(is_json(ln) and "daemon_ready" in ln for ln in piped.text.splitlines()), piped
    events = [json.loads(ln) for ln in piped.text.splitlines() if is_json(ln)]
    run_events = [e for e in events if e.get("event") in ("run_started", "run_finished")]
    assert len(run_events) == 2 and all(e["workflow"] == "hello" and e["run_id"] for e in run_events), events
    assert all(e.get("workflow") and e.get("run_id") for e in events if "item" in e), events
    brain.ok("start", "hello")
    piped_console = ambient("--brain", str(brain.root), "run", "--until-idle", "--log-format", "console")
    lines = [ln for ln in piped_console.text.splitlines() if "daemon_ready" in ln]
    assert lines and not any(is_json(ln) for ln in lines), piped_console
    assert len(brain.finished("hello")) == 4


def test_the_spawner_beside_the_daemon(brain: Brain) -> None:
    """The `python -I -S …/spawner_helper.py` process beside the daemon starts command agents; killed, `spawner_lost`
    is logged and its agents' attempts are retried; it exits when the daemon does."""
    brain.python_agent("deploy", WAITING_AGENT)
    _fanout(brain, "rollout", "deploy", ["eu-1", "eu-2"], extra="retry: {attempts: 2, backoff: 1s, on: [error]}")
    with _released_agents(brain), brain.daemon() as daemon:
        wait(lambda: len(_starts(brain)) == 2, "two agents running")
        spawners = [(pid, cmd) for pid, cmd in _children(daemon.pid) if "spawner_helper.py" in cmd]
        assert len(spawners) == 1, _children(daemon.pid)
        pid, cmd = spawners[0]
        assert " -I " in f" {cmd} " and " -S " in f" {cmd} ", cmd
        agents = {p for _, _, p in _starts(brain)}
        assert agents <= {child for child, _ in _children(pid)}  # the spawner started them
        os.kill(pid, signal.SIGKILL)
        daemon.wait_log("spawner_lost")
        wait(lambda: len(_starts(brain)) == 4, "both items tried again")
        assert sorted(a for _, a, _ in _starts(brain)) == [1, 1, 2, 2]
        brain.path("workspace/go").write_text("")
        [record] = brain.wait_finished("rollout")
        assert record["outcome"] == "success"
        new = [p for p, cmd in _children(daemon.pid) if "spawner_helper.py" in cmd]
        assert new and pid not in new
        assert daemon.stop() == 0
    wait(lambda: not any(_alive(p) for p in new), "the spawner to exit with the daemon")
