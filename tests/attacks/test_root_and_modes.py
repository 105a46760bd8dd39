"""A daemon run as root, attacked by its agents: the state files' modes, the agents' identity, the daemon's secrets.

ambient runs as root here (as a system unit may, and as the tests do), which is what makes these attacks real:
a root agent could open ambient's private files to everyone with ``chmod`` (Landlock does not cover metadata),
keep every capability, and read the daemon's environment in ``/proc``. Each test drives a real daemon with real
command agents and looks from the outside: files' modes, the daemon's log, ``ambient doctor``, what the agent said.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from ambient.storage.paths import BrainPaths
from tests.e2e import helpers
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

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="these attacks need a daemon run as root (CI runs as root)")

CANARY = "gsk_canary-7f3a9c1e5b2d4068"

#: A command agent that reports who it is and what it can see: its uid, its capabilities, the environment it was
#: given, and what reading each ancestor's /proc/<pid>/environ gave (the spawner, the daemon).
_PROBE = r"""
import json, os, sys
json.load(sys.stdin)
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
ancestors = {}
pid = os.getppid()
while pid > 1 and len(ancestors) < 3:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            ancestors[str(pid)] = f.read().decode(errors="replace")
    except OSError as exc:
        ancestors[str(pid)] = f"denied: {exc.strerror}"
    ppid = [l for l in open(f"/proc/{pid}/status").read().splitlines() if l.startswith("PPid:")]
    pid = int(ppid[0].split()[1]) if ppid else 0
print(json.dumps({
    "status": "ok",
    "uid": os.getuid(), "euid": os.geteuid(),
    "cap_eff": status["CapEff"].strip(), "cap_prm": status["CapPrm"].strip(), "cap_bnd": status["CapBnd"].strip(),
    "no_new_privs": status.get("NoNewPrivs", "?").strip(),
    "env": dict(os.environ), "ancestors": ancestors,
}))
"""

_LLM_AGENT = """---
name: groq
type: agent
status: active
description: "a model agent whose key is in GROQ_KEY"
ambient:
  runner:
    kind: llm
    provider: openai
    base_url: http://127.0.0.1:9/v1
    api_key_env: GROQ_KEY
---
# Agent: groq

Answers.
"""


#: The interpreter an unprivileged agent can run: the one running the tests may sit in root's home (pyenv).
SYSTEM_PYTHON = "/usr/bin/python3"


def _probe_md(name: str, *, user: str | None = None) -> str:
    python = "{{python}}" if user == "root" else SYSTEM_PYTHON
    return command_agent_md(name, [python, "-I", "-c", _PROBE], confine=True, user=user)


def _output(paths: BrainPaths, workflow: str) -> dict[str, object]:
    [done] = [e for e in events(paths, workflow, "finished") if e.get("item") == "a"]
    assert done["result"] == "success", done
    out = done["output"]
    assert isinstance(out, dict)
    return out


def test_a_root_daemons_agent_is_not_root_has_no_capabilities_and_cannot_read_the_daemons_environ(
    reachable: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent with no ``user:`` under a root daemon ran as root with every capability, and could read
    ``/proc/<daemon>/environ``. It runs as an unprivileged user now, with no capability and no_new_privs, and
    the daemon's environment (and the spawner's) is closed to it."""
    if not Path(SYSTEM_PYTHON).is_file():
        pytest.skip(f"no {SYSTEM_PYTHON} for the unprivileged agent")
    monkeypatch.setattr(helpers, "TEST_AGENT_ENV", {})  # the daemon's default, not the other tests' agent_user: root
    paths = make_brain(reachable / "brain", example_agents=False, agents={"probe": _probe_md("probe")})
    d = DaemonProcess(paths, env={"GROQ_KEY": CANARY}).start()
    try:
        d.wait_ready()
        drop(paths, "probe.yml", foreach_workflow("probe", ["a"], agent="probe", files=None))
        wait_for(lambda: finished_run(paths, "probe") is not None, 60, f"the probe's run; {d.tail()}")
        daemon_pid = d.pid
    finally:
        d.stop()
        d.kill()
    out = _output(paths, "probe")
    assert out["uid"] != 0 and out["euid"] != 0, out
    assert int(str(out["cap_eff"]), 16) == 0 and int(str(out["cap_prm"]), 16) == 0, out
    assert int(str(out["cap_bnd"]), 16) == 0, out
    assert out["no_new_privs"] == "1", out
    ancestors = out["ancestors"]
    assert isinstance(ancestors, dict) and str(daemon_pid) in ancestors, out
    assert str(ancestors[str(daemon_pid)]).startswith("denied"), "the agent read the daemon's environment"
    assert CANARY not in json.dumps(out)


