"""``ambient config show|template``: the effective settings (file + ``AMBIENT_*`` + defaults), secrets masked.

:func:`effective_config` is shared with ``ambient doctor``: it validates ``profil/ambient.yml`` with
the environment applied and blames each problem on what caused it: ``profil/ambient.yml:LINE`` for
the file, ``$AMBIENT_X`` for an environment override.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ambient.cli._common import EXIT_NO, EXIT_OK, add_command, brain_dir, out, out_json
from ambient.core.terminal import printable

if TYPE_CHECKING:
    from ambient.config.brain import LastGood, SettingsOrigin
    from ambient.config.settings import Settings
    from ambient.core.problems import Problem
    from ambient.storage.paths import BrainPaths
    from ambient.storage.yamlfile import LineMap

Loc = tuple[str, ...]
_MASK = "****"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient config show`` and ``ambient config template``."""
    p = add_command(sub, "config", None, help="ambient's configuration: the effective settings, a commented template")
    actions = p.add_subparsers(dest="config_action", metavar="ACTION", required=True)
    show = add_command(
        actions,
        "show",
        _show,
        help="the effective settings and where each comes from (secrets masked)",
        description=(
            "Print the settings ambient runs with: profil/ambient.yml, then AMBIENT_* environment overrides, then "
            "defaults, with the source of each value. Notification URLs and runner environment values are masked. "
            "When the file is invalid: its file:line problems on stderr, then the settings a daemon starting on it "
            "uses (every valid key, the others at their defaults; for a file that does not parse, the last good "
            "settings a daemon loaded, kept in .ambient/settings.last-good.yml), and exit 1, as `ambient validate`. "
            "A runners: entry the daemon does not use is marked refused (it does not validate) or not used (the "
            "agent's own runner wins), with its problem."
        ),
    )
    show.add_argument("--json", action="store_true", help="print JSON: settings, sources, file, environment")
    add_command(
        actions,
        "template",
        _template,
        help="print a profil/ambient.yml listing every setting, commented out with its default",
        needs_brain=False,
    )


@dataclass
class EffectiveConfig:
    """ambient's configuration as ``ambient run`` would load it, and where each value comes from."""

    file: str  # brain-relative name of the configuration file
    exists: bool
    settings: Settings | None  # None when it does not validate (see problems)
    problems: list[Problem] = field(default_factory=list)
    environment: dict[str, Loc] = field(default_factory=dict)  # AMBIENT_* variable in force → setting it sets
    sources: dict[str, str] = field(default_factory=dict)  # dotted key → "default" | "<file>:<line>" | "$VAR"
    salvaged: Settings | None = None  # when invalid: what `ambient run` starts with (choose_settings)
    runs_with: SettingsOrigin = "file"  # where what `ambient run` starts with comes from
    last_good: LastGood | None = None  # runs_with "last_good": the copy it runs on
    lines: LineMap | None = None  # where each key is in the file

    def redacted(self) -> dict[str, Any]:
        """The settings as JSON-ready data, secrets masked; when invalid, the salvaged ones (empty if none)."""
        used = self.settings or self.salvaged
        return redacted_settings(used) if used is not None else {}


def _has(data: Any, loc: Loc) -> bool:
    for key in loc:
        if not isinstance(data, dict) or key not in data:
            return False
        data = data[key]
    return True


