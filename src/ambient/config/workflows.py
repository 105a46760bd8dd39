"""Loading workflow files from disk into specs, every fault a ``file:line`` :class:`Problem`.

A file that fails is reported and never half-loaded; semantic checks (agents, access matrix,
cross-workflow triggers) take callbacks so the daemon and ``ambient validate`` share them.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from ambient.core.errors import InputError, WorkflowError, YamlError
from ambient.core.problems import Problem, Severity
from ambient.engine.compile import workflow_issues
from ambient.kernel.agents import why_absent
from ambient.kernel.zones import DEFAULT_RULES, ZoneRule
from ambient.storage.fsutil import read_capped
from ambient.storage.paths import BrainPaths
from ambient.storage.yamlfile import (
    MAX_DEPTH,
    MAX_WORKFLOW_BYTES,
    PARSE_BUDGET_S,
    EventReader,
    LineMap,
    decode,
    parse_yaml,
    problems_from_validation,
)
from ambient.workflows import templating
from ambient.workflows.checks import cross_targets, raw_key_issues
from ambient.workflows.exit_actions import SpawnAction, format_action
from ambient.workflows.spec import (
    MAX_ITEMS,
    MAX_WORKFLOW_VALUES,
    ChainWorkflow,
    ForEachWorkflow,
    WorkflowSpec,
    form_model,
    parse_workflow,
    spec_hash,
)
from ambient.workflows.variables import spec_item_values, spec_step_values

WORKFLOW_SUFFIXES = (".yml", ".yaml")

AgentExists = Callable[[str], bool]


class KnownAgents:
    """The brain's agents as an :data:`AgentExists` check, with the names a misspelt agent is matched against
    (``did you mean 'checker'?``, as key typos are) and the agent files that do not load (said with their cause,
    not as missing)."""

    def __init__(
        self, names: Iterable[str], exists: Callable[[str], bool], unloaded: Mapping[str, Problem] | None = None
    ) -> None:
        self.names = sorted(names)
        self._exists = exists
        self.unloaded: Mapping[str, Problem] = unloaded or {}

    def __call__(self, name: str) -> bool:
        return self._exists(name)


def _did_you_mean(name: str, agent_exists: AgentExists) -> str:
    """``; did you mean 'x'?`` when ``agent_exists`` knows the names and one is close to ``name``."""
    import difflib

    names = agent_exists.names if isinstance(agent_exists, KnownAgents) else []
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    return f"; did you mean {close[0]!r}?" if close else ""


# may_spawn(sender, agent, zone, files) -> None when allowed, else the reason of the denial.
MaySpawn = Callable[[str, str, str | None, Sequence[str]], str | None]


@dataclass(frozen=True)
class LoadedWorkflow:
    """A workflow file that passed every check: its spec, where it came from, and its pinned hash."""

    spec: WorkflowSpec
    path: Path
    source: str  # the name used in problems (brain-relative for brain files)
    spec_hash: str  # sha256 of the file's bytes
    lines: LineMap
    raw: bytes  # the exact bytes, so a run can be resumed on the version it started with

    @property
    def name(self) -> str:
        """The workflow's name."""
        return self.spec.name


def _problem(
    source: str, lines: LineMap | None, loc: Sequence[str | int], message: str, severity: Severity = "error"
) -> Problem:
    line = lines.line_for(loc) if lines is not None else None
    return Problem(file=source, line=line, message=message, severity=severity)


def _yaml_hint(exc: YamlError, text: str) -> str:
    # ADR-027 writes `files: [vps/configs/{{item}}.yml]`: in a [...] list, braces are YAML syntax.
    if exc.line is not None:
        lines = text.splitlines()
        if 0 < exc.line <= len(lines) and "{{" in lines[exc.line - 1]:
            return '; quote text that contains {{...}}, e.g. ["configs/{{item}}.yml"]'
    return ""


def _reader_line(exc: yaml.YAMLError, raw: bytes) -> int | None:
    position = getattr(exc, "position", None)
    if not isinstance(position, int):
        return None
    return raw.decode("utf-8", "replace")[:position].count("\n") + 1


