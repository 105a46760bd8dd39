"""The claude runner against the real Claude Code CLI and a fake Messages API on 127.0.0.1 (no daemon)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("claude_agent_sdk")

from ambient.runners.base import RunRequest
from ambient.runners.claude import ClaudeRunner, transcript_exists
from ambient.runners.result import AgentResult
from ambient.runners.runner_config import ClaudeRunnerConfig
from ambient.storage.paths import BrainPaths
from ambient.testing.fakeapi import FakeAnthropic

DONE = {"answer": {"signal": "RETURN", "result": {"status": "ok", "item": "$ITEM"}}}


@pytest.fixture
def api() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as fake:
        yield fake


def make_brain(root: Path, *steps: dict[str, Any]) -> Path:
    (root / "agents").mkdir(parents=True)
    (root / "work").mkdir()
    lines = "\n".join(json.dumps(s) for s in steps)
    (root / "agents" / "coder.md").write_text(f"---\nname: coder\n---\nYou code.\n\n```fake-model\n{lines}\n```\n")
    return root


class Harness:
    def __init__(self, brain: Path, api: FakeAnthropic, environ: dict[str, str] | None = None) -> None:
        self.brain = brain
        self.turns: list[tuple[str, str]] = []
        env = {"ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": "sk-test", "PATH": "/usr/bin:/bin"}
        self.runner = ClaudeRunner(
            BrainPaths(brain), environ={**env, **(environ or {})}, watch=lambda r, k, t: self.turns.append((k, t))
        )

    async def run(self, item: str = "a", decision: str | None = None, **cfg: Any) -> AgentResult:
        context: dict[str, Any] = {"item": item}
        if decision is not None:
            context["decision"] = decision
        req = RunRequest(
            packet={"payload": {"context": context}, "scope": {"files": [f"work/{item}.txt"]}},
            agent="coder",
            run_id="run-1",
            item=item,
            attempt=1,
            key=f"run-1/{item}/1",
            channel_token="",
            brain=self.brain,
            prompt_file=self.brain / "agents" / "coder.md",
        )
        return await self.runner.run(req, ClaudeRunnerConfig(kind="claude", timeout_s=60, **cfg))


@pytest.mark.slow
async def test_a_question_ends_the_session_and_the_answer_resumes_it(tmp_path: Path, api: FakeAnthropic) -> None:
    brain = make_brain(tmp_path / "brain", {"tool": "Bash", "input": {"command": "echo hi > work/$ITEM.txt"}}, DONE)
    h = Harness(brain, api)
    asked = await h.run()
    assert asked.status == "escalate"
    assert asked.options == ["allow", "allow always", "deny"]
    assert asked.permission is not None and asked.permission["signature"] == "Bash: echo hi > work/a.txt"
    assert asked.usage is not None and asked.usage.session_id
    assert not (brain / "work" / "a.txt").exists()
    session = asked.usage.session_id
    assert transcript_exists(brain / ".ambient" / "claude" / "agents" / "coder" / "config", session)
    done = await h.run(decision="allow")
    assert (done.status, done.result) == ("success", {"status": "ok", "item": "a"})
    assert (brain / "work" / "a.txt").read_text() == "hi\n"
    assert done.usage is not None and done.usage.session_id == session  # the same session, resumed
    kinds = [k for k, _ in h.turns]
    assert "tool_call" in kinds and "tool_result" in kinds


@pytest.mark.slow
async def test_allow_always_is_kept_for_the_agent(tmp_path: Path, api: FakeAnthropic) -> None:
    brain = make_brain(tmp_path / "brain", {"tool": "Bash", "input": {"command": "echo hi >> work/log"}}, DONE)
    h = Harness(brain, api)
    assert (await h.run("a")).status == "escalate"
    assert (await h.run("a", decision="allow always")).status == "success"
    assert (await h.run("b")).status == "success"  # another item: no question
    grants = json.loads((brain / ".ambient" / "claude" / "grants.json").read_text())
    digest = hashlib.sha256(b"Bash: echo hi >> work/log").hexdigest()
    assert grants == {"coder": [{"call": "Bash: echo hi >> work/log", "sha256": digest}]}
    assert (brain / "work" / "log").read_text() == "hi\nhi\n"


@pytest.mark.slow
async def test_a_denial_is_told_to_the_agent(tmp_path: Path, api: FakeAnthropic) -> None:
    on_deny = {"on_deny": {"signal": "BLOCKED_ON", "context": {"missing": "permission to build"}}}
    brain = make_brain(tmp_path / "brain", {"tool": "Bash", "input": {"command": "make"}}, DONE, on_deny)
    h = Harness(brain, api)
    assert (await h.run()).status == "escalate"
    res = await h.run(decision="deny")
    assert (res.status, res.context) == ("blocked", {"missing": "permission to build"})


@pytest.mark.slow
async def test_the_cli_gets_no_secret_of_the_daemon(
    tmp_path: Path, api: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK hands the CLI the daemon's whole environment; the launcher keeps only what ambient set."""
    monkeypatch.setenv("AMBIENT_NOTIFY_URLS", "tgram://123:SECRET-in-url/42")
    monkeypatch.setenv("MY_TELEGRAM_TOKEN", "123:SECRET-token")
    brain = make_brain(tmp_path / "brain", {"tool": "Bash", "input": {"command": "env > work/env.txt"}}, DONE)
    h = Harness(brain, api)
    res = await h.run(allowed_tools=["Bash"])
    assert res.status == "success", res
    env = (brain / "work" / "env.txt").read_text()
    assert "SECRET" not in env
    assert "AMBIENT_RUN_ID=run-1" in env and "CLAUDE_CONFIG_DIR=" in env
    assert f"HOME={brain}/.ambient/claude/agents/coder/home" in env


