"""A packet handed to the brain's router, as ``ambient send`` hands it: to the running daemon over its send socket
(:mod:`ambient.kernel.sendsocket`), else routed in this process by the same router, with the same audit record and
the same delivery to the daemon's inbox, which the daemon then acts on (at its start if it is down).

``ambient send`` and the person's own packets (``ambient gate abort`` on a run's claim: an ABORT) take this one path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ambient.core.problems import Problem
    from ambient.storage.paths import BrainPaths


@dataclass(frozen=True)
class Sent:
    """The router's answer (:func:`ambient.kernel.sendsocket.summary`), who routed it (``daemon``: the running
    daemon; ``here``: this process, no daemon answering) and the brain's routing problems met on the way."""

    answer: dict[str, Any]
    via: str
    problems: list[Problem] = field(default_factory=list)

    @property
    def delivered(self) -> bool:
        return self.answer.get("status") == "delivered"


def send_packet(paths: BrainPaths, raw: bytes, token: str | None = None) -> Sent:
    """Route ``raw`` (a packet's YAML or JSON) as ``token``'s principal (None: the person). Raises
    :class:`~ambient.core.errors.NoAnswer` when a daemon took it but did not answer (it may be delivered)."""
    # The router is imported only when no daemon answers: it costs ~0.2 s of imports (the start-up time of a short
    # CLI command; ambient.kernel.sendsocket's client half uses the standard library only).
    from ambient.kernel.sendsocket import ask_daemon

    answer = ask_daemon(paths.state, raw, token)
    if answer is not None:
        return Sent(answer, "daemon")
    return route_here(paths, raw, token)


def route_here(paths: BrainPaths, raw: bytes, token: str | None = None) -> Sent:
    """Route in this process, as the daemon would: the same router, audit record and inbox delivery."""
    import asyncio

    from ambient.kernel.inbox import inbox_handler
    from ambient.kernel.router import Router
    from ambient.kernel.sendsocket import summary
    from ambient.storage.fsutil import private_dir

    private_dir(paths.inbox)  # a link there is refused by name before anything is routed or audited
    router, problems = Router.for_brain(paths, buffered=True)
    try:
        router.set_default(inbox_handler(paths))
        assert router.registry is not None
        outcome = asyncio.run(router.send(raw, router.registry.channel_for(token)))
    finally:
        router.close()
    return Sent(summary(outcome), "here", [p for p in problems if p.severity == "error"])
