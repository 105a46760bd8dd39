"""The ``llm`` runner: one model call through the official SDKs, against the offline fake APIs on 127.0.0.1.

Pure parts (model resolution, prices and costs, credentials) are tested without a server.
"""

from __future__ import annotations

import asyncio
import json
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from ambient.runners.base import RunRequest
from ambient.runners.keys import credential
from ambient.runners.llm import (
    ANTHROPIC_ALIASES,
    INSTALL_HINT,
    LlmRunner,
    _Reply,
    resolve_model,
)
from ambient.runners.pricing import PRICES, ModelPrice, cost_usd, model_price
from ambient.runners.result import AgentResult, Usage
from ambient.runners.runner_config import LlmRunnerConfig, Price, parse_runner_config
from ambient.testing.fakeapi import FakeAnthropic, FakeOpenAI

KEY = "sk-ant-test-0123456789abcdef"
OKEY = "sk-openai-test-0123456789abcdef"


def cfg(**kw: Any) -> LlmRunnerConfig:
    raw = {"kind": "llm", **kw}
    out = parse_runner_config(raw)
    assert isinstance(out, LlmRunnerConfig)
    return out


def agent_file(tmp_path: Path, body: str, *, name: str = "thinker", model: str | None = None) -> Path:
    front = f"---\nname: {name}\n" + (f"model: {model}\n" if model else "") + "---\n"
    path = tmp_path / "agents" / f"{name}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(front + body, encoding="utf-8")
    return path


def playbook(*lines: dict[str, Any]) -> str:
    steps = "\n".join(json.dumps(line) for line in lines)
    return f"You review things.\n\n```fake-model\n{steps}\n```\n"


def request(tmp_path: Path, prompt: Path | None, *, item: str = "doc-1", agent: str = "thinker") -> RunRequest:
    return RunRequest(
        packet={"signal": "SPAWN", "to": agent, "payload": {"context": {"topic": "x"}}, "scope": {"files": []}},
        agent=agent,
        run_id="run-1",
        item=item,
        attempt=1,
        key=f"run-1/{item}/1",
        channel_token="tok",
        brain=tmp_path,
        prompt_file=prompt,
    )


def sent_key(rec: Any) -> str | None:
    """The key a request carried (``x-api-key``, or a bearer token as newer Anthropic SDKs send it)."""
    auth = rec.headers.get("authorization", "")
    return rec.headers.get("x-api-key") or (auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None)


def no_secret(result: AgentResult, *secrets: str) -> None:
    text = repr(result) + json.dumps(result.to_record())
    for secret in secrets:
        assert secret not in text


# --------------------------------------------------------------------------------------------- pure: models


def test_model_resolution() -> None:
    assert resolve_model("anthropic", None, None) == ANTHROPIC_ALIASES["sonnet"]
    assert resolve_model("anthropic", None, "haiku") == ANTHROPIC_ALIASES["haiku"]
    assert resolve_model("anthropic", "opus", "haiku") == ANTHROPIC_ALIASES["opus"]
    assert resolve_model("anthropic", "claude-opus-4-8", None) == "claude-opus-4-8"
    assert resolve_model("openai", None, None) is None
    assert resolve_model("openai", None, "sonnet") is None  # a Claude alias means nothing to an openai server
    assert resolve_model("openai", None, "llama3.2") == "llama3.2"
    assert resolve_model("openai", "gpt-6-sol", "sonnet") == "gpt-6-sol"
    # Every alias names a model the price table knows.
    for model in ANTHROPIC_ALIASES.values():
        assert model in PRICES


# ---------------------------------------------------------------------------------------------- pure: costs


def test_cost_from_the_table_anthropic() -> None:
    usage = Usage(
        model="claude-sonnet-5-5",
        input_tokens=1_000_000,
        output_tokens=1_000_000,
        cache_read_tokens=1_000_000,
        cache_write_tokens=1_000_000,
    )
    # Sonnet 5.5: $2 in, $10 out, $0.10 cache read, $2.50 cache write (5 minutes).
    assert cost_usd(usage) == pytest.approx(2 + 10 + 0.1 + 2.5)
    assert cost_usd(Usage(model="claude-opus-4-1", input_tokens=1000, output_tokens=100)) == pytest.approx(
        (1000 * 15 + 100 * 75) / 1e6
    )


