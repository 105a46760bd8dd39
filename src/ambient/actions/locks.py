"""A person releases a lock (``ambient lock release FILE HOLDER``, the console's "Release" button).

The release checks, under the locks' guard, that the lock still carries that holder (and token, when given):
a lock that changed hands meanwhile is never deleted, and the refusal says who holds it now
(:class:`~ambient.core.errors.LockNotHeldError`, what the CLI prints).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ambient.claims.locks import LockManager

if TYPE_CHECKING:
    from ambient.storage.paths import BrainPaths


def release_lock(paths: BrainPaths, file: str, holder: str, *, token: int | None = None) -> str:
    """Release the lock of ``file`` (relative to the brain) held by ``holder``; the line a person reads.

    Raises LockNotHeldError (nothing changed) when it is not held by ``holder`` (under ``token``)."""
    manager = LockManager(paths)
    try:
        manager.release(file, holder, token=token)
    finally:
        manager.close()
    return f"released {file}"
