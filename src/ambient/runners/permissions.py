"""Tool permissions of an AI agent: the access matrix, inside the agent. Pure.

Every tool call a Claude agent makes is put to :func:`check_tool` (through Claude Code's ``can_use_tool``):

- **writes** (Write, Edit, MultiEdit, NotebookEdit) land only inside the SPAWN's scope (the files the router checked
  against the agent's zones and locked for it); anything else is denied at once, without asking anyone, and recorded;
- **reads** (Read, Glob, Grep, LS, NotebookRead) stay inside the brain; leaving it is denied;
- neither ever touches what is the daemon's or the person's alone: ``.ambient/`` and the secrets of ``profil/``
  (the rule of :mod:`ambient.runners.confinement`). A **search** is judged by what it can read, not by its folder
  alone (:func:`search_reach`): Grep and LS rooted at the brain's root or at ``profil/`` are refused (they would go
  through those), and a Glob there only when its pattern cannot enter them (``src/**/*.py`` at the root is fine,
  ``**/*.json`` or ``.ambient/**`` is not); any other tool's ``path``-like argument may not name them either;
- **Bash** runs without asking only what ``allowed_tools`` lets through (``Bash`` for any command, ``Bash(pytest:*)``
  for a command starting with the word ``pytest``, ``Bash(make test)`` for that command exactly) and only when the
  command is one simple command: a ``;``, ``&``, ``|``, redirection, substitution or newline makes it a question for
  the person whatever it starts with (``pytest; rm -rf ~`` is not ``pytest``);
- any other tool (WebFetch, WebSearch, MCP tools…) runs when ``allowed_tools`` names it, else it is a question;
- a question becomes an escalation: "coder wants to run `rm -rf build/` in projets/feature", answered
  ``allow`` (this call), ``allow always`` (this exact call, for this agent, from now on) or ``deny``. The question
  shows the whole call (folded over lines, with its length); a call longer than :data:`MAX_ASKED_CHARS` is not asked
  about but denied, with the reason, since the person could not read all of it;
- once the person allowed the agent ``offer_after`` commands of one shape, a question about another also offers
  their pattern (:func:`ambient.runners.patterns.offer`), "allow `pytest -q tests/*` for coder from now on"
  (:func:`pattern_option`, keyed ``allow-pattern``); a pattern the person accepted allows a Bash command it stands
  for as a whole (:func:`ambient.runners.patterns.matches`), never a longer one nor one with shell syntax.

What the person allowed is a *grant*: the sha256 of the call's whole :func:`full_signature` (:func:`call_digest`),
kept beside its display form; a call matches a grant only when the digests are equal, so two commands sharing a long
head never share a grant. A grant stored before digests (its signature alone, cut at
:data:`LEGACY_SIGNATURE_CAP` characters) matches only a call whose whole signature is that text and shorter than
the cap (:func:`grant_digest`).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from ambient.runners import patterns
from ambient.runners.confinement import secret_name
from ambient.storage.paths import STATE_DIRNAME

#: The answers a permission question offers, in this order.
ALLOW = "allow"
ALLOW_ALWAYS = "allow always"
DENY = "deny"
OPTIONS = (ALLOW, ALLOW_ALWAYS, DENY)
#: The key of the fourth option, offered once the person allowed commands of one shape: the pattern of them
#: (:mod:`ambient.runners.patterns`) for this agent from now on.
ALLOW_PATTERN_KEY = patterns.ALLOW_PATTERN_KEY
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
#: Longest signature shown where a call is summed up (the live thread, ``ambient status``); never matched on.
MAX_SIGNATURE = 500
#: How long signatures were cut before grants carried the digest of the whole call: an old grant this long or
#: longer may be the head of a longer command, so it matches nothing any more.
LEGACY_SIGNATURE_CAP = 500
#: Longest call a person is asked about: the question shows it whole, and a Telegram message (4,096 characters)
#: must hold it with the header, the options and how to answer. A longer call is denied, with this reason.
MAX_ASKED_CHARS = 2000
#: Width at which a long call is folded in a question (a continuation starts with ``↳ ``).
FOLD_WIDTH = 100
#: Calls shorter than this, on one line and without a backtick, are quoted inline: "coder wants to run `make`".
INLINE_CHARS = 120
#: The tools that search a folder: judged by what they can reach below it (:func:`search_reach`).
SEARCH_TOOLS = frozenset({"Glob", "Grep", "LS"})
#: Arguments of any other tool taken as paths: none of them may name the daemon's state or the person's secrets.
PATH_KEYS = frozenset({"path", "file_path", "notebook_path", "directory", "dir", "root", "cwd", "folder"})
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_INVISIBLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_WILD = frozenset("*?[]{}\\")
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
    granted: frozenset[str] = frozenset()  # digests of the calls the person allowed (call_digest)
    patterns: tuple[str, ...] = ()  # the command patterns the person allowed for good (runners.patterns)
    allowed_before: tuple[str, ...] = ()  # the commands the person allowed this agent, what a pattern is offered from
    offer_after: int = 0  # how many commands of one shape before a pattern is offered (0: never)


@dataclass(frozen=True, slots=True)
class Verdict:
    """``allow``, ``deny`` (``reason`` is what the agent is told) or ``ask`` (``question`` for the person).
    ``signature`` is the whole call (:func:`full_signature`), ``digest`` what a grant of it matches; ``pattern``
    the command pattern the question offers too (:func:`pattern_option`), or empty."""

    action: Action
    reason: str = ""
    signature: str = ""
    question: str = ""
    digest: str = ""
    pattern: str = ""


def full_signature(tool: str, tool_input: Mapping[str, Any]) -> str:
    """The whole identity of a tool call, never cut: ``Bash: pytest -q`` (a command, a URL, a query), else the tool
    and its input as canonical JSON (sorted keys). A Bash call's ``description`` is not part of it."""
    if tool == "Bash":
        text = str(tool_input.get("command", ""))
    elif tool in ("WebFetch",):
        text = str(tool_input.get("url", ""))
    elif tool in ("WebSearch",):
        text = str(tool_input.get("query", ""))
    else:
        text = json.dumps(dict(tool_input), sort_keys=True, ensure_ascii=False, default=str)
    return f"{tool}: {text}"


