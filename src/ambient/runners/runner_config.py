"""An agent's runner configuration: frontmatter ``ambient.runner`` or ``profil/ambient.yml``, by ``kind``. Pure.

One model per kind (command, callable, assisted, claude, llm), checked when the brain is loaded so that a bad field
is reported with its file and line (:func:`parse_runner_config`) long before a SPAWN would trip on it. The runners
read these models; nothing here runs anything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from ambient.core.errors import InputError, RunnerConfigError
from ambient.core.pathrules import normalize
from ambient.core.problems import Problem
from ambient.runners.argv import check_argv
from ambient.storage.yamltext import (
    MAPPING_EXPECTED,
    LineMap,
    known_keys,
    mapping_expected,
    misspelled,
    unknown_key_hint,
)

KiB = 1024
MiB = 1024 * KiB


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Environment names a runner config may not set: ambient's own channel, systemd's, and loader injection.
_RESERVED_ENV_PREFIXES = ("AMBIENT_", "WATCHDOG_", "LISTEN_", "LD_")
_RESERVED_ENV_NAMES = frozenset({"NOTIFY_SOCKET", "CREDENTIALS_DIRECTORY"})
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_TARGET = re.compile(rf"^{_DOTTED}:{_DOTTED}$")


class _RunnerModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _AgentRunner(_RunnerModel):
    """What every kind's runner may also say: where the agent runs (docs/cluster.md). ``workers``: on the worker
    hosts of ``cluster:`` (kind: command only, checked with the brain); ``local``: here, whatever
    ``cluster.dispatch`` says; None: as ``cluster.dispatch`` says."""

    dispatch: Literal["workers", "local"] | None = None


def check_in_brain(rel: str, hint: str = "") -> str:
    """A runner's folder relative to the brain's root, that stays inside it (``cwd``, ``workdir``)."""
    try:
        normalize(rel)  # what storage.fsutil.check_relative checks, from core so that this module stays pure
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


#: ``network: any``: the agent's TCP is not confined.
ANY_NETWORK = "any"
_HOST_PORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+|\*):(?P<port>[0-9]{1,5})$")
Network = str | list[str]


def check_network(network: Network) -> Network:
    """A runner's ``network:``: ``any``, or a list of ``host:port`` (a port from 1 to 65535)."""
    if isinstance(network, str):
        if network != ANY_NETWORK:
            msg = f"{network!r} is neither `any` nor a list of host:port (e.g. [127.0.0.1:8080])"
            raise ValueError(msg)
        return network
    for entry in network:
        found = _HOST_PORT.match(entry)
        if found is None or not 0 < int(found["port"]) < 65536:
            msg = (
                f"network entry {entry!r} is not host:port (e.g. 127.0.0.1:8080, api.example.com:443, a port from "
                "1 to 65535); write `network: any` for an agent whose TCP is not confined"
            )
            raise ValueError(msg)
    return network


def network_ports(network: Network) -> tuple[int, ...] | None:
    """The TCP ports ``network:`` lets an agent connect to (None: any, the network is not confined). Landlock's
    rules know ports, not hosts: ``127.0.0.1:8080`` lets the agent reach port 8080 of any host."""
    if isinstance(network, str):
        return None
    return tuple(sorted({int(entry.rsplit(":", 1)[1]) for entry in network}))


class CommandRunnerConfig(_AgentRunner):
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
    #: Where a confined agent may connect by TCP (``host:port``; Landlock holds the port), or ``any``; none by default.
    network: Network = Field(default_factory=list, max_length=64)

    @field_validator("network")
    @classmethod
    def _check_network(cls, network: Network) -> Network:
        return check_network(network)

    @field_validator("argv")
    @classmethod
    def _check_argv(cls, argv: list[str]) -> list[str]:
        return check_argv(argv)

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


class CallableRunnerConfig(_AgentRunner):
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


class AssistedRunnerConfig(_AgentRunner):
    """A person or an external agent carries out the SPAWN: a claim is opened and polled until closed."""

    kind: Literal["assisted"]
    poll_s: float = Field(default=2.0, gt=0, le=3600)
    timeout_s: float = Field(default=86_400.0, gt=0, le=30 * 86_400)