@pytest.mark.slow
async def test_reads_of_the_daemons_state_are_refused_even_inside_the_working_folder(
    tmp_path: Path, api: FakeAnthropic
) -> None:
    """Claude Code reads inside its folder without asking; ambient makes it ask, and refuses .ambient/."""
    brain = make_brain(tmp_path / "brain", {"tool": "Read", "input": {"file_path": "$BRAIN/.ambient/inbox.key"}}, DONE)
    text = (brain / "agents" / "coder.md").read_text().replace("$BRAIN", str(brain))
    (brain / "agents" / "coder.md").write_text(text)
    (brain / ".ambient").mkdir()
    (brain / ".ambient" / "inbox.key").write_text("TOPSECRET")
    h = Harness(brain, api)
    res = await h.run()
    assert res.status == "success"
    assert (
        "denied",
        "ambient denied Read: .ambient/inbox.key is off limits (.ambient/ is the daemon's state)",
    ) in h.turns
    assert "TOPSECRET" not in json.dumps([r.body for r in api.requests])


@pytest.mark.slow
async def test_a_refused_key_ends_at_the_first_request(tmp_path: Path, api: FakeAnthropic) -> None:
    api.fail(401)
    brain = make_brain(tmp_path / "brain", DONE)
    res = await Harness(brain, api).run()
    assert (res.status, res.reason) == ("error", "provider_refused")
    assert "refused (401)" in str(res.error)
    assert len(api.requests) == 1


@pytest.mark.slow
async def test_an_api_that_cannot_be_reached_stops_the_session_in_seconds(tmp_path: Path, api: FakeAnthropic) -> None:
    """Claude Code would retry a refused connection for about three minutes; the item stops after three tries and
    says where it tried."""
    brain = make_brain(tmp_path / "brain", DONE)
    h = Harness(brain, api, environ={"ANTHROPIC_BASE_URL": "http://127.0.0.1:1"})
    res = await h.run()
    assert (res.status, res.reason) == ("error", "provider_unreachable")
    assert "the model API at http://127.0.0.1:1 cannot be reached" in str(res.error)


