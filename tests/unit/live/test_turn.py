"""A turn and the record a packet adds: which thread, attribution, bounded text and payload, agent names."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambient.core.errors import UnsafePathError
from ambient.live.turn import PAYLOAD_MAX_CHARS, bound_payload, check_agent_name, turn_from_packet, turn_record
from tests.unit.live.helpers import T0, packet, turn


class TestPackets:
    def test_spawn_goes_to_the_receivers_thread(self) -> None:
        """A SPAWN is a turn of the target agent's thread, asked by the sender; the session is the correlation."""
        t = turn_from_packet(packet("SPAWN", "main", "qa", context={"objective": "check the token"}), ts=T0)
        assert t is not None
        assert (t.target, t.requester, t.role, t.correlation_id, t.text) == (
            "qa",
            "main",
            "requester",
            "sess-1",
            "check the token",
        )

    def test_answers_go_to_the_senders_thread(self) -> None:
        """RETURN, ESCALATE, BLOCKED_ON go to the answering agent's thread, attributed to whom it answers."""
        r = turn_from_packet(packet("RETURN", "qa", "main", result="token is 7F3A"), ts=T0, correlation_id="c9")
        assert r is not None and (r.target, r.requester, r.role, r.correlation_id, r.text) == (
            "qa",
            "main",
            "agent",
            "c9",
            "token is 7F3A",
        )
        e = turn_from_packet(packet("ESCALATE", "qa", "human", options=["a", "b"]), ts=T0)
        assert e is not None and e.text == "options: a | b" and e.target == "qa"

    def test_no_thread_for_people_or_broadcast(self) -> None:
        """Packets to a person or to everyone concern no agent thread."""
        assert turn_from_packet(packet("SPAWN", "main", "broadcast"), ts=T0) is None
        assert turn_from_packet(packet("RETURN", "human", "qa"), ts=T0) is None

    def test_unsafe_agent_in_packet_is_refused(self) -> None:
        """A packet naming an agent with a path in it never becomes a directory."""
        with pytest.raises(UnsafePathError):
            turn_from_packet(packet("SPAWN", "main", "../etc"), ts=T0)

    def test_text_and_payload_are_bounded(self) -> None:
        """A turn keeps at most 2000 characters of text and a bounded payload summary."""
        t = turn(text="x" * 10_000, payload={"context": {"blob": "y" * 100_000, "list": list(range(1000))}})
        assert len(t.text) == 2000 and t.text.endswith("…")
        assert len(json.dumps(t.payload)) <= 4096
        assert bound_payload({"a": {"b": {"c": {"d": {"e": 1}}}}}) == {"a": {"b": {"c": {"d": "…"}}}}
        assert bound_payload("\ud800 lone") == "\ufffd lone"

    def test_real_agent_names_are_accepted(self) -> None:
        """Names of the corpus (camelCase, hyphens, dots, underscores) are fine."""
        for name in ("helloWorld", "code-review", "brain.ui", "kanban_scribe", "a"):
            assert check_agent_name(name) == name


_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=400)),
    lambda inner: st.one_of(st.lists(inner, max_size=25), st.dictionaries(st.text(max_size=80), inner, max_size=25)),
    max_leaves=60,
)


