"""When a workflow starts a run by itself, not asked by a packet or a person: once when its file is first seen
(dropping a file is how a person asks), then whenever its ``schedule: every`` falls due, never doubling a run still
going. Pure: the daemon's workflows evaluator asks, starts the run and remembers it (``.ambient/workflows.json``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Literal

from ambient.workflows.spec import WorkflowSpec

#: Why a workflow started a run by itself: its file was first seen, or its schedule fell due.
SelfTrigger = Literal["file", "schedule"]


def start_due(
    spec: WorkflowSpec, seen: Mapping[str, Any] | None, now: datetime, *, running: bool
) -> SelfTrigger | None:
    """Why ``spec`` starts a run now, or None.

    ``seen`` is what was remembered of its earlier starts (None: never seen), with its ``last_started`` time in ISO
    format; ``running`` whether a run of it is still going (only a schedule looks at it).
    """
    if not spec.runnable:
        return None
    if seen is None:
        return "file"
    if spec.schedule is None or running:
        return None
    last = datetime.fromisoformat(str(seen.get("last_started")))
    return "schedule" if now >= last + timedelta(seconds=spec.schedule.every) else None
