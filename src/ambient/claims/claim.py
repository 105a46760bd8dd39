"""Claims (DESIGN 3, spec/002 BSI claim schema v1.3-2.3): the model, human-gate transitions, TTL, conflicts.

Pure rules: no disk, no clock (``now`` is passed in). Claims are user documents: unknown keys and
unknown values are kept (with a warning), and a transition rebuilds the claim from its document
so nothing ambient does not understand is ever lost. :mod:`ambient.claims.store` reads and writes them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, tzinfo
from typing import Any, Final, Literal, NamedTuple, Self, get_args

from pydantic import BaseModel, ConfigDict, ModelWrapValidatorHandler, PrivateAttr, field_validator, model_validator

from ambient.core.errors import TransitionError, UnsafePathError
from ambient.kernel import zones

# -- vocabulary (spec/002 "Valeurs valides par champ", v2.2 statuses)

OPEN: Final = "open"
WAITING_HUMAN: Final = "waiting_human"
PAUSED: Final = "paused"
CLOSED: Final = "closed"
FAILED: Final = "failed"
STALE: Final = "stale"
STATUSES: Final = (OPEN, WAITING_HUMAN, PAUSED, CLOSED, FAILED, STALE)
TERMINAL: Final = frozenset({CLOSED, FAILED})
# Statuses whose claim still holds its scope (stale = abandoned, it no longer blocks anyone).
ACTIVE: Final = frozenset({OPEN, WAITING_HUMAN, PAUSED})

CLAIM_TYPES: Final = ("pilote", "satellite", "solo")
SATELLITE_TYPES: Final = ("code", "brain-write", "test", "deploy", "search", "domain")
SATELLITE_LEVELS: Final = ("leaf", "domain")
RESULT_STATUSES: Final = ("ok", "partial", "failed")

# Keys spec/002 says are inferred and must not be written; kept if a person wrote them, but ignored.
INFERRED_KEYS: Final = ("close_tier", "zone")

Action = Literal["gate", "approve", "reject", "pause", "resume", "abort", "close"]
ACTIONS: Final[tuple[str, ...]] = get_args(Action)

# action → (statuses it may start from, status it leads to; None = computed). DESIGN 3 / human-gate-ack.
TRANSITIONS: Final[Mapping[str, tuple[frozenset[str], str | None]]] = {
    "gate": (frozenset({OPEN}), WAITING_HUMAN),
    "approve": (frozenset({WAITING_HUMAN}), OPEN),
    "reject": (frozenset({WAITING_HUMAN}), FAILED),
    "pause": (frozenset({OPEN, WAITING_HUMAN}), PAUSED),
    "resume": (frozenset({PAUSED}), None),  # back to the status it had when paused
    "abort": (frozenset({OPEN, WAITING_HUMAN, PAUSED, STALE}), FAILED),
    # A stale claim may still be closed: its agent came back late with a result.
    "close": (frozenset({OPEN, STALE}), CLOSED),
}


def legal_actions(status: str, actions: Iterable[str] = ACTIONS) -> tuple[str, ...]:
    """The ``actions`` a claim of ``status`` may take, in their order (what the console offers as buttons; the
    transition itself may still refuse a case this cannot see, e.g. resuming a child its parent paused)."""
    return tuple(a for a in actions if a in TRANSITIONS and status in TRANSITIONS[a][0])


# Keys ambient adds to a claim (documented, never renamed): who cascaded a pause, the status to
# resume to, and the last fencing token accepted for a write (RELIABILITY §1.2 rule 3).
PAUSED_BY: Final = "paused_by"
PAUSED_FROM: Final = "paused_from"
FENCE: Final = "fence"

_MAX_SESS_ID = 200
_CONTROL_CHARS: Final = re.compile(r"[\x00-\x1f\x7f]")  # one scan in C (a generator over characters was per item)


def sess_id_ok(value: str) -> bool:
    """Whether ``value`` is usable as a claim id and file name (the rule of ``Claim.sess_id``)."""
    return not (
        not value
        or value != value.strip()
        or value.startswith(".")
        or len(value) > _MAX_SESS_ID
        or any(c in value for c in "/\\\x00")
        or _CONTROL_CHARS.search(value) is not None
    )


class _UserDoc(BaseModel):
    """A mapping a person owns: extra keys allowed, key order remembered for the rewrite."""

    model_config = ConfigDict(extra="allow", frozen=True)

    _order: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _remember_order(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        inst = handler(data)
        if isinstance(data, Mapping):
            inst._order = tuple(str(k) for k in data)
        return inst

    def to_document(self) -> dict[str, Any]:
        """The mapping to write back: the user's keys in their order, then new keys; unset fields left out."""
        values: dict[str, Any] = {}
        for name in type(self).model_fields:
            if name in self.model_fields_set:
                values[name] = _doc_value(getattr(self, name))
        for key, value in (self.model_extra or {}).items():
            values[key] = _doc_value(value)
        ordered = {k: values[k] for k in self._order if k in values}
        ordered.update((k, v) for k, v in values.items() if k not in ordered)
        return ordered


