"""Replay: recorded runs through a workflow as it is now, decided by the engine's own rules (a dry run, no I/O).

The executors decide with pure functions (:func:`ambient.engine.planner.after_attempt` for a for_each item,
:func:`~ambient.engine.planner.judge_step`, :func:`~ambient.engine.planner.gate_before` and
:func:`~ambient.engine.planner.exit_route` for a chain step, the retry policies and the circuit breaker); replay calls
the very same functions on each recorded step, so a workflow replayed over its own records meets exactly the
escalations it met (a property test holds it to that), and a changed workflow shows what would now go differently:
which steps would reach the person, be decided by a learned rule, or be routed another way. Nothing is executed.

A recorded step carries what the agent answered (``reply``: success, fail, error, escalate, blocked) and its
result's ``status`` and ``tests``; records of older versions lack them and are read from ``result`` and
``signal_in`` as well as they can be.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from ambient.engine.compile import chain_steps, fanout, retry_policy
from ambient.engine.planner import (
    DEFAULT_ON_RETURN,
    FINAL_QUESTION,
    ChainStep,
    FanOut,
    after_attempt,
    before_question,
    exit_route,
    gate_after_last,
    gate_before,
    gate_words,
    judge_step,
    route_question,
    untested_question,
)
from ambient.engine.records import RunRecord
from ambient.engine.runstate import UNRECOVERABLE, ItemState
from ambient.learning.rules import (
    SIGNAL_OF_KIND,
    Policy,
    Rule,
    Situation,
    may_auto_decide,
    predict,
    situation_from_step,
    situation_of,
)
from ambient.learning.stats import is_int, jsonable, parse_time
from ambient.workflows.spec import ChainWorkflow, ForEachWorkflow, WorkflowSpec

ReplayChange = Literal["escalate", "rule", "rerouted"]

# Retry delays and jitter do not change what happens, only when: one fixed source keeps replay deterministic.
_NOW = datetime(2000, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Fate:
    """What a workflow does after one recorded step: ``next`` (goes on), ``retry`` (its retry policy),
    ``escalate`` (the person decides; ``kind`` says why), ``abort``, ``stop`` (the chain ends), ``goto:<step>``;
    ``gated``: a human gate asked the person before the step ran (an escalation of its own)."""

    action: str
    kind: str | None = None
    gated: bool = False
    words: str | None = None  # a gate's, after the step: its step's type and question (planner.gate_words)

    @property
    def escalations(self) -> int:
        return int(self.action == "escalate") + int(self.gated)


def reply_of(step: Mapping[str, Any]) -> str:
    """What the agent answered: the recorded ``reply``, else read from ``signal_in`` and ``result`` (older records).
    The agent's own ERROR (``unrecoverable``) is an ``error`` that :func:`retryable` says no retry may follow."""
    reply = step.get("reply")
    if isinstance(reply, str) and reply:
        return "error" if reply == UNRECOVERABLE else reply
    signal = step.get("signal_in")
    if signal == "ESCALATE":
        return "escalate"
    if signal == "BLOCKED_ON":
        return "blocked"
    result = str(step.get("result"))
    return result if result in ("success", "fail", "error") else "error"


def retryable(step: Mapping[str, Any]) -> bool:
    """Whether the retry policy may run the step again (not after the agent's own ERROR signal)."""
    return step.get("reply") != UNRECOVERABLE


def fates(
    spec: WorkflowSpec | None,
    steps: Sequence[Mapping[str, Any]],
    *,
    gated: Sequence[str] = (),
    reached_end: bool | None = None,
    decisions: Sequence[Mapping[str, Any]] = (),
    threshold: int = 3,
    breaker: dict[str, int] | None = None,
) -> tuple[list[Fate], list[str]]:
    """The fate of each recorded step of one run under ``spec`` (None: ADR-027's for_each defaults), and the
    escalations of the run that belong to no recorded step, by the step they ask about: a human gate before a step
    that then never ran (``gated``: the steps the run's gates stopped before), a swarm chain's final gate (``""``;
    ``reached_end``: the run went past its last step; None: guessed from the steps).

    ``decisions``: the run's, in order; what the person answered changes what comes next (``retry`` counts the
    failures of an item from zero again, ``approve`` does not). ``breaker``: consecutive failures per scope,
    carried from run to run as the daemon's breaker carries them.
    """
    answers = _Answers(decisions)
    if isinstance(spec, ChainWorkflow):
        return _chain_fates(spec, steps, gated, reached_end, answers, threshold, breaker if breaker is not None else {})
    plan = fanout(spec) if isinstance(spec, ForEachWorkflow) else FanOut(on_return=dict(DEFAULT_ON_RETURN))
    return _for_each_fates(plan, steps, answers), []


