"""A turn of an agent's live thread (spec/001), and the record a delivered packet adds: pure.

Which thread a packet goes to (:func:`turn_from_packet`, :func:`turn_record`), the bounds every turn keeps (text,
ids, a payload summary: :func:`bound_payload`), the agent names a thread folder may have, and the clean one-line
text the thread's views and its handoff are written in. The files are :mod:`~ambient.live.threads`'."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, JsonValue, field_validator

from ambient.core.errors import UnsafePathError

TEXT_MAX = 2000
PAYLOAD_MAX_CHARS = 4096
# Principals that have no thread of their own.
NO_THREAD = frozenset({"human", "broadcast", "pilote", ""})

Role = Literal["requester", "agent", "system"]

_AGENT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_SURROGATES = re.compile(r"[\ud800-\udfff]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
_SPACES = re.compile(r"\s+")
_OBJECTIVE_KEYS = ("objective", "goal", "task", "story_angle", "brief")


def check_agent_name(name: str) -> str:
    """An agent name safe as a directory name (letters, digits, ``_ . -``, at most 64, no ``..``)."""
    if not isinstance(name, str) or not _AGENT_RE.fullmatch(name) or ".." in name:
        raise UnsafePathError(
            f"agent name {name!r} is not usable for a live thread; expected letters, digits, '_', '.', '-' "
            "(at most 64, no path separator, no '..')"
        )
    return name


def _safe(text: str) -> str:
    """Text that encodes as UTF-8: lone surrogates (possible in JSON input) become U+FFFD."""
    if text.isascii():  # the common case, without encoding a copy
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATES.sub("\ufffd", text)
    return text


def bound_payload(value: Any, *, depth: int = 4, max_str: int = 300, max_items: int = 20) -> JsonValue:
    """A bounded JSON summary of a payload: strings cut, lists and mappings shortened, depth capped,
    and at most 4096 characters of JSON in all."""
    out = _bound(value, depth, max_str, max_items)
    # ``out`` holds JSON types only, and no character of a string takes more than 6 in JSON (``\u0000``), the
    # quotes included, against at least 1 in its repr; numbers and the rest are as long: the JSON is at most 6
    # times the repr. A repr costs ~1 µs, a ``json.dumps`` call ~6 (two turns per fan-out item).
    if len(repr(out)) * 6 <= PAYLOAD_MAX_CHARS:
        return out
    text = json.dumps(out, ensure_ascii=False)
    if len(text) > PAYLOAD_MAX_CHARS:
        return {"summary": text[: PAYLOAD_MAX_CHARS // 4] + "…"}
    return out


_SEQUENCES = (list, tuple)


def _bound(value: Any, depth: int, max_str: int, max_items: int) -> JsonValue:
    kind = type(value)  # exact builtin types first: an ABC isinstance check per node was most of the cost
    if value is None or kind is int or kind is float or kind is bool:
        return value  # type: ignore[no-any-return]
    if kind is str:
        return _safe(value[:max_str] + "…" if len(value) > max_str else value)
    if isinstance(value, float):  # a subclass: its plain value (same JSON; its own repr may differ)
        return float.__float__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, str):
        return _safe(value[:max_str] + ("…" if len(value) > max_str else ""))
    if depth <= 0:
        return "…"
    if kind is dict or isinstance(value, Mapping):
        out: dict[str, JsonValue] = {}
        for i, (k, v) in enumerate(value.items()):
            if i >= max_items:
                out["…"] = f"{len(value) - max_items} more"
                break
            out[_safe(str(k)[:64])] = _bound(v, depth - 1, max_str, max_items)
        return out
    if kind is list or isinstance(value, _SEQUENCES):
        items: list[JsonValue] = [_bound(v, depth - 1, max_str, max_items) for v in value[:max_items]]
        if len(value) > max_items:
            items.append(f"… {len(value) - max_items} more")
        return items
    return _safe(str(value)[:max_str])


class Turn(BaseModel):
    """One turn of an agent's thread, with its attribution (spec/001)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ts: datetime
    target: str  # the agent whose thread this is
    requester: str
    correlation_id: str | None = None
    role: Role
    source: str = "router"  # who appended it: router, engine, cli, runner
    signal: str
    text: str = ""  # bounded to 2000 characters
    payload: JsonValue = None  # bounded summary (bound_payload)

    @field_validator("target")
    @classmethod
    def _target_name(cls, v: str) -> str:
        try:
            return check_agent_name(v)
        except UnsafePathError as exc:
            raise ValueError(exc.message) from None

    @field_validator("text", mode="before")
    @classmethod
    def _bound_text(cls, v: Any) -> Any:
        if isinstance(v, str):
            return _safe(v if len(v) <= TEXT_MAX else v[: TEXT_MAX - 1] + "…")
        return v

    @field_validator("payload", mode="before")
    @classmethod
    def _bound_payload(cls, v: Any) -> Any:
        return bound_payload(v)

    @field_validator("requester", "source", "signal", "correlation_id")
    @classmethod
    def _bound_ids(cls, v: str | None) -> str | None:
        return None if v is None else _safe(v[:200])


