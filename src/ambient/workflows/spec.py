"""Workflow specs (DESIGN 5): the ``for_each`` form (ADR-027), the ``chain`` form (kernel-orchestrator), exit triggers.

Parses and validates; executes nothing. The engine and the planner consume these frozen models,
the exit-trigger actions parsed from every spelling of the sources, and :func:`spec_issues`.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Final, Literal, NamedTuple, TypeAlias

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    PlainSerializer,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ambient.core.errors import InputError
from ambient.core.problems import Severity
from ambient.core.terminal import control_character, one_line
from ambient.kernel.zones import DEFAULT_RULES, ZoneRule, normalize
from ambient.workflows import templating

# ---------------------------------------------------------------------------------------------
# Vocabulary

Form = Literal["for_each", "chain"]
Status = Literal["active", "draft"]
Mode = Literal["manual", "assisted", "swarm"]
SatelliteType = Literal["code", "brain-write", "test", "deploy", "search", "domain"]
Gate = Literal["0-failures", "human", "never"]
OnTimeout = Literal["reject", "approve", "escalate", "abort"]
RetryOutcome = Literal["error", "fail"]
ResultStatus = Literal["ok", "partial", "failed"]

SATELLITE_TYPES: Final[tuple[str, ...]] = ("code", "brain-write", "test", "deploy", "search", "domain")
DEFAULT_MODE: Final[Mode] = "assisted"
MAX_CONCURRENCY: Final = 256
#: Items of one for_each (README, Workflows): one agent, one claim and one journal line each; a longer list is
#: refused at file:line. 10,000 keeps a file's parse under ~0.5 s and ~20 MB (a 1 MiB list of 350k items took 8 s
#: and 340 MB, issue 25, 10); split a longer list over several workflows.
MAX_ITEMS: Final = 10_000
#: Values (keys, items, scalars) one workflow file may hold: every item plus room for the rest. Counted from the YAML
#: events before any node is built, so a file past it costs what reading this many values costs, no more.
MAX_WORKFLOW_VALUES: Final = 2 * MAX_ITEMS
MAX_ACTION_TEXT: Final = 2000
MAX_MESSAGE: Final = 1000

# Which agent runs a chain step whose `agents:` list is empty (the template's step 1 has `agents: []`):
# the workflow's `default_agents:` first, then the caller's (brain settings), then this table.
DEFAULT_AGENT_BY_TYPE: Final[Mapping[str, str]] = {
    "code": "coder",
    "test": "tester",
    "brain-write": "scribe",
    "deploy": "vps",
    "search": "scout",
    "domain": "orchestrator",
}

# Signals after which the run waits for the person (ESCALATE has its own action kind).
WAITING_SIGNALS: Final = frozenset({"BLOCKED_ON", "BLOCKED", "CIRCUIT_BREAK"})
# Signal words recognised bare, in any case (`error`, `Blocked_On`); any ALL-CAPS word is a signal too.
KNOWN_SIGNALS: Final = frozenset(
    {
        "SPAWN", "RETURN", "BLOCKED_ON", "CHECKPOINT", "HANDOFF", "ESCALATE", "ERROR",  # ADR-026
        "STEP_DONE", "GATE_PENDING", "BLOCKED", "DONE", "CIRCUIT_BREAK", "ABORT", "INFO",  # spec/004
        "ORCHESTRATE", "ADAPT",
    }
)  # fmt: skip

_WORKFLOW_NAME_RE = re.compile(r"(?!\.)[^\s/\\:\x00-\x1f\x7f]{1,128}")
_NUMBER_RE = re.compile(r"[0-9]{1,9}")
_IDENT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_STEP_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
_SIGNAL_RE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
_BRANCH_BAD_RE = re.compile(r"[\s\x00-\x1f\x7f~^:?*\[\\]|\.\.|@\{|^[-/]|/$|\.lock$|^$")
_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_RESERVED_STEPS = frozenset({"next", "next_item", "next-item"})


class WorkflowError(InputError):
    """A workflow document that cannot become a spec; ``loc`` is the key path of the fault."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        loc: tuple[str | int, ...] = (),
        validation: ValidationError | None = None,
    ) -> None:
        self.loc = loc
        self.validation = validation
        super().__init__(message, file=file, line=line)


class ActionError(WorkflowError):
    """An exit-trigger action that is not one of the accepted spellings."""


class Issue(NamedTuple):
    """A finding about a spec beyond its schema, at a key path (the shell maps it to file:line)."""

    loc: tuple[str | int, ...]
    message: str
    severity: Severity = "error"


def spec_hash(raw: bytes) -> str:
    """The sha256 (hex) of a workflow file's bytes: a run is pinned to the spec it started with."""
    return hashlib.sha256(raw).hexdigest()


# ---------------------------------------------------------------------------------------------
# Small value types


def _custom(kind: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(kind, "{message}", {"message": message})


def _check_ident(value: str, what: str = "name") -> str:
    if not _IDENT_RE.fullmatch(value):
        raise _custom(
            "bad_name",
            f"{value!r} is not a valid {what}; expected letters, digits, '_', '.', '-' (no spaces or '/')",
        )
    return value


def _agent_name(value: str) -> str:
    return _check_ident(value, "agent name")


def _principal(value: str) -> str:
    return _check_ident(value, "principal name")


AgentName = Annotated[str, AfterValidator(_agent_name)]
Principal = Annotated[str, AfterValidator(_principal)]

_DURATION_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: object) -> float:
    """Seconds from ``90``, ``2.5``, ``"90s"``, ``"30m"``, ``"1h30m"``, ``"500ms"``, ``"2d"``."""
    if isinstance(value, bool):
        raise _custom("duration", "expected a duration such as 30s, 5m, 1h30m or a number of seconds")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"\d+(?:\.\d+)?", text):
            return float(text)
        pos, total = 0, 0.0
        while pos < len(text):
            m = _DURATION_PART.match(text, pos)
            if m is None:
                break
            total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
            pos = m.end()
        if text and pos == len(text):
            return total
    raise _custom(
        "duration", f"{value!r} is not a duration; expected e.g. 30s, 5m, 1h30m, 500ms, 2d or a number of seconds"
    )


Seconds = Annotated[float, BeforeValidator(parse_duration), Field(gt=0, le=365 * 86400)]


def _as_list(value: object) -> object:
    # `agents: testing` and `files: a.yml` mean a one-element list.
    return [value] if isinstance(value, str) else value


def _none_as_empty_list(value: object) -> object:
    return [] if value is None else _as_list(value)


# ---------------------------------------------------------------------------------------------
# Exit-trigger actions (spec/004 "Gestion des exit triggers", spec/002 v1.7, ADR-027 on_return)


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def __str__(self) -> str:
        return format_action(self)  # type: ignore[arg-type]


