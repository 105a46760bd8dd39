"""Chain runs (spec/004 kernel-orchestrator): ordered steps, gates, exit triggers, circuit breaker.

Per step: human gate if the step or the mode asks for one → run the step's agent (the delegate
does pre-flight, locks, SPAWN, RETURN) → apply the gate and the close tier → route the exit
trigger (``on_done`` / ``on_partial`` falling back to ``on_done`` / ``on_fail`` defaulting to
``signal:BLOCKED_ON``). Every move is a journal event, so a restart continues at the step the
cursor names: the first step without a closed claim. The breaker trips after ``threshold``
consecutive failures on one scope, emits CIRCUIT_BREAK and waits for the person; it never
restarts by itself.

Decisions the person can take (escalation options): before a gate ``approve``/``reject``; on a
blocked step ``retry``/``skip``/``abort``; on a tripped breaker ``reset`` (retry once more) or
``abort``; on a post-step ``gate:human`` ``approve`` (continue) or ``reject`` (abort + ABORT).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

import structlog

from ambient.engine import events
from ambient.engine.budget import permission_signature
from ambient.engine.events import FinishedResult, Ruling
from ambient.engine.planner import (
    FINAL_QUESTION,
    GATE_OPTIONS,
    ChainAction,
    ChainStep,
    FanOut,
    ItemTemplate,
    StepStatus,
    StepVerdict,
    before_question,
    breaker_update,
    exit_route,
    gate_after_last,
    gate_before,
    gate_words,
    judge_step,
    next_index,
    permission_options,
    question_options,
    route_question,
    untested_question,
)
from ambient.engine.ports import Attempt, AttemptResult, EscalationRequest, Ports
from ambient.engine.runs import RunExecutor, item_claim_id
from ambient.engine.runstate import ItemState, RunState, next_attempt
from ambient.storage.journal import Journal
from ambient.storage.paths import BrainPaths
from ambient.workflows.variables import step_runner_values, step_values

log = structlog.get_logger(__name__)


def _brief(output: Any) -> Any:
    """A step's output, reduced to what a supervisor needs (status and tests), never the whole context."""
    if isinstance(output, dict):
        return {k: output[k] for k in ("status", "tests", "files_modified", "commit") if k in output}
    return None


def _recorded(verdict: StepVerdict, res: AttemptResult) -> FinishedResult:
    """What the journal records of an attempt: its verdict decides success (a gate or a tier may fail an agent's
    "ok"); a failure is an ``error`` when the agent errored, else a ``fail``."""
    if verdict.status != "failed":
        return "success"
    return "error" if res.result == "error" else "fail"


def _step_done(step: ChainStep, verdict: StepVerdict, res: AttemptResult) -> dict[str, Any]:
    """``STEP_DONE``'s payload: the step's status and reason, and its output reduced to what a supervisor needs."""
    return {
        "context": {
            "step": step.name,
            "result": {"status": verdict.status, "reason": verdict.reason, "output": _brief(res.output)},
        }
    }


class Breaker(Protocol):
    """Consecutive-failure counters per scope, visible and resettable by the person."""

    def fail(self, scope: str) -> int: ...

    def success(self, scope: str) -> None: ...

    def reset(self, scope: str) -> None: ...


class Branches(Protocol):
    """Theme branch handling (git); a brain without git reports and ignores the field."""

    async def open(self, branch: str) -> str | None: ...

    async def merge(self, branch: str) -> str | None: ...


@dataclass
class ChainSettings:
    """What a chain run needs beyond the ports."""

    steps: Sequence[ChainStep]
    supervisor: str = "human"
    mode: str | None = None
    branch: str | None = None
    threshold: int = 3
    default_agents: Mapping[str, str] = field(default_factory=dict)  # step type → agent
    breaker: Breaker | None = None
    branches: Branches | None = None
    pilote: str | None = None  # the pilot session's id ({{pilote}})
    # trigger:<workflow>/<step>: (workflow, step, context, trigger) → the new run's id, or None if it cannot start
    start_workflow: Callable[[str, str | None, Mapping[str, Any], str], str | None] | None = None


