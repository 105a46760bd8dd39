"""``ambient status``, ``ambient runs``, ``ambient start``: what the brain is doing, read from disk.

Works whether the daemon runs or not: everything comes from the files (run journals, escalations,
locks, claims, run records), never from the daemon's memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ambient.cli._common import EXIT_NO, EXIT_OK, add_command, ambient_command, brain_dir, fail, out, out_json, say
from ambient.cli._workers import print_workers, workers_section
from ambient.core.terminal import one_line, printable

if TYPE_CHECKING:
    from ambient.query.facts import BrainFacts
    from ambient.query.views import EscalationRow, RunRow
    from ambient.storage.paths import BrainPaths


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "status", _status, "what ambient is doing: daemon, runs, escalations, locks, claims, errors")
    p.add_argument("workflow", nargs="?", help="show one workflow's runs item by item (a chain step by step)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--watch", action="store_true", help="refresh every second until interrupted")
    r = add_command(sub, "runs", _runs, "list recorded runs and their outcome")
    r.add_argument("workflow", nargs="?", help="only this workflow")
    r.add_argument("--last", type=int, metavar="N", help="only the newest N finished runs (read from the end)")
    r.add_argument("--json", action="store_true")
    s = add_command(sub, "start", _start, "start a run of a workflow now (an ORCHESTRATE packet to the daemon)")
    s.add_argument("workflow")
    s.add_argument("--step", help="chain: start at this step")
    s.add_argument("--context", help="JSON object passed to the run as context")


def _store(root: Path, *, build: bool = True) -> Any:
    """The brain's query store, refreshed now (``ambient.query``): what status and runs read instead of the files.
    ``build=False``: claims not indexed yet are left to the builder (``QueryStore.claims_indexed``)."""
    from ambient.query.store import QueryStore
    from ambient.storage.paths import BrainPaths

    return QueryStore.fresh(BrainPaths(root), build=build)


def _building(paths: BrainPaths) -> str | None:
    """How far the query store is built when a builder is to fill it in the background (``missing``: not even the
    runs yet, ``claims``: all but the claims); None when the store is ready, or the brain so small that reading it
    now is quicker (the store is then built here, as any reader does)."""
    from ambient.query.store import QueryStore

    readiness = QueryStore.readiness(paths)
    if readiness == "ready":
        return None
    if not os.access(paths.state if paths.state.is_dir() else paths.root, os.W_OK):
        return None  # a read-only .ambient/: no builder can keep a store, the reader builds one in memory
    from ambient.query.glance import FIRST_LOOK_MIN, files_to_index

    return readiness if files_to_index(paths) >= FIRST_LOOK_MIN else None


def _build_if_gathering(root: Path, data: dict[str, Any]) -> None:
    """Start the builder of the query store (unless one runs) when ``data`` says figures are being gathered: after
    the answer is written, so that the builder's start (its imports, read from disk) does not slow the answer."""
    if data.get("gathering") or data["claims"]["open"] is None:
        from ambient.query import builder
        from ambient.storage.paths import BrainPaths

        sys.stdout.flush()
        builder.start(BrainPaths(root))


