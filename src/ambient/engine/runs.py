"""Carrying out runs: for_each fan-out and chains, durable through the run journal.

A run is an asyncio task owned by :class:`RunManager`. Every change is an event appended to the
run's journal (``.ambient/runs/<run>.jsonl``) before ambient acts on it: an item is ``accepted``
(fsync'd, group-committed with its batch) before its agent starts, and its ``finished`` record is
fsync'd before the next decision depends on it. Claims are views written from the same events.
On restart :meth:`RunManager.resume_all` folds every unfinished journal and goes on: done items
are not run again, items that were running are run again (at most once per crash), pending
escalations stay pending.

The executors talk to the world only through the ports below (agents, escalations, claims,
packets, locks), so they are tested with fakes and wired to the real services by the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import structlog

from ambient.core.clock import Clock, SystemClock
from ambient.core.health import describe, resource_of
from ambient.core.problems import Problem
from ambient.engine.budget import (
    ESCALATION_KIND,
    HOLD_DETAIL,
    HOLD_OF_RESULT,
    Breach,
    Limits,
    breach,
    budget_question,
    day_of,
    hold_options,
    hold_step,
    next_day,
    permission_signature,
    provider_question,
)
from ambient.engine.planner import (
    ANSWER,
    GATE_OPTIONS,
    ITEM_OPTIONS,
    FanOut,
    ItemTemplate,
    after_attempt,
    first_open,
    next_wakeup,
    question_options,
    ready_items,
)
from ambient.engine.records import DecisionRecord, RunRecord, StepRecord
from ambient.engine.runstate import (
    ABORTING,
    TERMINAL_ITEM,
    UNRECOVERABLE,
    HistoryError,
    ItemState,
    RunState,
    aborts_run,
    apply_event,
    ended_because,
    fold,
    next_attempt,
    outcome_of,
)
from ambient.engine.slots import AgentSlots
from ambient.storage.journal import Journal, Unwritten, append_line, read_jsonl
from ambient.storage.paths import BrainPaths
from ambient.workflows.variables import completion_values, item_runner_values, item_values

log = structlog.get_logger(__name__)

#: Agents at once, all runs together, until the settings say otherwise (``concurrency:``, its default).
DEFAULT_SLOTS = 4

AttemptStatus = Literal["success", "fail", "error", "escalate", "blocked"]


# ---------------------------------------------------------------- ports


@dataclass(frozen=True)
class Attempt:
    """One agent execution requested by a run (the SPAWN, before routing)."""

    run_id: str
    workflow: str
    item: str
    index: int
    attempt: int
    key: str  # idempotency key run/item/attempt, handed to the agent
    agent: str
    sender: str
    files: tuple[str, ...] = ()
    zone: str | None = None
    context: Mapping[str, Any] = field(default_factory=dict)
    claim_id: str | None = None
    preflight: bool = False  # chain steps: run the six pre-flight checks before writing
    timeout_s: float | None = None  # the workflow's per-execution timeout, if any
    vars: Mapping[str, Any] = field(default_factory=dict)  # template values for the runner's argv


@dataclass
class AttemptResult:
    """What came back from the agent (already checked by the router)."""

    result: AttemptStatus
    output: Any = None
    error: str | None = None
    duration_ms: int = 0
    signal_in: str | None = None
    question: str | None = None
    options: list[str] = field(default_factory=list)
    retryable: bool = True  # False for the agent's own ERROR signal: "unrecoverable", never retried
    trouble: str | None = (
        None  # ambient itself failed (a resource it ran out of, see ambient.core.health): not the agent
    )
    usage: dict[str, Any] | None = None  # an AI agent's model, tokens, cost, turns, session (Usage.to_record)
    permission: dict[str, Any] | None = None  # the tool call an ESCALATE asks the person about (runners.permissions)
    #: The run must hold before any further spawn: ``provider_refused`` (the model API refused the key). The item goes
    #: back to pending without spending an attempt, and the person gets one escalation for the run.
    hold: str | None = None

    @property
    def reply(self) -> str:
        """What the agent answered, as run records keep it: success|fail|error|escalate|blocked, or
        ``unrecoverable`` for its own ERROR signal."""
        return self.result if self.retryable else UNRECOVERABLE


class Delegate(Protocol):
    """Carries out an attempt: lock scope, SPAWN through the router, run the agent, route the reply."""

    async def attempt(self, a: Attempt) -> AttemptResult: ...


@dataclass(frozen=True)
class EscalationRequest:
    """An escalation to persist (durably) and then notify."""

    run_id: str
    workflow: str
    item: str | None
    agent: str | None
    kind: str
    question: str
    options: Sequence[tuple[str, str, str]]  # (key, label, action)
    dedupe_key: str
    deadline_s: float | None = None
    on_timeout: str | None = None
    remind_before_s: float | None = None
    step: str | None = None  # a chain's step (then ``item`` is None)
    scope: str | None = None  # a circuit breaker's scope
    respawn: str | None = None  # an agent's own ESCALATE outside a run: SPAWN it again with the answer
    detail: str | None = None  # the agent's own words (its question, its error); None: none of an agent's

    def record(self) -> dict[str, Any]:
        """What the run journal keeps of it (an ``asked`` event): enough to rebuild the escalation file if it is
        lost or emptied by a crash (:func:`ambient.human.escalations.rebuild`), so the run never waits on a question
        nobody can see (issue 24, 5). The run's id and workflow are the journal's own."""
        out: dict[str, Any] = {"kind": self.kind, "question": self.question, "options": [list(o) for o in self.options]}
        for key in ("item", "step", "agent", "scope", "dedupe_key", "deadline_s", "on_timeout", "remind_before_s"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.detail and self.detail != self.question:
            out["detail"] = self.detail
        return out


class Escalator(Protocol):
    """Persists an escalation before any notification; returns its id."""

    async def escalate(self, req: EscalationRequest) -> str: ...

    async def inform(self, title: str, body: str) -> None: ...


class ClaimsView(Protocol):
    """Writes the claims that mirror a run (run claim, one claim per item or step)."""

    def run_changed(self, state: RunState) -> None: ...

    def item_changed(self, state: RunState, item: ItemState) -> None: ...


class Emitter(Protocol):
    """Sends a packet from ambient (on_complete RETURN, STEP_DONE, DONE, ERROR...) through the router."""

    async def emit(self, signal: str, to: str, payload: Mapping[str, Any], run: RunState) -> bool: ...


Renderer = Callable[[str, Mapping[str, Any]], str]


class BudgetMeter(Protocol):
    """The budgets as the settings say now, and today's spend of every run (:class:`~.spend.SpendMeter`)."""

    def limits(self) -> Limits: ...

    def spent(self, day: str) -> float: ...

    def add(self, cost: float | None, at: datetime) -> None: ...


class HealthView(Protocol):
    """Where the daemon's own troubles go (``status``, ``doctor``, one notification): not the agent's failures."""

    def trouble(self, kind: str, message: str) -> None: ...

    def recovered(self, kinds: Sequence[str]) -> None: ...


