"""The ``ambient`` command line: ``main(argv) -> int``, the only place with exit codes and print.

Each command group lives in its own module here (``matrix.py``, ``lock.py``...) exposing
``register(subparsers)``; modules are discovered, so adding a command is adding a file. A name with a leading
underscore is not a command: ``_common`` (the shared plumbing), ``_doctor/`` (the checks of ``ambient doctor``).
Command modules import heavy libraries (apprise, watchfiles) inside their handlers only, so
short commands such as ``ambient lock`` stay fast.

Conventions for every command: it acts on the brain in the current directory, or the one named
by ``--brain DIR`` or ``$AMBIENT_BRAIN``; ``--help`` everywhere; exit code 2 for bad usage or bad
input (see :mod:`ambient.cli._common`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence

from ambient import __version__
from ambient.cli._common import (
    EXIT_USAGE,
    CommandFunc,
    add_brain_option,
    fail,
    quiet_logs,
    refused_brain,
    say,
    without_brain,
)
from ambient.core.errors import AmbientError, InputError

#: Commands that run the daemon and set up its logging themselves.
_DAEMON_COMMANDS = frozenset({"run", "demo"})


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, with every command module's subcommands; with ``only``, just that module's."""
    parser = argparse.ArgumentParser(
        prog="ambient",
        description="The ambient layer of your agent brain: runs workflows, escalates only real decisions.",
    )
    parser.add_argument("--version", action="version", version=f"ambient {__version__}")
    add_brain_option(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    names = [only] if only is not None else sorted(m.name for m in pkgutil.iter_modules(__path__))
    for name in names:
        if name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


#: The commands whose module is named otherwise (tests/unit/cli/test_parser.py keeps this true).
HOMES: dict[str, str] = {"decide": "escalations", "demo": "run", "runs": "status", "start": "status"}


def _parser_for(argv: Sequence[str]) -> argparse.ArgumentParser:
    """Only the named command's module (its file is named like the command, or :data:`HOMES` names it), else all.

    Performance (bench/cli.py): importing every command module and building every subparser was ~80 ms of each
    ``ambient send`` or ``ambient lock`` an agent runs (and 30-60 ms of each ``ambient runs`` or ``decide``, before
    :data:`HOMES`); ``--help`` and unknown commands still see them all.
    """
    command = _command_word(argv)
    if command is not None and command.isidentifier() and not command.startswith("_"):
        try:
            parser = build_parser(only=HOMES.get(command, command))
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{command}":
                raise
        else:
            if command in _choices(parser):
                return parser
    return build_parser()


def _command_word(argv: Sequence[str]) -> str | None:
    """The first word that is not an option nor the value of ``--brain``."""
    for word in without_brain(argv):
        if word == "--":
            return None
        if not word.startswith("-"):
            return word
    return None


def _suggest(word: str | None, commands: set[str]) -> None:
    """``did you mean 'stats' or 'status'?`` under argparse's error, for a command word close to one or two."""
    if word is None or word in commands:
        return
    from ambient.core.problems import did_you_mean  # only when argparse refused the command line

    hint = did_you_mean(word, commands)
    if hint:
        say(hint)


def _choices(parser: argparse.ArgumentParser) -> set[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    return set()


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit code."""
    # pydantic looks for plugins in every installed distribution's entry points at the first model it builds (20-25
    # ms of a short command's 90-190); ambient uses none. Set before any command module builds its models; a value
    # the person set is kept (pydantic's documented switch).
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    words = list(argv) if argv is not None else sys.argv[1:]
    parser = _parser_for(words)
    try:
        args = parser.parse_args(words)
    except SystemExit as exc:  # argparse: --help (0) or bad usage (2)
        code = int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
        if code:
            _suggest(_command_word(words), _choices(parser))
        return code
    func: CommandFunc | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USAGE
    why = refused_brain(args, words)
    if why is not None:
        return fail(why)
    if args.command not in _DAEMON_COMMANDS:
        quiet_logs()
    try:
        code = func(args)
        sys.stdout.flush()  # a reader that went away shows here, not in Python's own flush at exit
        return code
    except InputError as exc:
        return fail(str(exc))
    except AmbientError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return 130
    except PermissionError as exc:  # e.g. ambient's state, read from inside a confined agent: said, not a traceback
        return fail(f"{exc.filename or 'a file'}: permission denied (is this ambient's own user?)")
    except BrokenPipeError:
        # The reader went away (`ambient escalations | head`): stop quietly, as a shell tool does, instead of a
        # traceback; what is still buffered goes nowhere, so Python's own flush at exit cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141  # 128 + SIGPIPE, what the shell reports for a command a closed pipe stopped