@pytest.mark.slow
async def test_a_wrong_path_in_the_base_url_is_named(tmp_path: Path, api: FakeAnthropic) -> None:
    brain = make_brain(tmp_path / "brain", DONE)
    h = Harness(brain, api, environ={"ANTHROPIC_BASE_URL": f"{api.url}/bogus"})
    res = await h.run()
    assert (res.status, res.reason) == ("error", "provider_unreachable"), res
    assert f"the model API at {api.url}/bogus answered 404" in str(res.error)


@pytest.mark.slow
async def test_the_frontmatters_model_and_tools_are_claude_codes(tmp_path: Path, api: FakeAnthropic) -> None:
    """Claude Code's subagent keys: `model:` picks the model, `tools:` the tools it is offered."""
    brain = make_brain(tmp_path / "brain", DONE)
    md = brain / "agents" / "coder.md"
    md.write_text(md.read_text().replace("name: coder\n", "name: coder\nmodel: haiku\ntools: Read, Grep\n"))
    res = await Harness(brain, api).run()
    assert res.status == "success", res
    [main] = [r.body for r in api.requests if r.body and "How to answer (ambient)" in json.dumps(r.body["system"])]
    assert "haiku" in main["model"]
    offered = {t["name"] for t in main.get("tools", [])}
    assert "Read" in offered and "Bash" not in offered and "Write" not in offered


def test_the_grants_file_keeps_a_digest_beside_each_call_and_reads_old_ones(tmp_path: Path) -> None:
    """grants.json: ``{"call", "sha256"}`` per grant; an old bare signature shorter than the old cap is read with its
    digest, one of the cap's length (maybe cut) is dropped; forget takes the call as listed or its digest."""
    from ambient.runners import permissions as P
    from ambient.runners.claude import SessionStore

    store = SessionStore(tmp_path)
    cut = "Bash: " + "x" * 494
    (tmp_path / "grants.json").write_text(json.dumps({"coder": ["Bash: make", cut], "other": "nonsense"}))
    assert store.grants("coder") == {P.digest_of("Bash: make")}
    assert store.all_grants() == {"coder": ["Bash: make"]}
    store.grant_always("coder", "Bash: pytest -q")
    stored = json.loads((tmp_path / "grants.json").read_text())
    assert stored == {
        "coder": [
            {"call": "Bash: make", "sha256": P.digest_of("Bash: make")},
            {"call": "Bash: pytest -q", "sha256": P.digest_of("Bash: pytest -q")},
        ]
    }
    assert store.forget("coder", P.digest_of("Bash: make")) == 1
    assert store.forget("coder", "Bash: make") == 0
    assert store.forget("coder", "Bash: pytest -q") == 1
    assert store.all_grants() == {}


def _jail(brain: Path, monkeypatch: pytest.MonkeyPatch, **cfg: Any) -> dict[str, Any] | None:
    """The jail the launcher would apply to a Claude agent of ``brain`` (Landlock ABI 6 assumed)."""
    from ambient.runners import confinement

    monkeypatch.setattr(confinement, "landlock_abi", lambda: 6)
    runner = ClaudeRunner(BrainPaths(brain), environ={"ANTHROPIC_BASE_URL": "https://models.example:8443/v1"})
    req = RunRequest(
        packet={"scope": {"files": ["work/a.txt"]}},
        agent="coder",
        run_id="run-1",
        item="a",
        attempt=1,
        key="run-1/a/1",
        channel_token="",
        brain=brain,
    )
    own = runner.session_dir("coder")
    found = runner._jail(req, ClaudeRunnerConfig(kind="claude", **cfg), Path("/bin/true"), brain / "tmp", own)
    return found