class _Answers:
    """The person's answers about each item or step, in the order they were given."""

    def __init__(self, decisions: Sequence[Mapping[str, Any]]) -> None:
        self._by_item: dict[str, list[str]] = {}
        for d in decisions:
            if d.get("escalation") and d.get("item") is not None:  # "": an exit trigger's abort, not an answer
                # A breaker's ``reset`` is recorded as the retry it becomes (ChainExecutor.decide): keep the option.
                answer = "reset" if d.get("option") == "reset" else str(d.get("action") or d.get("option"))
                self._by_item.setdefault(str(d["item"]), []).append(answer)

    def next(self, item: str) -> str | None:
        """The answer to the next escalation about ``item`` (None: never answered, the run ended first)."""
        queue = self._by_item.get(item)
        return queue.pop(0) if queue else None


#: Answers after which an item's failures count from zero again (apply_event's ``decided``).
_RESETS = frozenset({"retry", "answer", "reset"})


def _for_each_fates(plan: FanOut, steps: Sequence[Mapping[str, Any]], answers: _Answers) -> list[Fate]:
    rng = random.Random(0)
    fails: dict[str, int] = {}
    out: list[Fate] = []
    for s in steps:
        name, reply = str(s.get("item")), reply_of(s)
        count = _counted(s, fails.get(name, 0))
        outcome = after_attempt(plan, ItemState(name, 0, fails=count), reply, _NOW, rng, retryable=retryable(s))
        fails[name] = count
        if outcome.kind == "escalate":
            out.append(Fate("escalate", _kind(reply, s)))
            if answers.next(name) in _RESETS:
                fails[name] = 0
        elif outcome.kind == "retry":
            out.append(Fate("retry"))
        elif outcome.kind == "failed" and "abort" in outcome.reaction.verbs:
            out.append(Fate("abort"))
        else:
            out.append(Fate("next"))
    return out


def _counted(step: Mapping[str, Any], fails: int) -> int:
    """Consecutive failures after a step, as its ``finished`` event counts them (by the recorded result: a chain
    step whose RETURN failed its gate counts as a failure)."""
    return 0 if step.get("result") == "success" else fails + 1


def _kind(reply: str, step: Mapping[str, Any]) -> str:
    """Why a step reached the person: an agent's ESCALATE about a tool call (its ``permission_signature`` recorded)
    is a ``permission``, as ForEachExecutor._item_question names it; another is its ``question``."""
    if reply == "escalate" and step.get("permission_signature"):
        return "permission"
    return {"escalate": "question", "blocked": "blocked", "error": "error"}.get(reply, "fail")


def _chain_fates(
    spec: ChainWorkflow,
    steps: Sequence[Mapping[str, Any]],
    gated_steps: Sequence[str],
    reached_end: bool | None,
    answers: _Answers,
    threshold: int,
    breaker: dict[str, int],
) -> tuple[list[Fate], list[str]]:
    chain = chain_steps(spec)
    index = {s.name: i for i, s in enumerate(chain)}
    ran = {str(s.get("item")) for s in steps}
    # A gate before a step that never ran (rejected, or the run ended while it waited) left no step behind.
    extra = [
        name
        for name in dict.fromkeys(gated_steps)
        if name not in ran
        and name in index
        and gate_before(chain[index[name]], index[name], len(chain), spec.mode) is not None
    ]
    fails: dict[str, int] = {}
    passed: set[str] = set()  # steps whose gate before was answered in this run
    out: list[Fate] = []
    for s in steps:
        name = str(s.get("item"))
        i = index.get(name)
        step = chain[i] if i is not None else _satellite(name, spec)
        scope = step.scope or step.name
        gated = False
        if name not in passed:
            passed.add(name)
            gated = i is not None and gate_before(step, i, len(chain), spec.mode) is not None
            if gated:
                answers.next(name)  # approved: the step ran
        fate = _step_fate(step, s, fails, breaker, threshold)
        out.append(Fate(fate.action, fate.kind, gated, fate.words))
        if fate.action == "escalate":
            answer = answers.next(name)
            if answer in _RESETS:
                fails[name] = 0
            if answer == "reset":
                breaker[scope] = 0
    end = reached_end if reached_end is not None else _reached_end(chain, steps, out)
    return out, extra + ([""] if gate_after_last(spec.mode) and end else [])


