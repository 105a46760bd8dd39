"""Answer an escalation: the one code path of ``ambient decide`` and the console's option buttons.

The outcome is typed, so each door says it its own way: the CLI as exit codes (0 decided, 1 already settled, 2
refused), the console as a notice. A refused or late answer changes nothing (the store's guard and the rules of
:mod:`ambient.human.escalations`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ambient.actions.people import os_user, short_duration
from ambient.core.errors import InputError
from ambient.human.escalation_store import EscalationStore
from ambient.human.escalations import AlreadyAnsweredError, Channel, Escalation
from ambient.storage.paths import BrainPaths

DecideKind = Literal["decided", "settled", "refused"]


@dataclass(frozen=True)
class DecideOutcome:
    """What became of an answer.

    ``decided``: it is the decision; ``settled``: the escalation was already answered elsewhere, expired or
    cancelled (nothing changed); ``refused``: unknown id, an option not offered, a malformed file or note (nothing
    changed). ``message`` is the sentence to show; ``escalation`` the escalation as it now stands, when known.
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
        store.get(esc_id)  # an unknown id is refused before the store's guard: a refused answer writes nothing
        esc = store.answer(esc_id, option, by=who, channel=channel, note=note or None)
    except AlreadyAnsweredError as exc:
        return DecideOutcome("settled", str(exc), exc.escalation)
    except InputError as exc:  # unknown id, option not offered, malformed file, note too long
        return DecideOutcome("refused", str(exc))
    opt = esc.decided_option
    label = f" ({opt.label})" if opt is not None else ""
    message = (
        f"{esc.id}: {esc.decision}{label}, decided by {esc.by} via {channel} "
        f"after {short_duration(esc.latency_s or 0.0)}."
    )
    return DecideOutcome("decided", message, esc)