def test_the_jail_is_the_command_agents_plus_the_session_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Claude agent reads and writes its own session folder and nothing else of ``.ambient/``; it connects to its
    model API's port only, plus what ``network:`` lists; ``network: any`` and ``confine: false`` leave it be."""
    brain = make_brain(tmp_path / "brain")
    (brain / ".ambient" / "claude").mkdir(parents=True)
    (brain / "profil").mkdir()
    (brain / "profil" / "telegram-token").write_text("x")
    jail = _jail(brain, monkeypatch)
    assert jail is not None
    own = str(brain / ".ambient" / "claude" / "agents" / "coder")
    state = str(brain / ".ambient")
    assert own in jail["write"] and own in jail["read"]
    assert [p for p in (*jail["read"], *jail["write"]) if p.startswith(state) and p != own] == []
    assert str(brain / "profil" / "telegram-token") not in jail["read"]
    assert str(brain / "work") in jail["write"]  # the scope's folder (its file is not there yet)
    assert jail["connect"] == (8443,) and jail["abi"] == 6
    assert _jail(brain, monkeypatch, network=["127.0.0.1:5432"])["connect"] == (5432, 8443)  # type: ignore[index]
    assert _jail(brain, monkeypatch, network="any")["connect"] is None  # type: ignore[index]
    assert _jail(brain, monkeypatch, base_url="http://127.0.0.1:9000")["connect"] == (9000,)  # type: ignore[index]
    routed = {"ANTHROPIC_BASE_URL": "http://127.0.0.1:9100"}  # the runner's env wins, as the CLI gets it
    assert _jail(brain, monkeypatch, base_url="http://127.0.0.1:9000", env=routed)["connect"] == (9100,)  # type: ignore[index]
    assert _jail(brain, monkeypatch, confine=False) is None


@pytest.mark.parametrize(
    ("url", "port"),
    [("https://api.anthropic.com", 443), ("http://127.0.0.1:8080/v1", 8080), ("http://proxy.local", 80)],
)
def test_the_api_port_is_the_urls(url: str, port: int) -> None:
    from ambient.runners.claude import api_port

    assert api_port(url) == port


def test_a_pattern_grant_is_listed_and_forgotten_with_the_commands_it_came_from(tmp_path: Path) -> None:
    """grants.json keeps a pattern as ``{"call": "Bash pattern: …", "pattern"}``; forgetting it (as listed, or the
    pattern alone) drops the remembered commands it stands for, so it is offered again only after as many new
    ones. A pattern written by hand that breaks the rules (``*``, ``make *``) is dropped."""
    from ambient.runners.claude import SessionStore

    store = SessionStore(tmp_path)
    for command in ("pytest -q tests/a", "pytest -q tests/b", "make all", "echo x > y", "pytest -q tests/b"):
        store.remember_allowed("coder", command)
    assert store.allowed("coder") == ("pytest -q tests/a", "make all", "pytest -q tests/b")  # plain ones, newest last
    store.grant_pattern("coder", "pytest -q tests/*")
    store.grant_always("coder", "Bash: make all")
    assert store.patterns("coder") == ("pytest -q tests/*",)
    assert store.all_grants() == {"coder": ["Bash pattern: pytest -q tests/*", "Bash: make all"]}
    assert store.grants("coder") == {hashlib.sha256(b"Bash: make all").hexdigest()}
    assert store.forget("coder", "Bash pattern: pytest -q tests/*") == 1
    assert store.patterns("coder") == ()
    assert store.allowed("coder") == ("make all",)
    store.grant_pattern("coder", "pytest -q tests/*")
    assert store.forget("coder", "pytest -q tests/*") == 1
    data = json.loads((tmp_path / "grants.json").read_text())
    data["coder"] += [{"pattern": "*"}, {"pattern": "make *"}, {"pattern": "pytest -q tests/*; id"}]
    (tmp_path / "grants.json").write_text(json.dumps(data))
    assert store.patterns("coder") == ()
    assert store.all_grants() == {"coder": ["Bash: make all"]}


