"""The persisted circuit breakers (spec/004): consecutive failures per scope; the rules are pre-flight's.

Breakers live in ``.ambient/breaker.json`` (ambient's own state, JSON), one entry per normalised
scope, updated read-modify-write under a short flock and written atomically. A tripped breaker
stays tripped until a person resets it (spec/004: never restart automatically after 3 fails).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from ambient.claims.preflight import DEFAULT_THRESHOLD, BreakerState, breaker_fail, breaker_key, breaker_success
from ambient.core.clock import Clock, SystemClock
from ambient.core.errors import InputError
from ambient.storage.fsutil import PRIVATE_FILE, atomic_write, private_dir, read_capped
from ambient.storage.guard import FileGuard
from ambient.storage.paths import BrainPaths

STATE_NAME = "breaker.json"
GUARD_NAME = "breaker.guard"
_MAX_STATE_BYTES = 1024 * 1024


class Breaker:
    """Consecutive-failure counters per scope (what :class:`ambient.engine.chain.Breaker` expects), persisted.

    Args:
        paths: the brain layout (state in ``.ambient/breaker.json``).
        threshold: consecutive failures that trip a breaker (spec/004: 3).
    """

    def __init__(self, paths: BrainPaths, *, threshold: int = DEFAULT_THRESHOLD, clock: Clock | None = None) -> None:
        if threshold < 1:
            raise InputError(f"breaker threshold must be at least 1, got {threshold}")
        self.paths = paths
        self.path = paths.state / STATE_NAME
        self.threshold = threshold
        self.clock = clock or SystemClock()
        self._guard = FileGuard(paths.state / GUARD_NAME)

    def states(self) -> dict[str, BreakerState]:
        """Every scope with a breaker entry."""
        try:
            raw = read_capped(self.path, _MAX_STATE_BYTES)
        except FileNotFoundError:
            return {}
        source = self.paths.rel(self.path)
        try:
            data = json.loads(raw)
            scopes = data["scopes"] if isinstance(data, dict) else None
            if not isinstance(scopes, dict):
                raise ValueError("no 'scopes' mapping")
            return {str(k): BreakerState.model_validate(v) for k, v in scopes.items()}
        except (ValueError, KeyError, ValidationError) as exc:
            # Never treat an unreadable file as "no breaker tripped": that would silently restart work.
            raise InputError(
                f"cannot be read ({str(exc).splitlines()[0]}); fix or delete it to reset every breaker",
                file=source,
            ) from None

    def _save(self, states: Mapping[str, BreakerState]) -> None:
        doc: dict[str, Any] = {"version": 1, "scopes": {k: v.model_dump() for k, v in sorted(states.items())}}
        private_dir(self.path.parent)
        atomic_write(self.path, json.dumps(doc, indent=2) + "\n", mode=PRIVATE_FILE)

    def status(self, scope: str) -> BreakerState:
        """The breaker of ``scope`` (a fresh one if it never failed)."""
        return self.states().get(breaker_key(scope), BreakerState())

    def tripped(self, scope: str) -> bool:
        """Is the breaker of ``scope`` tripped?"""
        return self.status(scope).is_tripped(self.threshold)

    def fail(self, scope: str) -> int:
        """Record one failure on ``scope``; returns the consecutive count."""
        key = breaker_key(scope)
        with self._guard.hold():
            states = self.states()
            state = breaker_fail(states.get(key, BreakerState()), self.clock.now().astimezone(), self.threshold)
            states[key] = state
            self._save(states)
            return state.fails

    def success(self, scope: str) -> None:
        """A success ends the run of failures (a tripped breaker stays tripped)."""
        key = breaker_key(scope)
        with self._guard.hold():
            states = self.states()
            if key not in states:
                return
            state = breaker_success(states[key])
            if state.fails == 0 and not state.tripped:
                del states[key]
            else:
                states[key] = state
            self._save(states)

    def reset(self, scope: str) -> None:
        """A person clears the breaker of ``scope`` after inspecting."""
        key = breaker_key(scope)
        with self._guard.hold():
            states = self.states()
            if states.pop(key, None) is not None:
                self._save(states)