def _check_message(value: str | None) -> str | None:
    if value is None:
        return None
    if _CONTROL_RE.search(value):
        raise _custom("invalid", "a message may not contain control characters (newlines included)")
    if len(value) > MAX_MESSAGE:
        raise _custom("invalid", f"a message is at most {MAX_MESSAGE} characters")
    if not value.strip():
        raise _custom("invalid", "a message may not be blank")
    return value


Message = Annotated[str, AfterValidator(_check_message)]


class NextAction(_Action):
    """``trigger:next`` / ``→ next_item``: go on with the next step (chain) or the next item (for_each)."""

    kind: Literal["next"] = "next"


class GotoAction(_Action):
    """``trigger:<step>`` or ``trigger:<workflow>/<step>``: continue at that step (of another workflow)."""

    kind: Literal["goto"] = "goto"
    step: int | str
    workflow: str | None = None


class SpawnAction(_Action):
    """``trigger → type:test scope:brain-engine/``: start a new satellite of that type on that scope (spec/002)."""

    kind: Literal["spawn"] = "spawn"
    satellite_type: SatelliteType
    scope: str | None = None  # None: the scope of the step that triggers it
    agent: AgentName | None = None  # None: the default agent of the type
    story_angle: Message | None = None


class SignalAction(_Action):
    """``signal:<TYPE>`` / ``signal → CHECKPOINT pilote`` / bare ``ERROR``: emit a signal (to the pilot by default)."""

    kind: Literal["signal"] = "signal"
    signal: str
    to: Principal | None = None
    message: Message | None = None

    @property
    def waits(self) -> bool:
        """BLOCKED_ON (and BLOCKED, CIRCUIT_BREAK) suspend the run until the person answers."""
        return self.signal in WAITING_SIGNALS


class EscalateAction(_Action):
    """``ESCALATE pilote`` / ``signal:ESCALATE``: persist an escalation and wait for the person's decision."""

    kind: Literal["escalate"] = "escalate"
    to: Principal | None = None
    message: Message | None = None


class GateAction(_Action):
    """``gate:human → "msg"``: pause until approved; approve goes on, reject aborts (signal ABORT)."""

    kind: Literal["gate"] = "gate"
    message: Message | None = None


class NotifyAction(_Action):
    """``notify:<msg>``: information for the person (signal INFO); never blocks."""

    kind: Literal["notify"] = "notify"
    message: Message


class AbortAction(_Action):
    """``abort``: stop the chain or the run and signal ABORT to the pilot."""

    kind: Literal["abort"] = "abort"
    message: Message | None = None


class LogAction(_Action):
    """``log`` (ADR-027 ``ERROR + log + ...``): record the outcome in the run's journal, prominently."""

    kind: Literal["log"] = "log"
    message: Message | None = None


Action: TypeAlias = Annotated[
    NextAction
    | GotoAction
    | SpawnAction
    | SignalAction
    | EscalateAction
    | GateAction
    | NotifyAction
    | AbortAction
    | LogAction,
    Field(discriminator="kind"),
]
ACTION_KINDS: Final = ("next", "goto", "spawn", "signal", "escalate", "gate", "notify", "abort", "log")

_EXPECTED = (
    "expected one of: trigger:next, trigger:<step>, trigger:<workflow>/<step>, "
    "trigger → type:<type> scope:<path>, signal:<TYPE> [recipient], signal → <TYPE> [recipient], "
    'gate:human → "<message>", notify:<message>, abort, log, → next_item, → ESCALATE pilote, '
    "several joined with ' + ' (→ ERROR + log + ESCALATE pilote)"
)
_ARROW_RE = re.compile(r"\s*(?:→|->)\s*")
_LEAD_ARROW_RE = re.compile(r"^(?:→|->)\s*")
_WORD_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:-[A-Za-z0-9_]+)*")
_KV_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*)\s*:\s*")


def _fail(text: str, why: str) -> ActionError:
    return ActionError(f"bad exit-trigger action {text!r}: {why}; {_EXPECTED}")


def _read_quoted(text: str, start: int, whole: str) -> tuple[str, int]:
    """The quoted string at ``text[start]`` (a quote) and the index after it. Double quotes take \\" and \\\\."""
    quote = text[start]
    out: list[str] = []
    i = start + 1
    while i < len(text):
        ch = text[i]
        if quote == '"' and ch == "\\" and i + 1 < len(text) and text[i + 1] in '"\\':
            out.append(text[i + 1])
            i += 2
            continue
        if ch == quote:
            return "".join(out), i + 1
        out.append(ch)
        i += 1
    raise _fail(whole, f"unclosed {quote} quote")


def _opens_quote(text: str, i: int) -> bool:
    # A quote opens a string only at the start of a token, so "l'étape 2" stays plain text.
    return text[i] in "\"'" and (i == 0 or text[i - 1].isspace() or text[i - 1] in ":>→")


def _split_plus(text: str) -> list[str]:
    """Split on `` + `` (whitespace around it) outside quotes: ``ERROR + log + ESCALATE pilote``."""
    parts: list[str] = []
    start, i = 0, 0
    while i < len(text):
        if _opens_quote(text, i):
            _, i = _read_quoted(text, i, text)
            continue
        if text[i] == "+" and 0 < i < len(text) - 1 and text[i - 1].isspace() and text[i + 1].isspace():
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return parts


def _message(text: str, whole: str) -> str | None:
    """A message: the quoted string, or the plain text; None when empty."""
    text = text.strip()
    if not text:
        return None
    if text[0] in "\"'":
        value, end = _read_quoted(text, 0, whole)
        if text[end:].strip():
            raise _fail(whole, f"unexpected text after the closing quote: {text[end:].strip()!r}")
        return value if value.strip() else None
    return text


def _head(rest: str, whole: str) -> tuple[str | None, str]:
    """Separate the separator after a verb (``:``, an arrow, a space, nothing) from its argument."""
    stripped = rest.lstrip()
    if not stripped:
        return None, ""
    if stripped[0] == ":":
        return ":", stripped[1:].strip()
    for arrow in ("→", "->"):
        if stripped.startswith(arrow):
            return "→", stripped[len(arrow) :].strip()
    if stripped != rest:
        return " ", stripped.strip()
    raise _fail(whole, f"unexpected {rest[0]!r} after the action word")


def _step_ref(token: str, whole: str) -> int | str:
    if _NUMBER_RE.fullmatch(token):
        return int(token)
    if not _STEP_NAME_RE.fullmatch(token):
        raise _fail(whole, f"{token!r} is not a step number or name")
    return token


def _parse_target(arg: str, whole: str) -> NextAction | GotoAction:
    if not arg or any(c.isspace() for c in arg):
        raise _fail(whole, "trigger needs one target (next, a step, or workflow/step)")
    if arg.lower() in _RESERVED_STEPS:
        return NextAction()
    workflow: str | None = None
    step_text = arg
    if "/" in arg:
        workflow, _, step_text = arg.rpartition("/")
        if not _WORKFLOW_NAME_RE.fullmatch(workflow):
            raise _fail(whole, f"{workflow!r} is not a workflow name")
    return GotoAction(step=_step_ref(step_text, whole), workflow=workflow)


