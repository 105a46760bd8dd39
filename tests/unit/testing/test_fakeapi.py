"""The offline fake model APIs (ambient.testing.fakeapi), driven by real clients: the official anthropic and openai
SDKs, plain HTTP, the package's command line, and the real Claude Code CLI bundled in claude-agent-sdk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ambient.runners.prompt import CONTRACT
from ambient.testing import fakeapi
from ambient.testing.fakeapi import FakeAnthropic, FakeOpenAI, Playbook, Recorded
from ambient.testing.fakeapi import __main__ as fakeapi_cli


def agent_system(*steps: dict[str, Any], body: str = "You are a test agent.") -> str:
    """An agent's system prompt as ambient builds it: the body (with a playbook) then the contract."""
    if steps:
        lines = "\n".join(json.dumps(s) for s in steps)
        body = f"{body}\n\n```fake-model\n{lines}\n```"
    return f"{body}\n\n{CONTRACT}"


def brief(item: str) -> str:
    tail = "End with the JSON answer described in your instructions."
    return f"# Your task\nWorkflow: wf\nItem: {item}\nAttempt: 1\n\n{tail}\n"


BASH = {"tool": "Bash", "input": {"command": "pytest -q $ITEM"}}
WRITE = {"tool": "Write", "input": {"file_path": "notes/$ITEM.md", "content": "hello"}}
ANSWER = {"answer": {"signal": "RETURN", "result": {"status": "ok", "item": "$ITEM"}}}
ON_DENY = {"on_deny": {"signal": "BLOCKED_ON", "context": {"missing": "permission"}}}


def post(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read() or b"null")


def tool_result(tool_use_id: str, content: str, *, is_error: bool = False) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": content, "is_error": is_error}


# ------------------------------------------------------------------------------------------- the playbook, pure


def test_playbook_parses_steps_and_rejects_garbage() -> None:
    pb = Playbook.parse(agent_system(BASH, WRITE, ANSWER, ON_DENY, {"answer_as": "text"}))
    assert pb is not None
    assert [t["name"] for t in pb.tools] == ["Bash", "Write"]
    assert pb.answer == ANSWER["answer"] and pb.on_deny == ON_DENY["on_deny"] and pb.answer_as_text
    assert Playbook.parse(CONTRACT) is None
    with pytest.raises(ValueError):
        Playbook.parse("```fake-model\n[1, 2]\n```")
    with pytest.raises(ValueError):
        Playbook.parse('```fake-model\n{"frobnicate": 1}\n```')


def test_the_package_exports_its_public_seam() -> None:
    """What tests, the bench and users import from ``ambient.testing.fakeapi`` (its modules are the package's own)."""
    names = {"CONTRACT_MARKER", "STRUCTURED_OUTPUT_TOOLS", "Billed", "FakeAnthropic", "FakeOpenAI", "Playbook"}
    names.add("Recorded")
    assert set(fakeapi.__all__) == names
    assert all(hasattr(fakeapi, name) for name in names)
    assert fakeapi.CONTRACT_MARKER in CONTRACT and "StructuredOutput" in fakeapi.STRUCTURED_OUTPUT_TOOLS


# ----------------------------------------------------------------------------------------------- Anthropic SDK


@pytest.fixture
def anthropic_mod() -> Any:
    return pytest.importorskip("anthropic")


@pytest.fixture
def api() -> Any:
    with FakeAnthropic() as fake:
        yield fake


