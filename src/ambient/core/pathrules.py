"""Brain-relative path rules, stdlib only (S-01): shared by the zones and fsutil modules.

Kept free of pydantic so that short commands (``ambient lock ...``) check paths without loading it.
"""

from __future__ import annotations

from functools import lru_cache

from ambient.core.errors import UnsafePathError


@lru_cache(maxsize=8192)  # pure; a fan-out normalises the same item paths several times per item
def normalize(path: str) -> str:
    """Normalise a brain-relative path to POSIX form, rejecting anything that could escape.

    Rejected: NUL bytes, backslashes, absolute paths, ``..`` components, components over 255 bytes.
    A trailing ``/`` is kept (it marks a folder scope).
    """
    if "\x00" in path:
        raise UnsafePathError(f"path {path!r} contains a NUL byte")
    if "\\" in path:
        raise UnsafePathError(f"path {path!r} contains a backslash; use '/' separators")
    if path.startswith("/"):
        raise UnsafePathError(f"path {path!r} is absolute; expected a path relative to the brain root")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafePathError(f"path {path!r} contains '..'; expected a path inside the brain root")
    if any(len(p.encode()) > 255 for p in parts):
        raise UnsafePathError(f"path {path!r} has a component longer than 255 bytes")
    if not parts:
        return ""
    out = "/".join(parts)
    return out + "/" if path.endswith("/") else out
