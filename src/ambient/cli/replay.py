"""``ambient replay WORKFLOW``: recorded runs through the current workflow file and rules, as a
dry run: which items would now be escalated, decided by a rule, or routed differently."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ambient.cli._common import EXIT_OK, add_command, brain_dir, out, out_json, say
from ambient.errors import AmbientError

if TYPE_CHECKING:  # imported in the handler, so that other commands start fast
    from ambient.learning import ReplayItem, ReplayReport, Route
    from ambient.paths import BrainPaths


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


# --- the current routing of the workflow --------------------------------------------------------


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _action_text(value: Any) -> str:
    """Exit actions as source text: strings as written, parsed action models through ``str``."""
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        return " + ".join(_action_text(v) for v in value)
    return str(value)  # the workflow's action models print their source form


def route_from_spec(spec: Any) -> Route | None:
    """The routing of a workflow spec (a parsed model or the raw YAML mapping), or ``None``.

    for_each: ``on_return.{success,fail,error}`` (ADR-027 defaults for what is absent).
    chain: ``gate: human`` asks the person, ``gate: never`` stops, else ``on_done`` (default
    ``trigger:next``) on success and ``on_fail`` (default ``signal:BLOCKED_ON``) on fail/error.
    """
    from ambient.learning import default_route, normalise_action

    for_each = _get(spec, "for_each")
    if for_each is not None:
        on_return = _get(for_each, "on_return")
        table: dict[str, str] = {}
        for key in ("success", "fail", "error"):
            value = _get(on_return, key) if on_return is not None else None
            if value is not None:
                table[key] = normalise_action(_action_text(value))

        def route_each(item: str, result: str) -> str:
            return table.get(result) or default_route(item, result)

        return route_each
    chain = _get(spec, "chain")
    if isinstance(chain, list | tuple):
        steps = {str(_get(s, "step") if _get(s, "step") is not None else i + 1): s for i, s in enumerate(chain)}

        def route_chain(item: str, result: str) -> str:
            step = steps.get(item)
            if step is None:
                return default_route(item, result)
            gate = _get(step, "gate")
            if gate == "human":
                return "escalate"
            if result == "success":
                if gate == "never":
                    return "stop"
                done = _get(step, "on_done")
                return normalise_action(_action_text(done)) if done else "next"
            if result in ("fail", "error"):
                failed = _get(step, "on_fail")
                return normalise_action(_action_text(failed)) if failed else "blocked"
            return default_route(item, result)

        return route_chain
    return None


def _named(spec: Any, name: str) -> bool:
    return name in (_get(spec, "name"), _get(spec, "workflow"))


def _from_loader(paths: BrainPaths, workflow: str) -> tuple[Any, str] | None:
    # ambient.workflowload is written by another part of the project; its shape is not assumed.
    try:
        module = importlib.import_module("ambient.workflowload")
        loaded = module.load_workflows(paths)
    except Exception:  # noqa: BLE001 - absent or different loader: fall back to reading the file
        return None
    candidates: list[Any] = []
    if isinstance(loaded, tuple) and loaded:
        loaded = loaded[0]  # (workflows, problems)
    if isinstance(loaded, Mapping):
        if workflow in loaded:
            return loaded[workflow], "workflow loader"
        candidates = list(loaded.values())
    elif isinstance(loaded, list | tuple):
        candidates = list(loaded)
    for c in candidates:
        spec = _get(c, "spec") or c
        if _named(spec, workflow):
            return spec, "workflow loader"
    return None


def _from_files(paths: BrainPaths, workflow: str) -> tuple[Any, str] | None:
    from ambient.fsutil import iter_files
    from ambient.yamlfile import MAX_WORKFLOW_BYTES, load_file

    for path in iter_files(paths.workflows, (".yml", ".yaml")):
        try:
            data, _ = load_file(path, max_bytes=MAX_WORKFLOW_BYTES)
        except AmbientError as exc:
            if path.stem == workflow:
                say(f"warning: {exc}; routing falls back to the defaults")
            continue
        if not isinstance(data, Mapping) or not (_named(data, workflow) or path.stem == workflow):
            continue
        where = paths.rel(path)
        try:
            parse = importlib.import_module("ambient.workflow").parse_workflow
            return parse(data), where
        except (ImportError, AttributeError):
            return data, f"{where} (read as YAML)"
        except AmbientError as exc:
            say(f"warning: {where}: {exc}; routing read from the raw YAML")
            return data, f"{where} (read as YAML)"
    return None


def current_route(paths: BrainPaths, workflow: str) -> tuple[Route, str]:
    """The routing of ``workflow`` as its file says today, and where it came from."""
    from ambient.learning import default_route

    for source in (_from_loader, _from_files):
        found = source(paths, workflow)
        if found is not None:
            route = route_from_spec(found[0])
            if route is not None:
                return route, found[1]
    return default_route, "no workflow file found: ADR-027 defaults (success→next, fail/error→escalate)"


# --- the command ---------------------------------------------------------------------------------


def _replay(args: argparse.Namespace) -> int:
    from ambient.cli.stats import read_note
    from ambient.clock import utcnow
    from ambient.journal import ReadResult, iter_jsonl
    from ambient.learning import parse_since, replay
    from ambient.paths import BrainPaths
    from ambient.rulestore import load_rules, rules_path

    paths = BrainPaths(brain_dir(args))
    since = parse_since(args.since, utcnow()) if args.since else None
    book, problems = load_rules(rules_path(paths))
    for p in problems:
        say(f"warning: {p}")
    route, source = current_route(paths, args.workflow)
    res = ReadResult()
    report = replay(
        iter_jsonl(paths.runs_log, res), route, book.rules, workflow=args.workflow, policy=book.policy, since=since
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
    base = f"  {i.started_at.strftime('%Y-%m-%d')} {i.run_id} {i.item} ({i.agent}, {i.result})"
    if i.change == "rerouted":
        return f"{base}: {i.recorded} -> {i.now}"
    if i.change == "rule":
        return f"{base}: rule {i.rule_id} decides {i.option!r}"
    hint = f"; rule {i.rule_id} suggests {i.option!r}" if i.rule_id else ""
    return f"{base}: {i.signature}{hint}"