def test_anthropic_steps_through_the_playbook_statelessly(anthropic_mod: Any, api: FakeAnthropic) -> None:
    client = anthropic_mod.Anthropic(base_url=api.url, api_key="test-key", max_retries=0)
    system = agent_system(BASH, WRITE, ANSWER)
    messages: list[dict[str, Any]] = [{"role": "user", "content": brief("alpha")}]

    first = client.messages.create(model="claude-x", max_tokens=100, system=system, messages=messages)
    assert first.stop_reason == "tool_use" and first.model == "claude-x"
    (use,) = first.content
    assert use.type == "tool_use" and use.name == "Bash" and use.input == {"command": "pytest -q alpha"}
    assert use.id.startswith("toolu_")

    messages += [
        {"role": "assistant", "content": [use.model_dump(include={"type", "id", "name", "input"})]},
        {"role": "user", "content": [tool_result(use.id, "3 passed")]},
    ]
    second = client.messages.create(model="claude-x", max_tokens=100, system=system, messages=messages)
    (use2,) = second.content
    assert use2.name == "Write" and use2.input == {"file_path": "notes/alpha.md", "content": "hello"}
    assert use2.id != use.id

    messages += [
        {"role": "assistant", "content": [use2.model_dump(include={"type", "id", "name", "input"})]},
        {"role": "user", "content": [tool_result(use2.id, "written")]},
    ]
    third = client.messages.create(model="claude-x", max_tokens=100, system=system, messages=messages)
    assert third.stop_reason == "end_turn"
    (text,) = third.content
    assert text.type == "text"
    head, _, tail = text.text.partition("\n")
    assert head == "Done." and json.loads(tail) == {"signal": "RETURN", "result": {"status": "ok", "item": "alpha"}}
    # Stateless: the same history asked again gives the same step.
    again = client.messages.create(model="claude-x", max_tokens=100, system=system, messages=messages[:3])
    assert again.content[0].name == "Write"
    assert [r.path for r in api.requests] == ["/v1/messages"] * 4
    assert all(r.body and r.body["model"] == "claude-x" for r in api.requests)
    assert api.requests[0].headers["content-type"] == "application/json"


def test_anthropic_streaming_is_the_documented_event_sequence(anthropic_mod: Any, api: FakeAnthropic) -> None:
    client = anthropic_mod.Anthropic(base_url=api.url, api_key="test-key", max_retries=0)
    system = agent_system({"tool": "Write", "input": {"file_path": "x/$ITEM.md", "content": "a" * 200}}, ANSWER)
    kinds: list[str] = []
    with client.messages.stream(
        model="m", max_tokens=100, system=system, messages=[{"role": "user", "content": brief("b1")}]
    ) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds.count("input_json") >= 2  # the input arrives as several input_json_delta pieces
    assert "content_block_start" in kinds and "content_block_stop" in kinds and "message_delta" in kinds
    (use,) = final.content
    assert use.name == "Write" and use.input == {"file_path": "x/b1.md", "content": "a" * 200}
    assert final.stop_reason == "tool_use" and final.usage.output_tokens > 0 and final.usage.input_tokens > 0

    history = [
        {"role": "user", "content": brief("b1")},
        {"role": "assistant", "content": [use.model_dump(include={"type", "id", "name", "input"})]},
        {"role": "user", "content": [tool_result(use.id, "ok")]},
    ]
    with client.messages.stream(model="m", max_tokens=100, system=system, messages=history) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.startswith("Done.\n") and json.loads(text[6:])["result"]["item"] == "b1"
    assert final.stop_reason == "end_turn" and final.content[0].text == text
    assert api.requests[0].query == "" and api.requests[0].body is not None and api.requests[0].body["stream"]


def test_anthropic_answer_as_tool_when_forced_or_structured(anthropic_mod: Any, api: FakeAnthropic) -> None:
    client = anthropic_mod.Anthropic(base_url=api.url, api_key="k", max_retries=0)
    schema = {"type": "object", "properties": {"signal": {"type": "string"}}}
    user = [{"role": "user", "content": brief("c1")}]
    forced = client.messages.create(
        model="m",
        max_tokens=50,
        system=agent_system(ANSWER),
        messages=user,
        tools=[{"name": "answer", "description": "the answer", "input_schema": schema}],
        tool_choice={"type": "tool", "name": "answer"},
    )
    assert forced.content[0].name == "answer" and forced.content[0].input["result"]["item"] == "c1"
    offered = client.messages.create(
        model="m",
        max_tokens=50,
        system=agent_system(),  # no playbook: the default answer
        messages=user,
        tools=[
            {"name": "Bash", "description": "", "input_schema": schema},
            {"name": "StructuredOutput", "description": "", "input_schema": schema},
        ],
    )
    assert offered.content[0].name == "StructuredOutput"
    assert offered.content[0].input == {"signal": "RETURN", "result": {"status": "ok", "item": "c1"}}
    as_text = client.messages.create(
        model="m",
        max_tokens=50,
        system=agent_system(ANSWER, {"answer_as": "text"}),
        messages=user,
        tools=[{"name": "StructuredOutput", "description": "", "input_schema": schema}],
    )
    assert as_text.content[0].type == "text" and as_text.stop_reason == "end_turn"
    plain = client.messages.create(
        model="m", max_tokens=50, system=agent_system({"text": "All done for $ITEM, nothing to add."}), messages=user
    )
    assert plain.content[0].text == "All done for c1, nothing to add."


