"""``ambient stats``: success rates, durations, escalations, recurring errors, and the weekly
escalation rate with its trend (the headline measure of the learning loop)."""

from __future__ import annotations

import argparse
import gc
import json
import os
import threading
from typing import TYPE_CHECKING, Any

from ambient.cli._common import EXIT_OK, add_command, brain_dir, out, out_json

if TYPE_CHECKING:  # imported in the handlers, so that other commands start fast
    from collections.abc import Callable
    from datetime import datetime
    from pathlib import Path

    from ambient.learning.stats import CostStats, Stats, StatsBuilder, Trend, WeekStats
    from ambient.storage.journal import ReadResult
    from ambient.storage.paths import BrainPaths


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient stats``."""
    p = add_command(
        sub,
        "stats",
        _stats,
        "run statistics: success, durations, escalation rate per week and its trend, recurring errors",
    )
    p.add_argument("--workflow", metavar="W", help="only runs of this workflow")
    p.add_argument("--agent", metavar="A", help="only runs (and steps) of this agent")
    p.add_argument("--since", metavar="DATE", help="from this date: 2026-03-01, an ISO 8601 time, or 30d / 8w / 12h")
    p.add_argument("--weeks", metavar="N", type=int, default=8, help="weeks shown in the escalation-rate table (8)")
    p.add_argument("--errors", metavar="N", type=int, default=10, help="recurring error signatures shown (10)")
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.add_argument(
        "--calls",
        metavar="N",
        type=int,
        nargs="?",
        const=20,
        help="the newest N model calls (20), one line each with its cost, from the run journals",
    )


PARALLEL_MIN_BYTES = 8 * 1024 * 1024  # below this, one process is faster than forking workers
_BLOCK = 4 * 1024 * 1024


def summarise_file(
    path: Path,
    *,
    workflow: str | None = None,
    agent: str | None = None,
    since: datetime | None = None,
    top_errors: int = 20,
    workers: int | None = None,
) -> tuple[Stats, ReadResult]:
    """Summarise a ``runs.jsonl`` file: lines are parsed as plain dicts (no model per line).

    A large file is split at line boundaries into one chunk per CPU, summarised in forked worker
    processes and merged (JSON parsing is the cost; 100,000 lines take well under 2 s). A torn
    last line and corrupt lines are skipped and reported in the :class:`ReadResult`.
    """
    from ambient.learning.stats import StatsBuilder
    from ambient.storage.journal import ReadResult

    filters = (workflow, agent, since)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return StatsBuilder(workflow=workflow, agent=agent, since=since).result(top_errors=top_errors), ReadResult()
    n = workers if workers is not None else min(_cpus(), 4, max(1, size // PARALLEL_MIN_BYTES))
    # fork is safe only without other threads (a lock held by another thread would stay held).
    if n > 1 and threading.active_count() == 1 and hasattr(os, "fork"):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        bounds = _chunk_bounds(path, size, n)
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(len(bounds), mp_context=ctx) as pool:
            parts = list(pool.map(_summarise_range, [(path, a, b, filters) for a, b in bounds]))
    else:
        paused = gc.isenabled()
        gc.disable()  # no cycles are built here; the collector only slows the parsing down
        try:
            parts = [_summarise_range((path, 0, size, filters))]
        finally:
            if paused:
                gc.enable()
    builder, res, seen = parts[0][0], ReadResult(), 0
    for i, (part, lines, bad, torn) in enumerate(parts):
        if i:
            builder.merge(part)
        res.bad_lines.extend(seen + line for line in bad)
        res.torn_tail = res.torn_tail or torn
        seen += lines
    return builder.result(top_errors=top_errors), res


def summarise_store(
    paths: BrainPaths,
    *,
    workflow: str | None = None,
    agent: str | None = None,
    since: datetime | None = None,
    top_errors: int = 20,
) -> tuple[Stats, ReadResult]:
    """Summarise the run records kept by the query store (``ambient.query``: ``runs.jsonl`` read once, from where
    it was read up to): the same figures as :func:`summarise_file`, with the same lines skipped."""
    from ambient.learning.stats import StatsBuilder
    from ambient.query import views
    from ambient.query.store import QueryStore
    from ambient.storage.journal import ReadResult

    store = QueryStore.fresh(paths)
    try:
        with store.reading() as conn:
            read = views.record_lines(conn)
    finally:
        store.close()
    builder = StatsBuilder(workflow=workflow, agent=agent, since=since)
    loads = json.loads
    paused = gc.isenabled()
    gc.disable()  # no cycles are built here; the collector only slows the parsing down
    try:
        for text in read.lines:
            builder.add(loads(text))
    finally:
        if paused:
            gc.enable()
    return builder.result(top_errors=top_errors), ReadResult(torn_tail=read.torn_tail, bad_lines=read.bad_lines)


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _chunk_bounds(path: Path, size: int, n: int) -> list[tuple[int, int]]:
    """``n`` byte ranges that start at line starts and cover the file."""
    starts = [0]
    with path.open("rb") as fh:
        for i in range(1, n):
            fh.seek(size * i // n)
            fh.readline()  # a line belongs to the chunk where it starts
            pos = fh.tell()
            if starts[-1] < pos < size:
                starts.append(pos)
    return list(zip(starts, [*starts[1:], size], strict=True))


def _summarise_range(
    job: tuple[Path, int, int, tuple[str | None, str | None, datetime | None]],
) -> tuple[StatsBuilder, int, list[int], bool]:
    """Summarise the lines in ``[start, end)``: (builder, lines seen, bad line numbers in the range, torn tail)."""
    from ambient.learning.stats import StatsBuilder

    path, start, end, (workflow, agent, since) = job
    builder = StatsBuilder(workflow=workflow, agent=agent, since=since)
    add = builder.add
    # The C scanner straight on str lines: no per-line encoding detection (json.loads on bytes
    # does that), about a quarter faster; json.loads settles anything the fast path refuses.
    scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
    lines = 0
    bad: list[int] = []
    torn = False
    with path.open("rb") as fh:
        fh.seek(start)
        left = end - start
        rest = b""
        while left > 0:
            block = fh.read(min(_BLOCK, left))
            if not block:
                break
            left -= len(block)
            chunk = rest + block
            cut = chunk.rfind(b"\n") + 1
            rest = chunk[cut:]
            for raw in _text_lines(chunk[:cut]):
                lines += 1
                try:
                    rec, stop = scan(raw, 0)
                    if stop != len(raw) and raw[stop:].strip():
                        raise ValueError("trailing data")
                except StopIteration:
                    if not raw.strip():
                        continue
                    try:
                        rec = json.loads(raw)
                    except ValueError:
                        bad.append(lines)
                        continue
                except ValueError:
                    bad.append(lines)
                    continue
                if type(rec) is dict:
                    add(rec)
                else:
                    bad.append(lines)
        if rest:  # no final newline: a crash mid-append (journal.iter_jsonl's rule)
            lines += 1
            torn = True
    return builder, lines, bad, torn


def _text_lines(chunk: bytes) -> list[str]:
    """The lines of a block that ends with a newline, decoded; a line that is not UTF-8 stays
    undecodable (it becomes a bad line, as with json.loads)."""
    try:
        return chunk.decode("utf-8").split("\n")[:-1]
    except UnicodeDecodeError:
        out = []
        for raw in chunk.split(b"\n")[:-1]:
            try:
                out.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                out.append("\x00")  # not JSON: counted as a corrupt line
        return out


def read_note(path: Path, res: ReadResult, invalid: int = 0) -> str | None:
    """A line about what had to be skipped while reading, or ``None``."""
    parts = []
    if res.torn_tail:
        parts.append("a torn last line (crash mid-write)")
    if res.bad_lines:
        shown = ", ".join(str(n) for n in res.bad_lines[:5]) + (", ..." if len(res.bad_lines) > 5 else "")
        parts.append(f"{len(res.bad_lines)} corrupt line(s) (line {shown})")
    if invalid:
        parts.append(f"{invalid} record(s) that are not valid run records")
    return f"{path}: skipped " + "; ".join(parts) if parts else None


def _stats(args: argparse.Namespace) -> int:
    from ambient.core.clock import utcnow
    from ambient.learning.stats import parse_since
    from ambient.storage.paths import BrainPaths

    paths = BrainPaths(brain_dir(args))
    if args.calls is not None:
        return _calls(paths, args)
    since = parse_since(args.since, utcnow()) if args.since else None
    stats, res = summarise_store(
        paths, workflow=args.workflow, agent=args.agent, since=since, top_errors=max(0, args.errors)
    )
    note = read_note(paths.runs_log, res, stats.invalid)
    if args.json:
        data = stats.to_json()
        data["skipped"] = {"torn_tail": res.torn_tail, "bad_lines": res.bad_lines, "invalid": stats.invalid}
        out_json(data)
        return EXIT_OK
    out(render(stats, weeks=max(1, args.weeks), errors=max(0, args.errors), source=paths.rel(paths.runs_log)))
    if note:
        out(f"\nnote: {note}")
    return EXIT_OK


def _calls(paths: Any, args: argparse.Namespace) -> int:
    """``--calls N``: each model call with what it cost, as its run's journal recorded it."""
    from dataclasses import asdict

    from ambient.engine.journals import model_calls

    calls = model_calls(paths, last=max(0, args.calls), workflow=args.workflow, agent=args.agent)
    if args.json:
        out_json({"calls": [asdict(c) for c in calls]})
        return EXIT_OK
    if not calls:
        out("No model calls recorded.")
        return EXIT_OK
    rows = [
        [
            c.at[:19].replace("T", " "),
            c.run_id,
            c.item,
            c.agent,
            c.model,
            str(c.input_tokens),
            str(c.output_tokens),
            str(c.cache_read_tokens),
            "-" if c.cost_usd is None else f"${c.cost_usd:.4f}",
            "cut short" if c.partial else "",
        ]
        for c in calls
    ]
    header = ["AT (UTC)", "RUN", "ITEM", "AGENT", "MODEL", "IN", "OUT", "CACHE READ", "COST", ""]
    for line in _table(header, rows, right={5, 6, 7, 8}):
        out(line.rstrip())
    total = sum(c.cost_usd or 0.0 for c in calls)
    out(f"\n{len(calls)} call(s), ${total:.4f} in all")
    return EXIT_OK