def _doc_value(value: Any) -> Any:
    if isinstance(value, _UserDoc):
        return value.to_document()
    if isinstance(value, list):
        return [_doc_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _doc_value(v) for k, v in value.items()}
    return value


class ResultTests(_UserDoc):
    """``result.tests`` of a tier-2 (validated) close."""

    total: int | None = None
    passed: int | None = None
    failed: int | None = None


class ClaimResult(_UserDoc):
    """``result:`` written at close (spec/002 v1.6), in one of the three tier shapes.

    Tier 1: status, files_modified, commit, signal_id. Tier 2 adds ``tests``. Tier 3 adds
    ``children`` and ``notes``. Unknown keys are kept.
    """

    status: str
    files_modified: list[str] | None = None
    tests: ResultTests | None = None
    children: list[str] | None = None
    commit: str | int | None = None
    signal_id: str | int | None = None
    notes: str | None = None

    @property
    def shape(self) -> int:
        """The tier shape this result has: 3 with children, 2 with tests, else 1."""
        if self.children is not None:
            return 3
        return 2 if self.tests is not None else 1


class Claim(_UserDoc):
    """One BSI claim (``claims/<sess_id>.yml``), schema v1.3-2.3 plus whatever else the file holds.

    ``close_tier`` and ``zone`` are inferred (properties), never written. Values outside the
    schema's vocabulary (e.g. ``type: explore`` in the real corpus) are accepted and kept; see
    :meth:`warnings`.
    """

    # required (spec/002)
    sess_id: str
    type: str
    scope: str
    agent: str
    status: str
    opened_at: str  # the user's text, e.g. "2026-03-16T20:36" (local time)
    # optional, all claims
    handoff_level: int | str | None = None
    story_angle: str | None = None
    user_id: str | int | None = None  # v2.3; absent = the brain owner (kerneluser)
    # satellites (v1.3)
    satellite_type: str | None = None
    satellite_level: str | None = None
    parent_satellite: str | None = None
    # workflow (v1.9), mode (v2.0), theme branch (v1.8), exit triggers (v1.7)
    workflow: str | None = None
    workflow_step: int | str | None = None
    mode: str | None = None
    theme_branch: str | None = None
    on_done: str | None = None
    on_partial: str | None = None
    on_fail: str | None = None
    # close (v1.6) and gates (v2.2)
    result: ClaimResult | None = None
    gate_history: list[Any] | None = None
    closed_at: str | None = None
    ttl: int | float | str | None = None  # minutes, or "30m" / "4h" / "2d"
    # added by ambient
    paused_by: str | None = None
    paused_from: str | None = None
    fence: int | None = None

    @field_validator("sess_id")
    @classmethod
    def _safe_sess_id(cls, value: str) -> str:
        if not sess_id_ok(value):
            raise ValueError(
                f"sess_id must be usable as a file name: non-empty, no '/', '\\', control characters or "
                f"leading '.', at most {_MAX_SESS_ID} characters"
            )
        return value

    @property
    def level(self) -> str:
        """``satellite_level``, ``leaf`` when absent (spec/002 default)."""
        return self.satellite_level or "leaf"

    @property
    def close_tier(self) -> int:
        """Inferred close tier (spec/002 v1.4): 1 atomic, 2 validated, 3 orchestrated."""
        return infer_close_tier(self.type, self.satellite_type, self.satellite_level)

    @property
    def zone(self) -> str:
        """Zone inferred from ``scope`` with the default rules; raises UnsafePathError for an escaping scope."""
        return zones.zone_of(self.scope)

    @property
    def terminal(self) -> bool:
        """Closed or failed: no transition leaves these."""
        return self.status in TERMINAL

    def warnings(self) -> list[tuple[tuple[str | int, ...], str]]:
        """What is unusual but accepted, as (key path, message) pairs for a file:line report."""
        out: list[tuple[tuple[str | int, ...], str]] = []
        if self.type not in CLAIM_TYPES:
            out.append((("type",), f"type {self.type!r} is not one of {', '.join(CLAIM_TYPES)}; kept as written"))
        if self.status not in STATUSES:
            out.append(
                (
                    ("status",),
                    f"status {self.status!r} is not one of {', '.join(STATUSES)}; "
                    "ambient will not transition this claim until it is fixed",
                )
            )
        if self.satellite_type is not None and self.satellite_type not in SATELLITE_TYPES:
            out.append(
                (
                    ("satellite_type",),
                    f"satellite_type {self.satellite_type!r} is not one of {', '.join(SATELLITE_TYPES)}; "
                    "it conflicts with every satellite but search",
                )
            )
        if self.satellite_level is not None and self.satellite_level not in SATELLITE_LEVELS:
            out.append(
                (
                    ("satellite_level",),
                    f"satellite_level {self.satellite_level!r} is not leaf or domain; treated as leaf",
                )
            )
        if self.result is not None and self.result.status not in RESULT_STATUSES:
            out.append(
                (("result", "status"), f"result.status {self.result.status!r} is not one of ok, partial, failed")
            )
        if self.ttl is not None and parse_ttl(self.ttl) is None:
            out.append((("ttl",), f"ttl {self.ttl!r} is not a duration (minutes, or 30m / 4h / 2d); ignored"))
        if parse_time(self.opened_at, None) is None:
            out.append((("opened_at",), f"opened_at {self.opened_at!r} is not an ISO date-time; TTL cannot apply"))
        extra = self.model_extra or {}
        for key in INFERRED_KEYS:
            if key in extra:
                out.append(((key,), f"{key} is inferred by ambient and should not be written; the value is kept"))
        try:
            zones.normalize(self.scope)
        except UnsafePathError as exc:
            out.append((("scope",), f"{exc}; pre-flight refuses every write for this claim"))
        return out


