"""Whether each notification channel reaches the person now: the states the daemon keeps (and writes for the CLI),
why a channel is off in words a person acts on, and which secrets changed between two loads. Pure.

The daemon is the only one that knows whether its Telegram bot was refused or its token unreadable: ``ambient
doctor`` and ``ambient notify test`` read these states instead of judging the configuration again (a token file fixed
but not reloaded reads fine from the CLI while the daemon still runs without a bot).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict

#: up: its last message was taken; off: it does not take them (``why`` says why); checking: the Telegram bot just
#: (re)started, being asked; untried: a URL nothing was sent to since the daemon (re)loaded it, so nobody knows yet.
State = Literal["up", "off", "checking", "untried"]


class ChannelState(BaseModel):
    """One channel of the running daemon: the Telegram answers bot or one apprise URL (shown masked)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    channel: Literal["telegram", "apprise"]
    key: str  # the target's stable, secret-free id (``ambient.human.notify.target_key``)
    target: str  # the target as a person may see it, secrets masked
    state: State
    why: str | None = None
    since: AwareDatetime


class ChannelsReport(BaseModel):
    """What the daemon writes to ``.ambient/notifications.json`` at each change of a channel's state."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pid: int
    written_at: AwareDatetime
    channels: tuple[ChannelState, ...] = ()


def moved(old: ChannelState | None, state: State, why: str | None) -> bool:
    """Whether a channel's state changed (a new reason to be off counts: the person should read the new one)."""
    return old is None or old.state != state or old.why != why


def with_state(
    old: ChannelState | None,
    *,
    channel: Literal["telegram", "apprise"],
    key: str,
    target: str,
    state: State,
    why: str | None,
    now: datetime,
) -> ChannelState:
    """The channel's new state; ``since`` moves only when the state itself changes."""
    since = old.since if old is not None and old.state == state else now
    return ChannelState(channel=channel, key=key, target=target, state=state, why=why, since=since)


def telegram_off_reason(code: int | None, detail: str) -> str:
    """Why the Telegram bot is off, from what the Bot API (or the network) answered; ``detail`` is already redacted."""
    if code == 401:
        return "the Bot API refused the bot token (HTTP 401 Unauthorized): the token is wrong or was revoked"
    if code == 404:
        return "the Bot API does not know this bot token (HTTP 404 Not Found)"
    if code is None:
        return f"cannot reach the Bot API (network error): {detail}"
    return f"the Bot API answered HTTP {code}: {detail}"


def describe(state: ChannelState) -> str:
    """One line for a person: ``Telegram answers (telegram bot -> chat 42) are off: <why>``."""
    what = (
        f"Telegram answers ({state.target}) are"
        if state.channel == "telegram"
        else f"notification URL {state.target} is"
    )
    how = {"checking": "being checked", "untried": "not tried yet"}.get(state.state, state.state)
    why = f": {state.why}" if state.why else ""
    return f"{what} {how}{why}"


def digests(secrets: Mapping[str, str | None]) -> dict[str, str]:
    """Each present secret by name as its sha256 (what a reload compares and keeps: never the value)."""
    return {name: hashlib.sha256(value.encode()).hexdigest() for name, value in secrets.items() if value is not None}


def secrets_changed(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    """The names of the secrets that appeared, went or changed between two :func:`digests`."""
    names: Iterable[str] = set(old) | set(new)
    return sorted(n for n in names if old.get(n) != new.get(n))