# --- rendering ---------------------------------------------------------------------------------


def fmt_duration_ms(ms: float | None) -> str:
    """``850ms``, ``12.4s``, ``3m12s``, ``1h02m``, ``2d03h``; ``-`` when unknown."""
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms:.0f}ms"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.1f}%"


def _secs(s: float | None) -> str:
    return "-" if s is None else fmt_duration_ms(s * 1000)


def _trend(t: Trend) -> str:
    if t.direction == "unknown" or t.slope_per_week is None:
        return "n/a (one week)"
    return f"{t.direction} ({t.slope_per_week:+.3f}/week)"


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        cells = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)]
        lines.append("  ".join(cells).rstrip())
    return lines


def render(stats: Stats, *, weeks: int = 8, errors: int = 10, source: str = "runs.jsonl") -> str:
    """The readable report of ``ambient stats``."""
    if stats.runs == 0:
        return f"No runs recorded yet in {source} (matching the filters)."
    lines: list[str] = []
    first = stats.first_started.strftime("%Y-%m-%d") if stats.first_started else "?"
    last = stats.last_started.strftime("%Y-%m-%d") if stats.last_started else "?"
    lines.append(f"{stats.runs:,} runs from {first} to {last} ({source})")
    lines.append("")
    lines.append("Workflows")
    rows = [
        [
            w.workflow,
            f"{w.runs:,}",
            _pct(w.success_rate),
            fmt_duration_ms(w.duration_p50_ms),
            fmt_duration_ms(w.duration_p95_ms),
            f"{w.escalations:,}",
            "-" if w.escalation_rate is None else f"{w.escalation_rate:.3f}",
            f"{w.failures:,}",
            f"{w.errors:,}",
            f"{w.decisions:,}",
            f"{w.auto_decisions:,}",
            _secs(w.decision_p50_s),
            _secs(w.decision_p95_s),
        ]
        for w in stats.workflows
    ]
    header = ["WORKFLOW", "RUNS", "SUCCESS", "P50", "P95", "ESC", "ESC/RUN", "FAILED", "ERRORS", "DECIDED", "AUTO"]
    lines += _table([*header, "TTD P50", "TTD P95"], rows, set(range(1, 13)))
    lines.append("")
    lines.append("Agents")
    rows = [
        [
            a.agent,
            f"{a.steps:,}",
            _pct(a.success_rate),
            fmt_duration_ms(a.duration_p50_ms),
            fmt_duration_ms(a.duration_p95_ms),
            f"{a.escalations:,}",
            f"{a.failures:,}",
            f"{a.errors:,}",
        ]
        for a in stats.agents
    ]
    lines += _table(["AGENT", "STEPS", "SUCCESS", "P50", "P95", "ESC", "FAILED", "ERRORS"], rows, set(range(1, 8)))
    lines.append("")
    shown = [w.week for w in stats.weeks][-weeks:]
    lines.append(f"Escalations per run, by ISO week (last {len(shown)}; '.' = no runs that week)")
    rows = []
    for w in stats.workflows:
        rows.append([w.workflow, *_week_cells(w.weeks, shown), _trend(w.trend)])
    if len(stats.workflows) > 1:
        rows.append(["(all)", *_week_cells(stats.weeks, shown), _trend(stats.trend)])
    lines += _table(["WORKFLOW", *shown, "TREND"], rows, set(range(1, len(shown) + 1)))
    lines.append("")
    lines.append("ESC counts the escalations that reached you; those a learned rule decided alone are AUTO, beside.")
    lines.append("TREND is fitted over every week selected (--since narrows it). TTD = time you took to decide")
    lines.append("an escalation; DECIDED counts every decision, AUTO those taken by a learned rule (a deadline that")
    lines.append("passed decided nothing: `timeouts` in --json). FAILED: business failures (exit 1, status failed);")
    lines.append("ERRORS: exit 2+, the agent's ERROR, output that is not its protocol.")
    if stats.cost is not None or stats.models:
        lines.append("")
        lines += render_cost(stats, weeks=weeks)
    if errors and stats.errors:
        lines.append("")
        lines.append("Recurring failures and errors (numbers, ids, paths and quoted values normalised)")
        rows = [
            [
                f"{e.count:,}",
                e.last_seen.strftime("%Y-%m-%d %H:%M"),
                _where(e.workflows, e.agents),
                e.signature,
            ]
            for e in stats.errors[:errors]
        ]
        lines += _table(["COUNT", "LAST SEEN", "WHERE", "SIGNATURE"], rows, {0})
    return "\n".join(lines)


