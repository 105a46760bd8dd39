"""The agent protocol: what an agent may answer, and the :class:`AgentResult` each answer becomes. Pure.

Every agent answers with one JSON object, whatever runs it: a command agent prints it on stdout, a callable returns
it, a closed claim's ``result`` carries it, an AI agent ends its reply with it. :func:`interpret_output` holds that
object to the protocol: a signal object (``RETURN`` / ``ESCALATE`` / ``ERROR`` / ``BLOCKED_ON``) or a plain result
mapping, bounded in depth and string sizes, never in someone else's name (S-05).

An AI agent's reply is prose more than JSON, so :func:`final_answer` finds the object first: the structured output
(a JSON schema the runner asked for), else the last JSON object in the final text (a model often writes prose then
the object), else the plain text itself. A plain-text answer is a RETURN with ``{"status": "ok", "text": <the
text>}``: the agent finished and said so in words, which a chain's next step or the person can read; an empty answer
is an ERROR (``bad_output``), since nothing says the work was done. Whatever the form, :func:`interpret_output`
decides, so a model's answer is held to the same rules as a command agent's JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ambient.runners.result import AgentResult, AgentStatus, ResultStatus, error_result

#: Largest string anywhere in an agent's JSON output (same bound as the router's packets, RELIABILITY §2.5).
MAX_OUTPUT_STRING_CHARS = 65_536
#: Deepest nesting accepted in an agent's JSON output.
MAX_OUTPUT_DEPTH = 64


# ---------------------------------------------------------------------------------------------------------------
# Any agent's JSON answer


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    sender_from: str | None = Field(default=None, alias="from")
    sender: str | None = None


class _ReturnAnswer(_Answer):
    signal: Literal["RETURN"]
    result: dict[str, Any]


class _EscalateAnswer(_Answer):
    signal: Literal["ESCALATE"]
    options: list[Annotated[str, Field(min_length=1, max_length=500)]] = Field(min_length=1, max_length=20)
    question: str | None = Field(default=None, max_length=4000)


class _ErrorAnswer(_Answer):
    signal: Literal["ERROR"]
    context: dict[str, Any] = Field(default_factory=dict)


class _BlockedAnswer(_Answer):
    signal: Literal["BLOCKED_ON"]
    context: dict[str, Any] = Field(default_factory=dict)


_ANSWER: TypeAdapter[_ReturnAnswer | _EscalateAnswer | _ErrorAnswer | _BlockedAnswer] = TypeAdapter(
    Annotated[_ReturnAnswer | _EscalateAnswer | _ErrorAnswer | _BlockedAnswer, Field(discriminator="signal")]
)
_ALLOWED_KEYS = {
    "RETURN": "signal, result, from, sender",
    "ESCALATE": "signal, options, question, from, sender",
    "ERROR": "signal, context, from, sender",
    "BLOCKED_ON": "signal, context, from, sender",
}
#: ``status`` values of a result mapping → (agent status, normalised result status).
_STATUS_WORDS: dict[str, tuple[AgentStatus, ResultStatus | None]] = {
    "ok": ("success", "ok"),
    "success": ("success", "ok"),
    "partial": ("success", "partial"),
    "failed": ("fail", "failed"),
    "fail": ("fail", "failed"),
    "error": ("error", None),
}


def check_json_limits(
    obj: object, *, max_depth: int = MAX_OUTPUT_DEPTH, max_str: int = MAX_OUTPUT_STRING_CHARS
) -> str | None:
    """The first reason ``obj`` is too deep or holds too long a string (keys included), or None."""
    stack: list[tuple[object, int, str]] = [(obj, 0, "")]
    while stack:
        node, depth, path = stack.pop()
        if depth > max_depth:
            return f"{path or '(top)'}: nested deeper than {max_depth} levels"
        if isinstance(node, str):
            if len(node) > max_str:
                return f"{path or '(top)'}: string of {len(node)} characters is over the limit of {max_str}"
        elif isinstance(node, dict):
            for key, value in node.items():
                if isinstance(key, str) and len(key) > max_str:
                    return f"{path or '(top)'}: key of {len(key)} characters is over the limit of {max_str}"
                stack.append((value, depth + 1, f"{path}.{key}" if path else str(key)))
        elif isinstance(node, list):
            for index, value in enumerate(node):
                stack.append((value, depth + 1, f"{path}[{index}]"))
    return None


def _describe(exc: ValidationError, signal: str | None) -> str:
    parts: list[str] = []
    for err in exc.errors(include_url=False)[:3]:
        loc = [str(p) for p in err["loc"] if isinstance(p, str | int)]
        if loc and loc[0] == signal:
            loc = loc[1:]
        where = ".".join(loc)
        if err["type"] == "union_tag_invalid":
            parts.append(
                f"signal {signal!r} is not one an agent may answer with; expected RETURN, ESCALATE, ERROR or BLOCKED_ON"
            )
        elif err["type"] == "extra_forbidden" and signal in _ALLOWED_KEYS:
            parts.append(f"{where}: key not allowed in a {signal} answer (allowed: {_ALLOWED_KEYS[signal]})")
        else:
            parts.append(f"{where or '(answer)'}: {err['msg']}")
    return "; ".join(parts)


def interpret_output(obj: object, *, agent: str) -> AgentResult:
    """Map an agent's JSON answer onto an :class:`AgentResult` (the agent protocol, exit code 0).

    Accepted: ``None`` (no output: success, empty result); a signal object ``{"signal": "RETURN"|"ESCALATE"|
    "ERROR"|"BLOCKED_ON", ...}``; or a plain result mapping (no ``signal`` key) with an optional ``status``.
    Identity comes from the channel, never from the answer: a ``from``/``sender`` naming anyone but ``agent``
    is rejected (S-05).
    """
    if obj is None:
        return AgentResult(status="success", result={}, result_status="ok")
    if not isinstance(obj, dict):
        return error_result("bad_output", f"agent answer must be a JSON object, got {type(obj).__name__}")
    limit = check_json_limits(obj)
    if limit is not None:
        return error_result("bad_output", f"agent answer rejected: {limit}", output=None)
    for key in ("from", "sender"):
        claimed = obj.get(key)
        if claimed is not None and claimed != agent:
            return error_result(
                "sender_mismatch",
                f"agent answer claims {key}={str(claimed)[:80]!r} but came from the channel of agent {agent!r}",
                output=obj,
            )
    if "signal" not in obj:
        result = {k: v for k, v in obj.items() if k not in ("from", "sender")}
        return _from_result(result, output=obj)
    signal = obj.get("signal")
    try:
        answer = _ANSWER.validate_python(obj)
    except ValidationError as exc:
        why = _describe(exc, signal if isinstance(signal, str) else None)
        return error_result("bad_output", f"agent answer rejected: {why}", output=obj)
    if isinstance(answer, _ReturnAnswer):
        return _from_result(dict(answer.result), output=obj)
    if isinstance(answer, _EscalateAnswer):
        return AgentResult(status="escalate", output=obj, options=list(answer.options), question=answer.question)
    if isinstance(answer, _ErrorAnswer):
        context = dict(answer.context)
        return AgentResult(
            status="error", output=obj, context=context, reason="agent_error", error=stated_error(context)
        )
    return AgentResult(status="blocked", output=obj, context=dict(answer.context))


def _from_result(result: dict[str, Any], *, output: dict[str, Any]) -> AgentResult:
    word = result.get("status", "ok")
    if not isinstance(word, str) or word not in _STATUS_WORDS:
        expected = "ok, partial, failed (or success, fail, error)"
        return error_result("bad_output", f"result.status {str(word)[:40]!r} is not one of {expected}", output=output)
    status, result_status = _STATUS_WORDS[word]
    if status == "error":
        message = stated_error(result)
        return AgentResult(status="error", output=output, context=result, reason="agent_error", error=message)
    if status == "fail":
        return AgentResult(
            status="fail",
            output=output,
            result=result,
            result_status=result_status,
            reason="agent_failed",
            error=stated_error(result) or "agent reported status failed",
        )
    return AgentResult(status="success", output=output, result=result, result_status=result_status)


def stated_error(context: Mapping[str, Any]) -> str | None:
    """The agent's own words about what went wrong: its ``error``, ``message``, ``reason`` or ``detail``."""
    for key in ("error", "message", "reason", "detail"):
        value = context.get(key)
        if isinstance(value, str) and value:
            return value[:500]
    return None


