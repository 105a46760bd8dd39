"""What every agent runner shares: the per-agent runner config, the request, the result, the agent protocol.

Pure (no I/O): argv templating, config parsing with file:line errors, and the interpretation of what an agent
returned (its JSON) into an :class:`AgentResult`. The runners (command, callable, assisted) do the I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from ambient.core.errors import InputError, RunnerError
from ambient.core.problems import Problem
from ambient.storage.yamlfile import LineMap

KiB = 1024
MiB = 1024 * KiB

#: Largest SPAWN packet (JSON bytes) handed to an agent on stdin.
MAX_PACKET_BYTES = 1 * MiB
#: The packet is also put in ``AMBIENT_PACKET`` when its JSON is at most this long (else stdin only).
MAX_ENV_PACKET_BYTES = 32 * KiB
#: Handoff text (DESIGN §8) is bounded to this many characters.
MAX_HANDOFF_CHARS = 4096
#: Largest string anywhere in an agent's JSON output (same bound as the router's packets, RELIABILITY §2.5).
MAX_OUTPUT_STRING_CHARS = 65_536
#: Deepest nesting accepted in an agent's JSON output.
MAX_OUTPUT_DEPTH = 64
#: Linux MAX_ARG_STRLEN is 128 KiB including the NUL; one rendered argv element must fit.
MAX_ARG_BYTES = 128 * KiB - 1

AgentStatus = Literal["success", "fail", "error", "escalate", "blocked"]
ResultStatus = Literal["ok", "partial", "failed"]
#: Why a result is not a plain success. ``None`` for success, escalate and blocked.
Reason = Literal[
    "agent_failed",  # the agent reported a business failure (status failed, or exit code 1)
    "agent_error",  # the agent reported an ERROR (signal ERROR or status error)
    "exit_code",  # exit code 2..255
    "signal",  # the agent died from a signal ambient did not send (crash, abort, OOM kill)
    "timeout",  # ambient killed the process group at timeout_s
    "output_over_cap",  # ambient killed the process group: stdout over max_output_bytes
    "shutdown",  # ambient killed the process group because the daemon is stopping
    "bad_output",  # exit 0 but stdout is not a valid agent answer (see the protocol)
    "sender_mismatch",  # the answer claims to come from someone else than the spawned agent (S-05)
    "spawn_failed",  # the program could not be started (not found, not executable, bad cwd)
    "daemon_resources",  # ambient itself ran out of something starting it (descriptors, memory): not the agent
    "bad_request",  # the request could not be turned into a process (template, NUL, packet too big, import)
    "exception",  # a callable agent raised
    "provider_refused",  # the model provider refused the key (401/403): the person must act, no retry helps
    "provider_failed",  # the model provider kept failing (429/5xx after retries)
    "provider_unreachable",  # the model API cannot be reached or is not one (connection refused, 404): the person acts
    "budget",  # the agent's own max_budget_usd or max_turns ended it
]

_SIGNAL_OF_STATUS: dict[str, str] = {
    "success": "RETURN",
    "fail": "RETURN",
    "error": "ERROR",
    "escalate": "ESCALATE",
    "blocked": "BLOCKED_ON",
}


class RunnerConfigError(InputError):
    """A runner configuration that does not validate; ``problems`` holds every finding with its line."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        first = self.problems[0]
        rest = [str(p) for p in self.problems[1:]]
        message = "\n".join([first.message, *rest])
        super().__init__(message, file=first.file, line=first.line)


class TemplateError(RunnerError):
    """An argv template that cannot be rendered (unknown name, NUL, leading dash, too long)."""


# ---------------------------------------------------------------------------------------------------------------
# argv templating: plain {{name}} substitution, one value per argv element, no expressions (DESIGN §5, S-07)

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
#: The only template allowed in argv[0]: the daemon's own interpreter (never workflow data).
PROGRAM_TEMPLATES = frozenset({"python"})


def template_names(text: str) -> list[str]:
    """Names used by ``{{name}}`` placeholders in ``text``; raises ValueError on a stray ``{{`` or ``}}``."""
    names = _PLACEHOLDER.findall(text)
    rest = _PLACEHOLDER.sub("", text)
    if "{{" in rest or "}}" in rest:
        msg = f"{text!r} has a '{{{{' or '}}}}' that is not a placeholder; expected {{{{name}}}} with a plain name"
        raise ValueError(msg)
    return names