def test_anthropic_deny_path_and_failed_tools(anthropic_mod: Any, api: FakeAnthropic) -> None:
    client = anthropic_mod.Anthropic(base_url=api.url, api_key="k", max_retries=0)

    def reply(system: str, result: dict[str, Any]) -> Any:
        messages = [
            {"role": "user", "content": [{"type": "text", "text": brief("d1")}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}]},
            {"role": "user", "content": [result]},
        ]
        return client.messages.create(model="m", max_tokens=50, system=system, messages=messages)

    denied = tool_result("toolu_1", "coder may not run `rm -rf build`: denied by the person", is_error=True)
    answer = reply(agent_system(BASH, WRITE, ANSWER, ON_DENY), denied)
    assert json.loads(answer.content[0].text.partition("\n")[2]) == ON_DENY["on_deny"]
    # Without on_deny, the final answer.
    answer = reply(agent_system(BASH, WRITE, ANSWER), denied)
    assert json.loads(answer.content[0].text.partition("\n")[2])["signal"] == "RETURN"
    # Claude Code's text for a deny with interrupt=True counts as a refusal too.
    rejected = tool_result("toolu_1", "The user doesn't want to proceed with this tool use.", is_error=True)
    assert "BLOCKED_ON" in reply(agent_system(BASH, ANSWER, ON_DENY), rejected).content[0].text
    # A tool that ran and failed is a step done: the next step comes.
    failed = tool_result("toolu_1", "Exit code 1", is_error=True)
    assert reply(agent_system(BASH, WRITE, ANSWER, ON_DENY), failed).content[0].name == "Write"


def test_anthropic_side_requests_get_short_text(anthropic_mod: Any, api: FakeAnthropic) -> None:
    client = anthropic_mod.Anthropic(base_url=api.url, api_key="k", max_retries=0)
    side = client.messages.create(
        model="haiku",
        max_tokens=20,
        system="Generate a short title for this conversation.",
        messages=[{"role": "user", "content": brief("e1")}],
        tools=[{"name": "Bash", "description": "", "input_schema": {"type": "object"}}],
    )
    assert [b.type for b in side.content] == ["text"] and side.stop_reason == "end_turn"
    status, body = post(
        api.url + "/v1/messages?beta=true",
        {
            "model": "haiku",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "title?"}],
            "output_format": {
                "type": "json_schema",
                "schema": {
                    "type": "object",
                    "required": ["title", "ok"],
                    "properties": {"title": {"type": "string"}, "ok": {"type": "boolean"}},
                },
            },
        },
    )
    assert status == 200 and json.loads(body["content"][0]["text"]) == {"title": "", "ok": False}
    assert api.requests[-1].path == "/v1/messages" and api.requests[-1].query == "beta=true"


