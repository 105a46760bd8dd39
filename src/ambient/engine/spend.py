"""Today's spend of every run: the daemon's meter for ``budget.daily_usd`` (the rules are :mod:`ambient.engine.budget`).

Seeded once at start, from today's run records (``runs.jsonl``, read from its end) and from the journals of the runs
that resume; then each model call the gateway records adds its cost (and each finished attempt not metered by it).
No spawn rescans anything: the check before an attempt (or a model call) reads one number. The day is the UTC day
(see :mod:`ambient.engine.budget`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from ambient.engine.budget import Limits, amount_of, day_of
from ambient.engine.runstate import RunState

#: Records completed before today, in a row, after which the backwards scan of runs.jsonl stops. Summaries are
#: appended as runs end, so older ones come first; a few may be appended late (a start catching up after a crash).
_OLD_IN_A_ROW = 64
_BLOCK = 64 * 1024


class SpendMeter:
    """The spend of the current UTC day, all runs together; ``limits`` gives the budgets as the settings say now (the
    service layer passes it: the engine does not read the settings)."""

    def __init__(self, limits: Callable[[], Limits] | None = None) -> None:
        self._limits = limits or Limits
        self.day: str | None = None
        self.total = 0.0

    def limits(self) -> Limits:
        """The budgets now (read from the current settings: a reload takes effect at the next check)."""
        return self._limits()

    def spent(self, day: str) -> float:
        """What every run spent on ``day`` (0 for a day the meter is not on)."""
        return self.total if day == self.day else 0.0

    def add(self, cost: float | None, at: datetime) -> None:
        """An attempt that finished at ``at`` cost ``cost`` (None: unknown, not counted)."""
        self._add_on(day_of(at), cost)

    def _add_on(self, day: str, cost: float | None) -> None:
        if cost is None or cost <= 0:
            return
        if self.day is None or day > self.day:
            self.day, self.total = day, 0.0
        if day == self.day:
            self.total += cost

    def seed_steps(self, steps: Any, today: str) -> None:
        """Add the cost of the recorded steps that finished on ``today``."""
        for step in steps or ():
            if not isinstance(step, Mapping):
                continue
            usage = step.get("usage")
            at = step.get("at")
            if not isinstance(usage, Mapping) or not isinstance(at, str):
                continue
            try:
                day = day_of(datetime.fromisoformat(at))
            except ValueError:
                continue
            if day == today:
                self._add_on(day, amount_of(usage.get("cost_usd")))

    def seed_state(self, state: RunState, now: datetime) -> None:
        """A run that resumes: what it spent today (its journal, folded: the calls the model gateway recorded, those
        of an attempt a crash cut short included, and the other attempts' usage)."""
        today = day_of(now)
        self.day = self.day or today
        self._add_on(today, state.spent_by_day.get(today))

    def seed_records(self, path: Path, now: datetime) -> int:
        """Today's finished runs, from the end of ``runs.jsonl`` (blocking: call it off the loop); returns the runs
        read. Stops at :data:`_OLD_IN_A_ROW` runs in a row completed before today."""
        today = day_of(now)
        self.day = self.day or today
        seen = old = 0
        for rec in _backwards(path):
            completed = rec.get("completed_at") or rec.get("started_at")
            try:
                day = day_of(datetime.fromisoformat(str(completed)))
            except ValueError:
                continue
            seen += 1
            if day < today:
                old += 1
                if old >= _OLD_IN_A_ROW:
                    break
                continue
            old = 0
            by_day = rec.get("spent_by_day")
            if isinstance(by_day, Mapping):  # what the run spent each UTC day, metered calls included
                self._add_on(today, amount_of(by_day.get(today)))
            elif rec.get("cost_usd") is not None:  # a record written before records said it
                self.seed_steps(rec.get("steps"), today)
        return seen


def _backwards(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a JSON-lines file, newest first (a torn last line and corrupt lines skipped)."""
    try:
        fh = path.open("rb")
    except FileNotFoundError:
        return
    with fh:
        pos = fh.seek(0, os.SEEK_END)
        pending = b""
        first = True
        while pos > 0:
            step = min(_BLOCK, pos)
            pos -= step
            fh.seek(pos)
            parts = (fh.read(step) + pending).split(b"\n")
            if first:
                if len(parts) == 1:
                    pending = parts[0]  # still inside a torn last line
                    continue
                parts.pop()  # after the last newline: nothing, or a torn record
                first = False
            pending = parts.pop(0) if pos > 0 else b""
            for raw in reversed(parts):
                if not raw.strip():
                    continue
                try:
                    rec = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    yield rec