def effective_config(paths: BrainPaths, environ: Mapping[str, str]) -> EffectiveConfig:
    """Load ``profil/ambient.yml`` with ``environ`` applied; problems name the file line or the variable at fault."""
    from pydantic import ValidationError

    from ambient.config.brain import settings_problems, starting_settings
    from ambient.config.settings import Settings, env_paths, merge_environ
    from ambient.core.errors import InputError
    from ambient.core.problems import Problem
    from ambient.storage.yamlfile import MAX_CONFIG_BYTES, LineMap, expect_mapping, load_file

    source = paths.rel(paths.config)
    exists = os.path.lexists(paths.config)
    env = env_paths(environ)
    result = EffectiveConfig(file=source, exists=exists, settings=None, environment=env)
    data: Any = {}
    lines = LineMap()
    if exists:
        try:
            raw, lines = load_file(paths.config, max_bytes=MAX_CONFIG_BYTES, source=source)
            result.lines = lines
            data = {} if raw is None else dict(expect_mapping(raw, source=source, what="the configuration"))
        except InputError as exc:
            result.problems.append(Problem(file=exc.file or source, line=exc.line, message=exc.message))
            return _last_good_instead(result, paths, environ)
    try:
        merged = merge_environ(data, environ)
    except (TypeError, AttributeError):
        # A section the environment writes into is not a mapping in the file: validating the file alone
        # reports that section at its line.
        merged = data
    try:
        result.settings = Settings.model_validate(merged)
    except ValidationError as exc:
        result.problems += settings_problems(exc, source=source, lines=lines, environ=environ)
        _found, chosen = starting_settings(paths, environ)
        result.salvaged, result.runs_with = chosen.settings, chosen.origin
    # Where each value comes from; with problems, a value they name is the default (or the file's, for a bad
    # variable): settings_salvaged drops exactly those.
    bad_lines = {p.line for p in result.problems if p.file == source and p.line is not None}
    bad_vars = {p.file[1:] for p in result.problems if p.file.startswith("$")}
    for key, _ in flatten(result.redacted()):
        loc = tuple(key.split("."))
        var = next((v for v, path in env.items() if loc[: len(path)] == path and v not in bad_vars), None)
        line = lines.line_for(loc) if _has(data, loc) else None
        if var is not None:
            result.sources[key] = f"${var}"
        elif _has(data, loc) and line in bad_lines:
            result.sources[key] = f"default ({source}:{line} is invalid)"
        elif _has(data, loc):
            result.sources[key] = f"{source}:{line}"
        else:
            result.sources[key] = "default"
    return result


def _last_good_instead(result: EffectiveConfig, paths: BrainPaths, environ: Mapping[str, str]) -> EffectiveConfig:
    """The file does not parse: what ``ambient run`` starts with instead (choose_settings), and where each of its
    values comes from (the last good copy's line, an ``AMBIENT_*`` variable, a default)."""
    from ambient.config.brain import starting_settings

    _found, chosen = starting_settings(paths, environ)
    result.runs_with, result.last_good = chosen.origin, chosen.last_good
    if chosen.last_good is None:
        return result  # the defaults: nothing of the file is used
    result.salvaged = chosen.settings
    copy = chosen.last_good
    lines = copy.file.lines.lines if copy.file.lines is not None else {}
    for key, _ in flatten(result.redacted()):
        loc = tuple(key.split("."))
        var = next((v for v, path in result.environment.items() if loc[: len(path)] == path), None)
        if var is not None:
            result.sources[key] = f"${var}"
        elif loc in lines:
            result.sources[key] = f"{copy.source}:{lines[loc]}"
        else:
            result.sources[key] = "default"
    return result


def redacted_settings(settings: Settings) -> dict[str, Any]:
    """``Settings.redacted()`` plus runner environment values masked and token patterns redacted everywhere."""
    from ambient.core.redact import redact

    data = settings.redacted()
    for runner in data.get("runners", {}).values():
        if isinstance(runner, dict) and isinstance(runner.get("env"), dict):
            runner["env"] = {k: _MASK for k in runner["env"]}
    cleaned: dict[str, Any] = redact(data)
    return cleaned


_SECTIONS = ("notify", "telegram", "learning", "budget", "runners")


