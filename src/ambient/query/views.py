"""What the CLI and the web console read of the query store: typed rows from its tables (no file is read here).

Each function takes the store's connection (``with store.reading() as conn``) after a
:meth:`~ambient.query.store.QueryStore.refresh`. The names are a contract with the console's pages: add, do not
rename.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ambient.claims.claim import ClaimFacts
    from ambient.core.problems import Problem

# ------------------------------------------------------------------------------------------------ runs and items


@dataclass(frozen=True)
class ItemRow:
    """One item of a run (a for_each item or a chain step), with its times for a timeline."""

    run_id: str
    index: int
    name: str
    status: str
    attempt: int
    error: str | None
    escalation: str | None
    gate: str | None
    first_start: str | None  # the ``at`` of its first ``accepted``
    ended_at: str | None  # the ``at`` of its last ``finished``/``skipped`` once terminal
    duration_ms: int


@dataclass(frozen=True)
class RunRow:
    """One run, from its journal: ``state`` running | finished | unreadable (``problem`` then says why)."""

    run_id: str
    journal: str
    state: str
    workflow: str | None
    form: str | None
    outcome: str | None
    started_at: str | None
    finished_at: str | None
    done: int
    total: int
    running: int
    failed: int
    waiting: int
    cost_usd: float | None
    tokens: int | None
    usage: dict[str, Any]  # UsageTotals.to_record(): cost_usd, tokens, turns, models (AI agents only)
    tripped: list[str]
    holds: list[str]
    breaker: dict[str, int]
    cursor: int | None
    problem: str | None
    items: list[ItemRow] = field(default_factory=list)


_RUN_COLS = (
    "run_id, journal, state, workflow, form, outcome, started_at, finished_at, done, total, running, failed, "
    "waiting, cost_usd, tokens, usage, tripped, holds, breaker, cursor, problem"
)


def _run(row: tuple[Any, ...]) -> RunRow:
    names = _RUN_COLS.split(", ")
    values = dict(zip(names, row, strict=True))
    for key in ("usage", "tripped", "holds", "breaker"):
        values[key] = json.loads(values[key])
    return RunRow(**values)


def items_of(conn: sqlite3.Connection, run_id: str) -> list[ItemRow]:
    """The items of a run, in their order."""
    rows = conn.execute("SELECT * FROM items WHERE run_id=? ORDER BY idx", (run_id,))
    return [ItemRow(*r) for r in rows]


def _with_items(conn: sqlite3.Connection, runs: list[RunRow]) -> list[RunRow]:
    return [RunRow(**{**r.__dict__, "items": items_of(conn, r.run_id)}) for r in runs]


def runs_in_progress(conn: sqlite3.Connection, workflow: str | None = None, *, items: bool = True) -> list[RunRow]:
    """The runs not finished (journals that fold), oldest journal first, with their items unless ``items=False``."""
    sql = f"SELECT {_RUN_COLS} FROM runs WHERE state='running'"  # noqa: S608 (constant fragments)
    args: tuple[Any, ...] = ()
    if workflow is not None:
        sql, args = sql + " AND workflow=?", (workflow,)
    runs = [_run(r) for r in conn.execute(sql + " ORDER BY journal", args)]
    return _with_items(conn, runs) if items else runs


def run(conn: sqlite3.Connection, run_id: str) -> RunRow | None:
    """One run with its items, or None."""
    row = conn.execute(f"SELECT {_RUN_COLS} FROM runs WHERE run_id=?", (run_id,)).fetchone()  # noqa: S608 (constant fragments)
    return None if row is None else _with_items(conn, [_run(row)])[0]


def unreadable_runs(conn: sqlite3.Connection, workflow: str | None = None) -> list[str]:
    """``file:line: why`` of each journal of a run not finished that does not fold (that run is not resumed)."""
    rows = conn.execute("SELECT workflow, problem FROM runs WHERE state='unreadable' ORDER BY journal")
    return [p for wf, p in rows if p and (workflow is None or wf == workflow)]


def finished_runs(conn: sqlite3.Connection, *, last: int | None = None, workflow: str | None = None) -> list[RunRow]:
    """Finished runs from their journals (no items), oldest first; the newest ``last`` only when given."""
    sql = f"SELECT {_RUN_COLS} FROM runs WHERE state='finished'"  # noqa: S608 (constant fragments)
    args: list[Any] = []
    if workflow is not None:
        sql += " AND workflow=?"
        args.append(workflow)
    sql += " ORDER BY finished_at DESC, run_id DESC"
    if last is not None:
        sql += " LIMIT ?"
        args.append(last)
    return [_run(r) for r in conn.execute(sql, args)][::-1]


def known_workflow_run(conn: sqlite3.Connection, workflow: str) -> bool:
    """Whether any run journal is of ``workflow``."""
    return conn.execute("SELECT 1 FROM runs WHERE workflow=? LIMIT 1", (workflow,)).fetchone() is not None


# ------------------------------------------------------------------------------------------------ run records


def records(conn: sqlite3.Connection, *, workflow: str | None = None, last: int | None = None) -> list[dict[str, Any]]:
    """Run records of ``runs.jsonl`` (the JSON objects as written), in file order; the last ``last`` only."""
    sql = "SELECT json FROM records WHERE json IS NOT NULL"
    args: list[Any] = []
    if workflow is not None:
        sql += " AND workflow=?"
        args.append(workflow)
    sql += " ORDER BY line DESC"
    if last is not None:
        sql += " LIMIT ?"
        args.append(last)
    return [json.loads(r[0]) for r in conn.execute(sql, args)][::-1]


@dataclass(frozen=True)
class RecordsRead:
    """The raw lines of ``runs.jsonl`` for a reader that parses them itself (``ambient stats``), and what was
    skipped: lines that are not JSON objects (1-based numbers) and a torn last line."""

    lines: list[str]
    bad_lines: list[int]
    torn_tail: bool


def record_lines(conn: sqlite3.Connection) -> RecordsRead:
    """Every record's JSON text in file order, the bad line numbers and whether the last line is torn."""
    texts: list[str] = []
    bad: list[int] = []
    for line, text in conn.execute("SELECT line, json FROM records ORDER BY line"):
        if text is None:
            bad.append(line)
        else:
            texts.append(text)
    torn = conn.execute("SELECT value FROM meta WHERE key='records_torn'").fetchone()
    return RecordsRead(texts, bad, torn is not None and torn[0] == "1")


