"""``ambient replay WORKFLOW``: recorded runs through the current workflow file and rules, as a
dry run: which items would now be escalated, decided by a rule, or routed differently."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from ambient.cli._common import EXIT_OK, add_command, brain_dir, out, out_json, say
from ambient.core.errors import AmbientError

if TYPE_CHECKING:  # imported in the handler, so that other commands start fast
    from ambient.learning.replay import ReplayItem, ReplayReport
    from ambient.storage.paths import BrainPaths
    from ambient.workflows.spec import WorkflowSpec


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient replay``."""
    p = add_command(
        sub,
        "replay",
        _replay,
        "dry run of recorded runs through the current workflow and rules (nothing is executed)",
    )
    p.add_argument("workflow", metavar="WORKFLOW")
    p.add_argument("--since", metavar="DATE", help="from this date: 2026-03-01, an ISO 8601 time, or 30d / 8w / 12h")
    p.add_argument("--limit", metavar="N", type=int, default=20, help="items listed per section (20; 0 = all)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def current_spec(paths: BrainPaths, workflow: str) -> tuple[WorkflowSpec | None, str]:
    """The workflow as its file says today (loaded as the daemon loads it), and where it came from."""
    from ambient.config.workflows import load_workflows

    workflows, problems = load_workflows(paths)
    found = workflows.get(workflow)
    if found is not None:
        return found.spec, found.source
    for p in problems:
        if p.severity == "error" and p.file.rsplit("/", 1)[-1].rsplit(".", 1)[0] == workflow:
            say(f"warning: {p}; replay uses ADR-027's for_each defaults")
    return None, "no workflow file loads: ADR-027 defaults (success→next, fail/error→escalate)"


def pinned_specs(paths: BrainPaths) -> Callable[[str], WorkflowSpec | None]:
    """The spec each run was pinned to, from the first line of its journal (None when the journal is gone)."""
    from ambient.storage.journal import read_first
    from ambient.workflows.spec import parse_workflow

    def pinned(run_id: str) -> WorkflowSpec | None:
        try:
            head = read_first(paths.run_journal(run_id))
            return parse_workflow(head["spec"]) if head and isinstance(head.get("spec"), dict) else None
        except (AmbientError, OSError, ValueError, KeyError):
            return None

    return pinned


# --- the command ---------------------------------------------------------------------------------


def _replay(args: argparse.Namespace) -> int:
    from ambient.cli.stats import read_note
    from ambient.config.brain import load_settings
    from ambient.core.clock import utcnow
    from ambient.learning.replay import replay
    from ambient.learning.rulestore import load_rules, rules_path
    from ambient.learning.stats import parse_since
    from ambient.storage.journal import ReadResult, iter_jsonl
    from ambient.storage.paths import BrainPaths

    paths = BrainPaths(brain_dir(args))
    since = parse_since(args.since, utcnow()) if args.since else None
    book, problems = load_rules(rules_path(paths))
    for p in problems:
        say(f"warning: {p}")
    spec, source = current_spec(paths, args.workflow)
    settings, _ = load_settings(paths, os.environ)
    res = ReadResult()
    report = replay(
        iter_jsonl(paths.runs_log, res),
        spec,
        book.rules,
        workflow=args.workflow,
        policy=book.policy,
        since=since,
        pinned=pinned_specs(paths),
        threshold=settings.breaker_threshold if settings else 3,
    )
    if args.json:
        data = report.to_json()
        data["routing"] = source
        out_json(data)
        return EXIT_OK
    out(render(report, source=source, rules=len(book.rules), limit=args.limit))
    note = read_note(paths.runs_log, res, report.invalid)
    if note:
        out(f"\nnote: {note}")
    return EXIT_OK


def render(report: ReplayReport, *, source: str, rules: int, limit: int = 20) -> str:
    """The readable replay report."""
    lines = [
        f"replay {report.workflow}: {report.runs:,} run(s), {report.steps:,} step(s), routing from {source}, "
        f"{rules} rule(s); nothing was executed",
    ]
    if report.runs == 0:
        lines.append("No recorded runs of this workflow (matching --since).")
        return "\n".join(lines)
    now_total = report.would_escalate + report.decided_by_rule
    lines.append(
        f"escalations: {report.recorded_escalations:,} recorded -> {report.would_escalate:,} now "
        f"({now_total:,} escalating steps, {report.decided_by_rule:,} decided by rules); "
        f"{report.routed_differently:,} step(s) routed differently; {report.unchanged:,} unchanged"
    )
    if report.uncompared:
        lines.append(
            f"({report.uncompared:,} run(s) without their journal in .ambient/runs/: the spec they ran with "
            "is unknown, so their steps are not compared for rerouting)"
        )
    for change, title in (
        ("escalate", "Would be escalated to you"),
        ("rule", "Would be decided by a rule"),
        ("rerouted", "Would be routed differently"),
    ):
        items = [i for i in report.items if i.change == change]
        if not items:
            continue
        lines.append("")
        lines.append(f"{title} ({len(items):,})")
        shown = items[:limit] if limit > 0 else items
        lines.extend(_item(i) for i in shown)
        if len(shown) < len(items):
            lines.append(f"  ... {len(items) - len(shown):,} more (--limit 0 shows all)")
    return "\n".join(lines)


def _item(i: ReplayItem) -> str:
    """One line: when, which run and item, its agent, then why it reaches you (a question, a failure, a gate...)
    with the agent's words, or how it is routed now."""
    head = f"  {i.started_at.strftime('%Y-%m-%d')} {i.run_id} {i.item} ({i.agent}"
    if i.change == "rerouted":
        return f"{head}, {i.result}): {i.recorded} -> {i.now}"
    base = f"{head}, {_KIND_SHOWN.get(i.kind or '', i.kind or i.result)})"
    if i.change == "rule":
        return f"{base}: rule {i.rule_id} decides {i.option!r}"
    words = "" if i.kind in ("gate", "circuit_break") else f": {i.signature}"
    hint = f"; rule {i.rule_id} suggests {i.option!r}" if i.rule_id else ""
    return f"{base}{words}{hint}"


_KIND_SHOWN = {
    "question": "its question",
    "fail": "failed",
    "error": "error",
    "blocked": "blocked",
    "gate": "human gate",
    "circuit_break": "circuit breaker",
}
