"""Pre-flight (DESIGN 4; spec/004 step 4; the original ``preflight-check``): may this claim write this file?

Pure checks over an immutable :class:`Snapshot` that the shell builds (:mod:`ambient.claims.snapshot`),
each failure a :class:`PreflightProblem` carrying the source's exit code: 1 scope, 2 locked,
3 circuit breaker, 4 claim not open (or an ancestor paused/failed), 5 zone, 6 theme branch.
Also the circuit breaker's state rules (3 consecutive failures on a scope by default).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict

from ambient.claims.claim import FAILED, OPEN, PAUSED, WAITING_HUMAN, Claim, ancestors, format_time
from ambient.core.errors import UnsafePathError
from ambient.kernel import zones

SCOPE: Final = 1
LOCKED: Final = 2
BREAKER: Final = 3
CLAIM: Final = 4
ZONE: Final = 5
BRANCH: Final = 6
CHECKS: Final[Mapping[int, str]] = MappingProxyType(
    {SCOPE: "scope", LOCKED: "locked", BREAKER: "breaker", CLAIM: "claim", ZONE: "zone", BRANCH: "branch"}
)
DEFAULT_THRESHOLD: Final = 3  # spec/004: 3 consecutive fails on the same scope


class PreflightProblem(BaseModel):
    """One failed check; ``code`` is the source tool's exit code for it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: int
    check: str
    message: str

    def __str__(self) -> str:
        return f"[{self.code} {self.check}] {self.message}"


class LockView(BaseModel):
    """What pre-flight needs of a lock (built by the shell from :class:`ambient.claims.lockstate.LockStatus`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: str
    state: Literal["held", "expired", "dead", "malformed", "stale"]
    holder: str | None = None
    expires_at: str | None = None
    problem: str | None = None

    @property
    def blocking(self) -> bool:
        """Held, or unreadable and not yet stale: keeps other holders out."""
        return self.state in ("held", "malformed")


class BreakerState(BaseModel):
    """Circuit breaker of one scope: consecutive failures, and whether it tripped (only a person resets it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fails: int = 0
    tripped: bool = False
    last_fail_at: str | None = None
    tripped_at: str | None = None

    def is_tripped(self, threshold: int = DEFAULT_THRESHOLD) -> bool:
        """Tripped once, or at the threshold now."""
        return self.tripped or self.fails >= threshold


def breaker_fail(state: BreakerState, now: datetime, threshold: int = DEFAULT_THRESHOLD) -> BreakerState:
    """One more consecutive failure; trips at ``threshold`` (spec/004: never resets by itself)."""
    if threshold < 1:
        raise ValueError(f"breaker threshold must be at least 1, got {threshold}")
    fails = state.fails + 1
    trips = not state.tripped and fails >= threshold
    return BreakerState(
        fails=fails,
        tripped=state.tripped or trips,
        last_fail_at=format_time(now),
        tripped_at=format_time(now) if trips else state.tripped_at,
    )


def breaker_success(state: BreakerState) -> BreakerState:
    """A success ends the run of failures, unless the breaker tripped: then only a reset clears it."""
    return state if state.tripped else BreakerState()


def breaker_key(scope: str) -> str:
    """Breakers are per scope, normalised (``./agents//`` and ``agents/`` are one scope)."""
    try:
        return zones.normalize(scope)
    except UnsafePathError:
        return scope


@dataclass(frozen=True)
class Snapshot:
    """Everything pre-flight looks at, frozen at one moment.

    Args:
        claims: every readable claim by sess_id.
        locks: every lock file (free ones left out).
        breakers: breaker state by normalised scope.
        threshold: consecutive failures that trip a breaker.
        branch: the brain's current git branch; None when unknown (no git, detached HEAD).
        zone_rules: the brain's zone rules.
        agent_zones: ``zone_access`` of agents that declare one (``*`` = every zone).
    """

    claims: Mapping[str, Claim]
    locks: tuple[LockView, ...] = ()
    breakers: Mapping[str, BreakerState] = field(default_factory=dict)
    threshold: int = DEFAULT_THRESHOLD
    branch: str | None = None
    zone_rules: tuple[zones.ZoneRule, ...] = zones.DEFAULT_RULES
    agent_zones: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "claims", MappingProxyType(dict(self.claims)))
        object.__setattr__(self, "breakers", MappingProxyType(dict(self.breakers)))
        object.__setattr__(self, "agent_zones", MappingProxyType(dict(self.agent_zones)))
        object.__setattr__(self, "locks", tuple(self.locks))


