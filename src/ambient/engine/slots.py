"""The daemon-wide cap on agents running at once, all runs together (``concurrency:`` in ``profil/ambient.yml``).

What a person protecting a machine or an API quota expects from one number: however many runs are going, at most
``concurrency`` agents run at once. A for_each's own ``concurrency:`` caps that run further; a for_each without one
may use every free slot. No I/O: bookkeeping and callbacks, driven by the executors on the event loop, and what the
cap costs the service (:func:`unit_limits`; :mod:`ambient.service.limits` compares it with the limits in force).

Fairness: a run that finds no slot free queues with how many it lacks. A freed slot is not left for whoever asks
first (the run whose agent just ended would always win it back): it is set aside for the waiting run that holds
the fewest slots (the one that waited longest among equals), and that run is woken to take it. So a large fan-out
cannot starve a run that came after it: they end up sharing the slots.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

#: What ``concurrency`` agents at once cost the service (docs/service.md, limits: the unit's ``TasksMax=`` and
#: ``LimitNOFILE=`` are :func:`unit_limits` of the cap's maximum, 256). Tasks count threads and processes of the
#: whole unit: an agent with its children (a shell, a tool, a runtime's threads), and the daemon's own (event loop,
#: writer threads, the to_thread pool, the spawner). Descriptors are the daemon's: per agent its pipes, pidfd, lock
#: and claim files, its send-socket connection; its own are journals, watches, sockets and logs.
AGENT_TASKS = 15
DAEMON_TASKS = 256
AGENT_FDS = 8
DAEMON_FDS = 1024


def unit_limits(concurrency: int) -> tuple[int, int]:
    """(tasks, descriptors) the service needs for ``concurrency`` agents at once, the daemon's own included."""
    return concurrency * AGENT_TASKS + DAEMON_TASKS, concurrency * AGENT_FDS + DAEMON_FDS


class AgentSlots:
    """``limit`` slots shared by every run; :meth:`take` before starting agents, :meth:`give` when each is done."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running = 0  # slots held by agents that run (or are about to)
        self._held: dict[Hashable, int] = {}  # per run
        self._reserved: dict[Hashable, int] = {}  # freed slots set aside for a woken waiter, not yet taken
        self._waiting: dict[Hashable, tuple[Callable[[], None], int]] = {}  # in arrival order: (wake, lacking)

    @property
    def free(self) -> int:
        return self.limit - self.running - sum(self._reserved.values())

    def available(self, who: Hashable) -> bool:
        """Whether :meth:`take` would give ``who`` a slot now."""
        return self._reserved.get(who, 0) > 0 or (self.free > 0 and not self._queued_besides(who))

    def take(self, who: Hashable, want: int, wake: Callable[[], None]) -> int:
        """Up to ``want`` slots for ``who`` now: those set aside for it, and free ones unless others wait. Short of
        ``want``, ``who`` stays queued (keeping its place) and ``wake`` is called when a slot is set aside for it."""
        if want <= 0:
            return 0
        mine = self._reserved.pop(who, 0)  # from here on counted as free
        room = mine if self._queued_besides(who) else self.free
        got = max(0, min(want, room))
        if got:
            self._held[who] = self._held.get(who, 0) + got
            self.running += got
        if got < want:
            self._waiting[who] = (wake, want - got)  # an update keeps its place in the line
        else:
            self._waiting.pop(who, None)
        if got < mine:
            self._hand_out()  # more was set aside than wanted: it goes to the next in line
        return got

    def give(self, who: Hashable, n: int = 1) -> None:
        """``n`` of ``who``'s agents are done: their slots go to the runs that wait."""
        held = self._held.get(who, 0)
        n = min(n, held)
        if held - n:
            self._held[who] = held - n
        else:
            self._held.pop(who, None)
        self.running -= n
        self._hand_out()

    def leave(self, who: Hashable) -> None:
        """``who`` has nothing more to start (or ended): it leaves the line, and what was set aside for it goes to the
        next in line. The slots its agents hold stay held until :meth:`give`."""
        self._waiting.pop(who, None)
        if self._reserved.pop(who, 0):
            self._hand_out()

    def resize(self, limit: int) -> None:
        """A new cap (a reload): more slots go to the line at once; fewer take effect as agents end."""
        if limit < self.limit:
            self._reserved.clear()  # set aside but not taken yet: the waiters stay in line for the new cap
        self.limit = limit
        self._hand_out()

    def _queued_besides(self, who: Hashable) -> bool:
        """Whether another run waits for a slot not yet set aside for it (it goes first)."""
        return any(w != who and self._reserved.get(w, 0) < short for w, (_, short) in self._waiting.items())

    def _hand_out(self) -> None:
        woken: list[Hashable] = []
        while self.free > 0:
            lacking = [w for w, (_, short) in self._waiting.items() if self._reserved.get(w, 0) < short]
            if not lacking:
                break
            who = min(lacking, key=lambda w: self._held.get(w, 0) + self._reserved.get(w, 0))
            self._reserved[who] = self._reserved.get(who, 0) + 1
            if who not in woken:
                woken.append(who)
        for who in woken:  # after the bookkeeping: a wake may take at once
            self._waiting[who][0]()
