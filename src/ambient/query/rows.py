"""The rows of the query store's tables made from the brain's files, each file parsed by the module that owns its
format (claims: :func:`~ambient.claims.claimfile.read_claim_file`; escalations:
:meth:`~ambient.human.escalation_store.EscalationStore.read_file`; journals: :func:`~ambient.engine.runstate.fold`).

Apart from :mod:`ambient.query.store` so that a refresh finding nothing changed imports none of those readers (the
start-up time of ``ambient status`` and ``ambient escalations``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ambient.claims.claim import ClaimFacts
from ambient.claims.claimfile import is_claim_name, read_claim_file
from ambient.core.errors import ClaimFileError, InputError
from ambient.core.problems import Problem
from ambient.engine.journals import finished_glance, journal_problem
from ambient.engine.runstate import TERMINAL_ITEM, RunState, fold
from ambient.human.escalation_store import EscalationStore
from ambient.storage.journal import iter_jsonl

__all__ = [
    "EscalationStore",
    "Problem",
    "claim_row",
    "escalation_row",
    "finished_glance",
    "fold",
    "is_claim_name",
    "item_times",
    "iter_jsonl",
    "journal_problem",
    "problems_json",
    "record_row",
    "run_rows",
    "started_workflow",
]


def claim_row(path: Path, rel: str) -> tuple[Any, ...]:
    """The ``claims`` row of one claim file: its facts and warnings, or only the problems that make it unusable
    (the claims census's verdicts: :func:`ambient.claims.claimfile.read_claim_file`)."""
    try:
        claim, warnings, _ = read_claim_file(path, rel)
    except ClaimFileError as exc:
        return (rel, *([None] * 11), "[]", problems_json(exc.problems))
    except InputError as exc:
        return (rel, *([None] * 11), "[]", json.dumps([[exc.line, exc.message, "error"]]))
    except OSError as exc:
        return (rel, *([None] * 11), "[]", json.dumps([[None, f"cannot be read: {exc.strerror}", "error"]]))
    facts = ClaimFacts.of(claim)
    ttl = None if claim.ttl is None else str(claim.ttl)
    return (
        rel,
        claim.sess_id,
        claim.status,
        claim.agent,
        claim.parent_satellite,
        claim.type,
        claim.scope,
        claim.workflow,
        claim.opened_at,
        claim.closed_at,
        max(facts.times) if facts.times else None,
        ttl,
        json.dumps(list(facts.times)),
        problems_json(warnings),
    )


def problems_json(problems: Iterable[Problem]) -> str:
    return json.dumps([[p.line, p.message, p.severity] for p in problems])


def escalation_row(esc: Any) -> tuple[Any, ...]:
    """The ``escalations`` row of one escalation (an :class:`ambient.human.escalations.Escalation`)."""
    data = esc.model_dump(mode="json")
    return (
        esc.id,
        esc.status,
        esc.kind,
        esc.workflow,
        esc.agent,
        esc.run_id,
        esc.item,
        esc.step,
        esc.where,
        esc.question,
        json.dumps([[o.key, o.label, o.action] for o in esc.options]),
        esc.created_at.isoformat(),
        None if esc.deadline is None else esc.deadline.isoformat(),
        esc.decision,
        esc.by,
        esc.channel,
        esc.note,
        None if esc.answered_at is None else esc.answered_at.isoformat(),
        int(esc.notify.delivered_at is not None),
        esc.notify.count,
        json.dumps(data, separators=(",", ":")),
    )


def started_workflow(records: list[dict[str, Any]]) -> str | None:
    first = records[0] if records else None
    workflow = first.get("workflow") if first is not None else None
    return workflow if isinstance(workflow, str) else None


def item_times(records: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str | None, str | None]]:
    """Item name → (the ``at`` of its first ``accepted``, the ``at`` of its last ``finished`` or ``skipped``),
    from a run's journal records (:mod:`ambient.engine.events`: every event carries ``at``)."""
    times: dict[str, tuple[str | None, str | None]] = {}
    for ev in records:
        kind, item, at = ev.get("ev"), ev.get("item"), ev.get("at")
        if item is None or not isinstance(at, str):
            continue
        name = str(item)
        first, last = times.get(name, (None, None))
        if kind == "accepted" and first is None:
            times[name] = (at, last)
        elif kind in ("finished", "skipped"):
            times[name] = (first, at)
    return times


def run_rows(
    state: RunState, records: list[dict[str, Any]], journal: str, run_id: str
) -> tuple[tuple[Any, ...], list[tuple[Any, ...]]]:
    """The ``runs`` row and the ``items`` rows of a folded run."""
    counts = state.counts()
    usage = state.usage.to_record()
    tokens = (usage.get("input_tokens") or 0) + (usage.get("output_tokens") or 0) if "cost_usd" in usage else None
    row = (
        run_id,
        journal,
        "finished" if state.finished else "running",
        state.workflow,
        state.form,
        state.outcome,
        state.started_at,
        state.finished_at,
        counts.get("done", 0),
        counts["total"],
        counts.get("running", 0),
        counts.get("failed", 0),
        len(state.escalations),
        usage.get("cost_usd"),
        tokens,
        json.dumps(usage),
        json.dumps(sorted(state.tripped)),
        json.dumps(sorted(state.holds)),
        json.dumps(state.breaker),
        state.cursor if state.form == "chain" else None,
        None,
    )
    times = item_times(records)
    items = []
    for it in state.items:
        first, last = times.get(it.name, (None, None))
        last = (last or state.finished_at) if it.status in TERMINAL_ITEM else None
        items.append(
            (run_id, it.index, it.name, it.status, it.attempt, it.error, it.escalation, it.gate, first, last,
             it.duration_ms)
        )  # fmt: skip
    return row, items


def record_row(line: int, raw: bytes) -> tuple[Any, ...]:
    """The ``records`` row of one line of ``runs.jsonl`` (``json`` NULL for a line that is not a JSON object)."""
    try:
        rec = json.loads(raw)
    except ValueError:
        rec = None
    if not isinstance(rec, dict):
        return (line, None, *([None] * 9))
    started = rec.get("started_at")
    cost = rec.get("cost_usd")
    return (
        line,
        raw.decode("utf-8", "replace").strip(),
        _text(rec.get("run_id")),
        _text(rec.get("workflow")),
        _text(rec.get("outcome")),
        _text(started),
        _text(rec.get("completed_at")),
        _week(started),
        _reached(rec),
        _int(rec.get("errors")),
        float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else None,
    )


def _reached(rec: dict[str, Any]) -> int | None:
    """The escalations of a record that reached the person: an older record (without ``auto_decisions``) counted a
    learned rule's automatic decisions among them (ambient.engine.records)."""
    count = _int(rec.get("escalations"))
    if count is None or "auto_decisions" in rec:
        return count
    decisions = rec.get("decisions")
    auto = (
        sum(1 for d in decisions if isinstance(d, dict) and d.get("auto") is True) if isinstance(decisions, list) else 0
    )
    return max(0, count - auto)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _week(started: Any) -> str | None:
    """``2026-W12``: the ISO week of the UTC start (as ``ambient stats`` groups runs)."""
    from datetime import UTC, datetime

    if not isinstance(started, str):
        return None
    try:
        when = datetime.fromisoformat(started)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    year, week, _ = when.astimezone(UTC).isocalendar()
    return f"{year}-W{week:02d}"
