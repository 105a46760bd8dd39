"""Per-agent live context (spec/001): one canonical thread per target agent, shared by all requesters.

``.ambient/live/<agent>/log.jsonl`` (rotated to ``log.N.jsonl``) holds every turn with its
attribution; pair and correlation views are filtered projections of it. ``handoff.md`` is a
summary with stable rubrics, bounded to 4096 characters, from the pure :func:`summarise`; it is
what runners give an agent, never the raw transcript.

Threads are agent conversations, private state: ``live/<agent>/`` goes through
:func:`~ambient.storage.fsutil.private_dir` before each write (a real folder, 0700: a symlink swapped in is refused
for that thread only, the others go on) and every file is 0600, never opened through a symlink."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, NamedTuple

import structlog
from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError, field_validator

from ambient.core.errors import InputError, UnsafePathError
from ambient.storage.fsutil import (
    PRIVATE_FILE,
    atomic_write,
    fsync_dir,
    open_private,
    private_dir,
    read_capped,
    write_all,
)
from ambient.storage.journal import ReadResult, iter_jsonl
from ambient.storage.paths import BrainPaths

log = structlog.get_logger(__name__)

HANDOFF_MAX_CHARS = 4096  # spec/001 HANDOFF_SUMMARY_MAX_CHARS
TEXT_MAX = 2000
PAYLOAD_MAX_CHARS = 4096
DEFAULT_MAX_BYTES = 1024 * 1024
DEFAULT_KEEP = 5
SUMMARY_TURNS = 2000  # turns the handoff is summarised from (the newest)
LOG_NAME = "log.jsonl"
HANDOFF_NAME = "handoff.md"
HANDOFF_MAX_AGE_S = 60.0  # a handoff.md read this long after it was written, with turns since, is rebuilt first
LOCK_NAME = "thread.lock"
RUBRICS = (
    "Current objective",
    "Active requests (per requester)",
    "Recent decisions",
    "Blockers",
    "Last correlated answer",
)
# Signals after which the handoff is rewritten (spec/001: handoff at session change and checkpoints).
HANDOFF_SIGNALS = frozenset({"HANDOFF", "CHECKPOINT"})
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


# Encoders made once: ``json.dumps`` with options builds one per call (turn records are written in bulk).
_COMPACT = json.JSONEncoder(ensure_ascii=False, default=str, separators=(",", ":"))
_LINE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _compact(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        hit = _get(value, *_OBJECTIVE_KEYS)
        if isinstance(hit, str):
            return hit
    return _COMPACT.encode(value)[:TEXT_MAX]


def packet_text(signal: str, payload: Any) -> str:
    """A one-line text for a packet: the result of a RETURN, the options of an ESCALATE, else its context."""
    if not isinstance(payload, Mapping):
        return _compact(payload)
    if signal == "RETURN":
        return _compact(payload.get("result"))
    if signal == "ESCALATE":
        options = payload.get("options") or []
        return "options: " + " | ".join(str(o) for o in options) if isinstance(options, list) else _compact(options)
    if signal == "HANDOFF" and payload.get("decision") is not None:
        return f"decision: {_compact(payload.get('decision'))}; context: {_compact(payload.get('context'))}"
    return _compact(payload.get("context"))


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


# --------------------------------------------------------------------------------------------
# The summariser (pure)
# --------------------------------------------------------------------------------------------


def one_line(text: str, limit: int = 400) -> str:
    """One line of clean text: no control characters or line breaks, whitespace collapsed."""
    t = _safe(text[: limit * 2])
    t = _SPACES.sub(" ", _CONTROL.sub(" ", t)).strip()
    return _cut(t, limit)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    if limit <= 0:
        return ""
    # Never leave a joiner or a variation selector dangling before the ellipsis.
    return text[: limit - 1].rstrip("\u200d\ufe0e\ufe0f ") + "…"


def _ts(t: Turn) -> str:
    return t.ts.strftime("%Y-%m-%d %H:%M")


def _corr(t: Turn) -> str:
    return f" [{one_line(t.correlation_id, 60)}]" if t.correlation_id else ""


def _objective_of(t: Turn) -> str | None:
    p = t.payload
    if isinstance(p, dict):
        for container in (p.get("context"), p):
            if isinstance(container, dict):
                hit = _get(container, *_OBJECTIVE_KEYS)
                if isinstance(hit, str) and hit.strip():
                    return hit
    return None


def _objective(turns: Sequence[Turn]) -> list[str]:
    for t in reversed(turns):
        obj = _objective_of(t)
        if obj:
            return [f"{one_line(obj, 600)} (set by {one_line(t.requester, 60)} via {t.signal}, {_ts(t)})"]
    for t in reversed(turns):
        if t.signal == "SPAWN" and t.text:
            return [f"{one_line(t.text, 600)} (asked by {one_line(t.requester, 60)}, {_ts(t)})"]
    return ["(none recorded)"]


def _active_requests(turns: Sequence[Turn]) -> list[str]:
    open_: dict[tuple[str, str | None], Turn] = {}
    for t in turns:
        key = (t.requester, t.correlation_id)
        if t.role == "requester" and t.signal in ("SPAWN", "HANDOFF"):
            open_.pop(key, None)
            open_[key] = t
        elif t.role == "agent" and t.signal in ("RETURN", "ERROR"):
            if key in open_:
                del open_[key]
            elif t.correlation_id is None:
                mine = [k for k in open_ if k[0] == t.requester]
                if mine:
                    del open_[mine[-1]]
    by_requester: dict[str, list[Turn]] = {}
    for (req, _), t in open_.items():
        by_requester.setdefault(req, []).append(t)
    order = sorted(by_requester, key=lambda r: by_requester[r][-1].ts, reverse=True)
    lines = []
    for req in order[:12]:
        reqs = by_requester[req]
        last = reqs[-1]
        more = f" ({len(reqs)} open)" if len(reqs) > 1 else ""
        lines.append(f"- {one_line(req, 60)}{more}:{_corr(last)} {one_line(last.text, 300)} ({_ts(last)})")
    if len(order) > 12:
        lines.append(f"- … and {len(order) - 12} more requesters")
    return lines or ["(none)"]


def _decision_text(t: Turn) -> str | None:
    if isinstance(t.payload, dict) and t.payload.get("decision") is not None:
        return _compact(t.payload["decision"])
    if t.signal == "DECISION":
        return t.text
    return None


def _decisions(turns: Sequence[Turn]) -> list[str]:
    lines = []
    for t in reversed(turns):
        d = _decision_text(t)
        if d:
            lines.append(f"- {_ts(t)} {one_line(t.requester, 60)}{_corr(t)}: {one_line(d, 300)}")
            if len(lines) == 5:
                break
    return lines or ["(none)"]


def _blockers(turns: Sequence[Turn]) -> list[str]:
    open_: dict[str | None, Turn] = {}
    for t in turns:
        if t.signal in ("BLOCKED_ON", "ESCALATE"):
            open_.pop(t.correlation_id, None)
            open_[t.correlation_id] = t
        else:
            open_.pop(t.correlation_id, None)  # anything later on the same correlation moves it on
    lines = [f"- {t.signal} {_ts(t)}{_corr(t)}: {one_line(t.text, 300)}" for t in reversed(open_.values())]
    return lines[:5] or ["(none)"]


def _last_answer(turns: Sequence[Turn]) -> list[str]:
    for t in reversed(turns):
        if t.role == "agent" and t.signal == "RETURN" and t.correlation_id:
            return [f"{_corr(t).strip()} to {one_line(t.requester, 60)} ({_ts(t)}): {one_line(t.text, 1000)}"]
    return ["(none yet)"]


def _share(sizes: Sequence[int], budget: int) -> list[int]:
    """Water-filling: each rubric gets what it needs up to an equal share of what is left."""
    alloc = [0] * len(sizes)
    left = max(0, budget)
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    for rank, i in enumerate(order):
        share = left // (len(sizes) - rank)
        alloc[i] = min(sizes[i], share)
        left -= alloc[i]
    return alloc


def _fit_lines(lines: Sequence[str], limit: int) -> str:
    out: list[str] = []
    used = 0
    for ln in lines:
        sep = 1 if out else 0
        if used + sep + len(ln) <= limit:
            out.append(ln)
            used += sep + len(ln)
            continue
        room = limit - used - sep
        if room >= 8:
            out.append(_cut(ln, room))
        elif not out and limit >= 1:
            out.append("…")
        break
    return "\n".join(out)


def summarise(turns: Sequence[Turn], *, agent: str | None = None, max_chars: int = HANDOFF_MAX_CHARS) -> str:
    """The handoff of a thread: the five stable rubrics, never more than ``max_chars`` characters.

    Pure. Each rubric gets a fair share of the room (what one does not need goes to the others)
    and is cut at line ends, or inside a line with an ellipsis; the text is clean UTF-8.
    """
    if max_chars < 400:
        raise ValueError("max_chars must leave room for the rubrics (at least 400)")
    who = one_line(agent or (turns[-1].target if turns else "agent"), 64)
    as_of = f", up to {_ts(turns[-1])}" if turns else ""
    header = f"# Handoff: {who}\n_Summary of the shared live thread ({len(turns)} turns{as_of}); not the transcript._\n"
    sections = [_objective(turns), _active_requests(turns), _decisions(turns), _blockers(turns), _last_answer(turns)]
    fixed = len(header) + sum(len(f"\n## {title}\n") for title in RUBRICS) + 1
    sizes = [len("\n".join(lines)) for lines in sections]
    alloc = _share(sizes, max_chars - fixed)
    parts = [header]
    for title, lines, room in zip(RUBRICS, sections, alloc, strict=True):
        parts.append(f"\n## {title}\n{_fit_lines(lines, room)}")
    text = "".join(parts) + "\n"
    return text if len(text) <= max_chars else _cut(text, max_chars)  # guard; the shares already fit


# --------------------------------------------------------------------------------------------
# The shell: threads on disk
# --------------------------------------------------------------------------------------------


@dataclass
class ThreadView:
    """A projection of an agent's thread: the whole thread, or filtered by requester / correlation."""

    agent: str
    requester: str | None
    correlation: str | None
    turns: list[Turn]
    total: int  # turns in the whole thread
    partial: bool
    note: str
    skipped_lines: int = 0
    torn_tail: bool = False
    files: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "agent": self.agent,
            "requester": self.requester,
            "correlation": self.correlation,
            "partial": self.partial,
            "note": self.note,
            "total": self.total,
            "shown": len(self.turns),
            "skipped_lines": self.skipped_lines,
            "torn_tail": self.torn_tail,
            "turns": [t.model_dump(mode="json") for t in self.turns],
        }