def covers(scope: str, path: str) -> bool:
    """Does a normalised scope (or lock path) cover a normalised path? A scope covers itself and all below it."""
    if scope == "":
        return True
    base = scope.rstrip("/")
    return path == base or path.startswith(base + "/")


def _problem(code: int, message: str) -> PreflightProblem:
    return PreflightProblem(code=code, check=CHECKS[code], message=message)


def _theme_branch(snapshot: Snapshot, claim: Claim) -> str | None:
    # The theme branch is declared on the pilote or a coordinator; satellites below inherit it.
    if claim.theme_branch:
        return claim.theme_branch
    for sid in ancestors(snapshot.claims, claim.sess_id):
        branch = snapshot.claims[sid].theme_branch
        if branch:
            return branch
    return None


@dataclass(frozen=True)
class _Write:
    """One write pre-flight judges: who writes (its claim, None when unknown) and where (the normalised path, None
    when unusable: the target check says why)."""

    sess_id: str
    claim: Claim | None
    target: str | None


def _target(file: str) -> Iterator[PreflightProblem]:
    """The path itself: inside the brain and not empty."""
    try:
        normalised = zones.normalize(file).rstrip("/")
    except UnsafePathError as exc:
        yield _problem(SCOPE, f"{exc}; pre-flight only allows paths inside the brain")
        return
    if normalised == "":
        yield _problem(SCOPE, "the path is empty; expected a file inside the claim's scope")


def _claim_open(snapshot: Snapshot, w: _Write) -> Iterator[PreflightProblem]:
    """4: the claim exists and is open, and no ancestor is paused or failed."""
    claim = w.claim
    if claim is None:
        yield _problem(CLAIM, f"no claim {w.sess_id!r}; open one before writing")
        return
    if claim.status != OPEN:
        hint = {
            WAITING_HUMAN: "; it waits for a human gate (`ambient gate approve`)",
            PAUSED: "; resume it first (`ambient gate resume`)",
        }.get(claim.status, "")
        yield _problem(CLAIM, f"claim {w.sess_id} is {claim.status}, not open{hint}")
    for sid in ancestors(snapshot.claims, w.sess_id):
        parent = snapshot.claims[sid]
        if parent.status in (PAUSED, FAILED):
            yield _problem(CLAIM, f"claim {w.sess_id} sits under {sid}, which is {parent.status}")
            return


def _in_scope(snapshot: Snapshot, w: _Write) -> Iterator[PreflightProblem]:
    """1: the path is inside the claim's scope."""
    if w.claim is None:
        return
    try:
        scope = zones.normalize(w.claim.scope)
    except UnsafePathError as exc:
        yield _problem(SCOPE, f"claim {w.sess_id} has an unusable scope: {exc}")
        return
    if w.target is not None and not covers(scope, w.target):
        yield _problem(SCOPE, f"{w.target} is outside the scope of claim {w.sess_id} ({w.claim.scope})")