def records_torn(conn: sqlite3.Connection) -> bool:
    """Whether ``runs.jsonl`` ends with a torn line (a crash mid-append)."""
    torn = conn.execute("SELECT value FROM meta WHERE key='records_torn'").fetchone()
    return torn is not None and torn[0] == "1"


@dataclass(frozen=True)
class WeekRow:
    """Runs, escalations and cost of one workflow in one ISO week (of the runs' UTC start)."""

    workflow: str
    week: str
    runs: int
    escalations: int
    cost_usd: float | None


def weeks(conn: sqlite3.Connection, workflow: str | None = None) -> list[WeekRow]:
    """Per workflow and ISO week, oldest week first: what the escalation-rate chart draws."""
    sql = (
        "SELECT workflow, week, count(*), coalesce(sum(escalations), 0), sum(cost_usd) FROM records "
        "WHERE json IS NOT NULL AND week IS NOT NULL AND workflow IS NOT NULL"
    )
    args: tuple[Any, ...] = ()
    if workflow is not None:
        sql, args = sql + " AND workflow=?", (workflow,)
    return [WeekRow(*r) for r in conn.execute(sql + " GROUP BY workflow, week ORDER BY week, workflow", args)]


def cost_today(conn: sqlite3.Connection, day: str) -> float | None:
    """What the AI agents cost on ``day`` (``2026-03-18``, UTC): runs finished that day and runs in progress;
    None when nothing reported a cost."""
    # A range on the ``records_completed`` index (``substr`` would scan every record): the texts that start with
    # ``day`` are those from ``day`` up to ``day`` followed by the highest code point.
    done = conn.execute(
        "SELECT sum(cost_usd) FROM records WHERE completed_at >= ? AND completed_at < ? AND json IS NOT NULL",
        (day, day + "\U0010ffff"),
    ).fetchone()[0]
    running = conn.execute("SELECT sum(cost_usd) FROM runs WHERE state='running'").fetchone()[0]
    if done is None and running is None:
        return None
    return float((done or 0.0) + (running or 0.0))


# ------------------------------------------------------------------------------------------------ escalations


