"""What to do next in a run: pure decisions over :class:`ambient.engine.runstate.RunState`. No I/O.

The shell (:mod:`ambient.engine.runs`) carries decisions out; everything here is given ``now`` and a
random source, so it is tested with tables and properties, without processes or clocks.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from ambient.claims.claim import infer_close_tier
from ambient.engine.runstate import ItemState, RunState
from ambient.runners.patterns import ALLOW_PATTERN_KEY


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts per item before a failure counts (toward escalation or the breaker)."""

    attempts: int = 1  # total attempts, 1 = no retry
    base_s: float = 1.0
    cap_s: float = 60.0
    jitter: bool = True
    on: frozenset[str] = frozenset({"error"})  # results that are retried: error, fail

    def delay(self, failures: int, rng: random.Random) -> float:
        """Exponential backoff with full jitter (AWS architecture blog's "full jitter")."""
        ceiling = min(self.cap_s, self.base_s * (2 ** max(0, failures - 1)))
        return rng.uniform(0, ceiling) if self.jitter else ceiling


@dataclass(frozen=True)
class Reaction:
    """What a result leads to (ADR-027 on_return): e.g. ``→ ERROR + log + ESCALATE pilote``."""

    verbs: frozenset[str] = frozenset({"next"})
    target: str | None = None  # who is escalated to / signalled (pilote, orchestrator...)
    signal: str | None = None  # for signal reactions (ERROR, BLOCKED_ON, CHECKPOINT...)
    message: str | None = None

    @property
    def escalates(self) -> bool:
        return "escalate" in self.verbs


DEFAULT_ON_RETURN: dict[str, Reaction] = {
    "success": Reaction(frozenset({"next"})),
    "fail": Reaction(frozenset({"escalate"}), target="pilote"),
    "error": Reaction(frozenset({"error", "log", "escalate"}), target="pilote", signal="ERROR"),
    "escalate": Reaction(frozenset({"escalate"}), target="pilote"),
    "blocked": Reaction(frozenset({"escalate"}), target="pilote", signal="BLOCKED_ON"),
}


@dataclass(frozen=True)
class FanOut:
    """The parts of a for_each spec the planner needs."""

    concurrency: int = 4
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    on_return: dict[str, Reaction] = field(default_factory=lambda: dict(DEFAULT_ON_RETURN))


@dataclass(frozen=True)
class ItemTemplate:
    """The per-item parts of a for_each spec, still templated."""

    agent: str
    files: tuple[str, ...] = ()
    zone: str | None = None
    context: Mapping[str, Any] = field(default_factory=dict)
    sender: str = "ambient"
    complete_signal: str | None = "RETURN"
    complete_to: str | None = None
    complete_result: str | None = None
    escalate_to: str = "human"
    extra_options: tuple[tuple[str, str, str], ...] = ()
    deadline_s: float | None = None
    on_timeout: str | None = None
    remind_before_s: float | None = None
    timeout_s: float | None = None


@dataclass(frozen=True)
class ItemOutcome:
    """The decision after one attempt of an item."""

    kind: Literal["done", "retry", "escalate", "failed"]
    reaction: Reaction
    not_before: datetime | None = None


def reaction_for(plan: FanOut, result: str) -> Reaction:
    """The configured reaction to a result, falling back to ADR-027's defaults."""
    return plan.on_return.get(result) or DEFAULT_ON_RETURN.get(result) or DEFAULT_ON_RETURN["error"]


def after_attempt(
    plan: FanOut, item: ItemState, result: str, now: datetime, rng: random.Random, *, retryable: bool = True
) -> ItemOutcome:
    """Route one attempt's result: success goes on; failures retry per policy, then react.

    ``retryable`` is False for an agent's own ERROR signal: it said the failure is unrecoverable, so running it
    again cannot help (the retry policy is for crashes, timeouts and bad output)."""
    reaction = reaction_for(plan, result)
    if result == "success":
        return ItemOutcome("done", reaction)
    if retryable and result in plan.retry.on and item.fails < plan.retry.attempts:
        delay = plan.retry.delay(item.fails, rng)
        return ItemOutcome("retry", reaction, not_before=now + timedelta(seconds=delay))
    if reaction.escalates:
        return ItemOutcome("escalate", reaction)
    return ItemOutcome("failed", reaction)


def _due(item: ItemState, now: datetime) -> bool:
    if item.status == "pending":
        return True
    if item.status == "retry_wait":
        return item.not_before is None or datetime.fromisoformat(item.not_before) <= now
    return False


