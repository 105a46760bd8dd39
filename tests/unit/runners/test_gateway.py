"""The model gateway (ambient.runners.gateway) between the official SDKs and the fake APIs on 127.0.0.1: forwarded
with the real key, metered and recorded before the answer is handed on, refused past a budget, keys void once their
attempt ends."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from ambient.runners.gateway import Grant, MeteredCall, ModelGateway, Upstream, upstream_auth
from ambient.testing.fakeapi import FakeAnthropic, FakeOpenAI
from tests.conftest import async_wait_until

pytestmark = pytest.mark.slow  # the SDKs' imports and real sockets

REAL_KEY = "sk-real-key-0123456789"
PROMPT = "## How to answer (ambient)\nanswer"


class Hooks:
    """Records calls; refuses once ``refuse`` is set; ``seen`` says what the client had received at each record."""

    def __init__(self) -> None:
        self.calls: list[tuple[Grant, MeteredCall]] = []
        self.refuse: str | None = None
        self.client_saw_end = False
        self.ended_before_record: list[bool] = []

    def admit(self, grant: Grant) -> str | None:
        return self.refuse

    async def record(self, grant: Grant, call: MeteredCall) -> None:
        self.ended_before_record.append(self.client_saw_end)
        self.calls.append((grant, call))


@pytest.fixture
def anthropic_api() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as fake:
        yield fake


@pytest.fixture
def openai_api() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
async def gateway() -> AsyncIterator[ModelGateway]:
    gw = ModelGateway(Hooks())
    await gw.start()
    try:
        yield gw
    finally:
        await gw.close()


def _hooks(gw: ModelGateway) -> Hooks:
    assert isinstance(gw.hooks, Hooks)
    return gw.hooks


def _grant(gw: ModelGateway, provider: Any, url: str) -> Grant:
    return gw.grant(
        run_id="r",
        item="a",
        attempt=1,
        agent="writer",
        key="r/a/1",
        upstream=Upstream(provider, url, upstream_auth(provider, None, REAL_KEY)),
    )


def _tokens(usage: dict[str, Any]) -> tuple[int, int, int, int]:
    return (
        usage.get("input_tokens", 0),
        usage.get("output_tokens", 0),
        usage.get("cache_read_input_tokens", 0),
        usage.get("cache_creation_input_tokens", 0),
    )


async def test_a_streamed_answer_is_recorded_before_its_last_event_reaches_the_agent(
    gateway: ModelGateway, anthropic_api: FakeAnthropic
) -> None:
    grant = _grant(gateway, "anthropic", anthropic_api.url)
    hooks = _hooks(gateway)
    body = {"model": "claude-haiku-4-5", "max_tokens": 50, "stream": True, "system": PROMPT, "messages": []}
    body["messages"] = [{"role": "user", "content": "Item: a"}]
    async with (
        httpx.AsyncClient() as client,
        client.stream("POST", f"{gateway.url}/v1/messages", json=body, headers={"x-api-key": grant.token}) as resp,
    ):
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line == "event: message_stop":
                hooks.client_saw_end = True
    [billed] = anthropic_api.billed
    [(_, call)] = hooks.calls
    assert hooks.ended_before_record == [False]
    assert call.id == billed.id and call.stream and not call.partial
    u = call.usage
    assert (u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens) == _tokens(billed.usage)
    assert u.cost_usd is not None and u.cost_usd > 0
    # the provider got the real key, never the grant
    assert anthropic_api.requests[0].headers["x-api-key"] == REAL_KEY
    assert grant.token not in json.dumps(anthropic_api.requests[0].headers)


async def test_the_anthropic_sdk_through_the_gateway_is_charged_what_was_billed(
    gateway: ModelGateway, anthropic_api: FakeAnthropic
) -> None:
    anthropic = pytest.importorskip("anthropic")
    grant = _grant(gateway, "anthropic", anthropic_api.url)
    async with anthropic.AsyncAnthropic(api_key=grant.token, base_url=gateway.url, max_retries=0) as client:
        for _ in range(2):
            await client.messages.create(
                model="claude-haiku-4-5",
                max_tokens=50,
                system=[{"type": "text", "text": PROMPT, "cache_control": {"type": "ephemeral"}}],
                messages=[{"role": "user", "content": "Item: a"}],
            )
    billed = anthropic_api.billed
    assert len(billed) == 2 and billed[1].usage["cache_read_input_tokens"] > 0  # the second one read the cache
    total = grant.usage()
    assert total is not None and total.turns == 2
    assert total.input_tokens == sum(b.usage["input_tokens"] for b in billed)
    assert total.cache_read_tokens == sum(b.usage["cache_read_input_tokens"] for b in billed)
    assert total.cost_usd == pytest.approx(sum(c.usage.cost_usd or 0 for _, c in _hooks(gateway).calls))


async def test_an_openai_stream_is_asked_for_its_usage_and_metered(
    gateway: ModelGateway, openai_api: FakeOpenAI
) -> None:
    openai = pytest.importorskip("openai")
    grant = _grant(gateway, "openai", f"{openai_api.url}/v1")
    async with openai.AsyncOpenAI(api_key=grant.token, base_url=gateway.url, max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="gpt-5-mini", messages=[{"role": "system", "content": PROMPT}], stream=True
        )
        chunks = [c async for c in stream]
    assert chunks
    [billed] = openai_api.billed
    [(_, call)] = _hooks(gateway).calls
    assert call.id == billed.id
    assert call.usage.input_tokens + call.usage.cache_read_tokens == billed.usage["prompt_tokens"]
    assert call.usage.output_tokens == billed.usage["completion_tokens"]
    assert openai_api.requests[0].body["stream_options"] == {"include_usage": True}  # type: ignore[index]
    assert openai_api.requests[0].headers["authorization"] == f"Bearer {REAL_KEY}"


async def test_past_the_budget_a_call_is_refused_before_the_provider(
    gateway: ModelGateway, anthropic_api: FakeAnthropic
) -> None:
    anthropic = pytest.importorskip("anthropic")
    grant = _grant(gateway, "anthropic", anthropic_api.url)
    _hooks(gateway).refuse = "the run's budget is reached"
    async with anthropic.AsyncAnthropic(api_key=grant.token, base_url=gateway.url, max_retries=0) as client:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(
                model="claude-haiku-4-5", max_tokens=5, messages=[{"role": "user", "content": "x"}]
            )
    assert "the run's budget is reached" in str(refused.value)
    assert anthropic_api.requests == [] and anthropic_api.billed == []
    assert grant.refused == "the run's budget is reached" and grant.refusals == 1
    assert grant.usage() is None


async def test_a_key_is_void_once_its_attempt_ends_and_an_unknown_one_always(
    gateway: ModelGateway, anthropic_api: FakeAnthropic
) -> None:
    grant = _grant(gateway, "anthropic", anthropic_api.url)
    body = {"model": "claude-haiku-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    async with httpx.AsyncClient() as client:
        ok = await client.post(f"{gateway.url}/v1/messages", json=body, headers={"x-api-key": grant.token})
        assert ok.status_code == 200
        await gateway.release(grant)
        for key in (grant.token, REAL_KEY, "ambient-made-up"):
            late = await client.post(f"{gateway.url}/v1/messages", json=body, headers={"x-api-key": key})
            assert late.status_code == 401
            assert late.json()["error"]["type"] == "authentication_error"
    assert len(anthropic_api.requests) == 1


class HeldUpstream:
    """A model API on 127.0.0.1 that holds every answer until ``go`` is set, counting the calls at once."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.now = 0
        self.most = 0
        self.arrived = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        self.now += 1
        self.most = max(self.most, self.now)
        self.arrived.set()
        await self.go.wait()
        self.now -= 1
        body = json.dumps(
            {"id": "msg_x", "model": "claude-haiku-4-5", "usage": {"input_tokens": 1, "output_tokens": 1}}
        )
        writer.write(
            f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode()
        )
        writer.write(body.encode())
        await writer.drain()
        writer.close()


