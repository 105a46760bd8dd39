"""Workflow specs (DESIGN 5): the ``for_each`` form (ADR-027) and the ``chain`` form (kernel-orchestrator).

The frozen pydantic models a workflow document becomes, and :func:`parse_workflow` that builds them. The exit
triggers inside are :mod:`ambient.workflows.exit_actions`; the checks beyond the schema,
:mod:`ambient.workflows.checks`. Parses and validates; executes nothing.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal, TypeAlias

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    field_validator,
    model_validator,
)

from ambient.core.errors import WorkflowError, WorkflowTemplateError
from ambient.core.terminal import control_character, one_line
from ambient.workflows import templating
from ambient.workflows.exit_actions import ActionSeq, EscalateAction, LogAction, NextAction, SignalAction, SpawnAction
from ambient.workflows.fields import (
    NUMBER_RE,
    RESERVED_STEPS,
    SIGNAL_RE,
    STEP_NAME_RE,
    WORKFLOW_NAME_RE,
    AgentName,
    Principal,
    SatelliteType,
    ScopePath,
    Seconds,
    TemplateText,
    check_ident,
    custom_error,
    parse_duration,
)

# ---------------------------------------------------------------------------------------------
# Vocabulary

Form = Literal["for_each", "chain"]
Status = Literal["active", "draft"]
Mode = Literal["manual", "assisted", "swarm"]
Gate = Literal["0-failures", "human", "never"]
OnTimeout = Literal["reject", "approve", "escalate", "abort"]
RetryOutcome = Literal["error", "fail"]
DEFAULT_MODE: Final[Mode] = "assisted"
MAX_CONCURRENCY: Final = 256
#: Items of one for_each (README, Workflows): one agent, one claim and one journal line each; a longer list is
#: refused at file:line. 10,000 keeps a file's parse under ~0.5 s and ~20 MB (a 1 MiB list of 350k items took 8 s
#: and 340 MB); split a longer list over several workflows.
MAX_ITEMS: Final = 10_000
#: Values (keys, items, scalars) one workflow file may hold: every item plus room for the rest. Counted from the YAML
#: events before any node is built, so a file past it costs what reading this many values costs, no more.
MAX_WORKFLOW_VALUES: Final = 2 * MAX_ITEMS

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

_BRANCH_BAD_RE = re.compile(r"[\s\x00-\x1f\x7f~^:?*\[\\]|\.\.|@\{|^[-/]|/$|\.lock$|^$")

#: Keys written one level too high, and the block they belong in (``steps:`` goes under ``chain:``).
MISPLACED_KEYS: Final[Mapping[str, str]] = {
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


def spec_hash(raw: bytes) -> str:
    """The sha256 (hex) of a workflow file's bytes: a run is pinned to the spec it started with."""
    return hashlib.sha256(raw).hexdigest()


def _as_list(value: object) -> object:
    # `agents: testing` and `files: a.yml` mean a one-element list.
    return [value] if isinstance(value, str) else value


def _none_as_empty_list(value: object) -> object:
    return [] if value is None else _as_list(value)


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
            raise custom_error(
                "invalid", f"max_backoff ({self.max_backoff}s) is shorter than backoff ({self.backoff}s)"
            )
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
    options: list[Annotated[str, AfterValidator(check_ident)]] = Field(default_factory=list)  # [] = engine's
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
                raise custom_error("invalid", "remind_before needs a timeout to count back from")
            if self.remind_before >= self.timeout:
                raise custom_error(
                    "invalid", f"remind_before ({self.remind_before}s) must be shorter than timeout ({self.timeout}s)"
                )
        if len(set(self.options)) != len(self.options):
            raise custom_error("invalid", "options has the same option twice")
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
        if not SIGNAL_RE.fullmatch(name):
            raise custom_error("invalid", f"{value!r} is not a signal name")
        return name

    @model_validator(mode="after")
    def _payload_allowed(self) -> OnComplete:
        # DESIGN 2.2: a RETURN carries payload.result only, never the source context.
        if self.signal == "RETURN":
            extra = sorted(set(self.payload) - {"result"})
            if extra:
                raise custom_error("invalid", f"a RETURN payload carries result only; remove {', '.join(extra)}")
        _check_templates_in(self.payload)
        return self


def _check_templates_in(value: Any) -> None:
    if isinstance(value, str):
        try:
            templating.variables(value)
        except WorkflowTemplateError as exc:
            raise custom_error("invalid", exc.message) from None
    elif isinstance(value, Mapping):
        for v in value.values():
            _check_templates_in(v)
    elif isinstance(value, list):
        for v in value:
            _check_templates_in(v)


def _check_branch(value: str | None) -> str | None:
    # The branch reaches `git` as an argv element: refuse what git refuses and anything option-like.
    if value is not None and _BRANCH_BAD_RE.search(value):
        raise custom_error(
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
                    raise custom_error(
                        "invalid", f"{alias}: {value!r} and {field}: {data[field]!r} disagree; keep one of them"
                    )
                data[field] = value
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not WORKFLOW_NAME_RE.fullmatch(value):
            raise custom_error(
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
        raise custom_error(
            "item",
            f'an item is a name or a number, got {value!r:.60}; quote it if you mean text ("yes", "null")',
        )
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str) and (bad := control_character(value)) is not None:
        # An item names files, a claim, AMBIENT_ITEM and a line of every one-line view: it stays on one line.
        raise custom_error(
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
        raise custom_error("step", "a step is a number or a name")
    if isinstance(value, int) and value < 0:
        raise custom_error("step", f"step {value} is negative; expected a number from 0, or a name")
    if isinstance(value, str) and NUMBER_RE.fullmatch(value):
        return int(value)
    if isinstance(value, str):
        if value.lower() in RESERVED_STEPS:
            raise custom_error("step", f"{value!r} is reserved (trigger:next); choose another step name")
        if not STEP_NAME_RE.fullmatch(value):
            raise custom_error(
                "step", f"{value!r} is not a step name; expected a number or letters, digits, '_', '.', '-'"
            )
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
            hint = f" ({key}: goes under {MISPLACED_KEYS[key].split('.')[0]}:)"
        elif isinstance(key, str) and difflib.get_close_matches(key, ["for_each", "chain"], n=1, cutoff=0.6):
            hint = f" (is {key!r} a misspelling?)"
    raise WorkflowError(
        "has neither a for_each: block (one agent over a list of items, ADR-027) nor a chain: list "
        f"(ordered steps, kernel-orchestrator){hint}; expected one of them"
    )


def form_model(data: Mapping[str, Any]) -> type[ForEachWorkflow] | type[ChainWorkflow]:
    """The model a workflow document is validated against, by its form (:func:`detect_form`): the shell names an
    unknown key with the keys this model has at its place."""
    return ForEachWorkflow if detect_form(data) == "for_each" else ChainWorkflow


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
    try:
        return form_model(data).model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "(document)"
        raise WorkflowError(
            f"{where}: {first['msg']}" + (f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""),
            loc=tuple(p for p in first["loc"] if isinstance(p, str | int)),
            validation=exc,
        ) from None