def _line(record: Mapping[str, Any]) -> bytes:
    return (_LINE.encode(record) + "\n").encode("utf-8")


_TAIL_CHUNK = 65536


def _aged(handoff: Path) -> bool:
    """Whether a rotation should rewrite ``handoff``: it is missing, or was written ``HANDOFF_MAX_AGE_S`` ago or more.

    A rewrite summarises the newest 2,000 turns (~80-190 ms of a worker thread's GIL time here), and a fan-out
    rotates a MiB of turns every ~1,700 items: in one daemon running fan-outs back to back, every run after the
    first paid one or two of them while its items ran (bench/fanout.py (a): warm runs 10-25 % slower than the
    cold one). A reader still gets a summary at most a minute old: :meth:`LiveContext.handoff_for` rebuilds one
    read more than ``HANDOFF_MAX_AGE_S`` after it was written when turns came since (during a burst of rotations
    handoff.md may now lag the thread by up to that minute, where it lagged by at most one rotated file).
    """
    try:
        written = handoff.stat().st_mtime
    except OSError:
        return True
    return time.time() - written >= HANDOFF_MAX_AGE_S


def _tail_lines(path: Path, limit: int) -> list[bytes]:
    """The last ``limit`` complete, non-blank lines of ``path``, in order (a torn last line is left out).

    Read from the end, a chunk at a time: the handoff is rewritten from the newest turns after every batch of
    appends, and reading the whole log (up to a MiB before it rotates) each time cost CPU and left the soak's
    RSS ratcheting up with the log's size (R-12).
    """
    if limit <= 0:
        return []
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    try:
        end = os.fstat(fd).st_size
        buf = b""
        while True:
            start = max(0, end - _TAIL_CHUNK)
            buf = os.pread(fd, end - start, start) + buf
            end = start
            lines = buf.split(b"\n")
            lines.pop()  # what follows the last newline: nothing, or a record a crash cut short
            if start > 0:
                lines = lines[1:]  # may begin mid-line
            found = [raw for raw in lines if raw.strip()]
            if len(found) >= limit or start == 0:
                return found[-limit:]
    finally:
        os.close(fd)


