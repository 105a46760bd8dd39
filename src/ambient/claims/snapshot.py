"""Shell side of pre-flight: read the brain (claims, locks, breakers, agents' zones, the git branch) into the
immutable :class:`~ambient.claims.preflight.Snapshot` whose pure checks :mod:`ambient.claims.preflight` runs,
and run them for one write.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ambient.claims.breakers import Breaker
from ambient.claims.claim import Claim
from ambient.claims.locks import LockManager
from ambient.claims.preflight import DEFAULT_THRESHOLD, SCOPE, LockView, PreflightProblem, Snapshot, check
from ambient.claims.store import ClaimStore
from ambient.core.errors import InputError, UnsafePathError
from ambient.kernel.zones import DEFAULT_RULES, ZoneRule
from ambient.storage.fsutil import check_relative, read_capped, resolve_in_brain
from ambient.storage.paths import BrainPaths
from ambient.storage.yamlfile import MAX_AGENT_BYTES, decode, parse_yaml, split_frontmatter


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