def _parse_spawn(arg: str, whole: str) -> SpawnAction:
    fields: dict[str, str] = {}
    pos = 0
    while pos < len(arg):
        while pos < len(arg) and arg[pos].isspace():
            pos += 1
        if pos >= len(arg):
            break
        m = _KV_RE.match(arg, pos)
        if m is None:
            raise _fail(whole, f"expected key:value pairs (type:, scope:, agent:, story_angle:) at {arg[pos:]!r}")
        key = m.group(1)
        pos = m.end()
        if pos < len(arg) and arg[pos] in "\"'":
            value, pos = _read_quoted(arg, pos, whole)
        else:
            end = pos
            while end < len(arg) and not arg[end].isspace():
                end += 1
            value, pos = arg[pos:end], end
        if key not in ("type", "scope", "agent", "story_angle"):
            raise _fail(
                whole, f"unknown key {key!r} in a satellite trigger; expected type:, scope:, agent:, story_angle:"
            )
        if key in fields:
            raise _fail(whole, f"{key}: given twice")
        if not value:
            raise _fail(whole, f"{key}: has no value")
        fields[key] = value
    if "type" not in fields:
        raise _fail(whole, "a satellite trigger needs type:<code|brain-write|test|deploy|search|domain>")
    if fields["type"] not in SATELLITE_TYPES:
        raise _fail(whole, f"type:{fields['type']} is not a satellite type ({', '.join(SATELLITE_TYPES)})")
    scope = fields.get("scope")
    if scope is not None:
        scope = _check_scope_text(scope, lambda why: _fail(whole, why))
    return SpawnAction.model_validate(
        {"satellite_type": fields["type"], "scope": scope, "agent": fields.get("agent"),
         "story_angle": fields.get("story_angle")}
    )  # fmt: skip


_SIGNAL_ARG_RE = re.compile(r"([A-Za-z][A-Za-z0-9_]*)(?:\s+([A-Za-z0-9_][A-Za-z0-9_.-]*))?(?:\s+(.*))?")


def _parse_signal(arg: str, whole: str) -> SignalAction | EscalateAction:
    m = _SIGNAL_ARG_RE.fullmatch(arg)
    if m is None:
        raise _fail(whole, 'a signal is written <TYPE> [recipient] ["message"], e.g. signal → CHECKPOINT pilote')
    name = m.group(1).upper()
    if not _SIGNAL_RE.fullmatch(name):
        raise _fail(whole, f"{m.group(1)!r} is not a signal name")
    message = _message(m.group(3) or "", whole)
    if name == "ESCALATE":
        return EscalateAction(to=m.group(2), message=message)
    return SignalAction(signal=name, to=m.group(2), message=message)


def _parse_gate(sep: str | None, arg: str, whole: str) -> GateAction:
    if sep not in (":", " ") or not arg:
        raise _fail(whole, 'a gate action is written gate:human → "message"')
    m = re.match(r"[A-Za-z0-9_-]+", arg)
    kind = m.group() if m else ""
    if kind.lower() != "human":
        raise _fail(
            whole,
            f"gate:{kind or arg} is not an action; only gate:human pauses for the person "
            "(0-failures and never belong in a step's gate: field)",
        )
    rest = arg[len(kind) :]
    am = _ARROW_RE.match(rest)
    if am and am.group().strip():
        rest = rest[am.end() :]
    elif rest and not rest[0].isspace():
        raise _fail(whole, f"unexpected {rest[0]!r} after gate:human")
    return GateAction(message=_message(rest, whole))


def _parse_one(part: str, whole: str) -> Action:
    text = _LEAD_ARROW_RE.sub("", part.strip(), count=1).strip()
    if not text:
        raise _fail(whole, "empty action")
    m = _WORD_RE.match(text)
    if m is None:
        raise _fail(whole, f"{text!r} does not start with an action word")
    word = m.group()
    low = word.lower()
    sep, arg = _head(text[m.end() :], whole)
    if low == "trigger":
        if not arg:
            raise _fail(whole, "trigger needs a target")
        if _KV_RE.match(arg):  # key:value pairs start a satellite (spec/002 claim form)
            return _parse_spawn(arg, whole)
        return _parse_target(arg, whole)
    if low == "signal":
        if not arg:
            raise _fail(whole, "signal needs a type, e.g. signal:BLOCKED_ON")
        return _parse_signal(arg, whole)
    if low == "gate":
        return _parse_gate(sep, arg, whole)
    if low == "notify":
        message = _message(arg, whole)
        if message is None:
            raise _fail(whole, "notify needs a message, e.g. notify:deploy done")
        return NotifyAction(message=message)
    if low in ("abort", "log"):
        if sep == " ":
            raise _fail(whole, f'{low} takes its message after ":" or an arrow: {low} → "why"')
        message = _message(arg, whole)
        return AbortAction(message=message) if low == "abort" else LogAction(message=message)
    if low in _RESERVED_STEPS:
        if arg:
            raise _fail(whole, f"{word} takes no argument")
        return NextAction()
    if low == "escalate" or low.upper() in KNOWN_SIGNALS or (word.isupper() and _SIGNAL_RE.fullmatch(word)):
        if sep in (":", "→"):
            raise _fail(whole, f"write a bare signal as {word.upper()} [recipient], or signal:{word.upper()}")
        return _parse_signal(f"{word} {arg}".strip(), whole)
    raise _fail(whole, f"unknown action {word!r}")


def parse_actions(text: object) -> tuple[Action, ...]:
    """Parse an exit trigger into its actions, in order; a YAML list of action strings is accepted too.

    Raises :class:`ActionError` (and nothing else) for anything that is not an accepted spelling.
    """
    if isinstance(text, list | tuple):
        if not text:
            raise ActionError(f"an empty list is not an exit trigger; {_EXPECTED}")
        out: list[Action] = []
        for element in text:
            out.extend(parse_actions(element))
        return tuple(out)
    if not isinstance(text, str):
        raise ActionError(f"an exit trigger is text, got {type(text).__name__} ({text!r:.60}); {_EXPECTED}")
    whole = text.strip()
    if not whole:
        raise ActionError(f"an exit trigger may not be empty; {_EXPECTED}")
    if len(whole) > MAX_ACTION_TEXT:
        raise ActionError(f"an exit trigger is at most {MAX_ACTION_TEXT} characters")
    if _CONTROL_RE.search(whole):
        raise _fail(whole, "it contains a control character")
    try:
        return tuple(_parse_one(part, whole) for part in _split_plus(whole))
    except ValidationError as exc:  # a field rule of an action model (e.g. a blank story_angle)
        raise _fail(whole, exc.errors(include_url=False)[0]["msg"]) from None