#: A tool pattern as Claude Code writes it: ``Read``, ``Bash``, ``Bash(pytest:*)``, ``mcp__server__tool``.
_TOOL_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]*(\(.{1,500}\))?$"


class ClaudeRunnerConfig(_AgentRunner):
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
    #: Landlock, as for a command agent: Claude Code and every command it runs write only the scope, the agent's own
    #: session folder and a temp dir (ambient.runners.confinement).
    confine: bool = True
    #: Where it may connect by TCP beyond its model API (``host:port``, held by port), or ``any``.
    network: Network = Field(default_factory=list, max_length=64)

    @field_validator("network")
    @classmethod
    def _check_network(cls, network: Network) -> Network:
        return check_network(network)

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


class LlmRunnerConfig(_AgentRunner):
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


def network_text(cfg: AnyRunnerConfig) -> str | None:
    """What an agent of this runner may reach by TCP, as ``ambient matrix`` and the console say it (None: the kind
    runs no process of the agent's: callable, assisted, llm)."""
    if not isinstance(cfg, CommandRunnerConfig | ClaudeRunnerConfig):
        return None
    if not cfg.confine:
        return "any (unconfined: confine: false)"
    if isinstance(cfg.network, str):
        return "any (network: any)"
    listed = ", ".join(cfg.network)
    if isinstance(cfg, ClaudeRunnerConfig):
        return "its model API" + (f", {listed}" if listed else "") + "; binds no port"
    return (listed or "none") + "; binds no port"


AnyRunnerConfig = (
    CommandRunnerConfig | CallableRunnerConfig | AssistedRunnerConfig | ClaudeRunnerConfig | LlmRunnerConfig
)
RunnerConfig = Annotated[AnyRunnerConfig, Field(discriminator="kind")]
"""Per-agent runner configuration, discriminated by ``kind``."""

_RUNNER_ADAPTER: TypeAdapter[AnyRunnerConfig] = TypeAdapter(RunnerConfig)
_MODELS: dict[str, type[BaseModel]] = {
    "command": CommandRunnerConfig,
    "callable": CallableRunnerConfig,
    "assisted": AssistedRunnerConfig,
    "claude": ClaudeRunnerConfig,
    "llm": LlmRunnerConfig,
}
_KINDS = tuple(_MODELS)


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
    model = _MODELS.get(kind) if isinstance(kind, str) else None
    out: list[Problem] = []
    expected = ", ".join(repr(k) for k in _KINDS)
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if isinstance(p, str | int))
        if loc and loc[0] == kind:  # the discriminated union prefixes the tag; the document has no such key
            loc = loc[1:]
        kind_problem = err["type"] in ("union_tag_not_found", "union_tag_invalid")
        line_loc = (*prefix, "kind") if kind_problem else (*prefix, *loc)
        if err["type"] == "union_tag_not_found":
            message = f"kind: missing; expected one of {expected}"
        elif err["type"] == "union_tag_invalid":
            message = f"kind: {kind!r} is not a runner kind; expected one of {expected}"
        elif err["type"] == "extra_forbidden":
            hint = unknown_key_hint(str(loc[-1]), known_keys(model, loc[:-1])) if model and loc else ""
            message = f"{'.'.join(map(str, loc))}: unknown key for a {kind} runner" + (f"; {hint}" if hint else "")
        else:
            text = mapping_expected(model, loc) if err["type"] in MAPPING_EXPECTED else err["msg"]
            text = text.removeprefix("Value error, ")
            message = f"{'.'.join(map(str, loc)) or kind}: {text}"
            inp = err.get("input")
            missing = err["type"] == "missing" and bool(loc) and isinstance(inp, Mapping)
            typo = misspelled(str(loc[-1]), inp) if missing else None
            if typo is not None:  # `argvs:` beside a missing `argv`: said at the misspelled key's line
                message += f" (is {typo!r} a misspelling of {loc[-1]!r}?)"
                line_loc = (*prefix, *loc[:-1], typo)
        out.append(Problem(file=file, line=lines.line_for(line_loc), message=message))
    return out