def signature(tool: str, tool_input: Mapping[str, Any]) -> str:
    """A call summed up for display (the live thread): its :func:`full_signature`, cut at :data:`MAX_SIGNATURE`."""
    return full_signature(tool, tool_input)[:MAX_SIGNATURE]


def digest_of(full: str) -> str:
    """The sha256 (hex) of a whole signature: what a grant matches."""
    return hashlib.sha256(full.encode("utf-8", "surrogatepass")).hexdigest()


def call_digest(tool: str, tool_input: Mapping[str, Any]) -> str:
    """The digest of one call's whole signature (:func:`digest_of` of :func:`full_signature`)."""
    return digest_of(full_signature(tool, tool_input))


def grant_digest(entry: object) -> str | None:
    """The digest a stored grant matches, or None when it matches nothing.

    A grant is ``{"call": display, "sha256": digest}``; a bare 64-hex string is a digest; an older bare signature
    (cut at :data:`LEGACY_SIGNATURE_CAP`) matches only the call whose whole signature is that text, and only when it
    is shorter than the cap (a text of the cap's length may be a cut one)."""
    if isinstance(entry, Mapping):
        digest = entry.get("sha256")
        return digest if isinstance(digest, str) and _HEX64.match(digest) else None
    if not isinstance(entry, str) or not entry:
        return None
    if _HEX64.match(entry):
        return entry
    if ": " not in entry or len(entry) >= LEGACY_SIGNATURE_CAP:
        return None
    return digest_of(entry)


#: How ``ambient grants`` lists a command pattern the person allowed: ``Bash pattern: pytest -q tests/*``.
PATTERN_PREFIX = "Bash pattern: "


def pattern_option(agent: str, pattern: str) -> str:
    """The option offering ``pattern`` to the person, as they read it (and as their answer comes back)."""
    return f"allow `{pattern}` for {agent} from now on"


def grant_pattern(entry: object) -> str | None:
    """The command pattern a stored grant ``{"pattern": ...}`` allows, or None (not one, or not a valid pattern:
    one written by hand is held to the rules of :func:`ambient.runners.patterns.parse`)."""
    if not isinstance(entry, Mapping):
        return None
    found = entry.get("pattern")
    return found if isinstance(found, str) and patterns.parse(found) is not None else None