def ready_items(
    state: RunState, plan: FanOut, now: datetime, running: int, *, start: int = 0, aborted: bool | None = None
) -> list[ItemState]:
    """Items to start now, in order, without exceeding the concurrency.

    ``start``: no item before this index is pending or waiting for a retry (a caller's cursor; see
    :func:`first_open`); ``aborted``: whether an item is aborted, when the caller keeps counts. Both only
    spare the scan of the whole run on every step of a large fan-out; the answer is the same.
    """
    if state.finished:
        return []
    if aborted is None:
        aborted = state.aborted or any(it.status == "aborted" for it in state.items)
    free = max(0, plan.concurrency - running)
    if aborted or free == 0:
        return []
    out: list[ItemState] = []
    items = state.items
    for i in range(max(0, start), len(items)):
        if _due(items[i], now):
            out.append(items[i])
            if len(out) == free:
                break
    return out


def first_open(state: RunState, start: int = 0) -> int:
    """Index of the first item from ``start`` that is pending or waiting for a retry (``len(items)`` if none)."""
    items = state.items
    i = max(0, start)
    while i < len(items) and items[i].status not in ("pending", "retry_wait"):
        i += 1
    return i


def next_wakeup(state: RunState) -> datetime | None:
    """The earliest retry time among waiting items (the executor sleeps until then)."""
    times = [datetime.fromisoformat(it.not_before) for it in state.items if it.status == "retry_wait" and it.not_before]
    return min(times) if times else None


# Decision options offered for a failed item, and what each does (ESCALATE options).
ITEM_OPTIONS: Sequence[tuple[str, str]] = (
    ("retry", "Run the item again"),
    ("skip", "Skip this item and go on"),
    ("abort", "Abort the whole run"),
)
GATE_OPTIONS: Sequence[tuple[str, str]] = (
    ("approve", "Approve and continue"),
    ("reject", "Reject: stop the chain"),
)
#: The action of an answer the agent itself proposed: the item (or step) runs again with the answer in
#: ``payload.context.decision``.
ANSWER = "answer"


def names_run(name: str, run_id: str, workflow: str) -> bool:
    """Whether an ABORT's or ADAPT's ``workflow`` names this run: its run id (that run alone) or its workflow's name
    (every run of it)."""
    return name in (run_id, workflow)


#: Item statuses an ADAPT may skip: not started yet, or waiting to be tried again (no agent at work, no question).
ADAPT_SKIPPABLE: frozenset[str] = frozenset({"pending", "retry_wait"})


