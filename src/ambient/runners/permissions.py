"""Tool permissions of an AI agent: the access matrix, inside the agent. Pure.

Every tool call a Claude agent makes is put to :func:`check_tool` (through Claude Code's ``can_use_tool``):

- **writes** (Write, Edit, MultiEdit, NotebookEdit) land only inside the SPAWN's scope (the files the router checked
  against the agent's zones and locked for it); anything else is denied at once, without asking anyone, and recorded;
- **reads** (Read, Glob, Grep, LS, NotebookRead) stay inside the brain; leaving it is denied;
- neither ever touches what is the daemon's or the person's alone: ``.ambient/`` and the secrets of ``profil/``
  (the rule of :mod:`ambient.runners.confinement`);
- **Bash** runs without asking only what ``allowed_tools`` lets through (``Bash`` for any command, ``Bash(pytest:*)``
  for a command starting with the word ``pytest``, ``Bash(make test)`` for that command exactly) and only when the
  command is one simple command: a ``;``, ``&``, ``|``, redirection, substitution or newline makes it a question for
  the person whatever it starts with (``pytest; rm -rf ~`` is not ``pytest``);
- any other tool (WebFetch, WebSearch, MCP tools…) runs when ``allowed_tools`` names it, else it is a question;
- a question becomes an escalation: "coder wants to run `rm -rf build/` in projets/feature", answered
  ``allow`` (this call), ``allow always`` (this exact call, for this agent, from now on) or ``deny``. What the person
  allowed is a *grant*: its :func:`signature`, matched exactly.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from ambient.runners.confinement import secret_name
from ambient.storage.paths import STATE_DIRNAME

#: The answers a permission question offers, in this order.
ALLOW = "allow"
ALLOW_ALWAYS = "allow always"
DENY = "deny"
OPTIONS = (ALLOW, ALLOW_ALWAYS, DENY)
#: What the agent reads when the person said no (the model decides what to do next).
DENIED_BY_PERSON = "The person denied this tool call. Do not try it again; go on without it or end with your answer."

WRITE_TOOLS: dict[str, str] = {"Write": "file_path", "Edit": "file_path", "MultiEdit": "file_path"}
WRITE_TOOLS["NotebookEdit"] = "notebook_path"
READ_TOOLS: dict[str, str] = {"Read": "file_path", "NotebookRead": "notebook_path", "Glob": "path", "Grep": "path"}
READ_TOOLS["LS"] = "path"
#: Tools with no effect outside the agent's own session: never a question.
#: ``StructuredOutput`` is how Claude Code hands back the answer ambient asked for (``output_format``).
HARMLESS = frozenset(
    {"TodoWrite", "ExitPlanMode", "Task", "Agent", "BashOutput", "KillShell", "KillBash", "StructuredOutput"}
)
#: Longest signature kept (a grant, a learned rule's situation).
MAX_SIGNATURE = 500
_SHELL_SYNTAX = re.compile(r"[;&|<>`\n\r]|\$\(|\$\{")
_TOOL_RULE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?:\((?P<arg>.*)\))?$", re.S)

Action = Literal["allow", "deny", "ask"]


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool call is judged against: the agent, where it works, its scope, its allowlist, its grants."""

    agent: str
    brain: Path
    workdir: Path
    scope: tuple[str, ...] = ()
    allowed: tuple[str, ...] = ()
    granted: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Verdict:
    """``allow``, ``deny`` (``reason`` is what the agent is told) or ``ask`` (``question`` for the person)."""

    action: Action
    reason: str = ""
    signature: str = ""
    question: str = ""


def signature(tool: str, tool_input: Mapping[str, Any]) -> str:
    """The exact identity of a tool call, as grants and learned rules match it: ``Bash: pytest -q``."""
    if tool == "Bash":
        text = str(tool_input.get("command", ""))
    elif tool in ("WebFetch",):
        text = str(tool_input.get("url", ""))
    elif tool in ("WebSearch",):
        text = str(tool_input.get("query", ""))
    else:
        text = json.dumps(dict(tool_input), sort_keys=True, ensure_ascii=False, default=str)
    return f"{tool}: {text}"[:MAX_SIGNATURE]


def normal_path(path: str, base: Path) -> Path:
    """``path`` made absolute against ``base`` and normalised, without touching the disk (``..`` folded). A ``~``
    path is someone's home, never the brain: it is kept outside of it (``/~/...``)."""
    if path.startswith("~"):
        return Path(os.path.normpath("/" + path))
    return Path(os.path.normpath(base / path))


def private_reason(rel: PurePosixPath) -> str | None:
    """Why a brain-relative path is never an agent's (``.ambient/``, ``profil/`` secrets), or None."""
    parts = rel.parts
    if parts and parts[0] == STATE_DIRNAME:
        return f"{STATE_DIRNAME}/ is the daemon's state"
    if len(parts) >= 2 and parts[0] == "profil" and secret_name(parts[1]):
        return f"profil/{parts[1]} holds the person's settings or secrets"
    return None


