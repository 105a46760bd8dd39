"""``ambient`` on a simulated clock: ``python bench/simclock.py CLOCK_FILE [ambient arguments...]``.

Every ambient process that reads time reads it through :mod:`ambient.core.clock` (the daemon's ``Clock`` port,
``utcnow()`` in the commands). This launcher points both at ``CLOCK_FILE`` before anything else of ambient is
imported, then runs the ``ambient`` command as the console script would. The file holds ``{"sim": ISO, "real":
EPOCH}``: the simulated time at the real moment ``real``; time then flows at its real pace from there, so a run's
durations, a learned rule's back-off and the daemon's timers stay true while the date jumps to the next simulated
day when the bench writes the file again. Nothing sleeps: a month passes as fast as its runs do.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path


class FileClock:
    """Simulated aware UTC time read from a file (re-read only when the file changes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sig: tuple[int, int] | None = None
        self._sim = datetime.now(UTC)
        self._real = time.time()

    def now(self) -> datetime:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return datetime.now(UTC)
        sig = (st.st_mtime_ns, st.st_size)
        if sig != self._sig:
            try:
                data = json.loads(self.path.read_text())
                self._sim, self._real = datetime.fromisoformat(data["sim"]), float(data["real"])
                self._sig = sig
            except (OSError, ValueError, KeyError):  # written at this instant: the previous reading stands
                pass
        return self._sim + timedelta(seconds=time.time() - self._real)

    def monotonic(self) -> float:
        return time.monotonic()


def set_clock(path: Path, sim: datetime) -> None:
    """Move the simulated clock to ``sim`` now (atomically: a reader sees the old or the new time)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"sim": sim.isoformat(), "real": time.time()}))
    tmp.replace(path)


def install(path: Path) -> None:
    """Make ambient's clock the file's, before any ambient module that reads time is imported."""
    import ambient.core.clock as clock

    fc = FileClock(path)
    clock.SystemClock.now = lambda self: fc.now()  # type: ignore[method-assign]
    clock.utcnow = fc.now


if __name__ == "__main__":
    install(Path(sys.argv[1]))
    from ambient.cli import main

    sys.argv = ["ambient", *sys.argv[2:]]
    raise SystemExit(main())
