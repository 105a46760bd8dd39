"""``ambient thread AGENT``: an agent's live thread (shared by every requester), a pair or
correlation view of it (marked partial), or the bounded handoff the agent is given."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ambient.cli._common import EXIT_OK, add_command, brain_dir, fail, out, out_json

if TYPE_CHECKING:  # imported in the handler, so that other commands start fast
    from ambient.live.turn import Turn
    from ambient.storage.paths import BrainPaths


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient thread``."""
    p = add_command(sub, "thread", _thread, "show an agent's live thread, a pair or correlation view, or its handoff")
    p.add_argument("agent", metavar="AGENT")
    p.add_argument("--requester", metavar="R", help="only the turns of this requester (a partial view)")
    p.add_argument("--correlation", metavar="C", help="only the turns of this correlation id (a partial view)")
    p.add_argument("--limit", metavar="N", type=int, default=50, help="newest turns shown (50; 0 = all)")
    p.add_argument("--handoff", action="store_true", help="print the bounded handoff the agent is given instead")
    p.add_argument("--json", action="store_true", help="print the view as JSON")


def _fmt(t: Turn) -> str:
    from ambient.live.turn import one_line

    arrow = f"{t.requester} -> {t.target}" if t.role == "requester" else f"{t.target} -> {t.requester}"
    corr = f" [{t.correlation_id}]" if t.correlation_id else ""
    return f"{t.ts.strftime('%Y-%m-%d %H:%M:%S')}  {t.signal:<10} {arrow}{corr}: {one_line(t.text, 160)}"


def _thread(args: argparse.Namespace) -> int:
    from ambient.live.context import LiveContext
    from ambient.storage.paths import BrainPaths

    paths = BrainPaths(brain_dir(args))
    live = LiveContext(paths)
    if not live.view(args.agent).total and not _known_party(paths, args.agent):
        return fail(f"no agent named {args.agent!r}: no file in {paths.agents} names it and no thread of it is kept")
    if args.handoff:
        text = live.handoff_for(args.agent)
        if args.json:
            out_json({"agent": args.agent, "handoff": text, "chars": len(text)})
        else:
            out(text.rstrip("\n"))
        return EXIT_OK
    if args.limit < 0:
        return fail(f"--limit must be 0 (all) or more (got {args.limit})")
    view = live.view(args.agent, requester=args.requester, correlation=args.correlation)
    turns = view.turns[-args.limit :] if args.limit > 0 else view.turns
    if args.json:
        data = view.to_json()
        data["turns"] = [t.model_dump(mode="json") for t in turns]
        out_json(data)
        return EXIT_OK
    label = "PARTIAL " if view.partial else ""
    out(f"{label}thread {view.agent}: {len(turns)} turn(s) shown of {view.total}")
    out(view.note)
    if view.skipped_lines or view.torn_tail:
        out(f"note: {view.skipped_lines} unreadable line(s) skipped" + ("; torn last line" if view.torn_tail else ""))
    if len(turns) < len(view.turns):
        out(f"(... {len(view.turns) - len(turns)} earlier turn(s); --limit 0 shows all)")
    for t in turns:
        out(_fmt(t))
    if not view.turns:
        out("(no turns)")
    return EXIT_OK


def _known_party(paths: BrainPaths, name: str) -> bool:
    """An agent of the brain (a file of agents/ names it) or a party every brain has (the person, ambient): looked
    up only for a name without a thread, so a mistyped name is said (exit 2) instead of shown as an empty thread."""
    from ambient.kernel.agents import load_agents
    from ambient.kernel.matrix import ORCHESTRATOR, RESERVED

    if name in RESERVED or name == ORCHESTRATOR:
        return True
    agents, _ = load_agents(paths)
    return name in agents