# -- inference


def infer_close_tier(claim_type: str, satellite_type: str | None, satellite_level: str | None) -> int:
    """Close tier (spec/002 v1.4): 3 if level domain or type pilote, 2 if leaf code/test, else 1.

    A ``satellite_type: domain`` is a coordinator whatever its level says, so it is tier 3 too. The one home of the
    rule: :attr:`Claim.close_tier` and the chain executor's judgement of a step (``engine.planner.judge_step``).
    """
    if satellite_level == "domain" or claim_type == "pilote" or satellite_type == "domain":
        return 3
    if satellite_type in ("code", "test"):
        return 2
    return 1


# -- time


def parse_time(text: str | None, tz: tzinfo | None) -> datetime | None:
    """Parse an ISO date-time as claims and locks write it; a naive value is read in ``tz``.

    The sources write local time without an offset ("2026-03-16T20:36"); the shell passes the
    local zone. Returns None for anything unparseable (or a naive value when ``tz`` is None).
    """
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if dt.tzinfo is None:
        if tz is None:
            return dt  # caller only wanted to know it parses
        dt = dt.replace(tzinfo=tz)
    return dt


def format_time(now: datetime) -> str:
    """How ambient writes a time in a claim: ISO with seconds and the offset (unambiguous, readable)."""
    return now.isoformat(timespec="seconds")