@dataclass
class Ports:
    """Everything an executor needs from the world."""

    delegate: Delegate
    escalator: Escalator
    claims: ClaimsView
    emitter: Emitter
    render_text: Renderer
    render_path: Renderer
    clock: Clock = field(default_factory=SystemClock)
    rng: random.Random = field(default_factory=random.Random)
    health: HealthView | None = None
    budget: BudgetMeter | None = None  # None: no budget is checked (spend is still recorded)


# ---------------------------------------------------------------- helpers


def new_run_id(workflow: str, now: datetime, suffix: str | None = None) -> str:
    """A BSI-style session id for a run: ``sess-YYYYMMDD-HHMM-<workflow>-<hex>`` (``suffix`` instead of the random
    hex: an id derived from what the run acts on)."""
    slug = "".join(c if c.isalnum() or c == "-" else "-" for c in workflow.lower()).strip("-")[:40] or "run"
    return f"sess-{now:%Y%m%d-%H%M}-{slug}-{suffix or secrets.token_hex(2)}"


def item_claim_id(run_id: str, item: ItemState, form: str) -> str:
    """The claim id of an item (``-item-NNN``) or a chain step (``-step-N``)."""
    if form == "chain":
        return f"{run_id}-step-{item.name}"
    return f"{run_id}-item-{item.index + 1:03d}"


T = TypeVar("T")
_RETRY_FIRST_S = 0.5  # a write that failed for want of space or descriptors is tried again after this, doubling
_RETRY_MAX_S = 15.0

#: The troubles an agent that started and answered shows are over (a full disk ends when writes succeed again).
_RECOVERED_BY_AN_AGENT = ("descriptors", "memory", "processes")


def daemon_failure(exc: BaseException) -> AttemptResult:
    """An attempt that ambient itself failed to carry out (an exception, not an answer): an ``error`` that names
    the daemon's resource when it ran out of one, so nobody blames the agent; retried by the workflow's policy."""
    kind = resource_of(exc, spawning=True)
    if kind is not None:
        return AttemptResult(result="error", error=describe(kind, str(exc)), trouble=kind)
    return AttemptResult(result="error", error=f"ambient failed to carry out the attempt (not the agent): {exc!r}")


def _step_result(status: AttemptStatus) -> str:
    # An agent's ESCALATE or BLOCKED_ON is not a success: the run record counts it as a fail.
    return status if status in ("success", "fail", "error") else "fail"


def _iso(dt: datetime) -> str:
    return dt.isoformat(timespec="milliseconds")


def run_record(state: RunState) -> RunRecord:
    """The ADR-027 summary record of a finished run."""
    started = (
        datetime.fromisoformat(state.started_at)
        if state.started_at
        else datetime.fromisoformat(state.finished_at or "1970-01-01T00:00:00+00:00")
    )
    return RunRecord(
        run_id=state.run_id,
        workflow=state.workflow,
        spec_hash=state.spec_hash,
        started_at=started,
        completed_at=datetime.fromisoformat(state.finished_at) if state.finished_at else None,
        outcome=state.outcome or "running",  # type: ignore[arg-type]
        steps=[StepRecord.model_validate(s) for s in state.steps],
        escalations=state.escalation_count,
        errors=state.error_count,
        decisions=[DecisionRecord.model_validate(d) for d in state.decisions if "escalation" in d and "option" in d],
        gated=list(state.gated),
        asked=list(state.asked),
        reached_end=state.form == "chain" and state.cursor >= len(state.items),
        form=state.form if state.form in ("for_each", "chain") else None,  # type: ignore[arg-type]
        total=len(state.items),
        done=state.success_count,
        **state.usage.to_record(),
    )


# ---------------------------------------------------------------- executor


