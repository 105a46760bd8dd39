"""Doctor's checks of the brain's shared state: claims (unreadable, stale), locks (dead holder, TTL passed,
unreadable) and run journals (that do not fold); and which runs are unfinished (they resume when the daemon starts)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ambient.cli._doctor.findings import Finding, ago, capped

if TYPE_CHECKING:
    from ambient.config.settings import Settings
    from ambient.storage.paths import BrainPaths

# Each check imports what it reads inside its function (the start-up time of the CLI): building the whole parser
# (``ambient --help``, a mistyped command) imports every command module, and doctor's checks with it.


def check_claims(paths: BrainPaths, settings: Settings, now: datetime) -> list[Finding]:
    """Unreadable claims, open claims past their TTL (stale) and claims already marked stale."""
    from ambient.claims import claim as rules
    from ambient.claims.index import census, read_claims
    from ambient.claims.store import ClaimStore

    if not paths.claims.is_dir():
        return []
    store = ClaimStore(paths, check_filesystem=False)
    seen = census(store, save=False)  # the index is used, not written; the stale candidates are read in full
    found = [
        Finding(
            "warning",
            "claims",
            p.message,
            "fix the file (ambient skips it and never rewrites it); `ambient validate` shows every problem",
            p.file,
            p.line,
        )
        for p in seen.problems
        if p.severity == "error"
    ]
    local = now.astimezone()  # naive claim times are local time
    tz = local.tzinfo
    assert tz is not None  # astimezone() always sets one
    default_ttl = timedelta(hours=settings.stale_claim_hours)
    due = [sid for sid, f in seen.facts.items() if (at := f.stale_at(tz, default_ttl)) is not None and local > at]
    candidates = read_claims(store, seen, due)
    stale = rules.mark_stale({sid: claim for sid, (_, claim) in candidates.items()}, local, default_ttl)
    running = set(unfinished_runs(paths)) if stale else set()
    rows = []
    for sid in sorted(stale):
        claim = candidates[sid][1]
        ttl = rules.parse_ttl(claim.ttl) or timedelta(hours=settings.stale_claim_hours)
        last = rules.last_activity(claim, tz) or local
        run = next((r for r in (sid, claim.parent_satellite) if r in running), None)
        if run is not None:  # ambient's own mirror of a run that resumes: closing it by hand would lie
            hint = f"it mirrors run {run}, which resumes when the daemon starts: start the daemon, do not close it"
        else:
            hint = (
                f"if its agent is gone, close it: `ambient claim close {sid} --status failed --message "
                "abandoned`; a running daemon marks it stale at its next tick"
            )
        rows.append(
            Finding(
                "warning",
                "claims",
                f"claim {sid} (agent {claim.agent}, scope {claim.scope}) is open with no activity for "
                f"{ago(local - last)}, past its TTL ({ago(ttl)})",
                hint,
                paths.rel(candidates[sid][0]),
            )
        )
    found += capped(rows, "stale claims")
    already = sorted(sid for sid, f in seen.facts.items() if f.status == rules.STALE)
    if already:
        names = ", ".join(already[:5]) + (f" and {len(already) - 5} more" if len(already) > 5 else "")
        found.append(
            Finding(
                "info",
                "claims",
                f"{len(already)} claim(s) marked stale (they block nobody): {names}",
                "close each once its work is settled: `ambient claim close SESS_ID --status ...`",
            )
        )
    return found


def check_locks(paths: BrainPaths) -> list[Finding]:
    """Locks whose holder is dead, whose TTL passed, or that cannot be read."""
    from ambient.claims.locks import LockManager

    if not paths.locks.is_dir():
        return []
    manager = LockManager(paths, check_filesystem=False)
    rows = []
    for st in manager.list():
        where = paths.rel(st.path)
        info = st.info
        holder = "holder ?"
        if info is not None:
            holder = f"holder {info.holder}" + (f" (pid {info.pid} on {info.host})" if info.pid else "")
        if st.state == "dead":
            rows.append(
                Finding(
                    "warning",
                    "locks",
                    f"lock on {st.file}: {holder} is dead",
                    "`ambient lock cleanup` removes it (the next acquire would take it over)",
                    where,
                )
            )
        elif st.state == "expired":
            rows.append(
                Finding(
                    "warning",
                    "locks",
                    f"lock on {st.file}: {holder}, TTL passed at {info.expires_at if info else '?'}",
                    "`ambient lock cleanup` removes it (the next acquire would take it over)",
                    where,
                )
            )
        elif st.state == "stale":
            rows.append(
                Finding(
                    "warning",
                    "locks",
                    f"lock on {st.file} is unreadable: {st.problem}",
                    "`ambient lock cleanup` removes it",
                    where,
                    st.line,
                )
            )
        elif st.state == "malformed":
            rows.append(
                Finding(
                    "warning",
                    "locks",
                    f"lock on {st.file} is unreadable and counts as held for "
                    f"{manager.malformed_grace_s:g} s: {st.problem}",
                    "if no process is writing it, `ambient lock cleanup` removes it once stale",
                    where,
                    st.line,
                )
            )
    return capped(rows, "stale locks")


def check_runs(paths: BrainPaths) -> list[Finding]:
    """Run journals that do not fold (an edited value, a wrong type): each is that run's problem, at file:line."""
    from ambient.engine.journals import journal_problems

    rows = [
        Finding(
            "error",
            "runs",
            p.message,
            "mend or remove that record (the daemon resumes the run at its next start), or move the journal away",
            p.file,
            p.line,
        )
        for p in journal_problems(paths)
    ]
    return capped(rows, "run journals that do not load")


def _unfinished(paths: BrainPaths) -> list[tuple[Path, Any]]:
    """Each run journal with no end, and its folded state (journals that do not fold are left to check_runs)."""
    from ambient.engine.runstate import fold
    from ambient.storage.journal import read_jsonl

    found = []
    if paths.run_journals.is_dir():
        for path in sorted(paths.run_journals.glob("*.jsonl")):
            try:
                state = fold(read_jsonl(path).records)
            except (ValueError, KeyError, TypeError, OSError):
                continue
            if not state.finished:
                found.append((path, state))
    return found


def unfinished_runs(paths: BrainPaths) -> list[str]:
    """Ids of the runs whose journal has no end: they resume when the daemon starts."""
    return [state.run_id for _, state in _unfinished(paths)]


def questions_kept(paths: BrainPaths) -> dict[str, str]:
    """Escalations an unfinished run waits on whose question its journal keeps (id → journal): the daemon rebuilds
    their file if it is lost or unreadable."""
    kept: dict[str, str] = {}
    for path, state in _unfinished(paths):
        kept.update((e, paths.rel(path)) for e in state.escalations if e in state.requests)
    return kept
