"""The connection's error log: an unreachable server is said once, not every half second."""

from __future__ import annotations

from ambient.cluster.link import Outage


def test_a_repeated_error_is_said_once_until_the_connection_is_back() -> None:
    outage = Outage()
    said = [outage.first("nats: no servers available for connection") for _ in range(20)]
    assert said == [True] + [False] * 19
    assert outage.first("nats: timeout") is True  # another error is news
    outage.over()
    assert outage.first("nats: no servers available for connection") is True