def test_dated_ids_resolve_to_their_model() -> None:
    assert model_price("claude-haiku-4-5-20251001") == PRICES["claude-haiku-4-5"]
    assert model_price("claude-sonnet-4-20250514") == PRICES["claude-sonnet-4"]
    assert model_price("gpt-4.1-2025-04-14") == PRICES["gpt-4.1"]
    assert model_price("llama3.2") is None
    assert model_price(None) is None


def test_long_prompt_tier() -> None:
    short = Usage(model="claude-haiku-5-5", input_tokens=100_000, output_tokens=1000)
    long = Usage(model="claude-haiku-5-5", input_tokens=50_000, cache_read_tokens=60_000, output_tokens=1000)
    assert cost_usd(short) == pytest.approx((100_000 * 0.1 + 1000 * 0.5) / 1e6)
    assert cost_usd(long) == pytest.approx((50_000 * 0.5 + 60_000 * 0.05 + 1000 * 2.5) / 1e6)
    # OpenAI: over 272K input tokens the whole request is 2x input and 1.5x output (GPT-6 family).
    big = Usage(model="gpt-6-sol", input_tokens=300_000, output_tokens=1000)
    assert cost_usd(big) == pytest.approx((300_000 * 4 + 1000 * 15) / 1e6)


def test_unknown_model_has_no_cost_unless_priced() -> None:
    usage = Usage(model="llama3.2", input_tokens=1_000_000, output_tokens=500_000, cache_read_tokens=1_000_000)
    assert cost_usd(usage) is None
    assert cost_usd(usage, Price(input=1, output=2)) == pytest.approx(1 + 1 + 0.1)  # cache read at 0.1x input
    priced = Price(input=1, output=2, cache_read=0.5, cache_write=3)
    assert cost_usd(usage, priced) == pytest.approx(1 + 1 + 0.5)
    assert ModelPrice.of(Price(input=4, output=8)).cache_write == pytest.approx(5)
    # A price: wins over the table.
    assert cost_usd(Usage(model="gpt-6-sol", input_tokens=1_000_000), Price(input=7, output=0)) == pytest.approx(7)


def test_zero_usage_costs_zero() -> None:
    assert cost_usd(Usage(model="gpt-5")) == 0.0


# ---------------------------------------------------------------------------------------- pure: credentials


def test_credential_from_env_then_credentials_directory(tmp_path: Path) -> None:
    (tmp_path / "anthropic_api_key").write_text(" from-file-key-123 \n")
    assert credential("ANTHROPIC_API_KEY", {"ANTHROPIC_API_KEY": "env-key-123"}) == "env-key-123"
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path)}
    assert credential("ANTHROPIC_API_KEY", env) == "from-file-key-123"
    assert credential("OPENAI_API_KEY", env) is None
    assert credential("ANTHROPIC_API_KEY", {}) is None


def test_cut_answer_is_an_error() -> None:
    runner = LlmRunner(environ={})
    reply = _Reply(structured=None, text='{"signal": "RET', stop="max_tokens", usage=Usage(model="m", turns=1))
    result = runner._answer(request(Path("/tmp"), None), cfg(max_tokens=10), reply, None)
    assert result.status == "error"
    assert result.reason == "bad_output"
    assert "max_tokens=10" in (result.error or "")
    assert result.usage is not None


def test_refusal_is_an_agent_error() -> None:
    runner = LlmRunner(environ={})
    reply = _Reply(structured=None, text="", stop="stop", usage=Usage(turns=1), refusal="I can't help with that.")
    result = runner._answer(request(Path("/tmp"), None), cfg(provider="openai", model="m"), reply, None)
    assert result.reason == "agent_error"
    assert "can't help" in (result.error or "")


# ------------------------------------------------------------------------------------------ against the fakes

needs_anthropic = pytest.mark.skipif(find_spec("anthropic") is None, reason="the anthropic SDK (llm extra)")
needs_openai = pytest.mark.skipif(find_spec("openai") is None, reason="the openai SDK (llm extra)")


def anthropic_env(api: Any, **extra: str) -> dict[str, str]:
    return {"ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": KEY, **extra}


