"""Shell side of pre-flight: the persisted circuit breakers, and building the snapshot pre-flight checks.

Breakers live in ``.ambient/breaker.json`` (ambient's own state, JSON), one entry per normalised
scope, updated read-modify-write under a short flock and written atomically. A tripped breaker
stays tripped until a person resets it (spec/004: never restart automatically after 3 fails).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ambient.claims.claim import Claim
from ambient.claims.locks import LockManager
from ambient.claims.preflight import (
    DEFAULT_THRESHOLD,
    SCOPE,
    LockView,
    PreflightProblem,
    Snapshot,
    breaker_fail,
    breaker_key,
    breaker_success,
    check,
)
from ambient.claims.preflight import BreakerState as BreakerState
from ambient.claims.store import ClaimStore
from ambient.core.clock import Clock, SystemClock
from ambient.core.errors import InputError, UnsafePathError
from ambient.kernel.zones import DEFAULT_RULES, ZoneRule
from ambient.storage.fsutil import (
    PRIVATE_FILE,
    atomic_write,
    check_relative,
    private_dir,
    read_capped,
    resolve_in_brain,
)
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


# -- snapshot for pre-flight


def current_branch(root: Path) -> str | None:
    """The git branch checked out for ``root`` (searching parents for ``.git``); None if unknown or detached."""
    here = root.resolve()
    for folder in (here, *here.parents):
        dot_git = folder / ".git"
        try:
            if dot_git.is_file():
                text = read_capped(dot_git, 4096).decode("utf-8", "replace").strip()
                if not text.startswith("gitdir:"):
                    return None
                gitdir = Path(text.partition(":")[2].strip())
                dot_git = gitdir if gitdir.is_absolute() else folder / gitdir
            elif not dot_git.is_dir():
                continue
            head = read_capped(dot_git / "HEAD", 4096).decode("utf-8", "replace").strip()
        except (OSError, InputError):
            return None
        prefix = "ref: refs/heads/"
        return head[len(prefix) :] if head.startswith(prefix) else None
    return None


def agent_zone_access(paths: BrainPaths, agent: str) -> frozenset[str] | None:
    """``zone_access`` of ``agents/<agent>.md`` (under ``brain.ipc`` or ``ipc``); None if absent or unreadable."""
    if not agent or "/" in agent or agent.startswith(".") or "\x00" in agent:
        return None
    from ambient.storage.yamlfile import MAX_AGENT_BYTES, decode, parse_yaml, split_frontmatter

    path = paths.agents / f"{agent}.md"
    try:
        text = decode(read_capped(path, MAX_AGENT_BYTES), source=str(path))
        yaml_text, offset, _ = split_frontmatter(text, source=str(path))
        data, _ = parse_yaml(yaml_text, source=str(path), line_offset=offset)
    except (OSError, InputError):
        return None
    if not isinstance(data, dict):
        return None
    for holder in (data.get("brain"), data):
        ipc = holder.get("ipc") if isinstance(holder, dict) else None
        zones = ipc.get("zone_access") if isinstance(ipc, dict) else None
        if isinstance(zones, list):
            return frozenset(str(z) for z in zones)
        if isinstance(zones, str):
            return frozenset({zones})
    return None


def lock_views(manager: LockManager) -> tuple[LockView, ...]:
    """The locks on disk as pre-flight sees them (free ones left out)."""
    views: list[LockView] = []
    for status in manager.list():
        if status.state == "free":
            continue
        info = status.info
        views.append(
            LockView(
                file=info.file if info is not None else status.file,
                state=status.state,
                holder=info.holder if info is not None else None,
                expires_at=info.expires_at if info is not None else None,
                problem=status.problem,
            )
        )
    return tuple(views)


def build_snapshot(
    paths: BrainPaths,
    *,
    threshold: int = DEFAULT_THRESHOLD,
    agent_zones: Mapping[str, frozenset[str]] | None = None,
    zone_rules: tuple[ZoneRule, ...] = DEFAULT_RULES,
    store: ClaimStore | None = None,
    locks: LockManager | None = None,
    for_claim: str | None = None,
) -> Snapshot:
    """Read claims, locks, breakers and the git branch into one frozen snapshot.

    ``agent_zones`` defaults to the ``zone_access`` each claim's agent declares in ``agents/``. ``for_claim``:
    only that claim and its ancestors, all the checks of one claim look at (see :func:`_lineage`).
    """
    store = store or ClaimStore(paths)
    claims = _lineage(store, for_claim) if for_claim is not None else store.load().claims
    manager = locks or LockManager(paths)
    try:
        views = lock_views(manager)
    finally:
        if locks is None:
            manager.close()
    if agent_zones is None:
        found: dict[str, frozenset[str]] = {}
        for agent in {c.agent for c in claims.values()}:
            access = agent_zone_access(paths, agent)
            if access is not None:
                found[agent] = access
        agent_zones = found
    return Snapshot(
        claims=claims,
        locks=views,
        breakers=Breaker(paths, threshold=threshold).states(),
        threshold=threshold,
        branch=current_branch(paths.root),
        zone_rules=zone_rules,
        agent_zones=agent_zones,
    )


def _lineage(store: ClaimStore, sess_id: str) -> dict[str, Claim]:
    """A claim and the chain of its ``parent_satellite`` ancestors, read by name.

    Pre-flight checks one claim, its ancestors (paused or failed above it, the theme branch they declare) and
    its agent: parsing every claim for that grew with claims/, which only grows (a fan-out of 8 items leaves
    9 files): 1.5 s per pre-flight with 2,000 claims, 1.7 ms this way (measured here).
    """
    out: dict[str, Claim] = {}
    sid: str | None = sess_id
    while sid and sid not in out:
        try:
            out[sid] = store.get(sid)
        except (InputError, OSError):
            break  # absent or unreadable: as the full snapshot, which leaves it out
        sid = out[sid].parent_satellite
    return out


def run_preflight(
    paths: BrainPaths,
    sess_id: str,
    file: str,
    *,
    threshold: int = DEFAULT_THRESHOLD,
    agent_zones: Mapping[str, frozenset[str]] | None = None,
    zone_rules: tuple[ZoneRule, ...] = DEFAULT_RULES,
    snapshot: Snapshot | None = None,
) -> list[PreflightProblem]:
    """Pre-flight ``sess_id`` writing ``file`` (brain-relative) against the brain as it is now.

    A path that exists is resolved first, so a symlink leading out of the brain fails the scope
    check instead of reaching the file behind it (and a symlink inside is checked where it leads).
    """
    snap = snapshot or build_snapshot(
        paths, threshold=threshold, agent_zones=agent_zones, zone_rules=zone_rules, for_claim=sess_id
    )
    try:
        check_relative(file)
    except UnsafePathError:
        return check(snap, sess_id, file)  # reported there, with the other checks
    extra: list[PreflightProblem] = []
    target = file
    try:
        real = resolve_in_brain(paths.root, file)
        rel = str(real.relative_to(paths.root.resolve()))
        if rel != ".":
            target = rel + ("/" if file.endswith("/") else "")
    except UnsafePathError as exc:
        extra.append(PreflightProblem(code=SCOPE, check="scope", message=str(exc)))
    return sorted([*check(snap, sess_id, target), *extra], key=lambda p: p.code)
