"""Escalations: the decisions that are the person's (DESIGN §6), as a model and the pure rules over it.

The rules (:func:`new_escalation`, :func:`decide`, :func:`timeout_decision`, :func:`timeout_due`,
:func:`reminder_due`, :func:`next_timer`, :func:`find_pending`...) take ``now`` and return new models, never
changing the one given, and do no I/O: the daemon, the CLI and the tests run them alike. The files of
``.ambient/escalations/`` are :mod:`ambient.human.escalation_store`'s, which applies these rules under its lock.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

from ambient.core.errors import AlreadyAnsweredError, InputError, InvalidOptionError, StateError, UnknownEscalationError
from ambient.core.problems import did_you_mean

#: permission: a tool call an AI agent waits on the person for; budget: a run reached a budget (ambient.engine.budget);
#: provider: the model provider refused the key or cannot be reached (the run holds).
Kind = Literal["fail", "error", "blocked", "gate", "circuit_break", "question", "permission", "budget", "provider"]
Status = Literal["pending", "answered", "expired", "cancelled"]
Channel = Literal["cli", "web", "telegram", "rule", "timeout"]
OnTimeout = Literal["reject", "approve", "escalate", "abort"]

#: Actions the engine carries out by itself; a workflow may declare options with other actions.
ENGINE_ACTIONS = frozenset({"retry", "skip", "abort", "approve", "reject", "continue"})

#: Agent text in a question is cut here so the file stays far below its size cap (escalation_store).
MAX_QUESTION_CHARS = 8000
MAX_NOTE_CHARS = 2000
#: Notification attempts kept in the file (the count keeps growing).
MAX_ATTEMPTS_KEPT = 20
MAX_ERROR_CHARS = 300

ID_PREFIX = "esc-"
#: What an escalation id (and so its file's name) may be; fits Telegram callback_data (telegram.py).
ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
_GENERATED_ID_RE = re.compile(r"^[a-z2-7]{6}$")
# Same alphabet as workflow option names; an all-digit key is refused so "2" always means the 2nd option.
_KEY_RE = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"

# on_timeout → actions looked for among the offered options, in order (first offered wins).
# approve: go on (a gate approved, a blocked item continued, a failed item skipped); reject: stop.
_TIMEOUT_ACTIONS: dict[str, tuple[str, ...]] = {
    "approve": ("approve", "continue", "skip"),
    "reject": ("reject", "abort"),
    "abort": ("abort",),
}


# --------------------------------------------------------------------------- errors


# --------------------------------------------------------------------------- models


class Option(BaseModel):
    """One answer the person may give: typed by ``key`` or by its 1-based number in the list."""

    model_config = ConfigDict(extra="allow")

    key: str = Field(pattern=_KEY_RE, description="letters, digits, '_', '.', '-'; never only digits")
    label: str = Field(min_length=1, max_length=512)  # an agent's option as it wrote it (packets allow 512)
    action: str = Field(min_length=1, max_length=500, description="an ENGINE_ACTIONS name or a workflow action")

    @field_validator("key")
    @classmethod
    def _not_a_number(cls, value: str) -> str:
        if value.isdigit():
            raise ValueError("key must not be only digits (a number means the option at that place in the list)")
        return value

    @field_validator("action")
    @classmethod
    def _one_line(cls, value: str) -> str:
        if "\n" in value or "\r" in value:
            raise ValueError("must be one line")
        return value


class NotifyAttempt(BaseModel):
    """One try at delivering the escalation to the configured notification URLs."""

    model_config = ConfigDict(extra="allow")

    at: AwareDatetime
    ok: bool
    error: str | None = None


class NotifyState(BaseModel):
    """Delivery state: the last attempts, when to try again, when it was delivered."""

    model_config = ConfigDict(extra="allow")

    attempts: list[NotifyAttempt] = Field(default_factory=list)
    count: int = Field(default=0, ge=0, description="attempts made in total (the list keeps the last ones)")
    next_at: AwareDatetime | None = None
    delivered_at: AwareDatetime | None = None
    refs: dict[str, str] = Field(default_factory=dict, description="delivery references, e.g. a Telegram message id")


class Escalation(BaseModel):
    """A decision that is the person's, as stored in ``.ambient/escalations/<id>.yml``.

    People may read and edit these files, so unknown keys are kept (``extra="allow"``).
    All timestamps are aware and absolute, so a restart neither resets nor loses a deadline.
    """

    model_config = ConfigDict(extra="allow")

    id: str = Field(pattern=ID_RE.pattern)
    workflow: str = Field(min_length=1)
    run_id: str = Field(min_length=1)
    item: str | None = None
    step: str | None = None
    agent: str | None = None
    kind: Kind
    question: str
    options: list[Option] = Field(min_length=1)
    created_at: AwareDatetime
    deadline: AwareDatetime | None = None
    on_timeout: OnTimeout | None = None
    remind_at: AwareDatetime | None = None
    reminded: bool = False
    timed_out_at: AwareDatetime | None = None
    # An agent's ESCALATE sent with `ambient send`, outside any run: the answer SPAWNs this agent again with it.
    respawn: str | None = None
    scope: str | None = None  # a circuit breaker's scope (`ambient preflight reset SCOPE` answers it)
    detail: str | None = None  # the agent's own words (its question or error): what a learned rule matches
    dedupe_key: str = Field(min_length=1)
    nonce: str = Field(min_length=16, description="unguessable token carried by Telegram buttons")
    notify: NotifyState = Field(default_factory=NotifyState)
    status: Status = "pending"
    decision: str | None = None
    by: str | None = None
    channel: Channel | None = None
    note: str | None = None
    answered_at: AwareDatetime | None = None
    latency_s: float | None = None
    #: Why an answer was never applied (its run ended before ambient could apply it): said to the person once.
    unapplied: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Escalation:
        keys = [o.key for o in self.options]
        folded = [k.casefold() for k in keys]  # keys are typed in any case, so they must differ in more than case
        dupes = sorted({k for k in keys if folded.count(k.casefold()) > 1})
        if dupes:
            raise ValueError(f"option keys must be unique; repeated: {', '.join(dupes)}")
        if self.status in ("answered", "expired"):
            if self.decision is None or self.answered_at is None or self.channel is None:
                raise ValueError(f"status {self.status!r} needs decision, channel and answered_at")
            allowed = set(keys) if self.status == "answered" else set(keys) | set(_TIMEOUT_ACTIONS)
            if self.decision not in allowed:
                raise ValueError(f"decision {self.decision!r} is not one of the options ({', '.join(keys)})")
        return self

    @property
    def where(self) -> str:
        """``workflow / item`` (or step), for messages."""
        at = self.item or self.step
        return f"{self.workflow} / {at}" if at else self.workflow

    @property
    def decided_option(self) -> Option | None:
        """The option chosen, once decided (None for a timeout action that matched no option)."""
        return next((o for o in self.options if o.key == self.decision), None)

    @property
    def decided_action(self) -> str | None:
        """The action the engine must carry out, once decided."""
        if self.decision is None:
            return None
        opt = self.decided_option
        return opt.action if opt is not None else self.decision


# --------------------------------------------------------------------------- pure rules


def new_id() -> str:
    """A short human-typable id: ``esc-`` and 6 lowercase base32 characters (30 random bits)."""
    return ID_PREFIX + base64.b32encode(secrets.token_bytes(5)).decode("ascii").lower()[:6]


def new_nonce() -> str:
    """An unguessable token tying a Telegram button to one escalation."""
    return secrets.token_urlsafe(16)


def normalize_id(text: str) -> str:
    """Canonical id from what a person typed: case-insensitive, ``esc-`` prefix optional.

    Raises :class:`UnknownEscalationError` for text that cannot be an id (so it is never joined to a path).
    """
    raw = text.strip().lower()
    if _GENERATED_ID_RE.match(raw):
        raw = ID_PREFIX + raw
    if not ID_RE.match(raw):
        raise UnknownEscalationError(f"{text!r} is not an escalation id; expected e.g. 'esc-k3x9qa'")
    return raw


def default_options(kind: Kind) -> list[Option]:
    """The options the engine offers for each kind of escalation (a workflow may declare others)."""
    table: dict[str, list[tuple[str, str]]] = {
        "fail": [("retry", "Run it again"), ("skip", "Skip it and go on"), ("abort", "Abort the run")],
        "error": [("retry", "Run it again"), ("skip", "Skip it and go on"), ("abort", "Abort the run")],
        "blocked": [("continue", "Unblocked: go on"), ("skip", "Skip it and go on"), ("abort", "Abort the run")],
        "gate": [("approve", "Approve"), ("reject", "Reject")],
        "circuit_break": [("retry", "Reset the breaker and run again"), ("abort", "Abort the run")],
        "question": [],
        "permission": [],
        "budget": [("raise", "Allow more"), ("wait", "Keep the run held"), ("abort", "Abort the run")],
        "provider": [("retry", "Run it again"), ("abort", "Abort the run")],
    }
    return [Option(key=k, label=label, action=k) for k, label in table[kind]]


def slug_key(text: str) -> str:
    """An option key made from free text (an agent's proposed answer): ``"Yes, deploy!"`` → ``yes-deploy``."""
    slug = re.sub(r"[^a-z0-9_.]+", "-", text.casefold()).strip("-.")[:32].strip("-.")
    if not slug or slug.isdigit():
        slug = f"opt-{slug}" if slug else "opt"
    return slug


def make_dedupe_key(
    *, workflow: str, run_id: str, kind: Kind, item: str | None = None, step: str | None = None, question: str = ""
) -> str:
    """Same situation → same key: the run, the item or step and the kind (and the text, for questions)."""
    parts = [workflow, run_id, item or "", step or "", kind, question if kind == "question" else ""]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class EscalationDraft:
    """A question before it is an escalation: who asks (workflow, run, item or step, agent), what (kind, question,
    the agent's own words in ``detail``), the options (default: the kind's), and until when (``timeout`` without
    ``on_timeout`` means ``escalate``: never decide for the person by default; ``remind_before`` sets a reminder
    that long before the deadline). The single input of :func:`new_escalation`."""

    workflow: str
    run_id: str
    kind: Kind
    question: str
    options: Sequence[Option | Mapping[str, Any] | tuple[str, str, str]] | None = None
    item: str | None = None
    step: str | None = None
    agent: str | None = None
    timeout: timedelta | None = None
    on_timeout: OnTimeout | None = None
    remind_before: timedelta | None = None
    dedupe_key: str | None = None
    extra: Mapping[str, Any] | None = None
    respawn: str | None = None
    scope: str | None = None
    detail: str | None = None


def new_escalation(draft: EscalationDraft, *, now: datetime) -> Escalation:
    """A pending escalation from its draft, asked at ``now``: deadlines become absolute timestamps from it."""
    d = draft
    _check_aware(now)
    opts = [_as_option(o) for o in d.options or default_options(d.kind)]
    if not opts:
        raise InputError(f"an escalation of kind {d.kind!r} needs options; none were given")
    text = d.question if len(d.question) <= MAX_QUESTION_CHARS else d.question[: MAX_QUESTION_CHARS - 1] + "…"
    deadline = now + d.timeout if d.timeout is not None else None
    remind_at = None
    if deadline is not None and d.remind_before is not None and d.remind_before > timedelta(0):
        remind_at = max(now, deadline - d.remind_before)
    dedupe_key = d.dedupe_key or make_dedupe_key(
        workflow=d.workflow, run_id=d.run_id, kind=d.kind, item=d.item, step=d.step, question=d.question
    )
    data: dict[str, Any] = dict(d.extra or {})
    data.update(
        id=new_id(),
        workflow=d.workflow,
        run_id=d.run_id,
        item=d.item,
        step=d.step,
        agent=d.agent,
        respawn=d.respawn,
        scope=d.scope,
        detail=d.detail[:MAX_QUESTION_CHARS] if d.detail else d.detail,
        kind=d.kind,
        question=text,
        options=[o.model_dump() for o in opts],
        created_at=now,
        deadline=deadline,
        on_timeout=(d.on_timeout or "escalate") if deadline is not None else None,
        remind_at=remind_at,
        dedupe_key=dedupe_key,
        nonce=new_nonce(),
        notify={"next_at": now},
    )
    return Escalation.model_validate(data)


def _as_option(value: Option | Mapping[str, Any] | tuple[str, str, str]) -> Option:
    if isinstance(value, Option):
        return value
    if isinstance(value, tuple):
        key, label, action = value
        return Option(key=key, label=label, action=action)
    return Option.model_validate(value)


def offered_options(raw: Iterable[Sequence[str]]) -> list[tuple[str, str, str]]:
    """(key, label, action) as an escalation offers them: an agent's proposed answer (action ``answer``) gets a key
    slugged from its text; a key already offered is dropped (an agent that proposes ``skip`` beside ours)."""
    options: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for key, label, action in raw:
        k = key if action != "answer" else slug_key(key)
        if k not in seen:
            seen.add(k)
            options.append((k, label, action))
    return options


def rebuild(esc_id: str, *, workflow: str, run_id: str, request: Mapping[str, Any]) -> Escalation:
    """A pending escalation built again from what its run's journal kept of it (an ``asked`` event's request and its
    ``at``), for a file lost or emptied by a crash. Its deadline is counted from when the journal recorded the
    question (within milliseconds of the original); it gets a new nonce and is notified again."""
    at = datetime.fromisoformat(str(request["at"]))
    deadline_s, remind_s = request.get("deadline_s"), request.get("remind_before_s")
    esc = new_escalation(
        EscalationDraft(
            workflow=workflow,
            run_id=run_id,
            kind=request["kind"],
            question=str(request["question"]),
            options=offered_options(request["options"]),
            item=request.get("item"),
            step=request.get("step"),
            agent=request.get("agent"),
            scope=request.get("scope"),
            detail=request.get("detail", request["question"]),
            timeout=timedelta(seconds=float(deadline_s)) if deadline_s else None,
            on_timeout=request.get("on_timeout"),
            remind_before=timedelta(seconds=float(remind_s)) if remind_s else None,
            dedupe_key=request.get("dedupe_key"),
        ),
        now=at,
    )
    return _evolve(esc, id=normalize_id(esc_id))


def with_id(esc: Escalation, esc_id: str) -> Escalation:
    """The same escalation under another id (the store's way out of the rare collision of two random ids)."""
    return _evolve(esc, id=esc_id)


def render_options(esc: Escalation) -> list[str]:
    """The options numbered from 1, one per line: ``1) retry  Run it again``."""
    width = max(len(o.key) for o in esc.options)
    return [f"{n}) {o.key.ljust(width)}  {o.label}" for n, o in enumerate(esc.options, start=1)]


def option_for(esc: Escalation, choice: str) -> Option:
    """The option named by ``choice``: its key (any case) or its 1-based number."""
    raw = choice.strip()
    if raw.isdigit():
        n = int(raw)
        if 1 <= n <= len(esc.options):
            return esc.options[n - 1]
    else:
        for opt in esc.options:
            if opt.key.casefold() == raw.casefold():
                return opt
    offered = ", ".join(f"{n}) {o.key} ({o.label})" for n, o in enumerate(esc.options, start=1))
    hint = "" if raw.isdigit() else did_you_mean(raw, (o.key for o in esc.options))
    raise InvalidOptionError(
        f"{esc.id} does not offer {choice!r}"
        + (f" ({hint})" if hint else "")
        + f"; answer with a name or number among: {offered}"
    )


def decide(
    esc: Escalation,
    option: str,
    *,
    by: str,
    channel: Channel,
    now: datetime,
    note: str | None = None,
) -> Escalation:
    """Answer a pending escalation with an option (key or 1-based number); return the answered copy.

    Raises :class:`AlreadyAnsweredError` when it is not pending and :class:`InvalidOptionError` when
    the option is not offered; the escalation given is never changed.
    """
    _check_aware(now)
    _check_pending(esc)
    opt = option_for(esc, option)
    who = by.strip() or "human"
    if note is not None and len(note) > MAX_NOTE_CHARS:
        raise InputError(f"the note is {len(note)} characters; at most {MAX_NOTE_CHARS} are kept")
    return _evolve(
        esc,
        status="answered",
        decision=opt.key,
        by=who[:200],
        channel=channel,
        note=note or None,
        answered_at=now,
        latency_s=_latency(esc, now),
    )


def timeout_decision(esc: Escalation, now: datetime) -> Escalation | None:
    """What the deadline decides, or None when it is not due (or the escalation is not pending).

    ``approve``/``reject``/``abort`` pick the offered option with that action (approve falls back
    to ``continue``, then ``skip``; reject to ``abort``, except on an agent's question about a for_each item, where
    it rejects that item only; with none offered the action itself is the decision) and
    set status ``expired`` with channel ``timeout``. ``escalate`` keeps it pending without an end
    and re-arms the notification, so the person is told again.
    """
    _check_aware(now)
    if esc.status != "pending" or esc.deadline is None or esc.deadline > now:
        return None
    action = esc.on_timeout or "escalate"
    if action == "escalate":
        return _evolve(
            esc,
            deadline=None,
            on_timeout=None,
            remind_at=None,
            timed_out_at=now,
            notify=esc.notify.model_dump() | {"next_at": now, "delivered_at": None},
        )
    decision: str = action
    wanted_actions = _TIMEOUT_ACTIONS[action]
    if action == "reject" and esc.kind in ("question", "permission") and esc.item is not None:
        # An agent's own question in a for_each: reject that item (it fails), not the whole run through the
        # "abort" option offered beside the agent's answers. A chain's step has no item: its reject
        # still ends the chain.
        wanted_actions = ("reject",)
    for wanted in wanted_actions:
        match = next((o for o in esc.options if o.action == wanted), None)
        if match is not None:
            decision = match.key
            break
    return _evolve(
        esc,
        status="expired",
        decision=decision,
        by="timeout",
        channel="timeout",
        timed_out_at=now,
        answered_at=now,
        latency_s=_latency(esc, now),
    )


def timeout_due(esc: Escalation, now: datetime) -> bool:
    """A pending escalation whose deadline has passed: its ``on_timeout`` applies now."""
    return esc.status == "pending" and esc.deadline is not None and esc.deadline <= now


def reminder_due(esc: Escalation, now: datetime) -> bool:
    """A pending escalation whose reminder time has come, not yet reminded, its deadline still ahead."""
    return (
        esc.status == "pending"
        and not esc.reminded
        and esc.remind_at is not None
        and esc.remind_at <= now
        and not timeout_due(esc, now)
    )


def next_timer(escs: Iterable[Escalation]) -> datetime | None:
    """The earliest deadline or reminder still to fire among pending escalations (notifications have the outbox)."""
    times = [
        t
        for e in escs
        if e.status == "pending"
        for t in (e.deadline, None if e.reminded else e.remind_at)
        if t is not None
    ]
    return min(times, default=None)


def find_pending(escs: Iterable[Escalation], dedupe_key: str) -> Escalation | None:
    """The pending escalation for this situation, if one exists (identical ones are not sent twice)."""
    return next((e for e in escs if e.status == "pending" and e.dedupe_key == dedupe_key), None)


def find_asked(
    escs: Iterable[Escalation], dedupe_key: str, since: datetime, settled: Iterable[str] = ()
) -> Escalation | None:
    """The escalation already made for a question asked again after a crash: the newest of its ``dedupe_key``
    made at or after ``since`` (when the question arose), neither cancelled nor one of ``settled`` (those its run
    already decided). Answered or not, it is this very question: kept, so its answer is applied and the person is
    never asked twice."""
    done = set(settled)
    found = [
        e
        for e in escs
        if e.dedupe_key == dedupe_key and e.status != "cancelled" and e.id not in done and e.created_at >= since
    ]
    return max(found, key=lambda e: (e.created_at, e.id), default=None)


def mark_reminded(esc: Escalation, now: datetime) -> Escalation:
    """Record that the reminder is due: it is sent once, through the notification retry path."""
    _check_aware(now)
    return _evolve(esc, reminded=True, notify=esc.notify.model_dump() | {"next_at": now, "delivered_at": None})


def with_attempt(
    esc: Escalation,
    *,
    ok: bool,
    now: datetime,
    error: str | None = None,
    next_at: datetime | None = None,
    refs: Mapping[str, str] | None = None,
) -> Escalation:
    """Record one notification attempt. ``error`` must already be redacted (it is cut, not cleaned)."""
    _check_aware(now)
    attempt = {"at": now, "ok": ok, "error": None if error is None else error[:MAX_ERROR_CHARS]}
    state = esc.notify
    kept = [a.model_dump() for a in state.attempts][-(MAX_ATTEMPTS_KEPT - 1) :]
    attempts = [*kept, attempt]
    notify = state.model_dump() | {
        "attempts": attempts,
        "count": state.count + 1,
        "next_at": None if ok else next_at,
        "delivered_at": now if ok else state.delivered_at,
        "refs": state.refs | dict(refs or {}),
    }
    return _evolve(esc, notify=notify)


def mark_unapplied(esc: Escalation, reason: str) -> Escalation:
    """Record that an answer was never applied, and why (its run ended first): the person was told."""
    if esc.status not in ("answered", "expired"):
        raise StateError(f"{esc.id} is {esc.status}: only an answer can be left unapplied")
    return _evolve(esc, unapplied=reason[:MAX_NOTE_CHARS])


def cancel(esc: Escalation, *, reason: str, now: datetime) -> Escalation:
    """Withdraw a pending escalation (its run ended another way); an answer is then refused."""
    _check_aware(now)
    _check_pending(esc)
    return _evolve(esc, status="cancelled", note=reason[:MAX_NOTE_CHARS], answered_at=now, by="ambient")


def describe_answer(esc: Escalation) -> str:
    """One line saying how an escalation was settled (or that it is pending)."""
    if esc.status == "pending":
        return f"{esc.id} is pending"
    when = esc.answered_at.isoformat(timespec="seconds") if esc.answered_at else "?"
    if esc.status == "cancelled":
        return f"{esc.id} was cancelled at {when}" + (f" ({esc.note})" if esc.note else "")
    via = "by timeout" if esc.channel == "timeout" else f"by {esc.by} via {esc.channel}"
    verb = "answered" if esc.status == "answered" else "decided"
    return f"{esc.id} was already {verb}: {esc.decision} {via} at {when}"


def _check_pending(esc: Escalation) -> None:
    if esc.status != "pending":
        raise AlreadyAnsweredError(describe_answer(esc) + "; nothing was changed", escalation=esc)


def _check_aware(now: datetime) -> None:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be an aware datetime (UTC)")


def _latency(esc: Escalation, now: datetime) -> float:
    return round(max(0.0, (now - esc.created_at).total_seconds()), 3)


def _evolve(esc: Escalation, **changes: Any) -> Escalation:
    # model_copy(update=) does not validate: rebuild so every transition is checked (STYLE rule).
    return Escalation.model_validate(esc.model_dump() | changes)