class RunExecutor:
    """Carries out one for_each run until it finishes or waits on the person."""

    def __init__(
        self,
        state: RunState,
        plan: FanOut,
        template: ItemTemplate,
        ports: Ports,
        journal: Journal,
        paths: BrainPaths,
    ) -> None:
        self.state = state
        self.plan = plan
        self.template = template
        self.ports = ports
        self.journal = journal
        self.paths = paths
        self._by_name = {it.name: it for it in state.items}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._closing = False
        self._parked = False
        self._counts: dict[str, int] | None = None  # items per status (see _status_counts)
        self._open_from = 0  # no item before this index is pending or retry_wait (see _ready)
        self.on_park: Callable[[], None] | None = None
        self.slots: AgentSlots | None = None  # the daemon-wide cap (None: only the run's own concurrency)
        self.on_agent_end: Callable[[], None] | None = None  # an agent's work ended (the manager drains on stop)
        self._holding: set[str] = set()  # items whose agent holds one of those slots
        self._short = False  # ready items wait for a slot another run holds: busy, not parked

    # -- events

    def event(self, ev: str, **fields: Any) -> dict[str, Any]:
        """Append an event to the journal (buffered) and apply it to the state."""
        record = {"ev": ev, **fields, "at": _iso(self.ports.clock.now())}
        self.journal.write(record)
        item = self._by_name.get(str(fields["item"])) if "item" in fields else None
        before = item.status if item is not None else None
        apply_event(self.state, self._by_name, record)
        if item is None:
            self._open_from = 0  # a run-wide event (added, reset...) may reopen any item
        elif item.status in ("pending", "retry_wait") and item.index < self._open_from:
            self._open_from = item.index
        counts = self._counts
        if counts is not None:
            if item is not None and before is not None and ev != "added" and fields.get("action") not in ABORTING:
                if item.status != before:  # an item event moves only that item
                    counts[before] -= 1
                    counts[item.status] = counts.get(item.status, 0) + 1
            else:
                self._counts = None  # run-wide events (abort, added...): count again when next needed
        return record

    def _status_counts(self) -> dict[str, int]:
        # Performance: RunState.counts() walks every item; vars_for needs it for every item started, which made
        # a fan-out quadratic (bench/fanout.py). Kept up to date by event(), recounted after run-wide events.
        if self._counts is None:
            self._counts = self.state.counts()
        return self._counts

    @property
    def waiting(self) -> bool:
        """Parked: no agent runs and nothing moves until the person decides (or a retry timer fires). An item
        still "running" with no task behind it is not waiting on the person: never called idle."""
        return (
            self._parked and not self._tasks and not self.state.finished and not self._status_counts().get("running", 0)
        )

    async def _wait_wake(self, delay: float | None) -> None:
        """Sleep until poked (a task ended, a decision arrived, a slot was freed) or ``timeout``; parked when
        nothing runs and nothing waits for a slot."""
        self._parked = not self._tasks and not self._short
        if self._parked and self.on_park is not None:
            self.on_park()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
        finally:
            self._parked = False

    def has_item(self, name: str) -> bool:
        """Whether the run has an item (or chain step) called ``name``."""
        return name in self._by_name

    @property
    def running_items(self) -> int:
        return len(self._tasks)

    @property
    def busy(self) -> bool:
        """An agent of this run is at work."""
        return bool(self._tasks)

    def close(self) -> None:
        """Start nothing more (shutdown): what runs goes on until it ends or the run is cancelled."""
        self._closing = True
        self.poke()

    def poke(self) -> None:
        """Wake the executor (a decision arrived, or shutdown)."""
        self._parked = False  # at once: an idle check in this same tick must see it moving
        self._wake.set()

    # -- main loop

    async def run(self) -> RunState:
        """Drive the run; returns when it is finished, parked on the person, or cancelled."""
        # The run's task copied the context of the engine tick that created it: without this, every line of the
        # run carried that tick's number for ever (a misleading ``tick`` seen in the e2e JSON logs).
        structlog.contextvars.unbind_contextvars("tick")
        with structlog.contextvars.bound_contextvars(run_id=self.state.run_id, workflow=self.state.workflow):
            try:
                return await self._loop()
            except asyncio.CancelledError:
                await self._interrupt()
                raise
            finally:
                for name in list(self._holding):  # taken for items whose agents never started (a stop)
                    self._release(name)
                if self.slots is not None:
                    self.slots.leave(self)

    async def _loop(self) -> RunState:
        while not self.state.finished:
            now = self.ports.clock.now()
            if not self._closing:
                ready = self._ready(now)
                held = bool(ready) and await self._held(now)
                batch = self._with_slots([] if held else ready)
                if batch:
                    await self._accept(batch)
            counts = self._status_counts()
            aborted = self.state.aborted or counts.get("aborted", 0) > 0
            complete = sum(counts.get(s, 0) for s in TERMINAL_ITEM) == counts["total"]
            if not self._tasks and (aborted or complete):
                await self._finish()
                break
            self._wake.clear()
            if self._ready_now():
                continue
            wake_at = next_wakeup(self.state) if counts.get("retry_wait") else None
            wake_at = self._hold_wakeup(wake_at)
            timeout = max(0.0, (wake_at - now).total_seconds()) if wake_at else None
            await self._wait_wake(timeout)
        return self.state

    # -- holds: budgets and the provider (ambient.engine.budget holds the rules)

    def _breach(self, today: str) -> Breach | None:
        """The budget the run has reached today, or None (no meter: no budget)."""
        meter = self.ports.budget
        if meter is None:
            return None
        return breach(
            meter.limits(),
            run_spent=self.state.usage.cost_usd,
            run_raised=self.state.raised_run_usd,
            day_spent=meter.spent(today),
            day_raised=self.state.raised_day_usd.get(today, 0.0),
            day=today,
        )

    def _hold_state(self, now: datetime) -> Literal["free", "held", "act"]:
        """Where the run stands with its holds, without acting: ``held`` (nothing to do but wait), ``act`` (a hold to
        ask about or lift, a budget reached: :meth:`_held` must run), ``free``. Synchronous, so the loop checks it
        again after clearing its wake-up: a decision that came meanwhile is never missed."""
        today = day_of(now)
        held = False
        for hold in self.state.holds.values():
            step = hold_step(hold, today)
            if step != "held":
                return "act"
            held = True
        if held:
            return "held"
        return "act" if self._breach(today) is not None else "free"

    async def _held(self, now: datetime) -> bool:
        """Whether no new agent of the run may start now: a hold (asked about once, kept until answered), or a
        budget reached now (it becomes a hold). Called by the run's loop only, before an attempt starts."""
        if not self.state.holds and self.ports.budget is None:
            return False
        today = day_of(now)
        blocked = False
        for kind in list(self.state.holds):
            hold = self.state.holds[kind]
            step = hold_step(hold, today)
            if step == "lift":  # a daily hold answered wait: a new UTC day
                self.event("unhold", hold=kind, reason=f"a new UTC day ({today})")
                continue
            if step == "ask":
                await self._ask_hold(kind)
            blocked = True
        if blocked:
            return True
        reached = self._breach(today)
        if reached is None:
            return False
        log.warning("run_over_budget", **reached.record())
        self.event("hold", **reached.record())
        await self._ask_hold(reached.which)
        return True

    async def _ask_hold(self, kind: str) -> None:
        """One escalation for the run and its hold (the hold records it: never asked twice while pending)."""
        hold = self.state.holds[kind]
        esc_kind = ESCALATION_KIND.get(kind, kind)
        question = provider_question(hold) if esc_kind == "provider" else budget_question(self.state.workflow, hold)
        req = EscalationRequest(
            run_id=self.state.run_id,
            workflow=self.state.workflow,
            item=None,
            agent=hold.get("agent") if isinstance(hold.get("agent"), str) else None,
            kind=esc_kind,
            question=question,
            options=hold_options(hold),
            dedupe_key=f"{self.state.run_id}/-/{kind}/{'again' if hold.get('waited') else 'hold'}",
            detail=HOLD_DETAIL.get(kind, kind),
        )
        esc_id = await self.durably(lambda: self.ports.escalator.escalate(req))
        self.event("asked", escalation=esc_id, request=req.record())
        self.event("escalated", escalation=esc_id, kind=esc_kind, hold=kind, agent=req.agent)
        await self.commit()
        self.ports.claims.run_changed(self.state)

    def _hold_wakeup(self, wake_at: datetime | None) -> datetime | None:
        """When a daily hold answered wait lifts (the next UTC day), if that is sooner than ``wake_at``."""
        for hold in self.state.holds.values():
            if hold.get("hold") == "daily" and hold.get("waited") and not hold.get("escalation"):
                at = next_day(self.ports.clock.now())
                wake_at = at if wake_at is None or at < wake_at else wake_at
        return wake_at

    def _hold_result(self, item: ItemState, attempt: int, res: AttemptResult, agent: str | None = None) -> bool:
        """An attempt whose result holds the run (the provider refused the key): the item goes back to pending
        under the same attempt number (none spent, no retry counted, no item escalation) and the run holds, once
        however many items hit it. False for any other result."""
        kind = HOLD_OF_RESULT.get(res.hold or "")
        if kind is None:
            return False
        agent = agent or self.template.agent
        self.event(
            "finished",
            item=item.name,
            attempt=attempt,
            agent=agent,
            key=self._key(item, attempt),
            result="interrupted",
            error=res.error,
            duration_ms=res.duration_ms,
            hold=res.hold,
            **({"usage": res.usage} if res.usage else {}),
        )
        self._spent(res)
        if kind not in self.state.holds and not self.state.finished:
            self.event("hold", hold=kind, error=(res.error or res.hold or "")[:1000], agent=agent)
            log.warning("run_held", hold=kind, item=item.name, error=res.error)
        return True

    def _spent(self, res: AttemptResult) -> None:
        """The attempt's cost to today's meter (the run's own total is the journal's, folded)."""
        if res.usage and self.ports.budget is not None:
            cost = res.usage.get("cost_usd")
            if isinstance(cost, int | float) and not isinstance(cost, bool):
                self.ports.budget.add(float(cost), self.ports.clock.now())

    def _usage_fields(self, res: AttemptResult) -> dict[str, Any]:
        """The ``finished`` event's fields about cost and permissions (absent when the attempt has none)."""
        out: dict[str, Any] = {}
        if res.usage:
            out["usage"] = res.usage
        signature = permission_signature(res.permission) if res.result == "escalate" else None
        if signature is not None:
            out["permission_signature"] = signature
        return out

    def _ready(self, now: datetime) -> list[ItemState]:
        # Performance (bench/fanout.py): scanning every item on every step made a fan-out quadratic; the counts
        # and the cursor kept by event() give ready_items the same answer from where the open items start.
        self._open_from = first_open(self.state, self._open_from)
        counts = self._status_counts()
        # The cap counts agents (items accepted and not finished), not tasks: a task whose agent is done may
        # still wait for its fsync round (see _run_item). An item whose task has not ended is not started twice.
        batch = ready_items(
            self.state,
            self.plan,
            now,
            counts.get("running", 0),
            start=self._open_from,
            aborted=self.state.aborted or counts.get("aborted", 0) > 0,
        )
        return [it for it in batch if it.name not in self._tasks]

    def _ready_now(self) -> bool:
        if self._closing:
            return False
        now = self.ports.clock.now()
        ready = bool(self._ready(now))
        if ready and (self.state.holds or self.ports.budget is not None):
            hold = self._hold_state(now)
            if hold != "free":
                self._short = False
                return hold == "act"
        self._short = ready and self.slots is not None and not self.slots.available(self)
        return ready and not self._short

    def _with_slots(self, batch: list[ItemState]) -> list[ItemState]:
        """The part of ``batch`` the daemon-wide cap lets start now; each started agent holds a slot."""
        if self.slots is None:
            return batch
        if not batch:
            self.slots.leave(self)  # nothing to start: out of the queue, so freed slots go to runs that wait
            self._short = False
            return batch
        got = self.slots.take(self, len(batch), self.poke)
        self._short = got < len(batch)
        batch = batch[:got]
        self._holding.update(it.name for it in batch)
        return batch

    async def commit(self) -> None:
        """The journal's records on disk, waiting out a full disk (see :meth:`durably`)."""
        await self.durably(self.journal.commit)

    async def durably(self, op: Callable[[], Awaitable[T]]) -> T:
        """``op``, again and again while it fails for want of a resource of the daemon's (a full disk, no
        descriptor left): the run holds still, starting nothing, and goes on by itself once it succeeds (issue
        24, 3-4). The trouble goes to the daemon's health (status, doctor, one notification) and ends with it.
        Other errors are raised. Cancelled by a stop like any wait."""
        delay = _RETRY_FIRST_S
        kind: str | None = None
        while True:
            try:
                result = await op()
            except OSError as exc:
                kind = resource_of(exc)
                if kind is None:
                    raise
                where = exc.filename if isinstance(exc.filename, str) else str(self.journal.path.parent)
                message = describe(kind, exc.strerror or str(exc), str(Path(where).parent))
                log.warning("waiting_for_resources", resource=kind, error=str(exc), retry_in_s=delay)
                if self.ports.health is not None:
                    self.ports.health.trouble(kind, message)
                await asyncio.sleep(delay)  # a timer of the daemon's own, not a test's: the disk frees when it will
                delay = min(delay * 2, _RETRY_MAX_S)
                continue
            if kind is not None and self.ports.health is not None:
                self.ports.health.recovered([kind])
            return result

    def _release(self, name: str) -> None:
        """The item's agent is done (or will never run): its slot goes back, once."""
        if self.on_agent_end is not None:
            self.on_agent_end()
        if name in self._holding:
            self._holding.discard(name)
            assert self.slots is not None
            self.slots.give(self)

    async def _accept(self, batch: list[ItemState]) -> None:
        # spec: "accepted" means "on disk" before the agent starts; one fsync for the whole batch.
        starts: list[tuple[ItemState, int]] = []
        for item in batch:
            attempt = next_attempt(item)
            self.event("accepted", item=item.name, attempt=attempt, key=self._key(item, attempt))
            starts.append((item, attempt))
        await self.commit()
        for item, attempt in starts:
            self.ports.claims.item_changed(self.state, item)
            task = asyncio.create_task(self._run_item(item, attempt), name=f"item:{item.name}")
            self._tasks[item.name] = task
            task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        name = task.get_name().removeprefix("item:")
        self._tasks.pop(name, None)
        self._release(name)  # a task cancelled or crashed before its agent was done
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            log.error("item_task_crashed", item=name, error=repr(exc), exc_info=exc)
            self._settle(name, exc)
        self.poke()  # not parked any more: the loop has a result to route (an idle check must not stop us)

    def _settle(self, name: str, exc: BaseException) -> None:
        """An item whose task died before its result was written would stay "running" for ever: holding the
        run's concurrency, never retried, and the run looking idle (issue 24, 4). It gets ambient's error as its
        result, routed like any other (retried by the workflow's policy, then escalated)."""
        item = self._by_name.get(name)
        if item is None or item.status != "running" or self._closing:
            return
        task = asyncio.create_task(self._record(item, item.attempt, daemon_failure(exc)), name=f"item:{name}")
        self._tasks[name] = task
        task.add_done_callback(self._task_done)

    def _key(self, item: ItemState, attempt: int) -> str:
        return f"{self.state.run_id}/{item.name}/{attempt}"

    def vars_for(self, item: ItemState) -> dict[str, Any]:
        """Template variables for one item: only the workflow's own data (:func:`item_runner_values`)."""
        counts = self._status_counts()
        values = item_values(
            item=item.name,
            index=item.index + 1,
            total=counts["total"],
            workflow=self.state.workflow,
            run_id=self.state.run_id,
        )
        return item_runner_values(values, item.attempt)

    def _render_context(self, value: Any, variables: Mapping[str, Any]) -> Any:
        if isinstance(value, str):
            return self.ports.render_text(value, variables)
        if isinstance(value, Mapping):
            return {str(k): self._render_context(v, variables) for k, v in value.items()}
        if isinstance(value, list):
            return [self._render_context(v, variables) for v in value]
        return value

    def build_attempt(self, item: ItemState, attempt: int) -> Attempt:
        """Render the item's SPAWN from the pinned spec (templating from the workflow's data only)."""
        variables = self.vars_for(item)
        files = tuple(self.ports.render_path(f, variables) for f in self.template.files)
        # payload.context: the workflow's for_each.context rendered for the item, then the run's own context (from
        # `ambient start --context` or an ORCHESTRATE; it wins, as in a chain), then the item and the person's answer.
        context = {**self._render_context(dict(self.template.context), variables), **self.state.context}
        context.setdefault("item", item.name)
        decision = self._last_decision_for(item)
        if decision is not None:
            context["decision"] = decision
        return Attempt(
            run_id=self.state.run_id,
            workflow=self.state.workflow,
            item=item.name,
            index=item.index,
            attempt=attempt,
            key=self._key(item, attempt),
            agent=self.template.agent,
            sender=self.template.sender,
            files=files,
            zone=self.template.zone,
            context=context,
            claim_id=item_claim_id(self.state.run_id, item, self.state.form),
            timeout_s=self.template.timeout_s,
            vars=variables,
        )

    def _last_decision_for(self, item: ItemState) -> str | None:
        """The person's answer to the item's own question, in the agent's words (its option as it proposed it)."""
        for d in reversed(self.state.decisions):
            if d.get("item") == item.name and d.get("action") == ANSWER:
                return str(d.get("answer") or d.get("option"))
        return None

    async def _run_item(self, item: ItemState, attempt: int) -> None:
        # Bound without a reset: this runs as the item's own task (see _accept), in a copy of the run's context
        # that ends with it. Performance (bench/fanout.py): the ``bound_contextvars`` context manager cost ~11 µs
        # per item, binding alone ~2 µs.
        structlog.contextvars.bind_contextvars(item=item.name, attempt=attempt)
        try:
            a = self.build_attempt(item, attempt)
        except Exception as exc:  # noqa: BLE001 - a template that cannot render fails the item, not the run
            res = AttemptResult(result="error", error=f"cannot build the SPAWN: {exc}")
        else:
            try:
                res = await self.carry_out(a)
            finally:
                self._release(item.name)  # the agent is done: another run's agent may start now
        await self._record(item, attempt, res)

    async def carry_out(self, a: Attempt) -> AttemptResult:
        """The attempt through the delegate; an exception is ambient's failure, not the agent's: an ``error``
        result (retried by the workflow's policy), and a resource the daemon ran out of goes to its health."""
        try:
            res = await self.ports.delegate.attempt(a)
        except Exception as exc:  # ambient failed, not the agent: recorded, retried by the workflow's policy
            res = daemon_failure(exc)
            log.error("attempt_crashed", item=a.item, attempt=a.attempt, error=res.error, exc_info=exc)
        health = self.ports.health
        if health is not None:
            if res.trouble is not None:
                health.trouble(res.trouble, res.error or res.trouble)
            elif res.result != "error":
                health.recovered(_RECOVERED_BY_AN_AGENT)
        return res

    async def _record(self, item: ItemState, attempt: int, res: AttemptResult) -> None:
        """The attempt's result to the journal, routed (retry, escalate, next), committed, then the item's claim."""
        if self._hold_result(item, attempt, res):
            self.poke()
            await self.commit()
            self.ports.claims.item_changed(self.state, item)
            return
        self.event(
            "finished",
            item=item.name,
            attempt=attempt,
            agent=self.template.agent,
            key=self._key(item, attempt),
            result=_step_result(res.result),
            output=res.output,
            error=res.error,
            duration_ms=res.duration_ms,
            signal_in=res.signal_in,
            reply=res.reply,
            question=res.question,
            **self._usage_fields(res),
        )
        self._spent(res)
        await self._route(item, res)
        # The agent is done: its slot is free now, so the next item's ``accepted`` joins this fsync round
        # instead of waiting for it (bench/fanout.py (b): two fsync rounds in a row per slot before).
        self.poke()
        await self.commit()
        self.ports.claims.item_changed(self.state, item)

    async def _route(self, item: ItemState, res: AttemptResult) -> None:
        now = self.ports.clock.now()
        outcome = after_attempt(self.plan, item, res.result, now, self.ports.rng, retryable=res.retryable)
        reaction = outcome.reaction
        if "log" in reaction.verbs or res.result == "error":
            log.warning("item_failed", item=item.name, result=res.result, error=res.error)
        if "error" in reaction.verbs and res.result != "success":
            payload = {"context": {"item": item.name, "error": res.error or ""}}
            await self.ports.emitter.emit("ERROR", self.template.escalate_to, payload, self.state)
        if outcome.kind == "retry" and outcome.not_before is not None:
            self.event("retry", item=item.name, attempt=item.attempt, not_before=_iso(outcome.not_before))
        elif outcome.kind == "escalate":
            await self._escalate_item(item, res)
        elif outcome.kind == "failed" and "abort" in reaction.verbs:
            self.event(
                "decided", item=item.name, escalation="", option="abort", action="abort", by="workflow", channel="rule"
            )

    async def _escalate_item(self, item: ItemState, res: AttemptResult) -> None:
        signature = permission_signature(res.permission) if res.result == "escalate" else None
        if signature is not None:
            # A tool call the agent waits on the person for: its question and options as it gave them; a learned
            # rule matches the exact call (learning.situation_of), never a normalised one.
            options = question_options(res.options or ["allow", "deny"])
            kind = "permission"
            question = res.question or f"{self.template.agent} wants to run {signature} on {item.name}"
            detail = signature
        elif res.result == "escalate":
            options = question_options(res.options or ["continue"])  # what the agent's ESCALATE packet carried
            kind = "question"
            question = res.question or f"{self.template.agent} asks a decision about {item.name}"
            detail = res.question or ""
        else:
            options = [(k, label, k) for k, label in ITEM_OPTIONS]
            options += list(self.template.extra_options)
            kind = "blocked" if res.result == "blocked" else ("error" if res.result == "error" else "fail")
            what = {"fail": "failed", "error": "hit an error", "blocked": "is blocked"}[kind]
            who = "ambient" if res.trouble else self.template.agent  # the daemon's own failure: not the agent's
            question = f"{who} {what} on {item.name}" + (f": {res.error}" if res.error else "")
            detail = res.error or ""
        req = EscalationRequest(
            run_id=self.state.run_id,
            workflow=self.state.workflow,
            item=item.name,
            agent=self.template.agent,
            kind=kind,
            question=question[:2000],
            options=options,
            dedupe_key=f"{self.state.run_id}/{item.name}/{kind}",
            deadline_s=self.template.deadline_s,
            on_timeout=self.template.on_timeout,
            remind_before_s=self.template.remind_before_s,
            detail=detail,
        )
        esc_id = await self.durably(lambda: self.ports.escalator.escalate(req))
        self.event("asked", escalation=esc_id, request=req.record())
        self.event("escalated", item=item.name, escalation=esc_id, kind=kind, agent=self.template.agent)

    def abort(self, *, by: str, reason: str) -> None:
        """Stop the run (an ABORT packet): unfinished items are aborted, running agents are cancelled."""
        before = self._statuses()
        self.event("abort", by=by, reason=reason)
        self.journal.sync()
        self._stop_aborted(before)
        self.poke()

    def _statuses(self) -> list[str]:
        return [it.status for it in self.state.items]

    def _stop_aborted(self, before: list[str]) -> None:
        """After an abort: the running agents are stopped and every item it changed shows so in its claim."""
        for task in list(self._tasks.values()):
            task.cancel()
        for item, was in zip(self.state.items, before, strict=False):
            if item.status != was:
                self.ports.claims.item_changed(self.state, item)

    def decide(
        self,
        escalation: str,
        option: str,
        action: str,
        *,
        by: str,
        channel: str,
        latency_s: float | None,
        note: str | None = None,
        rule: str | None = None,
        answer: str | None = None,
    ) -> bool:
        """Apply the person's (or a rule's) decision; False if this run does not wait on it.

        ``answer``: the chosen option as the agent proposed it (its key is a slug of it), handed back to the agent.
        """
        if escalation not in self.state.escalations:
            return False
        item = self.state.escalations[escalation] or None
        extra = {"answer": answer} if answer is not None and action == ANSWER else {}
        before = self._statuses()
        self.event(
            "decided",
            item=item,
            escalation=escalation,
            option=option,
            action=action,
            by=by,
            channel=channel,
            latency_s=latency_s,
            note=note,
            auto=rule is not None,
            rule=rule,
            **extra,
        )
        self.journal.sync()
        if aborts_run(self.state.form, action, item):
            self._stop_aborted(before)
        elif item is not None:
            self.ports.claims.item_changed(self.state, self._by_name[item])
        self.poke()
        return True

    async def _finish(self) -> None:
        outcome = outcome_of(self.state)
        t = self.template
        if outcome != "aborted" and t.complete_signal and t.complete_to:
            items = self.state.items
            failed = [it for it in items if it.status in ("failed", "aborted")]
            variables = completion_values(
                total=len(items),
                success=self.state.success_count,
                failed=len(failed),
                errors=sum(1 for it in failed if it.result == "error"),
                skipped=sum(1 for it in items if it.status == "skipped"),
                workflow=self.state.workflow,
                run_id=self.state.run_id,
            )
            result = self.ports.render_text(t.complete_result, variables) if t.complete_result else outcome
            await self.ports.emitter.emit(t.complete_signal, t.complete_to, {"result": result}, self.state)
        self.event("finished_run", outcome=outcome)
        try:
            await self.commit()
        except asyncio.CancelledError:
            # A stop came while the record was being committed: the run is over all the same, so its summary
            # and closed claim go out now (the journal synced first) rather than wait for the next start's
            # catch-up (e2e: a run that finished just before SIGTERM was missing from runs.jsonl).
            self.journal.sync()
            self._summarize(outcome)
            raise
        await self.durably(lambda: self._summarize_now(outcome))

    async def _summarize_now(self, outcome: str) -> None:
        self._summarize(outcome)

    def _summarize(self, outcome: str) -> None:
        append_line(self.paths.runs_log, run_record(self.state).to_json_dict(), durable=True)
        self.ports.claims.run_changed(self.state)
        log.info("run_finished", outcome=outcome, items=len(self.state.items), escalations=self.state.escalation_count)

    async def _interrupt(self) -> None:
        """Shutdown: cancel running agents, record them as interrupted so a restart runs them again."""
        self._closing = True
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        del results
        for item in self.state.items:
            if item.status == "running":
                self.event("interrupted", item=item.name, attempt=item.attempt)
                self.ports.claims.item_changed(self.state, item)
        self.journal.sync()


