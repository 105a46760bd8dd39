"""A claim's human gate moved by a person (``ambient gate``, the console's approve/reject buttons).

A chain step's ``gate: human`` waits both as its claim (``waiting_human``) and as a question of its run: approve or
reject on that claim answers the question, exactly as ``ambient decide`` would (the run then moves the claim), so
the claim and the run never disagree. Likewise abort on the claim of a run that has not ended aborts the run: an
ABORT packet to ambient, routed as ``ambient send`` routes it (:mod:`ambient.actions.send`), which the daemon
carries out at once, or at its start if it is down (the run then moves its claims: ``failed``, for good). Any other
claim moves by :meth:`ambient.claims.store.ClaimStore.transition`
(its cascades and ``gate_history``). A refusal changes nothing and raises what the store raises
(:class:`~ambient.core.errors.TransitionError`, :class:`~ambient.core.errors.AlreadyAnsweredError`...).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ambient.actions.people import os_user
from ambient.claims.claim import legal_actions
from ambient.claims.store import ClaimStore
from ambient.engine.journals import run_glance
from ambient.human.escalation_store import EscalationStore

if TYPE_CHECKING:
    from ambient.claims.claim import Claim
    from ambient.human.escalations import Channel, Escalation
    from ambient.storage.paths import BrainPaths

#: What ``ambient gate`` may do to a claim (``status`` only reads).
GATE_ACTIONS = ("gate", "approve", "reject", "pause", "resume", "abort")


def gate_actions_for(status: str) -> tuple[str, ...]:
    """The gate actions a person may take on a claim of ``status`` (the claims' own transition rule decides)."""
    return legal_actions(status, GATE_ACTIONS)


@dataclass(frozen=True)
class Move:
    """One claim moved: from which status to which, and whether a cascade from the claim acted on moved it."""

    sess_id: str
    before: str
    after: str
    cascade: bool


@dataclass(frozen=True)
class GateOutcome:
    """What a gate action did: either the run's question it answered (``question``, ``decision``) or the claims it
    moved (``moves``, the acted-on claim first)."""

    sess_id: str
    action: str
    moves: list[Move] = field(default_factory=list)
    question: str | None = None
    decision: str | None = None
    run: str | None = None  # the run an abort was handed to (an ABORT packet)
    packet: str | None = None
    applied_now: bool = False  # a running daemon took the ABORT (else: when the daemon starts)

    @property
    def message(self) -> str:
        """One line a person reads (the CLI prints it; the console shows it as its notice)."""
        if self.question is not None:
            how = f"the run's question {self.question}, answered as `ambient decide` would"
            return f"{self.sess_id}: {self.decision} ({how})"
        if self.run is not None:
            when = "the running daemon applies it now" if self.applied_now else "applied when the daemon starts"
            return (
                f"{self.sess_id}: abort handed to its run as ABORT {self.packet} ({when}): its running agents stop, "
                "its unfinished items are aborted, its questions are cancelled, and it ends aborted"
            )
        return "; ".join(f"{m.sess_id}: {m.before} -> {m.after}{' (cascade)' if m.cascade else ''}" for m in self.moves)

    def statuses(self) -> dict[str, str]:
        """sess_id → status after the move (``ambient gate --json``)."""
        return {m.sess_id: m.after for m in self.moves}


def run_gate_question(paths: BrainPaths, sess_id: str) -> Escalation | None:
    """The pending gate question of the run step this claim is (``<run>-step-<step>``), or None."""
    for esc in EscalationStore(paths).list(status="pending"):
        step = esc.step or esc.item
        if esc.kind == "gate" and step is not None and f"{esc.run_id}-step-{step}" == sess_id:
            return esc
    return None


def move_gate(
    paths: BrainPaths,
    sess_id: str,
    action: str,
    message: str | None = None,
    *,
    token: int | None = None,
    by: str | None = None,
    channel: Channel = "cli",
) -> GateOutcome:
    """Apply ``action`` (one of :data:`GATE_ACTIONS`) to claim ``sess_id``; approve/reject of a run's waiting gate
    answers the run's question instead. Raises on a refusal (nothing changed)."""
    if action not in GATE_ACTIONS:
        from ambient.core.errors import InputError

        raise InputError(f"unknown gate action {action!r}; expected one of {', '.join(GATE_ACTIONS)}")
    if action in ("approve", "reject"):
        esc = run_gate_question(paths, sess_id)
        if esc is not None:
            who = by if by is not None else os_user()
            done = EscalationStore(paths).answer(esc.id, action, by=who, channel=channel, note=message)
            return GateOutcome(sess_id, action, question=esc.id, decision=done.decision)
        _refuse_if_waiting_on_a_question(paths, sess_id, action)
    if action == "abort" and _run_going_on(paths, sess_id):
        who = by if by is not None else os_user()
        return _abort_run(paths, sess_id, message, who, channel)
    if token is None:  # with a lock's token the write is fenced: the run cannot write over it (it is refused)
        refuse_if_a_run_holds(paths, sess_id, action)
    changed = ClaimStore(paths).transition(sess_id, action, message, token=token)
    return GateOutcome(sess_id, action, moves=[_move(sid, claim, sess_id) for sid, claim in changed.items()])


def refuse_if_a_run_holds(paths: BrainPaths, sess_id: str, action: str) -> None:
    """A run in progress keeps its claims itself (each item's and its own, rewritten as it goes): a pause, a hold,
    a close or an approval written into one by hand was said done, then written over when the run moved on, the
    person's ``gate_history`` with it. Refused (nothing written), naming what such a run does take: an abort, and
    the answers to its questions. ``ambient gate`` and ``ambient claim close`` both ask, unless the writer gives
    the fencing token of the scope's lock it took over (then the run's late write is the one refused)."""
    from ambient.core.errors import AmbientError, TransitionError

    run = sess_id if _run_going_on(paths, sess_id) else None
    if run is None:
        try:
            parent = ClaimStore(paths).get(sess_id).parent_satellite
        except AmbientError:
            return  # no such claim, or unreadable: the store's own refusal says so
        run = parent if parent is not None and _run_going_on(paths, parent) else None
    if run is None:
        return
    raise TransitionError(
        f"cannot {action} claim {sess_id}: it is a claim of run {run}, which ambient is running and which writes its "
        f"claims itself as it goes (a {action} here would be written over); a run in progress takes `ambient gate "
        f"abort {run}` and the answers to its questions (`ambient escalations`, then `ambient decide ID OPTION`)"
    )


def _run_going_on(paths: BrainPaths, sess_id: str) -> bool:
    """Whether ``sess_id`` is the claim of a run whose journal has not ended (a run ambient runs or will resume)."""
    glance = run_glance(paths, sess_id)
    return glance is not None and not glance.ended


def _abort_run(paths: BrainPaths, run_id: str, message: str | None, who: str, channel: Channel) -> GateOutcome:
    """Abort a run as an ABORT packet does: the person's ABORT to ambient, through the router and the daemon's inbox
    (durable: a daemon that is down applies it at its start). A packet the router refuses is refused here."""
    from ambient.actions.send import send_packet
    from ambient.core.errors import NoAnswer, TransitionError

    door = "the console" if channel == "web" else "ambient gate abort"
    reason = f"{message} ({door}, by {who})" if message else f"{door}, by {who}"
    packet = {
        "from": "human",
        "to": "ambient",
        "signal": "ABORT",
        "payload": {"context": {"workflow": run_id, "reason": reason}},
    }
    try:
        sent = send_packet(paths, json.dumps(packet).encode())
    except NoAnswer as exc:
        raise TransitionError(f"cannot tell whether run {run_id} was aborted: {exc.strerror}") from exc
    if not sent.delivered:
        raise TransitionError(
            f"cannot abort run {run_id}: its ABORT was {sent.answer.get('status')}: {sent.answer.get('reason')}"
        )
    return GateOutcome(run_id, "abort", run=run_id, packet=str(sent.answer.get("id")), applied_now=sent.via == "daemon")


def _refuse_if_waiting_on_a_question(paths: BrainPaths, sess_id: str, action: str) -> None:
    """A run's item waiting on a question that is not a gate (its agent asked, or it failed) is not approved through
    its claim: that moved the claim on and left the run waiting on the question (a new user's finding). Refused,
    naming the question to answer."""
    from ambient.core.errors import AmbientError, TransitionError

    extra = ClaimStore(paths).get(sess_id).model_extra or {}
    esc_id = extra.get("escalation")
    if not isinstance(esc_id, str):
        return
    try:
        esc = EscalationStore(paths).get(esc_id)
    except AmbientError:  # gone or unreadable: the claim alone decides, as before
        return
    if esc.status != "pending" or esc.kind == "gate":
        return
    options = ", ".join(o.key for o in esc.options)
    raise TransitionError(
        f"cannot {action} claim {sess_id}: it waits on its run's question {esc.id} ({esc.kind}), not on a gate; "
        f"answer that question instead: ambient decide {esc.id} OPTION (options: {options})"
    )


def _move(sid: str, claim: Claim, acted_on: str) -> Move:
    last: Any = (claim.gate_history or [{}])[-1]
    before = str(last.get("from")) if isinstance(last, dict) else "?"
    return Move(sid, before, str(claim.status), sid != acted_on)


def gate_status(paths: BrainPaths, sess_id: str) -> tuple[str, list[Any]]:
    """A claim's status and its ``gate_history`` (``ambient gate status``)."""
    claim = ClaimStore(paths).get(sess_id)
    return str(claim.status), list(claim.gate_history or [])
