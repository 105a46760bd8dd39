"""Answer an escalation: the one code path of ``ambient decide`` and the console's option buttons.

The outcome is typed, so each door says it its own way: the CLI as exit codes (0 decided, 1 already settled, 2
refused, 3 its run ended (or an abort of it waits for the daemon): the answer cannot be applied, 4 failed: the
answer could not be written), the console as a notice. A refused or late answer changes nothing (the store's guard
and the rules of :mod:`ambient.human.escalations`); "decided" is said only once the answer is on disk (fsync'd)
where the daemon applies it: the escalation of a run that is still running or will be resumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ambient.actions.people import os_user, short_duration
from ambient.core.errors import AlreadyAnsweredError, InputError
from ambient.core.lazylog import get_logger
from ambient.engine.budget import amount_in
from ambient.engine.journals import run_glance
from ambient.engine.planner import names_run
from ambient.human.escalation_store import EscalationStore
from ambient.human.escalations import Channel, Escalation, option_for
from ambient.kernel.inbox import read_inbox
from ambient.kernel.packet import AMBIENT, Packet, Signal
from ambient.storage.paths import BrainPaths

log = get_logger(__name__)

DecideKind = Literal["decided", "settled", "refused", "ended", "failed"]


@dataclass(frozen=True)
class DecideOutcome:
    """What became of an answer.

    ``decided``: it is the decision, on disk where the daemon applies it; ``settled``: the escalation was already
    answered elsewhere, expired or cancelled (nothing changed); ``refused``: unknown id, an option not offered, a
    malformed file or note (nothing changed); ``ended``: its run ended (finished, aborted, gone) before the answer,
    so nothing can apply it: the escalation is closed as cancelled, saying why; ``failed``: the answer could not be
    written (a full disk, a permission): nothing was decided. ``message`` is the sentence to show; ``escalation``
    the escalation as it now stands, when known.
    """

    kind: DecideKind
    message: str
    escalation: Escalation | None = None

    @property
    def ok(self) -> bool:
        return self.kind == "decided"


def decide(
    paths: BrainPaths,
    esc_id: str,
    option: str,
    *,
    channel: Channel,
    note: str | None = None,
    by: str | None = None,
) -> DecideOutcome:
    """Answer escalation ``esc_id`` with ``option`` (its key or 1-based number) as ``by`` (default: the OS user)."""
    store = EscalationStore(paths)
    who = by if by is not None else os_user()
    try:
        current = store.get(
            esc_id
        )  # an unknown id is refused before the store's guard: a refused answer writes nothing
        if current.status == "pending" and current.respawn is None:
            option_for(current, option)  # an option not offered is refused first, whatever the run
            ended = _run_ended(paths, current)
            if ended is not None:
                return _too_late(store, current, option, ended, who, channel)
        esc = store.answer(esc_id, option, by=who, channel=channel, note=note or None)
    except AlreadyAnsweredError as exc:
        return DecideOutcome("settled", str(exc), exc.escalation)
    except InputError as exc:  # unknown id, option not offered, malformed file, note too long
        return DecideOutcome("refused", str(exc))
    except OSError as exc:  # a full disk, a permission: the answer is not on disk, so it was not given
        return DecideOutcome("failed", f"{esc_id}: the answer could not be written ({exc.strerror or exc}); try again")
    opt = esc.decided_option
    label = f" ({opt.label})" if opt is not None else ""
    given = amount_in(esc.note) if opt is not None and opt.action == "raise" else None
    if given is not None:  # the note's amount is the cap, not the option's own words (spent plus one budget)
        label = f" (the cap raised to ${given:.2f} as your note says, if above what was spent)"
    message = (
        f"{esc.id}: {esc.decision}{label}, decided by {esc.by} via {channel} "
        f"after {short_duration(esc.latency_s or 0.0)}."
    )
    return DecideOutcome("decided", message, esc)


def _run_ended(paths: BrainPaths, esc: Escalation) -> str | None:
    """Why nothing will apply an answer to ``esc`` any more (its run ended, or an abort of it waits for the daemon),
    or None while its run may."""
    glance = run_glance(paths, esc.run_id)
    if glance is not None and glance.ended:
        return glance.reason
    return _abort_waiting(paths, esc)


def _abort_waiting(paths: BrainPaths, esc: Escalation) -> str | None:
    """An ABORT of the question's run waiting in the daemon's inbox (``ambient gate abort`` or ``ambient send``
    while the daemon was down), sealed as the daemon believes it: the daemon ends the run with it before it applies
    any answer, so an answer now is one nothing applies."""
    for _path, pkt, sealed in read_inbox(paths):
        if not sealed or not isinstance(pkt, Packet) or pkt.signal != Signal.ABORT or pkt.to != AMBIENT:
            continue
        ctx = pkt.payload.context
        if names_run(str(ctx.get("workflow")), esc.run_id, esc.workflow):
            reason = str(ctx.get("reason") or "").strip()
            said = f": {reason}" if reason else ""
            return f"the run was aborted by {pkt.from_}{said} (the daemon ends it when it next starts or looks)"
    return None


def _too_late(
    store: EscalationStore, esc: Escalation, option: str, why: str, who: str, channel: Channel
) -> DecideOutcome:
    """An answer to a question whose run ended: said, logged, and the escalation closed with the reason (never an
    answer reported accepted that nothing applies)."""
    reason = f"not applied: {why} before the answer ({option} by {who} via {channel})"
    try:
        closed = store.cancel(esc.id, reason)
    except AlreadyAnsweredError as exc:  # settled meanwhile (the daemon cancelled it as its run ended)
        closed = exc.escalation
    # Info: the person who answered is told (the message below); the daemon's log keeps it for the others.
    log.info("answer_not_applied", escalation=esc.id, run_id=esc.run_id, reason=why, option=option, by=who)
    message = f"{esc.id}: your answer {option!r} was not applied: {why}. The question is closed; nothing changed."
    return DecideOutcome("ended", message, closed)