_TTL_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d)?\s*$")
_TTL_UNIT = {None: 60.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_ttl(value: int | float | str | None) -> timedelta | None:
    """A claim TTL: a number of minutes, or a string ``90``, ``30m``, ``4h``, ``2d``, ``45s``; None if invalid."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return timedelta(minutes=value) if value > 0 else None
    m = _TTL_RE.match(value)
    if m is None:
        return None
    seconds = float(m.group(1)) * _TTL_UNIT[m.group(2)]
    return timedelta(seconds=seconds) if seconds > 0 else None


def _require_aware(now: datetime) -> None:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be an aware datetime (the shell passes its clock in the local zone)")


def last_activity(claim: Claim, tz: tzinfo) -> datetime | None:
    """When the claim last moved: the later of ``opened_at`` and the last ``gate_history`` time."""
    return ClaimFacts.of(claim).last_activity(tz)


class ClaimFacts(NamedTuple):
    """What the claim store keeps of a file it wrote or read: the fence its next write needs and what the
    stale-claims scan reads, a few hundred bytes instead of the ~3.4 KB of a :class:`Claim` (R-12: the store's
    4,096 remembered claims were ~12 MB of a soak's RSS growth)."""

    sess_id: str
    fence: int | None
    status: str
    ttl: int | float | str | None
    times: tuple[str, ...]  # ``opened_at`` and each ``gate_history`` time, as written

    @classmethod
    def of(cls, claim: Claim) -> ClaimFacts:
        times = [claim.opened_at] if isinstance(claim.opened_at, str) else []
        for entry in claim.gate_history or []:
            if isinstance(entry, Mapping) and isinstance(entry.get("at"), str):
                times.append(entry["at"])
        return cls(claim.sess_id, claim.fence, claim.status, claim.ttl, tuple(times))

    def last_activity(self, tz: tzinfo) -> datetime | None:
        """The later of ``opened_at`` and the last ``gate_history`` time."""
        known = [t for t in (parse_time(text, tz) for text in self.times) if t is not None]
        return max(known) if known else None

    def stale_at(self, tz: tzinfo, default_ttl: timedelta | None) -> datetime | None:
        """When an open claim goes stale without more activity (None: not open, or no TTL or time to go by)."""
        if self.status != OPEN:
            return None
        ttl = parse_ttl(self.ttl) or default_ttl
        last = self.last_activity(tz)
        return last + ttl if ttl is not None and last is not None else None


# -- family


def children_index(claims: Mapping[str, Claim]) -> dict[str, list[str]]:
    """parent sess_id → sorted child sess_ids (by ``parent_satellite``)."""
    out: dict[str, list[str]] = {}
    for sid, claim in claims.items():
        if claim.parent_satellite:
            out.setdefault(claim.parent_satellite, []).append(sid)
    for kids in out.values():
        kids.sort()
    return out


def descendants(claims: Mapping[str, Claim], sess_id: str) -> list[str]:
    """Every claim below ``sess_id`` through ``parent_satellite`` links, breadth first; cycles are cut."""
    index = children_index(claims)
    seen = {sess_id}
    order: list[str] = []
    queue = list(index.get(sess_id, []))
    while queue:
        sid = queue.pop(0)
        if sid in seen:
            continue
        seen.add(sid)
        order.append(sid)
        queue.extend(index.get(sid, []))
    return order


def ancestors(claims: Mapping[str, Claim], sess_id: str) -> list[str]:
    """The chain of ``parent_satellite`` above a claim (nearest first) among known claims; cycles are cut."""
    out: list[str] = []
    seen = {sess_id}
    current = claims.get(sess_id)
    while current is not None and current.parent_satellite and current.parent_satellite not in seen:
        parent = current.parent_satellite
        seen.add(parent)
        if parent not in claims:
            break
        out.append(parent)
        current = claims[parent]
    return out


# -- transitions


def _entry(action: str, before: str, after: str, message: str | None, now: datetime, **more: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"at": format_time(now), "action": action, "from": before, "to": after}
    if message:
        entry["message"] = message
    entry.update({k: v for k, v in more.items() if v is not None})
    return entry


def _rebuild(claim: Claim, changes: Mapping[str, Any], remove: Iterable[str] = (), entry: Any = None) -> Claim:
    """A new validated claim: the document with ``changes`` applied (``model_copy`` would not validate)."""
    doc = claim.to_document()
    for key in remove:
        doc.pop(key, None)
    doc.update(changes)
    if entry is not None:
        history = doc.get("gate_history")
        doc["gate_history"] = [*(history if isinstance(history, list) else []), entry]
    return Claim.model_validate(doc)


def _status_name(status: str) -> str:
    return status.replace("_", " ")


def _check_known(claim: Claim) -> None:
    if claim.status not in STATUSES:
        raise TransitionError(
            f"claim {claim.sess_id} has status {claim.status!r}, which is not one of {', '.join(STATUSES)}; "
            "fix the file by hand first"
        )


def _result_model(result: ClaimResult | Mapping[str, Any] | None, sess_id: str) -> ClaimResult:
    if result is None:
        raise TransitionError(f"cannot close claim {sess_id} without a result (result.status ok, partial or failed)")
    res = result if isinstance(result, ClaimResult) else ClaimResult.model_validate(dict(result))
    if res.status not in RESULT_STATUSES:
        raise TransitionError(
            f"cannot close claim {sess_id}: result.status {res.status!r} is not one of {', '.join(RESULT_STATUSES)}"
        )
    return res


def _close(
    claims: Mapping[str, Claim],
    claim: Claim,
    result: ClaimResult | Mapping[str, Any] | None,
    message: str | None,
    now: datetime,
) -> Claim:
    sid = claim.sess_id
    res = _result_model(result, sid)
    tier = claim.close_tier
    if tier == 2 and res.status == "ok":
        # spec/002 tier 2 "Validated": green tests are required for an ok close.
        tests = res.tests
        if tests is None or tests.failed is None:
            raise TransitionError(
                f"cannot close claim {sid} as ok: it is tier 2 (validated, {claim.satellite_type}) and needs "
                "result.tests with total/passed/failed"
            )
        if tests.failed != 0:
            raise TransitionError(
                f"cannot close claim {sid} as ok: result.tests.failed is {tests.failed}; tier 2 needs green tests "
                "(close as partial or failed instead)"
            )
    doc_result = res.to_document()
    if tier == 3:
        # spec/002 tier 3 "Orchestrated": wait for the children to close, then aggregate.
        kids = children_index(claims).get(sid, [])
        running = [k for k in kids if not claims[k].terminal]
        if running:
            raise TransitionError(
                f"cannot close claim {sid}: it is tier 3 (orchestrated) and these children are not closed yet: "
                + ", ".join(f"{k} ({claims[k].status})" for k in running)
            )
        if res.children is None:
            doc_result["children"] = kids
    entry = _entry("close", claim.status, CLOSED, message, now, result=res.status)
    return _rebuild(
        claim,
        {"status": CLOSED, "closed_at": format_time(now), "result": doc_result},
        remove=(PAUSED_BY, PAUSED_FROM),
        entry=entry,
    )


def apply(
    claims: Mapping[str, Claim],
    sess_id: str,
    action: str,
    message: str | None,
    now: datetime,
    *,
    result: ClaimResult | Mapping[str, Any] | None = None,
) -> dict[str, Claim]:
    """Apply a human-gate action (or close) to ``sess_id``; return only the claims that changed.

    ``claims`` is every known claim (needed for cascades and tier-3 closes); it is not modified.
    Each changed claim gets one ``gate_history`` entry ``{at, action, from, to, message?, cascade?}``.
    An illegal transition raises :class:`TransitionError` and changes nothing.

    Cascades (DESIGN 3): pause pauses open/waiting descendants and marks them ``paused_by`` the
    claim; resume brings back only those, to the status they had; abort fails every non-terminal
    descendant. Writing order for a shell: parents first for pause/abort, children first for resume.
    """
    _require_aware(now)
    if action not in TRANSITIONS:
        raise TransitionError(f"unknown action {action!r}; expected one of {', '.join(ACTIONS)}")
    claim = claims.get(sess_id)
    if claim is None:
        raise TransitionError(f"no claim {sess_id!r}; `ambient claim list` shows the known claims")
    _check_known(claim)
    sources, target = TRANSITIONS[action]
    if claim.status not in sources:
        allowed = " or ".join(_status_name(s) for s in sorted(sources))
        raise TransitionError(
            f"cannot {action} claim {sess_id}: it is {_status_name(claim.status)}; {action} needs a claim that is "
            f"{allowed}"
        )

    changed: dict[str, Claim] = {}
    if action == "close":
        changed[sess_id] = _close(claims, claim, result, message, now)
    elif action in ("gate", "approve", "reject"):
        assert target is not None
        changed[sess_id] = _rebuild(claim, {"status": target}, entry=_entry(action, claim.status, target, message, now))
    elif action == "pause":
        changed[sess_id] = _rebuild(
            claim,
            {"status": PAUSED, PAUSED_FROM: claim.status},
            remove=(PAUSED_BY,),
            entry=_entry("pause", claim.status, PAUSED, message, now),
        )
        for sid in descendants(claims, sess_id):
            child = claims[sid]
            if child.status in (OPEN, WAITING_HUMAN):
                changed[sid] = _rebuild(
                    child,
                    {"status": PAUSED, PAUSED_BY: sess_id, PAUSED_FROM: child.status},
                    entry=_entry("pause", child.status, PAUSED, message, now, cascade=sess_id),
                )
    elif action == "resume":
        if claim.paused_by is not None:
            by = claims.get(claim.paused_by)
            if by is not None and by.status == PAUSED:
                raise TransitionError(
                    f"cannot resume claim {sess_id}: it was paused by the pause of {claim.paused_by}, which is still "
                    f"paused; resume {claim.paused_by} instead"
                )
        changed[sess_id] = _resumed(claim, message, now, cascade=None)
        for sid in descendants(claims, sess_id):
            child = claims[sid]
            if child.status == PAUSED and child.paused_by == sess_id:
                changed[sid] = _resumed(child, message, now, cascade=sess_id)
    elif action == "abort":
        changed[sess_id] = _rebuild(
            claim,
            {"status": FAILED},
            remove=(PAUSED_BY, PAUSED_FROM),
            entry=_entry("abort", claim.status, FAILED, message, now),
        )
        for sid in descendants(claims, sess_id):
            child = claims[sid]
            if child.status in STATUSES and not child.terminal:
                changed[sid] = _rebuild(
                    child,
                    {"status": FAILED},
                    remove=(PAUSED_BY, PAUSED_FROM),
                    entry=_entry("abort", child.status, FAILED, message, now, cascade=sess_id),
                )
    return changed


def _resumed(claim: Claim, message: str | None, now: datetime, cascade: str | None) -> Claim:
    # Back to the status held before the pause, so a pending human gate is never skipped by a pause/resume.
    back = claim.paused_from if claim.paused_from in (OPEN, WAITING_HUMAN) else OPEN
    assert back is not None
    return _rebuild(
        claim,
        {"status": back},
        remove=(PAUSED_BY, PAUSED_FROM),
        entry=_entry("resume", PAUSED, back, message, now, cascade=cascade),
    )


def mark_stale(claims: Mapping[str, Claim], now: datetime, default_ttl: timedelta | None = None) -> dict[str, Claim]:
    """Open claims whose TTL has run out since their last activity become ``stale`` (spec/002).

    The TTL is the claim's ``ttl`` or ``default_ttl``; a claim with neither, or without a
    readable ``opened_at``, never goes stale. Waiting and paused claims wait for a person and
    are left alone. Naive times in claims are read in ``now``'s zone.
    """
    _require_aware(now)
    tz = now.tzinfo
    assert tz is not None
    changed: dict[str, Claim] = {}
    for sid, claim in claims.items():
        if claim.status != OPEN:
            continue
        ttl = parse_ttl(claim.ttl) or default_ttl
        last = last_activity(claim, tz)
        if ttl is None or last is None or now <= last + ttl:
            continue
        message = f"open without activity for longer than its TTL ({_fmt_delta(ttl)})"
        changed[sid] = _rebuild(claim, {"status": STALE}, entry=_entry("stale", OPEN, STALE, message, now))
    return changed


def _fmt_delta(delta: timedelta) -> str:
    minutes = delta.total_seconds() / 60
    return f"{minutes:g} min" if minutes < 120 else f"{minutes / 60:g} h"


def new_claim(sess_id: str, claim_type: str, scope: str, agent: str, now: datetime, **fields: Any) -> Claim:
    """A fresh open claim in the schema's key order, ``opened_at`` set from ``now``."""
    return Claim.model_validate(new_claim_doc(sess_id, claim_type, scope, agent, now, **fields))


def new_claim_doc(
    sess_id: str, claim_type: str, scope: str, agent: str, now: datetime, **fields: Any
) -> dict[str, Any]:
    """The document of :func:`new_claim`, not validated yet (for callers that add keys before validating)."""
    _require_aware(now)
    doc: dict[str, Any] = {
        "sess_id": sess_id,
        "type": claim_type,
        "scope": scope,
        "agent": agent,
        "status": OPEN,
        "opened_at": format_time(now),
    }
    doc.update({k: v for k, v in fields.items() if v is not None})
    return doc


_SLUG_RE = re.compile(r"[^a-z0-9]+")


def make_sess_id(now: datetime, slug: str) -> str:
    """``sess-YYYYMMDD-HHMM-<slug>`` (spec/002 naming), slug lower-cased to ``[a-z0-9-]``."""
    clean = _SLUG_RE.sub("-", slug.lower()).strip("-")[:60] or "session"
    return f"sess-{now:%Y%m%d-%H%M}-{clean}"


# -- satellite conflict matrix (spec/002 "Matrice de conflit")

_WRITERS: Final = frozenset({"code", "test", "deploy"})


def _folder(path: str) -> str:
    """The folder a scope lives in: a folder scope is itself, a file scope its parent ('' = brain root)."""
    if path == "" or path.endswith("/"):
        return path
    head, sep, _ = path.rpartition("/")
    return head + sep


def _contains(outer: str, inner: str) -> bool:
    if outer == inner or outer == "":
        return True
    base = outer.rstrip("/")
    return inner == base or inner.startswith(base + "/")


def scopes_overlap(a: str, b: str, *, file_granular: bool = False) -> bool:
    """Do two scopes touch the same files? Folder granularity unless ``file_granular``.

    With folder granularity a file scope stands for its folder (two ``code`` satellites on two
    files of one folder overlap); with file granularity only containment counts (two
    ``brain-write`` on different files of one folder do not). Scopes that leave the brain are
    rejected by :func:`ambient.kernel.zones.normalize`.
    """
    na, nb = zones.normalize(a), zones.normalize(b)
    if not file_granular:
        na, nb = _folder(na), _folder(nb)
    return _contains(na, nb) or _contains(nb, na)


def conflicts(active_type: str | None, active_scope: str, incoming_type: str | None, incoming_scope: str) -> bool:
    """Does an incoming satellite have to wait for an active one? (spec/002 conflict matrix)

    ``search`` never blocks and is never blocked; ``code``/``test``/``deploy`` block each other;
    two ``brain-write`` conflict only on the same file; ``domain`` conflicts with all but
    ``search``; ``brain-write`` and ``code``/``test``/``deploy`` do not block each other. Only
    overlapping scopes conflict. A claim with no satellite type (a pilote, a solo session) is
    outside the matrix and blocks nothing. An unknown type is treated like ``domain`` (the safe side).
    """
    if active_type is None or incoming_type is None:
        return False
    if active_type == "search" or incoming_type == "search":
        return False
    if active_type == "brain-write" and incoming_type == "brain-write":
        return scopes_overlap(active_scope, incoming_scope, file_granular=True)
    if not scopes_overlap(active_scope, incoming_scope):
        return False
    known = set(SATELLITE_TYPES)
    if active_type == "domain" or incoming_type == "domain" or active_type not in known or incoming_type not in known:
        return True
    return active_type in _WRITERS and incoming_type in _WRITERS


def find_conflicts(claims: Mapping[str, Claim], incoming: Claim) -> list[Claim]:
    """Active claims (open, waiting, paused) that block ``incoming`` under the matrix, sorted by sess_id.

    A claim never conflicts with itself, its ancestors or its descendants (a coordinator and its
    own satellites work the same scope on purpose).
    """
    known = {**claims, incoming.sess_id: incoming}
    family = {incoming.sess_id, *ancestors(known, incoming.sess_id), *descendants(known, incoming.sess_id)}
    out: list[Claim] = []
    for sid in sorted(claims):
        other = claims[sid]
        if sid in family or other.status not in ACTIVE:
            continue
        try:
            if conflicts(other.satellite_type, other.scope, incoming.satellite_type, incoming.scope):
                out.append(other)
        except UnsafePathError:
            continue  # an escaping scope is pre-flight's business (it refuses every write)
    return out
