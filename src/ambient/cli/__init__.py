"""The ``ambient`` command line: ``main(argv) -> int``, the only place with exit codes and print.

Each command group lives in its own module here (``matrix.py``, ``lock.py``...) exposing
``register(subparsers)``; modules are discovered, so adding a command is adding a file.
Command modules import heavy libraries (apprise, watchfiles) inside their handlers only, so
short commands such as ``ambient lock`` stay fast.

Conventions for every command: it acts on the brain in the current directory, or the one named
by ``--brain DIR`` or ``$AMBIENT_BRAIN``; ``--help`` everywhere; exit code 2 for bad usage or bad
input (see :mod:`ambient.cli._common`).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from ambient import __version__
from ambient.cli._common import EXIT_USAGE, CommandFunc, add_brain_option, fail
from ambient.errors import AmbientError, InputError


def build_parser() -> argparse.ArgumentParser:
    """The full parser, with every command module's subcommands."""
    parser = argparse.ArgumentParser(
        prog="ambient",
        description="The ambient layer of your agent brain: runs workflows, escalates only real decisions.",
    )
    parser.add_argument("--version", action="version", version=f"ambient {__version__}")
    add_brain_option(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else sys.argv[1:])
    except SystemExit as exc:  # argparse: --help (0) or bad usage (2)
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    func: CommandFunc | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return func(args)
    except InputError as exc:
        return fail(str(exc))
    except AmbientError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return 130