# ---------------------------------------------------------------- manager


ExecutorFactory = Callable[[RunState, Journal], RunExecutor]


class RunManager:
    """Owns the run tasks: start, resume from disk, route decisions, drain on shutdown."""

    def __init__(self, paths: BrainPaths, factory: ExecutorFactory, clock: Clock | None = None) -> None:
        self.paths = paths
        self.factory = factory
        self.clock = clock or SystemClock()
        self.executors: dict[str, RunExecutor] = {}
        self.tasks: dict[str, asyncio.Task[RunState]] = {}
        self.on_finished: list[Callable[[RunState], Awaitable[None] | None]] = []
        self.on_park: list[Callable[[], None]] = []  # a run went idle (waits on the person)
        self.slots = AgentSlots(DEFAULT_SLOTS)  # the daemon-wide cap; resized from the settings
        self._agent_ended = asyncio.Event()  # set by the executors when an agent's work ends (shutdown's drain)
        # Workflows that have a run journal on disk (filled by resume_all and start): a workflow file seen for
        # the first time is not started again when its run was already started before a crash.
        self.journaled: set[str] = set()

    def start(
        self,
        *,
        workflow: str,
        form: str,
        spec: Mapping[str, Any],
        spec_hash: str | None,
        items: Sequence[str],
        mode: str | None = None,
        trigger: str = "file",
        context: Mapping[str, Any] | None = None,
        run_id: str | None = None,
    ) -> str:
        """Start a run: its ``started`` event (with the pinned spec) is on disk before anything runs. ``run_id``: one
        the caller derived from what it acts on, so that acting twice (after a restart) finds the run it started."""
        now = self.clock.now()
        run_id = run_id or new_run_id(workflow, now)
        journal = Journal(self.paths.run_journal(run_id))
        record = {
            "ev": "started",
            "run_id": run_id,
            "workflow": workflow,
            "form": form,
            "spec_hash": spec_hash,
            "spec": dict(spec),
            "items": list(items),
            "mode": mode,
            "trigger": trigger,
            "context": dict(context or {}),
            "at": _iso(now),
        }
        journal.write(record)
        try:
            journal.sync()
        except OSError:
            # No room for the run (a full disk): no journal is left behind, so the next try starts it afresh.
            path = journal.path
            with contextlib.suppress(OSError):
                journal.close()
            with contextlib.suppress(OSError):
                if path.stat().st_size == 0:
                    path.unlink()
            raise
        state = fold([record])
        self.journaled.add(workflow)
        self._launch(state, journal)
        log.info("run_started", run_id=run_id, workflow=workflow, items=len(items), trigger=trigger)
        return run_id

    def _launch(self, state: RunState, journal: Journal) -> None:
        ex = self.factory(state, journal)
        ex.slots = self.slots
        ex.on_agent_end = self._agent_ended.set
        ex.ports.claims.run_changed(state)
        self.executors[state.run_id] = ex
        ex.on_park = self._parked
        task = asyncio.create_task(ex.run(), name=f"run:{state.run_id}")
        self.tasks[state.run_id] = task
        run_id = state.run_id
        task.add_done_callback(lambda t: self._done(run_id, t))

    def _parked(self) -> None:
        for cb in self.on_park:
            cb()

    def _done(self, run_id: str, task: asyncio.Task[RunState]) -> None:
        self.tasks.pop(run_id, None)
        ex = self.executors.get(run_id)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("run_crashed", run_id=run_id, error=repr(exc))
            return
        if ex is not None and ex.state.finished:
            self.executors.pop(run_id, None)
            ex.journal.close()
            for cb in self.on_finished:
                r = cb(ex.state)
                if asyncio.iscoroutine(r):
                    asyncio.ensure_future(r)  # noqa: RUF006 - callbacks are short; errors are logged by them

    def resume_all(self) -> list[str]:
        """Fold every unfinished run journal and continue it (the reconciliation pass)."""
        resumed: list[str] = []
        directory = self.paths.run_journals
        if not directory.is_dir():
            return resumed
        behind: list[tuple[RunState, Path]] = []
        unfinished: list[tuple[RunState, Path]] = []
        unreadable: list[str] = []
        for path in sorted(directory.glob("*.jsonl")):
            run_id = path.stem
            if run_id in self.executors:
                continue
            glance = finished_glance(path)
            if glance is not None and self._views_current_at(run_id, glance[1]):
                self.journaled.add(glance[0])  # finished, its views written: nothing to fold
                continue
            res = read_jsonl(path)
            if res.torn_tail:
                _truncate_torn_tail(path, self.paths.rel(path))
            try:
                state = fold(res.records)
            except (ValueError, KeyError, TypeError) as exc:
                # A problem of this run only (an edited journal): reported at file:line, not resumed, its workflow
                # not started again as if never seen; its agents, if any still run, are found by their environment.
                problem = journal_problem(path, self.paths.rel(path), exc)
                log.error(
                    "run_history_unreadable", run_id=run_id, file=problem.file, line=problem.line, error=problem.message
                )
                first = res.records[0] if res.records else {}
                if isinstance(first.get("workflow"), str):
                    self.journaled.add(first["workflow"])
                unreadable.append(run_id)
                continue
            self.journaled.add(state.workflow)
            if state.finished:
                if not self._views_current(state):
                    behind.append((state, path))
                continue
            unfinished.append((state, path))
        _stop_orphans(self.paths.root, [state for state, _ in unfinished], unreadable)
        for state, path in unfinished:
            run_id = state.run_id
            in_flight = [it.name for it in state.in_flight()]
            journal = Journal(path)
            by_name = {it.name: it for it in state.items}
            for name in in_flight:
                # Running at the crash: the agent may or may not have finished; run it again (at least once).
                ev = {
                    "ev": "interrupted",
                    "item": name,
                    "attempt": by_name[name].attempt,
                    "reason": "restart",
                    "at": _iso(self.clock.now()),
                }
                journal.write(ev)
                apply_event(state, by_name, ev)
            try:
                journal.sync()
            except Unwritten as exc:
                # A full disk: the records wait in memory, ahead of the ``accepted`` of any new attempt, which
                # is committed before its agent starts (RunExecutor.durably waits for space).
                log.warning("waiting_for_resources", resource=resource_of(exc), error=str(exc), run_id=run_id)
            self._launch(state, journal)
            # Item claims are views written after the journal (for_each ones coalesced): a kill can leave them
            # behind it, so every item already touched is written again from the journal (no ghost "open" claim).
            ex = self.executors[run_id]
            for it in state.items:
                if it.attempt or it.status != "pending":
                    ex.ports.claims.item_changed(state, it)
            resumed.append(run_id)
            log.info(
                "run_resumed",
                run_id=run_id,
                workflow=state.workflow,
                in_flight=in_flight,
                done=state.success_count,
                total=len(state.items),
            )
        if behind:
            self._catch_up(behind)
        return resumed

    def _views_current(self, state: RunState) -> bool:
        """Whether a finished run's views were written after it finished: its run claim (written last, after its
        item claims and its summary) is newer than its ``finished_run`` record.

        The kernel stamps files from a coarse clock (a tick, up to 10 ms, behind the one ``finished_at`` comes
        from): a claim written within a tick of the end may look older than it is. There the claim itself
        decides (closed or failed: written after the end), read only for those few runs.
        """
        return self._views_current_at(state.run_id, state.finished_at)

    def _views_current_at(self, run_id: str, finished_at: str | None) -> bool:
        path = self.paths.claims / f"{run_id}.yml"
        try:
            st = os.lstat(path)
        except OSError:
            return False
        try:
            finished = datetime.fromisoformat(finished_at).timestamp() if finished_at else None
        except ValueError:
            return True  # an unreadable time cannot say it is behind
        if finished is None:
            return True
        age = st.st_mtime_ns / 1e9 - finished
        if age >= _COARSE_CLOCK_S:
            return True
        if age < -_COARSE_CLOCK_S:
            return False
        return _claim_closed(path)

    def _catch_up(self, behind: list[tuple[RunState, Path]]) -> None:
        """Finish what a crash cut after a run's ``finished_run``: its summary and its claims.

        Found by R-03 (tests/chaos/test_powerloss.py): a cut after the record was fsync'd but before the closed run
        claim was on disk left that claim ``open`` for good, since a finished run was never looked at again;
        a cut before the summary was appended would have left the run out of runs.jsonl. Each step is
        idempotent: the summary is appended only if runs.jsonl lacks it.
        """
        summarized = {r.get("run_id") for r in read_jsonl(self.paths.runs_log).records}
        for state, path in behind:
            if state.run_id not in summarized:
                try:
                    append_line(self.paths.runs_log, run_record(state).to_json_dict(), durable=True)
                except OSError as exc:  # a full disk: the next start catches up (the journal says it finished)
                    if resource_of(exc) is None:
                        raise
                    log.warning("waiting_for_resources", resource=resource_of(exc), error=str(exc))
                    continue
            journal = Journal(path)
            try:
                views = self.factory(state, journal).ports.claims
                for it in state.items:
                    if it.attempt or it.status != "pending":
                        views.item_changed(state, it)
                views.run_changed(state)  # the item claims first, then the run claim
            except Exception as exc:  # noqa: BLE001 - views of one old run must not keep the daemon from starting
                log.error("run_views_catch_up_failed", run_id=state.run_id, error=repr(exc))
                continue
            finally:
                journal.close()
            log.info(
                "run_views_caught_up",
                run_id=state.run_id,
                workflow=state.workflow,
                summary_appended=state.run_id not in summarized,
            )

    def record_spawn(self, run_id: str, item: str, attempt: int, pid: int, started: float | None = None) -> None:
        """A command agent started: its pid and start time go to the run's journal (flushed, not fsync'd:
        a daemon crash keeps the page cache, and a power cut takes the agent with it).

        ``started``: the start time the runner read already (off the loop); read here when not given.
        """
        ex = self.executors.get(run_id)
        if ex is None or not ex.has_item(item):
            return
        if started is None:
            # /proc/<pid>/stat directly (what psutil's create_time reads, to 10 ms): importing psutil here, on the
            # loop at the first spawn, stalled it ~130 ms and showed as a late watchdog ping (R-09 test).
            from ambient.core.process import process_start_time

            try:
                started = process_start_time(pid)  # None when the agent is already gone: the pid alone is recorded
            except Exception:  # noqa: BLE001 - an unreadable /proc entry must not fail the spawn
                started = None
        ex.event("spawned", item=item, attempt=attempt, pid=pid, started=started)
        ex.journal.flush()

    def ended_reason(self, run_id: str) -> str:
        """Why a settled run waits on nobody (:func:`ended_because`, from its journal): what the escalations it left
        behind say once cancelled (blocking: call through ``to_thread``)."""
        try:
            state = fold(read_jsonl(self.paths.run_journal(run_id)).records)
        except (OSError, ValueError, KeyError):
            return "its run is no longer running"
        return ended_because(state) if state.finished else "its run is no longer running"

    def settled(self, run_id: str) -> bool:
        """Whether nothing will ever resume a run: it is not running here, and its journal is finished or gone.

        A journal that cannot be read is not settled: the person may mend it (``ambient doctor`` reports it).
        """
        if run_id in self.executors:
            return False
        path = self.paths.run_journal(run_id)
        if not path.exists():
            return True
        if finished_glance(path) is not None:
            return True
        try:
            return fold(read_jsonl(path).records).finished
        except (OSError, ValueError, KeyError):
            return False

    def find_escalation(self, escalation: str) -> RunExecutor | None:
        """The executor waiting on an escalation."""
        for ex in self.executors.values():
            if escalation in ex.state.escalations:
                return ex
        return None

    def decide(
        self,
        escalation: str,
        option: str,
        action: str,
        *,
        by: str,
        channel: str,
        latency_s: float | None = None,
        note: str | None = None,
        rule: str | None = None,
        answer: str | None = None,
    ) -> bool:
        """Route a decision to the run that waits on it."""
        ex = self.find_escalation(escalation)
        if ex is None:
            return False
        return ex.decide(
            escalation, option, action, by=by, channel=channel, latency_s=latency_s, note=note, rule=rule, answer=answer
        )

    @property
    def idle(self) -> bool:
        """No agent runs and no run can move without the person (or a timer)."""
        return all(ex.waiting and next_wakeup(ex.state) is None for ex in self.executors.values())

    def active_runs(self) -> list[RunState]:
        return [ex.state for ex in self.executors.values()]

    async def shutdown(self, grace: float) -> None:
        """Stop every run: no new agent starts, the running ones get ``grace`` seconds (``shutdown_grace_s``) to
        finish their work, and those still running then are interrupted: their runners send the process group
        SIGTERM, then SIGKILL after the agent's ``kill_grace_s``; a restart runs those items again."""
        for ex in self.executors.values():
            ex.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while any(ex.busy for ex in self.executors.values()) and loop.time() < deadline:
            self._agent_ended.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._agent_ended.wait(), deadline - loop.time())
        tasks = list(self.tasks.values())
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=grace + 5)
        for ex in self.executors.values():
            with contextlib.suppress(OSError):
                ex.journal.close()


