"""Loading a brain into one read-only snapshot: settings, agents, matrix, runners, workflows.

One bad file becomes a :class:`~ambient.problems.Problem` (file:line), never a crash: the daemon
runs with what loaded, ``ambient validate`` prints the problems, and a reload that breaks
ambient's own configuration keeps the previous snapshot (see :func:`load_brain`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ambient.errors import InputError
from ambient.fsutil import read_capped
from ambient.matrix import decide
from ambient.paths import BrainPaths
from ambient.problems import Problem
from ambient.routing import BrainMatrix, build_matrix
from ambient.runners.base import RunnerConfig, RunnerConfigError, parse_runner_config
from ambient.settings import Settings, settings_from, settings_salvaged
from ambient.workflowload import AgentExists, LoadedWorkflow, MaySpawn, load_workflows
from ambient.yamlfile import MAX_CONFIG_BYTES, LineMap, decode, expect_mapping, parse_yaml, problems_from_validation


@dataclass
class Brain:
    """Everything the daemon needs from the brain's files, loaded once per (re)load."""

    paths: BrainPaths
    settings: Settings
    matrix: BrainMatrix
    workflows: dict[str, LoadedWorkflow]
    runners: dict[str, RunnerConfig]
    problems: list[Problem] = field(default_factory=list)
    settings_ok: bool = True
    settings_file: SettingsFile | None = None  # the file the settings came from (the last good one)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]


@dataclass(frozen=True)
class SettingsFile:
    """What ``profil/ambient.yml`` gave: the settings (None when they do not validate), the problems, the sha256
    of the bytes read (None without a file) and the file's own values, secrets masked (what a running daemon
    records so that ``ambient doctor`` can tell when the file changed under it)."""

    settings: Settings | None
    problems: list[Problem]
    digest: str | None = None
    own: dict[str, Any] | None = None
    salvaged: Settings | None = None  # when they do not validate: every key that does (settings_salvaged)


def read_settings(paths: BrainPaths, environ: Mapping[str, str]) -> SettingsFile:
    """``profil/ambient.yml`` + environment → :class:`SettingsFile`."""
    source = paths.rel(paths.config)
    data: Any = None
    lines = None
    digest = None
    if paths.config.is_file() or paths.config.is_symlink():
        try:
            raw = read_capped(paths.config, MAX_CONFIG_BYTES)
            digest = hashlib.sha256(raw).hexdigest()
            data, lines = parse_yaml(decode(raw, source=source), source=source)
            if data is not None:
                data = expect_mapping(data, source=source, what="the configuration")
        except OSError as exc:
            return SettingsFile(None, [Problem(file=source, message=f"cannot be read: {exc.strerror}")], digest)
        except InputError as exc:
            return SettingsFile(None, [Problem(file=exc.file or source, line=exc.line, message=exc.message)], digest)
    try:
        settings = settings_from(data, environ)
    except ValidationError as exc:
        problems = problems_from_validation(exc, file=source, lines=lines or LineMap())
        return SettingsFile(None, problems, digest, salvaged=settings_salvaged(data, environ))
    try:
        own: dict[str, Any] | None = settings_from(data, {}).redacted()
    except ValidationError:  # a value only the environment makes valid: nothing of the file's own to show
        own = None
    return SettingsFile(settings, [], digest, own)


def load_settings(paths: BrainPaths, environ: Mapping[str, str]) -> tuple[Settings | None, list[Problem]]:
    """``profil/ambient.yml`` + environment → Settings; None (with problems) when it does not validate."""
    found = read_settings(paths, environ)
    return found.settings, found.problems


def spawn_checks(matrix: BrainMatrix) -> tuple[AgentExists, MaySpawn]:
    """The callbacks workflow validation uses: does an agent exist, may a sender SPAWN it here."""
    agents = matrix.agents

    def agent_exists(name: str) -> bool:
        return name in agents or matrix.matrix.gate(name) is not None

    def may_spawn(sender: str, agent: str, zone: str | None, files: Sequence[str]) -> str | None:
        decision = decide(matrix.matrix, sender, agent, "SPAWN", zone, files, matrix.zone_rules)
        if decision.allowed:
            return None
        return decision.reasons[-1] if decision.reasons else "denied by the access matrix"

    return agent_exists, may_spawn


