"""The daemon's secrets leave its environment block, which other processes of its user can read.

``/proc/<pid>/environ`` shows the environment a process was started with, straight from its memory, to any
process of the same user (and to root): an agent read ``AMBIENT_NOTIFY_URLS`` (tokens in its URLs) and
``CREDENTIALS_DIRECTORY`` there (issue 25, 2). Python copied the environment into ``os.environ`` at start, so
once the settings are read the daemon overwrites those values in the block itself; ``os.environ`` keeps them for
the reloads. Linux only (elsewhere, nothing to do: there is no such file).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

#: Variables that hold a secret or say where secrets are; and any whose name says it holds one.
SECRET_NAMES = frozenset({"AMBIENT_NOTIFY_URLS", "CREDENTIALS_DIRECTORY"})
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "API_KEY", "APIKEY", "CREDENTIAL")


def is_secret(name: str) -> bool:
    upper = name.upper()
    return name in SECRET_NAMES or any(word in upper for word in _SECRET_WORDS)


def _block() -> tuple[int, bytes] | None:
    """Where this process's environment block starts in memory, and its bytes (None: not Linux, unreadable)."""
    try:
        stat = Path("/proc/self/stat").read_bytes()
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    if len(fields) < 49:  # env_start is field 50 (Linux 3.5+)
        return None
    return int(fields[47]), raw


def scrub(names: Iterable[str] | None = None) -> list[str]:
    """Overwrite with NULs the values of the secret variables (``names``, default: :func:`is_secret`) in this
    process's environment block; the names scrubbed."""
    found = _block()
    if found is None:
        return []
    start, raw = found
    wanted = set(names) if names is not None else None
    done: list[str] = []
    offset = 0
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        text = name.decode(errors="replace")
        if sep and value and (text in wanted if wanted is not None else is_secret(text)):
            ctypes.memset(start + offset + len(name) + 1, 0, len(value))
            done.append(text)
        offset += len(entry) + 1
    if done:
        log.debug("environment_scrubbed", names=done)
    return done
