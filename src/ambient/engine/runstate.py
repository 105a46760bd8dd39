"""The state of one run, folded from its event history (``.ambient/runs/<run>.jsonl``). No I/O.

The run journal is the source of truth, as Temporal's event history is: claims are views of it,
and memory is a cache. After a crash the daemon folds the journal again; an item that was
``accepted`` but never ``finished`` was in flight, so it is run again (at most once per crash).

The events and their fields are :mod:`ambient.engine.events` (one type per event, :data:`~.events.RunEvent` their
union): :func:`apply_event` applies one, the fold applies them all in order. A journal is a file a person can edit,
so the fold takes each value with ``.get`` and checks the ones it relies on (:class:`HistoryError`); an event it does
not know is ignored.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, cast

from ambient.core.errors import HistoryError
from ambient.engine.budget import UsageTotals, answer_hold, day_of
from ambient.engine.events import (
    Accepted,
    Asking,
    Call,
    Decided,
    Decision,
    Escalated,
    FinalGate,
    Finished,
    Gate,
    HeldRun,
    Hold,
    Outcome,
    RunEvent,
    Spawned,
    Started,
)
from ambient.runners.result import Resumed

ItemStatus = Literal["pending", "running", "retry_wait", "done", "failed", "escalated", "skipped", "aborted"]
TERMINAL_ITEM: frozenset[str] = frozenset({"done", "failed", "skipped", "aborted"})
#: The result of a step before the one a run started at (``ambient start --step``, ``trigger:<workflow>/<step>``):
#: skipped, and left out of the run's outcome.
NOT_RUN = "not_run"
#: The recorded reply of an agent that answered with its own ERROR signal: unrecoverable, never retried.
UNRECOVERABLE = "unrecoverable"
#: Decisions that abort the whole run, cascading to every unfinished item (spec/002 ``abort``).
ABORTING: frozenset[str] = frozenset({"abort", "reject"})


@dataclass
class ItemState:
    """One for_each item or chain step."""

    name: str
    index: int
    status: ItemStatus = "pending"
    attempt: int = 0  # attempts started so far
    fails: int = 0  # consecutive failed attempts (for retries and the breaker)
    result: str | None = None  # last result: success|fail|error|skipped|interrupted
    output: Any = None
    error: str | None = None
    not_before: str | None = None  # ISO time before which a retry must not start
    escalation: str | None = None
    gate: str | None = None  # chain human gate: pending|passed|rejected
    duration_ms: int = 0
    pid: int | None = None  # the command agent of the current attempt (its process group id)
    pid_started: float | None = None  # that process's start time: a recycled pid is not our agent
    usage: UsageTotals | None = None  # what the item's AI agent consumed, every attempt together
    resumed: Resumed | None = None  # why its next attempt runs (an answer, a retry, a restart): told to the agent


@dataclass
class RunState:
    """Everything needed to continue a run after a restart."""

    run_id: str
    workflow: str
    form: str
    spec_hash: str | None
    spec: dict[str, Any]
    items: list[ItemState]
    mode: str | None = None
    trigger: str | None = None
    context: dict[str, Any] = field(default_factory=dict)
    started_at: str | None = None
    outcome: str | None = None
    finished_at: str | None = None
    escalations: dict[str, str] = field(default_factory=dict)  # escalation id → item
    escalation_count: int = 0
    error_count: int = 0
    decisions: list[Decision] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)  # StepRecord-shaped dicts
    notes: list[str] = field(default_factory=list)
    breaker: dict[str, int] = field(default_factory=dict)  # scope → consecutive fails
    tripped: set[str] = field(default_factory=set)
    torn_tail: bool = False
    cursor: int = 0  # chains: index of the step to run next
    final_gate: str | None = None  # swarm: pending|passed|rejected
    final_escalation: str | None = None
    aborted: bool = False  # an abort (decision, exit trigger, ABORT packet) ended the run, whatever its items did
    abort_note: str | None = None  # an ABORT packet's sender and reason: what its cancelled questions say
    gated: list[str] = field(default_factory=list)  # chains: steps a human gate asked about before they ran
    asked: list[dict[str, Any]] = field(default_factory=list)  # every escalation: escalation, item, kind, agent
    requests: dict[str, dict[str, Any]] = field(default_factory=dict)  # pending escalation id → its asked request
    #: Items (or steps) that asked the person and whose escalation the journal does not name yet (item → its
    #: ``asking`` event's fields and ``at``): a start asks again, idempotently (RunExecutor.ask_again).
    asking: dict[str, dict[str, Any]] = field(default_factory=dict)
    usage: UsageTotals = field(default_factory=UsageTotals)  # every attempt of the run together (ambient.engine.budget)
    #: Holds: no new agent starts while one is here (hold kind → its ``hold`` event's fields, ``escalation`` pending
    #: or None, ``waited`` once answered wait); see ambient.engine.budget.
    holds: dict[str, HeldRun] = field(default_factory=dict)
    raised_run_usd: float = 0.0  # what the person allowed the run to spend beyond per_run_usd
    raised_day_usd: dict[str, float] = field(default_factory=dict)  # UTC day → allowed beyond daily_usd that day
    #: UTC day → what the run spent that day: its metered calls by when they were recorded, the other attempts'
    #: usage by when they finished (today's spend of a run that resumes after a crash: ambient.engine.spend).
    spent_by_day: dict[str, float] = field(default_factory=dict)
    #: agent → model → the model calls the gateway metered or refused (the run record's ``calls_by``).
    calls_by: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    def item(self, name: str) -> ItemState:
        """The item called ``name`` (KeyError if unknown)."""
        for it in self.items:
            if it.name == name:
                return it
        raise KeyError(name)

    def counts(self) -> dict[str, int]:
        """Items per status, plus ``total``: the steps before the one a run started at are not counted (NOT_RUN)."""
        counted = self.counted()
        out: dict[str, int] = {"total": len(counted)}
        for it in counted:
            out[it.status] = out.get(it.status, 0) + 1
        return out

    def counted(self) -> list[ItemState]:
        """The items a run's progress counts: all but the steps before the one it started at."""
        return [it for it in self.items if it.result != NOT_RUN]

    @property
    def success_count(self) -> int:
        return sum(1 for it in self.items if it.status == "done")

    def in_flight(self) -> list[ItemState]:
        """Items accepted but not finished: running when the history stops."""
        return [it for it in self.items if it.status == "running"]


