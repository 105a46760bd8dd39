"""An AI agent never holds the model's real key (docs/agents-and-runners.md, "Costs and budgets"): its calls go
through ambient's model gateway with a key made for its attempt, void once the attempt ends.

The test is the adversary that looks everywhere a running Claude agent could find the key: the environment and argv
of Claude Code and of every command it runs (``/proc/<pid>/environ``, ``cmdline``), every file of the brain and of
the agent's temp folder, while the agent's command is still running; then it replays the key the agent had.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.harness import Brain, ai_agent_md, for_each, playbook, wait

pytest.importorskip("claude_agent_sdk", reason="the claude extra (pip install 'ambient[claude]') is not installed")

from ambient.testing.fakeapi import FakeAnthropic

AI_WAIT = 120.0
MODEL_KEY = "sk-ant-gateway-canary-key-0123456789"
DONE = {"answer": {"signal": "RETURN", "result": {"status": "ok", "item": "$ITEM"}}}


@pytest.fixture
def api() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as fake:
        yield fake


def _agent_processes(brain: Path) -> dict[int, tuple[dict[str, str], str]]:
    """Live processes started for this brain (their environment names it): pid → (environment, argv)."""
    found: dict[int, tuple[dict[str, str], str]] = {}
    marker = f"AMBIENT_BRAIN={brain}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "environ").read_bytes()
            argv = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in raw.split(b"\0"):
            env = dict(v.decode(errors="replace").partition("=")[::2] for v in raw.split(b"\0") if b"=" in v)
            found[int(entry.name)] = (env, argv.replace(b"\0", b" ").decode(errors="replace"))
    return found


def _files_holding(root: Path, needle: bytes) -> list[str]:
    out = []
    for path in root.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                out.append(str(path))
        except OSError:
            continue
    return out


def test_a_running_claude_agent_and_its_commands_hold_no_model_key(tmp_path: Path, api: FakeAnthropic) -> None:
    brain = Brain.init(tmp_path / "brain", "--no-example")
    brain.env.update({"ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": MODEL_KEY})
    command = "env > work/out/env.txt; until [ -e work/out/go ]; do sleep 0.1; done; echo done >> work/out/a.log"
    body = "You build.\n\n" + playbook({"tool": "Bash", "input": {"command": command}}, DONE)
    runner = {"kind": "claude", "timeout_s": 120, "allowed_tools": ["Bash"]}
    brain.write("agents/coder.md", ai_agent_md("coder", body, runner=runner))
    brain.write("work/out/.keep", "")
    brain.workflow("build", for_each("build", "coder", ["a"]).replace('"work/build/{{index}}.txt"', '"work/out"'))
    with brain.daemon():
        wait(lambda: brain.path("work/out/env.txt").exists(), "the agent's command running", timeout=AI_WAIT)
        procs = _agent_processes(brain.root)
        assert any("claude" in argv for _, argv in procs.values()), procs  # Claude Code itself is among them
        assert any(argv.startswith(("/bin/bash", "bash", "/usr/bin/bash")) for _, argv in procs.values()), procs
        grants = set()
        for pid, (env, argv) in procs.items():
            assert MODEL_KEY not in json.dumps(env), f"the model key in the environment of {pid}: {argv}"
            assert MODEL_KEY not in argv, f"the model key in the argv of {pid}"
            if "ANTHROPIC_API_KEY" in env:
                grants.add(env["ANTHROPIC_API_KEY"])
                assert env["ANTHROPIC_BASE_URL"].startswith("http://127.0.0.1:"), env
                assert env["ANTHROPIC_BASE_URL"] != api.url  # the gateway, not the API
        tmpdirs = {Path(env["TMPDIR"]) for env, _ in procs.values() if env.get("TMPDIR")}
        for place in (brain.root, *tmpdirs):
            assert _files_holding(place, MODEL_KEY.encode()) == [], place
        [grant] = grants
        gateway = next(env["ANTHROPIC_BASE_URL"] for env, _ in procs.values() if "ANTHROPIC_BASE_URL" in env)
        brain.write("work/out/go", "")
        [record] = brain.wait_finished("build", timeout=AI_WAIT)
        assert record["outcome"] == "success", record
        # The provider got the real key, from the gateway; the key the agent had is refused once its attempt ended.
        assert all(r.headers.get("x-api-key") == MODEL_KEY for r in api.requests)
        request = urllib.request.Request(
            f"{gateway}/v1/messages",
            data=json.dumps({"model": "claude-haiku-4-5", "max_tokens": 5, "messages": []}).encode(),
            headers={"x-api-key": grant, "content-type": "application/json", "anthropic-version": "2023-06-01"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 401
        refused.value.close()
        billed = len(api.billed)
    assert len(api.billed) == billed  # the replayed key reached nothing
    assert MODEL_KEY not in brain.read("work/out/env.txt")
