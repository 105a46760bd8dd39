"""The playbook: what the fake model says, scripted in the agent's system prompt.

Pure (no I/O), so both providers behave alike: :mod:`.anthropic` and :mod:`.openai` call :func:`plan` and shape its
:class:`Reply` in their own format. The playbook is a fenced block in the system prompt, one JSON object a line::

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
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: The heading of ambient's answer contract: a system prompt carrying it is an agent's conversation.
CONTRACT_MARKER = "## How to answer (ambient)"
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
class Reply:
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


def texts(content: Any) -> Iterator[str]:
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
                    yield from texts(block.get("content"))


def _find_item(messages: Sequence[Mapping[str, Any]]) -> str:
    """The item of the brief: ``Item: <name>`` in the first user message (else in any user message), or ``""``."""
    users = [m for m in messages if m.get("role") == "user"]
    for message in users:
        for text in texts(message.get("content")):
            match = _ITEM.search(text)
            if match:
                return match.group(1)
    return ""


def _refused(block: Mapping[str, Any]) -> bool:
    return bool(block.get("is_error")) and any(_DENIED.search(t) for t in texts(block.get("content")))


def _not_done(block: Mapping[str, Any]) -> bool:
    return _refused(block) or any(_CUT_OFF.search(t) for t in texts(block.get("content")))


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


def plan(
    system_text: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    forced_tool: str | None,
    structured_tool: str | None,
    json_output: bool,
    tools_allowed: bool = True,
    tool_steps: bool = True,
) -> Reply:
    """The reply to a request, from the playbook in its system prompt and the conversation so far."""
    playbook = Playbook.parse(system_text)
    if playbook is None and CONTRACT_MARKER not in system_text:
        if json_output:
            return Reply(text="{}")
        return Reply(text=SIDE_REPLY)
    playbook = playbook or Playbook()
    item = _find_item(messages)
    answer: dict[str, Any] | None
    if _last_user_denied(messages):
        answer = playbook.on_deny if playbook.on_deny is not None else playbook.answer
    else:
        step = _done_steps(messages)
        if tools_allowed and tool_steps and step < len(playbook.tools):
            tool = playbook.tools[step]
            return Reply(tool=(tool["name"], _substitute(tool["input"], item)))
        answer = playbook.answer
    if answer is None:
        if playbook.text is not None:
            return Reply(text=_substitute(playbook.text, item))
        answer = DEFAULT_ANSWER
    answer = _substitute(answer, item)
    if not playbook.answer_as_text:
        tool_name = forced_tool or structured_tool
        if tool_name and tools_allowed:
            return Reply(tool=(tool_name, answer))
        if json_output:
            return Reply(text=json.dumps(answer, ensure_ascii=False))
    return Reply(text="Done.\n" + json.dumps(answer, ensure_ascii=False))