@settings(max_examples=300, deadline=None)
@given(
    signal=st.sampled_from(["SPAWN", "RETURN", "ESCALATE", "HANDOFF", "ERROR", "CHECKPOINT", "BLOCKED_ON", ""]),
    sender=st.sampled_from(["ambient", "qa", "human", "dev-1", "broadcast"]),
    receiver=st.sampled_from(["qa", "ambient", "pilote", "coder", ""]),
    payload=st.one_of(_json, st.fixed_dictionaries({"result": _json, "context": _json, "options": _json})),
    corr=st.one_of(st.none(), st.text(max_size=300)),
    session=st.one_of(st.none(), st.text(max_size=30)),
    source=st.text(min_size=1, max_size=250),
)
@pytest.mark.slow
def test_turn_record_is_what_the_model_writes(
    signal: str, sender: str, receiver: str, payload: Any, corr: str | None, session: str | None, source: str
) -> None:
    """The daemon's direct record and the Turn model agree on every packet: same thread, same turn."""
    packet = {"signal": signal, "from": sender, "to": receiver, "payload": payload, "session_id": session}
    ts = datetime(2026, 11, 30, 12, 0, 1, 123456, tzinfo=UTC)
    model = turn_from_packet(packet, ts=ts, correlation_id=corr, source=source)
    record = turn_record(packet, ts=ts, correlation_id=corr, source=source)
    if model is None:
        assert record is None
        return
    assert record is not None
    assert json.loads(json.dumps(record)) == {**model.model_dump(mode="json", exclude_none=True), "ts": ts.isoformat()}


class _Str(str):
    pass


class _Int(int):
    def __repr__(self) -> str:  # a repr shorter than the JSON: bound_payload's size check must not trust it
        return "0"


def _reference_bound(value: Any, depth: int = 4, max_str: int = 300, max_items: int = 20) -> Any:
    """The bounding rule written plainly (as it was before the exact-type fast paths), as an oracle."""
    from collections.abc import Mapping

    def safe(text: str) -> str:
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)

    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int | float):  # subclasses come out as plain numbers (the same JSON)
        return float(value) if isinstance(value, float) else int(value)
    if isinstance(value, str):
        return safe(value[:max_str] + ("…" if len(value) > max_str else ""))
    if depth <= 0:
        return "…"
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for i, (k, v) in enumerate(value.items()):
            if i >= max_items:
                out["…"] = f"{len(value) - max_items} more"
                break
            out[safe(str(k)[:64])] = _reference_bound(v, depth - 1, max_str, max_items)
        return out
    if isinstance(value, list | tuple):
        items = [_reference_bound(v, depth - 1, max_str, max_items) for v in value[:max_items]]
        if len(value) > max_items:
            items.append(f"… {len(value) - max_items} more")
        return items
    return safe(str(value)[:max_str])


_odd_json = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False),
        st.text(max_size=400),
        st.text(max_size=40).map(_Str),
        st.integers().map(_Int),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=25),
        st.lists(inner, max_size=5).map(tuple),
        st.dictionaries(st.text(max_size=80), inner, max_size=25),
    ),
    max_leaves=60,
)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(value=_odd_json)
def test_bounding_takes_fast_paths_without_changing_the_result(value: Any) -> None:
    """bound_payload's exact-type shortcuts give what the plain rule gives, subclasses and lone surrogates too
    (including its size check from the repr, which must never let a payload over ``PAYLOAD_MAX_CHARS`` through)."""
    expected = _reference_bound(value)
    text = json.dumps(expected, ensure_ascii=False)
    if len(text) > PAYLOAD_MAX_CHARS:
        expected = {"summary": text[: PAYLOAD_MAX_CHARS // 4] + "…"}
    got = bound_payload(value)
    assert got == expected and type(got) is type(expected)


def test_the_size_check_does_not_trust_a_short_repr() -> None:
    """bound_payload skips its JSON size check when six times the repr fits (no character takes more than six in
    JSON): numbers whose subclass has a short repr, and strings of control characters, still get summarised."""
    big = [_Int(10**299)] * 20  # 6,000 characters of JSON, a repr of 80
    got = bound_payload(big)
    assert isinstance(got, dict) and set(got) == {"summary"}
    controls = ["\x01" * 300] * 3  # \u0001 is six characters in JSON, \x01 four in the repr
    assert len(json.dumps(_reference_bound(controls), ensure_ascii=False)) > PAYLOAD_MAX_CHARS
    assert set(bound_payload(controls)) == {"summary"}  # type: ignore[arg-type]
    small = {"item": "item-00001", "n": _Int(3), "x": 1.5}
    assert bound_payload(small) == small and type(bound_payload(small)["n"]) is int  # type: ignore[index]
