"""Reading a model call's usage from its response as it passes (ambient.runners.metering): pure."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambient.runners.metering import CallMeter, error_body

ANTHROPIC_STREAM = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","model":"claude-haiku-4-5",'
    b'"usage":{"input_tokens":100,"cache_read_input_tokens":50,"cache_creation_input_tokens":10,"output_tokens":1}}}'
    b"\n\n"
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
    b'"text":"hi"}}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
    b'"usage":{"output_tokens":42}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)


def _feed(meter: CallMeter, data: bytes, cuts: list[int]) -> list[tuple[bytes, bool]]:
    out: list[tuple[bytes, bool]] = []
    start = 0
    for cut in sorted(set(cuts)):
        out += meter.feed_stream(data[start:cut])
        start = cut
    out += meter.feed_stream(data[start:])
    return out


@pytest.mark.slow
@given(st.lists(st.integers(min_value=0, max_value=len(ANTHROPIC_STREAM)), max_size=12))
def test_an_anthropic_stream_cut_anywhere_gives_its_events_whole_and_its_usage(cuts: list[int]) -> None:
    meter = CallMeter("anthropic")
    events = _feed(meter, ANTHROPIC_STREAM, cuts)
    assert b"".join(raw for raw, _ in events) == ANTHROPIC_STREAM  # handed on byte for byte
    assert [last for _, last in events] == [False, False, False, True]  # message_stop ends it
    assert meter.billed and meter.ended and meter.rest() == b""
    usage = meter.usage()
    assert (usage.model, usage.input_tokens, usage.output_tokens) == ("claude-haiku-4-5", 100, 42)
    assert (usage.cache_read_tokens, usage.cache_write_tokens, usage.turns) == (50, 10, 1)
    assert meter.id == "msg_1"
    # 100 x $1 + 42 x $5 + 50 x $0.10 + 10 x $1.25 per million tokens
    assert usage.cost_usd == pytest.approx((100 * 1 + 42 * 5 + 50 * 0.1 + 10 * 1.25) / 1e6)


def test_a_stream_with_crlf_line_ends_is_read_the_same() -> None:
    meter = CallMeter("anthropic")
    events = meter.feed_stream(ANTHROPIC_STREAM.replace(b"\n", b"\r\n"))
    assert len(events) == 4 and events[-1][1]
    assert meter.usage().output_tokens == 42


def test_a_stream_cut_short_keeps_what_it_said() -> None:
    meter = CallMeter("anthropic")
    meter.feed_stream(ANTHROPIC_STREAM[: ANTHROPIC_STREAM.index(b"event: message_delta")])
    assert meter.billed and not meter.ended
    assert (meter.usage().input_tokens, meter.usage().output_tokens) == (100, 1)


def test_an_openai_stream_gives_its_usage_chunk_and_ends_at_done() -> None:
    chunk = {"id": "chatcmpl-1", "model": "gpt-5-mini", "choices": [{"delta": {"content": "x"}}]}
    usage = {
        "prompt_tokens": 1000,
        "completion_tokens": 20,
        "prompt_tokens_details": {"cached_tokens": 600, "cache_write_tokens": 100},
    }
    data = (
        f"data: {json.dumps(chunk)}\n\ndata: {json.dumps({**chunk, 'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n"
    ).encode()
    meter = CallMeter("openai")
    events = meter.feed_stream(data)
    assert [last for _, last in events] == [False, False, True]
    got = meter.usage()
    assert (got.input_tokens, got.cache_read_tokens, got.cache_write_tokens, got.output_tokens) == (300, 600, 100, 20)
    assert meter.id == "chatcmpl-1" and got.model == "gpt-5-mini"


def test_a_body_without_usage_is_no_billed_call() -> None:
    for provider, body in (
        ("anthropic", b'{"input_tokens": 12}'),  # count_tokens
        ("anthropic", json.dumps(error_body("anthropic", 400, "no")).encode()),
        ("openai", b'{"object": "list", "data": []}'),
        ("openai", b"not json"),
    ):
        meter = CallMeter(provider)  # type: ignore[arg-type]
        meter.feed_body(body)
        assert not meter.billed, (provider, body)


def test_a_model_without_a_price_has_an_unknown_cost_unless_the_runner_gives_one() -> None:
    from ambient.runners.runner_config import Price

    meter = CallMeter("openai")
    meter.feed_body(b'{"id": "c", "model": "llama3.1", "usage": {"prompt_tokens": 1000000, "completion_tokens": 0}}')
    assert meter.usage().cost_usd is None
    assert meter.usage(Price(input=0.5, output=1.0)).cost_usd == pytest.approx(0.5)


def test_errors_take_the_providers_shape() -> None:
    assert error_body("anthropic", 400, "held")["error"] == {"type": "invalid_request_error", "message": "held"}
    assert error_body("openai", 400, "held")["error"]["message"] == "held"
