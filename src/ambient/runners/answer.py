"""An AI agent's final answer onto the agent protocol (RETURN / ESCALATE / BLOCKED_ON / ERROR). Pure.

In order: the structured output (a JSON schema the runner asked for), else the last JSON object in the final text
(a model often writes prose then the object), else the plain text itself. A plain-text answer is a RETURN with
``{"status": "ok", "text": <the text>}``: the agent finished and said so in words, which a chain's next step or the
person can read; an empty answer is an ERROR (``bad_output``), since nothing says the work was done. Whatever the
form, :func:`ambient.runners.base.interpret_output` decides, so a model's answer is held to the same rules as a
command agent's JSON (sizes, depth, ``from`` naming someone else).
"""

from __future__ import annotations

import json
from typing import Any

from ambient.runners.base import AgentResult, error_result, interpret_output

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
