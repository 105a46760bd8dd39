"""Loading a brain into one read-only snapshot: settings, agents, matrix, runners, workflows.

One bad file becomes a :class:`~ambient.core.problems.Problem` (file:line), never a crash: the daemon
runs with what loaded, ``ambient validate`` prints the problems, and a reload that breaks
ambient's own configuration keeps the previous snapshot (see :func:`load_brain`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from ambient.cluster.protocol import AI_ON_WORKERS, dispatch_map
from ambient.config.settings import Settings, env_paths, settings_from, settings_salvaged
from ambient.config.workflows import (
    AgentExists,
    KnownAgents,
    LoadedWorkflow,
    MaySpawn,
    agents_named,
    load_workflows,
    spawns,
)
from ambient.core.errors import InputError, RunnerConfigError
from ambient.core.problems import Problem, Severity
from ambient.core.redact import is_url
from ambient.kernel.agents import GATE_KEY_OF_RULE, RUNNER_KEY, AgentSpec, lookalike, why_absent
from ambient.kernel.matrix import Decision, decide
from ambient.kernel.routing_table import BrainMatrix, build_matrix
from ambient.runners.runner_config import CommandRunnerConfig, RunnerConfig, parse_runner_config
from ambient.storage.fsutil import PRIVATE_FILE, atomic_write, read_capped
from ambient.storage.paths import BrainPaths
from ambient.storage.yamlfile import (
    MAX_CONFIG_BYTES,
    LineMap,
    decode,
    expect_mapping,
    parse_yaml,
    problems_from_validation,
)


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
    chosen: ChosenSettings | None = None  # which settings run and why (choose_settings)

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
    lines: LineMap | None = None  # where each key is in the file
    raw: bytes | None = None  # when they validate: the bytes read (the daemon keeps them as the last good settings)


def read_settings(paths: BrainPaths, environ: Mapping[str, str]) -> SettingsFile:
    """``profil/ambient.yml`` + environment → :class:`SettingsFile`."""
    return _read_settings_file(paths.config, paths.rel(paths.config), environ)


def _read_settings_file(path: Path, source: str, environ: Mapping[str, str]) -> SettingsFile:
    """One settings file (``profil/ambient.yml`` or its last good copy) + environment → :class:`SettingsFile`."""
    data: Any = None
    lines = None
    digest = None
    raw = b""
    if path.is_file() or path.is_symlink():
        try:
            raw = read_capped(path, MAX_CONFIG_BYTES)
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
        problems = settings_problems(exc, source=source, lines=lines or LineMap(), environ=environ)
        own_salvaged = settings_salvaged(data, {}).redacted()  # what a daemon starting on this file records
        return SettingsFile(
            None, problems, digest, own_salvaged, salvaged=settings_salvaged(data, environ), lines=lines
        )
    try:
        own: dict[str, Any] | None = settings_from(data, {}).redacted()
    except ValidationError:  # a value only the environment makes valid: nothing of the file's own to show
        own = None
    return SettingsFile(settings, [], digest, own, lines=lines, raw=raw if digest is not None else None)


@dataclass(frozen=True)
class LastGood:
    """The last ``profil/ambient.yml`` a daemon loaded (its copy in ``.ambient/``), read with today's environment,
    and when it was kept."""

    file: SettingsFile
    saved_at: datetime
    source: str  # the copy's brain-relative name, for messages and ``config show``'s sources


def read_last_good(paths: BrainPaths, environ: Mapping[str, str]) -> LastGood | None:
    """The last good copy of the settings, None when there is none (no daemon ever loaded the file) or it cannot be
    read (a command run by another user than the daemon's)."""
    path = paths.last_good_config
    try:
        saved = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    except OSError:
        return None
    found = _read_settings_file(path, paths.rel(path), environ)
    if found.settings is None and found.salvaged is None:
        return None  # it does not parse either (it was written from a file that did): nothing to run on
    return LastGood(found, saved, paths.rel(path))


def keep_last_good(paths: BrainPaths, found: SettingsFile) -> bool:
    """Keep the bytes of ``profil/ambient.yml`` that just loaded as the last good settings (atomic, 0600, only when
    they changed; the copy of an absent file is removed: its defaults are what loaded). True when written."""
    path = paths.last_good_config
    if found.raw is None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return False
    try:
        if hashlib.sha256(read_capped(path, MAX_CONFIG_BYTES)).hexdigest() == found.digest:
            return False
    except OSError:
        pass  # none yet, or unreadable: write it
    atomic_write(path, found.raw, mode=PRIVATE_FILE)
    return True


#: Where the settings a daemon runs with come from (:func:`choose_settings`).
SettingsOrigin = Literal["file", "last_good", "previous", "salvaged", "defaults"]


@dataclass(frozen=True)
class ChosenSettings:
    """The settings a daemon runs with, where they come from, and the file they came from (what ``daemon.json``
    records: ``ambient doctor`` compares it with ``profil/ambient.yml``)."""

    settings: Settings
    origin: SettingsOrigin
    source: SettingsFile | None
    last_good: LastGood | None = None  # origin "last_good": the copy used


def choose_settings(
    found: SettingsFile,
    environ: Mapping[str, str],
    *,
    last_good: LastGood | None = None,
    previous: tuple[Settings, SettingsFile | None] | None = None,
) -> ChosenSettings:
    """The one rule of which settings run: the file's when they validate; else, when the file does not parse at all
    (a syntax error, unreadable, not a mapping: no key to salvage), the last good copy's; else, at a reload, the
    previous settings (the running daemon keeps them); else every key of the file that is valid; else the defaults
    (the environment applied on top of each). The daemon, ``ambient doctor`` and ``ambient config show`` use it."""
    if found.settings is not None:
        return ChosenSettings(found.settings, "file", found)
    if found.salvaged is None and last_good is not None:
        kept = last_good.file.settings or last_good.file.salvaged
        if kept is not None:
            return ChosenSettings(kept, "last_good", last_good.file, last_good)
    if previous is not None:
        return ChosenSettings(previous[0], "previous", previous[1])
    if found.salvaged is not None:
        return ChosenSettings(found.salvaged, "salvaged", found)
    # a file that does not even parse still leaves the environment's overrides (AMBIENT_NOTIFY_URLS...) in force
    return ChosenSettings(settings_salvaged(None, environ), "defaults", found)


def settings_problems(
    exc: ValidationError, *, source: str, lines: LineMap, environ: Mapping[str, str]
) -> list[Problem]:
    """The settings' validation errors, the one way every command and the daemon say them: at the file's line with
    the key a typo looks like, or naming the ``AMBIENT_*`` variable at fault; secrets masked (an input may be a URL
    holding a token)."""
    from ambient.core.redact import redact_text

    found = problems_from_validation(exc, file=source, lines=lines, model=Settings, env=env_paths(environ))
    return [p.model_copy(update={"message": redact_text(p.message)}) for p in found]


def load_settings(paths: BrainPaths, environ: Mapping[str, str]) -> tuple[Settings | None, list[Problem]]:
    """``profil/ambient.yml`` + environment → Settings; None (with problems) when it does not validate."""
    found = read_settings(paths, environ)
    return found.settings, found.problems


def spawn_checks(matrix: BrainMatrix) -> tuple[AgentExists, MaySpawn]:
    """The callbacks workflow validation uses: does an agent exist, may a sender SPAWN it here."""
    agents = matrix.agents

    def exists(name: str) -> bool:
        return name in agents or matrix.matrix.gate(name) is not None

    agent_exists = KnownAgents(agents, exists, matrix.unloaded)

    def may_spawn(sender: str, agent: str, zone: str | None, files: Sequence[str]) -> str | None:
        decision = decide(matrix.matrix, sender, agent, "SPAWN", zone, files, matrix.zone_rules)
        if decision.allowed:
            return None
        reason = decision.reasons[-1] if decision.reasons else "denied by the access matrix"
        return reason + gate_typo(matrix, decision, sender, agent)

    return agent_exists, may_spawn


def gate_typo(matrix: BrainMatrix, decision: Decision, sender: str, receiver: str) -> str:
    """`` (agents/h4.md:14: 'signal' looks like 'signals')`` after a denial made by an agent's own gate when its file
    has a key that looks like the one the gate lacks (:func:`~ambient.kernel.agents.lookalike`); '' otherwise."""
    whose = GATE_KEY_OF_RULE.get(decision.rule)
    if whose is None:
        return ""
    role, key = whose
    spec = matrix.agents.get(sender if role == "sender" else receiver)
    typo = lookalike(spec, key) if spec is not None else None
    return f" ({typo})" if typo is not None else ""


def misspelt_needs(
    matrix: BrainMatrix,
    runners: Mapping[str, RunnerConfig],
    workflows: Mapping[str, LoadedWorkflow],
    settings: Settings,
) -> list[Problem]:
    """The agents a runnable workflow spawns that could not do their part because of a misspelt key of their file:
    no runner of their own (none at all, or ``runners.default`` in place of the one written) while a key looks like
    ``ambient`` or ``runner``, or a RETURN to the workflow's sender refused by their gate while a key looks like the
    one the gate lacks (``signal:`` for ``signals:``). An error at the misspelt key's line, once per agent and key:
    every item would fail or run on another runner. The same look-alike in an agent only drafts spawn, or none,
    stays the warning of its file (a frontmatter may hold other tools' keys). docs/agents-and-runners.md, "Writing
    an agent", says this rule."""
    found: dict[tuple[str, int | None, str], Problem] = {}

    def add(typo: Problem | None, why: str, wf: LoadedWorkflow) -> None:
        if typo is not None:
            message = f"{typo.message}: without it, {why}, and workflow {wf.name} spawns it ({wf.source})"
            found.setdefault((typo.file, typo.line, typo.message), typo.model_copy(update={"message": message}))

    for wf in workflows.values():
        if not wf.spec.runnable:
            continue
        for agent in agents_named(wf, settings.default_agents):
            spec = matrix.agents.get(agent)
            if spec is not None and spec.runner is None and agent not in settings.runners:
                why = f"{agent} runs on runners.default" if agent in runners else f"{agent} has no runner"
                add(lookalike(spec, RUNNER_KEY), why, wf)
        sender = wf.spec.sender
        for agent, zone, files in spawns(wf, matrix.zone_rules, settings.default_agents):
            if agent not in matrix.agents:
                continue
            answer = decide(matrix.matrix, agent, sender, "RETURN", zone, files, matrix.zone_rules)
            whose = GATE_KEY_OF_RULE.get(answer.rule)
            if not answer.allowed and whose is not None and whose[0] == "sender":
                reason = answer.reasons[-1] if answer.reasons else answer.rule
                add(lookalike(matrix.agents[agent], whose[1]), reason, wf)
    return list(found.values())


def runner_configs(
    matrix: BrainMatrix, settings: Settings, paths: BrainPaths | None = None, lines: LineMap | None = None
) -> tuple[dict[str, RunnerConfig], list[Problem]]:
    """Runner per agent: ``ambient.runner`` in its frontmatter, else ``runners.<agent>`` in profil/ambient.yml, else
    ``runners.default`` (e.g. ``{kind: claude}``: every agent of the brain runs on its prompt, unedited).

    Each one is checked, with its file and line (``lines``: the settings file's), also a ``runners:`` entry that
    an agent's own runner overrides (a warning says it is not used). ``default`` is that key's meaning in
    ``runners:``, never an agent's name there."""
    out: dict[str, RunnerConfig] = {}
    problems: list[Problem] = []
    config = paths.rel(paths.config) if paths is not None else "profil/ambient.yml"
    own = {name for name, spec in matrix.agents.items() if spec.runner is not None}
    default: RunnerConfig | None = None
    for name, conf in settings.runners.items():
        line = lines.line_for(("runners", name)) if lines is not None else None
        parsed = _runner_config(name, conf, config, line, problems, lines=lines, prefix=("runners", name))
        if name == DEFAULT_RUNNER:
            default = parsed
            continue
        if name in own:
            problems.append(
                Problem(
                    file=config,
                    line=line,
                    message=_not_used(name) + "the agent's file has its own ambient.runner, which wins",
                    severity="warning",
                )
            )
        elif parsed is not None:
            out[name] = parsed
    for name, spec in matrix.agents.items():
        if spec.runner is not None:
            file = paths.rel(spec.path) if paths is not None else spec.path.name
            parsed = _runner_config(
                name, spec.runner, file, spec.runner_line, problems, lines=spec.lines, prefix=("ambient", "runner")
            )
            if parsed is not None:
                out[name] = parsed
    if default is not None:
        for name in matrix.agents:
            out.setdefault(name, default)
    return out, problems


#: The key of ``runners:`` that gives every agent without a runner of its own one.
DEFAULT_RUNNER = "default"


def extra_problems(
    paths: BrainPaths, matrix: BrainMatrix, runners: Mapping[str, RunnerConfig], settings: Settings
) -> list[Problem]:
    """AI runners whose optional extra is not installed: one error per agent that names the kind itself, one for
    ``runners.default`` (not one per agent it covers). ``ambient validate``, ``doctor`` and the daemon say it."""
    from ambient.runners.extras import missing_extra

    found: list[Problem] = []
    default = settings.runners.get(DEFAULT_RUNNER)
    default_kind = default.get("kind") if isinstance(default, Mapping) else None
    said_default = False
    for name, cfg in sorted(runners.items()):
        hint = missing_extra(cfg)
        if hint is None:
            continue
        spec = matrix.agents.get(name)
        own = spec is not None and spec.runner is not None
        if not own and name not in settings.runners and default_kind == cfg.kind:
            if not said_default:
                said_default = True
                found.append(Problem(file=paths.rel(paths.config), message=f"runners.default: {hint}"))
            continue
        file = paths.rel(spec.path) if own and spec is not None else paths.rel(paths.config)
        line = spec.runner_line if own and spec is not None else None
        found.append(Problem(file=file, line=line, message=f"agent {name}: {hint}"))
    return found


def program_problems(paths: BrainPaths, matrix: BrainMatrix, runners: Mapping[str, RunnerConfig]) -> list[Problem]:
    """Command runners whose program (or ``{{python}}`` script) is not there, so every spawn of the agent would fail:
    the one check ``ambient validate`` and ``ambient doctor`` both report (errors; a bare program name not on this
    PATH is a warning, since the daemon's PATH under systemd may differ)."""
    import os
    import shutil
    from pathlib import Path

    found: list[Problem] = []
    for name, cfg in sorted(runners.items()):
        if not isinstance(cfg, CommandRunnerConfig):
            continue
        spec = matrix.agents.get(name)
        file = paths.rel(spec.path) if spec is not None else paths.rel(paths.config)
        line = spec.runner_line if spec is not None else None
        cwd = paths.root if cfg.cwd is None else paths.root / cfg.cwd if not cfg.cwd.startswith("/") else Path(cfg.cwd)
        prog = cfg.argv[0]
        message = None
        severity: Severity = "error"
        if prog == "{{python}}":
            script = cfg.argv[1] if len(cfg.argv) > 1 else ""
            if script.endswith(".py") and "{{" not in script and not (cwd / script).is_file():
                message = f"agent {name}: script {script} not found in {cwd}"
        elif "/" in prog:
            target = cwd / prog
            if not (target.is_file() and os.access(target, os.X_OK)):
                message = f"agent {name}: program {prog} is missing or not executable"
        elif shutil.which(prog) is None:
            message, severity = f"agent {name}: program {prog!r} is not on this PATH", "warning"
        if message is not None:
            found.append(Problem(file=file, line=line, message=message, severity=severity))
    return found


def _runner_of(name: str) -> str:
    """How a problem of an agent's runner begins (:func:`why_no_runner` finds it again by it)."""
    return f"runner of {name}: "


def _not_used(name: str) -> str:
    """How the warning of a ``runners:`` entry the daemon does not use begins (:func:`refused_runners`)."""
    return f"runners.{name} is not used: "


def refused_runners(settings: Settings, problems: Sequence[Problem], config: str) -> dict[str, Problem]:
    """Each ``runners.<name>`` of the settings file (``config``) that the daemon does not use, with the problem that
    says why (from :func:`runner_configs`): it does not validate (an error), or the agent's own runner wins (a
    warning). ``ambient config show`` marks them instead of listing them as in effect."""
    found: dict[str, Problem] = {}
    for name in settings.runners:
        starts = (_runner_of(name), _not_used(name))
        hit = next((p for p in problems if p.file == config and p.message.startswith(starts)), None)
        if hit is not None:
            found[name] = hit
    return found


def _runner_config(
    name: str,
    mapping: Mapping[str, Any],
    file: str,
    line: int | None,
    problems: list[Problem],
    *,
    lines: LineMap | None = None,
    prefix: tuple[str, ...] = (),
) -> RunnerConfig | None:
    """The runner of agent ``name``, or None with its problems: each at the line of its key in ``lines`` (where the
    runner sits at ``prefix``), else at ``line``, the runner's."""
    try:
        return parse_runner_config(mapping, file=file, lines=lines, prefix=prefix)
    except RunnerConfigError as exc:
        for p in exc.problems:
            problems.append(Problem(file=file, line=p.line or line, message=_runner_of(name) + p.message))
    except InputError as exc:
        problems.append(Problem(file=file, line=line, message=_runner_of(name) + exc.message))
    return None


def why_no_runner(brain: Brain, name: str) -> str:
    """Why an item of agent ``name`` cannot run, the brain having no runner for it: there is no such agent (no
    file, or a file that does not load: ``kernel.agents.why_absent``), the runner it has does not validate (its
    first problem, at its file:line), or it declares none."""
    if name not in brain.matrix.agents:
        return f"agent {name!r} {why_absent(name, brain.matrix.unloaded)}"
    bad = next((p for p in brain.errors if p.message.startswith(_runner_of(name))), None)
    if bad is not None:
        return f"agent {name!r} has no runner that validates: {bad}"
    typo = lookalike(brain.matrix.agents[name], RUNNER_KEY)
    if typo is not None:
        return f"agent {name!r} has no runner: {typo}"
    return (
        f"agent {name!r} has no runner: declare `ambient: runner:` in agents/{name}.md "
        f"or `runners: {name}:` in profil/ambient.yml"
    )


def settings_checks(settings: Settings, bm: BrainMatrix, paths: BrainPaths, lines: LineMap | None) -> list[Problem]:
    """What valid settings still get wrong against this brain: a ``default_sender:`` that is no principal (every
    packet a workflow sends from it is denied at run time), Telegram answers without the chat they post to."""
    import difflib

    at = functools.partial(_config_problem, paths, lines)
    found: list[Problem] = []
    known = sorted({*bm.matrix.principals(), *bm.agents})
    name = settings.default_sender
    if name not in known:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
        hint = f"did you mean {close[0]!r}?" if close else "use ambient (the default), human or an agent's name"
        found.append(
            at(("default_sender",), f"{name!r} is no principal, so every packet a workflow sends is denied; {hint}")
        )
    for n, url in enumerate(settings.notify.urls, 1):
        if not is_url(url.get_secret_value()):
            # The value is not shown (a token may be in it); the person finds it by its place in the list.
            message = f"URL number {n} is not a URL, so nothing is ever sent to it; expected scheme://… as apprise "
            found.append(at(("notify", "urls"), message + "takes it (json://host:port/path, tgram://TOKEN/CHAT_ID…)"))
    if settings.telegram.answers and not settings.telegram.chat_id:
        found.append(
            at(("telegram", "answers"), "Telegram answers are on but telegram.chat_id is not set: nothing is sent")
        )
    return found


def cluster_checks(
    settings: Settings,
    runners: Mapping[str, RunnerConfig],
    paths: BrainPaths,
    lines: LineMap | None,
    agents: Mapping[str, AgentSpec] | None = None,
    unloaded: Mapping[str, Problem] | None = None,
) -> list[Problem]:
    """Where each agent runs, against this brain (docs/cluster.md): an agent dispatched to ``workers`` (by
    ``cluster.dispatch`` or its own ``runner: dispatch:``) that has no runner or is not ``kind: command`` (the only
    kind workers run: an AI agent's model calls go through the daemon's gateway, which holds the key and meters each
    call into the run's journal), a ``dispatch: workers`` without ``cluster:``, and the ``cluster`` extra missing."""
    import importlib.util

    at = functools.partial(_config_problem, paths, lines)
    found: list[Problem] = []
    own_line = {name: spec.dispatch_line for name, spec in (agents or {}).items() if spec.dispatch_line is not None}

    def in_agent_file(name: str, message: str) -> Problem:
        """At the agent's own ``dispatch:`` line, else at ``runners.<name>.dispatch`` of the settings."""
        if name not in own_line:
            return at(("runners", name, "dispatch"), message)
        spec = (agents or {})[name]
        return Problem(file=paths.rel(spec.path), line=own_line[name], message=f"runner of {name}: {message}")

    cluster = settings.cluster
    if cluster is None:
        return [
            in_agent_file(name, "dispatch: workers needs cluster: in profil/ambient.yml (docs/cluster.md)")
            for name, cfg in sorted(runners.items())
            if cfg.dispatch == "workers"
        ]
    if importlib.util.find_spec("nats") is None:
        found.append(at(("cluster",), "needs the cluster extra (nats-py): pip install 'ambient[cluster]'"))
    for name, where in sorted(dispatch_map(cluster.dispatch, runners).items()):
        if where != "workers":
            continue
        cfg = runners.get(name)
        own = cfg is not None and cfg.dispatch == "workers"
        if cfg is None:
            found.append(at(("cluster", "dispatch", name), _no_runner(name, agents, unloaded or {})))
        elif cfg.kind != "command":
            why = f"agent {name!r} is kind: {cfg.kind}; " + AI_ON_WORKERS.format(kind=cfg.kind)
            found.append(in_agent_file(name, why) if own else at(("cluster", "dispatch", name), why))
    return found


def _no_runner(name: str, agents: Mapping[str, AgentSpec] | None, unloaded: Mapping[str, Problem]) -> str:
    """Why a dispatched agent cannot run: there is no such agent (a typo: the agent it is close to), its file does
    not load, or it declares no runner."""
    import difflib

    if agents is not None and name not in agents:
        if name in unloaded:
            return f"agent {name!r} {why_absent(name, unloaded)}"
        close = difflib.get_close_matches(name, sorted(agents), n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"there is no agent {name!r} (no agents/{name}.md){hint}"
    return f"agent {name!r} has no runner (agents/{name}.md)"


def _config_problem(paths: BrainPaths, lines: LineMap | None, loc: tuple[str, ...], message: str) -> Problem:
    line = lines.line_for(loc) if lines is not None else None
    return Problem(file=paths.rel(paths.config), line=line, message=f"{'.'.join(loc)}: {message}")


def settings_brain_checks(
    paths: BrainPaths, bm: BrainMatrix, settings: Settings, lines: LineMap | None
) -> tuple[dict[str, RunnerConfig], list[Problem]]:
    """The settings a daemon runs with, against this brain: :func:`settings_checks`, the runner of each agent
    (:func:`runner_configs`), the extras AI runners need, where each agent runs (:func:`cluster_checks`). The daemon
    (:func:`load_brain`), ``ambient validate`` and ``ambient config show`` (:func:`validate_checks`) say the same."""
    problems = settings_checks(settings, bm, paths, lines)
    runners, runner_problems = runner_configs(bm, settings, paths, lines)
    problems += runner_problems + extra_problems(paths, bm, runners, settings)
    problems += cluster_checks(settings, runners, paths, lines, bm.agents, bm.unloaded)
    return runners, problems


def starting_settings(paths: BrainPaths, environ: Mapping[str, str]) -> tuple[SettingsFile, ChosenSettings]:
    """``profil/ambient.yml`` and the settings a daemon starting now runs with (:func:`choose_settings`: the last
    good copy when the file does not parse): what ``ambient validate`` and ``ambient config show`` read."""
    found = read_settings(paths, environ)
    last_good = None if found.settings is not None else read_last_good(paths, environ)
    return found, choose_settings(found, environ, last_good=last_good)


def validate_checks(
    paths: BrainPaths, bm: BrainMatrix, settings: Settings, lines: LineMap | None
) -> tuple[dict[str, RunnerConfig], list[Problem]]:
    """What ``ambient validate`` reports of the settings a daemon runs with (:func:`starting_settings`) beyond the
    files' own problems: :func:`settings_brain_checks` and the runners' programs. ``ambient config show`` prints
    those of the settings file (:func:`of_settings`) after the file's own, so both count the same for it."""
    runners, checks = settings_brain_checks(paths, bm, settings, lines)
    return runners, checks + program_problems(paths, bm, runners)


def of_settings(problem: Problem, config: str) -> bool:
    """A problem of the settings: at their file ``config``, or an ``AMBIENT_*`` variable's (its file ``$NAME``)."""
    return problem.file == config or problem.file.startswith("$")


def load_brain(paths: BrainPaths, environ: Mapping[str, str], previous: Brain | None = None) -> Brain:
    """Load the whole brain, its settings as :func:`choose_settings` picks them: at a reload (``previous``) invalid
    settings keep the previous snapshot's, unless the file does not parse and a last good copy exists."""
    found = read_settings(paths, environ)
    problems = list(found.problems)
    settings_ok = found.settings is not None
    last_good = None if settings_ok else read_last_good(paths, environ)
    kept = (previous.settings, previous.settings_file) if previous is not None else None
    chosen = choose_settings(found, environ, last_good=last_good, previous=kept)
    settings, source = chosen.settings, chosen.source
    bm = build_matrix(paths)
    problems += bm.problems
    runners, checks = settings_brain_checks(paths, bm, settings, found.lines)
    problems += checks
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
        # A workflow whose file broke keeps its previous good version: runs are not dropped.
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
        chosen=chosen,
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
        chosen=previous.chosen,
    )


def worker_refusals(brain: Brain, agents: Sequence[str]) -> list[str]:
    """Why this host's copy of the brain cannot run each of ``agents`` as a worker (``ambient worker`` refuses to
    start on any): an agent it does not have (with the closest name it has), one that is not ``kind: command``
    (workers run command agents only), a command whose program is not there. Empty: it can run them all."""
    import difflib

    found: list[str] = []
    known = sorted(brain.matrix.agents)
    where = brain.paths.agents
    for name in agents:
        if name not in brain.matrix.agents and name in brain.matrix.unloaded:
            found.append(f"agent {name!r} {why_absent(name, brain.matrix.unloaded)}")
            continue
        if name not in brain.matrix.agents:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" ({', '.join(known) or 'none there'})"
            found.append(f"agent {name!r}: no such agent in {where}{hint}")
            continue
        cfg = brain.runners.get(name)
        if cfg is None:
            found.append(f"agent {name!r}: it has no runner; workers run kind: command")
        elif cfg.kind in ("claude", "llm"):
            found.append(f"agent {name!r}: {AI_ON_WORKERS.format(kind=cfg.kind)}")
        elif not isinstance(cfg, CommandRunnerConfig):
            found.append(f"agent {name!r}: kind: {cfg.kind} runs on the daemon's host only; workers run kind: command")
        else:
            found += [
                p.message for p in program_problems(brain.paths, brain.matrix, {name: cfg}) if p.severity == "error"
            ]
    return found
