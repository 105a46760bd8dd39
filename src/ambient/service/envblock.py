"""The daemon's secrets leave its environment block, which other processes of its user can read.

``/proc/<pid>/environ`` shows the environment a process was started with, straight from its memory, to any
process of the same user (and to root): an agent read ``AMBIENT_NOTIFY_URLS`` (tokens in its URLs) and
``CREDENTIALS_DIRECTORY`` there. Two locks on it:

- the daemon is not dumpable (:func:`undumpable`): its ``/proc/<pid>/`` files belong to root and only a process
  with ``CAP_SYS_PTRACE`` may read its environment or memory, not an agent of its own user;
- the secrets go by what the settings read, not only by name (:func:`secret_names`): every model key an agent's
  runner names (``api_key_env: GROQ_KEY`` says nothing of a key by its name), the notification URLs, the
  credentials folder, and any variable whose name says it holds a secret. Python copied the environment into
  ``os.environ`` at start; the daemon keeps its own copy (``DaemonOptions.environ``, read at every reload), so
  those values are overwritten in the block itself and removed from ``os.environ`` (:func:`forget`): no child
  of the daemon (git, the Claude Code SDK's CLI) inherits them either.

Linux only (elsewhere, nothing to do: there is no such file).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ambient.core.lazylog import get_logger
from ambient.runners.claude import MODEL_KEYS
from ambient.runners.keys import key_name

log = get_logger(__name__)

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


_PR_SET_DUMPABLE = 4


def undumpable() -> bool:
    """Make this process not dumpable (``prctl(PR_SET_DUMPABLE, 0)``): its ``/proc/<pid>/environ``, ``mem``,
    ``maps`` and ``auxv`` are closed to every process without ``CAP_SYS_PTRACE``, an agent of the same user
    included, and it leaves no core dump holding its secrets. False where it cannot be (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def secret_names(runners: Mapping[str, Any], environ: Mapping[str, str]) -> set[str]:
    """The variables of ``environ`` that hold a secret by what the settings read: each model key a runner names
    (``api_key_env``, the providers' defaults, Claude's keys), and every name :func:`is_secret` says."""
    names = set(MODEL_KEYS)
    names.update(n for cfg in runners.values() if (n := key_name(cfg)) is not None)
    names.update(n for n in environ if is_secret(n))
    return {n for n in names if n in environ}


def forget(names: Iterable[str]) -> list[str]:
    """The secrets ``names`` out of this process: their values overwritten in the environment block
    (:func:`scrub`) and removed from ``os.environ`` (children inherit nothing of them); the names scrubbed."""
    wanted = set(names)
    done = scrub(wanted)
    for name in wanted:
        os.environ.pop(name, None)
    return done
