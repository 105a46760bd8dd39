"""A clock a test moves by hand: :class:`ManualClock`, the :class:`~ambient.core.clock.Clock` of the shell frozen
until told otherwise, so a rule that depends on time is tested at exact moments, without sleeping and without
patching the process's clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

#: Where a manual clock starts unless told: a fixed moment, so a test reads the same on every run.
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


class ManualClock:
    """Implements :class:`ambient.core.clock.Clock` (``now``, ``monotonic``) and gives the wall clock as seconds
    since the epoch (:meth:`time`, for code that takes a ``time.time``-like callable). It moves only when told:
    :meth:`advance` moves both clocks on, :meth:`set` makes the wall clock jump (back too, as a real one may after
    an NTP step) while the monotonic clock stays where it is."""

    def __init__(self, start: datetime = EPOCH) -> None:
        if start.tzinfo is None:
            raise ValueError("a manual clock starts at an aware time (the shell's clock is aware UTC)")
        self._now = start.astimezone(UTC)
        self._monotonic = 0.0

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._monotonic

    def time(self) -> float:
        """The wall clock in seconds since the epoch, as :func:`time.time` gives it."""
        return self._now.timestamp()

    def advance(self, by: float | timedelta) -> datetime:
        """Let ``by`` (seconds or a timedelta, never negative: time does not run backwards) pass; the new now."""
        step = by if isinstance(by, timedelta) else timedelta(seconds=by)
        if step < timedelta(0):
            raise ValueError(f"time passes forwards only: advance({by!r}); set() jumps the wall clock")
        self._now += step
        self._monotonic += step.total_seconds()
        return self._now

    def set(self, moment: datetime) -> None:
        """Make the wall clock read ``moment`` (an aware time, earlier or later); the monotonic clock is untouched."""
        if moment.tzinfo is None:
            raise ValueError("set() takes an aware time")
        self._now = moment.astimezone(UTC)