def _get(mapping: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if k in mapping:
            return mapping[k]
    return None


def objective_in(mapping: Mapping[str, Any]) -> Any:
    """What a mapping (a packet's payload or its context) gives as the objective, if it names one."""
    return _get(mapping, *_OBJECTIVE_KEYS)


# Made once: ``json.dumps`` with options builds an encoder per call (turn records are written in bulk).
_COMPACT = json.JSONEncoder(ensure_ascii=False, default=str, separators=(",", ":"))


def compact(value: Any) -> str:
    """A value as short text: a string as it is, a mapping's objective, else its compact JSON (bounded)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        hit = objective_in(value)
        if isinstance(hit, str):
            return hit
    return _COMPACT.encode(value)[:TEXT_MAX]


def packet_text(signal: str, payload: Any) -> str:
    """A one-line text for a packet: the result of a RETURN, the options of an ESCALATE, else its context."""
    if not isinstance(payload, Mapping):
        return compact(payload)
    if signal == "RETURN":
        return compact(payload.get("result"))
    if signal == "ESCALATE":
        options = payload.get("options") or []
        return "options: " + " | ".join(str(o) for o in options) if isinstance(options, list) else compact(options)
    if signal == "HANDOFF" and payload.get("decision") is not None:
        return f"decision: {compact(payload.get('decision'))}; context: {compact(payload.get('context'))}"
    return compact(payload.get("context"))


def turn_from_packet(
    packet: Mapping[str, Any], *, ts: datetime, correlation_id: str | None = None, source: str = "router"
) -> Turn | None:
    """The turn a delivered packet adds, in the thread of the agent it concerns; ``None`` when no
    agent thread is concerned (to/from human or broadcast).

    SPAWN and HANDOFF go to the receiver's thread (role ``requester``); RETURN, ESCALATE,
    BLOCKED_ON, ERROR, CHECKPOINT and other signals to the sender's (role ``agent``). The
    correlation defaults to the packet's ``session_id``. ``packet`` is the JSON form (``from``).
    """
    at = _thread_of(packet, correlation_id)
    if at is None:
        return None
    return Turn(
        ts=ts,
        target=at.owner,
        requester=at.requester or "-",
        correlation_id=str(at.corr) if at.corr is not None else None,
        role=at.role,  # type: ignore[arg-type]
        source=source,
        signal=at.signal,
        text=packet_text(at.signal, at.payload),
        payload=at.payload,
    )


class _ThreadOf(NamedTuple):
    owner: str
    requester: str
    role: str
    signal: str
    corr: Any
    payload: Any


def _thread_of(packet: Mapping[str, Any], correlation_id: str | None) -> _ThreadOf | None:
    """Whose thread a packet goes to, and as what (see :func:`turn_from_packet`); None for no agent's."""
    signal = str(packet.get("signal", ""))
    sender = str(_get(packet, "from", "from_") or "")
    receiver = str(packet.get("to") or "")
    if signal in ("SPAWN", "HANDOFF"):
        owner, requester, role = receiver, sender, "requester"
    else:
        owner, requester, role = sender, receiver, "agent"
    if owner in NO_THREAD:
        return None
    check_agent_name(owner)
    corr = correlation_id if correlation_id is not None else packet.get("session_id")
    payload = packet.get("payload")
    return _ThreadOf(owner, requester, role, signal, corr, payload)


def turn_record(
    packet: Mapping[str, Any], *, ts: datetime, correlation_id: str | None = None, source: str = "router"
) -> dict[str, Any] | None:
    """The JSON record of :func:`turn_from_packet` built directly (what ``Turn.model_dump`` would write).

    Performance (bench/fanout.py): the daemon records two turns per fan-out item; building and dumping the
    ``Turn`` model took ~60 µs of a worker thread's GIL time per turn. Same bounds and checks as the model's
    validators; ``Turn.model_validate`` of the record equals the model (hypothesis-tested).
    """
    at = _thread_of(packet, correlation_id)
    if at is None:
        return None
    text = packet_text(at.signal, at.payload)
    record: dict[str, Any] = {
        "ts": ts.isoformat(),
        "target": at.owner,
        "requester": _safe((at.requester or "-")[:200]),
    }
    if at.corr is not None:
        record["correlation_id"] = _safe(str(at.corr)[:200])
    record["role"] = at.role
    record["source"] = _safe(source[:200])
    record["signal"] = _safe(at.signal[:200])
    record["text"] = _safe(text if len(text) <= TEXT_MAX else text[: TEXT_MAX - 1] + "…")
    bounded = bound_payload(at.payload)
    if bounded is not None:
        record["payload"] = bounded
    return record


def one_line(text: str, limit: int = 400) -> str:
    """One line of clean text: no control characters or line breaks, whitespace collapsed."""
    t = _safe(text[: limit * 2])
    t = _SPACES.sub(" ", _CONTROL.sub(" ", t)).strip()
    return cut(t, limit)


def cut(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, an ellipsis marking a cut."""
    if len(text) <= limit:
        return text
    if limit <= 0:
        return ""
    # Never leave a joiner or a variation selector dangling before the ellipsis.
    return text[: limit - 1].rstrip("\u200d\ufe0e\ufe0f ") + "…"
