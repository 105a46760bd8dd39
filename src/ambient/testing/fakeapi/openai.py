"""The fake OpenAI Chat Completions API: ``POST /v1/chat/completions`` (streaming SSE and not) and ``GET /v1/models``,
with the API's error bodies and its cached-prompt usage."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .playbook import plan, texts
from .server import Billed, FakeServer, Handler, Recorded, chunks, tokens

_OPENAI_ERRORS = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    503: ("server_error", None),
}


class FakeOpenAI(FakeServer):
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

    def _respond(self, handler: Handler, rec: Recorded) -> None:
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
                        cached = tokens(prefix)
                self._cache.update(keys)
        prompt = tokens(messages)
        return {"prompt_tokens": prompt, "prompt_tokens_details": {"cached_tokens": min(cached, prompt)}}

    def _complete(self, handler: Handler, body: Mapping[str, Any]) -> None:
        messages = [m for m in body["messages"] if isinstance(m, dict)]
        system_text = "\n".join(
            t for m in messages if m.get("role") in ("system", "developer") for t in texts(m.get("content"))
        )
        choice = body.get("tool_choice")
        forced = None
        if isinstance(choice, dict) and choice.get("type") == "function":
            forced = str((choice.get("function") or {}).get("name") or "") or None
        fmt: dict[str, Any] = body["response_format"] if isinstance(body.get("response_format"), dict) else {}
        json_output = fmt.get("type") in ("json_schema", "json_object")
        reply = plan(
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
        completion = tokens(reply.text) + (tokens(reply.tool[1]) if reply.tool else 0)
        usage |= {"completion_tokens": completion, "total_tokens": usage["prompt_tokens"] + completion}
        usage["completion_tokens_details"] = {"reasoning_tokens": 0}
        cid = self._new_id("chatcmpl-")
        model = str(body.get("model") or "gpt-fake")
        created = int(time.time())
        headers = {"x-request-id": self._new_id("req_")}
        self._bill(Billed(cid, model, dict(usage), bool(body.get("stream")), "/chat/completions"))
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
        for piece in chunks(reply.text or ""):
            chunk({"content": piece})
        if reply.tool is not None:
            call = message["tool_calls"][0]
            head = {"index": 0, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"]}}
            head["function"]["arguments"] = ""
            chunk({"tool_calls": [head]})
            for piece in chunks(call["function"]["arguments"]):
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
        chunk({}, finish)
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            handler.send_chunk(f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n".encode())
        handler.send_chunk(b"data: [DONE]\n\n")
        handler.end_sse()
