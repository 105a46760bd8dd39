"""What every run does, whatever its form: durable through the run journal.

A run is an asyncio task owned by :class:`~ambient.engine.manager.RunManager` and driven by an executor: the
for_each fan-out (:mod:`ambient.engine.foreach`) or a chain (:mod:`ambient.engine.chain`), both built on
:class:`RunExecutor` here. Every change is an event (:mod:`ambient.engine.events`) appended to the run's journal
(``.ambient/runs/<run>.jsonl``) before ambient acts on it: an item is ``accepted`` (fsync'd, group-committed with its
batch) before its agent starts, and its ``finished`` record is fsync'd before the next decision depends on it. Claims
are views written from the same events.

Common to both forms, and so here: writing an event and applying it to the state, an attempt carried out through
the delegate and its ``finished`` record, the holds (budgets, the provider), waiting out a full disk, the person's
decisions, an abort, the end of a run (its summary in ``runs.jsonl``) and a stop. The executors talk to the world
only through their ports (:mod:`ambient.engine.ports`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Concatenate, Literal, ParamSpec, TypeVar

import structlog

from ambient.core.health import describe, resource_of
from ambient.engine import events
from ambient.engine.budget import (
    ESCALATION_KIND,
    HOLD_DETAIL,
    HOLD_OF_RESULT,
    OVER_BUDGET,
    Breach,
    breach,
    budget_question,
    day_of,
    fmt_usd,
    hold_options,
    hold_step,
    next_day,
    permission_signature,
    provider_question,
    spend_by_agent,
)
from ambient.engine.events import FinishedFields, FinishedResult, Ruling, RunEvent
from ambient.engine.planner import ANSWER, FanOut, ItemTemplate, adapt_skips
from ambient.engine.ports import Attempt, AttemptResult, EscalationRequest, Ports
from ambient.engine.records import DecisionRecord, RunRecord, StepRecord
from ambient.engine.runstate import ABORTING, TERMINAL_ITEM, ItemState, RunState, aborts_run, apply_event, outcome_of
from ambient.engine.slots import AgentSlots
from ambient.storage.journal import Journal, append_line
from ambient.storage.paths import BrainPaths
from ambient.workflows.variables import completion_values

log = structlog.get_logger(__name__)

T = TypeVar("T")
P = ParamSpec("P")
E = TypeVar("E", bound=RunEvent)

_RETRY_FIRST_S = 0.5  # a write that failed for want of space or descriptors is tried again after this, doubling
_RETRY_MAX_S = 15.0

#: The troubles an agent that started and answered shows are over (a full disk ends when writes succeed again).
_RECOVERED_BY_AN_AGENT = ("descriptors", "memory", "processes")


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


def daemon_failure(exc: BaseException) -> AttemptResult:
    """An attempt that ambient itself failed to carry out (an exception, not an answer): an ``error`` that names
    the daemon's resource when it ran out of one, so nobody blames the agent; retried by the workflow's policy."""
    kind = resource_of(exc, spawning=True)
    if kind is not None:
        return AttemptResult(result="error", error=describe(kind, str(exc)), trouble=kind)
    return AttemptResult(result="error", error=f"ambient failed to carry out the attempt (not the agent): {exc!r}")


def iso(dt: datetime) -> str:
    """An event's time as the journal writes it (``at``): ISO 8601 to the millisecond."""
    return dt.isoformat(timespec="milliseconds")


def run_record(state: RunState) -> RunRecord:
    """The ADR-027 summary record of a finished run."""
    started = (
        datetime.fromisoformat(state.started_at)
        if state.started_at
        else datetime.fromisoformat(state.finished_at or "1970-01-01T00:00:00+00:00")
    )
    decisions = [DecisionRecord.model_validate(d) for d in state.decisions if "escalation" in d and "option" in d]
    auto = sum(1 for d in decisions if d.auto)
    return RunRecord(
        run_id=state.run_id,
        workflow=state.workflow,
        spec_hash=state.spec_hash,
        started_at=started,
        completed_at=datetime.fromisoformat(state.finished_at) if state.finished_at else None,
        outcome=state.outcome or "running",  # type: ignore[arg-type]
        steps=[StepRecord.model_validate(s) for s in state.steps],
        escalations=max(0, state.escalation_count - auto),  # what reached the person: the headline's count
        auto_decisions=auto,
        errors=state.error_count,
        decisions=decisions,
        gated=list(state.gated),
        asked=list(state.asked),
        reached_end=state.form == "chain" and state.cursor >= len(state.items),
        form=state.form if state.form in ("for_each", "chain") else None,  # type: ignore[arg-type]
        total=len(state.counted()),
        done=state.success_count,
        **state.usage.to_record(),
        spent_by_day={d: round(c, 8) for d, c in state.spent_by_day.items()} or None,
        calls_by=[
            {"agent": agent, "model": model, **figures, "cost_usd": round(figures["cost_usd"], 8)}
            for agent, models in sorted(state.calls_by.items())
            for model, figures in sorted(models.items())
        ]
        or None,
    )