def parse_action(text: object) -> Action:
    """Parse one action; a sequence (``a + b``) is refused here: use :func:`parse_actions`."""
    actions = parse_actions(text)
    if len(actions) != 1:
        raise ActionError(f"expected a single action, got {len(actions)} in {text!r}; use parse_actions for sequences")
    return actions[0]


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _bare_or_quoted(value: str) -> str:
    plain = value and not any(c.isspace() or c in "\"'+\\" for c in value) and value[0] not in "→-"
    return value if plain else _quote(value)


def format_action(action: Action) -> str:
    """The canonical spelling of an action; :func:`parse_action` reads it back to an equal action."""
    if isinstance(action, NextAction):
        return "trigger:next"
    if isinstance(action, GotoAction):
        prefix = f"{action.workflow}/" if action.workflow else ""
        return f"trigger:{prefix}{action.step}"
    if isinstance(action, SpawnAction):
        parts = [f"type:{action.satellite_type}"]
        if action.scope is not None:
            parts.append(f"scope:{_bare_or_quoted(action.scope)}")
        if action.agent is not None:
            parts.append(f"agent:{action.agent}")
        if action.story_angle is not None:
            parts.append(f"story_angle:{_quote(action.story_angle)}")
        return "trigger → " + " ".join(parts)
    if isinstance(action, SignalAction | EscalateAction):
        name = "ESCALATE" if isinstance(action, EscalateAction) else action.signal
        text = f"signal:{name}" + (f" {action.to}" if action.to else "")
        return text + (f" {_quote(action.message)}" if action.message else "")
    if isinstance(action, GateAction):
        return "gate:human" + (f" → {_quote(action.message)}" if action.message else "")
    if isinstance(action, NotifyAction):
        return f"notify:{_quote(action.message)}"
    word = "abort" if isinstance(action, AbortAction) else "log"
    return word + (f" → {_quote(action.message)}" if action.message else "")


def format_actions(actions: Iterable[Action]) -> str:
    """The canonical spelling of a sequence: actions joined with `` + ``."""
    return " + ".join(format_action(a) for a in actions)


def _coerce_actions(value: object) -> object:
    if value is None:
        return None
    if isinstance(value, tuple) and all(isinstance(a, _Action) for a in value):
        return value
    try:
        return parse_actions(value)
    except ActionError as exc:
        raise _custom("exit_trigger", exc.message) from None


ActionSeq: TypeAlias = Annotated[
    tuple[Action, ...],
    BeforeValidator(_coerce_actions),
    PlainSerializer(format_actions, return_type=str),
]


def _check_scope_text(value: str, error: Any) -> str:
    """A scope path or path template: templates are checked for syntax, literal paths normalised."""
    if not value.strip():
        raise error("a scope path may not be empty")
    if templating.has_variables(value):
        try:
            templating.variables(value)
        except templating.TemplateError as exc:
            raise error(exc.message) from None
        return value
    try:
        return normalize(value) or value
    except InputError as exc:
        raise error(exc.message) from None


def _scope_field(value: str) -> str:
    return _check_scope_text(value, lambda why: _custom("scope", why))


def _template_field(value: str) -> str:
    try:
        templating.variables(value)
    except templating.TemplateError as exc:
        raise _custom("template", exc.message) from None
    return value


ScopePath = Annotated[str, AfterValidator(_scope_field)]
TemplateText = Annotated[str, AfterValidator(_template_field)]


# ---------------------------------------------------------------------------------------------
# Parts shared by both forms


class _UserModel(BaseModel):
    # Workflow files belong to the user: unknown keys are kept (and typos flagged by spec_issues).
    model_config = ConfigDict(extra="allow", frozen=True)


class _Strict(BaseModel):
    # Small blocks whose every key changes behaviour: a typo here would silently change the run.
    model_config = ConfigDict(extra="forbid", frozen=True)


class RetryPolicy(_Strict):
    """How often an item or step is tried again before a failure counts (toward escalation or the breaker)."""

    attempts: int = Field(default=1, ge=1, le=100)  # total tries, the first included; 1 = never retry
    backoff: Seconds = 1.0  # delay before the first retry; doubles each time
    max_backoff: Seconds = 60.0
    jitter: bool = True  # full jitter: the delay is drawn uniformly in [0, delay]
    on: tuple[RetryOutcome, ...] = ("error",)  # outcomes retried: error (crash, timeout, bad output), fail

    @model_validator(mode="before")
    @classmethod
    def _yaml_on_key(cls, data: Any) -> Any:
        # YAML 1.1 reads the key `on:` as the boolean true.
        if isinstance(data, Mapping) and True in data:
            data = {("on" if k is True else k): v for k, v in data.items()}
        return data

    @field_validator("on", mode="before")
    @classmethod
    def _on_list(cls, value: Any) -> Any:
        return _as_list(value)

    @model_validator(mode="after")
    def _bounds(self) -> RetryPolicy:
        if self.max_backoff < self.backoff:
            raise _custom("invalid", f"max_backoff ({self.max_backoff}s) is shorter than backoff ({self.backoff}s)")
        return self

    def retries(self, outcome: str) -> bool:
        """Whether this outcome is retried at all."""
        return outcome in self.on

    def delay(self, failures: int, rand: float) -> float:
        """Seconds to wait after the ``failures``-th failure; ``rand`` in [0, 1) drives the jitter."""
        ceiling = min(self.max_backoff, self.backoff * 2.0 ** min(max(0, failures - 1), 60))
        return ceiling * rand if self.jitter else ceiling


class Schedule(_Strict):
    """Start a new run every ``every`` (e.g. ``schedule: {every: 1h}``); a run still going is not doubled."""

    every: Annotated[float, BeforeValidator(parse_duration), Field(ge=1, le=365 * 86400)]

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        # `schedule: 1h` and `schedule: every 1h` are short for `schedule: {every: 1h}`.
        if isinstance(data, str | int | float) and not isinstance(data, bool):
            text = str(data).strip()
            return {"every": text[len("every") :].strip() if text.startswith("every") else text}
        return data


class OnEscalate(_Strict):
    """How the escalations and human gates of this workflow reach the person and how long they wait."""

    notify: list[str] = Field(default_factory=list)  # channel names (telegram, brain-ui...); [] = all configured
    wait: Literal["human_decision"] = "human_decision"
    options: list[Annotated[str, AfterValidator(_check_ident)]] = Field(default_factory=list)  # [] = engine's
    timeout: Seconds | None = None  # None: wait for the person as long as it takes
    on_timeout: OnTimeout = "reject"  # never approve silently unless the file says so
    remind_before: Seconds | None = None  # send a reminder this long before the timeout

    @field_validator("notify", mode="before")
    @classmethod
    def _notify_list(cls, value: Any) -> Any:
        return _none_as_empty_list(value)

    @model_validator(mode="after")
    def _reminder(self) -> OnEscalate:
        if self.remind_before is not None:
            if self.timeout is None:
                raise _custom("invalid", "remind_before needs a timeout to count back from")
            if self.remind_before >= self.timeout:
                raise _custom(
                    "invalid", f"remind_before ({self.remind_before}s) must be shorter than timeout ({self.timeout}s)"
                )
        if len(set(self.options)) != len(self.options):
            raise _custom("invalid", "options has the same option twice")
        return self


