"""``/runs/{run_id}``: one run — its item grid and progress (live), a timeline of its items, a chain's steps with
their gates and exit triggers taken, each item's attempts and error, the tail of its agent's live thread, its pending
questions (answered through :mod:`ambient.actions.decide`, which is how an item is retried, skipped or aborted), and
the run record once it finished (its summary and an abridged print on the page, the whole record at
``/runs/{run_id}/record.json``: a 1,000-item run's record is ~250 KB).

The store gives the run and its items; the journal gives what the store does not keep (attempts, triggers), read by
:mod:`ambient.web.rundetail`; an agent's thread is read by :class:`ambient.live.context.LiveContext`.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ambient.live.context import LiveContext
from ambient.live.turn import Turn
from ambient.query import views
from ambient.storage.journal import read_jsonl
from ambient.storage.paths import BrainPaths
from ambient.web import rundetail, timeline
from ambient.web.filecache import FileCache
from ambient.web.render import render
from ambient.web.storethread import predictions, read

#: Newest turns of an item's agent thread shown under the item.
THREAD_TAIL: Final = 6
#: Items listed in detail (those with an error, an escalation, or more than one attempt first); the grid has all.
DETAILS_SHOWN: Final = 60
#: Entries of a list of the run record (its steps, decisions...) printed on the page; record.json has them all.
RECORD_LIST_SHOWN: Final = 5
#: Finished runs whose parsed journal is kept (per server process).
JOURNALS_KEPT: Final = 16

_journals: FileCache[dict[str, Any]] = FileCache(JOURNALS_KEPT)


@dataclass(frozen=True)
class Cell:
    """One grid cell: the item's index, name, classes and hover text."""

    index: int
    name: str
    css: str
    title: str


def titles(items: list[views.ItemRow]) -> list[str]:
    """Each item's hover text (the grid's and the timeline's), in item order."""
    return [rundetail.item_title(i.name, i.status, i.attempt, i.duration_ms, i.error) for i in items]


def cells(items: list[views.ItemRow], hover: list[str] | None = None) -> list[Cell]:
    """The item grid of a run, in item order (``hover``: :func:`titles`, when already made)."""
    hover = titles(items) if hover is None else hover
    return [Cell(i.index, i.name, rundetail.cell_class(i.status, i.gate), t) for i, t in zip(items, hover, strict=True)]


def spans(items: list[views.ItemRow], hover: list[str] | None = None) -> tuple[list[timeline.Span], int]:
    """The timeline's spans (items that started, in item order) and how many never started."""
    hover = titles(items) if hover is None else hover
    out: list[timeline.Span] = []
    never = 0
    for i, title in zip(items, hover, strict=True):
        start = rundetail.epoch(i.first_start)
        if start is None:
            never += 1
            continue
        end = rundetail.epoch(i.ended_at) if i.status not in ("running", "retry_wait", "escalated") else None
        css = rundetail.cell_class(i.status, i.gate).split()[0].removeprefix("st-")
        out.append(timeline.Span(i.name, start, end, css, title))
    return out, never


def abridged(value: Any, keep: int = RECORD_LIST_SHOWN) -> Any:
    """``value`` with every list longer than ``keep`` cut to its first ``keep`` entries and a line saying how many
    more there are: what the page prints of a run record (a 1,000-item run's steps would be ~450 KiB of it)."""
    if isinstance(value, dict):
        return {k: abridged(v, keep) for k, v in value.items()}
    if isinstance(value, list):
        head = [abridged(v, keep) for v in value[:keep]]
        return head if len(value) <= keep else [*head, f"… {len(value) - keep} more: see record.json"]
    return value


def _record_text(conn: sqlite3.Connection, run_id: str) -> str | None:
    """The run's record as written in ``runs.jsonl`` (the store's ``records`` row), once it finished."""
    row = conn.execute(
        "SELECT json FROM records WHERE run_id=? AND json IS NOT NULL ORDER BY line DESC LIMIT 1", (run_id,)
    ).fetchone()
    return None if row is None else str(row[0])


def _record(conn: sqlite3.Connection, run_id: str) -> dict[str, Any] | None:
    """:func:`_record_text`, parsed."""
    text = _record_text(conn, run_id)
    if text is None:
        return None
    value = json.loads(text)
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
        "record_shown": abridged(record) if record is not None else None,
    }


def _journal_facts(path: Path, steps: tuple[str, ...] | None) -> dict[str, Any]:
    """What the page takes from a run's journal: each item's history, the chain's declared steps, the start's
    context and trigger, the notes. Pure of the request: a finished run's is kept in :data:`_journals`."""
    res = read_jsonl(path)
    hist = rundetail.histories(res.records, list(steps) if steps is not None else None)
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
    return {
        "hist": hist,
        "declared": declared,
        "context": first.get("context") if isinstance(first.get("context"), dict) else {},
        "trigger": first.get("trigger"),
        "notes": [str(e.get("text", "")) for e in res.records if e.get("ev") == "note"][-20:],
        "torn": res.torn_tail,
    }


def _journal_data(paths: BrainPaths, run: views.RunRow) -> dict[str, Any]:
    """Attempts, triggers and thread tails from the journal and the agents' threads (none of which the store keeps)."""
    path = paths.run_journals / run.journal
    steps = tuple(i.name for i in run.items) if run.form == "chain" else None
    if run.state == "finished":
        facts = _journals.get(path, steps, lambda p: _journal_facts(p, steps))
    else:
        facts = _journal_facts(path, steps)
    hist: dict[str, rundetail.ItemHistory] = facts["hist"]
    notable = sorted(
        run.items,
        key=lambda i: (not (i.error or i.escalation or i.attempt > 1 or i.status in ("running", "failed")), i.index),
    )
    shown = notable[:DETAILS_SHOWN] if run.form != "chain" else run.items
    threads = _thread_tails(paths, run.run_id, [(i.name, hist.get(i.name)) for i in shown])
    return {**facts, "detail_items": sorted(shown, key=lambda i: i.index), "threads": threads}


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
    hover = titles(run.items) if fragment in (None, "progress", "timeline") else None
    ctx: dict[str, Any] = {**data, "pretty": _pretty, "record_list_shown": RECORD_LIST_SHOWN}
    ctx["predictions"] = await predictions(request, data["questions"])
    if fragment in (None, "progress"):
        ctx["cells"] = cells(run.items, hover)
    if fragment in (None, "timeline"):
        rows, never = spans(run.items, hover)
        ctx["tl"] = timeline.layout(rows, now=time.time(), never_started=never)
    if fragment in (None, "details", "steps"):
        ctx.update(await run_in_threadpool(_journal_data, paths, run))
    return render(request, "run.html", ctx)


async def run_record(request: Request) -> Response:
    """The run's whole record as written in ``runs.jsonl`` (JSON, not a page: nothing in it reaches markup)."""
    run_id = request.path_params["run_id"]
    text = await read(request, lambda conn: _record_text(conn, run_id))
    if text is None:
        return PlainTextResponse(f"No record of run {run_id} (it has not finished, or there is no such run).", 404)
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)[:120] or "run"
    return Response(
        text + "\n",
        media_type="application/json",
        headers={"Content-Disposition": f'inline; filename="{name}.json"'},
    )


routes = [
    Route("/runs/{run_id}/record.json", run_record, name="run_record"),
    Route("/runs/{run_id}", run_page, name="run"),
]
