"""Workflow specs → the planner's terms (FanOut, ItemTemplate, ChainStep). Pure translation, no I/O.

Kept apart so that the executors never depend on the YAML shape of a workflow, and a run resumed
from its pinned spec is translated exactly as it was when it started.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from ambient.engine.planner import (
    DEFAULT_ON_RETURN,
    ChainAction,
    ChainStep,
    FanOut,
    ItemTemplate,
    Reaction,
    RetryPolicy,
    StepStatus,
    exit_actions,
    exit_route,
)
from ambient.kernel.zones import DEFAULT_RULES, ZoneRule
from ambient.workflows.checks import Issue, spec_issues
from ambient.workflows.exit_actions import (
    AbortAction,
    Action,
    EscalateAction,
    GateAction,
    GotoAction,
    LogAction,
    NextAction,
    NotifyAction,
    SignalAction,
    SpawnAction,
)
from ambient.workflows.spec import MAX_CONCURRENCY, ChainWorkflow, ForEachWorkflow, WorkflowSpec
from ambient.workflows.spec import RetryPolicy as SpecRetry


def retry_policy(spec: SpecRetry | None) -> RetryPolicy:
    """The planner's retry policy from a workflow's (default: one attempt, no retry)."""
    if spec is None:
        return RetryPolicy()
    return RetryPolicy(
        attempts=spec.attempts, base_s=spec.backoff, cap_s=spec.max_backoff, jitter=spec.jitter, on=frozenset(spec.on)
    )


def reaction(actions: Sequence[Action] | None, default: Reaction) -> Reaction:
    """ADR-027 ``on_return`` actions (``→ ERROR + log + ESCALATE pilote``) as one reaction."""
    if not actions:
        return default
    verbs: set[str] = set()
    target = signal = message = None
    for a in actions:
        if isinstance(a, NextAction):
            verbs.add("next")
        elif isinstance(a, EscalateAction):
            verbs.add("escalate")
            target = a.to or target
            message = a.message or message
        elif isinstance(a, SignalAction):
            if a.signal == "ERROR":
                verbs.add("error")
            elif a.waits:  # BLOCKED_ON and friends wait for the person
                verbs.add("escalate")
            verbs.add("signal")
            signal, target = a.signal, a.to or target
        elif isinstance(a, LogAction):
            verbs.add("log")
        elif isinstance(a, AbortAction):
            verbs.add("abort")
        elif isinstance(a, GateAction):
            verbs.add("escalate")
            message = a.message or message
        elif isinstance(a, NotifyAction):
            verbs.add("notify")
            message = a.message
    return Reaction(frozenset(verbs) or frozenset({"next"}), target=target, signal=signal, message=message)


def fanout(spec: ForEachWorkflow) -> FanOut:
    """The for_each plan: concurrency (the run's own; without one, only the daemon-wide cap applies), retries,
    and the reaction to each result."""
    fe = spec.for_each
    ret = fe.on_return
    on_return = {
        "success": reaction(ret.success, DEFAULT_ON_RETURN["success"]),
        "fail": reaction(ret.fail, DEFAULT_ON_RETURN["fail"]),
        "error": reaction(ret.error, DEFAULT_ON_RETURN["error"]),
        "escalate": reaction(ret.escalate, DEFAULT_ON_RETURN["escalate"]),
        "blocked": reaction(ret.blocked, DEFAULT_ON_RETURN["blocked"]),
    }
    return FanOut(concurrency=fe.concurrency or MAX_CONCURRENCY, retry=retry_policy(spec.retry), on_return=on_return)


def item_template(spec: WorkflowSpec) -> ItemTemplate:
    """What each SPAWN of a run looks like before templating (the chain uses only its common parts)."""
    esc = spec.on_escalate
    oc = spec.on_complete
    base = ItemTemplate(
        agent="ambient",
        sender=spec.sender,
        escalate_to=spec.supervisor,
        extra_options=tuple((o, o, "answer") for o in esc.options),
        deadline_s=esc.timeout,
        on_timeout=esc.on_timeout if esc.timeout else None,
        remind_before_s=esc.remind_before,
        timeout_s=spec.timeout,
        complete_signal=oc.signal if oc is not None else None,
        complete_to=(oc.to or spec.supervisor) if oc is not None else None,
        complete_result=_result_template(oc.payload) if oc is not None else None,
    )
    if isinstance(spec, ForEachWorkflow):
        fe = spec.for_each
        return replace(base, agent=fe.spawn, files=tuple(fe.scope.files), zone=fe.scope.zone, context=fe.context)
    return base


def _result_template(payload: Mapping[str, object]) -> str | None:
    value = payload.get("result")
    return value if isinstance(value, str) else None


def chain_action(a: Action, own: str | None = None) -> ChainAction | None:
    """One exit-trigger action in the planner's terms (``log`` is only logged: None); ``own``: the chain's name
    (``trigger:<own>/<step>`` is a step of the chain itself, another workflow's starts a run of it)."""
    if isinstance(a, NextAction):
        return ChainAction("next")
    if isinstance(a, GotoAction):
        if a.workflow not in (None, own):
            return ChainAction("start", target=str(a.step), workflow=a.workflow)
        return ChainAction("goto", target=str(a.step))
    if isinstance(a, SpawnAction):
        return ChainAction("spawn", step_type=a.satellite_type, scope=a.scope)
    if isinstance(a, SignalAction):
        return ChainAction("signal", signal=a.signal, target=a.to, message=a.message)
    if isinstance(a, EscalateAction | GateAction):
        return ChainAction("gate", message=a.message)
    if isinstance(a, NotifyAction):
        return ChainAction("notify", message=a.message)
    if isinstance(a, AbortAction):
        return ChainAction("abort", message=a.message)
    return None


def _actions(actions: Sequence[Action] | None, own: str) -> tuple[ChainAction, ...]:
    return tuple(c for c in (chain_action(a, own) for a in actions or ()) if c is not None)


def chain_steps(spec: ChainWorkflow, default_agents: Mapping[str, str] | None = None) -> list[ChainStep]:
    """The chain's steps in the planner's terms, each with the agent that runs it."""
    return [
        ChainStep(
            name=s.key,
            type=s.type,
            scope=s.scope,
            agent=spec.agent_for(s, default_agents),
            gate=s.gate,
            level="domain" if s.type == "domain" else "leaf",
            on_done=_actions(s.on_done, spec.name),
            on_partial=_actions(s.on_partial, spec.name),
            on_fail=_actions(s.on_fail, spec.name),
            story_angle=s.story_angle or None,
            input_contract=s.input_contract or None,
            retry=retry_policy(spec.retry_for(s)),
            timeout_s=spec.timeout_for(s),
        )
        for s in spec.chain
    ]


def items_of(spec: WorkflowSpec) -> list[str]:
    """The items of a run: for_each items, or the chain's step keys."""
    if isinstance(spec, ForEachWorkflow):
        return list(spec.for_each.items)
    return [s.key for s in spec.chain]


def workflow_issues(spec: WorkflowSpec, zone_rules: Iterable[ZoneRule] = DEFAULT_RULES) -> list[Issue]:
    """Every finding about a spec beyond its schema (``ambient validate``, ``doctor`` and each load): those of
    :func:`ambient.workflows.checks.spec_issues`, and for a chain without errors the routes between its steps."""
    out = spec_issues(spec, zone_rules)
    if isinstance(spec, ChainWorkflow) and all(i.severity == "warning" for i in out):
        out += route_issues(spec)
    return out


def _routes(spec: ChainWorkflow) -> dict[int, list[tuple[int, str]]]:
    """The steps each step can lead to, with the field that leads there, read with the executor's own rule
    (:func:`ambient.engine.planner.exit_route`): a gate approved, or a failure the person skips, goes on too."""
    steps = chain_steps(spec)
    index = {s.name: i for i, s in enumerate(steps)}
    fields: dict[StepStatus, str] = {"ok": "on_done", "partial": "on_partial", "failed": "on_fail"}
    graph: dict[int, list[tuple[int, str]]] = {}
    for i, step in enumerate(steps):
        out: list[tuple[int, str]] = []
        for status, field in fields.items():
            route = exit_route(exit_actions(step, status), status, terminal=step.gate == "never")
            if route.kind == "goto" and route.action is not None:
                if route.action.target in index:
                    out.append((index[route.action.target], field))
            elif route.kind in ("next", "spawn", "gate", "blocked") and i + 1 < len(steps):
                out.append((i + 1, field))
        graph[i] = out
    return graph


def route_issues(spec: ChainWorkflow) -> list[Issue]:
    """Loops between steps are refused (repetition is what ``retry:`` is for; a loop never ends on its own), and a
    step no route reaches from the first is reported (a warning)."""
    graph = _routes(spec)
    out: list[Issue] = []
    state: dict[int, int] = {}  # 1 = on the stack, 2 = done
    stack: list[int] = []

    def visit(node: int) -> bool:
        state[node] = 1
        stack.append(node)
        for target, field in graph[node]:
            if state.get(target) == 1:
                loop = [*stack[stack.index(target) :], target]
                path = " → ".join(spec.chain[k].key for k in loop)
                out.append(
                    Issue(("chain", node, field), f"{field} makes a loop ({path}); loops are not supported, use retry:")
                )
                return True
            if state.get(target) is None and visit(target):
                return True
        stack.pop()
        state[node] = 2
        return False

    for start in range(len(spec.chain)):
        if state.get(start) is None and visit(start):
            break
    if not out:
        reached = {0}
        todo = [0]
        while todo:
            for target, _ in graph[todo.pop()]:
                if target not in reached:
                    reached.add(target)
                    todo.append(target)
        for i, step in enumerate(spec.chain):
            if i not in reached:
                out.append(Issue(("chain", i), f"step {step.key} is never reached from the first step", "warning"))
    return out
