"""``ambient grants``: the tool calls you allowed an AI agent for good (``allow always``) and the command patterns you
accepted (``allow-pattern``), and forgetting them."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ambient.cli._common import EXIT_NO, EXIT_OK, add_command, brain_dir, out, out_json, say

if TYPE_CHECKING:  # imported in the handlers, so that other commands start fast
    from ambient.storage.paths import BrainPaths


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient grants`` and ``ambient grants forget``."""
    p = add_command(
        sub, "grants", _list, "what you allowed AI agents for good (allow always, allow-pattern); forget one"
    )
    p.add_argument("--json", action="store_true", help="print the grants as JSON")
    gsub = p.add_subparsers(dest="grants_command", metavar="SUBCOMMAND")
    fp = add_command(gsub, "forget", _forget, "forget an agent's grant (or all of them): it is asked again")
    fp.add_argument("agent", metavar="AGENT")
    fp.add_argument(
        "signature",
        metavar="CALL",
        nargs="?",
        help="the call as listed (e.g. 'Bash: pytest -q' or 'Bash pattern: pytest -q tests/*'), or its sha256",
    )


def _paths(args: argparse.Namespace) -> BrainPaths:
    from ambient.storage.paths import BrainPaths

    return BrainPaths(brain_dir(args))


def _list(args: argparse.Namespace) -> int:
    from ambient.actions.grants import NO_GRANTS, list_grants

    grants = list_grants(_paths(args))
    if args.json:
        out_json(grants)
        return EXIT_OK
    if not grants:
        out(NO_GRANTS)
    for agent, calls in sorted(grants.items()):
        for call in calls:
            out(f"{agent}  {call}")
    return EXIT_OK


def _forget(args: argparse.Namespace) -> int:
    from ambient.actions.grants import forget_grant
    from ambient.core.errors import NoSuchGrantError

    try:
        done = forget_grant(_paths(args), args.agent, args.signature)
    except NoSuchGrantError as exc:
        say(str(exc))
        return EXIT_NO
    out(done.message)
    return EXIT_OK
