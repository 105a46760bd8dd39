"""``ambient init [DIR]``: scaffold a brain that ``ambient validate`` accepts and ``ambient run`` runs at once.

Never overwrites and never deletes: when any file it would write exists, it writes nothing, names
those files and exits 2. Each file is published with a hard link from a temp file, so a file that
appears meanwhile is not clobbered either.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ambient.cli._common import EXIT_OK, add_command, brain_dir, fail, out, say


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient init``."""
    p = add_command(
        sub,
        "init",
        _init,
        help="create a new brain: folders, a commented profil/ambient.yml, an example agent and workflow",
        description=(
            "Create a brain in DIR (default: --brain, $AMBIENT_BRAIN or the current directory): agents/, claims/, "
            "locks/, profil/, workflows/, a .gitignore for .ambient/, profil/ambient.yml with every setting "
            "commented with its default, profil/routing.yml, and an example agent and workflow that run at once. "
            "Existing folders are fine; an existing file is never overwritten (exit 2, nothing written)."
        ),
        needs_brain=False,
    )
    p.add_argument("dir", nargs="?", metavar="DIR", help="where to create the brain (created if missing)")
    p.add_argument(
        "--no-example",
        action="store_true",
        help="only folders, profil/ambient.yml and .gitignore (to add ambient to an existing brain)",
    )


def _create_new(path: Path, text: str, mode: int) -> None:
    """Publish ``path`` whole (temp file, fsync, link); FileExistsError if it exists, even if it just appeared."""
    from ambient.storage.fsutil import publish_new

    publish_new(path, text, mode=mode)  # fails if the name exists: never clobbers


def _only_example(existing: list[str], blocked: list[str]) -> bool:
    """Would ``--no-example`` avoid every conflict?"""
    from ambient.config.scaffold import brain_files

    minimal = {f.rel for f in brain_files(example=False)}
    return not blocked and not minimal.intersection(existing)


def _init(args: argparse.Namespace) -> int:
    from ambient.config.scaffold import DIRECTORIES, brain_files

    root = Path(args.dir).absolute() if args.dir else brain_dir(args)
    if root.exists() and not root.is_dir():
        return fail(f"{root} exists and is not a directory")
    files = brain_files(example=not args.no_example)
    existing = [f.rel for f in files if os.path.lexists(root / f.rel)]
    blocked = [d for d in DIRECTORIES if os.path.lexists(root / d) and not (root / d).is_dir()]
    if existing or blocked:
        names = ", ".join(existing + [f"{d} (not a directory)" for d in blocked])
        return fail(
            f"{root} already has {names}; ambient init never overwrites a file and wrote nothing. "
            "Move those files aside or choose another DIR"
            + (", or use --no-example to add only the configuration" if _only_example(existing, blocked) else "")
        )
    for d in DIRECTORIES:
        (root / d).mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    for f in files:
        try:
            _create_new(root / f.rel, f.text, f.mode)
        except FileExistsError:
            done = f"; already written: {', '.join(written)}" if written else ""
            return fail(f"{root / f.rel} appeared while ambient init was running; not overwritten{done}")
        written.append(f.rel)
    out(f"created a brain in {root}")
    for rel in written:
        out(f"  {rel}")
    brain = f" --brain {root}" if root != Path.cwd() else ""
    out("next:")
    out(f"  ambient validate{brain}             # check every file (file:line on a problem)")
    if not args.no_example:
        out(f"  ambient run{brain} --until-idle     # run the example workflow once, then exit")
    out(f"  ambient doctor{brain}               # what is wrong and how to fix it")
    out(f"  ambient config show{brain}          # the effective settings")
    _warn_agent_user(root)
    return EXIT_OK


def _warn_agent_user(root: Path) -> None:
    """Run as root, ambient runs agents as its agent user: said now when that user cannot reach the brain or the
    interpreter (Python under /root), rather than at the first agent's failure."""
    from ambient.cli._doctor.agents import agent_user_warnings

    for warning in agent_user_warnings(root, None):
        say(f"warning: {warning}")