def in_scope(rel: PurePosixPath, scope: Iterable[str]) -> bool:
    """Whether a brain-relative path is one of the scope's files or under one of its folders."""
    for entry in scope:
        s = PurePosixPath(entry.strip("/"))
        if rel == s or s in rel.parents:
            return True
    return False


def _tool_rules(allowed: Iterable[str]) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for rule in allowed:
        m = _TOOL_RULE.match(rule.strip())
        if m is not None:
            out.append((m.group("name"), m.group("arg")))
    return out


def bash_allowed(command: str, allowed: Iterable[str]) -> bool:
    """Whether ``allowed_tools`` lets this command run without asking (see the module docstring)."""
    cmd = command.strip()
    simple = _SHELL_SYNTAX.search(cmd) is None
    for name, arg in _tool_rules(allowed):
        if name != "Bash":
            continue
        if arg is None or arg in ("*", ":*"):
            return True  # the person allows any command to this agent
        if not simple:
            continue
        if arg.endswith(":*"):
            prefix = arg[:-2].strip()
            if prefix and (cmd == prefix or cmd.startswith(prefix + " ")):
                return True
        elif cmd == arg.strip():
            return True
    return False


def check_tool(
    tool: str,
    tool_input: Mapping[str, Any],
    ctx: ToolContext,
    *,
    resolve: Callable[[str, Path], Path] = normal_path,
) -> Verdict:
    """The verdict on one tool call. ``resolve`` turns a path of the input into an absolute one (the runner passes
    one that follows symlinks; the default folds ``..`` only)."""
    sig = signature(tool, tool_input)
    if tool in WRITE_TOOLS:
        return _check_path(tool, tool_input.get(WRITE_TOOLS[tool]), ctx, resolve, write=True)
    if tool in READ_TOOLS:
        return _check_path(tool, tool_input.get(READ_TOOLS[tool]), ctx, resolve, write=False)
    if tool in HARMLESS:
        return Verdict("allow", signature=sig)
    if tool == "AskUserQuestion":
        return Verdict(
            "deny",
            "Ask the person through your final answer instead: "
            '{"signal": "ESCALATE", "question": "...", "options": [...]}.',
            signature=sig,
        )
    if sig in ctx.granted:
        return Verdict("allow", signature=sig)
    if tool == "Bash":
        command = str(tool_input.get("command", ""))
        if bash_allowed(command, ctx.allowed):
            return Verdict("allow", signature=sig)
        where = _rel_or_abs(ctx.workdir, ctx.brain)
        return Verdict("ask", signature=sig, question=f"{ctx.agent} wants to run `{_short(command)}` in {where}")
    if any(name == tool and arg is None for name, arg in _tool_rules(ctx.allowed)):
        return Verdict("allow", signature=sig)
    what = sig.split(": ", 1)[1] if ": " in sig else ""
    return Verdict("ask", signature=sig, question=f"{ctx.agent} wants to use {tool}: {_short(what)}")


def _check_path(tool: str, raw: Any, ctx: ToolContext, resolve: Callable[[str, Path], Path], *, write: bool) -> Verdict:
    sig = signature(tool, {"path": raw} if raw is not None else {})
    if raw is None or raw == "":
        if write:
            return Verdict("deny", f"ambient denied {tool}: no path given", signature=sig)
        target = ctx.workdir  # Glob/Grep/LS without a path search the working folder
    elif not isinstance(raw, str):
        return Verdict("deny", f"ambient denied {tool}: the path is not text", signature=sig)
    else:
        target = resolve(raw, ctx.workdir)
    brain = ctx.brain
    if target != brain and brain not in target.parents:
        verb = "writes" if write else "reads"
        return Verdict("deny", f"ambient denied {tool}: {raw} is outside the brain ({verb} stay inside it)", sig)
    rel = PurePosixPath(target.relative_to(brain).as_posix())
    private = private_reason(rel)
    if private is not None:
        return Verdict("deny", f"ambient denied {tool}: {rel} is off limits ({private})", signature=sig)
    if write and not in_scope(rel, ctx.scope):
        scope = ", ".join(ctx.scope) or "nothing"
        return Verdict("deny", f"ambient denied {tool}: {rel} is outside this item's scope ({scope})", signature=sig)
    return Verdict("allow", signature=sig)


def _rel_or_abs(path: Path, brain: Path) -> str:
    if path == brain:
        return "the brain's root"
    return path.relative_to(brain).as_posix() if brain in path.parents else str(path)


def _short(text: str, limit: int = 300) -> str:
    one = " ".join(text.split())
    return one if len(one) <= limit else one[: limit - 1] + "…"


Answer = Literal["once", "always", "deny"]


def answer_of(decision: str) -> Answer:
    """The person's option, as proposed in :data:`OPTIONS`, onto what it does; anything unknown is a ``deny``."""
    word = " ".join(decision.lower().replace("-", " ").replace("_", " ").split())
    if word == ALLOW_ALWAYS:
        return "always"
    if word == ALLOW:
        return "once"
    return "deny"