def adapt_skips(state: RunState, names: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """What an ADAPT ``changes: {skip: names}`` does to a run: the items it skips, and each name it does not skip
    with why (never nothing in silence)."""
    skip: list[str] = []
    refused: dict[str, str] = {}
    if state.form != "for_each":
        return [], {n: f"ADAPT skips items of a for_each; {state.run_id} is a {state.form}" for n in names}
    if state.finished or state.aborted:
        return [], {n: f"the run {state.run_id} has ended" for n in names}
    by_name = {it.name: it for it in state.items}
    for name in dict.fromkeys(names):
        item = by_name.get(name)
        if item is None:
            refused[name] = f"the run {state.run_id} has no item {name!r}"
        elif item.status in ADAPT_SKIPPABLE:
            skip.append(name)
        else:
            refused[name] = f"item {name!r} is {item.status}; only an item not started yet is skipped"
    return skip, refused


def question_options(proposed: Sequence[str]) -> list[tuple[str, str, str]]:
    """(key, label, action) of an agent's own ESCALATE: its proposed answers, then skip and abort.

    One rule for for_each items and chain steps, so a person sees the same choices whichever form asked.
    """
    return [(o, o, ANSWER) for o in proposed] + [
        ("skip", "Skip it and go on", "skip"),
        ("abort", "Abort the whole run", "abort"),
    ]


def permission_options(proposed: Sequence[str], permission: Mapping[str, Any] | None) -> list[tuple[str, str, str]]:
    """(key, label, action) of a tool permission's question: the runner's answers as :func:`question_options`
    offers them, the pattern's (``permission["pattern_option"]``, "allow `pytest -q tests/*` for coder from now
    on") under the key ``allow-pattern``, so a person types one short word for it."""
    label = permission.get("pattern_option") if isinstance(permission, Mapping) else None
    return [
        (ALLOW_PATTERN_KEY, text, action)
        if action == ANSWER and label is not None and key == label
        else (key, text, action)
        for key, text, action in question_options(proposed or ["allow", "deny"])
    ]


# ---------------------------------------------------------------- chains (spec/004 kernel-orchestrator)

StepStatus = Literal["ok", "partial", "failed"]
ChainVerb = Literal["next", "goto", "spawn", "signal", "gate", "notify", "abort", "start"]


@dataclass(frozen=True)
class ChainAction:
    """One exit-trigger action, in the planner's own terms (parsed from every spelling of the sources)."""

    kind: ChainVerb
    target: str | None = None  # goto, start: step name; signal: recipient
    workflow: str | None = None  # start: the other workflow (trigger:<workflow>/<step>)
    signal: str | None = None  # signal: BLOCKED_ON, CHECKPOINT...
    message: str | None = None  # gate/notify text
    step_type: str | None = None  # spawn: satellite type
    scope: str | None = None  # spawn: satellite scope


@dataclass(frozen=True)
class ChainStep:
    """A chain step as the planner sees it."""

    name: str
    type: str = "code"
    scope: str | None = None
    agent: str | None = None
    gate: str | None = None  # None | "0-failures" | "human" | "never"
    level: str = "leaf"
    on_done: tuple[ChainAction, ...] = ()
    on_partial: tuple[ChainAction, ...] = ()
    on_fail: tuple[ChainAction, ...] = ()
    story_angle: str | None = None
    input_contract: str | None = None  # what the step is told it receives from the step before (a template)
    retry: RetryPolicy = field(default_factory=RetryPolicy)  # the step's own, else the workflow's
    timeout_s: float | None = None  # per attempt: the step's own, else the workflow's, else the runner's


DEFAULT_ON_DONE = (ChainAction("next"),)
DEFAULT_ON_FAIL = (ChainAction("signal", target="pilote", signal="BLOCKED_ON"),)


def step_status(output: Any, result: str) -> StepStatus:
    """``result.status`` of a step: ok | partial | failed (spec/002 v1.6); an agent error is failed."""
    if result != "success":
        return "failed"
    status = output.get("status") if isinstance(output, dict) else None
    if status in ("partial",):
        return "partial"
    if status in ("failed", "fail", "error", "ko"):
        return "failed"
    return "ok"


def tests_failed(output: Any) -> int | None:
    """``result.tests.failed`` or None when the result carries no tests."""
    if not isinstance(output, dict):
        return None
    tests = output.get("tests")
    if not isinstance(tests, dict) or "failed" not in tests:
        return None
    try:
        return int(tests["failed"])
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class StepVerdict:
    """What a finished step leads to: its status after gates and tiers, and the actions to route."""

    status: StepStatus
    actions: tuple[ChainAction, ...]
    reason: str | None = None
    needs_human: bool = False  # validated tier without tests: a person confirms


def exit_actions(step: ChainStep, status: StepStatus) -> tuple[ChainAction, ...]:
    """The exit trigger of a step for a result status (spec/004, DESIGN 5): ok → ``on_done`` (default
    ``trigger:next``); partial → ``on_partial``, falling back to ``on_done``; failed → ``on_fail`` (default
    ``signal:BLOCKED_ON`` to the pilot)."""
    if status == "ok":
        return step.on_done or DEFAULT_ON_DONE
    if status == "partial":
        return step.on_partial or step.on_done or DEFAULT_ON_DONE
    return step.on_fail or DEFAULT_ON_FAIL


ExitKind = Literal["next", "goto", "spawn", "gate", "blocked", "abort", "end"]
WAITING_SIGNALS = frozenset({"BLOCKED_ON", "BLOCKED"})


@dataclass(frozen=True)
class ExitRoute:
    """Where the chain goes after a step's exit trigger, and what is carried out on the way."""

    kind: ExitKind
    action: ChainAction | None = None  # the action that decided (None: nothing decided, the default applies)
    effects: tuple[ChainAction, ...] = ()  # notify: and signal actions carried out first, in order


def exit_route(actions: Sequence[ChainAction], status: StepStatus, *, terminal: bool = False) -> ExitRoute:
    """The one rule of where a chain goes: the executor follows it and validation checks reachability with it.

    Actions are taken in order. ``notify:``, a signal that does not wait and ``trigger:<other workflow>/<step>``
    (a run of that workflow starts at that step) are carried out and the next action is looked at; the first
    action that decides ends the list: ``trigger:next`` / ``trigger:<step>`` (go there),
    ``trigger → type:`` (a satellite, then the next declared step), ``gate:human`` (the person approves: on;
    rejects: abort), ``abort``, and on a failure a waiting signal (``BLOCKED_ON``: the person retries, skips or
    aborts). When nothing decides, a failure waits on the person as BLOCKED_ON and any other result goes on with
    the next step: ``on_done: notify:"deployed"`` notifies and goes on. A terminal step (``gate: never``) that did
    not fail ends the chain; its notifications and signals are still carried out.
    """
    effects: list[ChainAction] = []
    for action in actions:
        kind = action.kind
        if kind in ("notify", "signal", "start"):
            effects.append(action)
            if kind == "signal" and status == "failed" and (action.signal or "BLOCKED_ON") in WAITING_SIGNALS:
                return ExitRoute("blocked", action, tuple(effects))
            continue
        if terminal and status != "failed":
            continue  # gate: never: nothing moves the chain on
        if kind in ("next", "goto", "spawn", "gate", "abort"):
            return ExitRoute(kind, action, tuple(effects))
    if terminal and status != "failed":
        return ExitRoute("end", None, tuple(effects))
    return ExitRoute("blocked" if status == "failed" else "next", None, tuple(effects))


def judge_step(step: ChainStep, output: Any, result: str) -> StepVerdict:
    """Apply the step's gate and close tier to its result, then pick the exit trigger (spec/004 §8)."""
    status = step_status(output, result)
    reason = None
    failed_tests = tests_failed(output)
    if status != "failed" and step.gate == "0-failures":
        if failed_tests is None:
            status, reason = "failed", "gate 0-failures: the result has no tests.failed"
        elif failed_tests > 0:
            status, reason = "failed", f"gate 0-failures: {failed_tests} test(s) failed"
    needs_human = False
    # The close tier of the step's claim (a satellite of the step's type and level): one rule with the claims'.
    if status == "ok" and infer_close_tier("satellite", step.type, step.level) == 2:
        if failed_tests is None:
            needs_human = step.gate != "0-failures"  # validated tier: tests green, or a person confirms
        elif failed_tests > 0:
            status, reason = "failed", f"validated close: {failed_tests} test(s) failed"
    return StepVerdict(status, exit_actions(step, status), reason, needs_human)


def gate_before(step: ChainStep, index: int, total: int, mode: str | None) -> str | None:
    """Why a person must approve before this step runs, or None (gates of the step and of the mode)."""
    if step.gate == "human":
        return f"step {step.name} has gate: human"
    if mode == "manual":
        return f"manual mode: every step waits for approval (step {step.name})"
    if mode == "swarm" and index == 0:
        return "swarm mode: the person gates the entry"
    return None


def before_question(step: ChainStep, reason: str) -> str:
    """The question of a gate before a step (``reason``: :func:`gate_before`'s)."""
    return f"{reason}. Run step {step.name} ({step.type}) now?"


def untested_question(step: ChainStep) -> str:
    """The question of a step that closed without the tests its close tier asks for."""
    return f"step {step.name} ({step.type}) closed without tests: accept it?"


def route_question(step: ChainStep, status: str, message: str | None) -> str:
    """The question of an exit trigger's ``gate:human`` (its own message, else the step's result)."""
    return message or f"step {step.name} {status}: continue?"


#: The question of a swarm chain's final gate.
FINAL_QUESTION = "swarm mode: the chain is done. Accept the final result?"


def gate_words(step: ChainStep | None, question: str) -> str:
    """A gate's words for a learned rule (``ambient.learning.rules.situation_of``): its step's type and the question;
    the executor and replay build them alike, so a rule learned on a gate is the one replay predicts with."""
    if step is None or f"({step.type})" in question:
        return question
    return f"({step.type}) {question}"


def gate_after_last(mode: str | None) -> bool:
    """swarm mode: the person gates the final result too."""
    return mode == "swarm"


def next_index(steps: Sequence[ChainStep], current: int, action: ChainAction) -> int | None:
    """The step a trigger leads to, or None when the chain ends (``trigger:next`` after the last step)."""
    if action.kind == "next":
        return current + 1 if current + 1 < len(steps) else None
    if action.kind == "goto" and action.target is not None:
        for i, s in enumerate(steps):
            if s.name == action.target:
                return i
    return None


def breaker_update(fails: int, failed: bool, threshold: int) -> tuple[int, bool]:
    """Consecutive failures on one scope: reset on success; tripped at ``threshold`` (spec/004)."""
    count = fails + 1 if failed else 0
    return count, count >= threshold