def render_arg(template: str, values: Mapping[str, str], *, index: int = 0) -> str:
    """Render one argv element: each ``{{name}}`` is replaced by ``values[name]`` in a single pass.

    A value is never parsed again, so a value containing ``{{x}}`` stays literal. The result is exactly one
    argv element whatever the value holds (spaces, quotes, ``;``, ``$(...)``, newlines): no shell ever sees it.
    """

    def _one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            known = ", ".join(sorted(values)) or "none"
            msg = f"argv[{index}]: unknown template name {{{{{name}}}}}; known names: {known}"
            raise TemplateError(msg)
        value = values[name]
        if not isinstance(value, str):
            msg = f"argv[{index}]: value of {{{{{name}}}}} is {type(value).__name__}; expected a string"
            raise TemplateError(msg)
        return value

    out = _PLACEHOLDER.sub(_one, template)
    if "\x00" in out:
        msg = f"argv[{index}]: rendered argument contains a NUL byte; a NUL cannot be passed to a program"
        raise TemplateError(msg)
    if len(out.encode("utf-8", "surrogateescape")) > MAX_ARG_BYTES:
        msg = f"argv[{index}]: rendered argument is over {MAX_ARG_BYTES} bytes"
        raise TemplateError(msg)
    return out


def render_argv(argv: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """Render every element of ``argv`` (see :func:`render_arg`) and refuse option smuggling.

    S-07: an element that *starts* with a placeholder and renders to text beginning with ``-`` would be read as
    an option by the program (``--output=/etc/x``, ``-rf``). It is refused unless a literal ``--`` element comes
    before it in ``argv`` (the end-of-options marker of most tools). Elements such as ``--item={{item}}`` are
    safe: the program reads the whole element as that one option.
    """
    out: list[str] = []
    after_dashdash = False
    for index, template in enumerate(argv):
        rendered = render_arg(template, values, index=index)
        starts_with_value = _PLACEHOLDER.match(template) is not None
        if starts_with_value and rendered.startswith("-") and not after_dashdash and index > 0:
            msg = (
                f"argv[{index}]: templated value {rendered[:40]!r} starts with '-' and would be read as an option; "
                "put a literal '--' element before it in argv (for tools that accept it) or prefix the template"
            )
            raise TemplateError(msg)
        if template == "--":
            after_dashdash = True
        out.append(rendered)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Runner configuration (per agent: frontmatter `ambient.runner`, or profil/ambient.yml)

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Environment names a runner config may not set: ambient's own channel, systemd's, and loader injection.
_RESERVED_ENV_PREFIXES = ("AMBIENT_", "WATCHDOG_", "LISTEN_", "LD_")
_RESERVED_ENV_NAMES = frozenset({"NOTIFY_SOCKET", "CREDENTIALS_DIRECTORY"})
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_TARGET = re.compile(rf"^{_DOTTED}:{_DOTTED}$")


class _RunnerModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def check_in_brain(rel: str, hint: str = "") -> str:
    """A runner's folder relative to the brain's root, that stays inside it (``cwd``, ``workdir``)."""
    from ambient.storage.fsutil import check_relative  # a pure string check; fsutil is imported lazily to stay light

    try:
        check_relative(rel)
    except InputError as exc:
        raise ValueError(exc.message + hint) from None
    return rel


def check_env(env: dict[str, str]) -> dict[str, str]:
    """A runner's ``env:``: plain names, none of ambient's or the loader's own, no NUL, bounded values."""
    for name, value in env.items():
        if not _ENV_NAME.match(name):
            msg = f"env name {name!r} is not a valid variable name (letters, digits, '_')"
            raise ValueError(msg)
        if name in _RESERVED_ENV_NAMES or name.startswith(_RESERVED_ENV_PREFIXES):
            msg = f"env name {name!r} is reserved (AMBIENT_*, NOTIFY_SOCKET, WATCHDOG_*, LISTEN_*, LD_*, ...)"
            raise ValueError(msg)
        if "\x00" in value or len(value) > 32 * KiB:
            msg = f"env value of {name!r} contains a NUL byte or is over 32 KiB"
            raise ValueError(msg)
    return env


class CommandRunnerConfig(_RunnerModel):
    """Run the agent as a program: argv (never a shell), packet on stdin, answer as JSON on stdout."""

    kind: Literal["command"]
    argv: list[str] = Field(min_length=1, max_length=256)
    timeout_s: float = Field(default=600.0, gt=0, le=7 * 86_400)
    max_output_bytes: int = Field(default=1 * MiB, ge=1, le=256 * MiB)
    stderr_tail_bytes: int = Field(default=8 * KiB, ge=0, le=1 * MiB)
    env: dict[str, str] = Field(default_factory=dict, max_length=128)
    cwd: str | None = None
    kill_grace_s: float = Field(default=5.0, ge=0, le=300)
    #: Landlock: read the brain and the system, write only the SPAWN's scope (ambient.runners.confinement).
    confine: bool = True
    #: Run the agent as this Unix user (ambient must run as root): a same-user agent can do what ambient can.
    user: str | None = Field(default=None, min_length=1, max_length=64, pattern=r"^[a-z_][a-z0-9_-]*\$?$")

    @field_validator("argv")
    @classmethod
    def _check_argv(cls, argv: list[str]) -> list[str]:
        for index, element in enumerate(argv):
            if "\x00" in element:
                msg = f"argv[{index}] contains a NUL byte"
                raise ValueError(msg)
            names = template_names(element)
            if index == 0:
                if not element.strip():
                    msg = "argv[0] (the program) is empty"
                    raise ValueError(msg)
                # The program itself never comes from workflow data; only the daemon's interpreter may be named.
                if names and not (_PLACEHOLDER.fullmatch(element) and names[0] in PROGRAM_TEMPLATES):
                    msg = "argv[0] (the program) may only be a fixed path or exactly '{{python}}'"
                    raise ValueError(msg)
        return argv

    @field_validator("env")
    @classmethod
    def _check_env(cls, env: dict[str, str]) -> dict[str, str]:
        return check_env(env)

    @field_validator("cwd")
    @classmethod
    def _check_cwd(cls, cwd: str | None) -> str | None:
        if cwd is None or cwd.startswith("/"):
            return cwd
        return check_in_brain(cwd)


class CallableRunnerConfig(_RunnerModel):
    """Run the agent in-process: ``target`` is ``"pkg.module:function"`` called with the :class:`RunRequest`."""

    kind: Literal["callable"]
    target: str
    timeout_s: float = Field(default=600.0, gt=0, le=7 * 86_400)

    @field_validator("target")
    @classmethod
    def _check_target(cls, target: str) -> str:
        if not _TARGET.match(target):
            msg = f'import string {target!r} must be in format "<module>:<attribute>"'
            raise ValueError(msg)
        return target


class AssistedRunnerConfig(_RunnerModel):
    """A person or an external agent carries out the SPAWN: a claim is opened and polled until closed."""

    kind: Literal["assisted"]
    poll_s: float = Field(default=2.0, gt=0, le=3600)
    timeout_s: float = Field(default=86_400.0, gt=0, le=30 * 86_400)


#: A tool pattern as Claude Code writes it: ``Read``, ``Bash``, ``Bash(pytest:*)``, ``mcp__server__tool``.
_TOOL_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]*(\(.{1,500}\))?$"