@pytest.mark.slow
@needs_anthropic
async def test_anthropic_structured_return(tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []
    prompt = agent_file(tmp_path, playbook({"answer": {"signal": "RETURN", "result": {"status": "ok", "x": "$ITEM"}}}))
    with FakeAnthropic() as api:
        runner = LlmRunner(environ=anthropic_env(api), watch=lambda req, kind, text: seen.append((kind, text)))
        result = await runner.run(request(tmp_path, prompt), cfg())
        (rec,) = api.requests
    assert result.status == "success", result.error
    assert result.result == {"status": "ok", "x": "doc-1"}
    assert result.duration_ms >= 0
    body = rec.body
    assert body is not None
    assert rec.path == "/v1/messages"
    assert sent_key(rec) == KEY
    assert body["model"] == ANTHROPIC_ALIASES["sonnet"]
    assert body["tool_choice"] == {"type": "tool", "name": "answer"}
    assert body["tools"][0]["name"] == "answer"
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert "## How to answer (ambient)" in body["system"][0]["text"]
    assert "Item: doc-1" in body["messages"][0]["content"]
    usage = result.usage
    assert usage is not None
    assert usage.model == ANTHROPIC_ALIASES["sonnet"]
    assert usage.turns == 1
    assert usage.input_tokens > 0
    assert usage.output_tokens > 0
    assert usage.cache_write_tokens > 0  # the first request writes the prefix
    assert usage.cost_usd is not None
    assert usage.cost_usd == pytest.approx(cost_usd(usage))
    assert seen == [("assistant", json.dumps({"signal": "RETURN", "result": {"status": "ok", "x": "doc-1"}}))]
    no_secret(result, KEY)


@pytest.mark.slow
@needs_anthropic
async def test_anthropic_text_answer_falls_back_to_the_last_json(tmp_path: Path) -> None:
    answer = {"signal": "RETURN", "result": {"status": "partial", "n": 2}}
    prompt = agent_file(tmp_path, playbook({"answer": answer}, {"answer_as": "text"}))
    with FakeAnthropic() as api:
        result = await LlmRunner(environ=anthropic_env(api)).run(request(tmp_path, prompt), cfg())
    assert result.status == "success", result.error
    assert result.result_status == "partial"
    assert result.result == {"status": "partial", "n": 2}


@needs_anthropic
async def test_anthropic_plain_text_is_a_return_with_the_text(tmp_path: Path) -> None:
    prompt = agent_file(tmp_path, playbook({"text": "Reviewed $ITEM: nothing to change."}))

    def broken_watch(req: RunRequest, kind: str, text: str) -> None:
        raise RuntimeError("a watcher's bug")

    with FakeAnthropic() as api:
        result = await LlmRunner(environ=anthropic_env(api), watch=broken_watch).run(request(tmp_path, prompt), cfg())
    assert result.status == "success"
    assert result.result == {"status": "ok", "text": "Reviewed doc-1: nothing to change."}


@needs_anthropic
async def test_anthropic_escalate_with_options(tmp_path: Path) -> None:
    answer = {"signal": "ESCALATE", "question": "Ship $ITEM?", "options": ["ship", "hold"]}
    prompt = agent_file(tmp_path, playbook({"answer": answer}))
    with FakeAnthropic() as api:
        result = await LlmRunner(environ=anthropic_env(api)).run(request(tmp_path, prompt), cfg())
    assert result.status == "escalate"
    assert result.options == ["ship", "hold"]
    assert result.question == "Ship doc-1?"
    assert result.usage is not None


@needs_anthropic
async def test_frontmatter_model_alias_and_temperature(tmp_path: Path) -> None:
    prompt = agent_file(tmp_path, playbook({"text": "ok"}), model="haiku")
    with FakeAnthropic() as api:
        result = await LlmRunner(environ=anthropic_env(api)).run(request(tmp_path, prompt), cfg(temperature=0.2))
        (rec,) = api.requests
    assert result.ok
    assert rec.body is not None
    assert rec.body["model"] == "claude-haiku-5-5"
    assert rec.body["temperature"] == 0.2
    assert result.usage is not None
    assert result.usage.model == "claude-haiku-5-5"


@pytest.mark.slow
@needs_anthropic
async def test_anthropic_refused_key_is_not_retried(tmp_path: Path) -> None:
    prompt = agent_file(tmp_path, playbook({"text": "ok"}))
    with FakeAnthropic() as api:
        api.fail(401)
        result = await LlmRunner(environ=anthropic_env(api)).run(request(tmp_path, prompt), cfg(max_retries=3))
        assert len(api.requests) == 1
    assert result.status == "error"
    assert result.reason == "provider_refused"
    assert "the key for provider anthropic is refused (401)" in (result.error or "")
    assert "ANTHROPIC_API_KEY" in (result.error or "")
    no_secret(result, KEY)


@needs_anthropic
async def test_forbidden_is_refused_too(tmp_path: Path) -> None:
    with FakeAnthropic() as api:
        api.fail(403)
        result = await LlmRunner(environ=anthropic_env(api)).run(request(tmp_path, None), cfg())
        assert len(api.requests) == 1
    assert result.reason == "provider_refused"
    assert "(403)" in (result.error or "")


@needs_anthropic
async def test_rate_limit_is_retried_then_succeeds(tmp_path: Path) -> None:
    prompt = agent_file(tmp_path, playbook({"text": "ok"}))
    with FakeAnthropic() as api:
        api.fail(429, times=2)
        result = await LlmRunner(environ=anthropic_env(api)).run(request(tmp_path, prompt), cfg(max_retries=2))
        assert len(api.requests) == 3
    assert result.ok, result.error


@needs_anthropic
async def test_still_failing_after_retries_is_provider_failed(tmp_path: Path) -> None:
    with FakeAnthropic() as api:
        api.fail(529)
        result = await LlmRunner(environ=anthropic_env(api)).run(request(tmp_path, None), cfg(max_retries=1))
        assert len(api.requests) == 2
    assert result.reason == "provider_failed"
    assert "answered 529 after 1 retries" in (result.error or "")
    assert "overloaded_error" in (result.error or "")  # the provider's own message


@needs_anthropic
async def test_bad_request_is_not_retried(tmp_path: Path) -> None:
    with FakeAnthropic() as api:
        api.fail(400)
        result = await LlmRunner(environ=anthropic_env(api)).run(request(tmp_path, None), cfg(max_retries=3))
        assert len(api.requests) == 1
    assert result.reason == "provider_failed"
    assert "answered 400:" in (result.error or "")


@pytest.mark.slow
@needs_anthropic
async def test_fan_out_sends_a_byte_identical_cached_prefix(tmp_path: Path) -> None:
    prompt = agent_file(tmp_path, playbook({"answer": {"signal": "RETURN", "result": {"status": "ok", "i": "$ITEM"}}}))
    items = [f"item-{i:02d}" for i in range(20)]
    with FakeAnthropic() as api:
        runner = LlmRunner(environ=anthropic_env(api))
        first = await runner.run(request(tmp_path, prompt, item=items[0]), cfg())
        rest = await asyncio.gather(*(runner.run(request(tmp_path, prompt, item=i), cfg()) for i in items[1:]))
        recs = api.requests
    results = [first, *rest]
    assert [r.result for r in results] == [{"status": "ok", "i": i} for i in items]
    assert len(recs) == 20
    prefixes = set()
    for rec in recs:
        assert rec.body is not None
        assert rec.body["system"][-1]["cache_control"] == {"type": "ephemeral"}
        prefixes.add(json.dumps([rec.body["tools"], rec.body["system"]], sort_keys=False).encode())
    assert len(prefixes) == 1  # the stable prefix is byte-identical in all 20 requests
    users = {rec.body["messages"][0]["content"] for rec in recs if rec.body is not None}
    assert len(users) == 20  # only the brief changes
    usages = [r.usage for r in results]
    assert all(u is not None and u.cost_usd is not None and u.cost_usd > 0 for u in usages)
    assert usages[0] is not None and usages[0].cache_write_tokens > 0
    for usage in usages[1:]:
        assert usage is not None
        assert usage.cache_read_tokens > 0  # served by the cache
        assert usage.cache_write_tokens == 0


@needs_anthropic
async def test_key_from_credentials_directory(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "anthropic_api_key").write_text(KEY + "\n")
    with FakeAnthropic() as api:
        env = {"ANTHROPIC_BASE_URL": api.url, "CREDENTIALS_DIRECTORY": str(creds)}
        result = await LlmRunner(environ=env).run(request(tmp_path, None), cfg())
        (rec,) = api.requests
    assert result.ok, result.error
    assert sent_key(rec) == KEY


@needs_anthropic
async def test_custom_key_variable(tmp_path: Path) -> None:
    with FakeAnthropic() as api:
        env = {"ANTHROPIC_BASE_URL": api.url, "TEAM_CLAUDE_KEY": "team-key-0123456789"}
        result = await LlmRunner(environ=env).run(request(tmp_path, None), cfg(api_key_env="TEAM_CLAUDE_KEY"))
        (rec,) = api.requests
    assert result.ok, result.error
    assert sent_key(rec) == "team-key-0123456789"


@needs_anthropic
async def test_missing_key_is_refused_without_a_call(tmp_path: Path) -> None:
    with FakeAnthropic() as api:
        result = await LlmRunner(environ={"ANTHROPIC_BASE_URL": api.url}).run(request(tmp_path, None), cfg())
        assert api.requests == []
    assert result.reason == "provider_refused"
    assert "ANTHROPIC_API_KEY" in (result.error or "")
    assert "$CREDENTIALS_DIRECTORY/anthropic_api_key" in (result.error or "")


@needs_anthropic
async def test_key_echoed_by_the_provider_is_masked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import anthropic
    import httpx2

    def handler(request: httpx2.Request) -> httpx2.Response:
        key = request.headers.get("x-api-key") or request.headers["authorization"].removeprefix("Bearer ")
        body = {"type": "error", "error": {"type": "authentication_error", "message": f"invalid x-api-key {key}"}}
        return httpx2.Response(401, json=body)

    def mocked(**kw: Any) -> Any:
        return httpx2.AsyncClient(transport=httpx2.MockTransport(handler))

    monkeypatch.setattr(anthropic, "DefaultAsyncHttpxClient", mocked)
    result = await LlmRunner(environ={"ANTHROPIC_API_KEY": KEY}).run(request(tmp_path, None), cfg())
    assert result.reason == "provider_refused"
    assert "invalid x-api-key ***" in (result.error or "")
    no_secret(result, KEY)


async def test_no_sdk_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)  # ``import anthropic`` now raises ImportError
    result = await LlmRunner(environ={"ANTHROPIC_API_KEY": KEY}).run(request(tmp_path, None), cfg())
    assert result.status == "error"
    assert result.reason == "bad_request"
    assert INSTALL_HINT in (result.error or "")
    monkeypatch.setitem(sys.modules, "openai", None)
    result = await LlmRunner(environ={}).run(request(tmp_path, None), cfg(provider="openai", model="m"))
    assert INSTALL_HINT in (result.error or "")