@pytest.mark.slow
def test_anthropic_usage_and_prompt_cache(anthropic_mod: Any, api: FakeAnthropic) -> None:
    client = anthropic_mod.Anthropic(base_url=api.url, api_key="k", max_retries=0)
    system = [{"type": "text", "text": agent_system(ANSWER) + "x" * 4000, "cache_control": {"type": "ephemeral"}}]

    def usage(item: str) -> Any:
        msg = client.messages.create(
            model="m", max_tokens=50, system=system, messages=[{"role": "user", "content": brief(item)}]
        )
        return msg.usage

    first, second, third = usage("u1"), usage("u2"), usage("u3")
    assert first.cache_creation_input_tokens > 1000 and first.cache_read_input_tokens == 0
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens
    assert second.cache_creation_input_tokens == 0 and third.cache_read_input_tokens == second.cache_read_input_tokens
    assert 0 < second.input_tokens < 100  # only the brief is uncached
    plain = client.messages.create(
        model="m", max_tokens=50, system="no cache marks", messages=[{"role": "user", "content": "hi " * 400}]
    )
    assert plain.usage.cache_creation_input_tokens == 0 and plain.usage.cache_read_input_tokens == 0
    assert 250 <= plain.usage.input_tokens <= 350  # about len(text) / 4
    counted = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi " * 400}])
    assert 250 <= counted.input_tokens <= 350
    assert api.requests[-1].path == "/v1/messages/count_tokens"
    # The billing ledger: each answer with the usage it said, in order; count_tokens bills nothing
    billed = api.billed
    reads = [0, second.cache_read_input_tokens, third.cache_read_input_tokens, 0]
    assert [b.usage["cache_read_input_tokens"] for b in billed] == reads
    assert (billed[3].usage["input_tokens"], billed[3].usage["output_tokens"]) == (
        plain.usage.input_tokens,
        plain.usage.output_tokens,
    )
    assert all(not b.stream and b.model == "m" for b in billed)


def _stream(url: str, body: Any) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def test_the_ledger_bills_each_streamed_answer_and_no_error() -> None:
    """Each answer is written down with the usage its stream says; an error is not billed."""
    with FakeAnthropic() as api, FakeOpenAI() as chat_api:
        body = {"model": "m", "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        status, raw = _stream(f"{api.url}/v1/messages", body)
        assert status == 200 and b"message_stop" in raw
        [billed] = api.billed
        assert billed.stream and billed.id.startswith("msg_") and billed.id.encode() in raw
        assert f'"output_tokens": {billed.usage["output_tokens"]}'.encode() in raw
        api.fail(500, times=1)
        assert _stream(f"{api.url}/v1/messages", body)[0] == 500
        assert len(api.billed) == 1
        chat = {"model": "gpt-x", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        chat["stream_options"] = {"include_usage": True}
        status, raw = _stream(f"{chat_api.url}/v1/chat/completions", chat)
        assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
        [billed] = chat_api.billed
        assert billed.stream and billed.usage["prompt_tokens"] > 0 and billed.usage["completion_tokens"] > 0


@pytest.mark.slow
def test_anthropic_errors_map_onto_the_sdk_exceptions(anthropic_mod: Any, api: FakeAnthropic) -> None:
    client = anthropic_mod.Anthropic(base_url=api.url, api_key="k", max_retries=2)
    args: dict[str, Any] = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}

    api.fail(429, times=2)
    ok = client.messages.create(**args)  # two retries, then the normal reply
    assert ok.content[0].type == "text" and len(api.requests) == 3
    assert [r.headers.get("x-stainless-retry-count") for r in api.requests] == ["0", "1", "2"]

    api.fail(429, times=5)
    with pytest.raises(anthropic_mod.RateLimitError) as rate:
        client.messages.create(**args)
    assert rate.value.body["error"]["type"] == "rate_limit_error"
    api.fail(None)

    for status, exc in [
        (401, anthropic_mod.AuthenticationError),
        (403, anthropic_mod.PermissionDeniedError),
        (500, anthropic_mod.InternalServerError),
        (529, anthropic_mod.OverloadedError),
    ]:
        api.fail(status)
        before = len(api.requests)
        with pytest.raises(exc) as info:
            client.with_options(max_retries=0).messages.create(**args)
        assert info.value.status_code == status and len(api.requests) == before + 1
    api.fail(401)
    status, body = post(api.url + "/v1/messages", args)
    assert status == 401 and body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "fake authentication_error (401)"},
    }
    api.fail(None)
    assert client.messages.create(**args).stop_reason == "end_turn"


def test_unknown_paths_are_recorded_and_answered_404(api: FakeAnthropic) -> None:
    status, body = post(api.url + "/v1/something?x=1", {"a": 1})
    assert status == 404 and body["type"] == "error"
    status, body = post(api.url + "/v1/messages", {"no": "messages"})
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    with urllib.request.urlopen(api.url + "/v1/models", timeout=10) as resp:
        assert resp.status == 200 and json.loads(resp.read())["data"] == []
    assert [(r.method, r.path, r.query) for r in api.requests] == [
        ("POST", "/v1/something", "x=1"),
        ("POST", "/v1/messages", ""),
        ("GET", "/v1/models", ""),
    ]
    assert api.requests[0].body == {"a": 1} and api.requests[2].body is None