class OnComplete(_Strict):
    """The packet sent when the run is complete (ADR-027 ``on_complete``); ``to`` defaults to the supervisor."""

    signal: str = "RETURN"
    to: Principal | None = None
    payload: dict[str, JsonValue] = Field(default_factory=dict)

    @field_validator("signal")
    @classmethod
    def _signal_name(cls, value: str) -> str:
        name = value.upper()
        if not _SIGNAL_RE.fullmatch(name):
            raise _custom("invalid", f"{value!r} is not a signal name")
        return name

    @model_validator(mode="after")
    def _payload_allowed(self) -> OnComplete:
        # DESIGN 2.2: a RETURN carries payload.result only, never the source context.
        if self.signal == "RETURN":
            extra = sorted(set(self.payload) - {"result"})
            if extra:
                raise _custom("invalid", f"a RETURN payload carries result only; remove {', '.join(extra)}")
        _check_templates_in(self.payload)
        return self


def _check_templates_in(value: Any) -> None:
    if isinstance(value, str):
        try:
            templating.variables(value)
        except templating.TemplateError as exc:
            raise _custom("invalid", exc.message) from None
    elif isinstance(value, Mapping):
        for v in value.values():
            _check_templates_in(v)
    elif isinstance(value, list):
        for v in value:
            _check_templates_in(v)


def _check_branch(value: str | None) -> str | None:
    # The branch reaches `git` as an argv element: refuse what git refuses and anything option-like.
    if value is not None and _BRANCH_BAD_RE.search(value):
        raise _custom(
            "invalid", f"{value!r} is not a usable git branch name (no spaces, '..', '~^:?*[\\', leading '-')"
        )
    return value


class _WorkflowBase(_UserModel):
    """Keys common to both forms."""

    name: str
    description: str | None = None
    status: Status = "active"  # draft: validated, never started by itself (file, schedule); `ambient start` runs it
    mode: Mode = DEFAULT_MODE
    branch: Annotated[str | None, AfterValidator(_check_branch)] = None  # theme branch (also `theme_branch:`)
    pilote: str | None = None  # sess-id of the pilot session, filled at launch
    swarm_ready: bool = False
    supervisor: Principal = "human"  # receives STEP_DONE, GATE_PENDING, DONE, CIRCUIT_BREAK...
    sender: Principal = "ambient"  # the principal whose SPAWNs start the agents
    timeout: Seconds | None = None  # per agent execution (an item attempt or a step); None: the runner's
    retry: RetryPolicy | None = None  # None: the daemon's default policy
    schedule: Schedule | None = None
    on_complete: OnComplete | None = None
    on_escalate: OnEscalate = Field(default_factory=OnEscalate)

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        # ADR-027 writes `workflow:`, the chain template `name:`; claims say `theme_branch`, workflows `branch`.
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        for alias, field in (("workflow", "name"), ("theme_branch", "branch")):
            if alias in data:
                value = data.pop(alias)
                if field in data and data[field] != value:
                    raise _custom(
                        "invalid", f"{alias}: {value!r} and {field}: {data[field]!r} disagree; keep one of them"
                    )
                data[field] = value
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _WORKFLOW_NAME_RE.fullmatch(value):
            raise _custom(
                "invalid", f"{value!r} is not a workflow name; expected up to 128 characters without spaces or '/'"
            )
        return value

    @field_validator("pilote", "description", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        return None if value is None else str(value) if isinstance(value, int | float) else value

    @property
    def runnable(self) -> bool:
        """False for drafts: they are validated but never run."""
        return self.status == "active"


# ---------------------------------------------------------------------------------------------
# for_each (ADR-027)


class ScopeSpec(_Strict):
    """A SPAWN scope: ``files`` are path templates (``{{item}}``), ``zone`` is inferred from them when absent.

    No files: the agents take no locks (work that writes nothing in the brain: calls, research, a SPAWN of
    ``ambient send`` without files)."""

    zone: str | None = None
    files: list[ScopePath] = Field(default_factory=list)

    @field_validator("files", mode="before")
    @classmethod
    def _files_list(cls, value: Any) -> Any:
        return _as_list(value)


class OnReturn(_Strict):
    """What each RETURN of an item leads to (ADR-027); the defaults are the ADR's own spelling."""

    success: ActionSeq = (NextAction(),)
    fail: ActionSeq = (EscalateAction(to="pilote"),)
    error: ActionSeq = (SignalAction(signal="ERROR"), LogAction(), EscalateAction(to="pilote"))
    escalate: ActionSeq | None = None  # the agent itself answered ESCALATE (None: escalate to the pilot)
    blocked: ActionSeq | None = None  # the agent answered BLOCKED_ON (None: wait for the pilot)


def _item_text(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, Mapping | list):
        raise _custom(
            "item",
            f'an item is a name or a number, got {value!r:.60}; quote it if you mean text ("yes", "null")',
        )
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str) and (bad := control_character(value)) is not None:
        # An item names files, a claim, AMBIENT_ITEM and a line of every one-line view: it stays on one line.
        raise _custom(
            "item",
            f"item '{one_line(value)[:60]}' contains the control character {bad}; an item is a one-line name",
        )
    return value


class ForEach(_UserModel):
    """The ``for_each:`` block: one SPAWN of ``spawn`` per item, at most ``concurrency`` at once."""

    items: list[Annotated[str, BeforeValidator(_item_text), Field(min_length=1, max_length=255)]] = Field(
        min_length=1, max_length=MAX_ITEMS
    )
    spawn: AgentName
    scope: ScopeSpec = Field(default_factory=ScopeSpec)
    context: dict[str, JsonValue] = Field(default_factory=dict)  # SPAWN payload.context, templated per item
    on_return: OnReturn = Field(default_factory=OnReturn)
    # Agents of this run at once; None: as many as the daemon-wide cap (`concurrency:` in profil/ambient.yml) allows.
    concurrency: int | None = Field(default=None, ge=1, le=MAX_CONCURRENCY)

    @field_validator("context")
    @classmethod
    def _context_templates(cls, value: dict[str, JsonValue]) -> dict[str, JsonValue]:
        _check_templates_in(value)
        return value


class ForEachWorkflow(_WorkflowBase):
    """ADR-027 fan-out: the same agent over a list of items."""

    for_each: ForEach

    @property
    def form(self) -> Form:
        """``for_each``."""
        return "for_each"


