"""Offline fake model APIs on 127.0.0.1: the Anthropic Messages API and the OpenAI Chat Completions API.

A test double, not part of the daemon. Each fake is an HTTP server on a free loopback port, served by a daemon thread
(standard library only), that answers from a *playbook* written in the agent's system prompt, so the official SDKs and
the real Claude Code CLI can be driven end to end without a network or a key::

    with FakeAnthropic() as api:
        env = {"ANTHROPIC_BASE_URL": api.url, "ANTHROPIC_API_KEY": "test-key"}
        ...
        api.wait_for(lambda reqs: len(reqs) >= 2)

The playbook is a fenced block in the system prompt, one JSON object a line::

    ```fake-model
    {"tool": "Bash", "input": {"command": "pytest -q"}}
    {"answer": {"signal": "RETURN", "result": {"status": "ok", "item": "$ITEM"}}}
    {"on_deny": {"signal": "BLOCKED_ON", "context": {"missing": "permission"}}}
    ```

A reply is derived only from the request (a resumed session, which re-sends its history, continues where it was):

- ``$ITEM`` in any string becomes the item, read from the line ``Item: <name>`` of the first user message.
- The number of ``tool_result`` blocks that are not refusals is the index of the next tool step (a tool that failed
  counts as done; a refused one is asked again on resume); while tool steps remain, the reply is a ``tool_use`` of
  the next one.
- If the last user message says ``denied`` (or rejected, refused, not allowed: in an erroring tool_result or in its
  text), the reply is the ``on_deny`` answer, else the final answer.
- The final answer is ``{"answer": {...}}`` (a JSON object) or ``{"text": "..."}``. An object is sent as a
  ``tool_use`` when the request forces a tool (``tool_choice: {"type": "tool"}``) or offers Claude Code's structured
  output tool (``StructuredOutput``), as JSON text when the request asks for a JSON output format, otherwise as text
  ``"Done.\\n" + json``. ``{"answer_as": "text"}`` forces text.
- No playbook: ``{"signal": "RETURN", "result": {"status": "ok", "item": "$ITEM"}}``.
- A request whose system prompt has neither ambient's contract heading nor a playbook (Claude Code's side requests:
  titles, quota probes…) gets a short text reply, never a tool_use.

``python -m ambient.testing.fakeapi anthropic|openai [--port N] [--port-file F]`` serves one until SIGTERM.
"""

from __future__ import annotations

import abc
import argparse
import hashlib
import itertools
import json
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar
from urllib.parse import urlsplit

__all__ = ["CONTRACT_MARKER", "STRUCTURED_OUTPUT_TOOLS", "FakeAnthropic", "FakeOpenAI", "Playbook", "Recorded"]

#: The heading of ambient's answer contract: a system prompt carrying it is an agent's conversation.
CONTRACT_MARKER = "## How to answer (ambient)"
#: Tools through which a client asks for a structured answer (Claude Code's ``output_format`` offers this one).
STRUCTURED_OUTPUT_TOOLS = frozenset({"StructuredOutput"})
#: The answer when a playbook has none.
DEFAULT_ANSWER: dict[str, Any] = {"signal": "RETURN", "result": {"status": "ok", "item": "$ITEM"}}
#: What a side request (no contract, no playbook) is answered.
SIDE_REPLY = "OK."

_FENCE = re.compile(r"```fake-model[ \t]*\n(.*?)```", re.DOTALL)
_ITEM = re.compile(r"^Item:[ \t]*(.+?)[ \t]*$", re.MULTILINE)
#: How a refused tool call reads: a ``can_use_tool`` deny message (ambient's say "denied"), Claude Code's own text for a
#: deny with ``interrupt=True`` ("The user doesn't want to proceed with this tool use. The tool use was rejected").
_DENIED = re.compile(r"\b(denied|rejected|refused|not allowed)\b|doesn't want to proceed", re.IGNORECASE)
#: A call Claude Code cut off (its session ended before the result): a model checks and runs it again.
_CUT_OFF = re.compile(r"Tool call interrupted")
_MAX_BODY = 64 * 1024 * 1024
_DELTA_CHARS = 24


