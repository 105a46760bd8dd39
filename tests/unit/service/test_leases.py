"""Leases tested alone: a running agent's scope locks renewed."""

from __future__ import annotations

from pathlib import Path

import pytest

from ambient.storage.paths import BrainPaths


@pytest.mark.slow
async def test_leases_keep_a_running_agents_locks(tmp_path: Path) -> None:
    """A scope lock held for a running agent is renewed at a third of its TTL, so an agent that runs
    longer than the TTL keeps its scope; once dropped, its lease ends as before."""
    import asyncio
    import time

    from ambient.claims.locks import LockManager
    from ambient.core.errors import LockHeldError
    from ambient.service.leases import Leases
    from tests.conftest import async_wait_until

    locks = LockManager(BrainPaths(tmp_path), grace_s=0.0)  # an expired lock is taken over at once
    leases = Leases(locks)
    grant = locks.acquire("projets/a.md", "sess-agent", ttl_s=0.6)
    leases.hold(grant)
    renewed = lambda: leases._held[(grant.file, grant.token)].expires > grant.expires + 0.5  # noqa: E731
    assert await async_wait_until(renewed, 5)
    assert await async_wait_until(lambda: time.time() > grant.expires + 0.1, 5)  # the first lease is over...
    # ... yet a contender still finds the lock held: it was renewed
    with pytest.raises(LockHeldError):
        await asyncio.to_thread(locks.acquire, "projets/a.md", "sess-contender", ttl_s=5, pid_bound=False)
    last = leases.drop(grant)
    assert last.token == grant.token
    locks.release_grant(last)
    assert locks.acquire("projets/a.md", "sess-contender", ttl_s=5).holder == "sess-contender"