@needs_anthropic
async def test_unreadable_prompt_is_a_bad_request(tmp_path: Path) -> None:
    result = await LlmRunner(environ={"ANTHROPIC_API_KEY": KEY}).run(
        request(tmp_path, tmp_path / "agents" / "missing.md"), cfg()
    )
    assert result.reason == "bad_request"
    assert "missing.md" in (result.error or "")


@pytest.mark.slow
@needs_anthropic
async def test_timeout_is_provider_failed(tmp_path: Path) -> None:
    with FakeAnthropic() as api:
        api.delay_s = 1.5
        result = await LlmRunner(environ=anthropic_env(api)).run(
            request(tmp_path, None), cfg(timeout_s=0.3, max_retries=0)
        )
    assert result.reason == "provider_failed"
    assert "timeout_s=0.3" in (result.error or "")
    assert result.duration_ms < 1400


@needs_anthropic
async def test_an_unreachable_provider_holds_the_run_naming_its_address(tmp_path: Path) -> None:
    with FakeAnthropic() as api:
        url = api.url  # a port nobody listens on once the fake is closed
    result = await LlmRunner(environ={"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": KEY}).run(
        request(tmp_path, None), cfg(max_retries=0)
    )
    assert result.reason == "provider_unreachable"
    assert f"unreachable at {url}/v1/messages" in (result.error or "")
    no_secret(result, KEY)