def _stop_orphans(brain: Path, states: Sequence[RunState], unreadable: Sequence[str] = ()) -> None:
    """Agents a crash of the daemon left running (kill -9 outside systemd) are stopped before their items run
    again, so the same item never runs twice at once: those the journal names (pid *and* start time: a recycled
    pid is somebody else's process) and those whose pid never reached it, found by their environment. The agents
    of a run whose journal does not fold (``unreadable`` run ids) are found by their environment alone."""
    from ambient.runners import orphans

    if not states and not unreadable:
        return
    found = [
        o
        for state in states
        for it in state.in_flight()
        if (o := orphans.by_journal(state.run_id, it.name, it.pid, it.pid_started)) is not None
    ]
    found += orphans.by_environment(brain, [*(state.run_id for state in states), *unreadable])
    orphans.stop(found)


_COARSE_CLOCK_S = 0.02  # file times lag the clock by up to a kernel tick; twice the longest (HZ=100)


def _claim_closed(path: Path) -> bool:
    """Whether the claim file at ``path`` says closed or failed (unreadable: no)."""
    from ambient.claims.claim import TERMINAL
    from ambient.core.errors import AmbientError
    from ambient.storage.yamlfile import MAX_CLAIM_BYTES, load_file

    try:
        doc, _ = load_file(path, max_bytes=MAX_CLAIM_BYTES)
    except (AmbientError, OSError):
        return False
    return isinstance(doc, dict) and doc.get("status") in TERMINAL