async def test_model_calls_past_the_limit_wait_their_turn(gateway: ModelGateway) -> None:
    upstream = HeldUpstream()
    grant = _grant(gateway, "anthropic", await upstream.start())
    gateway.limit(1)
    body = {"model": "claude-haiku-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    async with httpx.AsyncClient() as client:
        calls = [
            asyncio.create_task(
                client.post(f"{gateway.url}/v1/messages", json=body, headers={"x-api-key": grant.token}, timeout=30)
            )
            for _ in range(3)
        ]
        await upstream.arrived.wait()
        assert await async_wait_until(lambda: gateway.waiting == 2)  # the two others wait for the slot, not the API
        assert upstream.now == 1
        upstream.go.set()
        answers = await asyncio.gather(*calls)
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert upstream.most == 1 and len(_hooks(gateway).calls) == 3
    assert upstream.server is not None
    upstream.server.close()


@pytest.mark.parametrize("status", [429, 500, 529])
async def test_an_api_error_reaches_the_agent_as_it_is_and_nothing_unbilled_is_recorded(
    gateway: ModelGateway, anthropic_api: FakeAnthropic, status: int
) -> None:
    """The API refuses a call (rate limit, server error, overloaded): the agent's SDK gets that status as the API sent
    it, the ledger bills nothing for it and the gateway records nothing; the next call, answered, is recorded as
    billed. Recorded = billed, call by call."""
    anthropic = pytest.importorskip("anthropic")
    grant = _grant(gateway, "anthropic", anthropic_api.url)
    anthropic_api.fail(status, times=1)
    async with anthropic.AsyncAnthropic(api_key=grant.token, base_url=gateway.url, max_retries=0) as client:
        ask = {
            "model": "claude-haiku-4-5",
            "max_tokens": 50,
            "system": PROMPT,
            "messages": [{"role": "user", "content": "Item: a"}],
        }
        with pytest.raises(anthropic.APIStatusError) as refused:
            await client.messages.create(**ask)
        assert refused.value.status_code == status
        assert anthropic_api.billed == [] and _hooks(gateway).calls == []
        await client.messages.create(**ask)
    [billed] = anthropic_api.billed
    [(_, call)] = _hooks(gateway).calls
    assert _tokens(billed.usage)[:2] == (call.usage.input_tokens, call.usage.output_tokens)


async def test_a_client_that_hangs_up_mid_stream_is_still_charged_what_was_billed(
    gateway: ModelGateway, anthropic_api: FakeAnthropic
) -> None:
    """An agent that drops its connection after the first event of a streamed answer (killed, timed out): the
    provider billed the answer, so the gateway, reading the stream to its end, records it all the same."""
    grant = _grant(gateway, "anthropic", anthropic_api.url)
    body = {
        "model": "claude-haiku-4-5",
        "max_tokens": 50,
        "stream": True,
        "system": PROMPT,
        "messages": [{"role": "user", "content": "Item: a"}],
    }
    headers = {"x-api-key": grant.token, "anthropic-version": "2023-06-01"}
    async with httpx.AsyncClient() as client:
        async with client.stream("POST", f"{gateway.url}/v1/messages", json=body, headers=headers) as resp:
            assert resp.status_code == 200
            async for _ in resp.aiter_bytes():
                break  # the first bytes, then the agent is gone
    [billed] = anthropic_api.wait_billed(1)
    await async_wait_until(lambda: len(_hooks(gateway).calls) == 1, timeout=30)
    [(_, call)] = _hooks(gateway).calls
    assert _tokens(billed.usage)[:2] == (call.usage.input_tokens, call.usage.output_tokens)