def grant_display(entry: object) -> str | None:
    """What ``ambient grants`` shows of a stored grant that still matches something, else None."""
    if grant_digest(entry) is None:
        return None
    if isinstance(entry, Mapping):
        call = entry.get("call")
        return call if isinstance(call, str) and call else str(entry.get("sha256"))
    return str(entry)


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
    if tool in WRITE_TOOLS:  # judged by the path alone: a file's content is never hashed here
        return _check_path(tool, tool_input.get(WRITE_TOOLS[tool]), ctx, resolve, write=True)
    if tool in SEARCH_TOOLS:
        return _check_search(tool, tool_input, ctx, resolve)
    if tool in READ_TOOLS:
        return _check_path(tool, tool_input.get(READ_TOOLS[tool]), ctx, resolve, write=False)
    full = full_signature(tool, tool_input)
    digest = digest_of(full)
    if tool in HARMLESS:
        return Verdict("allow", signature=full, digest=digest)
    if tool == "AskUserQuestion":
        return Verdict(
            "deny",
            "Ask the person through your final answer instead: "
            '{"signal": "ESCALATE", "question": "...", "options": [...]}.',
            signature=full,
            digest=digest,
        )
    private = _private_argument(tool, tool_input, ctx, resolve)
    if private is not None:
        return Verdict("deny", private, signature=full, digest=digest)
    if digest in ctx.granted:
        return Verdict("allow", signature=full, digest=digest)
    if tool == "Bash":
        command = str(tool_input.get("command", ""))
        if bash_allowed(command, ctx.allowed) or any(patterns.matches(p, command) for p in ctx.patterns):
            return Verdict("allow", signature=full, digest=digest)
        where = _rel_or_abs(ctx.workdir, ctx.brain)
        verdict = _ask(tool, command, full, digest, f"{ctx.agent} wants to run", f" in {where}", "command")
        offered = patterns.offer(command, ctx.allowed_before, ctx.offer_after) if verdict.action == "ask" else None
        if offered is None:
            return verdict
        more = (
            f"\nYou allowed {ctx.agent} commands of this shape before: answer {ALLOW_PATTERN_KEY} to "
            f"{pattern_option(ctx.agent, offered)} (a `*` stands for one word without spaces or shell syntax)."
        )
        return replace(verdict, question=verdict.question + more, pattern=offered)
    if any(name == tool and arg is None for name, arg in _tool_rules(ctx.allowed)):
        return Verdict("allow", signature=full, digest=digest)
    what = full.split(": ", 1)[1] if ": " in full else ""
    return _ask(tool, what, full, digest, f"{ctx.agent} wants to use {tool}:", "", "call")


def _ask(tool: str, call: str, full: str, digest: str, head: str, tail: str, noun: str) -> Verdict:
    """A question showing ``call`` whole, or a denial when it is too long to be read in one message (counted as a
    Telegram message counts it, on the text shown: UTF-16 units, invisible characters spelled out)."""
    shown = visible(call)
    if len(shown.encode("utf-16-le", "surrogatepass")) // 2 + shown.count("\n") > MAX_ASKED_CHARS:
        return Verdict(
            "deny",
            f"ambient denied {tool}: this {noun} is {len(call):,} characters long, and the person is asked only about "
            f"calls of at most {MAX_ASKED_CHARS:,} characters, shown whole. Put it in a script file of your scope and "
            "run that, or split it into shorter calls.",
            signature=full,
            digest=digest,
        )
    return Verdict("ask", signature=full, digest=digest, question=question_text(head, shown, tail, noun, len(call)))