class ClaudeRunnerConfig(_RunnerModel):
    """Run the agent on Claude Code (the ``claude-agent-sdk`` extra): its markdown body is the system prompt.

    ``allowed_tools`` is ambient's allowlist, checked by ambient in ``can_use_tool`` (never handed to Claude Code as
    auto-approvals, which would skip the scope check): ``Bash(pytest:*)`` lets Bash run commands starting with
    ``pytest`` without asking the person. ``permission_mode`` is ``default`` or ``plan``: the modes that accept
    edits or bypass permissions would let tool calls past the access matrix.
    """

    kind: Literal["claude"]
    model: str | None = Field(default=None, min_length=1, max_length=200)
    system_prompt: Literal["append", "replace"] = "append"
    max_turns: int | None = Field(default=None, ge=1, le=10_000)
    max_budget_usd: float | None = Field(default=None, gt=0, le=100_000)
    allowed_tools: list[Annotated[str, Field(pattern=_TOOL_PATTERN)]] = Field(default_factory=list, max_length=256)
    disallowed_tools: list[Annotated[str, Field(pattern=_TOOL_PATTERN)]] = Field(default_factory=list, max_length=256)
    permission_mode: Literal["default", "plan"] = "default"
    workdir: str | None = None
    env: dict[str, str] = Field(default_factory=dict, max_length=128)
    timeout_s: float = Field(default=1800.0, gt=0, le=7 * 86_400)
    base_url: str | None = Field(default=None, pattern=r"^https?://", max_length=2000)

    @field_validator("env")
    @classmethod
    def _check_env(cls, env: dict[str, str]) -> dict[str, str]:
        return check_env(env)

    @field_validator("workdir")
    @classmethod
    def _check_workdir(cls, workdir: str | None) -> str | None:
        return None if workdir is None else check_in_brain(workdir, " (workdir is relative to the brain's root)")


