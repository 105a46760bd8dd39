"""``ambient matrix``: print the effective access matrix; ``ambient matrix explain``: why a packet passes or not."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from ambient.cli._common import EXIT_NO, EXIT_OK, add_command, brain_dir, fail, out, out_json, say

if TYPE_CHECKING:
    from ambient.kernel.routing_table import BrainMatrix

# The models are imported inside the handlers: every `ambient` command imports this module.


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``matrix`` and ``matrix explain``."""
    p = add_command(
        sub,
        "matrix",
        _show,
        help="print the effective access matrix (kernel defaults, agent gates, routing table)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    msub = p.add_subparsers(dest="matrix_command", metavar="SUBCOMMAND")
    e = add_command(
        msub,
        "explain",
        _explain,
        help="allow or deny FROM → TO with SIGNAL, and the rule that decided (exit 0 allow, 1 deny, 2 bad input)",
    )
    e.add_argument("from_", metavar="FROM", help="sender (agent name, human or ambient)")
    e.add_argument("to", metavar="TO", help="receiver (agent name, human, ambient, bsi or broadcast)")
    e.add_argument(
        "signal", metavar="SIGNAL", help="SPAWN, RETURN, BLOCKED_ON, CHECKPOINT, HANDOFF, ESCALATE, ERROR, ..."
    )
    e.add_argument("--zone", help="the packet's scope.zone")
    e.add_argument("--file", dest="files", action="append", default=[], metavar="PATH", help="a scope file (repeat)")
    e.add_argument("--json", action="store_true", help="print JSON")


def _load(args: argparse.Namespace) -> BrainMatrix | None:
    from ambient.actions.explain import load_matrix
    from ambient.core.errors import InputError
    from ambient.storage.paths import BrainPaths

    try:
        bm = load_matrix(BrainPaths(brain_dir(args)))
    except InputError:
        return None
    for problem in bm.problems:
        say(f"{problem}")
    return bm


def _show(args: argparse.Namespace) -> int:
    from ambient.actions.explain import agent_networks
    from ambient.kernel.matrix import describe
    from ambient.storage.paths import BrainPaths

    bm = _load(args)
    if bm is None:
        return fail(f"{brain_dir(args)} is not a directory; expected a brain (--brain DIR)")
    rows = describe(bm.matrix)
    networks = agent_networks(BrainPaths(brain_dir(args)), bm)
    if args.json:
        principals = [{**dataclasses.asdict(r), "network": networks.get(r.name)} for r in rows]
        out_json({"principals": principals, "problems": [str(p) for p in bm.problems]})
        return EXIT_OK
    if bm.routing is not None:
        default = "deny" if bm.routing.default_deny else "matrix"
        applied = len(bm.matrix.routing.routes) if bm.matrix.routing else 0
        out(f"routing table: {bm.routing.file} (default: {default}, {applied} routes applied)")
    else:
        out("routing table: none (the matrix applies as is)")
    for r in rows:
        out("")
        out(f"{r.name}  [{r.source}]")
        if not r.signals and not r.receives_from:
            continue
        out(f"  receives from: {', '.join(r.receives_from) or '-'}")
        out(f"  sends to:      {', '.join(r.sends_to) or '-'}")
        out(f"  zones:         {', '.join(r.zone_access) or '-'}")
        out(f"  signals:       {', '.join(r.signals) or '-'}")
        for route in r.routes:
            out(f"  route:         {route}")
        if r.name in networks:
            out(f"  network:       {networks[r.name]}")
    return EXIT_OK


def _explain(args: argparse.Namespace) -> int:
    from ambient.actions.explain import explain
    from ambient.storage.paths import BrainPaths

    verdict = explain(BrainPaths(brain_dir(args)), args.from_, args.to, args.signal, zone=args.zone, files=args.files)
    for problem in verdict.problems:
        say(problem)
    if args.json:
        out_json(verdict.to_json())
    else:
        out(verdict.packet)
        out(verdict.decision.explain())
    return EXIT_OK if verdict.decision.allowed else EXIT_NO