def visible(text: str) -> str:
    """``text`` with every character a reader would not see (controls but tab and newline, zero-width and bidi
    marks) spelled out as its escape (``\\x1b``, ``\\u202e``): what the person reads is what runs."""
    return _INVISIBLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def question_text(head: str, shown: str, tail: str, noun: str = "command", length: int | None = None) -> str:
    """``coder wants to run `make` in work``: a short call inline; any other whole, folded at :data:`FOLD_WIDTH`
    with its length (a fold's continuation starts with ``↳ ``, so a real new line and a fold never look alike)."""
    if len(shown) <= INLINE_CHARS and "\n" not in shown and "\r" not in shown and "`" not in shown and shown.strip():
        return f"{head} `{shown}`{tail}" if noun == "command" else f"{head} {shown}{tail}"
    lines = shown.split("\n")  # the only line break left once invisible characters are spelled out
    folded: list[str] = []
    for line in lines:
        chunks = [line[i : i + FOLD_WIDTH] for i in range(0, len(line), FOLD_WIDTH)] or [""]
        folded.append(f"  {chunks[0]}")
        folded += [f"  ↳ {c}" for c in chunks[1:]]
    count = f"{len(shown) if length is None else length:,} characters" + (
        f", {len(lines)} lines" if len(lines) > 1 else ""
    )
    what = f"{head} this command ({count})" if noun == "command" else f"{head.rstrip(':')} ({count})"
    return f"{what}{tail}:\n" + "\n".join(folded)


def _target(raw: Any, ctx: ToolContext, resolve: Callable[[str, Path], Path]) -> Path | str:
    """Where a path argument leads (absolute), or why it cannot be judged."""
    if raw is None or raw == "":
        return ctx.workdir
    if not isinstance(raw, str):
        return "the path is not text"
    return resolve(raw, ctx.workdir)


def _inside(target: Path, brain: Path) -> PurePosixPath | None:
    """``target`` relative to the brain, or None when it is outside."""
    if target != brain and brain not in target.parents:
        return None
    return PurePosixPath(target.relative_to(brain).as_posix())


def _check_path(tool: str, raw: Any, ctx: ToolContext, resolve: Callable[[str, Path], Path], *, write: bool) -> Verdict:
    sig = full_signature(tool, {"path": raw} if raw is not None else {})
    digest = digest_of(sig)
    if write and (raw is None or raw == ""):
        return Verdict("deny", f"ambient denied {tool}: no path given", signature=sig, digest=digest)
    target = _target(raw, ctx, resolve)  # Glob/Grep/LS without a path search the working folder
    if isinstance(target, str):
        return Verdict("deny", f"ambient denied {tool}: {target}", signature=sig, digest=digest)
    rel = _inside(target, ctx.brain)
    if rel is None:
        verb = "writes" if write else "reads"
        return Verdict(
            "deny", f"ambient denied {tool}: {raw} is outside the brain ({verb} stay inside it)", sig, digest=digest
        )
    private = private_reason(rel)
    if private is not None:
        return Verdict("deny", f"ambient denied {tool}: {rel} is off limits ({private})", signature=sig, digest=digest)
    if write and not in_scope(rel, ctx.scope):
        scope = ", ".join(ctx.scope) or "nothing"
        return Verdict(
            "deny", f"ambient denied {tool}: {rel} is outside this item's scope ({scope})", signature=sig, digest=digest
        )
    return Verdict("allow", signature=sig, digest=digest)


def _check_search(
    tool: str, tool_input: Mapping[str, Any], ctx: ToolContext, resolve: Callable[[str, Path], Path]
) -> Verdict:
    """A search: its folder as any read, then what it can reach below it (:func:`search_reach`)."""
    raw = tool_input.get("path")
    full = full_signature(tool, tool_input)
    verdict = replace(_check_path(tool, raw, ctx, resolve, write=False), signature=full, digest=digest_of(full))
    if verdict.action != "allow":
        return verdict
    root = _target(raw, ctx, resolve)
    rel = _inside(root, ctx.brain) if isinstance(root, Path) else None
    if rel is None or not isinstance(root, Path):  # _check_path refused it already
        return replace(verdict, action="deny", reason=f"ambient denied {tool}: {raw} is outside the brain")
    pattern = tool_input.get("pattern") if tool == "Glob" else None
    if pattern is not None and not isinstance(pattern, str):
        return replace(verdict, action="deny", reason=f"ambient denied {tool}: the pattern is not text")
    if pattern is not None:  # its leading folders without wildcards are where it starts: judged as a path
        head, rest = _literal_head(pattern)
        if head:
            rel = _inside(resolve(head, root), ctx.brain)
            if rel is None:
                return replace(verdict, action="deny", reason=f"ambient denied {tool}: {pattern} leaves the brain")
            private = private_reason(rel)
            if private is not None:
                return replace(verdict, action="deny", reason=f"ambient denied {tool}: {rel} is off limits ({private})")
        pattern = "/".join(rest)
    why = search_reach(rel, pattern)
    if why is None:
        return verdict
    where = "the brain's root" if rel == PurePosixPath(".") else f"{rel}/"
    return replace(
        verdict,
        action="deny",
        reason=f"ambient denied {tool}: a search from {where}{' for ' + repr(pattern) if pattern else ''} could "
        f"reach {why}; search a folder of your task instead (a path below the brain's root, or a pattern starting "
        "with one)",
    )