# ---------------------------------------------------------------------------------------------
# chain (kernel-orchestrator)


def _step_id(value: Any) -> Any:
    if isinstance(value, bool):
        raise _custom("step", "a step is a number or a name")
    if isinstance(value, int) and value < 0:
        raise _custom("step", f"step {value} is negative; expected a number from 0, or a name")
    if isinstance(value, str) and _NUMBER_RE.fullmatch(value):
        return int(value)
    if isinstance(value, str):
        if value.lower() in _RESERVED_STEPS:
            raise _custom("step", f"{value!r} is reserved (trigger:next); choose another step name")
        if not _STEP_NAME_RE.fullmatch(value):
            raise _custom("step", f"{value!r} is not a step name; expected a number or letters, digits, '_', '.', '-'")
    return value


StepId = Annotated[int | str, Field(union_mode="left_to_right"), BeforeValidator(_step_id)]


class ChainStep(_UserModel):
    """One satellite of a chain; becomes one step claim (``sess-...-<theme>-step-N``)."""

    step: StepId
    type: SatelliteType
    scope: ScopePath
    story_angle: TemplateText = ""
    agents: list[AgentName] = Field(default_factory=list)  # the first runs the step; the others are context
    gate: Gate | None = None  # absent: proceed if ok; 0-failures; human (before the step); never (terminal)
    # What each result leads to: ambient.engine.planner.exit_actions (defaults) and exit_route (where the chain goes).
    on_done: ActionSeq | None = None  # result.status = ok (default: trigger:next)
    on_partial: ActionSeq | None = None  # partial (falls back to on_done)
    on_fail: ActionSeq | None = None  # failed (default: signal:BLOCKED_ON pilote)
    input_contract: TemplateText | None = None  # what the step receives from the previous one (prior_output)
    retry: RetryPolicy | None = None  # None: the workflow's
    timeout: Seconds | None = None  # None: the workflow's

    @field_validator("agents", mode="before")
    @classmethod
    def _agents_list(cls, value: Any) -> Any:
        return _none_as_empty_list(value)

    @field_validator("story_angle", mode="before")
    @classmethod
    def _angle(cls, value: Any) -> Any:
        return "" if value is None else value

    @property
    def key(self) -> str:
        """The step's id as text (claims say ``workflow_step: 3``)."""
        return str(self.step)


class ChainWorkflow(_WorkflowBase):
    """kernel-orchestrator chain: ordered typed steps, gates and exit triggers."""

    chain: list[ChainStep] = Field(min_length=1)
    default_agents: dict[SatelliteType, AgentName] = Field(default_factory=dict)

    @property
    def form(self) -> Form:
        """``chain``."""
        return "chain"

    def index_of(self, ref: int | str) -> int:
        """The list index of step ``ref`` (its number or name); KeyError if there is none."""
        for i, step in enumerate(self.chain):
            if step.step == ref or step.key == str(ref):
                return i
        raise KeyError(ref)

    def step_named(self, ref: int | str) -> ChainStep:
        """The step ``ref``; KeyError if there is none."""
        return self.chain[self.index_of(ref)]

    def next_index(self, index: int) -> int | None:
        """The index after ``index``, or None at the end of the chain."""
        return index + 1 if index + 1 < len(self.chain) else None

    def agent_for(self, step: ChainStep, defaults: Mapping[str, str] | None = None) -> str:
        """The agent that runs ``step``: its first ``agents:`` entry, else :meth:`agent_for_type`."""
        return step.agents[0] if step.agents else self.agent_for_type(step.type, defaults)

    def agent_for_type(self, satellite_type: str, defaults: Mapping[str, str] | None = None) -> str:
        """The default agent of a satellite type: ``default_agents:`` of the workflow, else ``defaults``
        (brain settings), else :data:`DEFAULT_AGENT_BY_TYPE`."""
        if satellite_type in self.default_agents:
            return self.default_agents[satellite_type]
        if defaults and satellite_type in defaults:
            return defaults[satellite_type]
        return DEFAULT_AGENT_BY_TYPE[satellite_type]

    def agent_for_spawn(self, action: SpawnAction, defaults: Mapping[str, str] | None = None) -> str:
        """The agent of a ``trigger → type:... scope:...`` satellite: its ``agent:``, else the type's default."""
        return action.agent or self.agent_for_type(action.satellite_type, defaults)

    def retry_for(self, step: ChainStep) -> RetryPolicy | None:
        """The step's retry policy, else the workflow's (None: the daemon's default)."""
        return step.retry or self.retry

    def timeout_for(self, step: ChainStep) -> float | None:
        """The step's timeout, else the workflow's (None: the runner's)."""
        return step.timeout or self.timeout


WorkflowSpec: TypeAlias = ForEachWorkflow | ChainWorkflow


def detect_form(data: Mapping[str, Any]) -> Form:
    """The form of a workflow document: it has a ``for_each:`` key (ADR-027) or a ``chain:`` key, never both."""
    has_each, has_chain = "for_each" in data, "chain" in data
    if has_each and has_chain:
        raise WorkflowError("has both for_each: and chain:; a workflow is one form or the other", loc=("chain",))
    if has_each:
        return "for_each"
    if has_chain:
        return "chain"
    hint = ""
    for key in data:
        if key in ("steps", "items", "spawn"):
            hint = f" ({key}: goes under {_MISPLACED[key].split('.')[0]}:)"
        elif isinstance(key, str) and difflib.get_close_matches(key, ["for_each", "chain"], n=1, cutoff=0.6):
            hint = f" (is {key!r} a misspelling?)"
    raise WorkflowError(
        "has neither a for_each: block (one agent over a list of items, ADR-027) nor a chain: list "
        f"(ordered steps, kernel-orchestrator){hint}; expected one of them"
    )


def parse_workflow(data: Any) -> WorkflowSpec:
    """Validate a workflow document (a mapping) into its spec.

    Raises :class:`WorkflowError`; for schema errors ``.validation`` holds the pydantic error, whose
    locations the shell maps to lines.
    """
    if not isinstance(data, Mapping):
        kind = "empty" if data is None else type(data).__name__
        raise WorkflowError(f"a workflow must be a YAML mapping (key: value), got {kind}")
    bad_keys = [k for k in data if not isinstance(k, str)]
    if bad_keys:
        raise WorkflowError(f"top-level key {bad_keys[0]!r} is not text; quote it")
    model: type[ForEachWorkflow] | type[ChainWorkflow] = (
        ForEachWorkflow if detect_form(data) == "for_each" else ChainWorkflow
    )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "(document)"
        raise WorkflowError(
            f"{where}: {first['msg']}" + (f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""),
            loc=tuple(p for p in first["loc"] if isinstance(p, str | int)),
            validation=exc,
        ) from None


# ---------------------------------------------------------------------------------------------
# Checks beyond the schema (pure; the shell adds agents, the access matrix and lines)

