"""Shared by the live tests: a delivered packet in its JSON form and a turn of the qa thread."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from ambient.live.turn import Turn

T0 = datetime(2026, 3, 18, 10, 0, tzinfo=UTC)


def packet(signal: str, frm: str, to: str, session: str | None = "sess-1", **payload: Any) -> dict[str, Any]:
    """A delivered packet in its JSON form."""
    return {
        "from": frm,
        "to": to,
        "signal": signal,
        "scope": {"files": [], "zone": "project"},
        "payload": payload,
        "session_id": session,
    }


def turn(
    signal: str = "SPAWN",
    *,
    requester: str = "orchestrator",
    role: str = "requester",
    corr: str | None = "c1",
    text: str = "do it",
    minutes: int = 0,
    payload: Any = None,
    target: str = "qa",
) -> Turn:
    """A turn of the qa thread."""
    return Turn(
        ts=T0 + timedelta(minutes=minutes),
        target=target,
        requester=requester,
        correlation_id=corr,
        role=role,
        signal=signal,
        text=text,
        payload=payload,
    )
