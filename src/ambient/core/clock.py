"""Time for the shell. Core rules never read the clock: they are given ``now``."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    """What the shell needs of time; tests pass a manual clock."""

    def now(self) -> datetime: ...

    def monotonic(self) -> float: ...


class SystemClock:
    """The real clock, aware UTC."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


def utcnow() -> datetime:
    """Aware UTC now, for the shell."""
    return datetime.now(UTC)
