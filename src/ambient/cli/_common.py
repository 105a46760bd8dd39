"""Shared CLI plumbing: the ``--brain`` convention, exit codes, output helpers."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from ambient.core.lazylog import set_up_on_import
from ambient.core.terminal import printable, printable_json

EXIT_OK = 0
EXIT_NO = 1  # a negative answer: denied, held by another, problems found
EXIT_USAGE = 2  # bad usage or bad input

CommandFunc = Callable[[argparse.Namespace], int]


def add_brain_option(parser: argparse.ArgumentParser) -> None:
    """``--brain DIR`` on a parser; accepted before or after the subcommand."""
    parser.add_argument(
        "--brain",
        metavar="DIR",
        default=argparse.SUPPRESS,
        help="brain directory (default: $AMBIENT_BRAIN, else the current directory)",
    )


def add_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    func: CommandFunc | None,
    help: str,
    description: str | None = None,
    *,
    needs_brain: bool = True,
) -> argparse.ArgumentParser:
    """Add a subcommand carrying the ``--brain`` option and its handler. ``needs_brain=False``: the command acts on
    no brain (``init``, ``demo``, ``config template``), so :func:`refused_brain` does not refuse its directory."""
    p = sub.add_parser(name, help=help, description=description or help)
    add_brain_option(p)
    if func is not None:
        p.set_defaults(func=func)
    if not needs_brain:
        p.set_defaults(needs_brain=False)
    return p


def brain_dir(args: argparse.Namespace) -> Path:
    """The brain this command acts on: ``--brain``, else ``$AMBIENT_BRAIN``, else the current directory."""
    raw = getattr(args, "brain", None) or os.environ.get("AMBIENT_BRAIN") or "."
    return Path(raw).absolute()


def ambient_command(root: Path, *words: str) -> str:
    """``ambient [--brain ROOT] WORDS``: a command to copy and run from any directory, the brain named unless it is
    the current directory (every hint that tells the person what to type next)."""
    where = "" if root == Path.cwd() else f"--brain {root} "
    return f"ambient {where}{' '.join(words)}"


#: What makes a directory a brain: one of these (``ambient init`` writes profil/ambient.yml).
BRAIN_MARKS = ("profil/ambient.yml", "agents", "workflows", ".ambient")


def not_a_brain(root: Path, words: Sequence[str] = ()) -> str | None:
    """Why ``root`` is not a brain a command may act on (None: it is one). Inside a brain (``cd brain/workflows``),
    the brain it lies in and the command ``words`` (as typed) aimed at it, never ``ambient init`` there: that would
    make a brain inside the brain."""
    if root.is_dir() and any((root / mark).exists() for mark in BRAIN_MARKS):
        return None
    inside = enclosing_brain(root)
    if inside is not None:
        who = (
            "you are" if root == Path.cwd() else f"{root} is" if root.is_dir() else f"{root} is not a directory, and is"
        )
        again = shlex.join(["ambient", "--brain", str(inside), *without_brain(words)])
        return f"{who} inside the brain {inside}: run `{again}`, or cd there"
    if not root.is_dir():
        return f"{root} is not a directory; run `ambient init {root}` to create a brain there"
    return (
        f"{root} is not a brain (no {', '.join(BRAIN_MARKS)}); run `ambient init {root}` to make one "
        "there, or give the brain with --brain DIR"
    )


def enclosing_brain(root: Path) -> Path | None:
    """The nearest folder above ``root`` that is a brain by what only a brain holds (the configuration ``ambient
    init`` writes, or ambient's state): an ``agents/`` or ``workflows/`` folder alone is too common a name (a
    repository's ``.github/workflows``) to call its parent a brain. None: ``root`` is inside no brain."""
    for parent in root.parents:
        if (parent / "profil" / "ambient.yml").is_file() or (parent / ".ambient").is_dir():
            return parent
    return None


def without_brain(words: Sequence[str]) -> list[str]:
    """The command words without ``--brain DIR`` (or ``--brain=DIR``), to aim them at another brain."""
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word == "--brain":
            skip = True
        elif not word.startswith("--brain="):
            kept.append(word)
    return kept


def refused_brain(args: argparse.Namespace, words: Sequence[str] = ()) -> str | None:
    """Why the command of ``args`` (typed as ``words``) may not run: the one rule for every command that reads or
    writes a brain, checked by ``main`` before any handler, so that no command creates a file in a directory that
    is not a brain (None: it may run)."""
    if not getattr(args, "needs_brain", True):
        return None
    return not_a_brain(brain_dir(args), words)


def fail(message: str, code: int = EXIT_USAGE) -> int:
    """Print an error on stderr and return ``code``."""
    say(f"error: {message}")
    return code


def say(message: str) -> None:
    """Print ``ambient: message`` on stderr (warnings, notes), escaped for the terminal like :func:`out`."""
    print(printable(f"ambient: {message}"), file=sys.stderr)


def out(text: str = "") -> None:
    """Print one line on stdout; what a terminal would act on is escaped (agent text: :mod:`ambient.core.terminal`)."""
    print(printable(text))


def out_json(data: Any) -> None:
    """Print data as indented JSON on stdout (control and bidi characters as JSON escapes)."""
    print(printable_json(json.dumps(data, indent=2, ensure_ascii=False, default=str)))


def quiet_logs(level: int = 30) -> None:
    """Library log lines of a short command go to stderr, at ``level`` (WARNING) and above: stdout is the
    command's answer (``--json`` must stay JSON). The daemon (``run``, ``demo``) sets up its own logging.

    structlog is set up as soon as it is imported, not before: a command that logs nothing (``ambient status``)
    does not import it at all (:func:`ambient.core.lazylog.set_up_on_import`)."""
    set_up_on_import(partial(_configure_logs, level))


def _configure_logs(level: int) -> None:
    import structlog

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
