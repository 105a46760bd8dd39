"""``/workflows``: each workflow file with its problems (``file:line: message``, as the daemon and ``ambient
validate`` find them: :func:`ambient.config.brain.load_brain`), when it starts by itself (file first seen, schedule),
its last runs, and a start form; ``POST /workflows/{name}/start`` asks the daemon through
:func:`ambient.actions.start.start`, the code of ``ambient start``.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from typing import Any, Final

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ambient.actions.start import parse_context, start
from ambient.config.brain import load_brain
from ambient.config.workflows import workflow_files
from ambient.core.problems import Problem
from ambient.query import views
from ambient.storage.paths import BrainPaths
from ambient.web.render import redirect_back, render
from ambient.web.storethread import read
from ambient.workflows.spec import ChainWorkflow, ForEachWorkflow

#: Finished runs listed per workflow (the newest).
LAST_RUNS: Final = 6


@dataclass
class WorkflowEntry:
    """One file of ``workflows/``: its name (the workflow's, else the file's stem), what it is, its problems."""

    file: str
    name: str
    loaded: bool
    form: str | None = None
    description: str | None = None
    status: str | None = None
    schedule_s: float | None = None
    steps: list[str] = field(default_factory=list)
    items: str | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return sum(1 for p in self.problems if p.severity == "error")

    @property
    def starts(self) -> str:
        """When it starts a run by itself, in words (the rule of :func:`ambient.workflows.triggers.start_due`)."""
        if not self.loaded:
            return "never while its file has errors"
        if self.status == "draft":
            return "never by itself (draft): only when started here or with `ambient start`"
        return "once when its file is first seen" + (", then on its schedule" if self.schedule_s else "")


def entries(paths: BrainPaths) -> list[WorkflowEntry]:
    """Every workflow file, loaded as the daemon loads it, with the problems of that file."""
    brain = load_brain(paths, os.environ)
    by_source = {wf.source: wf for wf in brain.workflows.values()}
    out = []
    for path in workflow_files(paths.workflows):
        source = paths.rel(path)
        wf = by_source.get(source)
        problems = [p for p in brain.problems if p.file == source]
        if wf is None:
            out.append(WorkflowEntry(source, path.stem, False, problems=problems))
            continue
        spec = wf.spec
        entry = WorkflowEntry(
            source,
            spec.name,
            True,
            form=spec.form,
            description=spec.description,
            status=spec.status,
            schedule_s=spec.schedule.every if spec.schedule is not None else None,
            problems=problems,
        )
        if isinstance(spec, ChainWorkflow):
            entry.steps = [s.key for s in spec.chain]
        elif isinstance(spec, ForEachWorkflow):
            fe = spec.for_each
            entry.items = f"{len(fe.items)} item(s), agent {fe.spawn}" + (
                f", {fe.concurrency} at once" if fe.concurrency else ""
            )
        out.append(entry)
    return out


def _runs(conn: sqlite3.Connection, names: list[str]) -> dict[str, dict[str, Any]]:
    return {
        n: {
            "running": views.runs_in_progress(conn, n, items=False),
            "finished": views.finished_runs(conn, last=LAST_RUNS, workflow=n)[::-1],
        }
        for n in names
    }


async def workflows_page(request: Request) -> Response:
    paths: BrainPaths = request.app.state.paths
    found = await run_in_threadpool(entries, paths)
    runs = await read(request, lambda conn: _runs(conn, [e.name for e in found]))
    return render(request, "workflows.html", {"workflows": found, "runs": runs})


async def start_action(request: Request) -> Response:
    """Start a run now (context JSON, a chain's step); refusals read like ``ambient start``'s."""
    paths: BrainPaths = request.app.state.paths
    form = await request.form()
    name = request.path_params["name"]
    back = form.get("back") or "/workflows"
    typed = str(form.get("context") or "")
    step = str(form.get("step") or "").strip() or None
    kept = {"start": name, "context": typed, "step": step or ""}  # a refusal gives the form back as it was typed
    context = parse_context(typed)
    if isinstance(context, str):
        return redirect_back(
            back, f"Refused, {name} not started: {context}", ok=False, keep_form=kept, anchor=f"wf-{name}"
        )
    outcome = await run_in_threadpool(lambda: start(paths, name, step=step, context=context))
    if not outcome.ok:
        verdict = "Denied" if outcome.kind == "denied" else "Refused"
        return redirect_back(
            back, f"{verdict}, {name} not started: {outcome.message}", ok=False, keep_form=kept, anchor=f"wf-{name}"
        )
    text = outcome.message + "".join(f" (warning: {w})" for w in outcome.warnings)
    return redirect_back(back, text)


routes = [
    Route("/workflows", workflows_page, name="workflows"),
    Route("/workflows/{name}/start", start_action, methods=["POST"], name="start"),
]
