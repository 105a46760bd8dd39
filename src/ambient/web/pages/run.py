"""``/runs/{run_id}``: one run — its item grid and progress (live), a timeline of its items, a chain's steps with
their gates and exit triggers taken, each item's attempts and error, the tail of its agent's live thread, its pending
questions (answered through :mod:`ambient.actions.decide`, which is how an item is retried, skipped or aborted), and
the run record once it finished.

The store gives the run and its items; the journal gives what the store does not keep (attempts, triggers), read by
:mod:`ambient.web.rundetail`; an agent's thread is read by :class:`ambient.live.context.LiveContext`.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Any, Final

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ambient.live.context import LiveContext
from ambient.live.turn import Turn
from ambient.query import views
from ambient.storage.journal import read_jsonl
from ambient.storage.paths import BrainPaths
from ambient.web import rundetail, timeline
from ambient.web.render import render
from ambient.web.store import read

#: Newest turns of an item's agent thread shown under the item.
THREAD_TAIL: Final = 6
#: Items listed in detail (those with an error, an escalation, or more than one attempt first); the grid has all.
DETAILS_SHOWN: Final = 60


@dataclass(frozen=True)
class Cell:
    """One grid cell: the item's index, name, classes and hover text."""

    index: int
    name: str
    css: str
    title: str


def cells(items: list[views.ItemRow]) -> list[Cell]:
    """The item grid of a run, in item order."""
    return [
        Cell(
            i.index,
            i.name,
            rundetail.cell_class(i.status, i.gate),
            rundetail.item_title(i.name, i.status, i.attempt, i.duration_ms, i.error),
        )
        for i in items
    ]


def spans(items: list[views.ItemRow]) -> tuple[list[timeline.Span], int]:
    """The timeline's spans (items that started, in item order) and how many never started."""
    out: list[timeline.Span] = []
    never = 0
    for i in items:
        start = rundetail.epoch(i.first_start)
        if start is None:
            never += 1
            continue
        end = rundetail.epoch(i.ended_at) if i.status not in ("running", "retry_wait", "escalated") else None
        css = rundetail.cell_class(i.status, i.gate).split()[0].removeprefix("st-")
        out.append(
            timeline.Span(
                i.name, start, end, css, rundetail.item_title(i.name, i.status, i.attempt, i.duration_ms, i.error)
            )
        )
    return out, never


def _record(conn: sqlite3.Connection, run_id: str) -> dict[str, Any] | None:
    """The run's record in ``runs.jsonl`` (the store's ``records`` row), once it finished."""
    row = conn.execute(
        "SELECT json FROM records WHERE run_id=? AND json IS NOT NULL ORDER BY line DESC LIMIT 1", (run_id,)
    ).fetchone()
    if row is None:
        return None
    value = json.loads(row[0])
    return value if isinstance(value, dict) else None


def _store_data(conn: sqlite3.Connection, run_id: str) -> dict[str, Any]:
    run = views.run(conn, run_id)
    if run is None:
        return {"run": None}
    record = _record(conn, run_id) if run.state == "finished" else None
    return {
        "run": run,
        "questions": views.escalations(conn, run_id=run_id, status="pending"),
        "record": record,
    }


def _journal_data(paths: BrainPaths, run: views.RunRow) -> dict[str, Any]:
    """Attempts, triggers and thread tails from the journal and the agents' threads (none of which the store keeps)."""
    res = read_jsonl(paths.run_journals / run.journal)
    steps = [i.name for i in run.items] if run.form == "chain" else None
    hist = rundetail.histories(res.records, steps)
    first = res.records[0] if res.records else {}
    spec = first.get("spec")
    chain = spec.get("chain") if isinstance(spec, dict) else None
    chain_steps: list[Any] = chain if isinstance(chain, list) else []
    declared: dict[str, dict[str, Any]] = {}
    for s in chain_steps:
        if isinstance(s, dict):
            declared[str(s.get("step"))] = {
                "gate": s.get("gate"),
                **{k: s.get(k) for k in ("on_done", "on_partial", "on_fail") if s.get(k) is not None},
            }
    notable = sorted(
        run.items,
        key=lambda i: (not (i.error or i.escalation or i.attempt > 1 or i.status in ("running", "failed")), i.index),
    )
    shown = notable[:DETAILS_SHOWN] if run.form != "chain" else run.items
    threads = _thread_tails(paths, run.run_id, [(i.name, hist.get(i.name)) for i in shown])
    return {
        "hist": hist,
        "declared": declared,
        "detail_items": sorted(shown, key=lambda i: i.index),
        "threads": threads,
        "context": first.get("context") if isinstance(first.get("context"), dict) else {},
        "trigger": first.get("trigger"),
        "notes": [str(e.get("text", "")) for e in res.records if e.get("ev") == "note"][-20:],
        "torn": res.torn_tail,
    }


def _thread_tails(
    paths: BrainPaths, run_id: str, items: list[tuple[str, rundetail.ItemHistory | None]]
) -> dict[str, list[Turn]]:
    """Each item's newest turns in its agent's thread (turns whose correlation is one of the item's attempts)."""
    live = LiveContext(paths)
    by_agent: dict[str, list[Turn]] = {}
    out: dict[str, list[Turn]] = {}
    for name, h in items:
        agent = h.agent if h is not None else None
        if not agent:
            continue
        if agent not in by_agent:
            try:
                by_agent[agent] = live.view(agent).turns
            except (OSError, ValueError):
                by_agent[agent] = []
        prefix = f"{run_id}/{name}/"
        mine = [t for t in by_agent[agent] if (t.correlation_id or "").startswith(prefix)]
        if mine:
            out[name] = mine[-THREAD_TAIL:]
    return out


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


async def run_page(request: Request) -> Response:
    paths: BrainPaths = request.app.state.paths
    run_id = request.path_params["run_id"]
    data = await read(request, lambda conn: _store_data(conn, run_id))
    run: views.RunRow | None = data["run"]
    if run is None:
        return render(request, "run_missing.html", {"run_id": run_id}, status_code=404)
    fragment = request.query_params.get("fragment")
    ctx: dict[str, Any] = {**data, "cells": cells(run.items), "pretty": _pretty}
    if fragment in (None, "timeline"):
        rows, never = spans(run.items)
        ctx["tl"] = timeline.layout(rows, now=time.time(), never_started=never)
    if fragment in (None, "details", "steps"):
        ctx.update(await run_in_threadpool(_journal_data, paths, run))
    return render(request, "run.html", ctx)


routes = [Route("/runs/{run_id}", run_page, name="run")]