def fmt_tokens(n: int) -> str:
    """``950``, ``12.4k``, ``3.1M``."""
    if n < 1000:
        return str(n)
    if n < 1_000_000:
        return f"{n / 1000:.1f}k"
    return f"{n / 1_000_000:.1f}M"


def _cost_cells(c: CostStats | None) -> list[str]:
    if c is None:
        return ["-"] * 7
    unknown = c.unknown_cost == c.steps
    cost = "?" if unknown else f"${c.cost_usd:,.2f}" + ("+?" if c.unknown_cost else "")
    return [
        cost,
        fmt_tokens(c.input_tokens),
        fmt_tokens(c.output_tokens),
        fmt_tokens(c.cache_read_tokens),
        fmt_tokens(c.cache_write_tokens),
        f"{c.turns:,}",
        f"{c.steps:,}",
    ]


def render_cost(stats: Stats, *, weeks: int = 8) -> list[str]:
    """The cost section: per workflow, per agent and per ISO week (only what reported usage: AI agents)."""
    head = ["COST", "INPUT", "OUTPUT", "CACHE RD", "CACHE WR", "TURNS", "STEPS"]
    right = set(range(1, 8))
    lines: list[str] = []
    if stats.cost is not None:
        lines.append("Cost of AI agents (tokens in and out, cache read and written; '+?': some steps had no price)")
        rows = [[w.workflow, *_cost_cells(w.cost)] for w in stats.workflows if w.cost is not None]
        if len(rows) > 1:
            rows.append(["(all)", *_cost_cells(stats.cost)])
        lines += _table(["WORKFLOW", *head], rows, right)
        lines.append("")
        rows = [[a.agent, *_cost_cells(a.cost)] for a in stats.agents if a.cost is not None]
        lines += _table(["AGENT", *head], rows, right)
        lines.append("")
        rows = [[w.week, *_cost_cells(w.cost)] for w in stats.weeks[-weeks:] if w.cost is not None]
        lines += _table(["WEEK", *head], rows, right)
    if stats.models:
        if lines:
            lines.append("")
        lines.append("Model calls through ambient's gateway (REFUSED: not sent, a budget was reached)")
        rows = [
            [
                m.agent,
                m.model,
                f"{m.calls:,}",
                fmt_tokens(m.input_tokens),
                fmt_tokens(m.output_tokens),
                fmt_tokens(m.cache_read_tokens),
                fmt_tokens(m.cache_write_tokens),
                ("?" if m.cost_unknown == m.calls and m.calls else f"${m.cost_usd:,.2f}")
                + ("+?" if 0 < m.cost_unknown < m.calls else ""),
                f"{m.refused:,}",
            ]
            for m in stats.models
        ]
        head = ["AGENT", "MODEL", "CALLS", "INPUT", "OUTPUT", "CACHE RD", "CACHE WR", "COST", "REFUSED"]
        lines += _table(head, rows, set(range(2, 9)))
    unknown = stats.cost.unknown_cost if stats.cost is not None else 0
    if unknown:
        lines.append(
            f"{unknown:,} step(s) of unknown cost (a model without a price): their tokens are counted, their cost"
            " is not; the figures marked '+?' are lower bounds (`price:` in the runner sets one)."
        )
    return lines


def _week_cells(weeks: list[WeekStats], shown: list[str]) -> list[str]:
    by = {w.week: w for w in weeks}
    return [f"{by[wk].rate:.2f}" if wk in by else "." for wk in shown]


def _where(workflows: list[str], agents: list[str]) -> str:
    def one(names: list[str]) -> str:
        return names[0] if len(names) == 1 else f"{names[0]}+{len(names) - 1}"

    return f"{one(workflows)}/{one(agents)}"