class Price(_RunnerModel):
    """US dollars per million tokens, for a model the built-in table does not know."""

    input: float = Field(ge=0, le=10_000)
    output: float = Field(ge=0, le=10_000)
    cache_read: float | None = Field(default=None, ge=0, le=10_000)
    cache_write: float | None = Field(default=None, ge=0, le=10_000)


class LlmRunnerConfig(_RunnerModel):
    """One model call, no tools: the agent body as system prompt, the SPAWN as the user message.

    ``provider: openai`` speaks the Chat Completions API at ``base_url`` (OpenAI, Ollama, vLLM, llama.cpp server,
    LM Studio, OpenRouter); ``anthropic`` the Messages API. The key comes from ``api_key_env`` (default
    ``ANTHROPIC_API_KEY`` / ``OPENAI_API_KEY``) in the daemon's environment or a file of that name, lower-cased, in
    ``$CREDENTIALS_DIRECTORY``.
    """

    kind: Literal["llm"]
    provider: Literal["anthropic", "openai"] = "anthropic"
    model: str | None = Field(default=None, min_length=1, max_length=200)
    base_url: str | None = Field(default=None, pattern=r"^https?://", max_length=2000)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)
    max_tokens: int = Field(default=4096, ge=1, le=1_000_000)
    temperature: float | None = Field(default=None, ge=0, le=2)
    timeout_s: float = Field(default=600.0, gt=0, le=86_400)
    max_retries: int = Field(default=4, ge=0, le=20)
    price: Price | None = None


AnyRunnerConfig = (
    CommandRunnerConfig | CallableRunnerConfig | AssistedRunnerConfig | ClaudeRunnerConfig | LlmRunnerConfig
)
RunnerConfig = Annotated[AnyRunnerConfig, Field(discriminator="kind")]
"""Per-agent runner configuration, discriminated by ``kind``."""

_RUNNER_ADAPTER: TypeAdapter[AnyRunnerConfig] = TypeAdapter(RunnerConfig)
_KINDS = ("command", "callable", "assisted", "claude", "llm")


def parse_runner_config(
    raw: Mapping[str, Any],
    *,
    file: str = "<runner>",
    lines: LineMap | None = None,
    prefix: Sequence[str | int] = (),
) -> AnyRunnerConfig:
    """Validate a runner mapping; raise :class:`RunnerConfigError` naming file, line, field and expectation.

    ``prefix`` is where the mapping sits in its document (e.g. ``("ambient", "runner")`` in a frontmatter),
    so ``lines`` can give the line of each bad field.
    """
    where = tuple(prefix)
    lines = lines or LineMap()
    if not isinstance(raw, Mapping):
        label = ".".join(str(p) for p in where) or "runner"
        problem = Problem(
            file=file,
            line=lines.line_for(where),
            message=f"{label}: expected a mapping with 'kind: {'|'.join(_KINDS)}', got {type(raw).__name__}",
        )
        raise RunnerConfigError([problem])
    try:
        return _RUNNER_ADAPTER.validate_python(dict(raw))
    except ValidationError as exc:
        raise RunnerConfigError(_problems(exc, raw, file=file, lines=lines, prefix=where)) from None


