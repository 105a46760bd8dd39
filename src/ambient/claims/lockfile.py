"""The lock file's format (DESIGN 4, spec/002 BSI-v3-7): its name, what it says, reading it, writing it.

Pure: no file is opened here (:mod:`ambient.claims.lockstate` reads lock files, :mod:`ambient.claims.locks` writes
them). A lock lives at ``locks/<percent-encoded path>.lock``: paths are percent-encoded so they cannot escape or
collide (RELIABILITY §1.2 rule 9). Its content is readable YAML; ambient writes one ``key: <JSON value>`` per line,
which a fast reader takes, and reads anything else (the source's ``file-lock.sh`` format, hand edits) with the
safe YAML reader, loaded on demand: PyYAML is not imported at import time (the ``ambient lock`` command runs around
every write of a script).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any, Final
from urllib.parse import quote, unquote

from ambient.core.errors import InputError, UnsafePathError
from ambient.storage.fsutil import check_relative

LOCK_SUFFIX: Final = ".lock"
MAX_LOCK_BYTES: Final = 4096  # same cap as ambient.storage.yamlfile.MAX_LOCK_BYTES (not imported: it pulls PyYAML)
MAX_HOLDER_LEN: Final = 200

# -- names


_QUOTE_FREE: Final = re.compile(r"[A-Za-z0-9_.~/-]+")


@lru_cache(maxsize=1024)
def folders_above(rel: str) -> list[str]:
    """The folder locks that cover ``rel`` (a normalised path, a folder ending with ``/``), nearest last:
    ``a/b/c.md`` → ``a/``, ``a/b/``. A folder lock covers every file and folder under it."""
    parts = rel.rstrip("/").split("/")
    return ["/".join(parts[:i]) + "/" for i in range(1, len(parts))]


def below_prefix(name: str) -> str | None:
    """For the lock file ``name`` of a folder, the start every lock name under that folder has; None for a file's
    (its encoding keeps each character's, so ``a/b/`` → ``a%2Fb%2F``, and ``a/b/c.md`` starts with it)."""
    stem = name[: -len(LOCK_SUFFIX)]
    return stem if stem.endswith("%2F") else None


def encode_path(file: str) -> tuple[str, str]:
    """(normalised brain-relative path, lock file name) for ``file``; refuses anything that could escape.

    ``agents/foo.md`` → ``agents%2Ffoo.md.lock``. A trailing ``/`` (a folder scope) is kept, so a
    folder and a file of the same name get different locks. ``%`` is encoded too, so two paths
    never share a name (RELIABILITY §1.2 rule 9, S-01).
    """
    if not isinstance(file, str):
        raise InputError(f"lock path must be a string, got {type(file).__name__}")
    folder = file.endswith("/")
    rel = check_relative(file)
    if not rel:
        raise InputError(f"lock path {file!r} is empty; expected a file or folder path relative to the brain root")
    if not rel.isprintable():  # control characters, and line breaks YAML would fold
        raise UnsafePathError(f"lock path {file!r} contains a control or line-break character")
    if folder:
        rel += "/"
    # quote() leaves letters, digits and "_.-~" as they are: a path of only those and "/" needs no scan.
    name = rel.replace("/", "%2F") if _QUOTE_FREE.fullmatch(rel) else quote(rel, safe="")
    if name.startswith("."):
        name = "%2E" + name[1:]  # a lock is never a hidden file (hidden names are temp files)
    name += LOCK_SUFFIX
    if len(name.encode()) > 255:
        raise InputError(f"lock path {file!r} is too long to lock (its encoded name is over 255 bytes)")
    return rel, name


def decode_name(name: str) -> str | None:
    """The path a lock file name stands for, or None for a name this module did not make."""
    if not name.endswith(LOCK_SUFFIX) or name.startswith("."):
        return None
    rel = unquote(name[: -len(LOCK_SUFFIX)])
    try:
        encode_path(rel)
    except (InputError, UnsafePathError):
        return None
    return rel


@lru_cache(maxsize=1024)
def check_holder(holder: str) -> str:
    """A holder (session id) must be printable text of at most 200 characters."""
    if not isinstance(holder, str) or not holder.strip():
        raise InputError("lock holder is empty; expected a session id such as sess-20260316-2036-x")
    # isprintable also refuses U+0085/U+2028/U+2029, which YAML and str.splitlines treat as line breaks.
    if len(holder) > MAX_HOLDER_LEN or not holder.isprintable():
        raise InputError(f"lock holder {holder[:40]!r} must be printable text of at most {MAX_HOLDER_LEN} characters")
    return holder


# -- what a lock file says


@dataclass(frozen=True)
class LockInfo:
    """A parsed lock file: the source's keys (file, holder, claimed_at, expires_at, ttl_min) plus ours."""

    file: str
    holder: str
    expires_at: str
    expires: float  # epoch seconds
    claimed_at: str | None = None
    ttl_min: float | None = None
    token: int | None = None
    instance: str | None = None
    pid: int | None = None
    pid_start_time: float | None = None
    host: str | None = None
    pid_bound: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The lock's keys, for JSON output."""
        out: dict[str, Any] = {
            "file": self.file,
            "holder": self.holder,
            "claimed_at": self.claimed_at,
            "expires_at": self.expires_at,
            "ttl_min": self.ttl_min,
            "token": self.token,
            "instance": self.instance,
            "pid": self.pid,
            "pid_start_time": self.pid_start_time,
            "host": self.host,
            "pid_bound": self.pid_bound,
        }
        out.update(self.extra)
        return out


# -- parsing

_LINE_RE: Final = re.compile(r"^([a-z_]+): (.*)$")


def _parse_fast(text: str) -> dict[str, Any] | None:
    """Our own format: one ``key: <JSON value>`` per line. None for anything else (then YAML)."""
    out: dict[str, Any] = {}
    for line in text.splitlines():
        m = _LINE_RE.match(line)
        if m is None or m.group(1) in out:
            return None
        try:
            out[m.group(1)] = json.loads(m.group(2))
        except (ValueError, RecursionError):  # a value nested past the decoder's depth: YAML tells it at its line
            return None
    return out


def _parse_yaml(raw: bytes, source: str) -> dict[str, Any]:
    # Imported here: only a foreign or hand-edited lock needs PyYAML, and `ambient lock` runs around every write of
    # a script (module docstring).
    from ambient.storage.yamlfile import decode, parse_yaml

    data, _ = parse_yaml(decode(raw, source=source), source=source)
    if not isinstance(data, dict):
        raise InputError("is not a YAML mapping of lock keys (file, holder, expires_at, ...)", file=source, line=1)
    return data


def _time_text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _epoch(text: str) -> float | None:
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.astimezone()  # the source writes local time without an offset
    return dt.timestamp()


def _key_line(text: str, key: str) -> int:
    """The line on which ``key`` is set (1 when it cannot be told): where a bad value is reported."""
    m = re.search(rf"^[ \t{{]*[\"']?{re.escape(key)}[\"']?[ \t]*:", text, re.MULTILINE)
    return text.count("\n", 0, m.start()) + 1 if m else 1


def parse_lock(raw: bytes, source: str) -> LockInfo:
    """Parse and check a lock file's bytes; raises InputError saying what is wrong, at ``file:line`` (line 1 for the
    file as a whole: empty, not text, not a mapping, keys missing), as every other problem with a file is told."""
    if not raw.strip():
        raise InputError("is empty (a crash mid-write, or another tool); expected lock keys", file=source, line=1)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("is not UTF-8 text", file=source, line=1) from None
    data = _parse_fast(text)
    if data is None:
        data = _parse_yaml(raw, source)
    missing = [k for k in ("file", "holder", "expires_at") if k not in data]
    if missing:
        expected = "expected file, holder, claimed_at, expires_at, ttl_min"
        raise InputError(f"lacks {', '.join(missing)}; {expected}", file=source, line=1)
    file_, holder, expires_at = data["file"], data["holder"], data["expires_at"]
    if not isinstance(file_, str) or not isinstance(holder, str) or not holder:
        bad = "file" if not isinstance(file_, str) else "holder"
        raise InputError("file and holder must be text", file=source, line=_key_line(text, bad))
    if not isinstance(expires_at, str):
        raise InputError(
            f"expires_at must be an ISO date-time, got {expires_at!r}", file=source, line=_key_line(text, "expires_at")
        )
    expires = _epoch(expires_at)
    if expires is None:
        raise InputError(
            f"expires_at {expires_at!r} is not an ISO date-time (YYYY-MM-DDTHH:MM)",
            file=source,
            line=_key_line(text, "expires_at"),
        )

    def _num(key: str, kinds: tuple[type, ...]) -> Any:
        value = data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise InputError(f"{key} must be a number, got {value!r}", file=source, line=_key_line(text, key))
        return value

    token = _num("token", (int,))
    pid = _num("pid", (int,))
    start = _num("pid_start_time", (int, float))
    ttl_min = _num("ttl_min", (int, float))
    bound = data.get("pid_bound", False)
    known = {
        "file",
        "holder",
        "claimed_at",
        "expires_at",
        "ttl_min",
        "token",
        "instance",
        "pid",
        "pid_start_time",
        "host",
        "pid_bound",
    }
    return LockInfo(
        file=file_,
        holder=holder,
        expires_at=expires_at,
        expires=expires,
        claimed_at=_time_text(data.get("claimed_at")),
        ttl_min=float(ttl_min) if ttl_min is not None else None,
        token=token,
        instance=data["instance"] if isinstance(data.get("instance"), str) else None,
        pid=pid,
        pid_start_time=float(start) if start is not None else None,
        host=data["host"] if isinstance(data.get("host"), str) else None,
        pid_bound=bound is True,
        extra={k: v for k, v in data.items() if k not in known},
    )


# -- writing


@lru_cache(maxsize=1024)
def _q(text: str) -> str:
    # A JSON string is a valid YAML double-quoted scalar for printable text (holders and paths are checked).
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'  # what json.dumps gives for such text, without building an encoder (hot path)
    return json.dumps(text, ensure_ascii=False)


_SECONDS: dict[int, tuple[str, str]] = {}  # whole second → (date and time, UTC offset) in local time


def _local_iso(t: float) -> str:
    """ISO 8601 local time with milliseconds and the offset in force at t (a hand-made isoformat: hot path).

    Each lock renders two of these; the part that changes once a second is kept (``time.localtime`` and the
    formatting were ~6 µs a call, bench/fanout.py).
    """
    sec = int(t // 1)
    parts = _SECONDS.get(sec)
    if parts is None:
        lt = time.localtime(sec)
        off = lt.tm_gmtoff or 0
        sign = "-" if off < 0 else "+"
        off = abs(off)
        parts = (
            f"{lt.tm_year:04d}-{lt.tm_mon:02d}-{lt.tm_mday:02d}T{lt.tm_hour:02d}:{lt.tm_min:02d}:{lt.tm_sec:02d}",
            f"{sign}{off // 3600:02d}:{off % 3600 // 60:02d}",
        )
        if len(_SECONDS) >= 16:
            _SECONDS.clear()
        _SECONDS[sec] = parts
    ms = int((t % 1) * 1000)
    return f"{parts[0]}.{ms:03d}{parts[1]}"


def _ttl_min(ttl_s: float) -> int | float:
    minutes = ttl_s / 60.0
    return int(minutes) if minutes == int(minutes) else round(minutes, 4)


def holder_lines(instance: str, pid: int, start: float | None, host: str, pid_bound: bool) -> tuple[str, str]:
    """The lines naming the holder's process, before and after ``token`` (the same for every grant of a process:
    the manager keeps them)."""
    return (
        f"instance: {_q(instance)}\npid: {pid}\npid_start_time: {'null' if start is None else start}\n",
        f"host: {_q(host)}\npid_bound: {'true' if pid_bound else 'false'}\n",
    )


def render_lock(rel: str, holder: str, token: int, now: float, ttl_s: float, lines: tuple[str, str]) -> bytes:
    """A lock file's content in our format (``lines`` from :func:`holder_lines`): what :func:`parse_lock` reads."""
    claimed, expires = _local_iso(now), _local_iso(now + ttl_s)
    return (
        f'file: {_q(rel)}\nholder: {_q(holder)}\nclaimed_at: "{claimed}"\nexpires_at: "{expires}"\n'
        f"ttl_min: {_ttl_min(ttl_s)}\n{lines[0]}token: {token}\n{lines[1]}"
    ).encode()