# The head of a run journal as Journal writes it (compact JSON, keys in this order); anything else is folded.
_STARTED_HEAD = re.compile(rb'\{"ev":"started","run_id":"[^"\\]*","workflow":("(?:[^"\\]|\\.)*")')
_GLANCE_BYTES = 4096


def journal_problem(path: Path, source: str, exc: Exception) -> Problem:
    """Why and where a run journal does not fold: ``file:line`` of the record that fails (:class:`HistoryError`
    gives its index among the records; lines that are blank or not JSON are not records)."""
    line = None
    index = exc.index if isinstance(exc, HistoryError) else None
    if index is not None:
        seen = -1
        try:
            with path.open("rb") as fh:
                for lineno, raw in enumerate(fh, 1):
                    if raw.strip() and raw.endswith(b"\n") and isinstance(_json_or_none(raw), dict):
                        seen += 1
                        if seen == index:
                            line = lineno
                            break
        except OSError:
            pass
    why = exc.message if isinstance(exc, HistoryError) else f"{type(exc).__name__}: {exc}"
    return Problem(
        file=source,
        line=line,
        message=f"run journal does not load ({why}); this run is not resumed",
    )


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def journal_problems(paths: BrainPaths) -> list[Problem]:
    """The run journals that do not fold, each a ``file:line`` problem (``ambient doctor``, ``ambient status``)."""
    found: list[Problem] = []
    if not paths.run_journals.is_dir():
        return found
    for path in sorted(paths.run_journals.glob("*.jsonl")):
        if finished_glance(path) is not None:
            continue
        try:
            fold(read_jsonl(path).records)
        except OSError:
            continue
        except (ValueError, KeyError, TypeError) as exc:
            found.append(journal_problem(path, paths.rel(path), exc))
    return found