@dataclass(frozen=True, slots=True)
class Recorded:
    """One request as the fake received it: path without the query string, lower-case headers, the JSON body
    (``None`` when there was none or it was not JSON)."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None
    method: str = "POST"
    query: str = ""


# --------------------------------------------------------------------------------------------------- the playbook


@dataclass(frozen=True, slots=True)
class Playbook:
    """The scripted behaviour of a fake model: tool steps, then a final answer (an object or plain text)."""

    tools: tuple[dict[str, Any], ...] = ()
    answer: dict[str, Any] | None = None
    text: str | None = None
    on_deny: dict[str, Any] | None = None
    answer_as_text: bool = False

    @classmethod
    def parse(cls, system_text: str) -> Playbook | None:
        """The playbook of the first ``fake-model`` fence of a system prompt, ``None`` when there is none.
        A line that is not a JSON object raises ``ValueError`` (a broken playbook is a broken test)."""
        match = _FENCE.search(system_text)
        if match is None:
            return None
        tools: list[dict[str, Any]] = []
        answer: dict[str, Any] | None = None
        text: str | None = None
        on_deny: dict[str, Any] | None = None
        as_text = False
        for raw in match.group(1).splitlines():
            line = raw.strip()
            if not line:
                continue
            step = json.loads(line)
            if not isinstance(step, dict):
                raise ValueError(f"fake-model step is not an object: {line!r}")
            if "tool" in step:
                tools.append({"name": str(step["tool"]), "input": step.get("input") or {}})
            elif "answer" in step:
                answer = step["answer"]
            elif "text" in step:
                text = str(step["text"])
            elif "on_deny" in step:
                on_deny = step["on_deny"]
            elif step.get("answer_as") == "text":
                as_text = True
            else:
                raise ValueError(f"unknown fake-model step: {line!r}")
        return cls(tuple(tools), answer, text, on_deny, as_text)


@dataclass(frozen=True, slots=True)
class _Reply:
    """What the fake model says: a text, a tool call, or both (text first)."""

    text: str | None = None
    tool: tuple[str, dict[str, Any]] | None = None


def _substitute(value: Any, item: str) -> Any:
    if isinstance(value, str):
        return value.replace("$ITEM", item)
    if isinstance(value, list):
        return [_substitute(v, item) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, item) for k, v in value.items()}
    return value


def _texts(content: Any) -> Iterator[str]:
    """Every text of a message content (a string, or blocks: text, tool_result contents)."""
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for block in content:
            if isinstance(block, str):
                yield block
            elif isinstance(block, dict):
                if isinstance(block.get("text"), str):
                    yield block["text"]
                if block.get("type") == "tool_result":
                    yield from _texts(block.get("content"))


def _find_item(messages: Sequence[Mapping[str, Any]]) -> str:
    """The item of the brief: ``Item: <name>`` in the first user message (else in any user message), or ``""``."""
    users = [m for m in messages if m.get("role") == "user"]
    for message in users:
        for text in _texts(message.get("content")):
            match = _ITEM.search(text)
            if match:
                return match.group(1)
    return ""


def _refused(block: Mapping[str, Any]) -> bool:
    return bool(block.get("is_error")) and any(_DENIED.search(t) for t in _texts(block.get("content")))


def _not_done(block: Mapping[str, Any]) -> bool:
    return _refused(block) or any(_CUT_OFF.search(t) for t in _texts(block.get("content")))


def _done_steps(messages: Sequence[Mapping[str, Any]]) -> int:
    """The tool steps done: every ``tool_result`` but refused and cut-off ones. A tool that ran and failed (``Exit code
    1``, no such tool) counts as done, as a model would move on; a refused one is asked again when the session
    resumes, and so is one whose session was killed before its result (Claude Code marks it "Tool call
    interrupted")."""
    count = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result" and not _not_done(block):
                    count += 1
    return count


def _last_user_denied(messages: Sequence[Mapping[str, Any]]) -> bool:
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return bool(_DENIED.search(content))
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_result":
                if _refused(block):
                    return True
            elif isinstance(block.get("text"), str) and _DENIED.search(block["text"]):
                return True
        return False
    return False


def _plan(
    system_text: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    forced_tool: str | None,
    structured_tool: str | None,
    json_output: bool,
    tools_allowed: bool = True,
    tool_steps: bool = True,
) -> _Reply:
    """The reply to a request, from the playbook in its system prompt and the conversation so far."""
    playbook = Playbook.parse(system_text)
    if playbook is None and CONTRACT_MARKER not in system_text:
        if json_output:
            return _Reply(text="{}")
        return _Reply(text=SIDE_REPLY)
    playbook = playbook or Playbook()
    item = _find_item(messages)
    answer: dict[str, Any] | None
    if _last_user_denied(messages):
        answer = playbook.on_deny if playbook.on_deny is not None else playbook.answer
    else:
        step = _done_steps(messages)
        if tools_allowed and tool_steps and step < len(playbook.tools):
            tool = playbook.tools[step]
            return _Reply(tool=(tool["name"], _substitute(tool["input"], item)))
        answer = playbook.answer
    if answer is None:
        if playbook.text is not None:
            return _Reply(text=_substitute(playbook.text, item))
        answer = DEFAULT_ANSWER
    answer = _substitute(answer, item)
    if not playbook.answer_as_text:
        tool_name = forced_tool or structured_tool
        if tool_name and tools_allowed:
            return _Reply(tool=(tool_name, answer))
        if json_output:
            return _Reply(text=json.dumps(answer, ensure_ascii=False))
    return _Reply(text="Done.\n" + json.dumps(answer, ensure_ascii=False))


def _tokens(value: Any) -> int:
    """A token count good enough for a fake: the characters of the JSON text over four."""
    if value is None:
        return 0
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    return max(1, len(text) // 4) if text else 0


def _system_text(system: Any) -> str:
    return "\n".join(_texts(system))


def _schema_instance(schema: Any) -> Any:
    """A minimal value of a JSON schema (the side requests of Claude Code that ask for JSON get one)."""
    if not isinstance(schema, dict):
        return {}
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        return {k: _schema_instance(props.get(k)) for k in schema.get("required") or []}
    if kind == "array":
        return []
    if kind == "boolean":
        return False
    if kind in ("integer", "number"):
        return 0
    if kind == "string":
        enum = schema.get("enum")
        return enum[0] if isinstance(enum, list) and enum else ""
    return None


def _chunks(text: str) -> Iterator[str]:
    for i in range(0, len(text), _DELTA_CHARS):
        yield text[i : i + _DELTA_CHARS]


# ------------------------------------------------------------------------------------------------- the server


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ambient-fakeapi/1"
    fake: ClassVar[_FakeServer]

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read ``requests``
        return

    def _read_body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            parts: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(min(length, _MAX_BODY)) if length > 0 else b""

    def _handle(self) -> None:
        raw = self._read_body()
        body: dict[str, Any] | None = None
        if raw:
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = None
            body = parsed if isinstance(parsed, dict) else None
        parts = urlsplit(self.path)
        rec = Recorded(
            path=parts.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            method=self.command,
            query=parts.query,
        )
        self.fake._record(rec)
        if self.fake.delay_s > 0:
            time.sleep(self.fake.delay_s)
        try:
            failure = self.fake._take_failure()
            if failure is not None:
                status, payload, headers = self.fake._error(failure)
                self.send_json(status, payload, headers)
                return
            self.fake._respond(self, rec)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_POST = _handle
    do_GET = _handle
    do_PUT = _handle
    do_DELETE = _handle
    do_PATCH = _handle

    def send_json(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def start_sse(self, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()

    def send_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def end_sse(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class _FakeServer(abc.ABC):
    """The shared machinery: a loopback HTTP server in a daemon thread, the record of requests, injected failures."""

    provider: ClassVar[str] = ""

    def __init__(self, *, port: int = 0, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self._cond = threading.Condition()
        self._requests: list[Recorded] = []
        self._fail_status: int | None = None
        self._fail_times: int | None = None
        self._cache: set[str] = set()
        self._ids = itertools.count(1)
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # -- lifecycle

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"fake-{self.provider}",
                daemon=True,
            )
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> _FakeServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- what tests read and set

    @property
    def requests(self) -> list[Recorded]:
        """Every request received so far (a copy)."""
        with self._cond:
            return list(self._requests)

    def fail(self, status: int | None, times: int | None = None) -> None:
        """The next ``times`` requests (every following one when ``None``) get ``status`` with the provider's error
        JSON. ``fail(None)`` stops failing."""
        with self._cond:
            self._fail_status = status
            self._fail_times = times if status is not None else None

    def wait_for(self, predicate: Callable[[list[Recorded]], bool], timeout: float = 30.0) -> list[Recorded]:
        """Block until ``predicate(requests)`` is true; return the requests then. ``TimeoutError`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(list(self._requests)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"fake {self.provider} API: condition not met within {timeout}s")
                self._cond.wait(left)
            return list(self._requests)

    # -- internals

    def _record(self, rec: Recorded) -> None:
        with self._cond:
            self._requests.append(rec)
            self._cond.notify_all()

    def _take_failure(self) -> int | None:
        with self._cond:
            status = self._fail_status
            if status is None:
                return None
            if self._fail_times is not None:
                self._fail_times -= 1
                if self._fail_times <= 0:
                    self._fail_status = None
                    self._fail_times = None
            return status

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):04d}{uuid.uuid4().hex[:20]}"

    def _cache_lookup(self, prefixes: Sequence[str]) -> tuple[int, int]:
        """Cache accounting for cumulative prefixes (each a breakpoint): ``(read, created)`` tokens. The longest
        prefix seen before is read, the rest up to the last breakpoint is created; every prefix is seen from now."""
        if not prefixes:
            return 0, 0
        keys = [hashlib.sha256(p.encode()).hexdigest() for p in prefixes]
        with self._cond:
            read = 0
            for prefix, key in zip(prefixes, keys, strict=True):
                if key in self._cache:
                    read = _tokens(prefix)
            self._cache.update(keys)
        total = _tokens(prefixes[-1])
        return read, max(0, total - read)

    @abc.abstractmethod
    def _error(self, status: int) -> tuple[int, Any, dict[str, str]]:
        """The provider's error reply for ``status``: (status, JSON body, headers)."""

    @abc.abstractmethod
    def _respond(self, handler: _Handler, rec: Recorded) -> None:
        """Answer one recorded request in the provider's own format."""


# ---------------------------------------------------------------------------------------------------- Anthropic

_ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


class FakeAnthropic(_FakeServer):
    """The Anthropic Messages API: ``POST /v1/messages`` (streaming SSE and not), ``/v1/messages/count_tokens``."""

    provider = "anthropic"

    def __enter__(self) -> FakeAnthropic:
        self.start()
        return self

    def _error(self, status: int) -> tuple[int, Any, dict[str, str]]:
        kind = _ANTHROPIC_ERRORS.get(status, "api_error")
        payload = {"type": "error", "error": {"type": kind, "message": f"fake {kind} ({status})"}}
        headers = {"request-id": self._new_id("req_")}
        if status in (429, 529):
            headers["retry-after-ms"] = "10"
            headers["retry-after"] = "0"
        return status, payload, headers

    def _respond(self, handler: _Handler, rec: Recorded) -> None:
        body = rec.body or {}
        if rec.method == "POST" and rec.path == "/v1/messages/count_tokens":
            handler.send_json(200, {"input_tokens": self._input_tokens(body)})
        elif rec.method == "POST" and rec.path == "/v1/messages":
            if not isinstance(body.get("messages"), list):
                handler.send_json(400, self._invalid("messages: field required"))
                return
            self._messages(handler, body)
        elif rec.method == "GET" and rec.path == "/v1/models":
            handler.send_json(200, {"data": [], "has_more": False, "first_id": None, "last_id": None})
        else:
            handler.send_json(404, {"type": "error", "error": {"type": "not_found_error", "message": rec.path}})

    @staticmethod
    def _invalid(message: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}

    @staticmethod
    def _input_tokens(body: Mapping[str, Any]) -> int:
        return _tokens(body.get("tools")) + _tokens(body.get("system")) + _tokens(body.get("messages"))

    def _usage(self, body: Mapping[str, Any]) -> dict[str, int]:
        """Input tokens split as the API does: uncached input, cache reads and cache writes at ``cache_control``."""
        blocks: list[Any] = []
        tools = body.get("tools")
        if isinstance(tools, list):
            blocks += tools
        system = body.get("system")
        blocks += system if isinstance(system, list) else ([system] if system else [])
        for message in body.get("messages") or []:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):
                blocks += [{"role": message.get("role")}, *content]
            else:
                blocks.append(message)
        prefixes: list[str] = []
        running: list[str] = []
        for block in blocks:
            running.append(json.dumps(block, sort_keys=True, ensure_ascii=False))
            if isinstance(block, dict) and block.get("cache_control"):
                prefixes.append("\n".join(running))
        read, created = self._cache_lookup(prefixes)
        total = self._input_tokens(body)
        return {
            "input_tokens": max(1, total - read - created),
            "cache_creation_input_tokens": created,
            "cache_read_input_tokens": read,
        }

    def _messages(self, handler: _Handler, body: Mapping[str, Any]) -> None:
        tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
        names = {str(t.get("name")) for t in tools}
        choice: dict[str, Any] = body["tool_choice"] if isinstance(body.get("tool_choice"), dict) else {}
        forced = str(choice["name"]) if choice.get("type") == "tool" and choice.get("name") else None
        structured = next((n for n in sorted(names) if n in STRUCTURED_OUTPUT_TOOLS), None)
        out_fmt = body.get("output_format") or (body.get("output_config") or {}).get("format")  # the two spellings
        json_output = isinstance(out_fmt, dict) and out_fmt.get("type") == "json_schema"
        system_text = _system_text(body.get("system"))
        reply = _plan(
            system_text,
            body["messages"],
            forced_tool=forced,
            structured_tool=structured,
            json_output=json_output,
            tools_allowed=choice.get("type") != "none",
        )
        if (
            json_output
            and reply.text in ("{}", SIDE_REPLY)
            and isinstance(out_fmt, dict)
            and CONTRACT_MARKER not in system_text
        ):
            reply = _Reply(text=json.dumps(_schema_instance(out_fmt.get("schema"))))
        content: list[dict[str, Any]] = []
        if reply.text is not None:
            content.append({"type": "text", "text": reply.text})
        if reply.tool is not None:
            name, tool_input = reply.tool
            content.append({"type": "tool_use", "id": self._new_id("toolu_"), "name": name, "input": tool_input})
        stop_reason = "tool_use" if reply.tool is not None else "end_turn"
        usage = self._usage(body)
        output_tokens = _tokens(content)
        model = str(body.get("model") or "claude-fake")
        msg_id = self._new_id("msg_")
        headers = {"request-id": self._new_id("req_"), "anthropic-organization-id": "fake-org"}
        if not body.get("stream"):
            handler.send_json(
                200,
                {
                    "id": msg_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": content,
                    "stop_reason": stop_reason,
                    "stop_sequence": None,
                    "usage": {**usage, "output_tokens": output_tokens},
                },
                headers,
            )
            return
        handler.start_sse(headers)

        def event(kind: str, data: Mapping[str, Any]) -> None:
            handler.send_chunk(f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode())

        start: dict[str, Any] = {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": []}
        start |= {"stop_reason": None, "stop_sequence": None, "usage": {**usage, "output_tokens": 1}}
        event("message_start", {"message": start})
        event("ping", {})
        for index, block in enumerate(content):
            if block["type"] == "text":
                event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})
                for piece in _chunks(block["text"]):
                    event("content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": piece}})
            else:
                start_block = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
                event("content_block_start", {"index": index, "content_block": start_block})
                for piece in _chunks(json.dumps(block["input"], ensure_ascii=False)):
                    delta = {"type": "input_json_delta", "partial_json": piece}
                    event("content_block_delta", {"index": index, "delta": delta})
            event("content_block_stop", {"index": index})
        event(
            "message_delta",
            {"delta": {"stop_reason": stop_reason, "stop_sequence": None}, "usage": {"output_tokens": output_tokens}},
        )
        event("message_stop", {})
        handler.end_sse()


# ------------------------------------------------------------------------------------------------------- OpenAI

_OPENAI_ERRORS = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    503: ("server_error", None),
}