# ---------------------------------------------------------------------------------------------------------------
# An AI agent's reply: find the JSON answer in it

#: A plain-text answer is kept up to this many characters in its RETURN.
MAX_TEXT_CHARS = 16_000


def final_answer(structured: Any, text: str | None, *, agent: str) -> AgentResult:
    """The agent's answer as an :class:`AgentResult` (see the module docstring for the order)."""
    if isinstance(structured, dict) and structured:
        return interpret_output(structured, agent=agent)
    found = last_json_object(text or "")
    if found is not None:
        return interpret_output(found, agent=agent)
    words = (text or "").strip()
    if not words:
        return error_result("bad_output", f"{agent} ended without an answer (no text, no JSON)")
    return interpret_output({"status": "ok", "text": words[:MAX_TEXT_CHARS]}, agent=agent)


def last_json_object(text: str) -> dict[str, Any] | None:
    """The last top-level JSON object in ``text`` (fenced or bare), or None.

    Scans from each ``{`` with a real JSON decoder, so braces inside strings are handled; linear in practice, since a
    decoded object is skipped whole.
    """
    decoder = json.JSONDecoder()
    found: dict[str, Any] | None = None
    index = text.find("{")
    while index != -1:
        try:
            obj, end = decoder.raw_decode(text, index)
        except ValueError:
            index = text.find("{", index + 1)
            continue
        if isinstance(obj, dict):
            found = obj
        index = text.find("{", end)
    return found