_MISPLACED: Final[Mapping[str, str]] = {
    "items": "for_each.items",
    "spawn": "for_each.spawn",
    "scope": "for_each.scope",
    "context": "for_each.context",
    "on_return": "for_each.on_return",
    "concurrency": "for_each.concurrency",
    "on_timeout": "on_escalate.on_timeout",
    "remind_before": "on_escalate.remind_before",
    "notify": "on_escalate.notify",
    "options": "on_escalate.options",
    "execution_mode": "mode",
    "steps": "chain",
}


def _known_keys(model: type[BaseModel], aliases: Iterable[str] = ()) -> list[str]:
    return [*model.model_fields, *aliases]


def _typo_issues(
    extra: Mapping[str, Any] | None, known: Sequence[str], loc: tuple[str | int, ...], *, strict: str | None = None
) -> list[Issue]:
    """Unknown keys: warnings for those that look like a known key or belong in another block (the top level keeps
    free keys such as ``note:``); with ``strict`` (the block's name), every unknown key is an error, since each key
    of that block changes how the work runs: ``gaet: human`` would run a deploy without its human gate."""
    candidates = {k: k for k in known}
    if not loc:  # top level: keys of the blocks below, written one level too high
        candidates.update({k: dest for k, dest in _MISPLACED.items() if dest.split(".")[0] in known})
    out: list[Issue] = []
    for key in extra or {}:
        if key in candidates:
            hint: str | None = candidates[key]
        else:
            close = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.75)
            hint = candidates[close[0]] if close else None
        if strict is not None:
            guess = f"did you mean {hint!r}? " if hint else ""
            out.append(
                Issue(
                    (*loc, key),
                    f"unknown key {key!r} in {strict}: {guess}every key of {strict} changes "
                    f"how it runs, so an unknown one is refused; its keys: {', '.join(known)}",
                )
            )
        elif hint is not None:
            out.append(
                Issue((*loc, key), f"unknown key {key!r} is kept but not used; did you mean {hint!r}?", "warning")
            )
    return out


def raw_key_issues(data: Mapping[str, Any]) -> list[Issue]:
    """The unknown keys of ``for_each:`` and of each chain step, read from the document itself: a file whose schema
    fails elsewhere (``type: tset``) has its misspelt keys (``gaet: human``) named at once, not after the first fix.
    """
    out: list[Issue] = []
    fe = data.get("for_each")
    if isinstance(fe, Mapping):
        extra = {k: v for k, v in fe.items() if k not in ForEach.model_fields}
        out += _typo_issues(extra, _known_keys(ForEach), ("for_each",), strict="for_each")
    chain = data.get("chain")
    for i, step in enumerate(chain if isinstance(chain, list) else ()):
        if isinstance(step, Mapping):
            extra = {k: v for k, v in step.items() if k not in ChainStep.model_fields}
            out += _typo_issues(extra, _known_keys(ChainStep), ("chain", i), strict=f"step {step.get('step', i + 1)}")
    return out


def _check_vars(text: str, allowed: frozenset[str], loc: tuple[str | int, ...], where: str) -> list[Issue]:
    try:
        unknown = sorted(templating.roots(text) - allowed)
    except templating.TemplateError as exc:
        return [Issue(loc, exc.message)]
    if unknown:
        names = ", ".join("{{" + n + "}}" for n in sorted(allowed))
        return [Issue(loc, f"unknown template variable {{{{{unknown[0]}}}}} in {where}; available here: {names}")]
    return []


def _vars_in(value: Any, allowed: frozenset[str], loc: tuple[str | int, ...], where: str) -> list[Issue]:
    if isinstance(value, str):
        return _check_vars(value, allowed, loc, where) if templating.has_variables(value) else []
    if isinstance(value, Mapping):
        return [i for k, v in value.items() for i in _vars_in(v, allowed, (*loc, k), where)]
    if isinstance(value, list):
        return [i for n, v in enumerate(value) for i in _vars_in(v, allowed, (*loc, n), where)]
    return []


def item_values(spec: ForEachWorkflow, index: int, run_id: str = "run") -> dict[str, Any]:
    """The template variables of item ``index`` (``{{item}}``, ``{{index}}`` from 1, ``{{total}}``...)."""
    items = spec.for_each.items
    return templating.item_values(
        item=items[index], index=index + 1, total=len(items), workflow=spec.name, run_id=run_id
    )


class ItemScope(NamedTuple):
    """The SPAWN scope of one item: its zone (None: no zone, no files) and its rendered, normalised files."""

    zone: str | None
    files: tuple[str, ...]


def item_scope(
    spec: ForEachWorkflow, index: int, run_id: str = "run", zone_rules: Iterable[ZoneRule] = DEFAULT_RULES
) -> ItemScope:
    """Render the scope of item ``index``; raises UnsafePathError/TemplateError (an InputError) for a bad path.

    The zone is ``scope.zone`` when declared, else the zone of the first file (the access matrix
    checks the zone of every file anyway).
    """
    values = item_values(spec, index, run_id)
    rendered = [templating.render_path(f, values, zone_rules) for f in spec.for_each.scope.files]
    zone = spec.for_each.scope.zone or (rendered[0].zone if rendered else None)
    return ItemScope(zone, tuple(r.path for r in rendered))


def item_context(spec: ForEachWorkflow, index: int, run_id: str = "run") -> dict[str, Any]:
    """The SPAWN ``payload.context`` of item ``index``: ``for_each.context`` with its strings rendered."""
    rendered: dict[str, Any] = templating.render_value(spec.for_each.context, item_values(spec, index, run_id))
    return rendered


def step_values(spec: ChainWorkflow, step: ChainStep, run_id: str = "run", prior: Any = None) -> dict[str, Any]:
    """The template variables of a chain step; ``prior`` is the previous step's output (``{{prior.result...}}``)."""
    return templating.step_values(
        workflow=spec.name,
        step=step.key,
        run_id=run_id,
        prior=prior,
        branch=spec.branch or "",
        pilote=spec.pilote or "",
    )


