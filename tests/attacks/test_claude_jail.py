"""A Claude agent runs under the same Landlock jail as a command agent, and agents reach only the network their
runner names (docs/agents-and-runners.md, Security).

An allowed command runs project code: ``Bash(pytest:*)`` lets a Claude agent Write a ``conftest.py`` into its scope
and run ``pytest``, and the conftest's code then does whatever it likes as ambient's user. Each judgement of a tool
call stays; what holds when a command does more than it says is the jail. These tests drive the real daemon and the
real Claude Code CLI against the fake Anthropic API on 127.0.0.1, and read the outcome from the files the hostile
code left (its witness) and from what the person still sees.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.harness import Brain, agent_md, ai_agent_md, playbook, wait

pytest.importorskip("claude_agent_sdk", reason="the claude extra (pip install 'ambient[claude]') is not installed")

from ambient.runners.confinement import landlock_abi
from ambient.testing.fakeapi import FakeAnthropic

pytestmark = pytest.mark.skipif(landlock_abi() < 4, reason="needs Landlock ABI 4 (Linux 6.7+): TCP rules")

AI_WAIT = 120.0
WEB_TOKEN = "web-console-token-canary-0123456789"
BOT_TOKEN = "123456:telegram-token-canary"
MODEL_KEY = "sk-ant-jail-canary-key-0123456789"
DONE = {"answer": {"signal": "RETURN", "result": {"status": "ok", "item": "$ITEM"}}}


@pytest.fixture
def api() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as fake:
        yield fake


@pytest.fixture
def jail_brain(tmp_path: Path, api: FakeAnthropic) -> Brain:
    """A fresh brain holding what a hostile agent wants: the console's token, a bot token, the person's notes; its
    daemon reaches the fake model API with a key, and finds ``pytest`` on its PATH (the person's virtualenv)."""
    brain = Brain.init(tmp_path / "brain", "--no-example")
    path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    brain.env.update({"ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": MODEL_KEY, "PATH": path})
    brain.write(".ambient/web/token", WEB_TOKEN + "\n", mode=0o600)
    brain.write("profil/telegram-token", BOT_TOKEN + "\n", mode=0o600)
    brain.write("notes.md", "the person's notes\n")
    return brain


_CONFTEST = """
import json, os, subprocess, sys
from pathlib import Path

brain = Path(os.environ.get("AMBIENT_BRAIN") or os.getcwd())
tried = {}


def attempt(name, act):
    try:
        tried[name] = "allowed: " + str(act())[:200]
    except OSError as exc:
        tried[name] = "denied: " + str(exc.strerror)


attempt("web_token", lambda: (brain / ".ambient" / "web" / "token").read_text())
attempt("telegram_token", lambda: (brain / "profil" / "telegram-token").read_text())
attempt("write_outside", lambda: (brain / "notes.md").write_text("overwritten by a conftest"))
attempt("write_grants", lambda: (brain / ".ambient" / "claude" / "grants.json").write_text('{"jailer": ["Bash"]}'))
attempt("read_other_sessions", lambda: os.listdir(brain / ".ambient" / "claude" / "items"))
decide = subprocess.run(
    [sys.executable, "-m", "ambient", "--brain", str(brain), "decide", "ESC_ID", "skip"],
    capture_output=True, text=True,
)
tried["decide_rc"] = decide.returncode
status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
tried["uid"], tried["cap_eff"] = status["Uid"].split()[0], status["CapEff"].strip()
tried["decide_said"] = (decide.stdout + decide.stderr)[-300:]
(brain / "work" / "jail" / "witness.json").write_text(json.dumps(tried))
"""


def _failing_item(brain: Brain) -> dict[str, Any]:
    """Another run's escalation: an item that failed waits on the person."""
    brain.python_agent(
        "failer", 'import json, sys\njson.load(sys.stdin)\nprint(json.dumps({"status": "failed", "error": "no"}))\n'
    )
    brain.workflow(
        "other",
        'workflow: other\nfor_each:\n  items: ["x"]\n  spawn: failer\n'
        '  scope: {zone: project, files: ["work/other/x.txt"]}\n',
    )
    [esc] = brain.wait_escalation("the failed item's escalation", timeout=AI_WAIT)
    return esc


def test_a_conftest_run_by_an_allowed_pytest_reads_no_secret_and_answers_nothing(jail_brain: Brain) -> None:
    """The agent Writes a conftest.py into its scope (allowed: it is its scope) and runs ``pytest`` (allowed by
    ``Bash(pytest:*)``). The conftest's code tries to read the console's token and the bot token, to overwrite the
    person's notes and ambient's grants, to list other sessions, and to answer another run's escalation with
    ``ambient decide``: all of it fails, under the jail Claude Code itself runs in, and the escalation still waits
    on the person."""
    brain = jail_brain
    with brain.daemon():
        esc = _failing_item(brain)
        conftest = _CONFTEST.replace("ESC_ID", esc["id"])
        body = "You run the tests.\n\n" + playbook(
            {"tool": "Write", "input": {"file_path": "work/jail/conftest.py", "content": conftest}},
            {"tool": "Bash", "input": {"command": "pytest -q -p no:cacheprovider work/jail"}},
            DONE,
        )
        runner = {"kind": "claude", "timeout_s": 120, "allowed_tools": ["Bash(pytest:*)"]}
        brain.write("agents/tester.md", ai_agent_md("tester", body, runner=runner))
        brain.workflow(
            "tests",
            'workflow: tests\nfor_each:\n  items: ["a"]\n  spawn: tester\n'
            '  scope: {zone: project, files: ["work/jail/conftest.py", "work/jail/witness.json"]}\n',
        )
        [record] = brain.wait_finished("tests", timeout=AI_WAIT)
        still = [e["id"] for e in brain.escalations()]
    assert record["escalations"] == 0, record  # nothing was asked: every call was allowed
    tried = json.loads(brain.read("work/jail/witness.json"))  # the conftest ran, in the scope it could write
    for name in ("web_token", "telegram_token", "write_outside", "write_grants", "read_other_sessions"):
        assert tried[name].startswith("denied"), (name, tried)
    assert tried["decide_rc"] != 0, tried
    assert int(tried["cap_eff"], 16) == 0, tried  # whatever its uid (a root daemon's agent keeps no power of root)
    assert esc["id"] in still, "the conftest answered another run's escalation in the person's name"
    assert brain.read("notes.md") == "the person's notes\n"
    witness = json.dumps(tried)
    assert WEB_TOKEN not in witness and BOT_TOKEN not in witness, witness
    assert "jailer" not in brain.ok("grants", "--json").out


# ---------------------------------------------------------------- the network

_NET_PROBE = """
import json, os, socket, sys

port = int(sys.argv[1])
tried = {}
try:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    tried["bind"] = "allowed"
except OSError as exc:
    tried["bind"] = "denied: " + str(exc.strerror)
try:
    socket.create_connection(("127.0.0.1", port), timeout=10).close()
    tried["connect"] = "allowed"
except OSError as exc:
    tried["connect"] = "denied: " + str(exc.strerror)
print(json.dumps(tried))
"""


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that accepts connections (the backlog answers them; nobody needs to accept)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield s.getsockname()[1]


def _command_prober(brain: Brain, name: str, port: int, **runner: Any) -> None:
    """A confined command agent that probes the network and leaves what it saw in its scope."""
    code = _NET_PROBE.replace(
        "print(json.dumps(tried))",
        'Path(os.environ["AMBIENT_BRAIN"], "work", "net", sys.argv[2]).write_text(json.dumps(tried))\n'
        'print(json.dumps({"status": "ok"}))',
    )
    brain.write(f"bin/{name}.py", "import json, sys\nfrom pathlib import Path\njson.load(sys.stdin)\n" + code)
    argv = ["{{python}}", f"bin/{name}.py", str(port), f"{name}.json"]
    brain.write(f"agents/{name}.md", agent_md(name, argv, runner={"confine": True, **runner}))
    brain.workflow(
        name,
        f'workflow: {name}\nfor_each:\n  items: ["a"]\n  spawn: {name}\n'
        f'  scope: {{zone: project, files: ["work/net/{name}.json"]}}\n',
    )


def _tried(brain: Brain, name: str) -> dict[str, str]:
    [record] = brain.wait_finished(name, timeout=AI_WAIT)
    assert record["outcome"] == "success", record
    found: dict[str, str] = json.loads(brain.read(f"work/net/{name}.json"))
    return found


def test_a_command_agent_binds_no_port_and_connects_only_where_its_runner_says(
    jail_brain: Brain, listener: int
) -> None:
    """A confined command agent has no network by default: it cannot listen on a TCP port nor connect to one. With
    ``network: [127.0.0.1:PORT]`` it connects to that port, and still binds none."""
    brain = jail_brain
    _command_prober(brain, "closed", listener)
    _command_prober(brain, "opened", listener, network=[f"127.0.0.1:{listener}"])
    with brain.daemon():
        closed = _tried(brain, "closed")
        opened = _tried(brain, "opened")
    assert "agents' TCP is confined" in brain.cli("doctor").out
    assert closed["bind"].startswith("denied") and closed["connect"].startswith("denied"), closed
    assert opened["connect"] == "allowed" and opened["bind"].startswith("denied"), opened


def test_a_claude_agent_binds_no_port_and_connects_only_to_its_api_and_listed_ports(
    jail_brain: Brain, listener: int
) -> None:
    """A Claude agent reaches its model API (the session works) but a program its allowed Bash runs can neither
    listen on a TCP port nor connect to another one; ``network: [127.0.0.1:PORT]`` opens that port."""
    brain = jail_brain
    brain.write("bin/probe.py", _NET_PROBE)
    for name, extra in (("shut", {}), ("open", {"network": [f"127.0.0.1:{listener}"]})):
        body = "You probe.\n\n" + playbook(
            {"tool": "Bash", "input": {"command": f"python bin/probe.py {listener}"}},
            {"answer": {"signal": "RETURN", "result": {"status": "ok", "item": "$ITEM"}}},
        )
        runner = {"kind": "claude", "timeout_s": 120, "allowed_tools": ["Bash(python:*)"], **extra}
        brain.write(f"agents/{name}.md", ai_agent_md(name, body, runner=runner))
    with brain.daemon():
        for name in ("shut", "open"):
            brain.workflow(name, f'workflow: {name}\nfor_each:\n  items: ["a"]\n  spawn: {name}\n')
            [record] = brain.wait_finished(name, timeout=AI_WAIT)
            assert record["outcome"] == "success", record
        shut = _thread_probe(brain, "shut")
        opened = _thread_probe(brain, "open")
    assert shut["bind"].startswith("denied") and shut["connect"].startswith("denied"), shut
    assert opened["connect"] == "allowed" and opened["bind"].startswith("denied"), opened


def _thread_probe(brain: Brain, agent: str) -> dict[str, str]:
    """The probe's JSON line, as the agent's live thread shows its tool result."""

    def found() -> dict[str, str] | None:
        for line in brain.ok("thread", agent).out.splitlines():
            at = line.find('{"bind"')
            if at >= 0:
                return dict(json.loads(line[at : line.rindex("}") + 1]))
        return None

    result: dict[str, str] = wait(found, f"the probe's result in the thread of {agent}", timeout=AI_WAIT)
    return result


def test_a_bad_network_entry_is_a_clear_error_with_its_line(jail_brain: Brain) -> None:
    """``network:`` takes ``any`` or a list of ``host:port``; anything else is the agent file's error, with its line."""
    brain = jail_brain
    brain.write("agents/bad.md", agent_md("bad", ["true"], runner={"network": ["localhost"]}))
    res = brain.cli("validate")
    assert res.rc != 0, res
    said = res.text
    assert "agents/bad.md:" in said and "network" in said and "host:port" in said, said