def fold(events: Iterable[Mapping[str, Any]]) -> RunState:
    """Rebuild a run's state from its events, in order (records as read from its journal: typed as the writers
    wrote them, each value checked where it is read). Unknown events are ignored (forward compatible)."""
    it = iter(events)
    first = next(it, None)
    if first is None or first.get("ev") != "started":
        raise HistoryError("a run history must start with a 'started' event", 0)
    try:
        state = _started(cast(Started, first))
    except HistoryError as exc:
        raise HistoryError(exc.message, 0) from None
    by_name = {i.name: i for i in state.items}
    for index, ev in enumerate(it, 1):
        try:
            apply_event(state, by_name, cast(RunEvent, ev))
        except HistoryError as exc:
            raise HistoryError(exc.message, index) from None
    return state


def _name(value: object, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise HistoryError(f"started record: {key} must be a name, got {value!r:.60}")
    return value


def _started(first: Started) -> RunState:
    run_id = _name(first.get("run_id"), "run_id")
    workflow = _name(first.get("workflow"), "workflow")
    items = first.get("items") or []
    if not isinstance(items, list) or not all(isinstance(n, str | int) and not isinstance(n, bool) for n in items):
        raise HistoryError(f"started record: items must be a list of names, got {items!r:.60}")
    spec, context = first.get("spec"), first.get("context")
    for key, value in (("spec", spec), ("context", context)):
        if value is not None and not isinstance(value, dict):
            raise HistoryError(f"started record: {key} must be an object, got {value!r:.60}")
    return RunState(
        run_id=run_id,
        workflow=workflow,
        form=str(first.get("form", "for_each")),
        spec_hash=first.get("spec_hash"),
        spec=dict(spec or {}),
        items=[ItemState(name=str(n), index=i) for i, n in enumerate(items)],
        mode=first.get("mode"),
        trigger=first.get("trigger"),
        context=dict(context or {}),
        started_at=first.get("at"),
    )


IntField = Literal["attempt", "duration_ms", "pid", "fails", "index"]


def _int(ev: RunEvent, key: IntField, default: int, minimum: int = 0, *, nullable: bool = False) -> int:
    """``ev[key]`` as checked by the fold: an integer (not a bool) of at least ``minimum``; ``default`` if absent
    (or null, when ``nullable``)."""
    fields: Mapping[str, object] = ev
    value = fields.get(key)
    if key not in fields or (value is None and nullable):
        return default
    if type(value) is not int or value < minimum:
        raise HistoryError(f"{ev.get('ev')} record: {key} must be an integer of at least {minimum}, got {value!r:.40}")
    return value


def _pid(ev: Spawned) -> int | None:
    """A ``spawned`` pid: an integer above 1 (0, 1 and negative pids name a group, init or every process)."""
    return None if ev.get("pid") is None else _int(ev, "pid", 0, minimum=2)


def _start_time(ev: Spawned) -> float | None:
    value: object = ev.get("started")
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise HistoryError(f"{ev.get('ev')} record: started must be a start time in seconds, got {value!r:.40}")
    return float(value)


def apply_event(state: RunState, by_name: dict[str, ItemState], ev: RunEvent) -> None:
    """Apply one event to ``state`` in place (the fold's step; also used live by the engine)."""
    if "ev" not in ev:  # not an event (an edited journal): nothing to apply
        return
    item = by_name.get(str(ev.get("item"))) if "item" in ev else None
    match ev["ev"]:
        case "accepted":
            if item is not None:
                state.asking.pop(item.name, None)
                _accepted(item, ev)
        case "finished":
            if item is not None:
                _finished(state, item, ev)
        case "call":
            _call(state, item, ev)
        case "spawned":
            if item is not None:
                item.pid = _pid(ev)
                item.pid_started = _start_time(ev)
        case "retry":
            if item is not None:
                item.status = "retry_wait"
                item.not_before = ev.get("not_before")
        case "asking":
            if item is not None:
                _asking(state, item, ev)
        case "asked":
            request = ev.get("request")
            if isinstance(request, dict):
                state.requests[str(ev.get("escalation"))] = {**request, "at": ev.get("at")}
        case "escalated":
            _escalated(state, item, ev)
        case "decided":
            _decided(state, by_name, ev)
        case "skipped":
            if item is not None:
                state.asking.pop(item.name, None)
                item.status = "skipped"
                item.result = NOT_RUN if ev.get("before_start") else "skipped"
                if ev.get("reason"):
                    item.error = str(ev.get("reason"))
        case "interrupted":
            if item is not None:
                item.status = "pending"
                item.result = "interrupted"
                item.resumed = Resumed("restart", crash=ev.get("reason") == "restart")
        case "gate":
            if item is not None:
                _gate(state, item, ev)
        case "breaker":
            scope = str(ev.get("scope"))
            state.breaker[scope] = _int(ev, "fails", 0)
            if ev.get("tripped"):
                state.tripped.add(scope)
            else:
                state.tripped.discard(scope)
        case "cursor":
            state.cursor = _int(ev, "index", state.cursor)
        case "added":
            name = str(ev.get("item"))
            if name not in by_name:
                new = ItemState(name=name, index=len(state.items))
                state.items.append(new)
                by_name[name] = new
        case "reset":
            if item is not None:
                state.asking.pop(item.name, None)
                item.status = "pending"
                item.gate = None
                item.fails = 0
                item.result = None
        case "final_gate":
            _final_gate(state, ev)
        case "abort":
            _abort_unfinished(state)
            reason = str(ev.get("reason") or "").strip()
            state.abort_note = f"by {ev.get('by') or 'ambient'}" + (f": {reason}" if reason else "")
        case "hold":
            _hold(state, ev)
        case "unhold":
            state.holds.pop(str(ev.get("hold")), None)
        case "note":
            state.notes.append(str(ev.get("text", "")))
        case "finished_run":
            state.outcome = str(ev.get("outcome"))
            state.finished_at = ev.get("at")


def _asking(state: RunState, item: ItemState, ev: Asking) -> None:
    """The item asked the person: it waits on them from here on, whatever its result said (a failure the
    workflow routes to the person, an agent's own question); the escalation's id comes with its ``escalated``."""
    request = ev.get("request")
    if not isinstance(request, dict):
        raise HistoryError(f"asking record: request must be an object, got {request!r:.60}")
    item.status = "escalated"
    item.escalation = None
    fields = {k: v for k, v in ev.items() if k != "ev"}
    state.asking[item.name] = fields


def _accepted(item: ItemState, ev: Accepted) -> None:
    item.status = "running"
    item.attempt = max(item.attempt, _int(ev, "attempt", item.attempt + 1, minimum=1))
    item.not_before = None


def _finished(state: RunState, item: ItemState, ev: Finished) -> None:
    result = str(ev.get("result"))
    item.result = result
    item.output = ev.get("output")
    item.error = ev.get("error")
    item.duration_ms = _int(ev, "duration_ms", 0, nullable=True)
    usage = ev.get("usage")
    if isinstance(usage, dict) and usage and not usage.get("metered"):  # metered: each call is counted already
        _count_usage(state, item, usage, ev.get("at"))
    if isinstance(usage, dict) and type(refused := usage.get("refused_calls")) is int and refused > 0:
        _calls_of(state, str(ev.get("agent") or "?"), usage)["refused"] += refused
    item.resumed = resumed_after(result, item.error)
    if result == "success":
        item.status = "done"
        item.fails = 0
    elif result == "interrupted":
        item.status = "pending"
    else:
        item.fails += 1
        item.status = "failed"
        if result == "error":
            state.error_count += 1
    if result == "interrupted":
        return
    step: dict[str, Any] = {
        "item": item.name,
        "agent": ev.get("agent", ""),
        "signal_out": "SPAWN",
        "signal_in": ev.get("signal_in"),
        "result": result,
        "duration_ms": item.duration_ms,
        "attempt": _int(ev, "attempt", item.attempt),
        "key": ev.get("key"),
        "error": item.error,
        "at": ev.get("at"),
    }
    # What the agent answered (success|fail|error|escalate|blocked) and its result's status and tests:
    # what ambient.learning.replay needs to decide the step again with a workflow as it is now.
    reply = ev.get("reply")
    if reply:
        step["reply"] = reply
    question = ev.get("question")
    if question:  # an agent's own question: the words a learned rule matches (learning.situation_of)
        step["question"] = question
    if isinstance(usage, dict) and usage:
        step["usage"] = dict(usage)
    signature = ev.get("permission_signature")
    if isinstance(signature, str) and signature:
        # the exact tool call the agent asked about: a learned rule's situation as it is (learning)
        step["permission_signature"] = signature
    if isinstance(item.output, dict):
        for key in ("status", "tests"):
            if item.output.get(key) is not None:
                step[key] = item.output[key]
    state.steps.append(step)


def _count_usage(state: RunState, item: ItemState | None, usage: dict[str, Any], at: object) -> None:
    """Usage counted for the item, the run and the day it was spent."""
    if item is not None:
        if item.usage is None:
            item.usage = UsageTotals()
        item.usage.add(usage)
    cost = state.usage.add(usage)
    if cost and isinstance(at, str):
        with contextlib.suppress(ValueError):
            day = day_of(datetime.fromisoformat(at))
            state.spent_by_day[day] = state.spent_by_day.get(day, 0.0) + cost


def _call(state: RunState, item: ItemState | None, ev: Call) -> None:
    """A model call the gateway metered: its cost counts now, whatever becomes of its attempt."""
    usage = ev.get("usage")
    if not isinstance(usage, dict):
        raise HistoryError(f"call record: usage must be an object, got {usage!r:.60}")
    _count_usage(state, item, usage, ev.get("at"))
    mine = _calls_of(state, str(ev.get("agent") or "?"), usage)
    mine["calls"] += 1
    for name in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"):
        n = usage.get(name)
        if type(n) is int and n > 0:
            mine[name] += n
    cost = usage.get("cost_usd")
    if isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0:
        mine["cost_usd"] += float(cost)
    else:
        mine["cost_unknown"] += 1


_MODELS_BY_MAX = 64  # (agent, model) pairs kept per run: more are counted under "?"


def _calls_of(state: RunState, agent: str, usage: Mapping[str, Any]) -> dict[str, Any]:
    """The figures of one (agent, model) pair of the run, made on first use."""
    model = usage.get("model")
    name = model[:200] if isinstance(model, str) and model else "?"
    if sum(len(m) for m in state.calls_by.values()) >= _MODELS_BY_MAX:
        name = "?"
    models = state.calls_by.setdefault(agent[:100], {})
    found = models.get(name)
    if found is None:
        found = models[name] = {
            "calls": 0,
            "input_tokens": 0,
            "output_tokens": 0,
            "cache_read_tokens": 0,
            "cache_write_tokens": 0,
            "cost_usd": 0.0,
            "cost_unknown": 0,
            "refused": 0,
        }
    return found


def _escalated(state: RunState, item: ItemState | None, ev: Escalated) -> None:
    esc = str(ev.get("escalation"))
    state.escalation_count += 1
    _asked(state, ev, str(ev.get("kind") or ""))
    hold = state.holds.get(str(ev.get("hold"))) if ev.get("hold") is not None else None
    if hold is not None:
        hold["escalation"] = esc
    if item is not None:
        item.status = "escalated"
        item.escalation = esc
        state.escalations[esc] = item.name
        state.asking.pop(item.name, None)
    else:
        state.escalations[esc] = ""


def _decided(state: RunState, by_name: dict[str, ItemState], ev: Decided) -> None:
    esc = str(ev.get("escalation"))
    state.escalations.pop(esc, None)
    request = state.requests.pop(esc, None)
    state.decisions.append(cast(Decision, {k: v for k, v in ev.items() if k != "ev"}))
    target = by_name.get(str(ev.get("item"))) if ev.get("item") is not None else None
    action = ev.get("action")
    _answer_hold(state, esc, action, ev)
    if target is not None and target.escalation == esc:
        target.escalation = None
        if target.attempt > 0:  # a gate before a step's first attempt resumes nothing
            target.resumed = answered(request, ev)
        if action in ("retry", "answer"):  # answer: run again with the person's answer (an agent's question)
            target.status = "pending"
            target.fails = 0
        elif action == "skip":
            target.status = "skipped"
        elif action == "reject" and not aborts_run(state.form, action, target.name):
            target.status = "failed"  # a for_each item rejected (DESIGN: reject → failed); its siblings go on
        elif action in ("approve", "continue"):
            target.gate = "passed" if target.gate == "pending" else target.gate
            if target.status == "escalated":
                target.status = "pending" if target.result != "success" else "done"
    if aborts_run(state.form, action, ev.get("item")):
        if target is not None and target.status not in ("done", "skipped"):
            target.status = "aborted"
        _abort_unfinished(state)


def resumed_after(result: str, error: Any) -> Resumed | None:
    """Why an item runs again after an attempt that ended with ``result``: a retry after a failure (the error
    said), none after a success. ``interrupted``: a hold (the model provider), run again once it is lifted."""
    if result == "success":
        return None
    text = str(error).strip()[:500] if error else None
    return Resumed("retry", error=text or f"the attempt ended with {result}")


def answered(request: Mapping[str, Any] | None, ev: Decided) -> Resumed:
    """An item runs again because the person answered its escalation: the question asked and the answer given."""
    question = request.get("question") if isinstance(request, Mapping) else None
    answer = ev.get("answer") or ev.get("option") or ev.get("action")
    return Resumed(
        "answered",
        question=str(question)[:2000] if question else None,
        answer=str(answer)[:2000] if answer else None,
    )


def _gate(state: RunState, item: ItemState, ev: Gate) -> None:
    item.gate = str(ev.get("state"))
    if item.gate == "pending" and ev.get("before"):
        state.gated.append(item.name)
    if item.gate == "pending":
        state.asking.pop(item.name, None)
        item.status = "escalated"
        item.escalation = ev.get("escalation")
        if item.escalation:
            state.escalations[str(item.escalation)] = item.name
            state.escalation_count += 1
            _asked(state, ev, "gate")
    elif item.gate == "rejected":
        item.status = "aborted"


def _final_gate(state: RunState, ev: FinalGate) -> None:
    state.final_gate = str(ev.get("state"))
    if state.final_gate == "pending":
        state.final_escalation = ev.get("escalation")
        if state.final_escalation:
            state.escalations[str(state.final_escalation)] = ""
            state.escalation_count += 1
            _asked(state, ev, "gate")


def _hold(state: RunState, ev: Hold) -> None:
    name = str(ev.get("hold"))
    fields = {k: v for k, v in ev.items() if k not in ("ev", "at")}
    state.holds[name] = cast(HeldRun, {**fields, "hold": name, "escalation": None, "waited": False, "at": ev.get("at")})


def _answer_hold(state: RunState, esc: str, action: Any, ev: Decided) -> None:
    """A decision on a hold's escalation: released (a raise allows more than the run has spent by now), kept
    waiting, or asked again."""
    for name, hold in list(state.holds.items()):
        if hold.get("escalation") != esc:
            continue
        ans = answer_hold(
            hold, str(action), option=str(ev.get("option") or ""), note=ev.get("note"), spent=state.usage.cost_usd
        )
        hold["escalation"] = None
        if ans.release:
            del state.holds[name]
        elif ans.waited:
            hold["waited"] = True
        state.raised_run_usd += ans.raise_run_usd
        if ans.raise_day is not None:
            day, amount = ans.raise_day
            state.raised_day_usd[day] = state.raised_day_usd.get(day, 0.0) + amount


def _asked(state: RunState, ev: Escalated | Gate | FinalGate, kind: str) -> None:
    """One escalation of the run, with the agent it is about (per-agent statistics count these)."""
    entry: dict[str, Any] = {"escalation": ev.get("escalation"), "kind": kind}
    item, agent = ev.get("item"), ev.get("agent")
    if item is not None:
        entry["item"] = item
    if agent is not None:
        entry["agent"] = agent
    state.asked.append(entry)


def aborts_run(form: str, action: Any, item: Any) -> bool:
    """Whether a decision ends the whole run (spec/002: an abort cascades to every unfinished item). ``reject`` does,
    except on a for_each item: there it rejects that item only, which fails, and its siblings go on; an
    ``on_timeout: reject`` of one agent's question must not abort the whole fan-out."""
    if action == "reject" and form == "for_each" and item:
        return False
    return action in ABORTING


def _abort_unfinished(state: RunState) -> None:
    """An abort cascades (spec/002): every item not finished is aborted and nothing waits on the person any more."""
    state.aborted = True
    state.holds.clear()
    for it in state.items:
        if it.status in ("pending", "retry_wait", "escalated", "running"):
            it.status = "aborted"
            it.escalation = None
    state.escalations.clear()
    state.requests.clear()
    state.asking.clear()


def ended_because(state: RunState) -> str:
    """Why a finished run waits on nobody any more: said by the escalations it leaves behind, once cancelled."""
    for d in reversed(state.decisions):
        if aborts_run(state.form, d.get("action"), d.get("item")):
            where = f" on {d['item']}" if d.get("item") else ""
            return f"the run was aborted: {d.get('option')}{where} by {d.get('by') or 'ambient'}"
    if state.abort_note is not None:
        return f"the run was aborted {state.abort_note}"
    return f"the run ended ({state.outcome or 'unfinished'})"


def next_attempt(item: ItemState) -> int:
    """The attempt number an item runs with next: a new one, except after an interruption (a crash or a stop cut
    the attempt short): that attempt is run again under the same number, so its idempotency key
    (``run/item/attempt``, AMBIENT_KEY) lets the agent see it may have done part of it already."""
    return item.attempt if item.result == "interrupted" and item.attempt else item.attempt + 1


def outcome_of(state: RunState) -> Outcome:
    """The outcome of a run whose items are all terminal."""
    statuses = [it.status for it in state.items if it.result != NOT_RUN]
    if state.aborted or any(s == "aborted" for s in statuses):
        return "aborted"
    if all(s == "done" for s in statuses):
        return "success"
    if any(s == "done" for s in statuses):
        return "partial"
    return "failed" if statuses else "success"


@dataclass(frozen=True)
class StoredQuestion:
    """An escalation file as the start-up reconciliation sees it: what the escalation store knows of a question."""

    id: str
    item: str | None  # its item or step; None: a question of the run (a hold, a final gate)
    kind: str
    status: str  # pending|answered|expired|cancelled
    request: dict[str, Any]  # an ``asked`` event's request, built from the file
    agent: str | None = None


@dataclass(frozen=True)
class Reconciled:
    """What a start does with a question the store knows of and the journal does not: ``attach`` it to its item
    (the item waits on it; an answer already given is then applied), or ``cancel`` it with ``reason``."""

    question: StoredQuestion
    verdict: Literal["attach", "cancel"]
    reason: str = ""


def reconcile_questions(state: RunState, stored: Iterable[StoredQuestion]) -> list[Reconciled]:
    """The escalations of a run's files that its journal never recorded (a kill between the file and the journal,
    an older ambient): each is attached to its item when the item can still wait on it (its attempt answered and
    nothing else asked), else cancelled, saying why. Questions of the run itself (holds, a final gate) are asked
    again by the run and found by their dedupe key: left alone here. Pure: the start carries it out."""
    known = set(state.escalations) | set(state.requests)
    known |= {str(d.get("escalation")) for d in state.decisions if d.get("escalation")}
    known |= {str(a.get("escalation")) for a in state.asked if a.get("escalation")}
    by_name = {it.name: it for it in state.items}
    out: list[Reconciled] = []
    taken: set[str] = set()
    for q in sorted(stored, key=lambda q: q.id):
        if q.id in known or q.status == "cancelled" or q.item is None:
            continue
        item = by_name.get(q.item)
        if q.item in state.asking:
            continue  # the run asks again itself and finds this file by its dedupe key (RunExecutor.ask_again)
        if item is None:
            out.append(Reconciled(q, "cancel", f"its run has no item {q.item}"))
        elif state.finished:
            out.append(Reconciled(q, "cancel", ended_because(state)))
        elif (
            item.status in ("failed", "pending")
            and item.attempt > 0
            and item.escalation is None
            and item.name not in state.asking
            and item.name not in taken
        ):
            taken.add(item.name)
            out.append(Reconciled(q, "attach"))
        else:
            out.append(Reconciled(q, "cancel", f"superseded: {item.name} is {item.status} in its run's journal"))
    return out
