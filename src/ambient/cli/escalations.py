"""``ambient escalations`` (what waits for you) and ``ambient decide ID OPTION`` (answer one).

Exit codes of ``decide``: 0 decided (on disk, where the daemon applies it); 1 already settled (answered
elsewhere, expired or cancelled: a negative answer, like a lock held by another); 2 unknown id, option not offered or
bad input; 3 its run ended before the answer (nothing can apply it: the question is closed, saying so); 4 failed (the
answer could not be written: nothing was decided, try again). A refused answer changes nothing.
"""

from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ambient.cli._common import EXIT_NO, EXIT_OK, add_command, ambient_command, brain_dir, fail, out, out_json, say
from ambient.core.clock import utcnow
from ambient.core.terminal import one_line
from ambient.storage.paths import BrainPaths

EXIT_RUN_ENDED = 3  # decide: the escalation's run ended before the answer; nothing applied it
EXIT_FAILED = 4  # decide: the answer could not be written (nothing was decided)

if TYPE_CHECKING:  # imported in the handlers: every `ambient` command builds the parser, few need these
    from ambient.human.escalation_store import EscalationStore
    from ambient.human.escalations import Escalation


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``escalations`` and ``decide`` commands."""
    p = add_command(sub, "escalations", _cmd_list, help="list the escalations waiting for your decision")
    p.add_argument("--all", action="store_true", help="also show answered, expired and cancelled ones")
    p.add_argument("--json", action="store_true", help="print JSON (the stored fields) for scripts")

    d = add_command(
        sub,
        "decide",
        _cmd_decide,
        help="answer an escalation",
        description="Answer an escalation with one of its options, by name or by number. Exit codes: 0 decided, "
        "1 already answered/expired/cancelled, 2 unknown id or option not offered, 3 its run ended before the answer "
        "(not applied; the question is closed), 4 failed (the answer could not be written; try again). "
        "A refused answer changes nothing.",
    )
    d.add_argument("id", metavar="ID", help="escalation id, e.g. esc-k3x9qa (the 'esc-' prefix is optional)")
    d.add_argument("option", metavar="OPTION", help="option name (retry, approve...) or its number in the list")
    d.add_argument("--note", metavar="TEXT", help="a note kept with the decision")


def _store(args: argparse.Namespace) -> EscalationStore:
    from ambient.human.escalation_store import EscalationStore

    return EscalationStore(BrainPaths(brain_dir(args)))


def _cmd_list(args: argparse.Namespace) -> int:
    from ambient.query import views
    from ambient.query.store import QueryStore

    paths = BrainPaths(brain_dir(args))
    store = QueryStore.fresh(paths)  # the query store: only the files that changed are read
    try:
        with store.reading() as conn:
            problems = views.escalation_problems(conn)
            rows = views.escalations(conn, status=None if args.all else "pending")
    finally:
        store.close()
    for problem in problems:  # a hand-edited file gone wrong is shown, never hidden or deleted
        say(f"warning: {problem}")
    if not rows:  # what a wait polls for most often: said without building the models
        if args.json:
            out_json([])
        else:
            out("No pending escalations." if not args.all else "No escalations.")
        return EXIT_OK
    from ambient.human.escalations import Escalation  # pydantic models: only to print them

    escs = [Escalation.model_validate(e.data) for e in rows]
    said = _predictions(paths, escs)
    if args.json:
        out_json([e.data | ({"prediction": said[e.id]} if e.id in said else {}) for e in rows])
        return EXIT_OK
    now = utcnow()
    for i, esc in enumerate(escs):
        if i:
            out()
        _print_one(esc, now, paths.root, said.get(esc.id))
    return EXIT_OK


def _predictions(paths: BrainPaths, escs: list[Escalation]) -> dict[str, str]:
    """What learned rules would choose, by escalation; a broken rules file never hides a question (none then)."""
    if not escs:  # nothing to predict: the rules and their imports (the runners' package) stay unread
        return {}
    from ambient.core.errors import AmbientError
    from ambient.learning.rulestore import escalation_predictions, rules_path

    try:
        return escalation_predictions(rules_path(paths), escs)
    except (AmbientError, OSError) as exc:
        say(f"warning: learned rules not read: {exc}")
        return {}


def _print_one(esc: Escalation, now: datetime, root: Path, prediction: str | None = None) -> None:
    from ambient.human.escalations import render_options

    who = f", agent {esc.agent}" if esc.agent else ""
    # Every field comes from a file an agent's words reach: each line is made one line (ambient.core.terminal.one_line).
    out(one_line(f"{esc.id}  {esc.where}  ({esc.kind}{who}, {_ago(now, esc.created_at)})"))
    for line in esc.question.strip().splitlines() or [""]:
        out(one_line(f"    {line}"))
    if esc.status != "pending":
        by = "timeout" if esc.channel == "timeout" else f"{esc.by} via {esc.channel}"
        settled = f"  {esc.status}: {esc.decision or '-'} by {by}" if esc.decision else f"  {esc.status}"
        out(one_line(settled + (f" ({esc.note})" if esc.note else "")))
        if esc.unapplied:
            out(one_line(f"  not applied: {esc.unapplied}"))
        return
    for line in render_options(esc):
        out(one_line(f"  {line}"))
    if prediction:
        out(one_line(f"  {prediction}"))
    if esc.deadline is not None:
        then = f", then {esc.on_timeout}" if esc.on_timeout else ""
        out(f"  deadline: {esc.deadline.isoformat(timespec='seconds')} ({_until(now, esc.deadline)}{then})")
    out(f"  answer: {ambient_command(root, 'decide', esc.id, '<number or name>', '[--note TEXT]')}")


def _cmd_decide(args: argparse.Namespace) -> int:
    from ambient.actions.decide import decide

    paths = BrainPaths(brain_dir(args))
    try:
        result = decide(paths, args.id, args.option, channel="cli", note=args.note)
    except Exception as exc:  # noqa: BLE001 - a failure must never exit 1, which says "already answered"
        return fail(f"{args.id}: the answer failed ({exc!r}); nothing was decided, try again", EXIT_FAILED)
    if result.kind == "settled":
        return fail(result.message, EXIT_NO)
    if result.kind == "ended":
        return fail(result.message, EXIT_RUN_ENDED)
    if result.kind == "failed":
        return fail(result.message, EXIT_FAILED)
    if result.kind == "refused":  # unknown id, option not offered, bad input: exit 2
        return fail(result.message)
    out(result.message)
    from ambient.service.instance import daemon_up

    if not daemon_up(paths):  # the run still shows the item waiting until a daemon applies the answer
        out("The daemon is down: the run goes on with this answer when it starts (`ambient run`, or its service).")
    return EXIT_OK


def _duration(seconds: float) -> str:
    from ambient.actions.people import short_duration

    return short_duration(seconds)


def _ago(now: datetime, then: datetime) -> str:
    return f"{_duration(max(0.0, (now - then).total_seconds()))} ago"


def _until(now: datetime, then: datetime) -> str:
    delta = (then - now).total_seconds()
    return f"in {_duration(delta)}" if delta >= 0 else f"passed {_duration(-delta)} ago"