def runner_configs(matrix: BrainMatrix, settings: Settings) -> tuple[dict[str, RunnerConfig], list[Problem]]:
    """Runner per agent: ``ambient.runner`` in its frontmatter, else ``runners.<agent>`` in profil/ambient.yml."""
    out: dict[str, RunnerConfig] = {}
    problems: list[Problem] = []
    sources: dict[str, tuple[Mapping[str, Any], str, int | None]] = {}
    for name, conf in settings.runners.items():
        sources[name] = (conf, "profil/ambient.yml", None)
    for name, spec in matrix.agents.items():
        if spec.runner is not None:
            sources[name] = (spec.runner, str(spec.path.name), spec.runner_line)
    for name, (mapping, file, line) in sources.items():
        try:
            out[name] = parse_runner_config(mapping, file=file)
        except RunnerConfigError as exc:
            for p in exc.problems:
                problems.append(Problem(file=file, line=line or p.line, message=f"runner of {name}: {p.message}"))
        except InputError as exc:
            problems.append(Problem(file=file, line=line, message=f"runner of {name}: {exc.message}"))
    return out, problems


def load_brain(paths: BrainPaths, environ: Mapping[str, str], previous: Brain | None = None) -> Brain:
    """Load the whole brain. Invalid settings fall back to the previous snapshot's; without one (a daemon starting,
    a command), to every key of the file that is valid, the others at their defaults."""
    found = read_settings(paths, environ)
    settings, problems = found.settings, list(found.problems)
    settings_ok = settings is not None
    source: SettingsFile | None = found
    if settings is None:
        if previous is not None:
            settings, source = previous.settings, previous.settings_file
        else:
            settings, source = found.salvaged or settings_from({}, {}), None
    bm = build_matrix(paths)
    problems += bm.problems
    runners, runner_problems = runner_configs(bm, settings)
    problems += runner_problems
    agent_exists, may_spawn = spawn_checks(bm)
    workflows, wf_problems = load_workflows(
        paths,
        agent_exists=agent_exists,
        may_spawn=may_spawn,
        zone_rules=bm.zone_rules,
        default_agents=settings.default_agents,
    )
    problems += wf_problems
    if previous is not None:
        # A workflow whose file broke keeps its previous good version (issue 4): runs are not dropped.
        broken = {p.file for p in wf_problems if p.severity == "error"}
        for name, old in previous.workflows.items():
            if name not in workflows and old.source in broken:
                workflows[name] = old
    return Brain(
        paths=paths,
        settings=settings,
        matrix=bm,
        workflows=workflows,
        runners=runners,
        problems=problems,
        settings_ok=settings_ok,
        settings_file=source,
    )


def reload_workflows(previous: Brain) -> Brain:
    """Only ``workflows/`` changed: re-read the workflows against the loaded agents, matrix and settings.

    A third of a full reload's cost: a dropped workflow file reaches its first SPAWN sooner.
    """
    bm = previous.matrix
    agent_exists, may_spawn = spawn_checks(bm)
    workflows, wf_problems = load_workflows(
        previous.paths,
        agent_exists=agent_exists,
        may_spawn=may_spawn,
        zone_rules=bm.zone_rules,
        default_agents=previous.settings.default_agents,
    )
    broken = {p.file for p in wf_problems if p.severity == "error"}
    for name, old in previous.workflows.items():
        if name not in workflows and old.source in broken:
            workflows[name] = old
    wf_files = {w.source for w in previous.workflows.values()} | {p.file for p in wf_problems}
    kept = [p for p in previous.problems if p.file not in wf_files and not p.file.startswith("workflows/")]
    return Brain(
        paths=previous.paths,
        settings=previous.settings,
        matrix=bm,
        workflows=workflows,
        runners=previous.runners,
        problems=kept + wf_problems,
        settings_ok=previous.settings_ok,
        settings_file=previous.settings_file,
    )