def _step_fate(
    step: ChainStep, s: Mapping[str, Any], fails: dict[str, int], breaker: dict[str, int], threshold: int
) -> Fate:
    """One chain step's attempt, decided as ChainExecutor._run_step decides it."""
    name, reply = step.name, reply_of(s)
    scope = step.scope or step.name
    fails[name] = _counted(s, fails.get(name, 0))
    if reply == "escalate":  # the agent's own question: not a failure (the breaker does not count it)
        return Fate("escalate", _kind(reply, s))
    output = {k: s[k] for k in ("status", "tests") if s.get(k) is not None}
    verdict = judge_step(step, output, reply)
    if verdict.status == "failed":
        if retryable(s) and reply in step.retry.on and fails[name] < step.retry.attempts:
            return Fate("retry")
        breaker[scope] = breaker.get(scope, 0) + 1
        if breaker[scope] >= threshold:
            return Fate("escalate", "circuit_break")
    else:
        breaker[scope] = 0
        if verdict.needs_human:
            return Fate("escalate", "gate", words=gate_words(step, untested_question(step)))
    route = exit_route(verdict.actions, verdict.status, terminal=step.gate == "never")
    if route.kind == "gate":
        message = route.action.message if route.action is not None else None
        return Fate("escalate", "gate", words=gate_words(step, route_question(step, verdict.status, message)))
    if route.kind == "blocked":
        return Fate("escalate", route.kind)
    if route.kind == "goto" and route.action is not None:
        return Fate(f"goto:{route.action.target}")
    return Fate({"abort": "abort", "end": "stop"}.get(route.kind, "next"))


def _before_words(spec: WorkflowSpec | None, name: str) -> str | None:
    """The words of the gate before a chain's step ``name`` (``""``: a swarm chain's final gate), as the executor
    asks it; None when the workflow no longer gates it."""
    if not isinstance(spec, ChainWorkflow):
        return None
    if not name:
        return gate_words(None, FINAL_QUESTION)
    chain = chain_steps(spec)
    for i, step in enumerate(chain):
        if step.name == name:
            reason = gate_before(step, i, len(chain), spec.mode)
            return gate_words(step, before_question(step, reason)) if reason else None
    return None


def _agent_of(spec: WorkflowSpec | None, step: str) -> str:
    """The agent of a chain's step by name ("-" for the chain's final gate, or a step it no longer has)."""
    if isinstance(spec, ChainWorkflow):
        for s in chain_steps(spec):
            if s.name == step:
                return s.agent or "-"
    return "-"


_KIND_OF_SIGNAL = {signal: kind for kind, signal in SIGNAL_OF_KIND.items()}


def _satellite(name: str, spec: ChainWorkflow) -> ChainStep:
    """A step a trigger added (``code@scope``), or one the workflow no longer has: the chain's defaults."""
    kind, _, scope = name.partition("@")
    return ChainStep(name=name, type=kind.split("#")[0] or "code", scope=scope or None, retry=retry_policy(spec.retry))


def _reached_end(chain: Sequence[ChainStep], steps: Sequence[Mapping[str, Any]], out: Sequence[Fate]) -> bool:
    """Whether the run went past its last declared step (a swarm chain then asks for the final approval)."""
    if not out or not chain:
        return False
    last = chain[-1].name
    done = [f for s, f in zip(steps, out, strict=True) if str(s.get("item")) == last]
    return bool(done) and done[-1].action in ("next", "stop")