@needs_anthropic
async def test_cancellation_propagates(tmp_path: Path) -> None:
    with FakeAnthropic() as api:
        api.delay_s = 1.0
        task = asyncio.create_task(LlmRunner(environ=anthropic_env(api)).run(request(tmp_path, None), cfg()))
        await asyncio.to_thread(api.wait_for, lambda reqs: len(reqs) >= 1, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


# ------------------------------------------------------------------------------------------------- OpenAI


def openai_cfg(api: Any, **kw: Any) -> LlmRunnerConfig:
    return cfg(provider="openai", model=kw.pop("model", "gpt-6-sol"), base_url=f"{api.url}/v1", **kw)


@pytest.mark.slow
@needs_openai
async def test_openai_structured_return(tmp_path: Path) -> None:
    seen: list[str] = []
    answer = {"signal": "RETURN", "result": {"status": "ok", "item": "$ITEM"}}
    prompt = agent_file(tmp_path, playbook({"answer": answer}))
    with FakeOpenAI() as api:
        runner = LlmRunner(environ={"OPENAI_API_KEY": OKEY}, watch=lambda r, k, t: seen.append(t))
        result = await runner.run(request(tmp_path, prompt), openai_cfg(api, temperature=0))
        (rec,) = api.requests
    assert result.status == "success", result.error
    assert result.result == {"status": "ok", "item": "doc-1"}
    body = rec.body
    assert body is not None
    assert rec.headers["authorization"] == f"Bearer {OKEY}"
    assert body["model"] == "gpt-6-sol"
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"]["required"] == ["signal"]
    assert body["max_tokens"] == 4096  # a server at a base_url: the universal parameter
    assert body["temperature"] == 0
    usage = result.usage
    assert usage is not None
    assert usage.model == "gpt-6-sol"
    assert usage.input_tokens > 0
    assert usage.output_tokens > 0
    assert usage.cost_usd == pytest.approx(cost_usd(usage))
    assert len(seen) == 1
    no_secret(result, OKEY)


@pytest.mark.slow
@needs_openai
async def test_openai_plain_text_and_escalate(tmp_path: Path) -> None:
    text_prompt = agent_file(tmp_path, playbook({"text": "All fine."}), name="a")
    esc = {"signal": "ESCALATE", "question": "Which?", "options": ["a", "b", "c"]}
    esc_prompt = agent_file(tmp_path, playbook({"answer": esc}), name="b")
    with FakeOpenAI() as api:
        runner = LlmRunner(environ={"OPENAI_API_KEY": OKEY})
        text = await runner.run(request(tmp_path, text_prompt, agent="a"), openai_cfg(api))
        escalated = await runner.run(request(tmp_path, esc_prompt, agent="b"), openai_cfg(api))
    assert text.result == {"status": "ok", "text": "All fine."}
    assert escalated.status == "escalate"
    assert escalated.options == ["a", "b", "c"]


@needs_openai
async def test_openai_local_server_without_key(tmp_path: Path) -> None:
    with FakeOpenAI() as api:
        result = await LlmRunner(environ={}).run(request(tmp_path, None), openai_cfg(api, model="llama3.2"))
        (rec,) = api.requests
    assert result.ok, result.error
    assert rec.headers["authorization"].startswith("Bearer ")
    assert result.usage is not None
    assert result.usage.cost_usd is None  # a model outside the table, no price:


@needs_openai
async def test_openai_priced_local_model(tmp_path: Path) -> None:
    with FakeOpenAI() as api:
        result = await LlmRunner(environ={}).run(
            request(tmp_path, None), openai_cfg(api, model="llama3.2", price={"input": 1.0, "output": 2.0})
        )
    assert result.usage is not None
    usage = result.usage
    assert usage.cost_usd == pytest.approx((usage.input_tokens * 1 + usage.output_tokens * 2) / 1e6)


@needs_openai
async def test_openai_without_model_is_a_clear_error(tmp_path: Path) -> None:
    prompt = agent_file(tmp_path, playbook({"text": "x"}), model="sonnet")
    result = await LlmRunner(environ={}).run(
        request(tmp_path, prompt), cfg(provider="openai", base_url="http://127.0.0.1:9/v1")
    )
    assert result.reason == "bad_request"
    assert "no model for provider openai" in (result.error or "")
    assert "'sonnet'" in (result.error or "")


@needs_openai
async def test_openai_refused_and_retried(tmp_path: Path) -> None:
    with FakeOpenAI() as api:
        runner = LlmRunner(environ={"OPENAI_API_KEY": OKEY})
        api.fail(401)
        refused = await runner.run(request(tmp_path, None), openai_cfg(api, max_retries=3))
        assert len(api.requests) == 1
        api.fail(429, times=2)
        retried = await runner.run(request(tmp_path, None), openai_cfg(api, max_retries=2))
        assert len(api.requests) == 4
    assert refused.reason == "provider_refused"
    assert "the key for provider openai is refused (401): check OPENAI_API_KEY" in (refused.error or "")
    no_secret(refused, OKEY)
    assert retried.ok, retried.error


@needs_openai
async def test_openai_missing_key_without_base_url(tmp_path: Path) -> None:
    result = await LlmRunner(environ={}).run(request(tmp_path, None), cfg(provider="openai", model="gpt-6-sol"))
    assert result.reason == "provider_refused"
    assert "OPENAI_API_KEY" in (result.error or "")


@needs_anthropic
async def test_a_wrong_path_in_the_base_url_is_named(tmp_path: Path) -> None:
    with FakeAnthropic() as api:
        result = await LlmRunner(environ={"ANTHROPIC_BASE_URL": f"{api.url}/bogus", "ANTHROPIC_API_KEY": KEY}).run(
            request(tmp_path, None), cfg(max_retries=0)
        )
    assert result.reason == "provider_unreachable"
    assert f"answered 404 at {api.url}/bogus/v1/messages" in (result.error or "")
    no_secret(result, KEY)
