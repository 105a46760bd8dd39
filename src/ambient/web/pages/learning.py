"""``/learning``: the learning loop — escalations per run per ISO week with its trend, per workflow (the numbers of
``ambient stats``: :class:`ambient.learning.stats.StatsBuilder` over the run records of the query store, drawn by
:mod:`ambient.web.chart`), the learned rules in shadow or active with their agreements and uses, the opt-in of
automatic decisions, and the recurring errors. Actions under ``POST /rules/...`` go through
:mod:`ambient.actions.rules`, the code of ``ambient rules``.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Final

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ambient.actions.rules import accept_rule, decides_alone, forget_rule, policy_line, read_rules, set_opt_in
from ambient.core.errors import AmbientError
from ambient.learning.stats import Stats, StatsBuilder
from ambient.query import views
from ambient.storage.paths import BrainPaths
from ambient.web import chart
from ambient.web.render import redirect_back, render
from ambient.web.storethread import read

#: Recurring error signatures shown (``ambient stats --errors``'s default).
ERRORS_SHOWN: Final = 10


def stats_of(conn: sqlite3.Connection) -> tuple[Stats, views.RecordsRead]:
    """``ambient stats`` over the store's copy of ``runs.jsonl`` (same builder, same rules)."""
    read_ = views.record_lines(conn)
    builder = StatsBuilder()
    for text in read_.lines:
        value = json.loads(text)
        if isinstance(value, dict):
            builder.add(value)
    return builder.result(top_errors=ERRORS_SHOWN), read_


def _charts(stats: Stats) -> list[tuple[str, chart.Chart, int]]:
    """One chart for every workflow (and all together when there are several): (title, chart, runs)."""
    out = [(w.workflow, chart.layout(w.weeks, w.trend), w.runs) for w in stats.workflows]
    if len(stats.workflows) > 1:
        out.insert(0, ("all workflows", chart.layout(stats.weeks, stats.trend), stats.runs))
    return out


async def learning_page(request: Request) -> Response:
    paths: BrainPaths = request.app.state.paths
    stats, read_ = await read(request, stats_of)
    book, problems = await run_in_threadpool(read_rules, paths)
    workflows = sorted({w.workflow for w in stats.workflows} | {r.situation.workflow for r in book.rules})
    ad = book.auto_decide
    optin = [(w, (ad.global_ and w not in ad.exclude) or w in ad.workflows, w in ad.exclude) for w in workflows]
    rules = [(r, decides_alone(r, book)) for r in book.rules]
    return render(
        request,
        "learning.html",
        {
            "stats": stats,
            "charts": _charts(stats),
            "skipped": len(read_.bad_lines) + (1 if read_.torn_tail else 0),
            "book": book,
            "rules": rules,
            "rule_problems": [str(p) for p in problems],
            "policy": policy_line(book),
            "optin": optin,
        },
    )


async def _rule_action(request: Request, verb: str) -> Response:
    paths: BrainPaths = request.app.state.paths
    form = await request.form()
    rule_id = request.path_params["rule_id"]
    back = form.get("back") or "/learning"
    fn = accept_rule if verb == "accept" else forget_rule
    try:
        done = await run_in_threadpool(fn, paths, rule_id)
    except AmbientError as exc:
        return redirect_back(back, f"Refused, nothing changed: {exc}", ok=False)
    return redirect_back(back, done.message)


async def accept_action(request: Request) -> Response:
    """``ambient rules accept ID``."""
    return await _rule_action(request, "accept")


async def forget_action(request: Request) -> Response:
    """``ambient rules forget ID``."""
    return await _rule_action(request, "forget")


async def optin_action(request: Request) -> Response:
    """``ambient rules optin|optout --workflow W | --global`` (form: ``on`` 1/0, ``workflow`` or ``global``)."""
    paths: BrainPaths = request.app.state.paths
    form = await request.form()
    back = form.get("back") or "/learning"
    on = str(form.get("on") or "") == "1"
    workflow = str(form.get("workflow") or "").strip() or None
    if workflow is None and str(form.get("global") or "") != "1":
        return redirect_back(back, "Say which workflow (or every workflow) to opt in or out.", ok=False)
    try:
        done = await run_in_threadpool(lambda: set_opt_in(paths, on, workflow=workflow))
    except (AmbientError, ValueError) as exc:
        return redirect_back(back, f"Refused, nothing changed: {exc}", ok=False)
    text = done.message
    if done.still_deciding:
        text += f"; {len(done.still_deciding)} accepted rule(s) still decide alone ({', '.join(done.still_deciding)})"
    return redirect_back(back, text)


routes = [
    Route("/learning", learning_page, name="learning"),
    Route("/rules/optin", optin_action, methods=["POST"], name="rules_optin"),
    Route("/rules/{rule_id}/accept", accept_action, methods=["POST"], name="rules_accept"),
    Route("/rules/{rule_id}/forget", forget_action, methods=["POST"], name="rules_forget"),
]
