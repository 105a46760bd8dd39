"""``ambient validate [PATH...]``: every problem of the brain's files as ``file:line: message``.

Exit 0 when clean, 1 when a problem was found, 2 on bad usage. Workflows are checked in full with
the same callbacks the daemon uses (:func:`ambient.config.brain.spawn_checks`); without PATH, the
configuration, agents, zones, routing table, runners and claims are checked too. A PATH is checked as
what it is by where it lives in the brain (``agents/*.md`` as an agent...): the whole-brain checks,
their problems kept for the files named. Read-only.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ambient.cli._common import EXIT_NO, EXIT_OK, EXIT_USAGE, add_command, brain_dir, fail, out, say

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ambient.config.brain import SettingsFile
    from ambient.config.settings import Settings
    from ambient.config.workflows import LoadedWorkflow
    from ambient.core.problems import Problem
    from ambient.kernel.routing_table import BrainMatrix
    from ambient.storage.paths import BrainPaths

#: Where each kind of file lives in a brain: (kind, place relative to the root, the suffixes of its files when the
#: place is a directory).
PLACES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("workflow", "workflows", (".yml", ".yaml")),
    ("agent", "agents", (".md",)),
    ("claim", "claims", (".yml", ".yaml")),
    ("config", "profil/ambient.yml", ()),
    ("routing", "profil/routing.yml", ()),
    ("zones", "profil/zones.yml", ()),
)

WHAT_VALIDATE_CHECKS = (
    "validate checks workflows/*.yml, agents/*.md, claims/*.yml, profil/ambient.yml, profil/routing.yml and "
    "profil/zones.yml of the brain (a directory: those in it; the brain itself: all of them), and workflow files "
    "outside the brain"
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient validate``."""
    p = add_command(
        sub,
        "validate",
        _validate,
        help="check workflows (and config, agents, zones, routing, claims); print every problem as file:line: message",
        description=(
            "Check the brain's files beyond their schema: workflows (agents exist and may be spawned, trigger "
            "targets exist, no loops, no path leaving the brain), profil/ambient.yml, agents and their runners, "
            "zones, the routing table and claims. A PATH is checked as what it is by where it lives (agents/*.md "
            "as an agent, profil/ambient.yml as the configuration, claims/*.yml as a claim, workflows/*.yml or a "
            "file outside the brain as a workflow; a directory: everything of its kind). Exit 0 when clean, 1 when "
            "a problem is found, 2 on bad usage."
        ),
    )
    p.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="files or directories of the brain, each checked as what it is by where it lives (default: everything)",
    )
    p.add_argument("--strict", action="store_true", help="count warnings as problems (exit 1)")


def _other_checks(
    paths: BrainPaths,
    bm: BrainMatrix,
    found: SettingsFile,
    settings: Settings,
    workflows: Mapping[str, LoadedWorkflow],
    *,
    claims: bool = True,
) -> list[Problem]:
    """Problems of the configuration, agents, zones, routing, runners (and their programs), agents the runnable
    ``workflows`` spawn that a misspelt key keeps from their part, and claims (read-only: nothing is swept);
    ``settings`` those a daemon runs with."""
    from ambient.claims.index import census
    from ambient.claims.store import ClaimStore
    from ambient.config.brain import misspelt_needs, validate_checks

    runners, checks = validate_checks(paths, bm, settings, found.lines)
    problems = found.problems + bm.problems + checks
    # At a key already said to be an error (`ambient: {runer: ...}`) nothing is added; a warning there says less.
    erred = {(p.file, p.line) for p in problems if p.severity == "error"}
    typos = [p for p in misspelt_needs(bm, runners, workflows, settings) if (p.file, p.line) not in erred]
    said = {(p.file, p.line) for p in typos}
    problems = [p for p in problems if p.severity == "error" or (p.file, p.line) not in said] + typos
    if claims and paths.claims.is_dir():  # the census: the same reader's verdicts, only changed files parsed again
        problems += census(ClaimStore(paths, check_filesystem=False), save=False).problems
    return problems


@dataclass
class Selection:
    """What the PATHs name: workflow files (path, name as given), the brain's other files by brain-relative name,
    and how many files of each kind."""

    workflows: list[tuple[Path, str]] = field(default_factory=list)
    others: set[str] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=dict)
    whole: bool = False

    def add(self, kind: str, path: Path, name: str) -> None:
        if kind == "workflow":
            self.workflows.append((path, name))
        else:
            self.others.add(name)
        self.counts[kind] = self.counts.get(kind, 0) + 1


