"""The state's modes kept: what in ``.ambient/`` is found open to others is closed again, at start and on the tick.

Landlock covers reads and writes, not metadata: an agent able to ``chmod`` (one the person runs as root) could
open the console's token, the journals or the escalations to every user of the machine. The daemon walks its
state at start and then at most every :attr:`StateModesEvaluator.EVERY_S` on its ticks, off the event loop
(:func:`ambient.storage.fsutil.keep_state_modes`: one ``lstat`` per file), closes what it finds, logs each
``state_mode_restored``, and keeps the last ones in ``.ambient/modes.json`` for ``ambient doctor``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from ambient.core.clock import Clock
from ambient.engine.tick import Tick
from ambient.storage.fsutil import PRIVATE_FILE, Restored, atomic_write, keep_state_modes, read_capped
from ambient.storage.paths import BrainPaths

#: The restorations ``ambient doctor`` is shown (the newest last).
KEPT = 20
#: The Claude Code CLI's own home, config and temp dir (ambient.runners.claude): their modes are the CLI's, which
#: may run as a user of its own; ``.ambient/`` above them stays 0700 all the same.
NOT_OURS = frozenset({"claude/home", "claude/config", "claude/tmp"})


def modes_file(paths: BrainPaths) -> Path:
    return paths.state / "modes.json"


def state_owner() -> tuple[int, int] | None:
    """Whom the state belongs to when ambient can say so (root): the daemon's own user and group."""
    return (os.geteuid(), os.getegid()) if os.geteuid() == 0 else None


def keep(paths: BrainPaths, now: datetime) -> list[Restored]:
    """One pass over ``.ambient/``; what it restored is added to ``modes.json``."""
    done = keep_state_modes(paths.state, state_owner(), skip=NOT_OURS)
    if done:
        record(paths, done, now)
    return done


def record(paths: BrainPaths, done: list[Restored], now: datetime) -> None:
    rows = read_restored(paths)
    rows += [{**r._asdict(), "at": now.isoformat()} for r in done]
    with contextlib.suppress(OSError):  # a full disk: the log said it
        atomic_write(modes_file(paths), json.dumps({"restored": rows[-KEPT:]}, indent=1) + "\n", mode=PRIVATE_FILE)


def read_restored(paths: BrainPaths) -> list[dict[str, Any]]:
    """The last restorations the daemon made (empty when none or unreadable)."""
    try:
        doc = json.loads(read_capped(modes_file(paths), 256 * 1024))
    except (OSError, ValueError):
        return []
    rows = doc.get("restored") if isinstance(doc, dict) else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


class StateModesEvaluator:
    """On ticks, at most every ``EVERY_S``: :func:`keep` in a worker thread."""

    name = "state_modes"
    EVERY_S = 10.0

    def __init__(self, paths: BrainPaths, clock: Clock, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.paths = paths
        self.clock = clock
        self._monotonic = monotonic
        self._last: float | None = None

    async def evaluate(self, tick: Tick) -> None:
        now = self._monotonic()
        if self._last is not None and now - self._last < self.EVERY_S:
            return
        self._last = now
        await asyncio.to_thread(keep, self.paths, self.clock.now())
