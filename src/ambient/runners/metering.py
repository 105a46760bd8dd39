"""What one model call used, read from its response as it passes through the model gateway. Pure.

The gateway (:mod:`ambient.runners.gateway`) hands each response's bytes to a :class:`CallMeter`: a whole JSON body,
or the events of a server-sent stream one by one. The meter keeps the response's id, model and usage as the provider
reports them, and says which streamed event is the last one (the gateway records the call before it hands that event
on):

- **Anthropic Messages.** A JSON body carries ``usage``; a stream carries the input side in ``message_start``
  (``message.usage``) and the output side, cumulative, in each ``message_delta`` (``usage``; the newer API repeats the
  input fields there too: the last value wins). ``message_stop`` ends it.
- **OpenAI Chat Completions** (and the servers speaking its API). A JSON body carries ``usage``; a stream carries it in
  its last chunk when the request asks ``stream_options.include_usage`` (the gateway asks it); ``data: [DONE]`` ends
  it. ``prompt_tokens`` include the cached ones: split into uncached, cache read and cache write as
  :class:`ambient.runners.result.Usage` counts them.

A response without usage (an error, ``count_tokens``, a model list) is no billed call: :attr:`CallMeter.billed` is
False and nothing is recorded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ambient.runners.pricing import cost_usd
from ambient.runners.result import Usage
from ambient.runners.runner_config import Price

Provider = Literal["anthropic", "openai"]
#: A server-sent event larger than this is not parsed for usage (it is forwarded all the same).
MAX_EVENT_BYTES = 4 * 1024 * 1024


def _count(value: Any) -> int | None:
    """A token count as a provider sends it (a non-negative integer), else None."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


@dataclass
class CallMeter:
    """The usage of one response of ``provider``, fed as it passes (see the module docstring)."""

    provider: Provider
    id: str | None = None
    model: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    billed: bool = False  # some usage was seen: the provider bills this response
    ended: bool = False  # the stream's last event was seen (or the whole JSON body)
    _buffer: bytearray = field(default_factory=bytearray, repr=False)

    # -- a whole body

    def feed_body(self, body: bytes) -> None:
        """A response's whole JSON body."""
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            return
        if isinstance(data, dict):
            self._read_object(data)
        self.ended = True

    # -- a stream

    def feed_stream(self, chunk: bytes) -> list[tuple[bytes, bool]]:
        """Bytes of an event stream as they come: the complete events they finish, each as its raw bytes (to hand on
        as they are) and whether it is the stream's last event. Bytes of an event not complete yet are kept."""
        self._buffer += chunk
        out: list[tuple[bytes, bool]] = []
        while True:
            end, sep = _event_end(self._buffer)
            if end < 0:
                if len(self._buffer) > MAX_EVENT_BYTES:  # no event is this big: hand it on unread
                    out.append((bytes(self._buffer), False))
                    self._buffer.clear()
                return out
            raw = bytes(self._buffer[: end + sep])
            del self._buffer[: end + sep]
            last = self._read_event(raw[:end])
            out.append((raw, last))

    def rest(self) -> bytes:
        """What is left of the stream that makes no complete event (handed on as it is at the end)."""
        left = bytes(self._buffer)
        self._buffer.clear()
        return left

    def _read_event(self, raw: bytes) -> bool:
        """Read one event's ``data:`` lines; True when it ends the stream."""
        lines = raw.decode("utf-8", "replace").splitlines()
        data = "\n".join(line[5:].removeprefix(" ") for line in lines if line.startswith("data:"))
        if not data:
            return False
        if data.strip() == "[DONE]":
            self.ended = True
            return True
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            return False
        if not isinstance(obj, dict):
            return False
        kind = obj.get("type")
        if kind == "message_start" and isinstance(obj.get("message"), dict):
            self._read_object(obj["message"])
        elif kind == "message_delta":
            self._read_usage(obj.get("usage"))
        elif kind == "message_stop":
            self.ended = True
            return True
        elif self.provider == "openai":
            self._read_object(obj)
        return False

    # -- the fields

    def _read_object(self, obj: dict[str, Any]) -> None:
        if isinstance(obj.get("id"), str) and self.id is None:
            self.id = obj["id"][:200]
        if isinstance(obj.get("model"), str) and obj["model"]:
            self.model = obj["model"][:200]
        self._read_usage(obj.get("usage"))

    def _read_usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        if self.provider == "openai":
            self._read_openai(usage)
            return
        for theirs, ours in (
            ("input_tokens", "input_tokens"),
            ("output_tokens", "output_tokens"),
            ("cache_read_input_tokens", "cache_read_tokens"),
            ("cache_creation_input_tokens", "cache_write_tokens"),
        ):
            n = _count(usage.get(theirs))
            if n is not None:
                setattr(self, ours, n)
                self.billed = True

    def _read_openai(self, usage: dict[str, Any]) -> None:
        prompt = _count(usage.get("prompt_tokens"))
        completion = _count(usage.get("completion_tokens"))
        if prompt is None and completion is None:
            return
        details = usage.get("prompt_tokens_details")
        details = details if isinstance(details, dict) else {}
        cached = _count(details.get("cached_tokens")) or 0
        written = _count(details.get("cache_write_tokens")) or 0
        self.input_tokens = max(0, (prompt or 0) - cached - written)
        self.cache_read_tokens = cached
        self.cache_write_tokens = written
        self.output_tokens = completion or 0
        self.billed = True

    def usage(self, price: Price | None = None, *, model: str | None = None) -> Usage:
        """The call's usage, priced at ``price`` (a runner's ``price:``) else the built-in table (``model``: the
        model asked for, when the response names none)."""
        found = Usage(
            model=self.model or model,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cache_read_tokens=self.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens,
            turns=1,
        )
        return replace(found, cost_usd=cost_usd(found, price))


def _event_end(buffer: bytearray) -> tuple[int, int]:
    """Where the first complete event of ``buffer`` ends and the length of its blank-line separator; (-1, 0) when
    none is complete. Both line ends are read (``\\n\\n``, ``\\r\\n\\r\\n``)."""
    found = [(i, len(sep)) for sep in (b"\n\n", b"\r\n\r\n", b"\r\r") if (i := buffer.find(sep)) >= 0]
    return min(found) if found else (-1, 0)


def error_body(provider: Provider, status: int, message: str) -> dict[str, Any]:
    """An error body in the provider's own shape, so the agent's SDK reads ``message`` as the API's words."""
    if provider == "anthropic":
        kind = {400: "invalid_request_error", 401: "authentication_error", 429: "rate_limit_error"}.get(status)
        return {"type": "error", "error": {"type": kind or "api_error", "message": message}}
    kind = {400: "invalid_request_error", 401: "invalid_api_key", 429: "rate_limit_exceeded"}.get(status)
    return {"error": {"message": message, "type": kind or "server_error", "param": None, "code": "ambient"}}