def _unlocked(snapshot: Snapshot, w: _Write) -> Iterator[PreflightProblem]:
    """2: no lock of another holder covers the path (an unreadable lock counts as held until it goes stale)."""
    if w.target is None:
        return
    for lock in snapshot.locks:
        if not lock.blocking or lock.holder == w.sess_id:
            continue
        try:
            locked = zones.normalize(lock.file)
        except UnsafePathError:
            continue
        if not covers(locked, w.target):
            continue
        if lock.holder is None:
            yield _problem(
                LOCKED,
                f"{w.target}: the lock of {lock.file} is unreadable ({lock.problem}); it counts as held until it "
                "goes stale",
            )
        else:
            yield _problem(
                LOCKED, f"{w.target} is locked by {lock.holder} (lock on {lock.file}) until {lock.expires_at}"
            )


def _breaker_closed(snapshot: Snapshot, w: _Write) -> Iterator[PreflightProblem]:
    """3: the circuit breaker of the claim's scope has not tripped."""
    if w.claim is None:
        return
    state = snapshot.breakers.get(breaker_key(w.claim.scope))
    if state is not None and state.is_tripped(snapshot.threshold):
        yield _problem(
            BREAKER,
            f"circuit breaker tripped on {w.claim.scope} after {state.fails} consecutive failures; a person "
            f"inspects, then `ambient preflight reset {w.claim.scope}`",
        )


def _zone_allowed(snapshot: Snapshot, w: _Write) -> Iterator[PreflightProblem]:
    """5: the path's zone is one the claim's mode, its user and its agent may write."""
    claim, target = w.claim, w.target
    if claim is None or target is None:
        return
    fzone = zones.zone_of(target, snapshot.zone_rules)
    if claim.mode == "rendering" and fzone != zones.PROJECT:
        yield _problem(ZONE, f"{target} is in zone {fzone}; a claim in mode rendering writes zone project only")
    if claim.user_id is not None and fzone == zones.PERSONAL:
        yield _problem(
            ZONE,
            f"{target} is in zone personal; only the brain owner (no user_id) writes it, and claim {w.sess_id} "
            f"belongs to {claim.user_id}",
        )
    allowed = snapshot.agent_zones.get(claim.agent)
    if allowed is not None and "*" not in allowed and fzone not in allowed:
        yield _problem(
            ZONE,
            f"{target} is in zone {fzone}; agent {claim.agent} may write {', '.join(sorted(allowed)) or 'no zone'}",
        )


def _on_theme_branch(snapshot: Snapshot, w: _Write) -> Iterator[PreflightProblem]:
    """6: the brain is on the theme branch the claim (or an ancestor) works on."""
    if w.claim is None:
        return
    expected = _theme_branch(snapshot, w.claim)
    if expected is None or snapshot.branch == expected:
        return
    if snapshot.branch is None:
        yield _problem(
            BRANCH,
            f"claim {w.sess_id} works on {expected}, and the current git branch cannot be told (no git repository, "
            "or a detached HEAD)",
        )
    else:
        yield _problem(BRANCH, f"claim {w.sess_id} works on {expected}, but the brain is on {snapshot.branch}")


#: The six checks of the BSI protocol, each a function of the snapshot and the write; their order is their report's.
CHECK_FUNCTIONS: Final[tuple[Callable[[Snapshot, _Write], Iterator[PreflightProblem]], ...]] = (
    _claim_open,
    _in_scope,
    _unlocked,
    _breaker_closed,
    _zone_allowed,
    _on_theme_branch,
)


def check(snapshot: Snapshot, sess_id: str, file: str) -> list[PreflightProblem]:
    """Run the six checks for ``sess_id`` writing ``file``; problems sorted by code (empty = go)."""
    claim = snapshot.claims.get(sess_id)
    unusable = list(_target(file))
    target = None if unusable else zones.normalize(file).rstrip("/")
    write = _Write(sess_id, claim, target)
    problems = unusable + [p for each in CHECK_FUNCTIONS for p in each(snapshot, write)]
    return sorted(problems, key=lambda p: p.code)


def exit_code(problems: list[PreflightProblem]) -> int:
    """The exit code of a check: 0 when clear, else the lowest problem code."""
    return min((p.code for p in problems), default=0)
