"""Workflow specs → the planner's terms (FanOut, ItemTemplate, ChainStep). Pure translation, no I/O.

Kept apart so that the executors never depend on the YAML shape of a workflow, and a run resumed
from its pinned spec is translated exactly as it was when it started.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ambient.planner import (
    DEFAULT_ON_RETURN,
    ChainAction,
    ChainStep,
    FanOut,
    ItemTemplate,
    Reaction,
    RetryPolicy,
)
from ambient.workflow import (
    AbortAction,
    Action,
    ChainWorkflow,
    EscalateAction,
    ForEachWorkflow,
    GateAction,
    GotoAction,
    LogAction,
    NextAction,
    NotifyAction,
    SignalAction,
    SpawnAction,
    WorkflowSpec,
)
from ambient.workflow import RetryPolicy as SpecRetry


def retry_policy(spec: SpecRetry | None) -> RetryPolicy:
    """The planner's retry policy from a workflow's (default: one attempt, no retry)."""
    if spec is None:
        return RetryPolicy()
    return RetryPolicy(attempts=spec.attempts, base_s=spec.backoff, cap_s=spec.max_backoff, jitter=spec.jitter,
                       on=frozenset(spec.on))


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


def fanout(spec: ForEachWorkflow, default_concurrency: int | None = None) -> FanOut:
    """The for_each plan: concurrency, retries, and the reaction to each result."""
    fe = spec.for_each
    ret = fe.on_return
    on_return = {
        "success": reaction(ret.success, DEFAULT_ON_RETURN["success"]),
        "fail": reaction(ret.fail, DEFAULT_ON_RETURN["fail"]),
        "error": reaction(ret.error, DEFAULT_ON_RETURN["error"]),
        "escalate": reaction(ret.escalate, DEFAULT_ON_RETURN["escalate"]),
        "blocked": reaction(ret.blocked, DEFAULT_ON_RETURN["blocked"]),
    }
    concurrency = fe.concurrency
    if "concurrency" not in fe.model_fields_set and default_concurrency is not None:
        concurrency = default_concurrency
    return FanOut(concurrency=concurrency, retry=retry_policy(spec.retry), on_return=on_return)


def item_template(spec: WorkflowSpec) -> ItemTemplate:
    """What each SPAWN of a run looks like before templating (the chain uses only its common parts)."""
    esc = spec.on_escalate
    extra = tuple((o, o, "answer") for o in esc.options)
    common = {
        "sender": spec.sender,
        "escalate_to": spec.supervisor,
        "extra_options": extra,
        "deadline_s": esc.timeout,
        "on_timeout": esc.on_timeout if esc.timeout else None,
        "remind_before_s": esc.remind_before,
        "timeout_s": spec.timeout,
    }
    oc = spec.on_complete
    complete = {
        "complete_signal": oc.signal if oc is not None else None,
        "complete_to": (oc.to or spec.supervisor) if oc is not None else None,
        "complete_result": _result_template(oc.payload) if oc is not None else None,
    }
    if isinstance(spec, ForEachWorkflow):
        fe = spec.for_each
        return ItemTemplate(agent=fe.spawn, files=tuple(fe.scope.files), zone=fe.scope.zone, context=fe.context,
                            **common, **complete)  # type: ignore[arg-type]
    return ItemTemplate(agent="ambient", **common, **complete)  # type: ignore[arg-type]


def _result_template(payload: Mapping[str, object]) -> str | None:
    value = payload.get("result")
    return value if isinstance(value, str) else None


def chain_action(a: Action) -> ChainAction | None:
    """One exit-trigger action in the planner's terms (``log`` is only logged: None)."""
    if isinstance(a, NextAction):
        return ChainAction("next")
    if isinstance(a, GotoAction):
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


def _actions(actions: Sequence[Action] | None) -> tuple[ChainAction, ...]:
    return tuple(c for c in (chain_action(a) for a in actions or ()) if c is not None)


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
            on_done=_actions(s.on_done),
            on_partial=_actions(s.on_partial),
            on_fail=_actions(s.on_fail),
            story_angle=s.story_angle or None,
        )
        for s in spec.chain
    ]


def items_of(spec: WorkflowSpec) -> list[str]:
    """The items of a run: for_each items, or the chain's step keys."""
    if isinstance(spec, ForEachWorkflow):
        return list(spec.for_each.items)
    return [s.key for s in spec.chain]