@dataclass(frozen=True)
class ReplayItem:
    """One recorded step whose handling would differ now, or that would still reach the person."""

    run_id: str
    started_at: datetime
    item: str
    agent: str
    result: str
    recorded: str | None  # what the workflow did then (None: not known)
    now: str  # what the workflow does now
    change: ReplayChange  # escalate: the person decides; rule: a rule decides; rerouted: another action
    rule_id: str | None = None
    option: str | None = None  # the rule's option (deciding, or only suggesting in shadow)
    signature: str | None = None  # the agent's words, normalised (a gate's: its step)
    kind: str | None = None  # why it reaches the person: question, fail, error, blocked, gate, circuit_break


@dataclass(frozen=True)
class ReplayReport:
    """What the recorded runs would meet today (a dry run: nothing is executed)."""

    workflow: str
    runs: int = 0
    steps: int = 0
    invalid: int = 0
    recorded_escalations: int = 0  # the runs' own escalation counts
    would_escalate: int = 0
    decided_by_rule: int = 0
    routed_differently: int = 0
    unchanged: int = 0
    items: list[ReplayItem] = field(default_factory=list)
    uncompared: int = 0  # runs whose own spec is unknown (journal gone): what they did then is not compared

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return jsonable(asdict(self))  # type: ignore[no-any-return]


@dataclass(frozen=True)
class _Recorded:
    """One run record of the workflow, read: what :func:`replay` needs of it."""

    run_id: str
    started: datetime
    steps: list[Mapping[str, Any]]
    escalations: int
    gated: list[str]
    reached_end: bool | None
    decisions: list[Mapping[str, Any]]

    def fates(self, spec: WorkflowSpec | None, threshold: int, breaker: dict[str, int]) -> tuple[list[Fate], list[str]]:
        """Phase 2: its steps' fates under ``spec`` (:func:`fates`)."""
        return fates(
            spec,
            self.steps,
            gated=self.gated,
            reached_end=self.reached_end,
            decisions=self.decisions,
            threshold=threshold,
            breaker=breaker,
        )


#: A question the workflow would ask now: item, agent, result, what the run did then, the situation a rule judges.
_Asked = tuple[str, str, str, str | None, Situation]


@dataclass
class _Tally:
    """The counts and items of a replay as its runs are read."""

    runs: int = 0
    steps: int = 0
    invalid: int = 0
    recorded_escalations: int = 0
    would_escalate: int = 0
    decided_by_rule: int = 0
    routed_differently: int = 0
    unchanged: int = 0
    uncompared: int = 0
    items: list[ReplayItem] = field(default_factory=list)


def _read_record(rec: Mapping[str, Any]) -> _Recorded | None:
    """Phase 1: a run record read (None: malformed, counted invalid)."""
    try:
        run_id = str(rec["run_id"])
        started = parse_time(rec["started_at"])
        raw_steps = [s for s in (rec.get("steps") or ()) if isinstance(s["result"], str)]
        run_escalations = rec.get("escalations", 0)
        if not is_int(run_escalations):
            raise TypeError("escalations")
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return _Recorded(
        run_id,
        started,
        raw_steps,
        int(run_escalations),
        [str(g) for g in rec.get("gated") or () if isinstance(g, str | int)],
        rec.get("reached_end") if isinstance(rec.get("reached_end"), bool) else None,
        [d for d in rec.get("decisions") or () if isinstance(d, Mapping)],
    )


