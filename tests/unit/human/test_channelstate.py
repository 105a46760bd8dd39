"""The rules of the channels' states: when a state moved, why a bot is off, which secrets changed (by hash)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from ambient.human.channelstate import (
    ChannelState,
    describe,
    digests,
    moved,
    secrets_changed,
    telegram_off_reason,
    with_state,
)

T0 = datetime(2026, 12, 7, 6, 0, tzinfo=UTC)


def _state(state: str = "up", why: str | None = None, since: datetime = T0) -> ChannelState:
    return ChannelState.model_validate(
        {
            "channel": "telegram",
            "key": "telegram:k",
            "target": "telegram bot -> chat 42",
            "state": state,
            "why": why,
            "since": since,
        }
    )


def test_a_state_moves_on_a_new_state_or_a_new_reason_only() -> None:
    off = _state("off", "the Bot API refused the bot token (HTTP 401 Unauthorized)")
    assert moved(None, "checking", None)
    assert moved(off, "up", None)
    assert moved(off, "off", "cannot reach the Bot API (network error): timed out")
    assert not moved(off, "off", off.why)
    assert not moved(_state("up"), "up", None)


def test_since_is_when_the_state_began_not_the_last_report() -> None:
    later = T0 + timedelta(minutes=5)
    off = _state("off", "a", since=T0)
    kw = {"channel": "telegram", "key": "telegram:k", "target": "t"}
    assert with_state(off, state="off", why="b", now=later, **kw).since == T0  # type: ignore[arg-type]
    assert with_state(off, state="up", why=None, now=later, **kw).since == later  # type: ignore[arg-type]
    assert with_state(None, state="off", why="a", now=later, **kw).since == later  # type: ignore[arg-type]


def test_why_a_bot_is_off_in_words_a_person_acts_on() -> None:
    assert "refused the bot token" in telegram_off_reason(401, "getMe: HTTP 401: Unauthorized")
    assert "HTTP 404" in telegram_off_reason(404, "x")
    assert telegram_off_reason(None, "ConnectError: refused").startswith("cannot reach the Bot API (network error)")
    assert "HTTP 502: getMe: HTTP 502" in telegram_off_reason(502, "getMe: HTTP 502")
    line = describe(_state("off", "the Bot API refused the bot token (HTTP 401 Unauthorized)"))
    assert line.startswith("Telegram answers (telegram bot -> chat 42) are off: the Bot API refused")
    assert describe(_state("checking", "the Bot API is being asked")).endswith(
        "are being checked: the Bot API is being asked"
    )


def test_secrets_are_compared_by_hash_and_named_never_shown() -> None:
    token_a, token_b = "123456789:AAH-first_token_abcdefghijklmnop", "123456789:AAH-second_token_abcdefghijklmno"
    old = digests({"telegram.token_file": token_a, "ANTHROPIC_API_KEY": None})
    new = digests({"telegram.token_file": token_b, "ANTHROPIC_API_KEY": "sk-ant-new-key-0123456789"})
    assert token_a not in str(old) and token_b not in str(new)
    assert secrets_changed(old, new) == ["ANTHROPIC_API_KEY", "telegram.token_file"]
    assert secrets_changed(new, new) == []
    assert secrets_changed(new, digests({"telegram.token_file": token_b})) == ["ANTHROPIC_API_KEY"]  # one went


@given(st.dictionaries(st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), st.text(min_size=1))))
def test_unchanged_secrets_never_count_as_changed(values: dict[str, str | None]) -> None:
    assert secrets_changed(digests(values), digests(dict(values))) == []
