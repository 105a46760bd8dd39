"""The context packet of ADR-026 (DESIGN 2.1-2.2): strict models and the signal → payload rule.

Pure rules: no routing, logging, clock or files. The shell stamps ``id`` and ``ts`` (it passes
``now``); :mod:`ambient.kernel.router` is the only path a packet takes between principals.

Rules enforced at validation (a violation names the signal, the field and what is allowed):

==============  ===================================================  =================================
signal          payload it may carry                                 other constraints
==============  ===================================================  =================================
SPAWN           scope.files, payload.context                         --
RETURN          payload.result only (never the source context)       --
BLOCKED_ON      payload.context (the blocker, required)              --
ESCALATE        payload.options (required, non-empty); context may   --
                hold only ``question`` (one string: what is asked)
ERROR           payload.context (the error, required)                --
CHECKPOINT      payload.context (the snapshot)                       ``to`` must be ``bsi``
HANDOFF         payload.context + payload.decision                   ``to`` must equal ``from``
                                                                     and ``session_id`` is required
ORCHESTRATE     context {workflow*, step, context}                   --
ADAPT           context {workflow*, changes*}                        to ``ambient``: changes is
                                                                     ``{skip: [item, ...]}``
ABORT           context {workflow*, reason*}                         --
STEP_DONE       context {step*, result*}                             --
GATE_PENDING    context {step*, message*}                            --
BLOCKED         context {step*, reason*}                             --
DONE            context {workflow*, summary*}                        --
CIRCUIT_BREAK   context {step*, fails*}                              --
NOTIFY          context {message*}                                   the only signal that may go to
                                                                     ``broadcast``
==============  ===================================================  =================================

(``*`` = required key.) ``scope.zone`` is an address, not payload: every signal may carry it and
the access matrix checks it. ``scope.files`` is task input, so only SPAWN may carry it. A field
"is carried" when it is non-empty (``context: {}``, ``options: []``, ``decision: null`` and
``result: null`` are the absent forms the ADR itself writes). The orchestration signals of
spec/004 keep their documented fields in ``payload.context`` with exactly those keys.

Bounds (a packet is refused beyond them): raw JSON/YAML at most :data:`MAX_PACKET_BYTES`
(checked before parsing); any string at most :data:`MAX_STR` characters; at most
:data:`MAX_FILES` files of :data:`MAX_PATH` characters; at most :data:`MAX_OPTIONS` options of
:data:`MAX_OPTION` characters; ``payload.context``/``decision`` nested at most
:data:`MAX_JSON_DEPTH` levels and ``payload.result`` at most :data:`MAX_RESULT_DEPTH` (a RETURN
cannot smuggle a deep copy of what the child saw, S-04); the payload holds at most
:data:`MAX_PAYLOAD_NODES` JSON values and :data:`MAX_PAYLOAD_CHARS` characters of strings.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Annotated, Any, Final

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ambient.core.errors import PacketError, YamlError

KiB: Final = 1024
MAX_PACKET_BYTES: Final = 256 * KiB
MAX_STR: Final = 64 * KiB
MAX_NAME: Final = 64
MAX_FILES: Final = 256
MAX_PATH: Final = 1024
MAX_OPTIONS: Final = 16
MAX_OPTION: Final = 512
MAX_QUESTION: Final = 2048
MAX_JSON_DEPTH: Final = 16
MAX_RESULT_DEPTH: Final = 8
MAX_PAYLOAD_NODES: Final = 10_000
MAX_PAYLOAD_CHARS: Final = 256 * KiB

BROADCAST: Final = "broadcast"
AMBIENT: Final = "ambient"  # the daemon, as a principal
CLAIMS_STORE: Final = "bsi"  # ADR-026 "BSI": the claims store, CHECKPOINT's only destination

NAME_PATTERN: Final = rf"^[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_NAME - 1}}}$"  # agent, human, ambient...
ID_PATTERN: Final = r"^pkt_[0-9a-f]{8,32}$"
ZONE_PATTERN: Final = r"^[a-z][a-z0-9_-]{0,31}$"


class Signal(StrEnum):
    """Kernel signals of ADR-026 plus the orchestration signals of spec/004 (kernel-orchestrator)."""

    SPAWN = "SPAWN"
    RETURN = "RETURN"
    BLOCKED_ON = "BLOCKED_ON"
    CHECKPOINT = "CHECKPOINT"
    HANDOFF = "HANDOFF"
    ESCALATE = "ESCALATE"
    ERROR = "ERROR"
    ORCHESTRATE = "ORCHESTRATE"
    ADAPT = "ADAPT"
    ABORT = "ABORT"
    STEP_DONE = "STEP_DONE"
    GATE_PENDING = "GATE_PENDING"
    BLOCKED = "BLOCKED"
    DONE = "DONE"
    CIRCUIT_BREAK = "CIRCUIT_BREAK"
    NOTIFY = "NOTIFY"


KERNEL_SIGNALS: Final = frozenset(
    {
        Signal.SPAWN,
        Signal.RETURN,
        Signal.BLOCKED_ON,
        Signal.CHECKPOINT,
        Signal.HANDOFF,
        Signal.ESCALATE,
        Signal.ERROR,
    }
)
ORCHESTRATION_SIGNALS: Final = frozenset(Signal) - KERNEL_SIGNALS
BROADCAST_SIGNALS: Final = frozenset({Signal.NOTIFY})

# Payload field names as the rule table and error messages spell them.
CONTEXT, DECISION, OPTIONS, RESULT, FILES = (
    "payload.context",
    "payload.decision",
    "payload.options",
    "payload.result",
    "scope.files",
)


@dataclass(frozen=True)
class SignalRule:
    """What one signal may carry: payload fields, required fields, and the keys its context may hold."""

    allowed: frozenset[str]
    required: frozenset[str] = frozenset()
    context_keys: Mapping[str, tuple[type, ...]] | None = None  # None: any keys
    required_keys: frozenset[str] = frozenset()

    def describe(self) -> str:
        """Human text of what the signal allows, for error messages."""
        if self.context_keys is not None and self.allowed == {CONTEXT}:
            keys = ", ".join(k + ("*" if k in self.required_keys else "") for k in self.context_keys)
            return f"only payload.context with keys {{{keys}}} (* = required)"
        parts = sorted(self.allowed)
        text = "only " + " + ".join(parts) if parts else "no payload"
        if self.context_keys is not None and CONTEXT in self.allowed:
            text += f" (payload.context may hold only {', '.join(self.context_keys)})"
        return text


_STR = (str,)
_STEP = (int, str)
_ANY: tuple[type, ...] = (object,)


def _orch(keys: dict[str, tuple[type, ...]], required: set[str]) -> SignalRule:
    return SignalRule(
        allowed=frozenset({CONTEXT}),
        required=frozenset({CONTEXT}),
        context_keys=keys,
        required_keys=frozenset(required),
    )


SIGNAL_RULES: Final[Mapping[Signal, SignalRule]] = MappingProxyType(
    {
        Signal.SPAWN: SignalRule(allowed=frozenset({FILES, CONTEXT})),
        Signal.RETURN: SignalRule(allowed=frozenset({RESULT})),
        Signal.BLOCKED_ON: SignalRule(allowed=frozenset({CONTEXT}), required=frozenset({CONTEXT})),
        Signal.ESCALATE: SignalRule(
            allowed=frozenset({OPTIONS, CONTEXT}),
            required=frozenset({OPTIONS}),
            context_keys={"question": _STR},
        ),
        Signal.ERROR: SignalRule(allowed=frozenset({CONTEXT}), required=frozenset({CONTEXT})),
        Signal.CHECKPOINT: SignalRule(allowed=frozenset({CONTEXT})),
        Signal.HANDOFF: SignalRule(allowed=frozenset({CONTEXT, DECISION})),
        # spec/004 "Interface avec brain-hypervisor": each signal's documented fields, nothing else.
        Signal.ORCHESTRATE: _orch({"workflow": _STR, "step": _STEP, "context": _ANY}, {"workflow"}),
        Signal.ADAPT: _orch({"workflow": _STR, "changes": _ANY}, {"workflow", "changes"}),
        Signal.ABORT: _orch({"workflow": _STR, "reason": _STR}, {"workflow", "reason"}),
        Signal.STEP_DONE: _orch({"step": _STEP, "result": _ANY}, {"step", "result"}),
        Signal.GATE_PENDING: _orch({"step": _STEP, "message": _STR}, {"step", "message"}),
        Signal.BLOCKED: _orch({"step": _STEP, "reason": _STR}, {"step", "reason"}),
        Signal.DONE: _orch({"workflow": _STR, "summary": _ANY}, {"workflow", "summary"}),
        Signal.CIRCUIT_BREAK: _orch({"step": _STEP, "fails": (int,)}, {"step", "fails"}),
        Signal.NOTIFY: _orch({"message": _STR}, {"message"}),
    }
)


def new_packet_id() -> str:
    """A fresh packet id ``pkt_<16 hex>``."""
    return f"pkt_{secrets.token_hex(8)}"


# --- field types ---------------------------------------------------------------------------

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
Zone = Annotated[str, StringConstraints(pattern=ZONE_PATTERN)]
ShortStr = Annotated[str, StringConstraints(min_length=1, max_length=128)]


# Already-normal paths of ordinary components (no '.'/'..'/empty part, no NUL or backslash): the common case.
# At most 63 characters per component keeps it under 255 bytes even in 4-byte UTF-8; longer ones take the slow path.
_PLAIN_PATH = re.compile(r"(?:[^/\x00\\.][^/\x00\\]{0,62}/)*[^/\x00\\.][^/\x00\\]{0,62}/?")


def _check_path(path: str) -> str:
    """Normalise a scope path (like :func:`ambient.kernel.zones.normalize`), refusing escapes without echoing
    the path: rejected packets are logged by size and hash only (S-04)."""
    if _PLAIN_PATH.fullmatch(path):
        return path
    if "\x00" in path:
        problem = "contains a NUL byte"
    elif "\\" in path:
        problem = "contains a backslash; use '/' separators"
    elif path[:1] == "/":
        problem = "is absolute; expected a path relative to the brain root"
    else:
        parts = [p for p in path.split("/") if p and p != "."]
        if ".." in parts:
            problem = "contains '..'; expected a path inside the brain root"
        elif not parts:
            problem = "is empty; expected a file or folder of the brain"
        elif len(path) > 63 and any(len(p.encode()) > 255 for p in parts):
            problem = "has a component longer than 255 bytes"
        else:
            out = "/".join(parts)
            return out + "/" if path[-1] == "/" else out
    raise PydanticCustomError("unsafe_path", "path {problem}", {"problem": problem})


ScopePath = Annotated[str, StringConstraints(min_length=1, max_length=MAX_PATH), AfterValidator(_check_path)]


def _to_utc(ts: datetime) -> datetime:
    if ts.tzinfo is UTC:
        return ts
    if ts.tzinfo is None or ts.utcoffset() is None:
        raise PydanticCustomError("naive_datetime", "timestamp must carry a timezone (UTC), e.g. 2026-03-18T10:00:00Z")
    return ts.astimezone(UTC)


class _Strict(BaseModel):
    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        frozen=True,
        str_max_length=MAX_STR,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )


class Scope(_Strict):
    """Where the work is: exact brain-relative paths (``dir/`` = a folder) and the BSI zone."""

    files: list[ScopePath] = Field(default_factory=list, max_length=MAX_FILES)
    zone: Zone | None = None


class _Budget:
    __slots__ = ("chars", "nodes")

    def __init__(self) -> None:
        self.nodes = 0
        self.chars = 0


def _walk(value: Any, depth: int, limit: int, field: str, budget: _Budget) -> None:
    """Check that ``value`` is plain JSON within the depth, node and character bounds."""
    budget.nodes += 1
    if budget.nodes > MAX_PAYLOAD_NODES:
        raise PydanticCustomError(
            "payload_too_large", "payload holds more than {n} JSON values", {"n": MAX_PAYLOAD_NODES}
        )
    kind = type(value)  # exact types first: this runs for every value of every packet
    if kind is str:
        _count(len(value), field, budget)
    elif kind is dict or kind is list:
        if depth >= limit:
            raise PydanticCustomError(
                "too_deep", "{field} is nested deeper than {n} levels", {"field": field, "n": limit}
            )
        if kind is dict:
            for k, v in value.items():
                if type(k) is not str:
                    raise PydanticCustomError("json_type", "{field}: object keys must be strings", {"field": field})
                budget.chars += len(k)
                _walk(v, depth + 1, limit, field, budget)
        else:
            for v in value:
                _walk(v, depth + 1, limit, field, budget)
    elif kind is int or kind is bool or value is None:
        pass
    elif kind is float:
        if not math.isfinite(value):
            raise PydanticCustomError("json_type", "{field}: NaN and infinity are not JSON numbers", {"field": field})
    else:
        raise PydanticCustomError(
            "json_type",
            "{field}: {kind} is not a JSON value; expected string, number, boolean, null, list or mapping",
            {"field": field, "kind": kind.__name__},
        )


def _count(length: int, field: str, budget: _Budget) -> None:
    if length > MAX_STR:
        raise PydanticCustomError(
            "string_too_long", "{field}: a string is longer than {n} characters", {"field": field, "n": MAX_STR}
        )
    budget.chars += length
    if budget.chars > MAX_PAYLOAD_CHARS:
        raise PydanticCustomError(
            "payload_too_large", "payload holds more than {n} characters", {"n": MAX_PAYLOAD_CHARS}
        )


class Payload(_Strict):
    """What the packet carries; which fields a signal may fill is :data:`SIGNAL_RULES`."""

    context: dict[str, Any] = Field(default_factory=dict)
    decision: Any = None
    options: list[Annotated[str, StringConstraints(min_length=1, max_length=MAX_OPTION)]] = Field(
        default_factory=list, max_length=MAX_OPTIONS
    )
    result: Any = None

    @model_validator(mode="after")
    def _plain_json(self) -> Payload:
        budget = _Budget()
        if self.context:
            _walk(self.context, 0, MAX_JSON_DEPTH, CONTEXT, budget)
        if self.decision is not None:
            _walk(self.decision, 0, MAX_JSON_DEPTH, DECISION, budget)
        if self.result is not None:
            _walk(self.result, 0, MAX_RESULT_DEPTH, RESULT, budget)
        return self


def _carried(pkt: Packet) -> set[str]:
    """The rule-governed fields this packet actually fills (non-empty)."""
    out: set[str] = set()
    if pkt.scope.files:
        out.add(FILES)
    p = pkt.payload
    if p.context:
        out.add(CONTEXT)
    if p.decision is not None:
        out.add(DECISION)
    if p.options:
        out.add(OPTIONS)
    if p.result is not None:
        out.add(RESULT)
    return out


def _context_violations(
    sig: Signal, rule: SignalRule, ctx: Mapping[str, Any], keys: Mapping[str, tuple[type, ...]]
) -> list[str]:
    errors: list[str] = []
    for key, value in ctx.items():
        expected = keys.get(key)
        if expected is None:
            errors.append(f"signal {sig} does not allow payload.context.{key}; {sig} carries {rule.describe()}")
        elif not isinstance(value, expected) or (
            isinstance(value, bool) and bool not in expected and object not in expected
        ):
            names = " or ".join("JSON value" if t is object else t.__name__ for t in expected)
            errors.append(f"signal {sig}: payload.context.{key} must be {names}, got {type(value).__name__}")
    for key in sorted(rule.required_keys - ctx.keys()):
        errors.append(f"signal {sig} requires payload.context.{key}")
    if sig is Signal.ESCALATE and isinstance(ctx.get("question"), str) and len(ctx["question"]) > MAX_QUESTION:
        errors.append(f"signal ESCALATE: payload.context.question is longer than {MAX_QUESTION} characters")
    return errors


_BITS: Final = {FILES: 1, CONTEXT: 2, DECISION: 4, OPTIONS: 8, RESULT: 16}
_ALLOWED_MASK: Final = {sig: sum(_BITS[f] for f in rule.allowed) for sig, rule in SIGNAL_RULES.items()}
_REQUIRED_MASK: Final = {sig: sum(_BITS[f] for f in rule.required) for sig, rule in SIGNAL_RULES.items()}
_KEYED: Final = frozenset(sig for sig, rule in SIGNAL_RULES.items() if rule.context_keys is not None)
_SPECIAL_TO: Final = frozenset({CLAIMS_STORE, BROADCAST})


def _plainly_valid(pkt: Packet) -> bool:
    """The common case, decided with bit masks: True means no rule is broken (False: look closer)."""
    sig = pkt.signal
    p = pkt.payload
    mask = (
        (1 if pkt.scope.files else 0)
        | (2 if p.context else 0)
        | (4 if p.decision is not None else 0)
        | (8 if p.options else 0)
        | (16 if p.result is not None else 0)
    )
    if mask & ~_ALLOWED_MASK[sig] or _REQUIRED_MASK[sig] & ~mask:
        return False
    if mask & 2 and sig in _KEYED:
        return False
    return not (sig is Signal.CHECKPOINT or sig is Signal.HANDOFF or pkt.to in _SPECIAL_TO or pkt.from_ in _SPECIAL_TO)


def signal_violations(pkt: Packet) -> list[str]:
    """Every breach of the signal → payload and signal → destination rules (empty when none)."""
    sig = pkt.signal
    rule = SIGNAL_RULES[sig]
    carried = _carried(pkt)
    errors: list[str] = []
    if not carried <= rule.allowed:
        for f in sorted(carried - rule.allowed):
            errors.append(f"signal {sig} does not allow {f}; {sig} carries {rule.describe()}")
    if not rule.required <= carried:
        for f in sorted(rule.required - carried):
            what = "a non-empty list of choices" if f == OPTIONS else "a non-empty value"
            errors.append(f"signal {sig} requires {f} ({what})")
    if rule.context_keys is not None and CONTEXT in carried:
        errors += _context_violations(sig, rule, pkt.payload.context, rule.context_keys)
    # Destinations fixed by the signal (ADR-026).
    to = pkt.to
    if sig is Signal.CHECKPOINT and to != CLAIMS_STORE:
        errors.append(f"signal CHECKPOINT goes to the claims store only; expected to: {CLAIMS_STORE}")
    elif to == CLAIMS_STORE and sig is not Signal.CHECKPOINT:
        errors.append(f"to: {CLAIMS_STORE} (the claims store) receives CHECKPOINT only, not {sig}")
    if sig is Signal.HANDOFF:
        if to != pkt.from_:
            errors.append("signal HANDOFF goes to the sender's next session only; expected to equal from")
        if pkt.session_id is None:
            errors.append("signal HANDOFF requires session_id (the session handing off)")
    if to == BROADCAST and sig not in BROADCAST_SIGNALS:
        errors.append(f"to: broadcast is only for NOTIFY; {sig} needs one receiver")
    if pkt.from_ == BROADCAST or pkt.from_ == CLAIMS_STORE:
        errors.append(f"from: {pkt.from_} is a destination, not a sender")
    if sig is Signal.ADAPT and to == AMBIENT and "changes" in pkt.payload.context:
        problem = adapt_changes_problem(pkt.payload.context["changes"])
        if problem is not None:
            errors.append(f"signal ADAPT to ambient: {problem}")
    return errors


#: What an ADAPT to ambient may change: the items of a running for_each to skip (they end ``skipped``).
ADAPT_CHANGES: Final = "changes: {skip: [item, ...]} (the names of a running for_each's items that have not started)"


def adapt_changes(changes: Any) -> tuple[str, ...] | None:
    """The item names an ADAPT's ``changes`` asks ambient to skip, or None when ambient cannot carry them out."""
    if not isinstance(changes, dict) or set(changes) != {"skip"}:
        return None
    skip = changes["skip"]
    if not isinstance(skip, list) or not skip or not all(isinstance(s, str) and s for s in skip):
        return None
    return tuple(skip)


