"""What an AI agent is told and how its answer is read (ambient.runners.prompt, .answer, .extras): pure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ambient.config.brain import extra_problems
from ambient.runners import extras
from ambient.runners.answer import final_answer, last_json_object
from ambient.runners.base import RunRequest
from ambient.runners.prompt import CONTRACT, AgentPrompt, agent_prompt, render_brief, system_prompt
from ambient.runners.runner_config import ClaudeRunnerConfig, LlmRunnerConfig, parse_runner_config


def request(
    context: dict[str, Any] | None = None, files: list[str] | None = None, handoff: str | None = None
) -> RunRequest:
    packet = {
        "payload": {"context": context or {"item": "a"}},
        "scope": {"files": files or ["notes/a.md"], "zone": "project"},
    }
    return RunRequest(
        packet=packet,
        agent="writer",
        run_id="r1",
        item="a",
        attempt=1,
        key="r1/a/1",
        channel_token="",
        brain=Path("/srv/brain"),
        vars={"workflow": "notes"},
        handoff=handoff,
    )


def test_the_brief_says_the_item_its_scope_its_context_and_the_persons_answer() -> None:
    text = render_brief(request({"item": "a", "ticket": 42, "decision": "blue"}))
    assert "Workflow: notes\nItem: a\nAttempt: 1\n" in text
    assert "Scope (the only files you may write): notes/a.md" in text
    assert '"ticket": 42' in text
    assert "## The person's answer to your question\nblue" in text
    assert '"decision"' not in text  # said once, as the answer, not in the context's JSON


def test_the_brief_is_the_same_bytes_for_the_same_request() -> None:
    assert render_brief(request({"b": 1, "a": 2})) == render_brief(request({"a": 2, "b": 1}))


def test_the_handoff_is_bounded() -> None:
    text = render_brief(request(handoff="§" * 10_000))
    assert text.count("§") == 4096


def test_the_system_prompt_is_the_body_then_the_contract() -> None:
    text = system_prompt(AgentPrompt(body="You review."))
    assert text.startswith("You review.\n\n") and text.endswith(CONTRACT)


def test_frontmatter_model_and_tools_in_claude_codes_subagent_format() -> None:
    p = agent_prompt({"model": "sonnet", "tools": "Read, Grep, Bash"}, "  body \n")
    assert (p.model, p.tools, p.body) == ("sonnet", ("Read", "Grep", "Bash"), "body")
    assert agent_prompt({"model": "inherit", "tools": ["Read"]}, "").model is None
    assert agent_prompt({}, "").tools is None


@pytest.mark.parametrize(
    ("structured", "text", "status", "result"),
    [
        ({"signal": "RETURN", "result": {"status": "ok", "n": 1}}, "", "success", {"status": "ok", "n": 1}),
        (
            None,
            'Done.\n```json\n{"signal": "RETURN", "result": {"status": "partial"}}\n```',
            "success",
            {"status": "partial"},
        ),
        (
            None,
            'first {"a": 1} then {"signal": "RETURN", "result": {"status": "ok", "k": "}"}}',
            "success",
            {"status": "ok", "k": "}"},
        ),
        (None, "All good, nothing to change.", "success", {"status": "ok", "text": "All good, nothing to change."}),
        (None, '{"signal": "ESCALATE", "question": "Which?", "options": ["a", "b"]}', "escalate", None),
        (None, '{"signal": "BLOCKED_ON", "context": {"missing": "vpn"}}', "blocked", None),
        (None, "", "error", None),
    ],
)
def test_a_final_answer_maps_onto_the_agent_protocol(
    structured: Any, text: str, status: str, result: dict[str, Any] | None
) -> None:
    res = final_answer(structured, text, agent="writer")
    assert res.status == status
    if result is not None:
        assert res.result == result


def test_an_answer_in_someone_elses_name_is_refused() -> None:
    res = final_answer({"signal": "RETURN", "from": "human", "result": {}}, None, agent="writer")
    assert (res.status, res.reason) == ("error", "sender_mismatch")


def test_last_json_object_skips_broken_braces() -> None:
    assert last_json_object('{ not json } {"x": 1} {oops') == {"x": 1}
    assert last_json_object("no json here") is None


def test_a_missing_extra_is_said_with_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extras, "installed", lambda module: False)
    claude = parse_runner_config({"kind": "claude"})
    llm = parse_runner_config({"kind": "llm", "provider": "openai", "model": "m"})
    assert extras.missing_extra(claude) == (
        "kind: claude needs the claude_agent_sdk package, which is not installed: pip install 'ambient[claude]'"
    )
    assert "pip install 'ambient[llm]'" in str(extras.missing_extra(llm))
    monkeypatch.setattr(extras, "installed", lambda module: True)
    assert extras.missing_extra(claude) is None


def test_runner_configs_of_ai_agents_validate_with_their_lines() -> None:
    cfg = parse_runner_config({"kind": "claude", "allowed_tools": ["Bash(pytest:*)"], "workdir": "projets"})
    assert isinstance(cfg, ClaudeRunnerConfig) and cfg.permission_mode == "default"
    with pytest.raises(Exception, match="permission_mode"):
        parse_runner_config({"kind": "claude", "permission_mode": "bypassPermissions"})
    with pytest.raises(Exception, match="workdir"):
        parse_runner_config({"kind": "claude", "workdir": "../outside"})
    assert isinstance(parse_runner_config({"kind": "llm", "price": {"input": 1, "output": 2}}), LlmRunnerConfig)


def test_the_default_runners_missing_extra_is_said_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from ambient.config.brain import load_brain
    from ambient.storage.paths import BrainPaths

    for d in ("agents", "profil"):
        (tmp_path / d).mkdir()
    for name in ("a", "b", "c"):
        (tmp_path / "agents" / f"{name}.md").write_text(f"---\nname: {name}\n---\nbody\n")
    (tmp_path / "profil" / "ambient.yml").write_text("runners:\n  default: {kind: claude}\n")
    monkeypatch.setattr(extras, "installed", lambda module: False)
    brain = load_brain(BrainPaths(tmp_path), {})
    found = extra_problems(brain.paths, brain.matrix, brain.runners, brain.settings)
    assert [str(p) for p in found] == [
        "profil/ambient.yml: runners.default: kind: claude needs the claude_agent_sdk package, which is not "
        "installed: pip install 'ambient[claude]'"
    ]
    assert sorted(brain.runners) == ["a", "b", "c"]
