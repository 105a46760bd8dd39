"""The fake Anthropic Messages API: ``POST /v1/messages`` (streaming SSE and not), ``/v1/messages/count_tokens``,
``GET /v1/models``, with the API's error bodies and its prompt-cache usage split."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .playbook import CONTRACT_MARKER, SIDE_REPLY, Reply, plan, texts
from .server import Billed, FakeServer, Handler, Recorded, chunks, tokens

#: Tools through which a client asks for a structured answer (Claude Code's ``output_format`` offers this one).
STRUCTURED_OUTPUT_TOOLS = frozenset({"StructuredOutput"})

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


def _system_text(system: Any) -> str:
    return "\n".join(texts(system))


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


class FakeAnthropic(FakeServer):
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

    def _respond(self, handler: Handler, rec: Recorded) -> None:
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
        return tokens(body.get("tools")) + tokens(body.get("system")) + tokens(body.get("messages"))

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

    def _messages(self, handler: Handler, body: Mapping[str, Any]) -> None:
        tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
        names = {str(t.get("name")) for t in tools}
        choice: dict[str, Any] = body["tool_choice"] if isinstance(body.get("tool_choice"), dict) else {}
        forced = str(choice["name"]) if choice.get("type") == "tool" and choice.get("name") else None
        structured = next((n for n in sorted(names) if n in STRUCTURED_OUTPUT_TOOLS), None)
        out_fmt = body.get("output_format") or (body.get("output_config") or {}).get("format")  # the two spellings
        json_output = isinstance(out_fmt, dict) and out_fmt.get("type") == "json_schema"
        system_text = _system_text(body.get("system"))
        reply = plan(
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
            reply = Reply(text=json.dumps(_schema_instance(out_fmt.get("schema"))))
        content: list[dict[str, Any]] = []
        if reply.text is not None:
            content.append({"type": "text", "text": reply.text})
        if reply.tool is not None:
            name, tool_input = reply.tool
            content.append({"type": "tool_use", "id": self._new_id("toolu_"), "name": name, "input": tool_input})
        stop_reason = "tool_use" if reply.tool is not None else "end_turn"
        usage = self._usage(body)
        output_tokens = tokens(content)
        model = str(body.get("model") or "claude-fake")
        msg_id = self._new_id("msg_")
        headers = {"request-id": self._new_id("req_"), "anthropic-organization-id": "fake-org"}
        billed = {**usage, "output_tokens": output_tokens}
        self._bill(Billed(msg_id, model, billed, bool(body.get("stream")), "/v1/messages"))
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
                for piece in chunks(block["text"]):
                    event("content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": piece}})
            else:
                start_block = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
                event("content_block_start", {"index": index, "content_block": start_block})
                for piece in chunks(json.dumps(block["input"], ensure_ascii=False)):
                    delta = {"type": "input_json_delta", "partial_json": piece}
                    event("content_block_delta", {"index": index, "delta": delta})
            event("content_block_stop", {"index": index})
        event(
            "message_delta",
            {"delta": {"stop_reason": stop_reason, "stop_sequence": None}, "usage": {"output_tokens": output_tokens}},
        )
        event("message_stop", {})
        handler.end_sse()