def adapt_changes_problem(changes: Any) -> str | None:
    """Why ambient cannot carry out an ADAPT's ``changes`` (None: it can), saying what it accepts."""
    if adapt_changes(changes) is not None:
        return None
    if isinstance(changes, dict):
        other = sorted(str(k) for k in changes if k != "skip")
        if other:
            what = f"payload.context.changes.{other[0]} is not a change ambient makes"
        elif "skip" not in changes:
            what = "payload.context.changes is empty"
        else:
            what = "payload.context.changes.skip must be a non-empty list of item names"
    else:
        what = f"payload.context.changes must be a mapping, got {type(changes).__name__}"
    return f"{what}; ambient accepts {ADAPT_CHANGES}"


class Packet(_Strict):
    """One context packet (ADR-026). Frozen: a validated packet cannot change on its way."""

    id: Annotated[str, StringConstraints(pattern=ID_PATTERN)]
    ts: Annotated[datetime, Field(strict=False), AfterValidator(_to_utc)]
    from_: Annotated[Name, Field(alias="from")]
    to: Name
    signal: Annotated[Signal, Field(strict=False)]
    scope: Scope = Field(default_factory=Scope)
    payload: Payload = Field(default_factory=Payload)
    return_to: Name | None = None
    session_id: ShortStr | None = None
    correlation_id: ShortStr | None = None
    key: Annotated[str, StringConstraints(max_length=512, pattern=r"^[^\x00]+/[^\x00]+/\d+$")] | None = None

    @model_validator(mode="after")
    def _signal_rule(self) -> Packet:
        if _plainly_valid(self):
            return self
        errors = signal_violations(self)
        if errors:
            raise PydanticCustomError("signal_payload", "{errors}", {"errors": "; ".join(errors)})
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready mapping with the wire names (``from``)."""
        return self.model_dump(mode="json", by_alias=True)

    def wire_view(self) -> dict[str, Any]:
        """The routing fields and payload in wire names (``from``), for readers only: no ``id``, ``ts``, scope.

        Unlike :meth:`to_dict` nothing is copied: the payload's values are the packet's own (plain JSON,
        checked at validation), so a caller must not change them. Performance (bench/fanout.py): the live
        threads record two packets per fan-out item, and ``model_dump`` was ~10 µs of GIL time each.
        """
        p = self.payload
        return {
            "from": self.from_,
            "to": self.to,
            "signal": self.signal.value,
            "payload": {"context": p.context, "decision": p.decision, "options": p.options, "result": p.result},
            "return_to": self.return_to,
            "session_id": self.session_id,
            "correlation_id": self.correlation_id,
            "key": self.key,
        }

    def to_json(self) -> str:
        """Compact JSON text; :func:`parse_packet` reads it back to an equal packet."""
        return self.model_dump_json(by_alias=True)

    def to_yaml(self) -> str:
        """Block YAML text; :func:`parse_packet` reads it back to an equal packet."""
        # yamlfile's parse/dump are pure text functions; imported here so the core stays file-free.
        from ambient.storage.yamltext import dump_yaml

        return dump_yaml(self.to_dict())


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise PacketError(f"duplicate key {k!r} in packet JSON; each key may appear once")
        out[k] = v
    return out


def _load_text(text: str) -> Any:
    if text.lstrip()[:1] == "{":
        try:
            return json.loads(text, object_pairs_hook=_reject_duplicates)
        except json.JSONDecodeError as exc:
            raise PacketError(f"not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
        except RecursionError:
            raise PacketError("packet JSON is nested too deeply") from None
    from ambient.storage.yamltext import parse_yaml  # pure text parser (see Packet.to_yaml)

    try:
        data, _ = parse_yaml(text, source="<packet>")
    except YamlError as exc:
        where = f"line {exc.line}: " if exc.line is not None else ""
        raise PacketError(f"packet YAML {where}{exc.message}") from None
    return data


def decode_packet(raw: bytes | str | Mapping[str, Any]) -> dict[str, Any]:
    """Size-check and parse raw packet text (JSON or YAML) into a mapping, unwrapping ``packet:``."""
    if type(raw) is dict:  # the in-process fast path
        if len(raw) == 1 and type(raw.get("packet")) is dict:
            return dict(raw["packet"])
        return raw.copy()
    if isinstance(raw, Mapping):
        data: Any = raw
    else:
        if isinstance(raw, bytes | bytearray | memoryview):
            size = len(raw)
            if size > MAX_PACKET_BYTES:
                raise PacketError(f"packet is {size} bytes; the limit is {MAX_PACKET_BYTES}")
            try:
                text = bytes(raw).decode("utf-8")
            except UnicodeDecodeError:
                raise PacketError("packet is not valid UTF-8") from None
        elif isinstance(raw, str):
            text = raw
            if len(text) > MAX_PACKET_BYTES or (
                len(text) * 4 > MAX_PACKET_BYTES and len(text.encode()) > MAX_PACKET_BYTES
            ):
                raise PacketError(f"packet is over the limit of {MAX_PACKET_BYTES} bytes")
        else:
            raise PacketError(f"packet must be bytes, text or a mapping, got {type(raw).__name__}")
        data = _load_text(text)
    if isinstance(data, Mapping) and len(data) == 1 and isinstance(data.get("packet"), Mapping):
        data = data["packet"]  # the ADR writes packets under a top-level `packet:` key
    if not isinstance(data, Mapping):
        kind = "empty" if data is None else type(data).__name__
        raise PacketError(f"packet must be a mapping (key: value), got {kind}")
    return dict(data)


def validation_message(exc: ValidationError) -> str:
    """One line per error, naming the field and the rule, never echoing the input (S-04)."""
    lines = []
    for err in exc.errors(include_url=False, include_input=False, include_context=False):
        loc = ".".join(str(p) for p in err["loc"]) or "packet"
        lines.append(f"{loc}: {err['msg']} [{err['type']}]")
    return "; ".join(lines)


def parse_packet(
    raw: bytes | str | Mapping[str, Any],
    *,
    now: datetime | None = None,
    packet_id: str | None = None,
) -> Packet:
    """Validate a packet from JSON/YAML text or a mapping; raise :class:`PacketError` naming the problem.

    ``now`` and ``packet_id``, when given, stamp the packet (ambient sets ``ts`` and ``id``; whatever
    the sender wrote there is replaced). Without them the raw packet must carry both (round trip).
    """
    data = decode_packet(raw)
    if now is not None:
        data["ts"] = now
    if packet_id is not None:
        data["id"] = packet_id
    try:
        return Packet.model_validate(data)
    except ValidationError as exc:
        raise PacketError(validation_message(exc)) from None


def make_packet(
    from_: str,
    to: str,
    signal: Signal | str,
    *,
    now: datetime,
    files: list[str] | None = None,
    zone: str | None = None,
    context: Mapping[str, Any] | None = None,
    decision: Any = None,
    options: list[str] | None = None,
    result: Any = None,
    return_to: str | None = None,
    session_id: str | None = None,
    correlation_id: str | None = None,
    key: str | None = None,
    packet_id: str | None = None,
) -> Packet:
    """Build and validate a packet (the engine's constructor); raises :class:`PacketError` on a rule breach."""
    data: dict[str, Any] = {
        "id": packet_id or new_packet_id(),
        "ts": now,
        "from": from_,
        "to": to,
        "signal": signal,
        "scope": {"files": list(files or []), "zone": zone},
        "payload": {
            "context": dict(context or {}),
            "decision": decision,
            "options": list(options or []),
            "result": result,
        },
        "return_to": return_to,
        "session_id": session_id,
        "correlation_id": correlation_id,
        "key": key,
    }
    try:
        return Packet.model_validate(data)
    except ValidationError as exc:
        raise PacketError(validation_message(exc)) from None
