"""What a run page shows beyond the query store's rows, read from the run's own journal events: each item's
attempts (when each started and ended, its result and error), the exit trigger a chain step took, and the colour
class of a grid cell. Pure: events in (as :func:`ambient.storage.journal.read_jsonl` gives them), plain data out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

#: A grid cell's colour by item status (classes of app.css); a status not listed is pending grey.
CELL_CLASS: Mapping[str, str] = {
    "done": "st-done",
    "running": "st-running",
    "retry_wait": "st-running cell-retry",
    "escalated": "st-waiting",
    "failed": "st-failed",
    "aborted": "st-failed cell-aborted",
    "skipped": "st-pending cell-skipped",
    "pending": "st-pending",
}


def cell_class(status: str, gate: str | None = None) -> str:
    """The classes of an item's grid cell: its status colour, a waiting gate drawn as waiting."""
    if gate == "pending":
        return "st-waiting cell-gate"
    return CELL_CLASS.get(status, "st-pending")


def epoch(value: object) -> float | None:
    """An ISO time as journaled (``at``), in seconds since the epoch; None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


@dataclass
class Attempt:
    """One attempt of an item: accepted at ``start``, finished at ``end`` (None: running or cut short)."""

    number: int
    start: str | None = None
    end: str | None = None
    result: str | None = None
    error: str | None = None
    duration_ms: int | None = None
    agent: str | None = None


@dataclass
class ItemHistory:
    """An item's attempts and the other things that happened to it (retry waits, escalations, gate, skips)."""

    name: str
    attempts: list[Attempt] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)  # (at, what) in journal order
    agent: str | None = None
    trigger: str | None = None  # chains: where the step's exit sent the run


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def histories(events: Iterable[Mapping[str, Any]], steps: list[str] | None = None) -> dict[str, ItemHistory]:
    """Each item's history, by item name. ``steps`` (a chain's step names in order) lets a ``cursor`` event after a
    step's ``finished`` say which step the exit trigger chose."""
    out: dict[str, ItemHistory] = {}
    last_finished: str | None = None

    def of(name: str) -> ItemHistory:
        if name not in out:
            out[name] = ItemHistory(name)
        return out[name]

    for ev in events:
        kind = ev.get("ev")
        at = str(ev.get("at") or "")
        name = ev.get("item")
        if kind == "cursor" and last_finished is not None:
            idx = _int(ev.get("index"))
            if steps is not None and idx is not None:
                target = steps[idx] if 0 <= idx < len(steps) else "the end of the chain"
                of(last_finished).trigger = f"→ {target}"
            last_finished = None
            continue
        if kind == "finished_run":
            if last_finished is not None and out[last_finished].trigger is None:
                out[last_finished].trigger = "→ end of run"
            continue
        if not isinstance(name, str):
            continue
        h = of(name)
        if kind == "accepted":
            number = _int(ev.get("attempt")) or len(h.attempts) + 1
            h.attempts.append(Attempt(number, start=at))
        elif kind == "finished":
            number = _int(ev.get("attempt")) or (h.attempts[-1].number if h.attempts else 1)
            att = next((a for a in reversed(h.attempts) if a.number == number), None)
            if att is None:
                att = Attempt(number)
                h.attempts.append(att)
            att.end = at
            att.result = str(ev.get("result") or "")
            err = ev.get("error")
            att.error = str(err) if err else None
            att.duration_ms = _int(ev.get("duration_ms"))
            agent = ev.get("agent")
            if isinstance(agent, str) and agent:
                att.agent = h.agent = agent
            last_finished = name if att.result != "interrupted" else last_finished
        elif kind == "retry":
            h.events.append((at, f"retry after {ev.get('not_before') or '?'}"))
        elif kind == "escalated":
            h.events.append((at, f"escalated ({ev.get('kind') or '?'}): {ev.get('escalation') or ''}"))
        elif kind == "gate":
            h.events.append((at, f"gate {ev.get('state') or '?'}"))
            if ev.get("state") == "pending":
                h.trigger = "→ human gate"
        elif kind == "decided":
            h.events.append(
                (at, f"decided {ev.get('option') or '?'} by {ev.get('by') or '?'} via {ev.get('channel') or '?'}")
            )
            if ev.get("channel") == "trigger":
                h.trigger = f"→ {ev.get('action') or 'abort'} (exit trigger)"
        elif kind == "skipped":
            h.events.append((at, "skipped before start" if ev.get("before_start") else "skipped"))
        elif kind == "interrupted":
            h.events.append((at, f"interrupted ({ev.get('reason') or 'stop'})"))
        elif kind == "added":
            h.events.append((at, "added by an exit trigger"))
            if last_finished is not None and last_finished != name:
                of(last_finished).trigger = f"→ spawn {name}"
        elif kind == "reset":
            h.events.append((at, "reset: run again by a loop back"))
    return out


def item_title(name: str, status: str, attempt: int, duration_ms: int, error: str | None) -> str:
    """A grid cell's hover text: name, status, attempt, duration, the first line of the error."""
    parts = [f"{name}: {status}"]
    if attempt:
        parts.append(f"attempt {attempt}")
    if duration_ms:
        parts.append(f"{duration_ms / 1000:.1f} s")
    text = ", ".join(parts)
    if error:
        first = error.strip().splitlines()[0] if error.strip() else ""
        text += f"\n{first[:200]}"
    return text
