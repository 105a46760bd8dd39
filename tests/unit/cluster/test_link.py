"""The connection's error log: an unreachable server is said once, not every half second; its close is bounded."""

from __future__ import annotations

import asyncio
from typing import Any

from ambient.cluster.link import Link, Outage
from ambient.cluster.protocol import Names


def test_a_repeated_error_is_said_once_until_the_connection_is_back() -> None:
    outage = Outage()
    said = [outage.first("nats: no servers available for connection") for _ in range(20)]
    assert said == [True] + [False] * 19
    assert outage.first("nats: timeout") is True  # another error is news
    outage.over()
    assert outage.first("nats: no servers available for connection") is True


async def test_a_client_whose_close_hangs_does_not_hold_the_stop() -> None:
    """A worker's or the daemon's stop closes the link last: a client that never finishes closing is let go."""

    class Hanging:
        async def flush(self) -> None:
            await asyncio.Event().wait()

        async def close(self) -> None:
            await asyncio.Event().wait()

    nc: Any = Hanging()
    link = Link(nc=nc, js=None, attempts=None, workers=None, names=Names("ns"))
    await asyncio.wait_for(link.close(timeout_s=0.05), timeout=5.0)