def _literal_head(pattern: str) -> tuple[str, list[str]]:
    """A Glob pattern split into its leading folders without wildcards (a path: ``/`` for an absolute one) and the
    segments from the first wildcard on, or the last segment."""
    parts = pattern.split("/")
    cut = next((i for i, part in enumerate(parts) if _WILD & set(part)), len(parts) - 1)
    head = "/".join(parts[:cut])
    if pattern.startswith("/") and not head:
        head = "/"
    return head, parts[cut:]


def search_reach(rel: PurePosixPath, pattern: str | None) -> str | None:
    """What private part of the brain a search rooted at ``rel`` (brain-relative, itself not private) can reach, or
    None. Conservative, for the tools' glob semantics as ripgrep reads them (a segment without a ``/`` matches names
    at any depth): no pattern (Grep and LS walk every folder below), ``**``, ``..``, or a wildcard segment that may
    match ``.ambient`` or ``profil`` (dot names included, case ignored; braces, classes and escapes match anything)
    reach all that is below; in ``profil/``, only a literal name that is no secret's is safe."""
    parts = [p for p in rel.parts if p != "."]
    if parts and parts != ["profil"]:
        return None  # below the brain's root and below profil/
    below = _PRIVATE_BELOW[bool(parts)]
    if pattern is None:
        return below
    segments = [s for s in pattern.split("/") if s not in ("", ".")]
    if not segments:
        return None
    first = segments[0]
    if ".." in segments or "**" in first:
        return below
    if parts:  # profil/: a secret is named by a word anywhere in its name
        return below if _WILD & set(first) or secret_name(first) else None
    if len(segments) == 1:  # matched at any depth: only a literal name that is neither private folder nor a secret
        return below if _WILD & set(first) or first == STATE_DIRNAME or secret_name(first) else None
    if _may_match(first, STATE_DIRNAME):
        return below
    if _may_match(first, "profil"):
        return search_reach(PurePosixPath("profil"), "/".join(segments[1:]))
    return None


_PRIVATE_BELOW = {
    False: f"{STATE_DIRNAME}/ (the daemon's state) and the secrets of profil/",
    True: "the secrets of profil/",
}


def _may_match(segment: str, name: str) -> bool:
    """Whether a pattern segment may match ``name``: braces, classes and escapes are taken to match anything."""
    if set("[]{}\\") & set(segment):
        return True
    return fnmatch.fnmatchcase(name.lower(), segment.lower())


def _private_argument(
    tool: str, tool_input: Mapping[str, Any], ctx: ToolContext, resolve: Callable[[str, Path], Path]
) -> str | None:
    """Why a path-like argument of another tool (an MCP server's ``path``...) names what is never an agent's."""
    for key in sorted(PATH_KEYS & set(tool_input)):
        raw = tool_input[key]
        if not isinstance(raw, str) or not raw:
            continue
        rel = _inside(resolve(raw, ctx.workdir), ctx.brain)
        private = private_reason(rel) if rel is not None else None
        if private is not None:
            return f"ambient denied {tool}: {key} {rel} is off limits ({private})"
    return None


def _rel_or_abs(path: Path, brain: Path) -> str:
    if path == brain:
        return "the brain's root"
    return path.relative_to(brain).as_posix() if brain in path.parents else str(path)


Answer = Literal["once", "always", "pattern", "deny"]


def answer_of(decision: str, offered: str | None = None) -> Answer:
    """The person's option, as proposed in :data:`OPTIONS` (or ``offered``: the label of the pattern's option,
    :func:`pattern_option`), onto what it does; anything unknown is a ``deny``."""
    if offered is not None and decision == offered:
        return "pattern"
    word = " ".join(decision.lower().replace("-", " ").replace("_", " ").split())
    if word == ALLOW_ALWAYS:
        return "always"
    if word == ALLOW:
        return "once"
    return "deny"
