"""The TriggerEngine: a tick loop over pluggable evaluators (ADR-027 ``TriggerEngine.tick()``).

The engine wakes at once when something it watches changes (``wake()``, fed by :mod:`ambient.service.watch`)
and otherwise every ``tick_seconds``; idle, it sleeps on an event and costs no CPU.

Plugging in an evaluator: write a class with a ``name`` and ``async def evaluate(self, tick: Tick)``
and pass it to :class:`TriggerEngine` (or ``engine.add(evaluator)``). ``tick.changes`` holds the paths
that changed since the last tick (empty on a timed tick: treat it as "look at everything"); an
evaluator decides what to do and hands the work to the services it was built with. One failing
evaluator is logged and the others still run: a bad evaluator never stops the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol

import structlog

from ambient.core.clock import Clock, SystemClock

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Tick:
    """What one tick knows: when it runs, its number, and what changed (empty = timed tick)."""

    number: int
    now: datetime
    changes: frozenset[Path] = field(default_factory=frozenset)

    @property
    def timed(self) -> bool:
        return not self.changes

    def touched(self, directory: Path) -> bool:
        """True on a timed tick, or when a path under ``directory`` changed."""
        if self.timed:
            return True
        top = str(directory)
        below = top.rstrip("/") + "/"
        return any((s := str(p)) == top or s.startswith(below) for p in self.changes)


class Evaluator(Protocol):
    """One concern evaluated on every tick (workflows, escalations, stale claims...)."""

    name: str

    async def evaluate(self, tick: Tick) -> None: ...


class Wakeup:
    """Asks the engine for a tick, and gathers what changed until it comes.

    Made before everything that wakes the engine (the escalator, the troubles, the run manager, the evaluators) and
    handed to each: none of them needs the engine itself, which is built last, from its evaluators.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._pending: set[Path] = set()
        self._timed_due = False

    def wake(self, changes: Iterable[Path] = ()) -> None:
        """Ask for a tick now; ``changes`` says what changed (nothing = a full look)."""
        changed = list(changes)
        if changed:
            self._pending.update(changed)
        else:
            self._timed_due = True
        self._event.set()

    def file_changed(self, path: Path) -> None:
        """Ask for a tick that looks at ``path`` (a file written here, not seen by the watcher yet)."""
        self.wake((path,))

    async def wait(self) -> None:
        """Until somebody asks for a tick."""
        await self._event.wait()

    def take(self, *, timed_out: bool) -> frozenset[Path]:
        """What the next tick looks at, and the slate wiped: empty (a full look) when a full look was asked for or
        the wait timed out, else the paths that changed."""
        self._event.clear()
        changes = frozenset(self._pending)
        self._pending.clear()
        timed = self._timed_due or timed_out
        self._timed_due = False
        return frozenset() if timed else changes


class TriggerEngine:
    """Runs evaluators on each tick; wakes early on file events."""

    def __init__(
        self,
        evaluators: Iterable[Evaluator] = (),
        *,
        tick_seconds: float = 30.0,
        clock: Clock | None = None,
        wakeup: Wakeup | None = None,
    ) -> None:
        self.evaluators: list[Evaluator] = list(evaluators)
        self.tick_seconds = tick_seconds
        self.clock = clock or SystemClock()
        self.ticks = 0
        self.wakeup = wakeup or Wakeup()

    def add(self, evaluator: Evaluator) -> None:
        """Plug in another evaluator."""
        self.evaluators.append(evaluator)

    def wake(self, changes: Iterable[Path] = ()) -> None:
        """Ask for a tick now; ``changes`` says what changed (nothing = a full look)."""
        self.wakeup.wake(changes)

    async def tick(self, changes: Iterable[Path] = ()) -> Tick:
        """Run every evaluator once."""
        self.ticks += 1
        tick = Tick(number=self.ticks, now=self.clock.now(), changes=frozenset(changes))
        with structlog.contextvars.bound_contextvars(tick=tick.number):
            for ev in list(self.evaluators):
                try:
                    await ev.evaluate(tick)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # one bad evaluator must not stop the others
                    log.exception("evaluator_failed", evaluator=ev.name, error=str(exc))
        return tick

    async def run(self, stop: asyncio.Event) -> None:
        """Tick until ``stop`` is set: at once on :meth:`wake`, else every ``tick_seconds``."""
        await self.tick()
        stopper = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                waker = asyncio.ensure_future(self.wakeup.wait())
                done, _ = await asyncio.wait(
                    {waker, stopper}, timeout=self.tick_seconds, return_when=asyncio.FIRST_COMPLETED
                )
                waker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waker
                if stop.is_set():
                    break
                await self.tick(self.wakeup.take(timed_out=not done))
        finally:
            stopper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stopper