def _problems(
    exc: ValidationError, raw: Mapping[str, Any], *, file: str, lines: LineMap, prefix: tuple[str | int, ...]
) -> list[Problem]:
    kind = raw.get("kind")
    out: list[Problem] = []
    expected = ", ".join(repr(k) for k in _KINDS)
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if isinstance(p, str | int))
        if loc and loc[0] == kind:  # the discriminated union prefixes the tag; the document has no such key
            loc = loc[1:]
        kind_problem = err["type"] in ("union_tag_not_found", "union_tag_invalid")
        if err["type"] == "union_tag_not_found":
            message = f"kind: missing; expected one of {expected}"
        elif err["type"] == "union_tag_invalid":
            message = f"kind: {kind!r} is not a runner kind; expected one of {expected}"
        elif err["type"] == "extra_forbidden":
            message = f"{'.'.join(map(str, loc))}: unknown key for a {kind} runner"
        else:
            text = err["msg"].removeprefix("Value error, ")
            message = f"{'.'.join(map(str, loc)) or kind}: {text}"
        line_loc = (*prefix, "kind") if kind_problem else (*prefix, *loc)
        out.append(Problem(file=file, line=lines.line_for(line_loc), message=message))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Request and result


def idempotency_key(run_id: str, item: str, attempt: int) -> str:
    """The idempotency key of one SPAWN: ``run/item/attempt`` (RELIABILITY §1.1, Temporal's lesson)."""
    return f"{run_id}/{item}/{attempt}"


@dataclass(frozen=True, slots=True)
class RunRequest:
    """Everything a runner needs to carry out one SPAWN.

    ``packet`` is the SPAWN packet as a JSON-ready mapping (what the agent receives on stdin). ``channel_token`` is
    the per-spawn secret the agent may use to talk back; it is never part of ``repr`` and never logged.
    ``vars`` are the workflow's template values for argv (``{{item}}`` and friends); the built-in names ``item``,
    ``run_id``, ``attempt``, ``key``, ``agent``, ``brain`` and ``python`` always win over them.
    ``before_start`` is a short blocking job a command runner runs on the event loop just before the agent starts
    (the agent is not started if it raises): the daemon writes the channel file there (a few syscalls; a thread hop
    per agent cost more, see ``ChannelRegistry.mint``); other runners ignore it.
    """

    packet: Mapping[str, Any]
    agent: str
    run_id: str
    item: str
    attempt: int
    key: str
    channel_token: str = field(repr=False)
    brain: Path
    vars: Mapping[str, str] = field(default_factory=dict)
    handoff: str | None = None
    before_start: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    prompt_file: Path | None = None  # agents/<name>.md: an AI runner's system prompt is its body

    def template_values(self, python: str) -> dict[str, str]:
        """The values argv templates may use (``python`` is the daemon's interpreter path)."""
        values = {str(k): v for k, v in self.vars.items()}
        values.update(
            item=self.item,
            run_id=self.run_id,
            attempt=str(self.attempt),
            key=self.key,
            agent=self.agent,
            brain=str(self.brain),
            python=python,
        )
        return values

    def bounded_handoff(self) -> str | None:
        """The handoff text cut to :data:`MAX_HANDOFF_CHARS`."""
        if self.handoff is None:
            return None
        return self.handoff[:MAX_HANDOFF_CHARS]


@dataclass(frozen=True, slots=True)
class Usage:
    """What one AI agent execution consumed: the figures run records and ``ambient stats`` carry.

    ``cost_usd`` is None when nobody knows the price (a model outside the built-in table with no ``price:``).
    """

    model: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float | None = None
    turns: int = 0
    session_id: str | None = None

    def to_record(self) -> dict[str, Any]:
        """JSON-ready, zero and unknown figures left out."""
        out: dict[str, Any] = {}
        for name in self.__slots__:
            value = getattr(self, name)
            if value not in (None, 0):
                out[name] = value
        return out


