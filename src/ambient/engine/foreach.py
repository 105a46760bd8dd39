"""The for_each executor: one agent per item, fanned out under the run's concurrency and the daemon's slots.

Items start in batches: their ``accepted`` records share one fsync before any of their agents starts; each result is
written (``finished``), routed by the workflow's ``on_return`` and retry policy (:func:`~.planner.after_attempt`):
done, retried after a delay, escalated to the person (the agent's own question, a permission, a failure) or failed,
and the run ends when every item is. What every run shares (the journal, holds, decisions, the end) is
:class:`~ambient.engine.runs.RunExecutor`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import structlog

from ambient.engine import events
from ambient.engine.budget import permission_signature
from ambient.engine.events import FinishedResult
from ambient.engine.planner import (
    ITEM_OPTIONS,
    FanOut,
    ItemOutcome,
    ItemTemplate,
    after_attempt,
    first_open,
    next_wakeup,
    permission_options,
    question_options,
    ready_items,
)
from ambient.engine.ports import Attempt, AttemptResult, AttemptStatus, EscalationRequest, Ports
from ambient.engine.runs import RunExecutor, daemon_failure, iso, item_claim_id
from ambient.engine.runstate import TERMINAL_ITEM, ItemState, RunState, next_attempt
from ambient.storage.journal import Journal
from ambient.storage.paths import BrainPaths
from ambient.workflows.variables import item_runner_values, item_values

log = structlog.get_logger(__name__)


def _step_result(status: AttemptStatus) -> FinishedResult:
    # An agent's ESCALATE or BLOCKED_ON is not a success: the run record counts it as a fail.
    return status if status in ("success", "fail", "error") else "fail"


class ForEachExecutor(RunExecutor):
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
        super().__init__(state, plan, template, ports, journal, paths)
        self._open_from = 0  # no item before this index is pending or retry_wait (see _ready)

    def _moved(self, item: ItemState | None) -> None:
        if item is None:
            self._open_from = 0  # a run-wide event (added, reset...) may reopen any item
        elif item.status in ("pending", "retry_wait") and item.index < self._open_from:
            self._open_from = item.index

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

    # -- what may start

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

    # -- one item's attempt

    async def _accept(self, batch: list[ItemState]) -> None:
        # spec: "accepted" means "on disk" before the agent starts; one fsync for the whole batch.
        starts: list[tuple[ItemState, int]] = []
        for item in batch:
            attempt = next_attempt(item)
            self.event(events.accepted, item=item.name, attempt=attempt, key=self._key(item, attempt))
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
        run's concurrency, never retried, and the run looking idle. It gets ambient's error as its
        result, routed like any other (retried by the workflow's policy, then escalated)."""
        item = self._by_name.get(name)
        if item is None or item.status != "running" or self._closing:
            return
        task = asyncio.create_task(self._record(item, item.attempt, daemon_failure(exc)), name=f"item:{name}")
        self._tasks[name] = task
        task.add_done_callback(self._task_done)

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
            resumed=item.resumed,
        )

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

    async def _record(self, item: ItemState, attempt: int, res: AttemptResult) -> None:
        """The attempt's result to the journal, routed (retry, escalate, next), committed, then the item's claim.

        The result and what it leads to (a retry, the person's question, an abort) are journaled in one write
        (:meth:`Journal.together`), before anything is awaited: a kill never leaves a result alone that would read
        as a failure where the agent asked the person (or where the workflow routes a failure to them)."""
        if self._hold_result(item, attempt, res):
            self.poke()
            await self.commit()
            self.ports.claims.item_changed(self.state, item)
            return
        with self.journal.together():
            self._attempt_finished(
                item, attempt, res, agent=self.template.agent, result=_step_result(res.result), error=res.error
            )
            outcome, req = self._route(item, res)
        reaction = outcome.reaction
        if "error" in reaction.verbs and res.result != "success":
            payload = {"context": {"item": item.name, "error": res.error or ""}}
            await self.ports.emitter.emit("ERROR", self.template.escalate_to, payload, self.state)
        if req is not None:
            esc_id = await self._publish(req)
            self.event(events.escalated, item=item.name, escalation=esc_id, kind=req.kind, agent=self.template.agent)
        # The agent is done: its slot is free now, so the next item's ``accepted`` joins this fsync round
        # instead of waiting for it (bench/fanout.py (b): two fsync rounds in a row per slot before).
        self.poke()
        await self.commit()
        self.ports.claims.item_changed(self.state, item)

    def _route(self, item: ItemState, res: AttemptResult) -> tuple[ItemOutcome, EscalationRequest | None]:
        """What the result leads to, journaled at once (no await: see :meth:`_record`); the question to publish."""
        now = self.ports.clock.now()
        outcome = after_attempt(self.plan, item, res.result, now, self.ports.rng, retryable=res.retryable)
        reaction = outcome.reaction
        if "log" in reaction.verbs or res.result == "error":
            log.warning("item_failed", item=item.name, result=res.result, error=res.error)
        if outcome.kind == "retry" and outcome.not_before is not None:
            self.event(events.retry, item=item.name, attempt=item.attempt, not_before=iso(outcome.not_before))
        elif outcome.kind == "escalate":
            req = self._item_question(item, res)
            self._asking(item, req)
            return outcome, req
        elif outcome.kind == "failed" and "abort" in reaction.verbs:
            self.event(
                events.decided,
                item=item.name,
                escalation="",
                option="abort",
                action="abort",
                by="workflow",
                channel="rule",
            )
        return outcome, None

    def _item_question(self, item: ItemState, res: AttemptResult) -> EscalationRequest:
        signature = permission_signature(res.permission) if res.result == "escalate" else None
        if signature is not None:
            # A tool call the agent waits on the person for: its question and options as it gave them; a learned
            # rule matches the exact call (learning.situation_of), never a normalised one.
            options = permission_options(res.options or [], res.permission)
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
        return EscalationRequest(
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