def _for_each_issues(spec: ForEachWorkflow, rules: tuple[ZoneRule, ...]) -> list[Issue]:
    fe = spec.for_each
    out: list[Issue] = []
    out += _typo_issues(fe.model_extra, _known_keys(ForEach), ("for_each",), strict="for_each")
    seen: dict[str, int] = {}
    for i, item in enumerate(fe.items):
        if item in seen:
            out.append(
                Issue(("for_each", "items", i), f"item {item!r} is listed twice (first as item {seen[item] + 1})")
            )
        seen.setdefault(item, i)
        if item.strip(".") == "" and len(item) >= 3:
            out.append(
                Issue(("for_each", "items", i), f"item {item!r} looks like an elision; list every item", "warning")
            )
    template_ok = True
    for n, f in enumerate(fe.scope.files):
        loc = ("for_each", "scope", "files", n)
        bad = _check_vars(f, templating.ITEM_VARS, loc, "a scope file")
        if not bad:
            # The template's own text first (every value a harmless name): `../{{item}}` is one fault, not N.
            try:
                normalize(templating.render(f, dict.fromkeys(templating.ITEM_VARS, "x")))
            except InputError as exc:
                bad = [Issue(loc, f"scope file {f!r} leaves the brain root whatever the item: {exc.message}")]
        out += bad
        template_ok = template_ok and not bad
    if template_ok:
        out += _render_items(spec, rules)
    out += _vars_in(fe.context, templating.ITEM_VARS, ("for_each", "context"), "for_each.context")
    for outcome in ("success", "fail", "error", "escalate", "blocked"):
        for action in getattr(fe.on_return, outcome) or ():
            rloc = ("for_each", "on_return", outcome)
            if isinstance(action, GotoAction) and action.workflow in (None, spec.name):
                out.append(Issue(rloc, f"{format_action(action)}: a for_each workflow has no steps; use → next_item"))
            elif isinstance(action, SpawnAction):
                out.append(Issue(rloc, f"{format_action(action)}: starting a satellite is a chain step action"))
    return out


_MAX_ITEM_REPORTS = 5


def _render_items(spec: ForEachWorkflow, rules: tuple[ZoneRule, ...]) -> list[Issue]:
    """Render the scope with every item: an item that escapes the brain root is refused at load (S-01)."""
    fe = spec.for_each
    out: list[Issue] = []
    bad = 0
    for i in range(len(fe.items)):
        values = item_values(spec, i)
        zones: set[str] = set()
        for n, template in enumerate(fe.scope.files):
            try:
                zones.add(templating.render_path(template, values, rules).zone)
            except InputError as exc:
                bad += 1
                if bad <= _MAX_ITEM_REPORTS:
                    out.append(
                        Issue(("for_each", "items", i), f"item {fe.items[i]!r} in scope file {n + 1}: {exc.message}")
                    )
        if fe.scope.zone is not None and zones and zones != {fe.scope.zone}:
            bad += 1
            if bad <= _MAX_ITEM_REPORTS:
                out.append(
                    Issue(
                        ("for_each", "scope", "zone"),
                        f"scope.zone is {fe.scope.zone!r} but item {fe.items[i]!r} touches zone(s) "
                        f"{', '.join(sorted(zones))}; expected the zone of the files",
                    )
                )
    if bad > _MAX_ITEM_REPORTS:
        out.append(Issue(("for_each", "items"), f"and {bad - _MAX_ITEM_REPORTS} more bad item paths"))
    return out


def _chain_issues(spec: ChainWorkflow) -> list[Issue]:
    out: list[Issue] = []
    seen: dict[str, int] = {}
    for i, step in enumerate(spec.chain):
        out += _typo_issues(step.model_extra, _known_keys(ChainStep), ("chain", i), strict=f"step {step.key}")
        if step.key in seen:
            out.append(
                Issue(("chain", i, "step"), f"step {step.key!r} is declared twice (first at chain[{seen[step.key]}])")
            )
        seen.setdefault(step.key, i)
        for field in ("scope", "story_angle", "input_contract"):
            value = getattr(step, field)
            if value:
                out += _check_vars(value, templating.STEP_VARS, ("chain", i, field), field)
        if step.gate == "0-failures" and step.type != "test":
            out.append(
                Issue(
                    ("chain", i, "gate"),
                    f"gate 0-failures reads test results; step {step.key} is type {step.type}",
                    "warning",
                )
            )
        if spec.swarm_ready and i > 0 and not step.input_contract:
            out.append(
                Issue(
                    ("chain", i),
                    f"step {step.key} has no input_contract; contracts are required before swarm_ready: true",
                )
            )
        for field in ("on_done", "on_partial", "on_fail"):
            for action in getattr(step, field) or ():
                if isinstance(action, GotoAction) and action.workflow in (None, spec.name):
                    try:
                        spec.index_of(action.step)
                    except KeyError:
                        known = ", ".join(s.key for s in spec.chain)
                        out.append(
                            Issue(
                                ("chain", i, field),
                                f"trigger:{action.step} names no step of this chain (steps: {known})",
                            )
                        )
                elif isinstance(action, SpawnAction) and action.scope:
                    out += _check_vars(action.scope, templating.STEP_VARS, ("chain", i, field), "a trigger scope")
        if step.gate == "never" and step.on_done and any(isinstance(a, NextAction | GotoAction) for a in step.on_done):
            out.append(
                Issue(
                    ("chain", i, "on_done"),
                    f"step {step.key} has gate: never (terminal) but on_done goes on",
                    "warning",
                )
            )
    return out


def spec_issues(spec: WorkflowSpec, zone_rules: Iterable[ZoneRule] = DEFAULT_RULES) -> list[Issue]:
    """Checks beyond the schema that need no agents: step ids, trigger targets, template variables, scope paths
    rendered for every item (S-01), zones, and likely typos (warnings). The routes between a chain's steps (loops,
    steps never reached) are checked by :func:`ambient.engine.compile.workflow_issues`, with the executor's own rule."""
    rules = tuple(zone_rules)
    aliases = ("workflow", "theme_branch")
    out: list[Issue] = []
    if isinstance(spec, ForEachWorkflow):
        out += _typo_issues(spec.model_extra, _known_keys(ForEachWorkflow, aliases), ())
        out += _for_each_issues(spec, rules)
    else:
        out += _typo_issues(spec.model_extra, _known_keys(ChainWorkflow, aliases), ())
        out += _chain_issues(spec)
        if spec.mode == "swarm" and not spec.swarm_ready:
            out.append(Issue(("mode",), "mode: swarm on a workflow not marked swarm_ready: true", "warning"))
    if spec.on_complete is not None:
        out += _vars_in(spec.on_complete.payload, templating.COMPLETE_VARS, ("on_complete", "payload"), "on_complete")
    return out


def cross_targets(spec: WorkflowSpec) -> list[tuple[tuple[str | int, ...], GotoAction]]:
    """Every ``trigger:<workflow>/<step>`` naming another workflow, with where it is written."""
    out: list[tuple[tuple[str | int, ...], GotoAction]] = []
    places: list[tuple[tuple[str | int, ...], tuple[Action, ...] | None]] = []
    if isinstance(spec, ForEachWorkflow):
        r = spec.for_each.on_return
        places = [
            (("for_each", "on_return", o), getattr(r, o)) for o in ("success", "fail", "error", "escalate", "blocked")
        ]
    else:
        places = [
            (("chain", i, f), getattr(s, f))
            for i, s in enumerate(spec.chain)
            for f in ("on_done", "on_partial", "on_fail")
        ]
    for loc, actions in places:
        for a in actions or ():
            if isinstance(a, GotoAction) and a.workflow not in (None, spec.name):
                out.append((loc, a))
    return out