def _questions(
    workflow: str,
    spec: WorkflowSpec | None,
    run: _Recorded,
    now: Sequence[Fate],
    then: Sequence[Fate] | None,
    extra: Sequence[str],
    tally: _Tally,
) -> list[_Asked]:
    """Phase 3: the questions the run's steps would raise now; the steps that would not ask are counted unchanged
    or routed differently (against what the run did then, when its own spec is known)."""
    asked: list[_Asked] = []
    for name in extra:  # a gate before a step that never ran, a swarm chain's final gate: no recorded step
        agent = _agent_of(spec, name)
        gate = situation_of(workflow, agent, "gate", detail=_before_words(spec, name), step=name)
        asked.append((name or "(final result)", agent, "not run", None, gate))
    for n, s in enumerate(run.steps):
        tally.steps += 1
        fate = now[n]
        before = then[n].action if then is not None else None
        item, result, agent = str(s.get("item", "")), str(s["result"]), str(s.get("agent", ""))
        kinds = (["gate"] if fate.gated else []) + ([fate.kind or "fail"] if fate.action == "escalate" else [])
        if fate.gated:
            gate = situation_of(workflow, agent, "gate", detail=_before_words(spec, item), step=item)
            asked.append((item, agent, result, before, gate))
        for kind in kinds[int(fate.gated) :]:
            sit = (
                situation_of(workflow, agent, "gate", detail=fate.words, step=item)
                if kind == "gate" and fate.words
                else situation_from_step(workflow, s, kind)
            )
            asked.append((item, agent, result, before, sit))
        if kinds:
            continue
        if before is not None and before != fate.action:
            tally.routed_differently += 1
            tally.items.append(
                ReplayItem(run.run_id, run.started, item, agent, result, before, fate.action, "rerouted")
            )
        else:
            tally.unchanged += 1
    return asked


def _judge(run: _Recorded, asked: Sequence[_Asked], rules: Sequence[Rule], pol: Policy, tally: _Tally) -> None:
    """Phase 4: each question decided by a rule the person opted in to (:func:`may_auto_decide`), or still asked."""
    for item, agent, result, before, situation in asked:
        rule = predict(rules, situation)
        decided = may_auto_decide(rule, pol)
        tally.decided_by_rule += decided
        tally.would_escalate += not decided
        tally.items.append(
            ReplayItem(
                run.run_id,
                run.started,
                item,
                agent,
                result,
                before,
                "escalate",
                "rule" if decided else "escalate",
                rule.id if rule else None,
                rule.option if rule else None,
                situation.signature,
                _KIND_OF_SIGNAL.get(situation.signal, situation.signal.lower()),
            )
        )


def replay(
    records: Iterable[Mapping[str, Any] | RunRecord],
    spec: WorkflowSpec | None,
    rules: Sequence[Rule],
    *,
    workflow: str,
    policy: Policy | None = None,
    since: datetime | None = None,
    pinned: Callable[[str], WorkflowSpec | None] | None = None,
    threshold: int = 3,
) -> ReplayReport:
    """Run the recorded steps of ``workflow`` through ``spec`` (the workflow as it is now) and ``rules``.

    Each escalation met now is either decided by a rule the person opted in to (:func:`may_auto_decide`) or still
    asked; a step handled otherwise than its run handled it (the run's own spec, from ``pinned(run_id)``, replayed
    the same way; unknown: not compared) is reported as routed differently. By phase: each record read, its steps'
    fates now and then (phase 2, :func:`fates`), the questions they raise, and each question judged.
    """
    pol = policy or Policy()
    since = parse_time(since) if since is not None else None
    tally = _Tally()
    breaker_now: dict[str, int] = {}
    breaker_then: dict[str, int] = {}
    for record in records:
        rec: Mapping[str, Any] = record.to_json_dict() if isinstance(record, RunRecord) else record
        if rec.get("kind", "run") != "run" or rec.get("workflow") != workflow:
            continue
        run = _read_record(rec)
        if run is None:
            tally.invalid += 1
            continue
        if since is not None and run.started < since:
            continue
        tally.runs += 1
        tally.recorded_escalations += run.escalations
        now, extra = run.fates(spec, threshold, breaker_now)
        old = pinned(run.run_id) if pinned is not None else None
        tally.uncompared += old is None
        then = run.fates(old, threshold, breaker_then)[0] if old is not None else None
        _judge(run, _questions(workflow, spec, run, now, then, extra, tally), rules, pol, tally)
    return ReplayReport(
        workflow,
        tally.runs,
        tally.steps,
        tally.invalid,
        tally.recorded_escalations,
        tally.would_escalate,
        tally.decided_by_rule,
        tally.routed_differently,
        tally.unchanged,
        tally.items,
        tally.uncompared,
    )
