"""The program ambient hands the Claude Agent SDK as ``cli_path``: it cleans the environment, ties the CLI's life to
the daemon's, then execs the real Claude Code CLI.

Why a launcher: the SDK starts the CLI with the daemon's whole environment (``os.environ`` merged under
``options.env``), which may hold the person's secrets (a bot token, notification URLs); and a CLI left behind by a
daemon killed with SIGKILL would go on spending tokens. Here, before the exec:

- only the variables named in ``AMBIENT_CLAUDE_KEEP`` (what the runner set on purpose) and a few basics survive;
- ``PR_SET_PDEATHSIG`` makes the kernel kill the CLI when the daemon's thread that started it dies (and the
  ``AMBIENT_BRAIN``/``AMBIENT_RUN_ID`` it keeps let the next start's orphan sweep find anything it started);
- the Landlock policy in ``AMBIENT_CLAUDE_JAIL`` (JSON: ``read``, ``write``, ``abi``, ``connect``, and ``module``,
  where ``landlock.py`` is) confines this process, so the CLI and every tool and command it runs start confined,
  like a command agent. A policy that cannot be applied stops the launch (exit 127): never unconfined by mistake.
  Under a root daemon it also drops every capability (``spawner_helper.drop_privileges``: uid 0 kept for the
  session folder root owns, no power of root, none to gain again by an exec).

Stdlib only, imported by nothing else: it runs in a fresh interpreter per agent.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import signal
import sys

#: Always kept (when set): what any program needs to run and read text.
BASICS = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM")
_PR_SET_PDEATHSIG = 1


def clean_env(environ: dict[str, str]) -> dict[str, str]:
    """The CLI's environment: the basics and the names listed in ``AMBIENT_CLAUDE_KEEP``, nothing else."""
    keep = {n for n in environ.get("AMBIENT_CLAUDE_KEEP", "").split(",") if n}
    return {k: v for k, v in environ.items() if k in BASICS or k in keep}


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the orphan sweep at the next start is what remains
        return
    if os.getppid() != parent:  # the daemon died before the prctl: nobody is left to wait for us
        os._exit(1)


def confine(raw: str) -> None:
    """Apply the jail the runner computed (see the module's docstring). OSError or ValueError when it cannot be."""
    jail = json.loads(raw)
    sys.path.insert(0, str(jail["module"]))
    landlock = importlib.import_module("landlock")  # ambient/runners/landlock.py: standard library only
    del sys.path[0]
    read = [os.fsencode(p) for p in jail["read"]]
    write = [os.fsencode(p) for p in jail["write"]]
    connect = None if jail["connect"] is None else [int(p) for p in jail["connect"]]
    landlock.confine(read, write, int(jail["abi"]), connect)
    if os.geteuid() == 0:  # a root daemon: Claude Code keeps root's files (its session folder) but no power of root
        sys.path.insert(0, str(jail["module"]))
        helper = importlib.import_module("spawner_helper")  # its sibling, standard library only
        del sys.path[0]
        helper.drop_privileges(0, 0)


def main() -> None:
    """Exec the real CLI (``AMBIENT_CLAUDE_CLI``) with the same arguments and a clean environment."""
    cli = os.environ.get("AMBIENT_CLAUDE_CLI", "")
    if not cli:
        sys.stderr.write("ambient: AMBIENT_CLAUDE_CLI is not set; this launcher is started by ambient only\n")
        sys.exit(127)
    parent = int(os.environ.get("AMBIENT_CLAUDE_PARENT", "0") or 0)
    if parent:
        _die_with_parent(parent)
    env = clean_env(dict(os.environ))
    jail = os.environ.get("AMBIENT_CLAUDE_JAIL")
    if jail:
        try:
            confine(jail)
        except (OSError, ValueError, KeyError, TypeError, ImportError) as exc:
            sys.stderr.write(f"ambient: cannot confine Claude Code: {exc}\n")
            sys.exit(127)
    try:
        os.execve(cli, [cli, *sys.argv[1:]], env)  # noqa: S606 - the CLI itself, argv as the SDK built it
    except OSError as exc:
        sys.stderr.write(f"ambient: cannot start Claude Code at {cli}: {exc.strerror}\n")
        sys.exit(127)


if __name__ == "__main__":
    main()
