"""``ambient grants``: the tool calls you allowed an AI agent for good (``allow always``), and forgetting them."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ambient.cli._common import EXIT_NO, EXIT_OK, add_command, brain_dir, out, out_json, say

if TYPE_CHECKING:  # imported in the handlers, so that other commands start fast
    from ambient.runners.claude import SessionStore


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient grants`` and ``ambient grants forget``."""
    p = add_command(sub, "grants", _list, "what you allowed AI agents for good (allow always); forget one")
    p.add_argument("--json", action="store_true", help="print the grants as JSON")
    gsub = p.add_subparsers(dest="grants_command", metavar="SUBCOMMAND")
    fp = add_command(gsub, "forget", _forget, "forget an agent's grant (or all of them): it is asked again")
    fp.add_argument("agent", metavar="AGENT")
    fp.add_argument("signature", metavar="CALL", nargs="?", help="the call as listed (e.g. 'Bash: pytest -q')")


def _store(args: argparse.Namespace) -> SessionStore:
    from ambient.runners.claude import SessionStore
    from ambient.storage.paths import BrainPaths

    return SessionStore(BrainPaths(brain_dir(args)).state / "claude")


def _list(args: argparse.Namespace) -> int:
    store = _store(args)
    grants = store.all_grants()
    if args.json:
        out_json(grants)
        return EXIT_OK
    if not grants:
        out("no grants: every call outside an agent's allowed_tools is asked (allow | allow-always | deny)")
    for agent, calls in sorted(grants.items()):
        for call in calls:
            out(f"{agent}  {call}")
    return EXIT_OK


def _forget(args: argparse.Namespace) -> int:
    store = _store(args)
    dropped = store.forget(args.agent, args.signature)
    if not dropped:
        say(f"no such grant of {args.agent}; `ambient grants` lists them")
        return EXIT_NO
    out(f"forgot {dropped} grant(s) of {args.agent}: asked again from the next call")
    return EXIT_OK