@dataclass(frozen=True, slots=True)
class AgentResult:
    """What came back from one agent execution, already mapped onto ``on_return`` outcomes.

    ``status``: success | fail (business failure) | error | escalate | blocked. ``output`` is the JSON object the
    agent printed, as parsed (``None`` if none). ``result`` is the normalised result mapping of a RETURN (success
    or fail), with ``result_status`` ok | partial | failed for chain exit triggers (spec/004). ``options`` and
    ``question`` come with escalate; ``context`` with error and blocked. ``reason`` says why a result is not a
    success; ``killed`` is True when ambient signalled the agent's process group.
    """

    status: AgentStatus
    output: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    result_status: ResultStatus | None = None
    options: list[str] | None = None
    question: str | None = None
    context: dict[str, Any] | None = None
    exit_code: int | None = None
    duration_ms: int = 0
    stderr_tail: str = ""
    error: str | None = None
    killed: bool = False
    reason: Reason | None = None
    pid: int | None = None
    usage: Usage | None = None  # an AI agent's tokens, cost, turns and session
    #: A tool call the agent waits on the person for (``ambient.runners.permissions``): its ESCALATE is about that.
    permission: dict[str, Any] | None = None

    @property
    def signal(self) -> str:
        """The packet signal this result becomes: RETURN, ERROR, ESCALATE or BLOCKED_ON."""
        return _SIGNAL_OF_STATUS[self.status]

    @property
    def ok(self) -> bool:
        """True for a success."""
        return self.status == "success"

    def with_process(self, **changes: Any) -> AgentResult:
        """A copy with process facts (exit code, duration, stderr tail, pid...) filled in."""
        return replace(self, **changes)

    def to_record(self) -> dict[str, Any]:
        """A JSON-ready summary for run records (no raw output, which may be large)."""
        out: dict[str, Any] = {"status": self.status, "signal": self.signal, "duration_ms": self.duration_ms}
        for name in ("result_status", "exit_code", "error", "reason", "pid"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.killed:
            out["killed"] = True
        if self.usage is not None:
            out["usage"] = self.usage.to_record()
        return out


def error_result(reason: Reason, message: str, **extra: Any) -> AgentResult:
    """An ``error`` result with a reason code and a human message."""
    return AgentResult(status="error", reason=reason, error=message, **extra)


#: What an AI runner reports as its agent works, for the live thread and ``ambient status``: ``(request, kind, text)``
#: with kind ``assistant`` (a message of the model), ``tool_call`` (``Bash: pytest -q``), ``tool_result`` or
#: ``denied`` (a tool call refused by the permissions). Called on the event loop; it must not block.
Watch = Callable[["RunRequest", str, str], None]


class Runner(Protocol):
    """Carries out one SPAWN. ``run`` never raises for agent failures (they become results); it re-raises
    ``CancelledError`` after cleaning up (killing the agent's processes)."""

    async def run(self, req: RunRequest, cfg: Any) -> AgentResult:
        """Run the agent for ``req`` as configured by ``cfg`` (its own kind's config) and return what came back."""
        ...


# ---------------------------------------------------------------------------------------------------------------
# The agent protocol: what an agent may answer (see docs in runners/__init__.py)


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
            status="error", output=obj, context=context, reason="agent_error", error=_context_message(context)
        )
    return AgentResult(status="blocked", output=obj, context=dict(answer.context))


def _from_result(result: dict[str, Any], *, output: dict[str, Any]) -> AgentResult:
    word = result.get("status", "ok")
    if not isinstance(word, str) or word not in _STATUS_WORDS:
        expected = "ok, partial, failed (or success, fail, error)"
        return error_result("bad_output", f"result.status {str(word)[:40]!r} is not one of {expected}", output=output)
    status, result_status = _STATUS_WORDS[word]
    if status == "error":
        message = _context_message(result)
        return AgentResult(status="error", output=output, context=result, reason="agent_error", error=message)
    if status == "fail":
        return AgentResult(
            status="fail",
            output=output,
            result=result,
            result_status=result_status,
            reason="agent_failed",
            error=_context_message(result) or "agent reported status failed",
        )
    return AgentResult(status="success", output=output, result=result, result_status=result_status)


def _context_message(context: Mapping[str, Any]) -> str | None:
    for key in ("error", "message", "reason", "detail"):
        value = context.get(key)
        if isinstance(value, str) and value:
            return value[:500]
    return None