def finished_glance(path: Path) -> tuple[str, str] | None:
    """(workflow, finished_at) of a finished run from its journal's first and last lines only; None when those do
    not tell (not finished, a torn or unusual line): the journal is then read and folded as a whole.

    Start-up walks every run journal ever written, and folding a finished one cost ~0.6 ms (26 lines): a start
    after 10,000 runs spent 6 s on runs that needed nothing.
    """
    try:
        with path.open("rb") as fh:
            head = fh.read(_GLANCE_BYTES)
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - _GLANCE_BYTES))
            tail = fh.read(_GLANCE_BYTES)
    except OSError:
        return None
    started = _STARTED_HEAD.match(head)
    if started is None or not tail.endswith(b"\n"):
        return None
    try:
        workflow = json.loads(started.group(1))
        last = json.loads(tail[:-1].rsplit(b"\n", 1)[-1])
    except ValueError:
        return None
    if not isinstance(last, dict) or last.get("ev") != "finished_run" or not isinstance(last.get("at"), str):
        return None
    return (workflow, last["at"]) if isinstance(workflow, str) else None


def _truncate_torn_tail(path: Path, source: str) -> None:
    """Cut a torn last line (crash mid-append) so new events start on a line of their own; reported as
    ``file:line`` (``source`` names the file), like every other problem with a file."""
    data = path.read_bytes()
    cut = data.rfind(b"\n") + 1
    if cut < len(data):
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            os.ftruncate(fd, cut)
            os.fsync(fd)  # the cut is what the next appends start from: on disk before they come
        finally:
            os.close(fd)
        line = data.count(b"\n", 0, cut) + 1
        problem = f"{source}:{line}: torn last line (a crash mid-append): {len(data) - cut} byte(s) cut"
        log.warning("journal_torn_tail_cut", path=str(path), line=line, bytes=len(data) - cut, problem=problem)


__all__ = [
    "GATE_OPTIONS",
    "Attempt",
    "AttemptResult",
    "ClaimsView",
    "Delegate",
    "Emitter",
    "EscalationRequest",
    "Escalator",
    "ItemTemplate",
    "Ports",
    "RunExecutor",
    "RunManager",
    "finished_glance",
    "new_run_id",
    "run_record",
]