def test_wait_for_blocks_until_the_condition_then_times_out(api: FakeAnthropic) -> None:
    done = threading.Event()

    def client() -> None:
        for i in range(3):
            post(api.url + "/v1/messages", {"model": "m", "messages": [{"role": "user", "content": brief(f"w{i}")}]})
        done.set()

    thread = threading.Thread(target=client)
    thread.start()
    seen = api.wait_for(lambda reqs: len(reqs) >= 3, timeout=30)
    assert len(seen) >= 3 and all(isinstance(r, Recorded) for r in seen)
    thread.join()
    assert done.is_set()
    with pytest.raises(TimeoutError):
        api.wait_for(lambda reqs: len(reqs) > 3, timeout=0.05)


def test_delay_and_a_closed_fake_refuses(api: FakeAnthropic) -> None:
    api.delay_s = 0.01
    status, _ = post(api.url + "/v1/messages", {"messages": [{"role": "user", "content": "x"}]})
    assert status == 200
    url = api.url
    api.stop()
    with pytest.raises(urllib.error.URLError):
        post(url + "/v1/messages", {"messages": []})


# -------------------------------------------------------------------------------------------------- OpenAI SDK


@pytest.fixture
def openai_mod() -> Any:
    return pytest.importorskip("openai")


@pytest.mark.slow
def test_openai_answers_from_the_playbook(openai_mod: Any) -> None:
    with FakeOpenAI() as oa:
        client = openai_mod.OpenAI(base_url=oa.url + "/v1", api_key="k", max_retries=0)
        messages = [
            {"role": "system", "content": agent_system(BASH, ANSWER)},  # tool steps don't apply
            {"role": "user", "content": brief("o1")},
        ]
        plain = client.chat.completions.create(model="gpt-x", messages=messages)
        text = plain.choices[0].message.content
        assert text.startswith("Done.\n") and json.loads(text[6:])["result"]["item"] == "o1"
        assert plain.choices[0].finish_reason == "stop" and plain.model == "gpt-x"
        assert plain.usage.prompt_tokens > 0 and plain.usage.completion_tokens > 0
        assert plain.usage.prompt_tokens_details.cached_tokens == 0

        schema = {"name": "answer", "schema": {"type": "object"}, "strict": False}
        structured = client.chat.completions.create(
            model="gpt-x", messages=messages, response_format={"type": "json_schema", "json_schema": schema}
        )
        assert json.loads(structured.choices[0].message.content) == {
            "signal": "RETURN",
            "result": {"status": "ok", "item": "o1"},
        }
        # The system prefix was seen before: it is cached now.
        assert structured.usage.prompt_tokens_details.cached_tokens > 0

        chunks = list(
            client.chat.completions.create(
                model="gpt-x",
                messages=[{"role": "system", "content": agent_system({"text": "plain $ITEM"})}, messages[1]],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "plain o1"
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"

        forced = client.chat.completions.create(
            model="gpt-x",
            messages=messages,
            tools=[{"type": "function", "function": {"name": "answer", "parameters": {"type": "object"}}}],
            tool_choice={"type": "function", "function": {"name": "answer"}},
        )
        (call,) = forced.choices[0].message.tool_calls
        assert call.function.name == "answer" and json.loads(call.function.arguments)["signal"] == "RETURN"
        assert [r.path for r in oa.requests] == ["/v1/chat/completions"] * 4


@pytest.mark.slow
def test_openai_errors_and_retries(openai_mod: Any) -> None:
    with FakeOpenAI() as oa:
        client = openai_mod.OpenAI(base_url=oa.url + "/v1", api_key="k", max_retries=2)
        args: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        oa.fail(429, times=2)
        assert client.chat.completions.create(**args).choices[0].message.content == "OK."
        assert len(oa.requests) == 3
        oa.fail(401)
        with pytest.raises(openai_mod.AuthenticationError) as info:
            client.chat.completions.create(**args)
        assert info.value.code == "invalid_api_key" and len(oa.requests) == 4  # a 401 is not retried
        oa.fail(500, times=1)
        assert client.chat.completions.create(**args).choices[0].message.content == "OK."


# -------------------------------------------------------------------------------------------- the command line


def test_help_describes_the_package(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m ambient.testing.fakeapi --help`` says what the package is (its docstring's first line)."""
    with pytest.raises(SystemExit) as info:
        fakeapi_cli.main(["--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "usage: python -m ambient.testing.fakeapi" in out
    said = "Offline fake model APIs on 127.0.0.1: the Anthropic Messages API and the OpenAI Chat Completions API."
    assert said in out


@pytest.mark.slow
def test_module_serves_until_sigterm(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ambient.testing.fakeapi", "openai", "--port-file", str(port_file)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and port_file.read_text().strip() == url.rsplit(":", 1)[1]
        status, body = post(
            url + "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        )
        assert status == 200 and body["object"] == "chat.completion"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


# ------------------------------------------------------------------------------------ the real Claude Code CLI


@pytest.mark.slow
async def test_claude_code_cli_runs_a_playbook_against_the_fake(tmp_path: Path) -> None:
    sdk = pytest.importorskip("claude_agent_sdk")
    brain, config = tmp_path / "brain", tmp_path / "config"
    for d in (brain, config, tmp_path / "home", tmp_path / "tmp"):
        d.mkdir(mode=0o700)
    asked: list[tuple[str, dict[str, Any]]] = []

    async def can_use_tool(name: str, tool_input: dict[str, Any], _ctx: Any) -> Any:
        asked.append((name, tool_input))
        return sdk.PermissionResultAllow()

    with FakeAnthropic() as fake:
        options = sdk.ClaudeAgentOptions(
            system_prompt={
                "type": "preset",
                "preset": "claude_code",
                "append": agent_system({"tool": "Bash", "input": {"command": "echo ran-$ITEM > out.txt"}}, ANSWER),
            },
            setting_sources=[],
            can_use_tool=can_use_tool,
            permission_mode="default",
            cwd=str(brain),
            max_turns=5,
            env={
                "ANTHROPIC_BASE_URL": fake.url,
                "ANTHROPIC_API_KEY": "test-key",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "CLAUDE_CONFIG_DIR": str(config),
                "HOME": str(tmp_path / "home"),
                "CLAUDE_CODE_TMPDIR": str(tmp_path / "tmp"),
                "XDG_RUNTIME_DIR": str(tmp_path / "tmp"),
            },
        )
        messages: list[Any] = []
        async with sdk.ClaudeSDKClient(options) as client:
            await client.query(brief("cc1"))
            async for message in client.receive_response():
                messages.append(message)
        agent_requests = [r for r in fake.requests if r.path == "/v1/messages"]

    assert asked == [("Bash", {"command": "echo ran-cc1 > out.txt"})]
    assert (brain / "out.txt").read_text() == "ran-cc1\n"
    result = messages[-1]
    assert isinstance(result, sdk.ResultMessage)
    assert not result.is_error and result.subtype == "success"
    assert result.session_id and result.total_cost_usd and result.total_cost_usd > 0
    assert result.usage and result.usage["output_tokens"] > 0
    assert json.loads(result.result.partition("\n")[2]) == {
        "signal": "RETURN",
        "result": {"status": "ok", "item": "cc1"},
    }
    init = messages[0]
    assert isinstance(init, sdk.SystemMessage) and init.data["session_id"] == result.session_id
    tool_uses = [b for m in messages if isinstance(m, sdk.AssistantMessage) for b in m.content]
    assert any(isinstance(b, sdk.ToolUseBlock) and b.name == "Bash" for b in tool_uses)
    assert len(agent_requests) == 2  # the tool_use, then the answer
    transcripts = list(config.glob(f"projects/*/{result.session_id}.jsonl"))
    assert transcripts, sorted(str(p.relative_to(config)) for p in config.rglob("*"))
    assert os.environ.get("ANTHROPIC_BASE_URL") != fake.url  # the fake's address went to the CLI only
