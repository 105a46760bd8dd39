"""What an AI agent is told: its prompt file, the answer contract, and the brief a SPAWN becomes.

Pure except :func:`read_agent_prompt`. The system prompt is the agent's markdown body followed by the contract: a
stable prefix, byte-identical for every item of a fan-out over one agent, so a provider's prompt cache serves it
(the item's brief, which changes, is the user message). The brief is plain text a model reads well: the workflow,
the item, the scope, ``payload.context`` as JSON, the handoff (bounded), and what to answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ambient.runners.base import MAX_HANDOFF_CHARS, RunRequest
from ambient.runners.result import Resumed

#: Largest agent prompt file read (the same bound as an agent's frontmatter file).
MAX_PROMPT_BYTES = 256 * 1024
#: ``payload.context`` is shown as JSON up to this many characters; the rest is cut with a note.
MAX_CONTEXT_CHARS = 16_000

CONTRACT = """\
## How to answer (ambient)

You are run by ambient as one step of a workflow. When you are done, end with exactly one JSON object, the last thing
in your answer, in one of these forms:

- done: {"signal": "RETURN", "result": {"status": "ok", ...what you produced...}}
  ("status" may be "ok", "partial" or "failed"; add any keys the workflow needs)
- a decision only the person can take: {"signal": "ESCALATE", "question": "...", "options": ["...", "..."]}
- waiting on something outside your reach: {"signal": "BLOCKED_ON", "context": {"missing": "..."}}
- you cannot do it at all: {"signal": "ERROR", "context": {"error": "..."}}

Write files only inside the scope you are given. When the person answers a question of yours, you are run again with
their answer in the context under "decision".
"""

#: The JSON schema of an answer (structured output): the same four forms as :data:`CONTRACT`.
ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "signal": {"type": "string", "enum": ["RETURN", "ESCALATE", "BLOCKED_ON", "ERROR"]},
        "result": {"type": "object"},
        "question": {"type": "string"},
        "options": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 20},
        "context": {"type": "object"},
    },
    "required": ["signal"],
}


@dataclass(frozen=True, slots=True)
class AgentPrompt:
    """An agent file as an AI runner reads it: the markdown body, and the frontmatter's ``model:`` and ``tools:``
    (Claude Code's subagent format: a list, or a comma-separated string)."""

    body: str
    model: str | None = None
    tools: tuple[str, ...] | None = None


def agent_prompt(frontmatter: Mapping[str, Any], body: str) -> AgentPrompt:
    """The prompt of an agent from its parsed frontmatter and body (``model: inherit`` means no model of its own)."""
    model = frontmatter.get("model")
    tools_raw = frontmatter.get("tools")
    tools: tuple[str, ...] | None = None
    if isinstance(tools_raw, str):
        tools = tuple(t.strip() for t in tools_raw.split(",") if t.strip())
    elif isinstance(tools_raw, list):
        tools = tuple(str(t).strip() for t in tools_raw if str(t).strip())
    return AgentPrompt(
        body=body.strip(),
        model=model.strip() if isinstance(model, str) and model.strip() and model.strip() != "inherit" else None,
        tools=tools,
    )


def read_agent_prompt(path: Path) -> AgentPrompt:
    """Read ``agents/<name>.md`` now (an edit is picked up by the next item). Raises ``InputError``/``OSError``."""
    from ambient.storage.fsutil import read_capped
    from ambient.storage.yamlfile import parse_yaml, split_frontmatter

    source = path.name
    text = read_capped(path, MAX_PROMPT_BYTES).decode("utf-8", "replace")
    yaml_text, offset, body = split_frontmatter(text, source=source)
    data, _lines = parse_yaml(yaml_text, source=source, line_offset=offset)
    return agent_prompt(data if isinstance(data, dict) else {}, body)


def system_prompt(prompt: AgentPrompt) -> str:
    """The agent's body then the contract: the stable, cacheable prefix of every request for this agent."""
    body = prompt.body or "You are an agent of this brain."
    return f"{body}\n\n{CONTRACT}"


def resume_note(resumed: Resumed | None) -> str:
    """What a resumed session is told of why it runs again, exactly as the run journal says it happened: the
    person's answer (with the question), a retry after an error (which), or a stop of ambient. Told it was
    interrupted when it was not, a real model may redo its work."""
    if resumed is None:
        return "You are resumed in your earlier session; continue the task where you left off."
    if resumed.why == "answered":
        asked = f' You asked: "{_one_line(resumed.question)}".' if resumed.question else ""
        answer = _one_line(resumed.answer) if resumed.answer else "(no words)"
        return (
            f"You are resumed because the person answered your question.{asked} They answered: {answer}. "
            "Go on from where you asked, with their answer."
        )
    if resumed.why == "retry":
        error = _one_line(resumed.error) if resumed.error else "no detail"
        return (
            f"You are resumed for a retry: your previous attempt did not succeed ({error}). Check what you "
            "already did, then finish the task."
        )
    if resumed.crash:
        return (
            "You are resumed after ambient stopped unexpectedly (a crash or a kill) while you worked: a tool call "
            "in progress may or may not have run. Check, then continue the task where you left off."
        )
    return "You are resumed after ambient was stopped or restarted while you worked; continue where you left off."


def _one_line(text: str | None, limit: int = 500) -> str:
    """A question or an error on one line, bounded: a note is one paragraph of the brief."""
    flat = " ".join((text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def render_brief(req: RunRequest, *, note: str | None = None) -> str:
    """The user message of a SPAWN: what this item is, in a model's reading order. Same request, same bytes."""
    packet = req.packet
    payload = packet.get("payload") or {}
    context = dict(payload.get("context") or {})
    scope = packet.get("scope") or {}
    files: Sequence[str] = scope.get("files") or []
    zone = scope.get("zone")
    workflow = req.vars.get("workflow")
    # A constant first line longer than 20 characters: Claude Code's first system block (a billing header) hashes
    # characters of the first ~20 of the first user message, so the cacheable prefix stays one for every item
    # (bench/README, AI agents).
    lines = ["# Your task, given by ambient"]
    if workflow:
        lines.append(f"Workflow: {workflow}")
    lines.append(f"Item: {req.item}")
    lines.append(f"Attempt: {req.attempt}")
    if files:
        lines.append("Scope (the only files you may write): " + ", ".join(files))
    else:
        lines.append("Scope: no files; write nothing")
    if zone:
        lines.append(f"Zone: {zone}")
    decision = context.pop("decision", None)
    if context:
        text = json.dumps(context, ensure_ascii=False, indent=2, sort_keys=True, default=str)
        if len(text) > MAX_CONTEXT_CHARS:
            text = text[:MAX_CONTEXT_CHARS] + "\n... (cut)"
        lines += ["", "## Context", text]
    if decision is not None:
        lines += ["", "## The person's answer to your question", str(decision)]
    if note:
        lines += ["", "## Note from ambient", note]
    handoff = req.handoff
    if handoff:
        lines += ["", "## Handoff (what came before)", handoff[:MAX_HANDOFF_CHARS]]
    lines += ["", "End with the JSON answer described in your instructions."]
    return "\n".join(lines) + "\n"