def _pending_answer(runner: ClaudeRunner, command: str, pattern: str, decision: str) -> None:
    """The person answers ``decision`` to the question about ``command`` that offered ``pattern``."""
    from ambient.runners.claude import ItemSession

    state = ItemSession(
        session_id="s-1",
        pending={"tool": "Bash", "input": {"command": command}, "signature": f"Bash: {command}", "pattern": pattern},
    )
    req = RunRequest(
        packet={"payload": {"context": {"decision": decision}}},
        agent="coder",
        run_id="r-1",
        item="a",
        attempt=2,
        key="r-1/a",
        channel_token="t",
        brain=runner.paths.root,
    )
    runner._take_answer(req, state)


def test_only_the_patterns_own_option_grants_it(tmp_path: Path) -> None:
    """The pattern is granted when the answer is its option's label, as offered; `allow` or `allow always` grant
    the call (and count it toward a pattern), never the pattern; a pending pattern that does not stand for its
    command is never granted."""
    runner = ClaudeRunner(BrainPaths(tmp_path), environ={})
    label = "allow `pytest -q tests/*` for coder from now on"
    _pending_answer(runner, "pytest -q tests/d", "pytest -q tests/*", "allow")
    _pending_answer(runner, "pytest -q tests/e", "pytest -q tests/*", "allow always")
    assert runner.sessions.patterns("coder") == ()
    assert runner.sessions.allowed("coder") == ("pytest -q tests/d", "pytest -q tests/e")
    _pending_answer(runner, "pytest -q other/f", "pytest -q tests/*", label)
    assert runner.sessions.patterns("coder") == ()
    _pending_answer(runner, "pytest -q tests/f", "pytest -q tests/*", label)
    assert runner.sessions.patterns("coder") == ("pytest -q tests/*",)


async def test_through_the_gateway_the_cli_gets_its_grant_and_its_port_never_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the model gateway started, Claude Code's environment names the gateway and the attempt's grant: no
    variable holds the daemon's key or the runner's, nor the real API's address; its jail connects to the
    gateway's port, not the API's."""
    from ambient.runners import confinement
    from ambient.runners.gateway import ModelGateway

    monkeypatch.setattr(confinement, "landlock_abi", lambda: 6)
    brain = make_brain(tmp_path / "brain")
    gateway = ModelGateway()
    await gateway.start()
    try:
        environ = {"ANTHROPIC_BASE_URL": "https://models.example:8443", "ANTHROPIC_API_KEY": "sk-daemon-key"}
        runner = ClaudeRunner(BrainPaths(brain), environ=environ, gateway=gateway)
        cfg = ClaudeRunnerConfig(kind="claude", env={"ANTHROPIC_API_KEY": "sk-runner-key", "FOO": "bar"})
        req = RunRequest(
            packet={"scope": {"files": ["work/a.txt"]}},
            agent="coder",
            run_id="run-1",
            item="a",
            attempt=1,
            key="run-1/a/1",
            channel_token="",
            brain=brain,
        )
        from ambient.runners.prompt import AgentPrompt

        grant = runner._grant(req, cfg, AgentPrompt(body=""))
        assert grant is not None
        assert grant.upstream.base_url == "https://models.example:8443"
        assert dict(grant.upstream.auth) == {"x-api-key": "sk-runner-key"}  # the runner's env wins, kept here
        env = runner._env(req, cfg, Path("/bin/true"), tmp_path, grant)
        assert env["ANTHROPIC_API_KEY"] == grant.token and env["ANTHROPIC_BASE_URL"] == gateway.url
        assert env["FOO"] == "bar"
        assert "sk-" not in json.dumps(env) and "models.example" not in json.dumps(env)
        assert json.loads(env["AMBIENT_CLAUDE_JAIL"])["connect"] == [gateway.port]
        await gateway.release(grant)
    finally:
        await gateway.close()
