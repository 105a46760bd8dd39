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

from ambient.cli._common import EXIT_OK, EXIT_USAGE, add_command, brain_dir, fail, out, out_json
from ambient.terminal import printable

if TYPE_CHECKING:
    from ambient.paths import BrainPaths
    from ambient.problems import Problem
    from ambient.settings import Settings

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
            "Exit 2 with file:line problems when the configuration is invalid."
        ),
    )
    show.add_argument("--json", action="store_true", help="print JSON: settings, sources, file, environment")
    add_command(
        actions,
        "template",
        _template,
        help="print a profil/ambient.yml listing every setting, commented out with its default",
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
    salvaged: Settings | None = None  # when invalid: what `ambient run` starts with (every key that is valid)

    def redacted(self) -> dict[str, Any]:
        """The settings as JSON-ready data, secrets masked (empty when invalid)."""
        return redacted_settings(self.settings) if self.settings is not None else {}


def _has(data: Any, loc: Loc) -> bool:
    for key in loc:
        if not isinstance(data, dict) or key not in data:
            return False
        data = data[key]
    return True


def effective_config(paths: BrainPaths, environ: Mapping[str, str]) -> EffectiveConfig:
    """Load ``profil/ambient.yml`` with ``environ`` applied; problems name the file line or the variable at fault."""
    from pydantic import ValidationError

    from ambient.brain import settings_problems
    from ambient.errors import InputError
    from ambient.problems import Problem
    from ambient.settings import Settings, env_paths, merge_environ, settings_salvaged
    from ambient.yamlfile import MAX_CONFIG_BYTES, LineMap, expect_mapping, load_file

    source = paths.rel(paths.config)
    exists = os.path.lexists(paths.config)
    env = env_paths(environ)
    result = EffectiveConfig(file=source, exists=exists, settings=None, environment=env)
    data: Any = {}
    lines = LineMap()
    if exists:
        try:
            raw, lines = load_file(paths.config, max_bytes=MAX_CONFIG_BYTES, source=source)
            data = {} if raw is None else dict(expect_mapping(raw, source=source, what="the configuration"))
        except InputError as exc:
            result.problems.append(Problem(file=exc.file or source, line=exc.line, message=exc.message))
            return result
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
        result.salvaged = settings_salvaged(data, environ)
        return result
    for key, _ in flatten(result.redacted()):
        loc = tuple(key.split("."))
        var = next((v for v, path in env.items() if loc[: len(path)] == path), None)
        if var is not None:
            result.sources[key] = f"${var}"
        elif _has(data, loc):
            result.sources[key] = f"{source}:{lines.line_for(loc)}"
        else:
            result.sources[key] = "default"
    return result


def redacted_settings(settings: Settings) -> dict[str, Any]:
    """``Settings.redacted()`` plus runner environment values masked and token patterns redacted everywhere."""
    from ambient.redact import redact

    data = settings.redacted()
    for runner in data.get("runners", {}).values():
        if isinstance(runner, dict) and isinstance(runner.get("env"), dict):
            runner["env"] = {k: _MASK for k in runner["env"]}
    cleaned: dict[str, Any] = redact(data)
    return cleaned


_SECTIONS = ("notify", "telegram", "learning", "runners")


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


def _show(args: argparse.Namespace) -> int:
    from ambient.paths import BrainPaths

    root = brain_dir(args)
    if not root.is_dir():
        return fail(f"{root} is not a directory; run in a brain or pass --brain DIR")
    cfg = effective_config(BrainPaths(root), os.environ)
    if cfg.settings is None:
        for problem in cfg.problems:
            print(printable(str(problem)), file=sys.stderr)
        return fail(
            f"the configuration is invalid ({len(cfg.problems)} problem(s) above); until it is fixed `ambient run` "
            "starts with the keys that are valid (the others at their defaults) and a reload keeps the previous "
            "settings",
            EXIT_USAGE,
        )
    settings = cfg.redacted()
    if args.json:
        out_json(
            {
                "brain": str(root),
                "file": cfg.file,
                "file_exists": cfg.exists,
                "environment": sorted(cfg.environment),
                "settings": settings,
                "sources": cfg.sources,
            }
        )
        return EXIT_OK
    env = ", ".join(sorted(cfg.environment)) or "none"
    out(f"# effective settings of {root}")
    out(f"# file: {cfg.file}{'' if cfg.exists else ' (absent: defaults)'}; environment overrides: {env}")
    rows = [(key, json.dumps(_as_written(value), ensure_ascii=False)) for key, value in flatten(settings)]
    key_w = max(len(k) for k, _ in rows)
    val_w = min(max(len(v) for _, v in rows), 40)
    for key, value in rows:
        out(f"{key:<{key_w}}  {value:<{val_w}}  {cfg.sources.get(key, 'default')}")
    return EXIT_OK


def _as_written(value: object) -> object:
    """A whole number of a float setting as a person writes it (``lock_ttl_min 60``, not ``60.0``)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _template(args: argparse.Namespace) -> int:
    from ambient.scaffold import CONFIG_TEMPLATE

    sys.stdout.write(CONFIG_TEMPLATE)
    return EXIT_OK