class ChainExecutor(RunExecutor):
    """Carries out a chain run step by step."""

    def __init__(
        self,
        state: RunState,
        plan: FanOut,
        template: ItemTemplate,
        ports: Ports,
        journal: Journal,
        paths: BrainPaths,
        chain: ChainSettings,
    ) -> None:
        super().__init__(state, plan, template, ports, journal, paths)
        self.chain = chain
        self.steps: list[ChainStep] = list(chain.steps)
        self._declared = len(self.steps)
        self._stepping = False  # a step's agent is at work (shutdown lets it finish within the grace)
        # Satellites added by `trigger → type:X scope:Y` live in the journal; rebuild their steps.
        for it in state.items[len(self.steps) :]:
            self.steps.append(self._satellite_step(it.name))

    # -- helpers

    def _satellite_step(self, name: str) -> ChainStep:
        step_type, _, scope = name.partition("@")
        step_type = step_type.split("-", 1)[0] if "-" in step_type else step_type
        agent = self.chain.default_agents.get(step_type)
        return ChainStep(name=name, type=step_type, scope=scope or None, agent=agent, retry=self.plan.retry)

    def _agent_for(self, step: ChainStep) -> str:
        return step.agent or self.chain.default_agents.get(step.type) or self.template.agent

    def build_attempt(self, item: ItemState, attempt: int) -> Attempt:
        step = self.steps[item.index]
        prior = self._prior_output(item.index)
        # The step's templates ({{workflow}}, {{prior.result.status}}...) with the values validation allows.
        values = step_values(
            workflow=self.state.workflow,
            step=step.name,
            run_id=self.state.run_id,
            prior=prior,
            branch=self.chain.branch or "",
            pilote=self.chain.pilote or "",
        )
        context: dict[str, Any] = {
            "step": step.name,
            "type": step.type,
            "story_angle": self.ports.render_text(step.story_angle, values) if step.story_angle else None,
            "workflow": self.state.workflow,
        }
        if step.input_contract:  # what the person wrote the step receives: told to its agent, rendered like the angle
            context["input_contract"] = self.ports.render_text(step.input_contract, values)
        if prior is not None:
            context["prior"] = prior
        context.update(self.state.context)
        decision = self._last_decision_for(item)
        if decision is not None:
            context["decision"] = decision
        files = (self.ports.render_path(step.scope, values),) if step.scope else ()
        return Attempt(
            run_id=self.state.run_id,
            workflow=self.state.workflow,
            item=item.name,
            index=item.index,
            attempt=attempt,
            key=self._key(item, attempt),
            agent=self._agent_for(step),
            sender=self.template.sender,
            files=files,
            zone=None,
            context=context,
            claim_id=item_claim_id(self.state.run_id, item, "chain"),
            preflight=True,
            timeout_s=step.timeout_s or self.template.timeout_s,
            vars=step_runner_values(values),
            resumed=item.resumed,
        )

    def _prior_output(self, index: int) -> Any:
        for it in reversed(self.state.items[:index]):
            if it.status == "done":
                return it.output
        return None

    async def _signal(self, signal: str, to: str | None, payload: Mapping[str, Any]) -> None:
        target = to if to and to not in ("pilote", "pilot", "supervisor") else self.chain.supervisor
        await self.ports.emitter.emit(signal, target, payload, self.state)

    async def _ask(
        self,
        item: ItemState | None,
        kind: str,
        question: str,
        options: Sequence[tuple[str, str, str]],
        scope: str | None = None,
        detail: str | None = None,
        *,
        gate: bool = False,
        before: bool = False,
    ) -> str:
        """Ask the person about a step (or the run): the step waits on them in the journal (``asking``) before the
        escalation's file is written, so a kill between the two asks again at the next start."""
        req = self._request(item, kind, question, options, scope=scope, detail=detail)
        if item is not None and item.name not in self.state.asking:
            self._asking(item, req, gate=gate, before=before)
        return await self._publish(req)

    def _request(
        self,
        item: ItemState | None,
        kind: str,
        question: str,
        options: Sequence[tuple[str, str, str]],
        *,
        scope: str | None = None,
        detail: str | None = None,
    ) -> EscalationRequest:
        """The escalation a question about a step (or the run, ``item`` None) asks: what the journal keeps of it."""
        if kind == "gate" and detail is None:
            detail = gate_words(self.steps[item.index] if item is not None else None, question)
        return EscalationRequest(
            run_id=self.state.run_id,
            workflow=self.state.workflow,
            item=None,
            step=item.name if item is not None else None,
            agent=self._agent_for(self.steps[item.index]) if item is not None else None,
            kind=kind,
            question=question[:2000],
            options=list(options),
            dedupe_key=f"{self.state.run_id}/{item.name if item else '-'}/{kind}",
            deadline_s=self.template.deadline_s,
            on_timeout=self.template.on_timeout,
            remind_before_s=self.template.remind_before_s,
            scope=scope,
            detail=detail,
        )

    # -- the loop

    async def _loop(self) -> RunState:
        if self.chain.branch and self.chain.branches is not None and self.state.cursor == 0 and not self.state.steps:
            problem = await self.chain.branches.open(self.chain.branch)
            if problem:
                self.event(events.note, text=f"theme branch: {problem}")
        while not self.state.finished:
            if self._closing:  # shutdown: no step starts; the run is cancelled once the running one ends
                await self._park()
                continue
            if self.state.aborted or any(it.status == "aborted" for it in self.state.items):
                await self._abort("aborted by decision")
                break
            idx = self.state.cursor
            if idx >= len(self.steps):
                if await self._final_gate():
                    break
                await self._park()
                continue
            item = self.state.items[idx]
            step = self.steps[idx]
            if item.status in ("done", "skipped"):
                self._advance(idx, ChainAction("next"))
                continue
            if item.status == "escalated":
                await self._park()
                continue
            if item.status == "retry_wait" and item.not_before:
                delay = (datetime.fromisoformat(item.not_before) - self.ports.clock.now()).total_seconds()
                if delay > 0:
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), delay)  # a retry timer: not idle
                    continue
            reason = gate_before(step, idx, len(self.steps), self.chain.mode)
            if reason and item.gate != "passed":
                esc = await self._ask(
                    item,
                    "gate",
                    before_question(step, reason),
                    [(k, label, k) for k, label in GATE_OPTIONS],
                    gate=True,
                    before=True,
                )
                self.event(
                    events.gate,
                    item=item.name,
                    state="pending",
                    escalation=esc,
                    before=True,
                    agent=self._agent_for(step),
                )
                await self._signal("GATE_PENDING", None, {"context": {"step": step.name, "message": reason}})
                await self.commit()
                self.ports.claims.item_changed(self.state, item)
                continue
            if await self._held(self.ports.clock.now()):  # a budget reached, the provider refused the key
                self._wake.clear()
                now = self.ports.clock.now()
                if self._hold_state(now) == "held":  # checked after the clear: an answer meanwhile is not missed
                    wake_at = self._hold_wakeup(None)
                    await self._wait_wake(max(0.0, (wake_at - now).total_seconds()) if wake_at else None)
                continue
            await self._run_step(item, step)
        return self.state

    async def _park(self) -> None:
        self._wake.clear()
        if self.state.finished:
            return
        await self._wait_wake(None)

    def _advance(self, idx: int, action: ChainAction) -> None:
        if idx >= self._declared and action.kind == "next":
            # A satellite started by a trigger: the chain goes on with its first declared step not yet run.
            rest = [i for i in range(self._declared) if self.state.items[i].status not in ("done", "skipped")]
            self.event(events.cursor, index=rest[0] if rest else len(self.steps))
            return
        nxt = next_index(self.steps[: self._declared], idx, action)
        target = len(self.steps) if nxt is None else nxt
        if nxt is not None and nxt <= idx:
            self.event(events.reset, item=self.state.items[nxt].name)  # a loop back runs the step again
        self.event(events.cursor, index=target)

    async def _slot(self, item: ItemState) -> bool:
        """Wait for one of the daemon-wide agent slots; False when the step no longer needs it (a decision came)."""
        if self.slots is None:
            return True
        status = item.status
        while not self.slots.take(self, 1, self.poke):
            self._short = True  # waiting on other runs' agents, not on the person: never idle
            self._wake.clear()
            await self._wake.wait()
            if item.status != status:
                self._short = False
                self.slots.leave(self)
                return False
        self._short = False
        self._holding.add(item.name)
        return True

    async def _run_step(self, item: ItemState, step: ChainStep) -> None:
        """One attempt at a step, then what its result leads to, in this order: a hold (a budget, a refused key), the
        agent's own question, the result journaled with its verdict, a retry or the breaker on a failure,
        ``STEP_DONE``, and the person's acceptance or the exit trigger. Each part is a method below."""
        attempt = await self._accept(item)
        if attempt is None:
            return
        res = await self._attempt(item, step, attempt)
        if self._hold_result(item, attempt, res, agent=self._agent_for(step)):  # the step runs again once answered
            await self._checkpoint(item)
            return
        if res.result == "escalate":
            await self._agent_asks(item, step, attempt, res)
            return
        verdict = judge_step(step, res.output, res.result)
        accept = self._record_verdict(item, step, attempt, res, verdict)
        if verdict.status == "failed":
            if await self._after_failure(item, step, attempt, res):
                return
        else:
            self._after_success(step)
        await self._signal("STEP_DONE", None, _step_done(step, verdict, res))
        if accept is not None:
            esc = await self._publish(accept)
            self.event(events.gate, item=item.name, state="pending", escalation=esc, agent=self._agent_for(step))
            await self._checkpoint(item)
            return
        await self._route_exit(item, step, verdict.status, verdict.actions, verdict.reason or res.error)
        await self._checkpoint(item)

    async def _checkpoint(self, item: ItemState) -> None:
        """The journal committed, then the step's claim told: the claim never says more than the journal holds."""
        await self.commit()
        self.ports.claims.item_changed(self.state, item)

    async def _accept(self, item: ItemState) -> int | None:
        """An agent slot taken and the attempt journaled (``accepted``) before its agent starts, so a restart knows
        the step was under way. None when a decision came while the step waited for a slot (nothing runs)."""
        if not await self._slot(item):
            return None
        attempt = next_attempt(item)
        self.event(events.accepted, item=item.name, attempt=attempt, key=self._key(item, attempt))
        await self._checkpoint(item)
        return attempt

    async def _attempt(self, item: ItemState, step: ChainStep, attempt: int) -> AttemptResult:
        """The step's agent at work (``busy`` meanwhile: the shutdown lets it finish within the grace); a SPAWN that
        cannot be built is an error result, never an exception out of the run. The slot is given back either way."""
        self._stepping = True
        with structlog.contextvars.bound_contextvars(step=step.name, attempt=attempt):
            try:
                return await self.carry_out(self.build_attempt(item, attempt))
            except Exception as exc:  # noqa: BLE001 - a step whose SPAWN cannot be built fails, the daemon goes on
                return AttemptResult(result="error", error=str(exc))
            finally:
                self._stepping = False
                self._release(item.name)

    def _record_verdict(
        self, item: ItemState, step: ChainStep, attempt: int, res: AttemptResult, verdict: StepVerdict
    ) -> EscalationRequest | None:
        """The attempt's result and the question it leads to, in one journal write: a step closed without tests, or
        whose exit trigger is a ``gate:human``, waits on the person and is never "done" alone, even after a crash.
        Returns the acceptance question of a step closed without tests (asked once ``STEP_DONE`` is out)."""
        accept = None
        with self.journal.together():
            self._attempt_finished(
                item,
                attempt,
                res,
                agent=self._agent_for(step),
                result=_recorded(verdict, res),
                error=verdict.reason or res.error,
                question=False,  # a step's own questions are _agent_asks's: this record never had the key
            )
            if verdict.needs_human:
                accept = self._request(
                    item,
                    "gate",
                    untested_question(step),
                    [(k, label, k) for k, label in GATE_OPTIONS],
                )
                self._asking(item, accept, gate=True)
            elif verdict.status != "failed":  # an exit trigger's gate: the step waits on the person, never "done"
                route = exit_route(verdict.actions, verdict.status, terminal=step.gate == "never")
                if route.kind == "gate":
                    self._asking(
                        item, self._request(*self._exit_gate(item, step, verdict.status, route.action)), gate=True
                    )
        return accept

    async def _after_failure(self, item: ItemState, step: ChainStep, attempt: int, res: AttemptResult) -> bool:
        """A failed step: its retry policy first (the step's, else the chain's), then the breaker. True when the
        step waits now (for its retry's time, or on the person after the breaker tripped); False when its exit
        trigger is to be routed."""
        if res.retryable and res.result in step.retry.on and item.fails < step.retry.attempts:
            delay = step.retry.delay(item.fails, self.ports.rng)
            not_before = self.ports.clock.now() + timedelta(seconds=delay)
            self.event(events.retry, item=item.name, attempt=attempt, not_before=not_before.isoformat())
            await self.commit()
            return True
        scope = step.scope or step.name
        if self.chain.breaker is not None:
            fails = self.chain.breaker.fail(scope)
            tripped = fails >= self.chain.threshold
        else:
            fails, tripped = breaker_update(self.state.breaker.get(scope, 0), True, self.chain.threshold)
        self.event(events.breaker, scope=scope, fails=fails, tripped=tripped)
        if tripped:
            await self._trip(item, step, scope, fails)
            return True
        return False

    def _after_success(self, step: ChainStep) -> None:
        """A step that did not fail closes its scope's run of failures (the breaker counts consecutive ones)."""
        scope = step.scope or step.name
        if self.chain.breaker is not None:
            self.chain.breaker.success(scope)
        self.event(events.breaker, scope=scope, fails=0, tripped=False)

    async def _agent_asks(self, item: ItemState, step: ChainStep, attempt: int, res: AttemptResult) -> None:
        """The step's agent asked the person (its own ESCALATE): its question and options, as in a for_each; the
        answer runs the step again with it in ``payload.context.decision``. A question is not a failure: the
        breaker does not count it."""
        agent = self._agent_for(step)
        signature = permission_signature(res.permission)
        if signature is not None:  # a tool call the agent waits on the person for (ForEachExecutor._item_question)
            kind, detail = "permission", signature
            question = res.question or f"{agent} wants to run {signature} in step {step.name}"
            options = permission_options(res.options or [], res.permission)
        else:
            kind, detail = "question", res.question or ""
            question = res.question or f"{agent} asks a decision about step {step.name}"
            options = question_options(res.options or ["continue"])
        req = self._request(item, kind, question, options, detail=detail)
        with self.journal.together():  # the result and its question in one write: never a "fail" alone
            self._attempt_finished(item, attempt, res, agent=agent, result="fail", error=res.error)
            self._asking(item, req)
        esc = await self._publish(req)
        self.event(events.escalated, item=item.name, escalation=esc, kind=kind, agent=agent)
        await self.commit()
        self.ports.claims.item_changed(self.state, item)

    async def _trip(self, item: ItemState, step: ChainStep, scope: str, fails: int) -> None:
        await self._signal("CIRCUIT_BREAK", None, {"context": {"step": step.name, "fails": fails}})
        esc = await self._ask(
            item,
            "circuit_break",
            f"circuit breaker: {fails} consecutive failures on {scope} (step {step.name}). Inspect, then decide.",
            [("reset", "Reset the breaker and run the step again", "reset"), ("abort", "Abort the chain", "abort")],
            scope=scope,
        )
        self.event(events.escalated, item=item.name, escalation=esc, kind="circuit_break", agent=self._agent_for(step))
        await self.commit()
        self.ports.claims.item_changed(self.state, item)

    async def _route_exit(
        self, item: ItemState, step: ChainStep, status: StepStatus, actions: Sequence[ChainAction], reason: str | None
    ) -> None:
        """Carry out the exit trigger as :func:`~.planner.exit_route` reads it (validation reads it so too)."""
        idx = item.index
        route = exit_route(actions, status, terminal=step.gate == "never")
        for effect in route.effects:
            if effect.kind == "notify":
                self.event(events.note, text=effect.message or "")
                await self.ports.escalator.inform(f"{self.state.workflow}: step {step.name}", effect.message or "")
            elif effect.kind == "start":
                await self._start_other(effect)
            else:
                await self._signal(
                    effect.signal or "BLOCKED_ON",
                    effect.target,
                    {"context": {"step": step.name, "status": status, "reason": reason}},
                )
        action = route.action
        if route.kind == "end":
            self.event(events.cursor, index=len(self.steps))  # gate: never — the chain ends with this step
        elif route.kind in ("next", "goto"):
            self._advance(idx, action or ChainAction("next"))
        elif route.kind == "spawn" and action is not None:
            name = f"{action.step_type or 'code'}@{action.scope or step.scope or ''}"
            if name in self._by_name:
                name = f"{name}#{len(self.state.items)}"
            self.event(events.added, item=name)
            self.steps.append(
                ChainStep(
                    name=name,
                    type=action.step_type or "code",
                    scope=action.scope,
                    agent=self.chain.default_agents.get(action.step_type or "code"),
                    retry=self.plan.retry,
                )
            )
            self.event(events.cursor, index=len(self.state.items) - 1)
        elif route.kind == "gate":
            message = action.message if action is not None else None
            esc = await self._ask(*self._exit_gate(item, step, status, action), gate=True)
            self.event(events.gate, item=item.name, state="pending", escalation=esc, agent=self._agent_for(step))
            await self._signal(
                "GATE_PENDING", None, {"context": {"step": step.name, "message": message or "continue?"}}
            )
        elif route.kind == "abort":
            self.event(
                events.decided,
                item=item.name,
                escalation="",
                option="abort",
                action="abort",
                by="workflow",
                channel="trigger",
            )
        else:  # blocked: the person retries, skips or aborts
            esc = await self._ask(
                item,
                "blocked",
                f"step {step.name} failed: {reason or 'no detail'}",
                [
                    ("retry", "Run the step again", "retry"),
                    ("skip", "Skip the step and go on", "skip"),
                    ("abort", "Abort the chain", "abort"),
                ],
                detail=reason or "",
            )
            self.event(events.escalated, item=item.name, escalation=esc, kind="blocked", agent=self._agent_for(step))

    def _exit_gate(
        self, item: ItemState, step: ChainStep, status: StepStatus, action: ChainAction | None
    ) -> tuple[ItemState, str, str, list[tuple[str, str, str]]]:
        """The question of an exit trigger's ``gate:human``: asked where the step's result is journaled, and again
        when the trigger is carried out (the same request: found in the journal's ``asking``)."""
        message = action.message if action is not None else None
        return item, "gate", route_question(step, status, message), [(k, lb, k) for k, lb in GATE_OPTIONS]

    async def _start_other(self, action: ChainAction) -> None:
        """``trigger:<workflow>/<step>``: a run of that workflow starts at that step, with this run's context."""
        started = None
        if self.chain.start_workflow is not None and action.workflow:
            started = self.chain.start_workflow(
                action.workflow, action.target, dict(self.state.context), f"trigger:{self.state.run_id}"
            )
        text = (
            f"started {action.workflow} at step {action.target}: {started}"
            if started
            else f"could not start {action.workflow} at step {action.target} (no such workflow is loaded)"
        )
        self.event(events.note, text=text)

    async def _final_gate(self) -> bool:
        """True when the run finished; False when it waits on the final approval."""
        if gate_after_last(self.chain.mode) and self.state.final_gate != "passed":
            if self.state.final_gate == "rejected":
                await self._abort("final result rejected")
                return True
            if self.state.final_gate != "pending":
                esc = await self._ask(
                    None,
                    "gate",
                    FINAL_QUESTION,
                    [(k, label, k) for k, label in GATE_OPTIONS],
                )
                self.event(events.final_gate, state="pending", escalation=esc)
                await self.commit()
            return False
        if self.chain.branch and self.chain.branches is not None:
            problem = await self.chain.branches.merge(self.chain.branch)
            if problem:
                self.event(events.note, text=f"theme branch not merged: {problem}")
                await self._signal("BLOCKED_ON", None, {"context": {"branch": self.chain.branch, "reason": problem}})
        done = sum(1 for i in self.state.items if i.status == "done")
        await self._signal(
            "DONE",
            None,
            {"context": {"workflow": self.state.workflow, "summary": f"{done}/{len(self.state.items)} steps done"}},
        )
        await self._finish()
        return True

    async def _abort(self, why: str) -> None:
        await self._signal("ABORT", None, {"context": {"workflow": self.state.workflow, "reason": why}})
        await self._finish()

    def decide(self, d: Ruling) -> bool:
        if d.escalation == self.state.final_escalation and d.escalation in self.state.escalations:
            self.state.escalations.pop(d.escalation, None)
            fields = d.fields(None)
            fields.pop("item", None)
            fields.pop("answer", None)
            self.event(events.decided, **fields)
            self.event(events.final_gate, state="passed" if d.action in ("approve", "continue") else "rejected")
            self.journal.sync()
            self.poke()
            return True
        item_name = self.state.escalations.get(d.escalation)
        if d.action == "reset" and item_name:
            step = self.steps[self._by_name[item_name].index]
            scope = step.scope or step.name
            if self.chain.breaker is not None:
                self.chain.breaker.reset(scope)
            self.event(events.breaker, scope=scope, fails=0, tripped=False)
            d = replace(d, action="retry")
        return super().decide(d)

    @property
    def busy(self) -> bool:
        return self._stepping

    async def _interrupt(self) -> None:
        for item in self.state.items:
            if item.status == "running":
                self.event(events.interrupted, item=item.name, attempt=item.attempt)
                self.ports.claims.item_changed(self.state, item)
        with contextlib.suppress(OSError):
            self.journal.sync()
