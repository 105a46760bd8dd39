"""``ambient gate ACTION SESS_ID [MESSAGE]``: human gates on claims (the original ``human-gate-ack``).

ACTION is gate (open → waiting_human), approve, reject, pause (cascades to open/waiting
children), resume (only what the pause cascaded), abort (cascades to every non-terminal child)
or status. Each change is appended to ``gate_history``. An illegal transition changes nothing
and exits 2 with the reason.

A chain step's ``gate: human`` waits both as its claim (``waiting_human``) and as a question of its run: approve or
reject on that claim answers the question, exactly as ``ambient decide`` would (the run then moves the claim), so
the claim and the run never disagree.
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
        description="Move a claim through its human gate. Exit codes: 0 done, 2 refused (illegal transition, "
        "unknown claim) — a refusal changes nothing.",
    )
    p.add_argument("action", choices=_ACTIONS, metavar="ACTION", help=" | ".join(_ACTIONS))
    p.add_argument("sess_id", metavar="SESS_ID")
    p.add_argument("message", nargs="?", default=None, metavar="MESSAGE", help="why; kept in gate_history")
    p.add_argument("--token", type=int, metavar="N", help="fencing token of the lock this write is made under")
    p.add_argument("--json", action="store_true", help="print JSON")


def _cmd_gate(args: argparse.Namespace) -> int:
    from ambient.claims.store import ClaimStore

    store = ClaimStore(BrainPaths(brain_dir(args)))
    if args.action == "status":
        claim = store.get(args.sess_id)
        history = [e for e in claim.gate_history or []]
        if args.json:
            out_json({"sess_id": claim.sess_id, "status": claim.status, "gate_history": history})
            return EXIT_OK
        out(f"{claim.sess_id}: {claim.status}")
        for entry in history:
            if isinstance(entry, dict):
                cascade = f" (cascade from {entry['cascade']})" if entry.get("cascade") else ""
                note = f": {entry['message']}" if entry.get("message") else ""
                move = f"{entry.get('from')} -> {entry.get('to')}"
                out(f"  {entry.get('at')}  {entry.get('action')}  {move}{cascade}{note}")
            else:
                out(f"  {entry}")
        return EXIT_OK
    if args.action in ("approve", "reject"):
        answered = _answer_run_gate(args)
        if answered is not None:
            return answered
    changed = store.transition(args.sess_id, args.action, args.message, token=args.token)
    if args.json:
        out_json({sid: c.status for sid, c in changed.items()})
        return EXIT_OK
    for sid, claim in changed.items():
        last = (claim.gate_history or [{}])[-1]
        before = last.get("from") if isinstance(last, dict) else "?"
        cascade = " (cascade)" if sid != args.sess_id else ""
        out(f"{sid}: {before} -> {claim.status}{cascade}")
    return EXIT_OK


def _answer_run_gate(args: argparse.Namespace) -> int | None:
    """The pending gate question of the run step this claim is, answered like ``ambient decide``; None when the
    claim is no run's waiting gate (a gate a person or a script set on a claim of their own)."""
    import os

    from ambient.human.escalation_store import EscalationStore
    from ambient.human.escalations import AlreadyAnsweredError

    store = EscalationStore(BrainPaths(brain_dir(args)))
    for esc in store.list(status="pending"):
        step = esc.step or esc.item
        if esc.kind == "gate" and step is not None and f"{esc.run_id}-step-{step}" == args.sess_id:
            try:
                done = store.answer(
                    esc.id, args.action, by=os.environ.get("USER") or "human", channel="cli", note=args.message
                )
            except AlreadyAnsweredError as exc:
                return fail(str(exc), EXIT_NO)
            out(f"{args.sess_id}: {done.decision} (the run's question {esc.id}, answered as `ambient decide` would)")
            return EXIT_OK
    return None