def test_an_agent_that_asks_for_root_gets_no_capabilities(tmp_path: Path) -> None:
    """``user: root`` is the person's explicit choice (an agent that must write root's files): it keeps uid 0 but
    loses every capability (no module loading, no clock, no reboot, no ptrace) and cannot gain one back."""
    paths = make_brain(tmp_path / "brain", example_agents=False, agents={"rooted": _probe_md("rooted", user="root")})
    d = DaemonProcess(paths).start()
    try:
        d.wait_ready()
        drop(paths, "rooted.yml", foreach_workflow("rooted", ["a"], agent="rooted", files=None))
        wait_for(lambda: finished_run(paths, "rooted") is not None, 60, f"the agent's run; {d.tail()}")
        daemon_pid = d.pid
    finally:
        d.stop()
        d.kill()
    out = _output(paths, "rooted")
    assert out["uid"] == 0, out
    assert int(str(out["cap_eff"]), 16) == 0 and int(str(out["cap_bnd"]), 16) == 0, out
    assert out["no_new_privs"] == "1", out
    ancestors = out["ancestors"]
    assert isinstance(ancestors, dict)
    assert str(ancestors[str(daemon_pid)]).startswith("denied"), "a root agent read the daemon's environment"


def test_a_key_named_by_api_key_env_reaches_no_agent_and_leaves_the_daemons_environ(tmp_path: Path) -> None:
    """A model key named by ``api_key_env: GROQ_KEY`` (not a name that says "key" the way API_KEY does) stayed in
    the daemon's ``/proc/<pid>/environ``: the wipe went by name. It goes by what the settings read now: the key is
    in no agent's environment, and not in the daemon's environment block even as root reads it."""
    paths = make_brain(
        tmp_path / "brain", example_agents=False, agents={"probe": _probe_md("probe", user="root"), "groq": _LLM_AGENT}
    )
    d = DaemonProcess(paths, env={"GROQ_KEY": CANARY}).start()
    try:
        d.wait_ready()
        environ = Path(f"/proc/{d.pid}/environ").read_bytes()
        drop(paths, "probe.yml", foreach_workflow("probe", ["a"], agent="probe", files=None))
        wait_for(lambda: finished_run(paths, "probe") is not None, 60, f"the probe's run; {d.tail()}")
    finally:
        d.stop()
        d.kill()
    assert CANARY.encode() not in environ, "the key is still in /proc/<daemon>/environ"
    assert b"GROQ_KEY=" in environ  # the name stays, its value is gone
    out = _output(paths, "probe")
    assert CANARY not in json.dumps(out), "an agent saw the key"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


_CHMODDER = r"""
import json, os, sys
json.load(sys.stdin)
state = os.path.join(os.environ["AMBIENT_BRAIN"], ".ambient")
done = []
for path, mode in ((os.path.join(state, "web", "token"), 0o644), (state, 0o755)):
    try:
        os.chmod(path, mode)
        done.append(path)
    except OSError as exc:
        done.append(f"{path}: {exc.strerror}")
print(json.dumps({"status": "ok", "done": done}))
"""


def test_state_files_opened_by_an_agent_are_closed_again_and_said(tmp_path: Path) -> None:
    """A root agent (``user: root``: the person's choice) chmods the console's token to 0644 and ``.ambient/`` to
    0755: Landlock does not cover metadata. The daemon sees it on its maintenance tick and closes them again
    (0600, 0700); its log says ``state_mode_restored`` with what it was, and ``ambient doctor`` says so too."""
    agent = command_agent_md("opener", ["{{python}}", "-c", _CHMODDER], confine=True, user="root")
    paths = make_brain(tmp_path / "brain", example_agents=False, agents={"opener": agent}, config="tick_seconds: 1\n")
    token = paths.state / "web" / "token"
    ambient_cli(paths.root, "web", "--url")  # the console's token, made on first use (no console serves: rc 1)
    assert _mode(token) == 0o600
    d = DaemonProcess(paths).start()
    try:
        d.wait_ready()
        drop(paths, "open.yml", foreach_workflow("open", ["a"], agent="opener", files=None))
        wait_for(lambda: finished_run(paths, "open") is not None, 60, f"the agent's run; {d.tail()}")
        out = _output(paths, "open")
        assert out["done"] == [str(token), str(paths.state)], out  # the attack itself worked
        restored = d.wait_logged("state_mode_restored", timeout=30, count=2)
        wait_for(lambda: _mode(token) == 0o600 and _mode(paths.state) == 0o700, 10, "the modes restored")
        doctor = ambient_cli(paths.root, "doctor", "--json")
    finally:
        d.stop()
        d.kill()
    said = {(r["path"], r["was"]) for r in restored}
    assert (str(token), "0644") in said and (str(paths.state), "0755") in said, restored
    report = json.loads(doctor.stdout)
    texts = [f["message"] for f in report["findings"]]
    assert any(".ambient/web/token" in t and "0644" in t for t in texts), texts


def test_state_files_opened_while_the_daemon_was_down_are_closed_at_start(tmp_path: Path) -> None:
    """The same, done while no daemon ran (a backup restored with the wrong modes, a person's chmod -R): the
    daemon closes them at start, and says which."""
    paths = make_brain(tmp_path / "brain", example_agents=False)
    ambient_cli(paths.root, "web", "--url")
    token = paths.state / "web" / "token"
    token.chmod(0o644)
    (paths.state / "web").chmod(0o755)
    d = DaemonProcess(paths).start()
    try:
        d.wait_ready()
        restored = d.wait_logged("state_mode_restored", timeout=15, count=2)
    finally:
        d.stop()
        d.kill()
    assert _mode(token) == 0o600 and _mode(paths.state / "web") == 0o700
    said = {(r["path"], r["was"]) for r in restored}
    assert (str(token), "0644") in said and (str(paths.state / "web"), "0755") in said, restored
