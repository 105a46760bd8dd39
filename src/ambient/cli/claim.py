"""``ambient claim list|show|open|close``: BSI claims (spec/002) from the command line.

``open`` refuses (exit 1) when an active claim blocks the new one under the satellite conflict
matrix, unless ``--force``. Bad input and refused transitions exit 2 with the reason.
"""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING, Any

from ambient.cli._common import EXIT_NO, EXIT_OK, add_command, brain_dir, fail, out, out_json, say
from ambient.storage.paths import BrainPaths

if TYPE_CHECKING:  # pydantic and YAML are imported in the handlers: `ambient --help` stays fast
    from pathlib import Path

    from ambient.claims.claim import Claim
    from ambient.claims.store import ClaimStore


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient claim ...``."""
    p = add_command(sub, "claim", None, help="BSI claims: list, show, open, close")
    actions = p.add_subparsers(dest="claim_action", metavar="ACTION", required=True)

    ls = add_command(actions, "list", _cmd_list, help="claims with status, type, scope, agent, tier and zone")
    ls.add_argument("--status", action="append", metavar="STATUS", help="only this status (repeatable)")
    ls.add_argument("--json", action="store_true", help="print JSON")

    sh = add_command(actions, "show", _cmd_show, help="one claim, with its inferred close tier and zone")
    sh.add_argument("sess_id", metavar="SESS_ID")
    sh.add_argument("--json", action="store_true", help="print JSON")

    op = add_command(actions, "open", _cmd_open, help="open a claim (prints its sess_id)")
    op.add_argument("--type", required=True, metavar="TYPE", help="pilote, satellite or solo")
    op.add_argument("--scope", required=True, metavar="PATH", help="folder (ending with /) or file")
    op.add_argument("--agent", required=True, metavar="AGENT")
    op.add_argument("--sess-id", metavar="ID", help="default: sess-YYYYMMDD-HHMM-<agent>")
    op.add_argument("--satellite-type", metavar="TYPE", help="code, brain-write, test, deploy, search, domain")
    op.add_argument("--satellite-level", metavar="LEVEL", help="leaf (default) or domain")
    op.add_argument("--parent", dest="parent_satellite", metavar="SESS_ID", help="parent_satellite")
    op.add_argument("--story-angle", metavar="TEXT")
    op.add_argument("--workflow", metavar="NAME")
    op.add_argument("--workflow-step", metavar="N")
    op.add_argument("--mode", metavar="MODE")
    op.add_argument("--theme-branch", metavar="BRANCH")
    op.add_argument("--user-id", metavar="ID")
    op.add_argument("--ttl", metavar="TTL", help="minutes, or 30m / 4h / 2d")
    op.add_argument("--on-done", metavar="ACTION")
    op.add_argument("--on-partial", metavar="ACTION")
    op.add_argument("--on-fail", metavar="ACTION")
    op.add_argument("--token", type=int, metavar="N", help="fencing token of the lock this write is made under")
    op.add_argument("--force", action="store_true", help="open even if an active claim conflicts")

    cl = add_command(actions, "close", _cmd_close, help="close a claim with its result")
    cl.add_argument("sess_id", metavar="SESS_ID")
    cl.add_argument("--status", required=True, choices=["ok", "partial", "failed"], help="result.status")
    cl.add_argument("--files", nargs="*", metavar="FILE", help="result.files_modified")
    cl.add_argument("--commit", metavar="SHA")
    cl.add_argument("--signal-id", metavar="ID")
    cl.add_argument("--tests-total", type=int, metavar="N")
    cl.add_argument("--tests-passed", type=int, metavar="N")
    cl.add_argument("--tests-failed", type=int, metavar="N")
    cl.add_argument("--children", nargs="*", metavar="SESS_ID", help="result.children (default: aggregated)")
    cl.add_argument("--notes", metavar="TEXT")
    cl.add_argument("--message", metavar="TEXT", help="kept in gate_history")
    cl.add_argument("--token", type=int, metavar="N", help="fencing token of the lock this write is made under")


def _store(args: argparse.Namespace) -> ClaimStore:
    from ambient.claims.store import ClaimStore

    return ClaimStore(BrainPaths(brain_dir(args)))


def _inferred(claim: Claim) -> tuple[int, str]:
    from ambient.core.errors import UnsafePathError

    try:
        zone = claim.zone
    except UnsafePathError:
        zone = "(scope outside the brain)"
    return claim.close_tier, zone


def _cmd_list(args: argparse.Namespace) -> int:
    from ambient.claims.claim import STATUSES

    if bad := sorted(set(args.status or ()) - set(STATUSES)):
        return fail(f"--status {', '.join(bad)}: expected one of {', '.join(STATUSES)}")
    store = _store(args)
    wanted = set(args.status) if args.status else None
    if wanted is None:
        loaded = store.load()
        problems, claims = loaded.problems, [c for _, c in sorted(loaded.claims.items())]
    else:  # a few statuses out of every claim ever: the census picks them, only their files are parsed
        from ambient.claims.index import census, read_claims

        seen = census(store)
        picked = read_claims(store, seen, sorted(s for s, f in seen.facts.items() if f.status in wanted))
        problems, claims = seen.problems, [c for _, c in picked.values() if c.status in wanted]
    for problem in problems:  # a bad file is shown, never hidden or rewritten
        say(f"{problem}")
    if args.json:
        rows: list[dict[str, Any]] = []
        for c in claims:
            tier, zone = _inferred(c)
            rows.append({**c.to_document(), "close_tier": tier, "zone": zone})
        out_json(rows)
        return EXIT_OK
    if not claims:
        out("No claims.")
        return EXIT_OK
    for c in claims:
        tier, zone = _inferred(c)
        kind = c.type + (f"/{c.satellite_type}" if c.satellite_type else "")
        out(f"{c.sess_id}  {c.status}  {kind}  {c.scope}  agent {c.agent}  tier {tier}  zone {zone}")
    return EXIT_OK


def _cmd_show(args: argparse.Namespace) -> int:
    from ambient.storage.yamlfile import dump_yaml

    store = _store(args)
    path = store.locate(args.sess_id)
    claim, warnings = store.read(path)  # again, for its warnings
    tier, zone = _inferred(claim)
    if args.json:
        out_json({"file": store.paths.rel(path), "claim": claim.to_document(), "close_tier": tier, "zone": zone})
        return EXIT_OK
    out(f"# {store.paths.rel(path)} (inferred, not written: close_tier {tier}, zone {zone})")
    out(dump_yaml(claim.to_document()).rstrip("\n"))
    for problem in warnings:
        say(f"{problem}")
    return EXIT_OK


#: How a claim's warning says what reading a file does with the value; nothing is written here.
_AS_READ = re.compile(r"; (kept as written|ignored|treated as leaf|the value is kept)$")


def _warn_if_it_leaves_the_brain(root: Path, scope: str) -> None:
    """A scope inside the brain by its words that leads out of it through a symlink (``workspace/link/`` with
    ``link -> /tmp``): said as a scope outside the brain is (pre-flight and the router refuse it)."""
    from ambient.core.errors import AmbientError
    from ambient.storage.fsutil import resolve_in_brain

    if scope.startswith("/") or ".." in scope.split("/"):
        return  # said already by the claim's own warnings
    try:
        resolve_in_brain(root, scope)
    except AmbientError as exc:
        say(f"warning: scope {scope}: {exc}")


def _cmd_open(args: argparse.Namespace) -> int:
    from ambient.claims.claim import find_conflicts, make_sess_id, new_claim

    store = _store(args)
    now = store.now()
    sess_id = args.sess_id or make_sess_id(now, args.agent)
    fields = {
        k: getattr(args, k)
        for k in (
            "satellite_type",
            "satellite_level",
            "parent_satellite",
            "story_angle",
            "workflow",
            "workflow_step",
            "mode",
            "theme_branch",
            "user_id",
            "ttl",
            "on_done",
            "on_partial",
            "on_fail",
        )
    }
    claim = new_claim(sess_id, args.type, args.scope, args.agent, now, **fields)
    # Accepted in a file someone wrote (kept, ignored); given on the command line, a mistake to fix now.
    unusual = [_AS_READ.sub("", message) for _, message in claim.warnings()]
    if unusual:
        return fail(f"claim {sess_id} not opened: " + "; ".join(unusual))
    _warn_if_it_leaves_the_brain(store.paths.root, args.scope)
    if not args.force:
        blocking = find_conflicts(store.load().claims, claim)
        if blocking:
            for other in blocking:
                say(
                    f"{other.sess_id} ({other.satellite_type}, {other.status}) holds {other.scope}; "
                    f"a {claim.satellite_type} satellite on {claim.scope} must wait (spec/002 conflict matrix)"
                )
            say("not opened; use --force to open anyway")
            return EXIT_NO
    store.open(claim, token=args.token)
    out(sess_id)
    return EXIT_OK


def _cmd_close(args: argparse.Namespace) -> int:
    result: dict[str, Any] = {"status": args.status}
    if args.files is not None:
        result["files_modified"] = list(args.files)
    counts = {"total": args.tests_total, "passed": args.tests_passed, "failed": args.tests_failed}
    negative = [f"--tests-{k} {v}" for k, v in counts.items() if v is not None and v < 0]
    if negative:
        return fail(f"{', '.join(negative)}: a count of tests is 0 or more")
    if any(v is not None for v in counts.values()):
        result["tests"] = {k: v for k, v in counts.items() if v is not None}
    if args.children is not None:
        result["children"] = list(args.children)
    for key in ("commit", "signal_id", "notes"):
        if getattr(args, key) is not None:
            result[key] = getattr(args, key)
    from ambient.actions.gates import refuse_if_a_run_holds

    store = _store(args)
    if args.token is None:  # with a lock's token the write is fenced: the run's late write is refused instead
        refuse_if_a_run_holds(store.paths, args.sess_id, "close")
    claim = store.close(args.sess_id, result, message=args.message, token=args.token)
    out(f"{claim.sess_id}: closed ({args.status}, tier {claim.close_tier})")
    return EXIT_OK
