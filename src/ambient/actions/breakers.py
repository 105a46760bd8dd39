"""A person resets a tripped circuit breaker (``ambient preflight reset TARGET``, the console's "Reset" button).

Resetting clears the scope's entry in ``.ambient/breaker.json`` and answers ``reset`` to every chain waiting on that
scope's circuit-break question (the daemon then runs the step again), so the breaker and the runs never disagree.
The breaker's rules themselves (when it trips, what tripped means) stay in :mod:`ambient.claims.preflight`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ambient.actions.people import os_user
from ambient.claims.breakers import Breaker
from ambient.claims.store import ClaimStore
from ambient.config.brain import read_settings
from ambient.core.errors import InputError

if TYPE_CHECKING:
    from ambient.human.escalations import Channel
    from ambient.storage.paths import BrainPaths

#: The threshold when ``profil/ambient.yml`` cannot be read (spec/004).
DEFAULT_THRESHOLD = 3


@dataclass(frozen=True)
class TrippedBreaker:
    """A tripped breaker as a person reads it: its scope, its consecutive failures and since when."""

    scope: str
    fails: int
    tripped_at: str | None


@dataclass(frozen=True)
class BreakerReset:
    """What a reset did: the scope cleared and the circuit-break questions it answered ``(id, where)``."""

    scope: str
    answered: list[tuple[str, str]] = field(default_factory=list)

    @property
    def lines(self) -> list[str]:
        """What a person reads, one line each (the CLI prints them; the console joins them into its notice)."""
        runs_again = "the daemon runs the step again"
        done = [f"{esc_id}: answered reset ({where}); {runs_again}" for esc_id, where in self.answered]
        return [f"{self.scope}: breaker reset", *done]


def breaker_threshold(paths: BrainPaths) -> int:
    """``breaker_threshold`` of profil/ambient.yml (3 when unset or unreadable): the daemon's breaker and this agree."""
    found = read_settings(paths, os.environ)
    settings = found.settings or found.salvaged
    return settings.breaker_threshold if settings is not None else DEFAULT_THRESHOLD


def scope_of(paths: BrainPaths, target: str) -> str:
    """The scope a target names: a path is a scope; a sess_id of a known claim means its claim's scope."""
    if "/" in target or target.startswith("."):
        return target
    try:
        return ClaimStore(paths).get(target).scope
    except InputError:
        return target


def tripped_breakers(paths: BrainPaths, threshold: int | None = None) -> list[TrippedBreaker]:
    """Every tripped breaker of ``.ambient/breaker.json``, by scope. Raises InputError if the file is unreadable."""
    limit = breaker_threshold(paths) if threshold is None else threshold
    states = Breaker(paths, threshold=limit).states()
    return [
        TrippedBreaker(scope, state.fails, state.tripped_at)
        for scope, state in sorted(states.items())
        if state.is_tripped(limit)
    ]


def reset_breaker(
    paths: BrainPaths,
    target: str,
    *,
    threshold: int | None = None,
    by: str | None = None,
    channel: Channel = "cli",
    note: str = "ambient preflight reset",
) -> BreakerReset:
    """Clear the breaker of ``target`` (a sess_id or a scope) and answer its chains' circuit-break questions.

    Raises :class:`InputError` on an empty target or an unreadable ``breaker.json`` (nothing changed)."""
    if not target.strip():
        raise InputError("say which breaker to reset: a sess_id or a scope")
    from ambient.core.errors import AlreadyAnsweredError
    from ambient.human.escalation_store import EscalationStore  # here: `preflight check` runs before every write

    scope = scope_of(paths, target)
    limit = breaker_threshold(paths) if threshold is None else threshold
    Breaker(paths, threshold=limit).reset(scope)
    store = EscalationStore(paths)
    who = by if by is not None else os_user()
    answered: list[tuple[str, str]] = []
    for esc in store.pending_breaks(scope):
        try:
            store.answer(esc.id, "reset", by=who, channel=channel, note=note)
        except AlreadyAnsweredError:
            continue
        answered.append((esc.id, esc.where))
    return BreakerReset(scope, answered)