def _reader_message(exc: yaml.YAMLError) -> str:
    character = getattr(exc, "character", None)
    if isinstance(character, int):
        return f"contains the character U+{character:04X}, which YAML does not allow; expected printable text"
    return f"malformed YAML: {exc}; expected valid YAML"


class _Parsed:
    """What parsing a workflow document gave, by (sha256 of its bytes, source, path, zone rules).

    Performance (bench/fanout.py (d), bench/README.md, finding 32): every change in ``workflows/`` reloads every file
    there, and YAML parsing is ~90 % of that (~1.5 ms per small file): reloading a folder of 100 workflows
    took 159 ms, and a file dropped beside them 206 ms to its first SPAWN. The same bytes give the same frozen
    result (the models are frozen, problems are handed out as new lists), so only a
    changed file is parsed again; the checks against agents, the matrix and the other workflows still run on
    every load. Bounded in entries and in bytes (a workflow may be 1 MiB); least recently used go first.
    """

    MAX_ENTRIES = 1024
    MAX_BYTES = 16 << 20

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[object, ...], tuple[LoadedWorkflow | None, tuple[Problem, ...], int]] = (
            OrderedDict()
        )
        self._bytes = 0
        self._lock = threading.Lock()  # the daemon reloads in a worker thread; runs load pinned copies on the loop

    def get(self, key: tuple[object, ...]) -> tuple[LoadedWorkflow | None, list[Problem]] | None:
        with self._lock:
            hit = self._entries.get(key)
            if hit is None:
                return None
            self._entries.move_to_end(key)
        return hit[0], list(hit[1])

    def put(self, key: tuple[object, ...], loaded: LoadedWorkflow | None, problems: list[Problem], size: int) -> None:
        if size > self.MAX_BYTES:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[2]
            self._entries[key] = (loaded, tuple(problems), size)
            self._bytes += size
            while len(self._entries) > self.MAX_ENTRIES or self._bytes > self.MAX_BYTES:
                _, (_, _, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


_PARSED = _Parsed()


def load_workflow_bytes(
    raw: bytes,
    *,
    source: str,
    path: Path | None = None,
    zone_rules: Iterable[ZoneRule] = DEFAULT_RULES,
) -> tuple[LoadedWorkflow | None, list[Problem]]:
    """Parse and check one workflow document given as bytes (a file, or a run's pinned copy).

    Returns the loaded workflow (None when any problem is an error) and every problem, warnings included.
    The same bytes under the same names are parsed once (see :class:`_Parsed`).
    """
    rules = tuple(zone_rules)
    # The rules as plain pairs: hashing 18 frozen models per file was a third of a cached reload.
    digest = spec_hash(raw)
    key = (digest, source, None if path is None else str(path), tuple((r.prefix, r.zone) for r in rules))
    hit = _PARSED.get(key)
    if hit is not None:
        return hit
    loaded, problems = _parse_workflow_bytes(raw, digest, source=source, path=path, zone_rules=rules)
    _PARSED.put(key, loaded, problems, len(raw))
    return loaded, problems


#: Longest the count of a workflow's values may take before the full parse, bounded itself, has its say.
COUNT_BUDGET_S = PARSE_BUDGET_S


def _too_many_values(text: str, limit: int = MAX_WORKFLOW_VALUES) -> int | None:
    """The line where a document passes ``limit`` values, read as YAML events (no node is built: memory stays
    flat), stopping there; None when it holds fewer, or when it does not parse or nests deeper than the loader's
    bound (the full parse says why, at once).

    Bounded like the loader: a file cannot hold more values than it has characters, so one of ``limit`` characters
    or fewer is not read; the count stops past :data:`MAX_DEPTH` levels (PyYAML's scanner weighs each token by the
    open levels: 40 KB of ``[`` cost minutes to count to the end) and after :data:`COUNT_BUDGET_S` seconds.
    """
    if len(text) <= limit:
        return None
    counted = (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent, yaml.AliasEvent)
    opening = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
    closing = (yaml.SequenceEndEvent, yaml.MappingEndEvent)
    loader = EventReader(text)  # events only: the scanner and parser, pure Python, iterative (no recursion)
    deadline = time.monotonic() + COUNT_BUDGET_S
    values = depth = 0
    try:
        while loader.check_event():
            event = loader.get_event()  # type: ignore[no-untyped-call]
            if isinstance(event, counted):
                values += 1
                if values > limit:
                    return int(event.start_mark.line) + 1 if event.start_mark is not None else None
                if values % 1024 == 0 and time.monotonic() > deadline:
                    return None
            if isinstance(event, opening):
                depth += 1
                if depth > MAX_DEPTH:
                    return None
            elif isinstance(event, closing):
                depth -= 1
    except (yaml.YAMLError, YamlError):
        return None
    return None


def _parse_workflow_bytes(
    raw: bytes, digest: str, *, source: str, path: Path | None, zone_rules: tuple[ZoneRule, ...]
) -> tuple[LoadedWorkflow | None, list[Problem]]:
    try:
        text = decode(raw, source=source)
        too_many = _too_many_values(text)
        if too_many is not None:
            message = (
                f"has more than {MAX_WORKFLOW_VALUES} values; a for_each lists at most {MAX_ITEMS} items "
                "(split the list over several workflows)"
            )
            return None, [Problem(file=source, line=too_many, message=message)]
        data, lines = parse_yaml(text, source=source)
    except YamlError as exc:
        hint = _yaml_hint(exc, raw.decode("utf-8", "replace"))
        return None, [Problem(file=source, line=exc.line, message=exc.message + hint)]
    except yaml.YAMLError as exc:
        # yamlfile.parse_yaml builds its loader outside its try: the reader's own check of
        # non-printable characters (NUL, most control characters) escapes as a bare ReaderError.
        return None, [Problem(file=source, line=_reader_line(exc, raw), message=_reader_message(exc))]
    if isinstance(data, dict) and "name" not in data and "workflow" not in data and path is not None:
        data = {"name": path.stem, **data}  # a file without a name is named after itself
    try:
        spec = parse_workflow(data)
    except WorkflowError as exc:
        found = (
            problems_from_validation(exc.validation, file=source, lines=lines, model=form_model(data))
            if exc.validation is not None and isinstance(data, dict)
            else [_problem(source, lines, exc.loc, exc.message)]
        )
        if isinstance(data, dict):
            found += [_problem(source, lines, i.loc, i.message, i.severity) for i in raw_key_issues(data)]
        return None, found
    problems = [_problem(source, lines, i.loc, i.message, i.severity) for i in workflow_issues(spec, zone_rules)]
    if any(p.severity == "error" for p in problems):
        return None, problems
    loaded = LoadedWorkflow(
        spec=spec,
        path=path or Path(source),
        source=source,
        spec_hash=digest,
        lines=lines,
        raw=raw,
    )
    return loaded, problems


def load_workflow(
    path: Path,
    *,
    source: str | None = None,
    zone_rules: Iterable[ZoneRule] = DEFAULT_RULES,
) -> tuple[LoadedWorkflow | None, list[Problem]]:
    """Read one workflow file (capped at ``MAX_WORKFLOW_BYTES``, symlinks refused) and check it."""
    name = source or str(path)
    try:
        raw = read_capped(path, MAX_WORKFLOW_BYTES)
    except InputError as exc:
        return None, [Problem(file=name, line=exc.line, message=exc.message)]
    except OSError as exc:
        return None, [Problem(file=name, message=f"cannot be read: {exc.strerror or exc}")]
    return load_workflow_bytes(raw, source=name, path=path, zone_rules=zone_rules)


def workflow_files(directory: Path) -> list[Path]:
    """The workflow files of a directory, sorted: ``*.yml``/``*.yaml`` not starting with ``.`` or ``_``.

    ``_template.yml`` and other ``_`` files are templates to copy, never run; hidden files include
    editors' and ambient's temporary files. Symlinks are listed so that loading reports them.
    """
    if not directory.is_dir():
        return []
    return [
        directory / name
        for name in sorted(os.listdir(directory))
        if name.endswith(WORKFLOW_SUFFIXES) and not name.startswith((".", "_"))
    ]


_SpawnCheck = tuple[Sequence[str | int], str, str | None, list[str]]  # (loc, agent, zone, files) of one SPAWN

# for_each spawns by (sha256 of the file, workflow name, zone rules): see _for_each_scopes.
_FOR_EACH_SCOPES: OrderedDict[tuple[object, ...], tuple[_SpawnCheck, ...]] = OrderedDict()
_FOR_EACH_SCOPES_MAX = 1024
_FOR_EACH_SCOPES_LOCK = threading.Lock()  # reloads run in a worker thread, pinned copies load on the loop


def _for_each_scopes(wf: LoadedWorkflow, spec: ForEachWorkflow, rules: tuple[ZoneRule, ...]) -> list[_SpawnCheck]:
    """One SPAWN per distinct set of zones the items' scopes fall in, the first item of each standing for the rest.

    Rendering every item is the cost of checking a for_each, and every change in ``workflows/`` checks every file
    again: with six 1,000-item workflows a reload took ~60 ms of a worker thread's GIL time beside the running
    fan-outs. The answer depends only on the file's bytes, its name and the zone rules, so it is kept by them
    (bounded; the matrix decision on it is still made at every load, the agents and the matrix may change).
    """
    key = (wf.spec_hash, spec.name, tuple((r.prefix, r.zone) for r in rules))
    with _FOR_EACH_SCOPES_LOCK:
        hit = _FOR_EACH_SCOPES.get(key)
        if hit is not None:
            _FOR_EACH_SCOPES.move_to_end(key)
    if hit is not None:
        return [(loc, agent, zone, list(files)) for loc, agent, zone, files in hit]
    fe = spec.for_each
    out: list[_SpawnCheck] = []
    seen: set[frozenset[str]] = set()
    for i in range(len(fe.items)):
        try:
            rendered = [templating.render_path(f, spec_item_values(spec, i), rules) for f in fe.scope.files]
        except InputError:
            continue  # already reported by workflow_issues
        zones = frozenset(r.zone for r in rendered)
        if zones in seen:
            continue
        seen.add(zones)
        zone = fe.scope.zone or (next(iter(zones)) if len(zones) == 1 else ",".join(sorted(zones)) or None)
        out.append((("for_each", "spawn"), fe.spawn, zone, [r.path for r in rendered]))
    with _FOR_EACH_SCOPES_LOCK:
        _FOR_EACH_SCOPES[key] = tuple((loc, agent, zone, list(files)) for loc, agent, zone, files in out)
        while len(_FOR_EACH_SCOPES) > _FOR_EACH_SCOPES_MAX:
            _FOR_EACH_SCOPES.popitem(last=False)
    return out


def _scope_for_check(
    wf: LoadedWorkflow, rules: tuple[ZoneRule, ...], defaults: Mapping[str, str] | None
) -> list[_SpawnCheck]:
    """(loc, agent, zone, files) of every SPAWN the workflow makes, rendered with placeholder values."""
    spec = wf.spec
    if isinstance(spec, ForEachWorkflow):
        return _for_each_scopes(wf, spec, rules)
    out: list[_SpawnCheck] = []
    for i, step in enumerate(spec.chain):
        values = spec_step_values(spec, step)
        try:
            scope = templating.render_path(step.scope, values, rules)
        except InputError:
            continue  # a scope that needs {{prior...}} is known only at run time
        out.append((("chain", i), spec.agent_for(step, defaults), scope.zone, [scope.path]))
        for field in ("on_done", "on_partial", "on_fail"):
            for action in getattr(step, field) or ():
                if isinstance(action, SpawnAction):
                    agent = spec.agent_for_spawn(action, defaults)
                    try:
                        target = templating.render_path(action.scope or step.scope, values, rules)
                    except InputError:
                        continue
                    out.append((("chain", i, field), agent, target.zone, [target.path]))
    return out


#: Where a workflow names an agent: (loc, agent, the message's text before and after why the agent is not there).
_AgentNamed = tuple[Sequence[str | int], str, str, str]


def _agents_named(wf: LoadedWorkflow, defaults: Mapping[str, str] | None) -> list[_AgentNamed]:
    """Every agent the workflow names or falls back to, with the words around the reason it is not there."""
    spec = wf.spec
    if isinstance(spec, ForEachWorkflow):
        agent = spec.for_each.spawn
        return [(("for_each", "spawn"), agent, f"spawn: agent {agent!r} ", "")]
    out: list[_AgentNamed] = []
    for i, step in enumerate(spec.chain):
        if step.agents:
            for n, a in enumerate(step.agents):
                out.append((("chain", i, "agents", n), a, f"step {step.key}: agent {a!r} ", ""))
        else:
            a = spec.agent_for(step, defaults)
            head = f"step {step.key} names no agents: and the default agent for type {step.type}, {a!r}, "
            out.append((("chain", i), a, head, "; name one in agents: or in default_agents:"))
        for field in ("on_done", "on_partial", "on_fail"):
            for action in getattr(step, field) or ():
                if isinstance(action, SpawnAction):
                    a = spec.agent_for_spawn(action, defaults)
                    out.append((("chain", i, field), a, f"{field}: {format_action(action)}: agent {a!r} ", ""))
    return out


def agents_named(wf: LoadedWorkflow, defaults: Mapping[str, str] | None = None) -> list[str]:
    """Every agent the workflow names or falls back to (a chain step's type's default agent), once each."""
    return list(dict.fromkeys(agent for _, agent, _, _ in _agents_named(wf, defaults)))


def spawns(
    wf: LoadedWorkflow, zone_rules: Iterable[ZoneRule] = DEFAULT_RULES, defaults: Mapping[str, str] | None = None
) -> list[tuple[str, str | None, list[str]]]:
    """(agent, zone, files) of every SPAWN the workflow makes whose scope is known before it runs, rendered with
    placeholder values: what the matrix is asked about an agent's part in it."""
    return [(agent, zone, files) for _, agent, zone, files in _scope_for_check(wf, tuple(zone_rules), defaults)]


def _cross_problems(
    wf: LoadedWorkflow, workflows: Mapping[str, LoadedWorkflow]
) -> list[tuple[Sequence[str | int], str]]:
    out: list[tuple[Sequence[str | int], str]] = []
    for loc, action in cross_targets(wf.spec):
        target = workflows.get(action.workflow or "")
        where = format_action(action)
        if target is None:
            out.append((loc, f"{where}: no workflow is named {action.workflow!r}"))
        elif not isinstance(target.spec, ChainWorkflow):
            out.append((loc, f"{where}: {action.workflow!r} is a for_each workflow; it has no steps"))
        else:
            try:
                target.spec.index_of(action.step)
            except KeyError:
                out.append((loc, f"{where}: workflow {action.workflow!r} has no step {action.step!r}"))
    return out


def check_workflow(
    wf: LoadedWorkflow,
    agent_exists: AgentExists | None = None,
    may_spawn: MaySpawn | None = None,
    *,
    zone_rules: Iterable[ZoneRule] = DEFAULT_RULES,
    workflows: Mapping[str, LoadedWorkflow] | None = None,
    default_agents: Mapping[str, str] | None = None,
) -> list[Problem]:
    """Checks that need the rest of the brain: every agent exists, the sender may SPAWN it in the zone
    its scope infers (access matrix), and cross-workflow triggers name a workflow and step that exist.

    The structural checks (steps, targets, loops, paths) already ran at load; a callback left None
    skips its check. For a draft these are warnings: a draft never runs, and is often written before
    its agents.
    """
    rules = tuple(zone_rules)
    severity: Severity = "error" if wf.spec.runnable else "warning"
    found: list[tuple[Sequence[str | int], str]] = []
    missing: set[str] = set()
    if agent_exists is not None:
        unloaded = agent_exists.unloaded if isinstance(agent_exists, KnownAgents) else {}
        for loc, agent, head, tail in _agents_named(wf, default_agents):
            if not agent_exists(agent):
                missing.add(agent)
                hint = "" if agent in unloaded else _did_you_mean(agent, agent_exists)
                found.append((loc, head + why_absent(agent, unloaded) + tail + hint))
    if may_spawn is not None:
        sender = wf.spec.sender
        for loc, agent, zone, files in _scope_for_check(wf, rules, default_agents):
            if agent in missing:
                continue  # already reported; the matrix would only repeat it
            reason = may_spawn(sender, agent, zone, files)
            if reason:
                where = f" in zone {zone}" if zone else ""
                found.append((loc, f"{sender!r} may not SPAWN {agent!r}{where}: {reason}"))
    if workflows is not None:
        found += _cross_problems(wf, workflows)
    return [_problem(wf.source, wf.lines, loc, message, severity) for loc, message in found]


def load_many(
    files: Iterable[tuple[Path, str]],
    *,
    agent_exists: AgentExists | None = None,
    may_spawn: MaySpawn | None = None,
    zone_rules: Iterable[ZoneRule] = DEFAULT_RULES,
    default_agents: Mapping[str, str] | None = None,
) -> tuple[dict[str, LoadedWorkflow], list[Problem]]:
    """Load (path, source name) pairs, in their order; a name used twice keeps the first file and reports the others.

    ``default_agents``: the brain's step type → agent (``default_agents:`` in profil/ambient.yml)."""
    rules = tuple(zone_rules)
    loaded: dict[str, LoadedWorkflow] = {}
    problems: list[Problem] = []
    for path, source in files:
        wf, found = load_workflow(path, source=source, zone_rules=rules)
        problems += found
        if wf is None:
            continue
        first = loaded.get(wf.name)
        if first is not None:
            problems.append(
                _problem(
                    source,
                    wf.lines,
                    ("name",),
                    f"workflow name {wf.name!r} is already used by {first.source}; names must be unique",
                )
            )
            continue
        loaded[wf.name] = wf
    good: dict[str, LoadedWorkflow] = {}
    for name, wf in loaded.items():
        found = check_workflow(
            wf, agent_exists, may_spawn, zone_rules=rules, workflows=loaded, default_agents=default_agents
        )
        problems += found
        if not any(p.severity == "error" for p in found):
            good[name] = wf
    return good, problems


def _written_first(path: Path) -> tuple[int, str]:
    """The order in which files claim a workflow name: modification time, then file name (a file gone: last)."""
    try:
        return path.lstat().st_mtime_ns, path.name
    except OSError:
        return 2**63, path.name


def load_workflows(
    paths: BrainPaths,
    *,
    agent_exists: AgentExists | None = None,
    may_spawn: MaySpawn | None = None,
    zone_rules: Iterable[ZoneRule] = DEFAULT_RULES,
    default_agents: Mapping[str, str] | None = None,
) -> tuple[dict[str, LoadedWorkflow], list[Problem]]:
    """Every workflow of a brain by name, and every problem found (file:line, brain-relative names).

    A file with an error is left out whole; warnings do not keep a workflow out. Two files of one ``name:``: the one
    written first (by modification time, then by file name) keeps it, so a copy never takes the original's place.
    """
    files = [(p, paths.rel(p)) for p in sorted(workflow_files(paths.workflows), key=_written_first)]
    good, problems = load_many(
        files, agent_exists=agent_exists, may_spawn=may_spawn, zone_rules=zone_rules, default_agents=default_agents
    )
    # Said and kept in file-name order, as before: only which file keeps a name depends on when it was written.
    by_file = sorted(good.values(), key=lambda wf: wf.source)
    return {wf.name: wf for wf in by_file}, sorted(problems, key=lambda p: p.file)
