"""Exit-trigger actions (spec/004 "Gestion des exit triggers", spec/002 v1.7, ADR-027 ``on_return``).

What a step's ``on_done:`` / ``on_fail:`` and an item's ``on_return:`` say to do next, parsed from every spelling
of the sources (``trigger:next``, ``→ ERROR + log + ESCALATE pilote``, ``signal → CHECKPOINT pilote``...) into
frozen models, and written back in one canonical spelling. Parses only: the engine carries them out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, Final, Literal, TypeAlias

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, ValidationError

from ambient.core.errors import ActionError
from ambient.workflows.fields import (
    NUMBER_RE,
    RESERVED_STEPS,
    SATELLITE_TYPES,
    SIGNAL_RE,
    STEP_NAME_RE,
    WORKFLOW_NAME_RE,
    AgentName,
    Principal,
    SatelliteType,
    check_scope_text,
    custom_error,
)

MAX_ACTION_TEXT: Final = 2000
MAX_MESSAGE: Final = 1000

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

# Control characters, which a message or an exit trigger may not hold (a tab may).
_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


# ---------------------------------------------------------------------------------------------
# The actions


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def __str__(self) -> str:
        return format_action(self)  # type: ignore[arg-type]


def _check_message(value: str | None) -> str | None:
    if value is None:
        return None
    if _CONTROL_RE.search(value):
        raise custom_error("invalid", "a message may not contain control characters (newlines included)")
    if len(value) > MAX_MESSAGE:
        raise custom_error("invalid", f"a message is at most {MAX_MESSAGE} characters")
    if not value.strip():
        raise custom_error("invalid", "a message may not be blank")
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
    if NUMBER_RE.fullmatch(token):
        return int(token)
    if not STEP_NAME_RE.fullmatch(token):
        raise _fail(whole, f"{token!r} is not a step number or name")
    return token


def _parse_target(arg: str, whole: str) -> NextAction | GotoAction:
    if not arg or any(c.isspace() for c in arg):
        raise _fail(whole, "trigger needs one target (next, a step, or workflow/step)")
    if arg.lower() in RESERVED_STEPS:
        return NextAction()
    workflow: str | None = None
    step_text = arg
    if "/" in arg:
        workflow, _, step_text = arg.rpartition("/")
        if not WORKFLOW_NAME_RE.fullmatch(workflow):
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
        scope = check_scope_text(scope, lambda why: _fail(whole, why))
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
    if not SIGNAL_RE.fullmatch(name):
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
    if low in RESERVED_STEPS:
        if arg:
            raise _fail(whole, f"{word} takes no argument")
        return NextAction()
    if low == "escalate" or low.upper() in KNOWN_SIGNALS or (word.isupper() and SIGNAL_RE.fullmatch(word)):
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
        raise custom_error("exit_trigger", exc.message) from None


ActionSeq: TypeAlias = Annotated[
    tuple[Action, ...],
    BeforeValidator(_coerce_actions),
    PlainSerializer(format_actions, return_type=str),
]