class RunExecutor(ABC):
    """Carries out one run until it finishes or waits on the person: the part every form shares. A form gives its
    loop (:meth:`_loop`) and how an item's attempt is built (:meth:`build_attempt`)."""

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
        self._tasks: dict[str, asyncio.Task[None]] = {}  # items whose agent is at work in a task of its own
        self._wake = asyncio.Event()
        self._closing = False
        self._parked = False
        self._counts: dict[str, int] | None = None  # items per status (see _status_counts)
        self.on_park: Callable[[], None] | None = None
        self.slots: AgentSlots | None = None  # the daemon-wide cap (None: only the run's own concurrency)
        self.on_agent_end: Callable[[], None] | None = None  # an agent's work ended (the manager drains on stop)
        self._holding: set[str] = set()  # items whose agent holds one of those slots
        self._at_work: set[str] = set()  # items whose agent is at work (carry_out under way)
        self._short_of: str | None = None  # a resource the run waits for (a full disk): a stop does not wait for it
        self._short = False  # ready items wait for a slot another run holds: busy, not parked

    # -- events

    def event(self, make: Callable[Concatenate[str, P], E], /, *args: P.args, **fields: P.kwargs) -> E:
        """Append an event to the journal (buffered) and apply it to the state: ``make`` is its constructor in
        :mod:`ambient.engine.events`, given the time and ``fields``."""
        record = make(iso(self.ports.clock.now()), *args, **fields)
        self.journal.write(record)
        item = self._by_name.get(str(fields["item"])) if "item" in fields else None
        before = item.status if item is not None else None
        apply_event(self.state, self._by_name, record)
        self._moved(item)
        counts = self._counts
        if counts is not None:
            if (
                item is not None
                and before is not None
                and record["ev"] != "added"
                and fields.get("action") not in ABORTING
            ):
                if item.status != before:  # an item event moves only that item
                    counts[before] -= 1
                    counts[item.status] = counts.get(item.status, 0) + 1
            else:
                self._counts = None  # run-wide events (abort, added...): count again when next needed
        return record

    def _moved(self, item: ItemState | None) -> None:  # noqa: B027 - a hook with nothing to do by default
        """An event was applied to ``item`` (None: to the run as a whole): for_each keeps where its scan starts."""

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
        """Work a stop gives its grace to: an agent at work, a result being recorded, the end of a run whose items
        are all done. A run waiting for disk space is not busy, past its agents: a stop that waited for it waited its
        whole grace on a full disk (what it was writing is written again from the journal at the next start)."""
        if any(name in self._at_work for name in self._tasks):
            return True
        if self._short_of is not None:
            return False
        return bool(self._tasks) or self._ending()

    def _ending(self) -> bool:
        """Every item is done and the run not yet finished: its loop writes the end at its next step."""
        if self.state.finished:
            return False
        counts = self._status_counts()
        return sum(counts.get(s, 0) for s in TERMINAL_ITEM) == counts["total"]

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
                if self.state.asking:
                    await self.ask_again()
                return await self._loop()
            except asyncio.CancelledError:
                await self._interrupt()
                raise
            finally:
                for name in list(self._holding):  # taken for items whose agents never started (a stop)
                    self._release(name)
                if self.slots is not None:
                    self.slots.leave(self)

    @abstractmethod
    async def _loop(self) -> RunState:
        """Start what may start, route what came back, finish the run; return when it is finished."""

    @abstractmethod
    def build_attempt(self, item: ItemState, attempt: int) -> Attempt:
        """The SPAWN of an item's (or step's) attempt, rendered from the pinned spec."""

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

    def over_budget(self) -> str | None:
        """Why a model call of this run may not go out now (the model gateway asks before each one): the run's or
        the day's budget reached by what is recorded so far, as the same rules say before an agent starts; else
        None. Calls already sent are not counted before they are recorded: they are the overshoot."""
        now = self.ports.clock.now()
        reached = self._breach(day_of(now))
        if reached is None:
            return None
        if reached.which == "daily":
            return (
                f"ambient holds this run: the daily budget is reached ({fmt_usd(reached.spent)} spent today against "
                f"{fmt_usd(reached.limit)}); the call was not sent. Stop now: the person is asked whether to go on."
            )
        return (
            f"ambient holds this run: its budget is reached ({fmt_usd(reached.spent)} spent against "
            f"{fmt_usd(reached.limit)}); the call was not sent. Stop now: the person is asked whether to go on."
        )

    async def record_call(self, fields: events.CallFields) -> None:
        """A model call the gateway metered, on disk (fsync'd) before its answer is handed to the agent: its cost
        counts for the run and for the day at once, whatever becomes of the attempt."""
        self.event(events.call, **fields)
        if self.ports.budget is not None:
            cost = fields["usage"].get("cost_usd")
            if isinstance(cost, int | float) and not isinstance(cost, bool):
                self.ports.budget.add(float(cost), self.ports.clock.now())
        await self.commit()

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
                self.event(events.unhold, hold=hold["hold"], reason=f"a new UTC day ({today})")
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
        self.event(events.hold, **reached.record(), agents=spend_by_agent(self.state.steps))
        await self._ask_hold(reached.which)
        return True

    async def _ask_hold(self, kind: str) -> None:
        """One escalation for the run and its hold (the hold records it: never asked twice while pending)."""
        hold = self.state.holds[kind]
        esc_kind = ESCALATION_KIND.get(kind, kind)
        question = provider_question(hold) if esc_kind == "provider" else budget_question(self.state.workflow, hold)
        agent = hold.get("agent")
        req = EscalationRequest(
            run_id=self.state.run_id,
            workflow=self.state.workflow,
            item=None,
            agent=agent if isinstance(agent, str) else None,
            kind=esc_kind,
            question=question,
            options=hold_options(hold),
            dedupe_key=f"{self.state.run_id}/-/{kind}/{'again' if hold.get('waited') else 'hold'}",
            detail=HOLD_DETAIL.get(kind, kind),
            # The hold is on disk before its question: asked again after a crash, the question a file already
            # holds (maybe answered meanwhile) is the one kept, not a second one.
            since=hold.get("at"),
            settled=self._settled(),
        )
        esc_id = await self._publish(req)  # the hold on disk before its question's file: a start finds it by it
        self.event(events.escalated, escalation=esc_id, kind=esc_kind, hold=hold["hold"], agent=req.agent)
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
        if res.hold == OVER_BUDGET:
            kind = None  # the budget reached: the run's loop finds it before the next start and holds (_held)
        elif kind is None or res.hold is None:
            return False
        agent = agent or self.template.agent
        fields: FinishedFields = {
            "item": item.name,
            "attempt": attempt,
            "agent": agent,
            "key": self._key(item, attempt),
            "result": "interrupted",
            "error": res.error,
            "duration_ms": res.duration_ms,
            "hold": res.hold,
        }
        if res.usage:
            fields["usage"] = res.usage
        with self.journal.together():  # the item back to pending and the hold: never one without the other
            self.event(events.finished, **fields)
            if kind is not None and kind not in self.state.holds and not self.state.finished:
                self.event(events.hold, hold=kind, error=(res.error or res.hold or "")[:1000], agent=agent)
                log.warning("run_held", hold=kind, item=item.name, error=res.error)
        self._spent(res)
        return True

    def _spent(self, res: AttemptResult) -> None:
        """The attempt's cost to today's meter (the run's own total is the journal's, folded)."""
        if res.usage and not res.usage.get("metered") and self.ports.budget is not None:  # metered: counted per call
            cost = res.usage.get("cost_usd")
            if isinstance(cost, int | float) and not isinstance(cost, bool):
                self.ports.budget.add(float(cost), self.ports.clock.now())

    # -- the person's questions: on disk before anything can read the item as finished

    def _settled(self) -> tuple[str, ...]:
        """The escalations this run already decided (an escalation of theirs is never taken for a new question)."""
        return tuple(str(d.get("escalation")) for d in self.state.decisions if d.get("escalation"))

    def _asking(self, item: ItemState, req: EscalationRequest, *, gate: bool = False, before: bool = False) -> None:
        """Record that ``item`` asks the person (call it in :meth:`Journal.together` with the result that raised the
        question): from here on the fold reads the item as waiting on the person, even if the escalation's file
        never gets written (a kill): a start then asks again (:meth:`ask_again`)."""
        fields: events.AskingFields = {"item": item.name, "kind": req.kind, "request": req.record()}
        if gate:
            fields["gate"] = True
            if before:
                fields["before"] = True
        self.event(events.asking, **fields)

    async def _publish(self, req: EscalationRequest) -> str:
        """The escalation's file, fsync'd, then its message queued; its id (an escalation already on disk for the
        same question is the one kept: the store dedupes).

        The journal is committed first (one group commit: the fsync round of every item at hand): the question is on
        disk in the journal before its file exists, so no file is ever found that the journal does not know of (a
        kill in between: the start asks again and finds the file by its dedupe key, answered or not)."""
        await self.commit()
        esc_id = await self.durably(lambda: self.ports.escalator.escalate(req))
        self.event(events.asked, escalation=esc_id, request=req.record())  # rebuilt from it if its file is lost
        return esc_id

    async def ask_again(self) -> None:
        """At a start: the questions the journal says were asked and whose escalation it never named (a kill came
        between the two) are asked again. Idempotent: a file written before the kill is found by its dedupe key
        and kept, answered or not, so the person is never asked twice and an answer given meanwhile is applied."""
        for name, fields in list(self.state.asking.items()):
            item = self._by_name.get(name)
            record = fields.get("request")
            if item is None or not isinstance(record, dict):
                continue
            try:
                req = EscalationRequest.from_record(
                    record,
                    run_id=self.state.run_id,
                    workflow=self.state.workflow,
                    since=fields.get("at"),
                    settled=self._settled(),
                )
            except (KeyError, TypeError, ValueError) as exc:  # an edited journal: said, the run goes on without it
                log.error("question_not_asked_again", item=name, error=repr(exc))
                continue
            esc_id = await self._publish(req)
            agent = req.agent or ""
            if fields.get("gate"):
                gate: events.GateFields = {"item": name, "state": "pending", "escalation": esc_id, "agent": agent}
                if fields.get("before"):
                    gate["before"] = True
                self.event(events.gate, **gate)
            else:
                self.event(events.escalated, item=name, escalation=esc_id, kind=req.kind, agent=req.agent)
            log.warning("question_asked_again", item=name, escalation=esc_id, kind=req.kind)
            await self.commit()
            self.ports.claims.item_changed(self.state, item)

    # -- attempts

    def _attempt_finished(
        self,
        item: ItemState,
        attempt: int,
        res: AttemptResult,
        *,
        agent: str,
        result: FinishedResult,
        error: str | None,
        question: bool = True,
    ) -> None:
        """The ``finished`` record of an attempt that counted (every form's, in one place), and its cost to today's
        meter. ``question``: the record has the agent's question (a chain step's, answered by the step's verdict,
        leaves it out)."""
        fields: FinishedFields = {
            "item": item.name,
            "attempt": attempt,
            "agent": agent,
            "key": self._key(item, attempt),
            "result": result,
            "output": res.output,
            "error": error,
            "duration_ms": res.duration_ms,
            "signal_in": res.signal_in,
            "reply": res.reply,
        }
        if question:
            fields["question"] = res.question
        if res.usage:
            fields["usage"] = res.usage
        signature = permission_signature(res.permission) if res.result == "escalate" else None
        if signature is not None:
            fields["permission_signature"] = signature
        self.event(events.finished, **fields)
        self._spent(res)

    async def carry_out(self, a: Attempt) -> AttemptResult:
        """The attempt through the delegate; an exception is ambient's failure, not the agent's: an ``error``
        result (retried by the workflow's policy), and a resource the daemon ran out of goes to its health."""
        self._at_work.add(a.item)
        try:
            res = await self.ports.delegate.attempt(a)
        except Exception as exc:  # ambient failed, not the agent: recorded, retried by the workflow's policy
            res = daemon_failure(exc)
            log.error("attempt_crashed", item=a.item, attempt=a.attempt, error=res.error, exc_info=exc)
        finally:
            self._at_work.discard(a.item)
        health = self.ports.health
        if health is not None:
            if res.trouble is not None:
                health.trouble(res.trouble, res.error or res.trouble)
            elif res.result != "error":
                health.recovered(_RECOVERED_BY_AN_AGENT)
        return res

    def _key(self, item: ItemState, attempt: int) -> str:
        return f"{self.state.run_id}/{item.name}/{attempt}"

    def _last_decision_for(self, item: ItemState) -> str | None:
        """The person's answer to the item's own question, in the agent's words (its option as it proposed it)."""
        for d in reversed(self.state.decisions):
            if d.get("item") == item.name and d.get("action") == ANSWER:
                return str(d.get("answer") or d.get("option"))
        return None

    def _release(self, name: str) -> None:
        """The item's agent is done (or will never run): its slot goes back, once."""
        if self.on_agent_end is not None:
            self.on_agent_end()
        if name in self._holding:
            self._holding.discard(name)
            assert self.slots is not None
            self.slots.give(self)

    # -- the journal on disk

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
                self._short_of = kind
                if self.on_agent_end is not None:
                    self.on_agent_end()  # a stop draining the run stops waiting for it
                try:
                    await asyncio.sleep(delay)  # a timer of the daemon's own, not a test's: the disk frees when it will
                finally:
                    self._short_of = None
                delay = min(delay * 2, _RETRY_MAX_S)
                continue
            if kind is not None and self.ports.health is not None:
                self.ports.health.recovered([kind])
            return result

    # -- the person, an abort

    def abort(self, *, by: str, reason: str) -> None:
        """Stop the run (an ABORT packet): unfinished items are aborted, running agents are cancelled."""
        before = self._statuses()
        self.event(events.abort, by=by, reason=reason)
        self.journal.sync()
        self._stop_aborted(before)
        self.poke()

    def _statuses(self) -> list[str]:
        return [it.status for it in self.state.items]

    def adapt(self, *, by: str, skip: Sequence[str]) -> tuple[list[str], dict[str, str]]:
        """Carry out an ADAPT ``changes: {skip: [...]}``: the named items not started yet end ``skipped`` (each its
        claim), and a note in the journal says what was skipped and what was not, why. Returns the same."""
        skipped, refused = adapt_skips(self.state, skip)
        if self.state.finished:
            return skipped, refused
        for name in skipped:
            self.event(events.skipped, item=name, reason=f"skipped by an ADAPT from {by}")
        said = "; ".join(f"{name}: {why}" for name, why in refused.items())
        text = f"ADAPT from {by}: skipped {', '.join(skipped) or 'nothing'}" + (
            f" (not skipped: {said})" if said else ""
        )
        self.event(events.note, text=text[:2000])
        self.journal.sync()
        for name in skipped:
            self.ports.claims.item_changed(self.state, self._by_name[name])
        self.poke()
        return skipped, refused

    def _stop_aborted(self, before: list[str]) -> None:
        """After an abort: the running agents are stopped and every item it changed shows so in its claim."""
        for task in list(self._tasks.values()):
            task.cancel()
        for item, was in zip(self.state.items, before, strict=False):
            if item.status != was:
                self.ports.claims.item_changed(self.state, item)

    def decide(self, d: Ruling) -> bool:
        """Apply the person's (or a rule's) decision; False if this run does not wait on it."""
        if d.escalation not in self.state.escalations:
            return False
        item = self.state.escalations[d.escalation] or None
        before = self._statuses()
        self.event(events.decided, **d.fields(item))
        self.journal.sync()
        if aborts_run(self.state.form, d.action, item):
            self._stop_aborted(before)
        elif item is not None:
            self.ports.claims.item_changed(self.state, self._by_name[item])
        self.poke()
        return True

    # -- the end of a run

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
        self.event(events.finished_run, outcome=outcome)
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
                self.event(events.interrupted, item=item.name, attempt=item.attempt)
                self.ports.claims.item_changed(self.state, item)
        self.journal.sync()