class LiveContext:
    """The live threads of a brain (``.ambient/live/<agent>/``).

    Appends take a per-agent ``flock`` (threads and processes); they are blocking file calls,
    so from the event loop call them through ``asyncio.to_thread``.
    """

    def __init__(
        self,
        paths: BrainPaths,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        keep: int = DEFAULT_KEEP,
        durable: bool = False,
    ) -> None:
        if max_bytes < 1024 or keep < 1:
            raise ValueError("live context: max_bytes must be at least 1024 and keep at least 1")
        self.paths = paths
        self.max_bytes = max_bytes
        self.keep = keep
        self.durable = durable  # fsync each turn (the run journal, not this, is the source of truth)
        self._dirs: dict[str, Path] = {}  # checked agent names → their thread folder

    def thread_dir(self, agent: str) -> Path:
        """``.ambient/live/<agent>`` (the name is checked first)."""
        known = self._dirs.get(agent)
        if known is None:
            known = self.paths.live / check_agent_name(agent)
            if len(self._dirs) < 4096:
                self._dirs[agent] = known
        return known

    def log_files(self, agent: str) -> list[Path]:
        """The thread's files, oldest first: ``log.K.jsonl`` … ``log.1.jsonl``, ``log.jsonl``."""
        d = self.thread_dir(agent)
        files = [d / f"log.{n}.jsonl" for n in range(self.keep, 0, -1)] + [d / LOG_NAME]
        return [f for f in files if f.is_file()]

    @contextlib.contextmanager
    def _locked(self, directory: Path) -> Iterator[None]:
        fd = open_private(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def append_turn(self, turn: Turn) -> None:
        """Append a turn to its agent's thread; rotate past ``max_bytes``; rewrite ``handoff.md``
        after a HANDOFF or CHECKPOINT turn, and after a rotation unless it was written less than
        ``HANDOFF_MAX_AGE_S`` ago (see :func:`_aged`)."""
        self.append_turns([turn])

    def append_turns(self, turns: Iterable[Turn]) -> None:
        """Append turns in order, with one lock and one write per thread (and per rotation).

        Performance (bench/fanout.py): a fan-out adds two turns per item; one lock, stat, open and write per
        turn was a dozen syscalls per turn on a busy disk. The daemon hands its batches here.
        """
        groups: dict[str, list[Turn]] = {}
        for turn in turns:
            groups.setdefault(turn.target, []).append(turn)
        failed: Exception | None = None
        for agent, group in groups.items():
            try:
                self._append_group(agent, group)
            except (OSError, InputError) as exc:  # one broken thread must not lose the others' turns
                failed = failed or exc
        if failed is not None:
            raise failed

    def append_records(self, records: Iterable[Mapping[str, Any]]) -> None:
        """:meth:`append_turns` for records made by :func:`turn_record` (the daemon's path)."""
        groups: dict[str, list[Mapping[str, Any]]] = {}
        for rec in records:
            groups.setdefault(str(rec["target"]), []).append(rec)
        failed: Exception | None = None
        for agent, group in groups.items():
            try:
                self._append_lines(
                    agent, [_line(r) for r in group], any(r.get("signal") in HANDOFF_SIGNALS for r in group)
                )
            except (OSError, InputError) as exc:  # one broken thread must not lose the others' turns
                failed = failed or exc
        if failed is not None:
            raise failed

    def _append_group(self, agent: str, group: Sequence[Turn]) -> None:
        lines = [_line(t.model_dump(mode="json", exclude_none=True)) for t in group]
        self._append_lines(agent, lines, any(t.signal in HANDOFF_SIGNALS for t in group))

    def _append_lines(self, agent: str, lines: Sequence[bytes], handoff: bool) -> None:
        d = private_dir(self.thread_dir(agent))
        with self._locked(d):
            log = d / LOG_NAME
            try:
                size = log.stat().st_size
            except FileNotFoundError:
                size = 0
            chunk: list[bytes] = []
            pending = 0
            rotated = False
            for data in lines:
                if size + pending > 0 and size + pending + len(data) > self.max_bytes:
                    if chunk:
                        self._append(log, b"".join(chunk))
                        chunk, pending = [], 0
                    self._rotate(d)
                    size, rotated = 0, True
                chunk.append(data)
                pending += len(data)
            if chunk:
                self._append(log, b"".join(chunk))
            if handoff or (rotated and _aged(d / HANDOFF_NAME)):
                self._write_handoff(agent)

    def append_packet(
        self, packet: Mapping[str, Any], *, ts: datetime, correlation_id: str | None = None, source: str = "router"
    ) -> Turn | None:
        """Record a delivered packet in the thread it concerns (see :func:`turn_from_packet`)."""
        turn = turn_from_packet(packet, ts=ts, correlation_id=correlation_id, source=source)
        if turn is not None:
            self.append_turn(turn)
        return turn

    def _append(self, log: Path, data: bytes) -> None:
        fd = open_private(log, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data  # a torn last line (crash mid-append) stays alone on its line
            try:
                write_all(fd, data)
            except OSError:  # a full disk: no fragment is left for the next append to be glued onto
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                raise
            if self.durable:
                os.fsync(fd)
        finally:
            os.close(fd)

    def _rotate(self, d: Path) -> None:
        # log.K is the oldest and leaves; the rotation applies to the canonical thread (spec/001).
        (d / f"log.{self.keep}.jsonl").unlink(missing_ok=True)
        for n in range(self.keep - 1, 0, -1):
            src = d / f"log.{n}.jsonl"
            if src.exists():
                src.rename(d / f"log.{n + 1}.jsonl")
        (d / LOG_NAME).rename(d / "log.1.jsonl")
        if self.durable:
            fsync_dir(d)

    def _read(self, files: Sequence[Path]) -> tuple[list[Turn], int, bool]:
        turns: list[Turn] = []
        skipped = 0
        torn = False
        for f in files:
            res = ReadResult()
            for rec in iter_jsonl(f, res):
                try:
                    turns.append(Turn.model_validate(rec))
                except (ValidationError, InputError):
                    skipped += 1
            skipped += len(res.bad_lines)
            torn = torn or res.torn_tail
        return turns, skipped, torn

    def turns(self, agent: str) -> list[Turn]:
        """Every readable turn of the thread, oldest first."""
        return self._read(self.log_files(agent))[0]

    def recent_turns(self, agent: str, limit: int = SUMMARY_TURNS) -> list[Turn]:
        """The turns of the newest ``limit`` lines of the two newest files, oldest first.

        A torn last line, a blank or corrupt line yields no turn (so there may be fewer than ``limit``).
        Performance: a rotation rewrites the handoff from here, and validating every turn of the full rotated
        file (~3,400 turns a MiB) held the GIL ~125 ms, stalling the daemon's loop; now only the lines
        needed are validated, from their JSON text (~45 ms).
        """
        picked: list[bytes] = []
        for f in reversed(self.log_files(agent)[-2:]):
            picked = _tail_lines(f, limit - len(picked)) + picked
            if len(picked) >= limit:
                break
        turns: list[Turn] = []
        for raw in picked:
            try:
                turns.append(Turn.model_validate_json(raw))
            except (ValidationError, InputError):
                continue
        return turns

    def view(self, agent: str, requester: str | None = None, correlation: str | None = None) -> ThreadView:
        """The thread, or the turns of one requester and/or one correlation id.

        A filtered view is marked partial: the agent's live context is shared by every requester,
        so what the agent knows includes turns the view does not show.
        """
        files = self.log_files(agent)
        turns, skipped, torn = self._read(files)
        shown = [
            t
            for t in turns
            if (requester is None or t.requester == requester)
            and (correlation is None or t.correlation_id == correlation)
        ]
        filters = [f"{k} {v}" for k, v in (("requester", requester), ("correlation", correlation)) if v is not None]
        partial = bool(filters)
        if partial:
            note = (
                f"partial view ({' and '.join(filters)}): {agent}'s live context is one thread shared by every "
                f"requester; {len(turns) - len(shown)} of its {len(turns)} turns are not shown here"
            )
        else:
            note = f"full thread of {agent}, shared by every requester"
        return ThreadView(
            agent, requester, correlation, shown, len(turns), partial, note, skipped, torn, [f.name for f in files]
        )

    def _write_handoff(self, agent: str) -> str:
        text = summarise(self.recent_turns(agent), agent=agent)
        atomic_write(self.thread_dir(agent) / HANDOFF_NAME, text, mode=PRIVATE_FILE)
        return text

    def handoff_for(self, agent: str) -> str:
        """What a runner gives the agent: ``handoff.md``, at most 4096 characters. Never the raw transcript.

        ``handoff.md`` is rewritten after a HANDOFF or CHECKPOINT turn and at rotation; it is also written here
        when a thread has none yet, and rebuilt here when it is read more than ``HANDOFF_MAX_AGE_S`` after it was
        written and turns came since. Summarising on every read instead (the file was only written by those
        turns) parsed the newest 2,000 turns each time: ~160 ms of CPU and 4.6 MB at once for every run's first
        spawn of an agent (R-12's soak: most of the daemon's time, and its RSS ratcheting up).
        A thread folder that is a symlink is neither read nor written: the agent gets an empty handoff (logged).
        """
        d = self.thread_dir(agent)
        if d.is_symlink():
            try:
                private_dir(d)
            except InputError as exc:
                log.warning("thread_refused", agent=agent, error=str(exc))
                return summarise([], agent=agent)
        path = d / HANDOFF_NAME
        try:
            raw = read_capped(path, 64 * 1024)
        except FileNotFoundError:
            return self._rebuild_handoff(agent) if d.is_dir() else summarise([], agent=agent)
        except InputError:  # not a regular file, a symlink or too big: summarised, and that file left alone
            return summarise(self.recent_turns(agent), agent=agent)
        if self._outdated(path, d / LOG_NAME):
            return self._rebuild_handoff(agent)
        text = raw.decode("utf-8", "replace")
        return text if len(text) <= HANDOFF_MAX_CHARS else _cut(text, HANDOFF_MAX_CHARS)

    @staticmethod
    def _outdated(handoff: Path, thread_log: Path) -> bool:
        try:
            written = handoff.stat().st_mtime
            appended = thread_log.stat().st_mtime
        except FileNotFoundError:
            return False
        return appended > written and time.time() - written > HANDOFF_MAX_AGE_S

    def _rebuild_handoff(self, agent: str) -> str:
        """The summary, kept as ``handoff.md`` when it can be: an agent is not refused its handoff because the
        file could not be written (disk full, a read-only copy of the brain)."""
        try:
            with self._locked(private_dir(self.thread_dir(agent))):
                return self._write_handoff(agent)
        except (OSError, InputError) as exc:
            log.warning("handoff_not_written", agent=agent, error=str(exc))
            return summarise(self.recent_turns(agent), agent=agent)
