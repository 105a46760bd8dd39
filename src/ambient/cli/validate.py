"""``ambient validate [PATH...]``: every problem of the brain's files as ``file:line: message``.

Exit 0 when clean, 1 when a problem was found, 2 on bad usage. Workflows are checked in full with
the same callbacks the daemon uses (:func:`ambient.brain.spawn_checks`); without PATH, the
configuration, agents, zones, routing table, runners and claims are checked too. Read-only.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ambient.cli._common import EXIT_NO, EXIT_OK, EXIT_USAGE, add_command, brain_dir, fail, not_a_brain, out

if TYPE_CHECKING:
    from ambient.paths import BrainPaths
    from ambient.problems import Problem
    from ambient.routing import BrainMatrix


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient validate``."""
    p = add_command(
        sub,
        "validate",
        _validate,
        help="check workflows (and config, agents, zones, routing, claims); print every problem as file:line: message",
        description=(
            "Check the brain's workflow files, or the files and directories named, beyond their schema: "
            "agents exist and may be spawned, trigger targets exist, no loops, no path leaving the brain. "
            "Without PATH, profil/ambient.yml, agents, zones, the routing table, runners and claims are checked "
            "too. Exit 0 when clean, 1 when a problem is found, 2 on bad usage."
        ),
    )
    p.add_argument(
        "paths", nargs="*", metavar="PATH", help="workflow files or directories (default: the brain's workflows/)"
    )
    p.add_argument("--strict", action="store_true", help="count warnings as problems (exit 1)")


def _other_checks(paths: BrainPaths, bm: BrainMatrix) -> list[Problem]:
    """Problems of the configuration, agents, zones, routing, runners and claims (read-only: nothing is swept)."""
    from ambient.brain import read_settings, runner_configs, settings_checks
    from ambient.claimindex import census
    from ambient.claimstore import ClaimStore
    from ambient.settings import settings_from

    found = read_settings(paths, os.environ)
    settings = found.settings or found.salvaged or settings_from({}, {})  # what `ambient run` starts with
    problems = found.problems + bm.problems + settings_checks(settings, bm, paths, found.lines)
    _, runner_problems = runner_configs(bm, settings, paths, found.lines)
    problems += runner_problems
    if paths.claims.is_dir():  # the census: the same reader's verdicts, only changed files parsed again
        problems += census(ClaimStore(paths, check_filesystem=False), save=False).problems
    return problems


def _files_of(args: list[str]) -> list[tuple[Path, str]] | str:
    """(path, name) of every workflow file named, or the message of a bad argument."""
    from ambient.workflowload import workflow_files

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
    from ambient.brain import read_settings, spawn_checks
    from ambient.paths import BrainPaths
    from ambient.routing import build_matrix
    from ambient.workflowload import load_many, load_workflows
    from ambient.zones import DEFAULT_RULES

    root = brain_dir(args)
    paths = BrainPaths(root)
    why = None if args.paths else not_a_brain(root)
    if why is not None:
        return fail(why, EXIT_USAGE)
    bm = build_matrix(paths) if root.is_dir() else None
    rules = bm.zone_rules if bm is not None else DEFAULT_RULES
    # A folder of workflows alone (no agents/) cannot say which agents exist: both checks are skipped.
    agent_exists, may_spawn = spawn_checks(bm) if bm is not None and paths.agents.is_dir() else (None, None)
    # The step types' agents as the daemon takes them (`default_agents:` of profil/ambient.yml, even a file that
    # does not validate as a whole: the daemon keeps its valid keys).
    found = read_settings(paths, os.environ) if root.is_dir() else None
    settings = (found.settings or found.salvaged) if found is not None else None
    defaults = settings.default_agents if settings is not None else None
    if args.paths:
        files = _files_of(args.paths)
        if isinstance(files, str):
            return fail(files, EXIT_USAGE)
        workflows, problems = load_many(
            files, agent_exists=agent_exists, may_spawn=may_spawn, zone_rules=rules, default_agents=defaults
        )
    else:
        workflows, problems = load_workflows(
            paths, agent_exists=agent_exists, may_spawn=may_spawn, zone_rules=rules, default_agents=defaults
        )
        if bm is not None:
            problems += _other_checks(paths, bm)
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