class FakeOpenAI(_FakeServer):
    """The OpenAI Chat Completions API: ``POST /v1/chat/completions`` (streaming SSE and not). No tool steps: the
    playbook's final answer only (as a function call when ``tool_choice`` forces one)."""

    provider = "openai"

    def __enter__(self) -> FakeOpenAI:
        self.start()
        return self

    def _error(self, status: int) -> tuple[int, Any, dict[str, str]]:
        kind, code = _OPENAI_ERRORS.get(status, ("server_error", None))
        payload = {"error": {"message": f"fake {kind} ({status})", "type": kind, "param": None, "code": code}}
        headers = {"x-request-id": self._new_id("req_")}
        if status == 429:
            headers["retry-after-ms"] = "10"
        return status, payload, headers

    def _respond(self, handler: _Handler, rec: Recorded) -> None:
        body = rec.body or {}
        path = rec.path.removeprefix("/v1")
        if rec.method == "POST" and path == "/chat/completions":
            if not isinstance(body.get("messages"), list):
                handler.send_json(400, self._error(400)[1])
                return
            self._complete(handler, body)
        elif rec.method == "GET" and path == "/models":
            handler.send_json(200, {"object": "list", "data": [{"id": "gpt-fake", "object": "model", "owned_by": "x"}]})
        else:
            message = f"Unknown request URL: {rec.method} {rec.path}"
            err = {"message": message, "type": "invalid_request_error", "param": None, "code": "unknown_url"}
            handler.send_json(404, {"error": err})

    def _usage(self, messages: Sequence[Any]) -> dict[str, Any]:
        prefixes = [json.dumps(messages[: i + 1], sort_keys=True, ensure_ascii=False) for i in range(len(messages) - 1)]
        cached = 0
        if prefixes:
            keys = [hashlib.sha256(p.encode()).hexdigest() for p in prefixes]
            with self._cond:
                for prefix, key in zip(prefixes, keys, strict=True):
                    if key in self._cache:
                        cached = _tokens(prefix)
                self._cache.update(keys)
        prompt = _tokens(messages)
        return {"prompt_tokens": prompt, "prompt_tokens_details": {"cached_tokens": min(cached, prompt)}}

    def _complete(self, handler: _Handler, body: Mapping[str, Any]) -> None:
        messages = [m for m in body["messages"] if isinstance(m, dict)]
        system_text = "\n".join(
            t for m in messages if m.get("role") in ("system", "developer") for t in _texts(m.get("content"))
        )
        choice = body.get("tool_choice")
        forced = None
        if isinstance(choice, dict) and choice.get("type") == "function":
            forced = str((choice.get("function") or {}).get("name") or "") or None
        fmt: dict[str, Any] = body["response_format"] if isinstance(body.get("response_format"), dict) else {}
        json_output = fmt.get("type") in ("json_schema", "json_object")
        reply = _plan(
            system_text,
            messages,
            forced_tool=forced,
            structured_tool=None,
            json_output=json_output,
            tool_steps=False,
        )
        usage = self._usage(messages)
        message: dict[str, Any] = {"role": "assistant", "content": reply.text, "refusal": None}
        finish = "stop"
        if reply.tool is not None:
            name, args = reply.tool
            function = {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}
            call = {"id": self._new_id("call_"), "type": "function", "function": function}
            message["tool_calls"] = [call]
            finish = "tool_calls"
        completion = _tokens(reply.text) + (_tokens(reply.tool[1]) if reply.tool else 0)
        usage |= {"completion_tokens": completion, "total_tokens": usage["prompt_tokens"] + completion}
        usage["completion_tokens_details"] = {"reasoning_tokens": 0}
        cid = self._new_id("chatcmpl-")
        model = str(body.get("model") or "gpt-fake")
        created = int(time.time())
        headers = {"x-request-id": self._new_id("req_")}
        if not body.get("stream"):
            handler.send_json(
                200,
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                    "usage": usage,
                    "system_fingerprint": "fp_fake",
                },
                headers,
            )
            return
        handler.start_sse(headers)
        base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}

        def chunk(delta: Mapping[str, Any], finish_reason: str | None = None) -> None:
            data = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
            handler.send_chunk(f"data: {json.dumps(data)}\n\n".encode())

        chunk({"role": "assistant", "content": ""})
        for piece in _chunks(reply.text or ""):
            chunk({"content": piece})
        if reply.tool is not None:
            call = message["tool_calls"][0]
            head = {"index": 0, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"]}}
            head["function"]["arguments"] = ""
            chunk({"tool_calls": [head]})
            for piece in _chunks(call["function"]["arguments"]):
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
        chunk({}, finish)
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            handler.send_chunk(f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n".encode())
        handler.send_chunk(b"data: [DONE]\n\n")
        handler.end_sse()


# ------------------------------------------------------------------------------------------------------ the CLI


def main(argv: Sequence[str] | None = None) -> int:
    """Serve a fake API until SIGTERM/SIGINT, printing its URL (and writing its port to ``--port-file``)."""
    parser = argparse.ArgumentParser(prog="python -m ambient.testing.fakeapi", description=__doc__.splitlines()[0])
    parser.add_argument("provider", choices=["anthropic", "openai"])
    parser.add_argument("--port", type=int, default=0, help="the port (default: a free one)")
    parser.add_argument("--port-file", type=Path, help="write the port number there once listening")
    parser.add_argument("--delay-s", type=float, default=0.0, help="sleep before each reply")
    args = parser.parse_args(argv)
    cls: type[_FakeServer] = FakeAnthropic if args.provider == "anthropic" else FakeOpenAI
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    api = cls(port=args.port, delay_s=args.delay_s)
    with api:
        if args.port_file is not None:
            tmp = args.port_file.with_name(args.port_file.name + ".tmp")
            tmp.write_text(f"{api.port}\n")
            tmp.replace(args.port_file)
        sys.stdout.write(api.url + "\n")
        sys.stdout.flush()
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
