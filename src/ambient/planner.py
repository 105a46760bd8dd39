"""What to do next in a run: pure decisions over :class:`ambient.runstate.RunState`. No I/O.

The shell (:mod:`ambient.runs`) carries decisions out; everything here is given ``now`` and a
random source, so it is tested with tables and properties, without processes or clocks.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from ambient.runstate import TERMINAL_ITEM, ItemState, RunState

Verb = Literal["next", "escalate", "error", "log", "abort", "retry", "notify", "signal"]


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
class ItemOutcome:
    """The decision after one attempt of an item."""

    kind: Literal["done", "retry", "escalate", "failed"]
    reaction: Reaction
    not_before: datetime | None = None


def reaction_for(plan: FanOut, result: str) -> Reaction:
    """The configured reaction to a result, falling back to ADR-027's defaults."""
    return plan.on_return.get(result) or DEFAULT_ON_RETURN.get(result) or DEFAULT_ON_RETURN["error"]


def after_attempt(plan: FanOut, item: ItemState, result: str, now: datetime, rng: random.Random) -> ItemOutcome:
    """Route one attempt's result: success goes on; failures retry per policy, then react."""
    reaction = reaction_for(plan, result)
    if result == "success":
        return ItemOutcome("done", reaction)
    if result in plan.retry.on and item.fails < plan.retry.attempts:
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


def ready_items(state: RunState, plan: FanOut, now: datetime, running: int) -> list[ItemState]:
    """Items to start now, in order, without exceeding the concurrency."""
    if state.finished or any(it.status == "aborted" for it in state.items):
        return []
    free = max(0, plan.concurrency - running)
    if free == 0:
        return []
    return [it for it in state.items if _due(it, now)][:free]


def next_wakeup(state: RunState) -> datetime | None:
    """The earliest retry time among waiting items (the executor sleeps until then)."""
    times = [datetime.fromisoformat(it.not_before) for it in state.items if it.status == "retry_wait" and it.not_before]
    return min(times) if times else None


def is_complete(state: RunState) -> bool:
    """Every item is terminal (done, failed without escalation, skipped or aborted)."""
    return all(it.status in TERMINAL_ITEM for it in state.items)


def waiting_on_human(state: RunState) -> bool:
    """Nothing can move until the person decides."""
    return bool(state.escalations) and not any(it.status in ("pending", "running", "retry_wait") for it in state.items)


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
