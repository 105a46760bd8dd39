"""Fakes of the executors' ports (:mod:`ambient.engine.ports`), so a run is driven end to end in-process: agents
answer from a script, escalations, claims, packets, spend and troubles are recorded for the test to read, and time
is a :class:`~ambient.testing.clock.ManualClock`. :func:`fake_ports` wires them all."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ambient.engine.budget import Limits, day_of
from ambient.engine.ports import Attempt, AttemptResult, EscalationRequest, Ports, Renderer
from ambient.engine.runstate import ItemState, RunState
from ambient.testing.clock import ManualClock

#: What an agent answers unless its script says otherwise.
SUCCESS = AttemptResult(result="success", output={"status": "ok"}, signal_in="RETURN")


class FakeDelegate:
    """Answers each attempt of an item with the next result of its script (the last one repeats; an item without a
    script succeeds). Every attempt is kept in :attr:`calls`; while :attr:`gate` is set, attempts wait on it."""

    def __init__(self, script: Mapping[str, Sequence[AttemptResult]] | None = None) -> None:
        self.script = {item: list(results) for item, results in (script or {}).items()}
        self.calls: list[Attempt] = []
        self.gate: asyncio.Event | None = None

    async def attempt(self, a: Attempt) -> AttemptResult:
        self.calls.append(a)
        if self.gate is not None:
            await self.gate.wait()
        results = self.script.get(a.item)
        if not results:
            return SUCCESS
        return results.pop(0) if len(results) > 1 else results[0]


class FakeEscalator:
    """Keeps each escalation asked (:attr:`requests`, answered ``esc-1``, ``esc-2`` ...) and each note sent."""

    def __init__(self) -> None:
        self.requests: list[EscalationRequest] = []
        self.informed: list[tuple[str, str]] = []

    async def escalate(self, req: EscalationRequest) -> str:
        self.requests.append(req)
        return f"esc-{len(self.requests)}"

    async def inform(self, title: str, body: str) -> None:
        self.informed.append((title, body))


class FakeClaims:
    """The claims' view as two maps: each run's finished flag and each item's status, by name."""

    def __init__(self) -> None:
        self.runs: dict[str, bool] = {}
        self.items: dict[str, str] = {}

    def run_changed(self, state: RunState) -> None:
        self.runs[state.run_id] = state.finished

    def item_changed(self, state: RunState, item: ItemState) -> None:
        self.items[item.name] = item.status


class FakeEmitter:
    """Keeps each packet emitted as ``(signal, to, payload)``; delivers them all unless :attr:`delivers` is False."""

    def __init__(self, *, delivers: bool = True) -> None:
        self.sent: list[tuple[str, str, dict[str, Any]]] = []
        self.delivers = delivers

    async def emit(self, signal: str, to: str, payload: Mapping[str, Any], run: RunState) -> bool:
        self.sent.append((signal, to, dict(payload)))
        return self.delivers


@dataclass
class FakeBudget:
    """Budgets as given and what was spent, by UTC day."""

    budgets: Limits = field(default_factory=Limits)
    by_day: dict[str, float] = field(default_factory=dict)

    def limits(self) -> Limits:
        return self.budgets

    def spent(self, day: str) -> float:
        return self.by_day.get(day, 0.0)

    def add(self, cost: float | None, at: datetime) -> None:
        if cost is not None and cost > 0:
            day = day_of(at)
            self.by_day[day] = self.by_day.get(day, 0.0) + cost


class FakeHealth:
    """The daemon's troubles as a run reports them: :attr:`troubles` said, :attr:`recoveries` said over."""

    def __init__(self) -> None:
        self.troubles: list[tuple[str, str]] = []
        self.recoveries: list[str] = []

    def trouble(self, kind: str, message: str) -> None:
        self.troubles.append((kind, message))

    def recovered(self, kinds: Sequence[str]) -> None:
        self.recoveries.extend(kinds)


def render(template: str, variables: Mapping[str, Any]) -> str:
    """``{{name}}`` replaced by its value (a missing name is a KeyError: a test that forgets one fails)."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: str(variables[m.group(1)]), template)


def fake_ports(
    *,
    delegate: FakeDelegate | None = None,
    clock: ManualClock | None = None,
    seed: int = 0,
    budget: FakeBudget | None = None,
    renderer: Renderer = render,
) -> Ports:
    """Ports made of the fakes above, a manual clock and a seeded random source; reach each fake through the
    returned ports (``ports.delegate``, ``ports.emitter`` ...)."""
    return Ports(
        delegate=delegate or FakeDelegate(),
        escalator=FakeEscalator(),
        claims=FakeClaims(),
        emitter=FakeEmitter(),
        render_text=renderer,
        render_path=renderer,
        clock=clock or ManualClock(),
        rng=random.Random(seed),
        health=FakeHealth(),
        budget=budget,
    )