def _doing_now(paths: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """What each running AI agent is doing (the daemon's ``.ambient/now.json``): (run, item) → tool, seconds."""
    import time

    from ambient.storage.paths import NOW_FILE

    try:
        rows = json.loads((paths.state / NOW_FILE).read_bytes()[:1_000_000])
    except (OSError, ValueError):
        return {}
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and isinstance(row.get("since"), int | float):
            key = (str(row.get("run_id")), str(row.get("item")))
            out[key] = {"tool": str(row.get("tool", "")), "for_s": max(0, int(time.time() - row["since"]))}
    return out


def collect(root: Path, workflow: str | None = None) -> dict[str, Any]:
    """Everything ``ambient status`` shows, as plain data; with ``workflow``, what is of that workflow only (runs,
    escalations, errors, finished runs, files that do not load)."""
    from ambient.query import views
    from ambient.query.facts import brain_facts
    from ambient.service.instance import daemon_up, running_pid
    from ambient.storage.paths import BrainPaths

    paths = BrainPaths(root)
    up = daemon_up(paths)
    doing = _doing_now(paths) if up else {}
    building = _building(paths)
    if building == "missing":
        return _first_look(paths, workflow, up)
    try:
        store = _store(root, build=building is None)
    except sqlite3.OperationalError:  # locked by the builder too long: what is cheap, and the builder goes on
        return _first_look(paths, workflow, up, indexed=None)
    try:
        indexing = None if store.claims_indexed() else store.claim_files_indexed()
        files = None if indexing is None else _claim_files(paths)
        with store.reading() as conn:
            unreadable = views.unreadable_runs(conn)
            active = views.runs_in_progress(conn, workflow)
            waiting = views.escalations(conn, status="pending", workflow=workflow)
            claims = views.claim_counts(conn)
            records = views.records(conn, last=50)  # the newest runs only: the file keeps every run ever made
        facts = brain_facts(store, os.environ, lambda: _brain_facts(paths))
    finally:
        store.close()
    records = [r for r in records if workflow in (None, r.get("workflow"))]
    broken = sorted(f for f, names in facts.broken if workflow in (None, Path(f).stem, *names))
    return {
        "brain": str(root),
        "daemon": {"up": up, "pid": running_pid(paths) if up else None},
        "troubles": _troubles(paths, up),
        **({"workers": w} if (w := workers_section(paths, up)) is not None else {}),
        "notifications": facts.notifications,
        "runs": [_run_entry(run, doing) for run in active],
        "escalations": [_escalation_entry(e) for e in waiting],
        "locks": _locks(paths),
        "claims": _claims_figure(
            claims.unfinished,
            [str(p) for p in claims.problems],
            indexing,
            files=files,
            unreadable=sum(1 for p in claims.problems if p.severity == "error"),
        ),
        "errors": _failures(records, active),
        "broken_workflows": broken,
        "unreadable_runs": unreadable,
        "recent": [_recent_entry(r) for r in records[-10:]],
    }


def _first_look(paths: BrainPaths, workflow: str | None, up: bool, *, indexed: int | None = 0) -> dict[str, Any]:
    """What ``collect`` gives while the query store is first built in the background: what is cheap to read
    (:mod:`ambient.query.glance`), and None for what is still being gathered (runs' items, escalations, claims).
    ``indexed``: how many claim files the store has read (None: not known, the store being busy)."""
    from ambient.query.glance import first_look
    from ambient.service.instance import running_pid

    look = first_look(paths)
    records = [r for r in look.records if workflow in (None, r.get("workflow"))]
    return {
        "brain": str(paths.root),
        "gathering": True,  # the query store is being built: run status again for every figure
        "daemon": {"up": up, "pid": running_pid(paths) if up else None},
        "troubles": _troubles(paths, up),
        **({"workers": w} if (w := workers_section(paths, up)) is not None else {}),
        "notifications": None,
        "runs": None,
        "run_heads": None
        if look.runs is None
        else [
            {"run_id": h.run_id, "workflow": h.workflow, "started_at": h.started_at, "total": h.total}
            for h in look.runs
            if workflow in (None, h.workflow)
        ],
        "run_journals": look.journals,
        "escalations": None,
        "escalation_files": look.escalation_files,
        "locks": _locks(paths),
        "claims": {"open": None, "problems": [], "indexing": {"indexed": indexed, "files": look.claim_files}},
        "errors": _failures(records, []),
        "broken_workflows": [],
        "unreadable_runs": [],
        "recent": [_recent_entry(r) for r in records[-10:]],
    }


def _claim_files(paths: BrainPaths) -> int:
    from ambient.claims.names import is_claim_name
    from ambient.query.glance import count_names

    return count_names(paths.claims, is_claim_name)


def _claims_figure(
    unfinished: int | None,
    problems: list[str],
    indexing: int | None,
    *,
    files: int | None = None,
    unreadable: int = 0,
) -> dict[str, Any]:
    """The claims part of the status: the open ones, or (``indexing``: how many files have their row) None while
    the claims are being indexed, with how far that went. ``problems`` are every problem (warnings too);
    ``unreadable`` counts the files that could not be read (errors): a claim read with a warning is counted open."""
    if indexing is None:
        return {"open": unfinished, "problems": problems, "unreadable": unreadable}
    return {"open": None, "problems": [], "unreadable": 0, "indexing": {"indexed": indexing, "files": files}}


def _run_entry(run: RunRow, doing: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    """A run in progress as status shows it: its row, its items, and what each running AI agent is doing now."""
    return {
        "run_id": run.run_id,
        "workflow": run.workflow,
        "form": run.form,
        "started_at": run.started_at,
        "done": run.done,
        "total": run.total,
        "running": run.running,
        "waiting": run.waiting,
        "failed": run.failed,
        "items": [
            {
                "name": i.name,
                "status": i.status,
                "attempt": i.attempt,
                "error": i.error,
                "escalation": i.escalation,
                "gate": i.gate,
                "now": doing.get((run.run_id, i.name)) if i.status == "running" else None,
            }
            for i in run.items
        ],
        "cursor": run.cursor,
        "breaker": run.breaker,
        "tripped": run.tripped,
        **run.usage,  # cost_usd, tokens, turns, models (AI agents only)
        "held": run.holds,  # per_run | daily | provider: no new agent starts
    }


def _escalation_entry(e: EscalationRow) -> dict[str, Any]:
    from ambient.core.redact import redact_text

    return {
        "id": e.id,
        "workflow": e.workflow,
        "where": e.where,
        "kind": e.kind,
        "question": redact_text(e.question),
        "options": [key for key, _, _ in e.options],
        "created_at": e.created_at,
        "notified": e.notified,
        "attempts": e.attempts,
    }


def _recent_entry(r: dict[str, Any]) -> dict[str, Any]:
    """A finished run as status lists it, from its run record."""
    return {
        "run_id": r.get("run_id"),
        "workflow": r.get("workflow"),
        "outcome": r.get("outcome"),
        "escalations": r.get("escalations"),
        "completed_at": r.get("completed_at"),
        **{k: r[k] for k in ("cost_usd", "cost_unknown") if r.get(k) is not None},
    }


def _locks(paths: BrainPaths) -> list[dict[str, Any]]:
    """The scope locks not free, with holder and expiry."""
    from ambient.claims.locks import LockManager

    locks = []
    try:
        for st in LockManager(paths, check_filesystem=False).list():
            if st.state != "free":
                locks.append(
                    {
                        "file": st.file,
                        "state": st.state,
                        "holder": st.info.holder if st.info else None,
                        "expires_at": st.info.expires_at if st.info else None,
                    }
                )
    except OSError:
        pass
    return locks


def _failures(records: list[dict[str, Any]], active: list[RunRow]) -> list[dict[str, Any]]:
    """The last ten failures: one entry per item of a run, its last error and how many attempts failed (a record
    has a step per attempt), from the newest run records and then the runs in progress. An item whose later attempt
    succeeded (a retry, the person's `retry`) is no failure any more: it is left out."""
    from ambient.core.redact import redact_text

    errors: dict[tuple[str, str], dict[str, Any]] = {}

    def failed(run_id: Any, wf: Any, item: Any, error: str, attempts: int, at: Any = None) -> None:
        key = (str(run_id), str(item))
        seen = errors.pop(key, None)
        count = attempts if seen is None else max(attempts, seen["attempts"] + 1)
        errors[key] = {"workflow": wf, "item": item, "run_id": run_id, "error": redact_text(error)[:200]}
        errors[key].update(attempts=count, at=at)

    for rec in records:
        steps = rec.get("steps", [])
        if not any(step.get("error") for step in steps):
            continue
        from ambient.engine.records import recovered  # pydantic with it: only for a record that has an error

        fine = recovered(steps)
        for step in steps:
            if step.get("error") and str(step.get("item")) not in fine:
                failed(rec.get("run_id"), rec.get("workflow"), step.get("item"), str(step["error"]), 1, step.get("at"))
    for run in active:
        for i in run.items:
            if i.error and i.status in ("failed", "escalated", "retry_wait"):
                failed(run.run_id, run.workflow, i.name, i.error, max(i.attempt, 1))
    return list(errors.values())[-10:]


def _troubles(paths: BrainPaths, up: bool) -> list[str]:
    """The daemon's own troubles (what it ran out of, :mod:`ambient.core.health`) and a full disk, seen from here."""
    from ambient.service.diskfree import disk_full

    found = []
    if up:
        from ambient.service.troubles import read_health  # the daemon's health model (pydantic): only when it runs

        found = [c.message for c in read_health(paths).conditions.values()]
    full = disk_full(paths.state if paths.state.is_dir() else paths.root)
    if full is not None and not any(m.startswith("disk full") for m in found):
        found.append(full)
    return found


def _brain_facts(paths: BrainPaths) -> BrainFacts:
    """Load the brain as the daemon does and keep what status shows of it: which workflow files it cannot run (and
    the workflow names each serves), whether notifications are configured. Kept in the query store until its files
    change (:mod:`ambient.query.facts`): loading costs a third of a second."""
    from ambient.config.brain import load_brain
    from ambient.query.facts import BrainFacts

    brain = load_brain(paths, os.environ)
    settings = brain.settings
    broken = sorted({p.file for p in brain.errors if p.file.startswith("workflows/")})
    return BrainFacts(
        notifications=bool(settings.notify.urls or settings.telegram.answers),
        broken=tuple((file, tuple(_names_in(brain, file))) for file in broken),
    )


def _names_in(brain: Any, file: str) -> list[str]:
    """The workflow names a file serves (a previous good version the daemon keeps may carry another name)."""
    return [name for name, wf in brain.workflows.items() if wf.source == file]


def print_status(
    root: Path, *, verbose: bool = False, workflow: str | None = None, write: Callable[[str], None] = out
) -> dict[str, Any]:
    """Print the status of the brain at ``root`` in readable form, one line per entry; return the data."""
    data = collect(root, workflow)
    shown = write

    def line(text: str) -> None:  # names and errors come from files: none may break its line
        shown(one_line(text))

    write = line
    d = data["daemon"]
    write(f"Daemon: {'up (pid ' + str(d['pid']) + ')' if d['up'] else 'down'}   brain: {data['brain']}")
    for trouble in data["troubles"]:
        write(f"  TROUBLE: {trouble}")
    recent = data["recent"]
    if recent:
        write("Finished runs:")
        for r in recent:
            write(
                f"  {r['workflow']:<20} {r['outcome']:<9} escalations={r['escalations']}{cost_text(r)}  {r['run_id']}"
            )
    if data.get("gathering"):
        _print_first_look(data, root, write)
        return data
    runs = data["runs"]
    write(f"Runs in progress: {len(runs)}")
    if not d["up"] and any(r["running"] for r in runs):
        write(
            "  (the daemon is down: items shown running were running when it stopped; their agents may still run, "
            "and its next start stops them and runs those items again)"
        )
    for problem in data["unreadable_runs"]:
        write(f"  NOT RESUMED: {problem}")
    for r in runs:
        bar = _bar(r["done"], r["total"])
        write(
            f"  {r['workflow']:<20} {bar} {r['done']}/{r['total']} done, {r['running']} running, "
            f"{r['waiting']} waiting on you{cost_text(r)}{_held_text(r)}  {r['run_id']}"
        )
        if not (verbose or workflow):
            for i in r["items"]:
                if i.get("now"):
                    write(f"      {i['name']}: now {_clip(i['now']['tool'], 80)} ({i['now']['for_s']} s)")
        if verbose or workflow:
            for n, i in enumerate(r["items"]):
                extra = f"  escalation {i['escalation']}" if i["escalation"] else ""
                err = f"  ({_clip(i['error'], 80)})" if i["error"] and i["status"] != "done" else ""
                here = " <-" if r["form"] == "chain" and r["cursor"] == n else ""
                write(f"      {i['name']:<24} {i['status']:<11}{extra}{err}{here}")
                if i.get("now"):
                    write(f"          now: {_clip(i['now']['tool'], 90)} ({i['now']['for_s']} s)")
            if r["tripped"]:
                write(f"      circuit breaker TRIPPED on {', '.join(r['tripped'])} (ambient preflight reset SCOPE)")
    print_workers(data, write)
    write(f"Escalations waiting on you: {len(data['escalations'])}")
    for e in data["escalations"]:
        opts = " | ".join(f"{n}. {o}" for n, o in enumerate(e["options"], 1))
        write(f"  {e['id']}  {e['where']}: {_clip(e['question'], 100)}")  # where: `workflow / item`
        write(f"      options: {opts}")
        note = ""
        if not data["notifications"]:
            note = "   (no notification URL configured: see docs/escalations-and-notifications.md#notifications)"
        elif not e["notified"]:
            note = f"   (notification not delivered yet, {e['attempts']} attempt(s))"
        write(f"      answer:  {ambient_command(root, 'decide', e['id'], '<option>')}{note}")
    _print_locks_claims_errors(data, root, write)
    broken = data["broken_workflows"]
    if broken:
        write(
            f"Workflow files that do not load: {len(broken)} ({', '.join(broken)}); "
            f"`{ambient_command(root, 'validate')}` says why"
        )
    return data


def _print_first_look(data: dict[str, Any], root: Path, write: Callable[[str], None]) -> None:
    """The rest of a status while the query store is first built: what was cheap to read, and what is not known
    yet said so."""
    heads = data["run_heads"]
    if heads is None:
        write(f"Runs in progress: being gathered ({data['run_journals']:,} run journals)")
        heads = []
    else:
        write(f"Runs in progress: {len(heads)} (their items are being gathered)")
    for h in heads:
        total = f", {h['total']} items" if h["total"] is not None else ""
        write(f"  {h['workflow'] or '?':<20} started {h['started_at'] or '?'}{total}  {h['run_id']}")
    write(f"Escalations waiting on you: being gathered ({data['escalation_files']} escalation files)")
    _print_locks_claims_errors(data, root, write)
    write(
        f"Some figures are still being gathered (the brain's index is being built in the background): "
        f"run `{ambient_command(root, 'status')}` again in a moment"
    )


def _print_locks_claims_errors(data: dict[str, Any], root: Path, write: Callable[[str], None]) -> None:
    write(f"Locks held: {len(data['locks'])}")
    for lk in data["locks"]:
        write(f"  {lk['file']}  {lk['state']}  holder={lk['holder']}  expires={lk['expires_at']}")
    claims = data["claims"]
    if claims["open"] is None:
        done = claims["indexing"]
        files = f"{done['files']:,} claim files" if done["files"] is not None else "claim files"
        read = f"{done['indexed']:,} of {files} read" if done["indexed"] is not None else files
        write(f"Open claims: being indexed ({read}); run `{ambient_command(root, 'status')}` again")
    else:
        write(
            f"Open claims: {claims['open']}"
            + (f" ({claims['unreadable']} unreadable)" if claims.get("unreadable") else "")
            + (f" ({warned} warning(s): ambient validate)" if (warned := _warned(claims)) else "")
        )
    errors = data["errors"]
    if errors:
        write("Last failures and errors:")
        for e in errors[-5:]:
            tries = f" ({e['attempts']} attempts)" if e["attempts"] > 1 else ""
            write(f"  {e['workflow']}/{e['item']}{tries}: {_clip(e['error'], 200)}")


def _warned(claims: dict[str, Any]) -> int:
    return len(claims["problems"]) - int(claims.get("unreadable") or 0)


def known_workflow(root: Path, name: str) -> bool:
    """A workflow file of that name (by file name or by its ``name:``), or a run of it in the journals."""
    from ambient.config.workflows import workflow_files

    workflows = root / "workflows"
    if any(p.stem == name for p in workflow_files(workflows)) if workflows.is_dir() else False:
        return True
    from ambient.query import views

    try:
        store = _store(root, build=False)  # the runs only: the claims of a store not built are left to the builder
    except sqlite3.OperationalError:
        return True  # locked by its builder too long: status goes on (and shows what it finds of that workflow)
    try:
        with store.reading() as conn:
            return views.known_workflow_run(conn, name)
    finally:
        store.close()


def cost_text(record: dict[str, Any]) -> str:
    """`` cost=$1.20`` for a run whose AI agents reported usage (``+?``: some of unknown cost), else nothing."""
    from ambient.engine.budget import fmt_usd

    cost = record.get("cost_usd")
    if not isinstance(cost, int | float) or isinstance(cost, bool):
        return ""
    unknown = record.get("cost_unknown")
    return f" cost={fmt_usd(float(cost))}" + ("+?" if isinstance(unknown, int) and unknown else "")


_HELD = {"per_run": "its budget", "daily": "the daily budget", "provider": "the model provider cannot be used"}


def _held_text(run: dict[str, Any]) -> str:
    held = [_HELD.get(h, h) for h in run.get("held") or ()]
    return f" HELD: {', '.join(held)}" if held else ""


def _bar(done: int, total: int, width: int = 20) -> str:
    filled = int(width * done / total) if total else width
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _clip(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis when it was longer."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _status(args: argparse.Namespace) -> int:
    root = brain_dir(args)
    if args.workflow and not known_workflow(root, args.workflow):
        return fail(f"no workflow named {args.workflow!r}: no file in {root / 'workflows'} and no run recorded")
    if args.json:
        data = collect(root, args.workflow)
        out_json(data)
        _build_if_gathering(root, data)
        return EXIT_OK
    if args.watch:
        try:
            while True:
                lines: list[str] = []
                data = print_status(root, verbose=True, workflow=args.workflow, write=lines.append)
                # Our clear-screen sequence, then the lines escaped like out() does (agent text: ambient.core.terminal).
                sys.stdout.write("\x1b[2J\x1b[H" + printable("\n".join(lines)) + "\n")
                sys.stdout.flush()
                _build_if_gathering(root, data)
                time.sleep(1.0)
        except KeyboardInterrupt:
            return EXIT_OK
    _build_if_gathering(root, print_status(root, workflow=args.workflow))
    return EXIT_OK


def _runs(args: argparse.Namespace) -> int:
    from ambient.query import views

    root = brain_dir(args)
    if args.last is not None and args.last < 1:
        return fail(f"--last must be 1 or more (got {args.last})")
    store = _store(root)
    try:
        with store.reading() as conn:
            rows = views.records(conn, workflow=args.workflow, last=args.last)
            # The torn last line is told when the whole file was read (not for the newest N of every workflow).
            torn = views.records_torn(conn) and not (args.last is not None and args.workflow is None)
            active = views.runs_in_progress(conn, args.workflow, items=False)
    finally:
        store.close()
    if args.workflow and not rows and not active and not known_workflow(root, args.workflow):
        return fail(f"no workflow named {args.workflow!r}: no file in {root / 'workflows'} and no run recorded")
    if args.json:
        out_json(
            {"finished": rows, "active": [{"run_id": s.run_id, "workflow": s.workflow, **s.usage} for s in active]}
        )
        return EXIT_OK
    from ambient.engine.records import is_failure

    for r in rows:
        done, total, unit = _done_of(r)
        failed = sum(1 for s in r.get("steps") or () if isinstance(s, dict) and is_failure(s))
        out(
            one_line(
                f"{str(r.get('completed_at', ''))[:19]:<19}  {r.get('workflow', '')!s:<20} {r.get('outcome', '')!s:<9} "
                f"{done}/{total} {unit} done  escalations={r.get('escalations', 0)} failed={failed} "
                f"errors={r.get('errors', 0)}{cost_text(r)}  {r.get('run_id')}"
            )
        )
    for s in active:
        cost = cost_text(s.usage)
        out(one_line(f"{'(running)':<19}  {s.workflow!s:<20} {'running':<9} {s.done}/{s.total} done{cost}  {s.run_id}"))
    if torn:
        out("(the last record was torn by a crash and is ignored)")
    if not rows and not active:
        out(f"no runs of {args.workflow} recorded yet" if args.workflow else "no runs recorded yet")
    return EXIT_OK


def _done_of(record: dict[str, Any]) -> tuple[int, int, str]:
    """Items (or steps) done out of the run's, from a run record: counted by item, never by attempt (a retried
    item is one item). Records of older versions lack the totals: their steps' items stand in."""
    unit = "steps" if record.get("form") == "chain" else "items"
    if isinstance(record.get("total"), int) and isinstance(record.get("done"), int):
        return record["done"], record["total"], unit
    last: dict[str, Any] = {}
    for step in record.get("steps", []):
        last[str(step.get("item"))] = step.get("result")
    return sum(1 for r in last.values() if r == "success"), len(last), unit


def _start(args: argparse.Namespace) -> int:
    from ambient.actions.start import parse_context, start
    from ambient.storage.paths import BrainPaths

    context = parse_context(args.context)
    if isinstance(context, str):
        return fail(context.replace("the context", "--context", 1))
    result = start(BrainPaths(brain_dir(args)), args.workflow, step=args.step, context=context)
    for warning in result.warnings:
        say(f"warning: {warning}")
    if result.kind == "denied":
        return fail(result.message, EXIT_NO)
    if result.kind == "refused":
        return fail(result.message)
    out(result.message)
    return EXIT_OK