def _files_in(kind: str, directory: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """The files of ``kind`` in a directory, as the loaders of the whole brain list them."""
    from ambient.config.workflows import workflow_files
    from ambient.storage.fsutil import iter_files

    if kind == "workflow":
        return workflow_files(directory)
    return [p for p in iter_files(directory, suffixes) if not (kind == "agent" and p.name.startswith("_"))]


def _select(raws: list[str], paths: BrainPaths) -> Selection | str:
    """What each PATH is by where it lives, or the message of a PATH that is none of what validate checks."""
    from ambient.config.workflows import workflow_files

    root = paths.root.resolve()
    sel = Selection()
    for raw in raws:
        path = Path(raw)
        if not os.path.lexists(path) and not path.is_absolute() and os.path.lexists(root / raw):
            path = root / raw  # brain-relative, as `ambient --brain DIR validate agents/x.md` from elsewhere means
        if not os.path.lexists(path):
            return f"{raw}: no such file or directory"
        plain = Path(os.path.normpath(path.absolute()))
        where = plain.parent.resolve() / plain.name  # a symlink is named, not followed
        if not where.is_relative_to(root):  # a workflow written elsewhere, before it is dropped into workflows/
            if where.is_dir():
                for f in workflow_files(where):
                    sel.add("workflow", f, str(f))
            elif where.suffix in (".yml", ".yaml"):
                sel.add("workflow", path, raw)
            else:
                return f"{raw}: not a workflow file; {WHAT_VALIDATE_CHECKS}"
            continue
        rel = where.relative_to(root)
        if rel == Path():
            sel.whole = True
            continue
        matched = False
        for kind, place, suffixes in PLACES:
            if rel == Path(place) and suffixes and where.is_dir():
                for f in _files_in(kind, where, suffixes):
                    sel.add(kind, f, str(f) if kind == "workflow" else paths.rel(f))
                sel.counts.setdefault(kind, 0)
            elif rel == Path(place) and not suffixes and not where.is_dir():
                sel.add(kind, where, place)
            elif rel.parent == Path(place) and suffixes and where.name.endswith(suffixes) and not where.is_dir():
                sel.add(kind, path, raw if kind == "workflow" else str(rel))
            elif rel == Path("profil") and not suffixes and os.path.lexists(root / place):
                sel.add(kind, root / place, place)
            else:
                continue
            matched = True
        if not matched:
            return f"{raw}: none of what validate checks; {WHAT_VALIDATE_CHECKS}"
    return sel


def _checked(sel: Selection, workflows: int, drafts: int) -> str:
    """What was checked, for the summary line: ``2 workflow(s) (0 draft), 1 agent file(s), profil/ambient.yml``."""
    parts = [f"{workflows} workflow(s) ({drafts} draft)"] if "workflow" in sel.counts or not sel.counts else []
    for kind, place, suffixes in PLACES[1:]:
        if kind in sel.counts:
            parts.append(f"{sel.counts[kind]} {kind} file(s)" if suffixes else place)
    return ", ".join(parts)


def _validate(args: argparse.Namespace) -> int:
    from ambient.config.brain import of_settings, spawn_checks, starting_settings
    from ambient.config.workflows import load_many, load_workflows
    from ambient.kernel.routing_table import build_matrix
    from ambient.storage.paths import BrainPaths

    root = brain_dir(args)  # a brain: main() refused anything else
    paths = BrainPaths(root)
    sel = _select(args.paths, paths) if args.paths else Selection(whole=True)
    if isinstance(sel, str):
        return fail(sel, EXIT_USAGE)
    bm = build_matrix(paths)
    # A folder of workflows alone (no agents/) cannot say which agents exist: both checks are skipped.
    agent_exists, may_spawn = spawn_checks(bm) if paths.agents.is_dir() else (None, None)
    # The settings as a daemon starting now takes them (a file that does not validate as a whole: its valid keys;
    # one that does not parse: the last good copy): the step types' agents (`default_agents:`), the agent user.
    found, chosen = starting_settings(paths, os.environ)
    settings = chosen.settings
    defaults = settings.default_agents
    if sel.whole:
        workflows, problems = load_workflows(
            paths, agent_exists=agent_exists, may_spawn=may_spawn, zone_rules=bm.zone_rules, default_agents=defaults
        )
        problems += _other_checks(paths, bm, found, settings, workflows)
    else:
        workflows, problems = load_many(
            sel.workflows,
            agent_exists=agent_exists,
            may_spawn=may_spawn,
            zone_rules=bm.zone_rules,
            default_agents=defaults,
        )
        if sel.others:  # the whole brain's checks, the same rule as without PATH, kept for the files named
            config = paths.rel(paths.config) in sel.others
            # An agent file named: the workflows that spawn it are the brain's, named or not.
            spawning = (
                load_workflows(paths, zone_rules=bm.zone_rules, default_agents=defaults)[0]
                if "agent" in sel.counts
                else workflows
            )
            problems += [
                p
                for p in _other_checks(paths, bm, found, settings, spawning, claims="claim" in sel.counts)
                if p.file in sel.others or (config and of_settings(p, paths.rel(paths.config)))
            ]
    # One file's problems together and in line order (checks of different kinds find them in their own order).
    problems.sort(key=lambda p: (p.file, p.line or 0))
    for problem in problems:
        out(str(problem))
    machine: list[str] = []
    if sel.whole:  # run as root: agents that could not start at all on this machine, said before the first fails
        from ambient.cli._doctor.agents import agent_user_warnings

        # On stderr, not counted: the files are fine (a brain's CI may validate them where no agent runs).
        machine = agent_user_warnings(paths.root, settings.agent_user)
        for warning in machine:
            say(f"warning: {warning}")
    errors = sum(1 for p in problems if p.severity == "error")
    warnings = len(problems) - errors
    drafts = sum(1 for wf in workflows.values() if not wf.spec.runnable)
    also = f"; {_machine_count(len(machine))} about this machine above" if machine else ""
    if errors or (args.strict and warnings):
        files_hit = len({p.file for p in problems})
        out(f"{errors} error(s), {warnings} warning(s) in {files_hit} file(s){also}")
        return EXIT_NO
    out(f"ok: {_checked(sel, len(workflows), drafts)}, {warnings} warning(s){also}")
    return EXIT_OK


def _machine_count(n: int) -> str:
    return f"{n} warning{'s' if n > 1 else ''}"
