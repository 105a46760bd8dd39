"""``ambient validate [PATH...]``: every problem of the brain's files as ``file:line: message``.

Exit 0 when clean, 1 when a problem was found, 2 on bad usage. Workflows are checked here in
full; agents, zones, routing and claims through the modules that own them, when they are present.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ambient.cli._common import EXIT_NO, EXIT_OK, EXIT_USAGE, add_command, brain_dir, fail, out
from ambient.errors import AmbientError
from ambient.paths import BrainPaths
from ambient.problems import Problem
from ambient.workflowload import AgentExists, MaySpawn, load_many, load_workflows, workflow_files
from ambient.zones import DEFAULT_RULES, ZoneRule

# Errors a sibling module may raise when called through the adapters below; anything else is a bug there.
_ADAPTER_ERRORS = (AmbientError, OSError, ValueError, TypeError, KeyError, AttributeError)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient validate``."""
    p = add_command(
        sub,
        "validate",
        _validate,
        help="check workflows (and agents, zones, routing, claims); print every problem as file:line: message",
        description=(
            "Check the brain's workflow files, or the files and directories named, beyond their schema: "
            "agents exist and may be spawned, trigger targets exist, no loops, no path leaving the brain. "
            "Exit 0 when clean, 1 when a problem is found, 2 on bad usage."
        ),
    )
    p.add_argument(
        "paths", nargs="*", metavar="PATH", help="workflow files or directories (default: the brain's workflows/)"
    )
    p.add_argument("--strict", action="store_true", help="count warnings as problems (exit 1)")


def _optional(module: str, name: str) -> Callable[..., Any] | None:
    """``module.name`` if that module exists and imports cleanly, else None."""
    try:
        mod = importlib.import_module(module)
    except (ImportError, SyntaxError):
        return None
    func = getattr(mod, name, None)
    return func if callable(func) else None


def _problems_in(result: Any) -> list[Problem]:
    """The Problems inside whatever a loader returned (a list, a tuple, an object with ``.problems``)."""
    if isinstance(result, Problem):
        return [result]
    if isinstance(result, list | tuple):
        return [p for item in result for p in _problems_in(item)]
    problems = getattr(result, "problems", None)
    return _problems_in(problems) if isinstance(problems, list) else []


def _brain_matrix(paths: BrainPaths) -> Any:
    """``ambient.routing.build_matrix(paths)`` (agents, zone rules, routing table), or None."""
    build = _optional("ambient.routing", "build_matrix")
    if build is None:
        return None
    try:
        return build(paths)
    except _ADAPTER_ERRORS:
        return None


def _other_checks(paths: BrainPaths, brain: Any = None) -> list[Problem]:
    """Problems of agents, zones, routing and claims, from the modules that own those files."""
    problems: list[Problem] = []
    if brain is not None:
        problems += _problems_in(brain)
    else:
        load_agents = _optional("ambient.agents", "load_agents")
        if load_agents is not None:
            try:
                problems += _problems_in(load_agents(paths))
            except _ADAPTER_ERRORS as exc:
                problems.append(Problem(file=paths.rel(paths.agents), message=f"agents could not be checked: {exc}"))
    store_class = _optional("ambient.claimstore", "ClaimStore")
    if store_class is not None and paths.claims.is_dir():
        try:
            # Read-only here: validate looks at the claims, it never sweeps or rewrites them.
            problems += _problems_in(store_class(paths, check_filesystem=False).load())
        except _ADAPTER_ERRORS as exc:
            problems.append(Problem(file=paths.rel(paths.claims), message=f"claims could not be checked: {exc}"))
    return problems


def _spawn_callbacks(paths: BrainPaths, brain: Any) -> tuple[AgentExists | None, MaySpawn | None, Iterable[ZoneRule]]:
    """agent_exists and may_spawn for :func:`check_workflow`, from the brain's agents and access matrix.

    A brain without an ``agents/`` directory (a folder of workflows alone) skips both checks.
    """
    if not paths.agents.is_dir():
        return None, None, tuple(getattr(brain, "zone_rules", DEFAULT_RULES))
    if brain is not None:
        agents = getattr(brain, "agents", None)
        matrix = getattr(brain, "matrix", None)
        rules = tuple(getattr(brain, "zone_rules", DEFAULT_RULES))
        decide = _optional("ambient.matrix", "decide")
        exists: AgentExists | None = agents.__contains__ if isinstance(agents, dict) else None
        if matrix is None or decide is None:
            return exists, None, rules

        def may_spawn(sender: str, agent: str, zone: str, files: Sequence[str]) -> str | None:
            try:
                decision = decide(matrix, sender, agent, "SPAWN", zone, files, rules)
            except _ADAPTER_ERRORS as exc:
                return f"the access matrix could not decide: {exc}"
            if getattr(decision, "allowed", False):
                return None
            reasons = getattr(decision, "reasons", ())
            return str(reasons[-1]) if reasons else "denied by the access matrix"

        return exists, may_spawn, rules
    names = {p.stem for p in paths.agents.glob("*.md")}
    return names.__contains__, None, DEFAULT_RULES


def _files_of(args: Sequence[str]) -> list[tuple[Path, str]] | str:
    """(path, name) of every workflow file named, or the message of a bad argument."""
    files: list[tuple[Path, str]] = []
    for raw in args:
        path = Path(raw)
        if path.is_dir():
            files += [(f, str(f)) for f in workflow_files(path)]
        elif path.exists() or path.is_symlink():
            files.append((path, raw))
        else:
            return f"{raw}: no such file or directory"
    return files


def _validate(args: argparse.Namespace) -> int:
    root = brain_dir(args)
    paths = BrainPaths(root)
    if not args.paths and not root.is_dir():
        return fail(f"{root} is not a directory; run in a brain or pass --brain DIR", EXIT_USAGE)
    brain = _brain_matrix(paths) if root.is_dir() else None
    agent_exists, may_spawn, rules = _spawn_callbacks(paths, brain)
    if args.paths:
        files = _files_of(args.paths)
        if isinstance(files, str):
            return fail(files, EXIT_USAGE)
        workflows, problems = load_many(files, agent_exists=agent_exists, may_spawn=may_spawn, zone_rules=rules)
    else:
        workflows, problems = load_workflows(paths, agent_exists=agent_exists, may_spawn=may_spawn, zone_rules=rules)
        problems += _other_checks(paths, brain)
    for problem in problems:
        out(str(problem))
    errors = sum(1 for p in problems if p.severity == "error")
    warnings = len(problems) - errors
    drafts = sum(1 for wf in workflows.values() if not wf.spec.runnable)
    if errors or (args.strict and warnings):
        files_hit = len({p.file for p in problems})
        out(f"{errors} error(s), {warnings} warning(s) in {files_hit} file(s)")
        return EXIT_NO
    out(f"ok: {len(workflows)} workflow(s) ({drafts} draft), {warnings} warning(s)")
    return EXIT_OK
