"""The ports of the executors: what a run needs from the world, as Protocols the service layer implements.

An executor (:mod:`ambient.engine.foreach`, :mod:`ambient.engine.chain`) talks to the world only through these:
agents (:class:`Delegate`), escalations (:class:`Escalator`), claims (:class:`ClaimsView`), packets
(:class:`Emitter`), budgets (:class:`BudgetMeter`) and the daemon's health (:class:`HealthView`). The daemon wires them
to the real services (:mod:`ambient.service.adapters`); the tests pass fakes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from ambient.core.clock import Clock, SystemClock
from ambient.engine.budget import Limits
from ambient.engine.events import EscalationRecord
from ambient.engine.runstate import UNRECOVERABLE, ItemState, RunState
from ambient.runners.result import Resumed

AttemptStatus = Literal["success", "fail", "error", "escalate", "blocked"]


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
    resumed: Resumed | None = None  # why the item runs again (the run journal's answer; None: first attempt)


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
    #: Asked again after a crash (the journal's ``asking``): when the question arose, and the escalations the run
    #: already decided. An escalation of the same ``dedupe_key`` made since then, not cancelled and not one of
    #: those, is this very question (its file was written before the crash, maybe answered): it is kept.
    since: str | None = None
    settled: tuple[str, ...] = ()

    @classmethod
    def from_record(
        cls, record: Mapping[str, Any], *, run_id: str, workflow: str, since: str | None, settled: Sequence[str] = ()
    ) -> EscalationRequest:
        """The request a journal's ``asking`` kept (:meth:`record`), to ask again."""
        deadline, remind = record.get("deadline_s"), record.get("remind_before_s")
        return cls(
            run_id=run_id,
            workflow=workflow,
            item=record.get("item"),
            agent=record.get("agent"),
            kind=str(record["kind"]),
            question=str(record["question"]),
            options=[(str(k), str(label), str(action)) for k, label, action in record["options"]],
            dedupe_key=str(record.get("dedupe_key") or f"{run_id}/{record.get('item') or record.get('step')}"),
            deadline_s=float(deadline) if deadline else None,
            on_timeout=record.get("on_timeout"),
            remind_before_s=float(remind) if remind else None,
            step=record.get("step"),
            scope=record.get("scope"),
            detail=str(record.get("detail", record["question"])),
            since=since,
            settled=tuple(settled),
        )

    def record(self) -> EscalationRecord:
        """What the run journal keeps of it (an ``asked`` event): enough to rebuild the escalation file if it is
        lost or emptied by a crash (:func:`ambient.human.escalations.rebuild`), so the run never waits on a question
        nobody can see. The run's id and workflow are the journal's own. Keys in this order."""
        out: EscalationRecord = {
            "kind": self.kind,
            "question": self.question,
            "options": [list(o) for o in self.options],
        }
        if self.item is not None:
            out["item"] = self.item
        if self.step is not None:
            out["step"] = self.step
        if self.agent is not None:
            out["agent"] = self.agent
        if self.scope is not None:
            out["scope"] = self.scope
        out["dedupe_key"] = self.dedupe_key
        if self.deadline_s is not None:
            out["deadline_s"] = self.deadline_s
        if self.on_timeout is not None:
            out["on_timeout"] = self.on_timeout
        if self.remind_before_s is not None:
            out["remind_before_s"] = self.remind_before_s
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