@dataclass(frozen=True)
class EscalationRow:
    """One escalation: its indexed fields and ``data``, the whole of it (``Escalation.model_dump(mode="json")``:
    ``Escalation.model_validate(row.data)`` gives the model back)."""

    id: str
    status: str
    kind: str
    workflow: str
    agent: str | None
    run_id: str
    item: str | None
    step: str | None
    where: str
    question: str
    options: list[tuple[str, str, str]]  # key, label, action
    created_at: str
    deadline: str | None
    decision: str | None
    by: str | None
    channel: str | None
    note: str | None
    answered_at: str | None
    notified: bool
    attempts: int
    data: dict[str, Any]


def _escalation(row: tuple[Any, ...]) -> EscalationRow:
    values = list(row)
    values[10] = [tuple(o) for o in json.loads(values[10])]
    values[18] = bool(values[18])
    values[20] = json.loads(values[20])
    return EscalationRow(*values)


def escalations(
    conn: sqlite3.Connection,
    *,
    status: str | None = None,
    workflow: str | None = None,
    agent: str | None = None,
    run_id: str | None = None,
    answered: bool | None = None,
) -> list[EscalationRow]:
    """Escalations, oldest first (by creation, then id, as the store lists them), filtered by what is given;
    ``answered=True``: those not pending any more."""
    sql, args = "SELECT * FROM escalations WHERE 1", []
    for column, value in (("status", status), ("workflow", workflow), ("agent", agent), ("run_id", run_id)):
        if value is not None:
            sql += f" AND {column}=?"
            args.append(value)
    if answered is not None:
        sql += " AND status != 'pending'" if answered else " AND status = 'pending'"
    return [_escalation(r) for r in conn.execute(sql + " ORDER BY created_at, id", args)]


def escalation(conn: sqlite3.Connection, esc_id: str) -> EscalationRow | None:
    """One escalation by id, or None."""
    row = conn.execute("SELECT * FROM escalations WHERE id=?", (esc_id,)).fetchone()
    return None if row is None else _escalation(row)


def escalation_problems(conn: sqlite3.Connection) -> list[Problem]:
    """The files of ``.ambient/escalations/`` that are not escalations, by file name."""
    rows = conn.execute(
        "SELECT file, line, message, severity FROM problems WHERE kind='escalation' ORDER BY file"
    ).fetchall()
    if not rows:
        return []
    from ambient.core.problems import Problem  # a pydantic model: imported only when there is one to show

    return [Problem(file=f, line=line, message=m, severity=s) for f, line, m, s in rows]


# ------------------------------------------------------------------------------------------------ claims


@dataclass(frozen=True)
class ClaimRow:
    """One usable claim file (the first of its sess_id)."""

    file: str
    sess_id: str
    status: str
    agent: str | None
    parent: str | None
    type: str | None
    scope: str | None
    workflow: str | None
    opened_at: str | None
    closed_at: str | None
    updated: str | None
    ttl: str | None
    times: list[str]

    def facts(self) -> ClaimFacts:
        """What the stale rule reads (:meth:`ambient.claims.claim.ClaimFacts.stale_at`)."""
        from ambient.claims.claim import ClaimFacts  # the start-up time of `ambient status`: claims' models

        return ClaimFacts(self.sess_id, None, self.status, self.ttl, tuple(self.times))


# The first file of a sess_id is the claim; a later one is a problem (the claims census's rule). Constant SQL
# fragments: every value is a parameter.
_EARLIER = "EXISTS (SELECT 1 FROM claims d WHERE d.sess_id = c.sess_id AND d.file < c.file)"
_FIRST = f"NOT {_EARLIER}"


@dataclass(frozen=True)
class ClaimCounts:
    """Claims by status (the first file of each sess_id) and every problem, as the claims census gives them."""

    by_status: dict[str, int]
    problems: list[Problem]

    def count(self, *statuses: str) -> int:
        """How many usable claims have one of ``statuses``."""
        return sum(self.by_status.get(s, 0) for s in statuses)

    @property
    def unfinished(self) -> int:
        """The claims still open in the broad sense a person counts them ("Open claims" in ``ambient status`` and
        on the console's overview): open, waiting for a person, or paused."""
        return self.count("open", "waiting_human", "paused")


