"""``ambient gate ACTION SESS_ID [MESSAGE]``: human gates on claims (the original ``human-gate-ack``).

ACTION is gate (open → waiting_human), approve, reject, pause (cascades to open/waiting
children), resume (only what the pause cascaded), abort (cascades to every non-terminal child)
or status. Each change is appended to ``gate_history``. An illegal transition changes nothing
and exits 2 with the reason.

A chain step's ``gate: human`` waits both as its claim (``waiting_human``) and as a question of its run: approve or
reject on that claim answers the question, exactly as ``ambient decide`` would (the run then moves the claim), so
the claim and the run never disagree. Likewise abort on the claim of a run that has not ended aborts the run, as an
ABORT packet does (the running daemon applies it at once; a daemon that is down, when it starts).
"""

from __future__ import annotations

import argparse

from ambient.cli._common import EXIT_NO, EXIT_OK, add_command, brain_dir, fail, out, out_json
from ambient.storage.paths import BrainPaths

_ACTIONS = ("gate", "approve", "reject", "pause", "resume", "abort", "status")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient gate ...``."""
    p = add_command(
        sub,
        "gate",
        _cmd_gate,
        help="human gate on a claim: gate, approve, reject, pause, resume, abort, status",
        description="Move a claim through its human gate. Abort on a run's claim aborts the run (an ABORT packet: "
        "at once with a daemon running, else when it starts). Exit codes: 0 done, 2 refused (illegal transition, "
        "unknown claim) — a refusal changes nothing.",
    )
    p.add_argument("action", choices=_ACTIONS, metavar="ACTION", help=" | ".join(_ACTIONS))
    p.add_argument("sess_id", metavar="SESS_ID")
    p.add_argument("message", nargs="?", default=None, metavar="MESSAGE", help="why; kept in gate_history")
    p.add_argument("--token", type=int, metavar="N", help="fencing token of the lock this write is made under")
    p.add_argument("--json", action="store_true", help="print JSON")


def _cmd_gate(args: argparse.Namespace) -> int:
    from ambient.actions.gates import gate_status, move_gate
    from ambient.core.errors import AlreadyAnsweredError

    paths = BrainPaths(brain_dir(args))
    if args.action == "status":
        status, history = gate_status(paths, args.sess_id)
        if args.json:
            out_json({"sess_id": args.sess_id, "status": status, "gate_history": history})
            return EXIT_OK
        out(f"{args.sess_id}: {status}")
        for entry in history:
            if isinstance(entry, dict):
                cascade = f" (cascade from {entry['cascade']})" if entry.get("cascade") else ""
                note = f": {entry['message']}" if entry.get("message") else ""
                move = f"{entry.get('from')} -> {entry.get('to')}"
                out(f"  {entry.get('at')}  {entry.get('action')}  {move}{cascade}{note}")
            else:
                out(f"  {entry}")
        return EXIT_OK
    try:
        outcome = move_gate(paths, args.sess_id, args.action, args.message, token=args.token)
    except AlreadyAnsweredError as exc:  # the run's gate question, answered elsewhere meanwhile
        return fail(str(exc), EXIT_NO)
    if outcome.run is not None and args.json:
        out_json({"sess_id": args.sess_id, "run": outcome.run, "abort": outcome.packet, "now": outcome.applied_now})
        return EXIT_OK
    if outcome.question is not None or outcome.run is not None:
        out(outcome.message)
        return EXIT_OK
    if args.json:
        out_json(outcome.statuses())
        return EXIT_OK
    for m in outcome.moves:
        out(f"{m.sess_id}: {m.before} -> {m.after}{' (cascade)' if m.cascade else ''}")
    return EXIT_OK
