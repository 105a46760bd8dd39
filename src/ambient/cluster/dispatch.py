"""The daemon's side: a dispatched agent's SPAWN goes to the workers instead of a local runner, and its result comes
back the same way a local runner's does (an :class:`~ambient.runners.result.AgentResult`), so the engine journals
it, routes it and retries it exactly as it would a local one.

The daemon stays the only decider: it accepted the attempt in its journal before calling :meth:`Dispatcher.run`,
and it alone writes ``finished``. A worker only runs the agent and commits the result under its lease. Reattaching
after a daemon crash needs nothing of its own: the engine runs an interrupted attempt again under the same number,
so the same attempt key; :meth:`Dispatcher.run` first looks for that attempt's result, and a second publish of its
SPAWN is dropped by the server (``Nats-Msg-Id``). A result committed while the daemon was down is not lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Mapping
from typing import Any

import structlog

from ambient.cluster.link import Link, connect, ensure_consumers
from ambient.cluster.protocol import AI_ON_WORKERS, Done, Work, entry_from, kv_key, resumed_record, work_subject
from ambient.runners.base import RunRequest
from ambient.runners.result import AgentResult, error_result
from ambient.runners.runner_config import AnyRunnerConfig

log = structlog.get_logger(__name__)

#: While waiting for a result, the entry is read again this often even without a watch update (a watch may miss
#: updates across a reconnect).
_RECHECK_S = 2.0


class Dispatcher:
    """Publishes SPAWNs of dispatched agents to JetStream and waits for their results."""

    def __init__(self, urls: list[str], creds: str | None, dispatch: Mapping[str, str], lease_s: float) -> None:
        self.urls = urls
        self.creds = creds
        self.dispatch = dict(dispatch)
        self.lease_s = lease_s
        self._link: Link | None = None
        self._connecting: asyncio.Lock | None = None
        self._consumers: set[str] = set()  # agents whose durable consumer this dispatcher made sure of

    def dispatches(self, agent: str) -> bool:
        """Whether ``agent`` runs on the workers."""
        return self.dispatch.get(agent) == "workers"

    async def link(self) -> Link:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._link is None:
                link = await connect(self.urls, self.creds, name=f"ambient-daemon@{socket.gethostname()}")
                agents = [a for a in self.dispatch if self.dispatches(a)]
                await ensure_consumers(link.js, agents, self.lease_s)
                self._consumers.update(agents)
                self._link = link
            return self._link

    async def _consumer(self, link: Link, agent: str) -> None:
        """The agent's consumer, for an agent dispatched by a reload after the connection was made."""
        if agent not in self._consumers:
            await ensure_consumers(link.js, [agent], self.lease_s)
            self._consumers.add(agent)

    async def close(self) -> None:
        if self._link is not None:
            await self._link.close()
            self._link = None

    async def run(self, req: RunRequest, cfg: AnyRunnerConfig) -> AgentResult:
        """The attempt's result: the one already committed for its key, else the one a worker commits after this
        publishes the SPAWN. Never raises for a failure of the cluster: it becomes an error result (retried by the
        workflow's policy); a cancellation (the daemon stopping) leaves the remote attempt running, and the next
        start finds its result."""
        if cfg.kind != "command":
            return error_result(
                "bad_request", f"agent {req.agent!r} is kind: {cfg.kind}; " + AI_ON_WORKERS.format(kind=cfg.kind)
            )
        try:
            link = await self.link()
            await self._consumer(link, req.agent)
            key = kv_key(req.key)
            done = await _done(link, key)
            if done is not None:
                log.info("remote_reattached", key=req.key, worker=done.worker, host=done.host)
                return done.result
            work = Work(
                key=req.key,
                run_id=req.run_id,
                item=req.item,
                attempt=req.attempt,
                agent=req.agent,
                runner=cfg.model_dump(mode="json", exclude={"dispatch"}),  # where it runs is the daemon's business
                packet=req.packet,
                vars=dict(req.vars),
                handoff=req.bounded_handoff(),
                resumed=resumed_record(req.resumed),
                lease_s=self.lease_s,
            )
            ack = await _publish(link, work_subject(req.agent), work.to_bytes(), req.key)
            log.info("remote_dispatched", key=req.key, agent=req.agent, duplicate=bool(ack.duplicate))
            done = await self._wait(link, key)
            log.info("remote_result", key=req.key, worker=done.worker, host=done.host, status=done.result.status)
            return done.result
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the cluster's failure is this attempt's error, never the daemon's
            log.warning("remote_failed", key=req.key, error=str(exc))
            return error_result("spawn_failed", f"the cluster could not run the attempt: {exc}")

    async def _wait(self, link: Link, key: str) -> Done:
        """Until the attempt's entry is a result: watch it, and read it again every few seconds."""
        from nats.errors import TimeoutError as NatsTimeout

        watcher = await link.attempts.watch(key)
        try:
            while True:
                with contextlib.suppress(NatsTimeout, asyncio.TimeoutError):
                    update = await watcher.updates(timeout=_RECHECK_S)
                    if update is not None:
                        entry = entry_from(update.value)
                        if isinstance(entry, Done):
                            return entry
                done = await _done(link, key)
                if done is not None:
                    return done
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()


async def _publish(link: Link, subject: str, payload: bytes, msg_id: str) -> Any:
    """Publish until the server acknowledges: a timeout around a reconnect may hide a publish that was stored, and
    publishing again is safe (``Nats-Msg-Id``); giving up would let the engine retry the item under a new attempt
    key while this one may still run."""
    from nats.errors import TimeoutError as NatsTimeout

    while True:
        try:
            return await link.js.publish(subject, payload, headers={"Nats-Msg-Id": msg_id})
        except NatsTimeout:
            log.warning("remote_publish_retry", key=msg_id)


async def _done(link: Link, key: str) -> Done | None:
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.errors import KeyNotFoundError

    try:
        entry: Any = await link.attempts.get(key)
    except KeyNotFoundError:
        return None
    except NatsTimeout:
        return None
    found = entry_from(entry.value)
    return found if isinstance(found, Done) else None