def claim_counts(conn: sqlite3.Connection) -> ClaimCounts:
    """Claims per status and the problems of claim files, in file order: a file that cannot be used, the
    warnings of one that can, a second file of a sess_id (ignored)."""
    by: dict[str, int] = dict(
        conn.execute("SELECT status, count(*) FROM claims WHERE sess_id IS NOT NULL GROUP BY status").fetchall()
    )
    seconds: dict[str, tuple[str, str]] = {}  # file → its sess_id and the first file of it
    rows = conn.execute(  # kept at each refresh: no probe per claim row
        "SELECT d.file, d.sess_id, d.first, c.status FROM claim_dups d JOIN claims c ON c.file = d.file"
    )
    for file, sess_id, first, status in rows:
        seconds[file] = (sess_id, first)
        by[status] -= 1
    warned = dict(conn.execute("SELECT file, problems FROM claims WHERE problems != '[]'").fetchall())
    problems: list[Problem] = []
    if warned or seconds:
        from ambient.core.problems import Problem  # a pydantic model: imported only when there is one to show
    for file in sorted(set(warned) | set(seconds)):
        if file in seconds:  # only this problem: the file is ignored, its warnings with it
            sess_id, used_by = seconds[file]
            message = f"sess_id {sess_id!r} is already used by {used_by}; this file is ignored"
            problems.append(Problem(file=file, line=1, message=message))
            continue
        for line, message, severity in json.loads(warned[file]):
            problems.append(Problem(file=file, line=line, message=message, severity=severity))
    return ClaimCounts({k: v for k, v in by.items() if v}, problems)


def claims(conn: sqlite3.Connection, statuses: Iterable[str] | None = None) -> list[ClaimRow]:
    """The usable claims (first file of each sess_id), by file; only those of ``statuses`` when given."""
    sql = (
        "SELECT file, sess_id, status, agent, parent, type, scope, workflow, opened_at, closed_at, updated, ttl, "  # noqa: S608
        f"times FROM claims c WHERE sess_id IS NOT NULL AND {_FIRST}"
    )
    args: list[str] = []
    if statuses is not None:
        args = list(statuses)
        sql += f" AND status IN ({', '.join('?' * len(args))})"
    rows = conn.execute(sql + " ORDER BY file", args)
    names = [f.name for f in fields(ClaimRow)]
    return [ClaimRow(**{**dict(zip(names, r, strict=True)), "times": json.loads(r[12])}) for r in rows]


def stale_claims(
    conn: sqlite3.Connection, now: datetime, tz: tzinfo, default_ttl: timedelta | None
) -> list[tuple[ClaimRow, datetime]]:
    """Open claims past their TTL at ``now`` (the claims rule, :meth:`ClaimFacts.stale_at`), with when."""
    out = []
    for row in claims(conn, ("open",)):
        at = row.facts().stale_at(tz, default_ttl)
        if at is not None and at <= now:
            out.append((row, at))
    return out


# ------------------------------------------------------------------------------------------------ overview


@dataclass(frozen=True)
class Overview:
    """The counts of the console's first page."""

    runs_in_progress: int
    runs_finished: int
    runs_unreadable: int
    escalations_pending: int
    escalations_answered: int
    claims_open: int
    claims_waiting: int
    claims_problems: int
    records: int
    cost_today_usd: float | None


def overview(conn: sqlite3.Connection, day: str) -> Overview:
    """Counts of runs, escalations, claims and records, and the cost of ``day`` (UTC, ``2026-03-18``)."""
    runs = dict(conn.execute("SELECT state, count(*) FROM runs GROUP BY state").fetchall())
    escs = dict(conn.execute("SELECT status='pending', count(*) FROM escalations GROUP BY 1").fetchall())
    counts = claim_counts(conn)
    n_records = conn.execute("SELECT count(*) FROM records WHERE json IS NOT NULL").fetchone()[0]
    return Overview(
        runs_in_progress=runs.get("running", 0),
        runs_finished=runs.get("finished", 0),
        runs_unreadable=runs.get("unreadable", 0),
        escalations_pending=escs.get(1, 0),
        escalations_answered=escs.get(0, 0),
        claims_open=counts.unfinished,
        claims_waiting=counts.count("waiting_human", "paused"),
        claims_problems=len(counts.problems),
        records=n_records,
        cost_today_usd=cost_today(conn, day),
    )