def flatten(data: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of each setting: sections are opened, ``runners`` one line per agent."""
    rows: list[tuple[str, Any]] = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if not prefix and key in _SECTIONS and isinstance(value, dict) and value:
            rows += flatten(value, f"{name}.")
        else:
            rows.append((name, value))
    return rows


def against_the_brain(paths: BrainPaths, cfg: EffectiveConfig) -> tuple[list[Problem], dict[str, Problem]]:
    """The settings' problems as ``ambient validate profil/ambient.yml`` counts them (the file's and the variables'
    own, then those of the settings a daemon runs with against this brain: runners, their programs, the cluster), and
    the ``runners:`` entries the daemon does not use, by their dotted key, with why."""
    from ambient.config.brain import of_settings, refused_runners, validate_checks
    from ambient.kernel.routing_table import build_matrix

    used = cfg.settings or cfg.salvaged
    if used is None:  # nothing of the file parses and no daemon loaded it: the defaults, no runner to check
        return list(cfg.problems), {}
    lines = None if cfg.last_good is not None else cfg.lines  # as the daemon: the broken file's lines, none
    _runners, checks = validate_checks(paths, build_matrix(paths), used, lines)
    problems = cfg.problems + [p for p in checks if of_settings(p, cfg.file)]
    return problems, {f"runners.{name}": p for name, p in refused_runners(used, checks, cfg.file).items()}


def _show(args: argparse.Namespace) -> int:
    from ambient.storage.paths import BrainPaths

    root = brain_dir(args)  # a brain: main() refused anything else
    paths = BrainPaths(root)
    cfg = effective_config(paths, os.environ)
    problems, refused = against_the_brain(paths, cfg)
    for problem in problems:  # first, on stderr: what is wrong, and where
        print(printable(str(problem)), file=sys.stderr)
    errors = sum(1 for p in problems if p.severity == "error")
    code = EXIT_OK if not errors else EXIT_NO  # as `ambient validate` on the same file
    settings = cfg.redacted()  # an invalid file: what a daemon starting on it uses (its valid keys kept)
    sources = {**cfg.sources, **{key: _refusal(p) for key, p in refused.items()}}
    if args.json:
        out_json(
            {
                "brain": str(root),
                "file": cfg.file,
                "file_exists": cfg.exists,
                "valid": not errors,
                "runs_with": cfg.runs_with,
                "last_good": (
                    {"file": cfg.last_good.source, "saved_at": cfg.last_good.saved_at.isoformat()}
                    if cfg.last_good is not None
                    else None
                ),
                "problems": [str(p) for p in problems],
                "refused": {key: str(p) for key, p in refused.items()},
                "environment": sorted(cfg.environment),
                "settings": settings,
                "sources": sources,
            }
        )
        return code
    count = f"{errors} error(s), {len(problems) - errors} warning(s) on stderr"
    if not settings:  # the file cannot be read as YAML at all, and never loaded: nothing of it is used
        out(f"# {cfg.file} cannot be read ({count}): `ambient run` starts on defaults")
        return code
    env = ", ".join(sorted(cfg.environment)) or "none"
    out(f"# effective settings of {root}")
    out(f"# file: {cfg.file}{'' if cfg.exists else ' (absent: defaults)'}; environment overrides: {env}")
    head = _what_is_wrong(cfg, problems, count)
    if head is not None:
        out(head + ("; a runner marked refused or not used is not in effect" if refused else ""))
    rows = [(key, json.dumps(_as_written(value), ensure_ascii=False)) for key, value in flatten(settings)]
    key_w = max(len(k) for k, _ in rows)
    val_w = min(max(len(v) for _, v in rows), 40)
    for key, value in rows:
        out(f"{key:<{key_w}}  {value:<{val_w}}  {sources.get(key, 'default')}")
    return code


def _refusal(problem: Problem) -> str:
    """The source column of a ``runners:`` entry the daemon does not use: why, at its line."""
    return f"{'refused' if problem.severity == 'error' else 'not used'} ({problem})"


def _what_is_wrong(cfg: EffectiveConfig, problems: list[Problem], count: str) -> str | None:
    """The header line that names what is at fault (the file, an ``AMBIENT_*`` variable, both) and what ``ambient
    run`` does meanwhile; None when nothing is."""
    if cfg.last_good is not None:
        return (
            f"# {cfg.file} does not load ({count}): below, what `ambient run` runs with, the last good settings, from "
            f"{cfg.last_good.saved_at:%Y-%m-%d %H:%M:%S} UTC ({cfg.last_good.source}: the last {cfg.file} a daemon "
            "loaded); fix the file"
        )
    if not problems:
        return None
    errors = [p for p in problems if p.severity == "error"]
    culprits = sorted({p.file for p in errors or problems}, key=lambda f: (f.startswith("$"), f))
    who = " and ".join(culprits)
    if not errors:
        return f"# {who} {'has' if len(culprits) == 1 else 'have'} {count}: `ambient run` runs with what is below"
    verb = "is" if len(culprits) == 1 else "are"
    if cfg.settings is not None:
        return f"# {who} {verb} invalid ({count}): below, what `ambient run` runs with"
    if cfg.file not in culprits:  # only variables: each one's setting keeps the file's value (or its default)
        return (
            f"# {who} {verb} invalid ({count}): below, what `ambient run` starts with, the file's value (or the "
            "default) where a variable is invalid"
        )
    return (
        f"# {who} {verb} invalid ({count}): below, what `ambient run` starts with, the valid keys of the file "
        "and the others at their defaults (a running daemon keeps its previous settings until the file is fixed)"
    )


def _as_written(value: object) -> object:
    """A whole number of a float setting as a person writes it (``lock_ttl_min 60``, not ``60.0``)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _template(args: argparse.Namespace) -> int:
    from ambient.config.scaffold import CONFIG_TEMPLATE

    sys.stdout.write(CONFIG_TEMPLATE)
    return EXIT_OK
