"""The events of a run journal (``.ambient/runs/<run>.jsonl``): one type per event, the constructors the writers use.

A run's journal is its source of truth (:mod:`ambient.engine.runstate` folds it): one JSON object per line, ``ev``
names the kind, ``at`` (last) says when. Each kind is a :class:`~typing.TypedDict` with ``ev`` as its
:data:`~typing.Literal` discriminator, and :data:`RunEvent` is their union: mypy checks every key a writer puts (name
and type), and a reader narrowed on ``ev`` gets each key's declared type (a key the event does not have reads as
``object``). TypedDicts are plain dicts at run time: the hot path (an event per item state change, a fan-out of
thousands) pays nothing for them, and the bytes on disk are what they were before they had types.

The constructors (``accepted(at, item=..., ...)``) take the fields as keyword arguments, checked against the
event's ``*Fields`` type, and keep the order they are given in: that order is the order of the keys on disk, so a
writer that names them as before writes the same bytes. A key marked ``NotRequired`` is one some writers leave out
(``question`` in a chain step's ``finished``, ``item`` in a run-wide ``decided``), which is not the same as ``null``.

Reading: a journal is a file a person (or an attacker) can edit. The types say what the writers write; the fold
still reads every value with ``.get`` and checks it (:class:`ambient.core.errors.HistoryError`), and a key it does
not know is ignored.

=============  ==========================================================================================
event          fields (``at`` on every one), and what the event means
=============  ==========================================================================================
started        run_id workflow form spec_hash spec items mode trigger context (the spec pinned for the run)
accepted       item attempt key (on disk before the agent starts)
spawned        item attempt pid started (a command agent's process: stopped if a crash orphans it)
finished       item attempt agent key result [output] error duration_ms [signal_in reply] [question] [hold]
               [usage] [permission_signature] (reply: what the agent answered; question: its own, when it
               asked one; hold: the attempt did not count, result ``interrupted``)
call           item attempt agent key id usage sent [stream partial] (one model call of the attempt, metered by
               the model gateway and fsync'd before the agent got its answer; its cost counts for the run and
               the day at once; a ``finished`` whose usage is ``metered`` carries the attempt's total of them)
retry          item attempt not_before (a failure the retry policy retries)
asking         item kind request [gate before] (the item asks the person: written with the result that raised
               the question, in one write, before the escalation's file exists; the item waits on the person
               from here on, and a start asks again, idempotently, if no ``escalated`` or ``gate`` followed)
asked          escalation request (what the escalation asks, to rebuild its file if lost; comes before
               its ``escalated``, ``gate`` or ``final_gate``)
escalated      [item] escalation kind [hold] agent (no item: the question of a run hold)
hold           hold (per_run|daily|provider) [spent limit budget day] [error agent] (no new agent of the run
               starts until it is answered)
unhold         hold reason (a daily hold answered wait: the UTC day changed)
decided        [item] escalation option action by channel [latency_s note auto rule] [answer] (an abort, or
               a reject but of a for_each item, aborts every unfinished item)
skipped        item [before_start] [reason] (before_start: a step before the one the run started at;
               reason: who skipped it, an ADAPT)
interrupted    item attempt [reason] (a stop cut the agent short; reason ``restart``: a crash did)
gate           item state escalation [before] agent (chains' human gates; before: the step has not run yet)
breaker        scope fails tripped
cursor         index (chains: the step to run next)
added          item (chains: a satellite started by a trigger)
reset          item (chains: a step run again by a loop back)
final_gate     state [escalation] (swarm mode: the person gates the final result)
note           text (information only: a notify action, a theme branch's problem, an ADAPT)
abort          by reason (an ABORT packet: every unfinished item is aborted)
finished_run   outcome
=============  ==========================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict, Unpack

from ambient.engine.budget import HoldKind

#: What an attempt recorded in ``finished`` came to: ``interrupted`` did not count (a stop, a hold).
FinishedResult = Literal["success", "fail", "error", "interrupted"]
Outcome = Literal["success", "partial", "failed", "aborted"]
GateState = Literal["pending", "passed", "rejected"]


class EscalationRecord(TypedDict):
    """An ``asked`` event's ``request``: enough to rebuild the escalation's file (the run is the journal's)."""

    kind: str
    question: str
    options: list[list[str]]  # [key, label, action]
    item: NotRequired[str]
    step: NotRequired[str]
    agent: NotRequired[str]
    scope: NotRequired[str]
    dedupe_key: NotRequired[str]
    deadline_s: NotRequired[float]
    on_timeout: NotRequired[str]
    remind_before_s: NotRequired[float]
    detail: NotRequired[str]


# ---------------------------------------------------------------- the fields of each event, as the writers give them


class StartedFields(TypedDict):
    run_id: str
    workflow: str
    form: str
    spec_hash: str | None
    spec: dict[str, Any]  # the workflow as it was when the run started: the run goes on with it
    items: list[str]
    mode: str | None
    trigger: str
    context: dict[str, Any]


class AcceptedFields(TypedDict):
    item: str
    attempt: int
    key: str  # the idempotency key run/item/attempt


class SpawnedFields(TypedDict):
    item: str
    attempt: int
    pid: int
    started: float | None  # the process's start time: a recycled pid is not the agent


class UsageFields(TypedDict, total=False):
    """What a ``finished`` says of cost and permissions, when the attempt has them."""

    usage: dict[str, Any]  # an AI agent's model, tokens, cost_usd, turns (runners.result.Usage.to_record)
    permission_signature: str  # the tool call its ESCALATE asks about


class FinishedFields(UsageFields):
    item: str
    attempt: int
    agent: str
    key: str
    result: FinishedResult
    output: NotRequired[Any]
    error: str | None
    duration_ms: int
    signal_in: NotRequired[str | None]
    reply: NotRequired[str]  # what the agent answered: success|fail|error|escalate|blocked|unrecoverable
    question: NotRequired[str | None]  # its own question, when it asked one
    hold: NotRequired[str]  # the attempt held the run (``provider_refused``...): it did not count


class CallFields(TypedDict):
    item: str
    attempt: int
    agent: str
    key: str
    id: str  # the provider's id of the response (its billing line)
    usage: dict[str, Any]  # model, tokens, cost_usd, turns 1 (runners.result.Usage.to_record)
    sent: str  # when the request went to the provider
    stream: NotRequired[bool]
    partial: NotRequired[bool]  # cut short: the usage is what the response said so far


class RetryFields(TypedDict):
    item: str
    attempt: int
    not_before: str


class AskingFields(TypedDict):
    item: str
    kind: str
    request: EscalationRecord
    gate: NotRequired[bool]  # a chain's human gate: its escalation is recorded by a ``gate`` event
    before: NotRequired[bool]  # that gate comes before the step runs


class AskedFields(TypedDict):
    escalation: str
    request: EscalationRecord


class EscalatedFields(TypedDict):
    item: NotRequired[str]  # absent: the question of a run hold
    escalation: str
    kind: str
    hold: NotRequired[HoldKind]
    agent: str | None


class HoldFields(TypedDict):
    hold: HoldKind
    spent: NotRequired[float]  # a budget: what was spent against which limit, the budget's own amount
    limit: NotRequired[float]
    budget: NotRequired[float]
    day: NotRequired[str]  # a daily budget: the UTC day
    agents: NotRequired[dict[str, float]]  # a budget: what each agent of the run spent, the largest first
    error: NotRequired[str]  # the provider: what it answered
    agent: NotRequired[str | None]


class UnholdFields(TypedDict):
    hold: HoldKind
    reason: str


class DecidedFields(TypedDict):
    item: NotRequired[str | None]
    escalation: str  # "": a decision nobody was asked (an exit trigger's or a rule's abort)
    option: str
    action: str
    by: str
    channel: str
    latency_s: NotRequired[float | None]
    note: NotRequired[str | None]
    auto: NotRequired[bool]  # decided by a learned rule
    rule: NotRequired[str | None]
    answer: NotRequired[str]  # the option as the agent proposed it, handed back to it


@dataclass(frozen=True)
class Ruling:
    """A decision on an escalation, as it travels from whoever took it (the person on a channel, a learned rule, a
    deadline) through the run manager to the run that waits on it: one value instead of ten parameters. (The
    ``decided`` record it becomes, folded, is a :class:`Decision`.)"""

    escalation: str
    option: str  # the option's key
    action: str  # what the engine does (retry, skip, abort, answer, approve, raise...)
    by: str
    channel: str
    latency_s: float | None = None
    note: str | None = None
    rule: str | None = None  # the learned rule that took it (None: the person, or a deadline)
    answer: str | None = None  # the option as the agent proposed it, handed back to it (``answer`` actions)

    def fields(self, item: str | None) -> DecidedFields:
        """The journal record's fields for the run's ``item`` (None: a question of the whole run)."""
        fields: DecidedFields = {
            "item": item,
            "escalation": self.escalation,
            "option": self.option,
            "action": self.action,
            "by": self.by,
            "channel": self.channel,
            "latency_s": self.latency_s,
            "note": self.note,
            "auto": self.rule is not None,
            "rule": self.rule,
        }
        if self.answer is not None and self.action == "answer":
            fields["answer"] = self.answer
        return fields


class SkippedFields(TypedDict):
    item: str
    before_start: NotRequired[bool]  # a step before the one the run started at
    reason: NotRequired[str]  # why, when it is not the item's own result (an ADAPT)


class InterruptedFields(TypedDict):
    item: str
    attempt: int
    reason: NotRequired[str]  # restart: running when the daemon died


class GateFields(TypedDict):
    item: str
    state: GateState
    escalation: str
    before: NotRequired[bool]  # the step has not run yet
    agent: str


class BreakerFields(TypedDict):
    scope: str
    fails: int
    tripped: bool


class CursorFields(TypedDict):
    index: int


class ItemFields(TypedDict):
    item: str


class FinalGateFields(TypedDict):
    state: GateState
    escalation: NotRequired[str]


class NoteFields(TypedDict):
    text: str


class AbortFields(TypedDict):
    by: str
    reason: str


class FinishedRunFields(TypedDict):
    outcome: Outcome


# ---------------------------------------------------------------- the events as on disk


class Started(StartedFields):
    ev: Literal["started"]
    at: str


class Accepted(AcceptedFields):
    ev: Literal["accepted"]
    at: str


class Spawned(SpawnedFields):
    ev: Literal["spawned"]
    at: str


class Finished(FinishedFields):
    ev: Literal["finished"]
    at: str


class Call(CallFields):
    ev: Literal["call"]
    at: str


class Retry(RetryFields):
    ev: Literal["retry"]
    at: str


class Asking(AskingFields):
    ev: Literal["asking"]
    at: str


class Asked(AskedFields):
    ev: Literal["asked"]
    at: str


class Escalated(EscalatedFields):
    ev: Literal["escalated"]
    at: str


class Hold(HoldFields):
    ev: Literal["hold"]
    at: str


class Unhold(UnholdFields):
    ev: Literal["unhold"]
    at: str


class Decided(DecidedFields):
    ev: Literal["decided"]
    at: str


class Skipped(SkippedFields):
    ev: Literal["skipped"]
    at: str


class Interrupted(InterruptedFields):
    ev: Literal["interrupted"]
    at: str


class Gate(GateFields):
    ev: Literal["gate"]
    at: str


class Breaker(BreakerFields):
    ev: Literal["breaker"]
    at: str


class Cursor(CursorFields):
    ev: Literal["cursor"]
    at: str


class Added(ItemFields):
    ev: Literal["added"]
    at: str


class Reset(ItemFields):
    ev: Literal["reset"]
    at: str


class FinalGate(FinalGateFields):
    ev: Literal["final_gate"]
    at: str


class Note(NoteFields):
    ev: Literal["note"]
    at: str


class Abort(AbortFields):
    ev: Literal["abort"]
    at: str


class FinishedRun(FinishedRunFields):
    ev: Literal["finished_run"]
    at: str


RunEvent = (
    Started
    | Accepted
    | Spawned
    | Finished
    | Call
    | Retry
    | Asking
    | Asked
    | Escalated
    | Hold
    | Unhold
    | Decided
    | Skipped
    | Interrupted
    | Gate
    | Breaker
    | Cursor
    | Added
    | Reset
    | FinalGate
    | Note
    | Abort
    | FinishedRun
)


class Decision(DecidedFields):
    """A ``decided`` event as the folded state keeps it (:attr:`ambient.engine.runstate.RunState.decisions`)."""

    at: str


class HeldRun(HoldFields):
    """A hold as the folded state keeps it (:attr:`ambient.engine.runstate.RunState.holds`): its ``hold`` event, the
    escalation that asks about it (None: not asked, or answered) and whether the person answered ``wait``."""

    escalation: str | None
    waited: bool
    at: str | None


# ---------------------------------------------------------------- constructors: ``ev`` first, the fields, ``at`` last


def started(at: str, /, **fields: Unpack[StartedFields]) -> Started:
    return {"ev": "started", **fields, "at": at}


def accepted(at: str, /, **fields: Unpack[AcceptedFields]) -> Accepted:
    return {"ev": "accepted", **fields, "at": at}


def spawned(at: str, /, **fields: Unpack[SpawnedFields]) -> Spawned:
    return {"ev": "spawned", **fields, "at": at}


def finished(at: str, /, **fields: Unpack[FinishedFields]) -> Finished:
    return {"ev": "finished", **fields, "at": at}


def call(at: str, /, **fields: Unpack[CallFields]) -> Call:
    return {"ev": "call", **fields, "at": at}


def retry(at: str, /, **fields: Unpack[RetryFields]) -> Retry:
    return {"ev": "retry", **fields, "at": at}


def asking(at: str, /, **fields: Unpack[AskingFields]) -> Asking:
    return {"ev": "asking", **fields, "at": at}


def asked(at: str, /, **fields: Unpack[AskedFields]) -> Asked:
    return {"ev": "asked", **fields, "at": at}


def escalated(at: str, /, **fields: Unpack[EscalatedFields]) -> Escalated:
    return {"ev": "escalated", **fields, "at": at}


def hold(at: str, /, **fields: Unpack[HoldFields]) -> Hold:
    return {"ev": "hold", **fields, "at": at}


def unhold(at: str, /, **fields: Unpack[UnholdFields]) -> Unhold:
    return {"ev": "unhold", **fields, "at": at}


def decided(at: str, /, **fields: Unpack[DecidedFields]) -> Decided:
    return {"ev": "decided", **fields, "at": at}


def skipped(at: str, /, **fields: Unpack[SkippedFields]) -> Skipped:
    return {"ev": "skipped", **fields, "at": at}


def interrupted(at: str, /, **fields: Unpack[InterruptedFields]) -> Interrupted:
    return {"ev": "interrupted", **fields, "at": at}


def gate(at: str, /, **fields: Unpack[GateFields]) -> Gate:
    return {"ev": "gate", **fields, "at": at}


def breaker(at: str, /, **fields: Unpack[BreakerFields]) -> Breaker:
    return {"ev": "breaker", **fields, "at": at}


def cursor(at: str, /, **fields: Unpack[CursorFields]) -> Cursor:
    return {"ev": "cursor", **fields, "at": at}


def added(at: str, /, **fields: Unpack[ItemFields]) -> Added:
    return {"ev": "added", **fields, "at": at}


def reset(at: str, /, **fields: Unpack[ItemFields]) -> Reset:
    return {"ev": "reset", **fields, "at": at}


def final_gate(at: str, /, **fields: Unpack[FinalGateFields]) -> FinalGate:
    return {"ev": "final_gate", **fields, "at": at}


def note(at: str, /, **fields: Unpack[NoteFields]) -> Note:
    return {"ev": "note", **fields, "at": at}


def abort(at: str, /, **fields: Unpack[AbortFields]) -> Abort:
    return {"ev": "abort", **fields, "at": at}


def finished_run(at: str, /, **fields: Unpack[FinishedRunFields]) -> FinishedRun:
    return {"ev": "finished_run", **fields, "at": at}
