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
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, TypeVar

from ambient.cluster.link import Link, connect, ensure_consumers
from ambient.cluster.protocol import (
    AI_ON_WORKERS,
    HOLDER_KEY,
    Done,
    Entry,
    Holder,
    Lease,
    Names,
    Work,
    entry_bytes,
    entry_from,
    holder_blocks,
    kv_key,
    namespace_taken_message,
    resumed_record,
    unreachable,
    unreachable_message,
)
from ambient.core.errors import NamespaceTakenError
from ambient.core.lazylog import get_logger
from ambient.runners.base import RunRequest
from ambient.runners.result import AgentResult, error_result
from ambient.runners.runner_config import AnyRunnerConfig

log = get_logger(__name__)

T = TypeVar("T")

#: A stopped watch's consumer is removed by the server this long after (s). nats-py's default keeps it five minutes:
#: a fan-out of 1,000 remote items left 1,000 of them and the server refused the next watch ("maximum consumers
#: limit reached"), so every later item waited (bench/cluster.py, 1,000 items).
_WATCH_GONE_S: Final = 2.0
#: While waiting for a result, the entry is read again this often even without a watch update (a watch may miss
#: updates across a reconnect).
_RECHECK_S = 2.0
#: The name a result written by the daemon itself carries (an attempt it closed because its worker went silent).
DAEMON = "ambient-daemon"


class Dispatcher:
    """Publishes SPAWNs of dispatched agents to JetStream and waits for their results."""

    def __init__(
        self,
        urls: list[str],
        creds: str | None,
        dispatch: Mapping[str, str],
        lease_s: float,
        unreachable_after_s: float | None = None,
        names: Names | None = None,
        brain: str | None = None,
    ) -> None:
        self.urls = urls
        self.brain = brain  # this brain's folder: the namespace is held in its name (None: not held, for tests)
        self.names = names if names is not None else Names()  # the brain's cluster.namespace
        self.creds = creds
        self.dispatch = dict(dispatch)
        self.lease_s = lease_s
        self.unreachable_after_s = unreachable_after_s  # None: wait for a silent worker for ever
        self._link: Link | None = None
        self._connecting: asyncio.Lock | None = None
        self._consumers: set[str] = set()  # agents whose durable consumer this dispatcher made sure of
        self._taken: str | None = None  # why dispatching stopped: another brain's daemon took the namespace

    def dispatches(self, agent: str) -> bool:
        """Whether ``agent`` runs on the workers."""
        return self.dispatch.get(agent) == "workers"

    async def link(self) -> Link:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._link is None:
                link = await connect(
                    self.urls, self.creds, name=f"ambient-daemon@{socket.gethostname()}", names=self.names
                )
                try:
                    await self._hold(link)
                except NamespaceTakenError as exc:
                    self._taken = str(exc)
                    await link.close()
                    raise
                except BaseException:
                    await link.close()
                    raise
                if self._taken is not None:
                    log.info("cluster_namespace_held", namespace=self.names.namespace)
                    self._taken = None
                agents = [a for a in self.dispatch if self.dispatches(a)]
                await ensure_consumers(link.js, self.names, agents, self.lease_s)
                self._consumers.update(agents)
                self._link = link
            return self._link

    @property
    def taken(self) -> str | None:
        """Why nothing is dispatched: another brain's daemon holds the namespace (None: it is this daemon's)."""
        return self._taken

    def _me(self) -> Holder | None:
        if self.brain is None:
            return None
        return Holder(socket.gethostname(), self.brain, os.getpid(), time.time())

    async def _hold(self, link: Link) -> None:
        """Say on the server that this brain's daemon uses the namespace, unless another brain's daemon does: then
        :class:`NamespaceTakenError` and nothing of this brain is dispatched (docs/cluster.md). Compare-and-set on
        the record's revision: of two daemons starting at once, one holds it."""
        from nats.js.errors import KeyWrongLastSequenceError, NotFoundError

        for _ in range(3):
            me = self._me()
            if me is None:
                return
            try:
                current: Any = await link.attempts.get(HOLDER_KEY)
                found, revision = Holder.from_bytes(current.value), int(current.revision)
            except NotFoundError:
                found, revision = None, None
            if found is not None and holder_blocks(found, me):
                raise NamespaceTakenError(namespace_taken_message(self.names, found, me.beat))
            try:
                if revision is None:
                    await link.attempts.create(HOLDER_KEY, me.to_bytes())
                else:
                    await link.attempts.update(HOLDER_KEY, me.to_bytes(), last=revision)
                return
            except KeyWrongLastSequenceError:
                continue  # another daemon wrote it first: read it again
        raise NamespaceTakenError(f"the cluster namespace {self.names.namespace!r} is contended: try again")

    async def beat(self) -> None:
        """Say again that this daemon holds the namespace (the roster keeper calls it every few seconds). A
        namespace another brain took meanwhile is said as an error: dispatching stops until it is free."""
        link = await self.link()
        try:
            await self._hold(link)
        except NamespaceTakenError as exc:
            if self._taken is None:
                log.error("cluster_namespace_taken", namespace=self.names.namespace, error=str(exc))
            self._taken = str(exc)
        else:
            if self._taken is not None:
                log.info("cluster_namespace_held", namespace=self.names.namespace)
            self._taken = None

    async def _consumer(self, link: Link, agent: str) -> None:
        """The agent's consumer, for an agent dispatched by a reload after the connection was made."""
        if agent not in self._consumers:
            await ensure_consumers(link.js, self.names, [agent], self.lease_s)
            self._consumers.add(agent)

    async def close(self) -> None:
        """Give the namespace up (a brain moved to another host may start at once) and close the connection."""
        if self._link is not None:
            me = self._me()
            if me is not None:
                await _release(self._link, me)
            await self._link.close()
            self._link = None

    async def run(self, req: RunRequest, cfg: AnyRunnerConfig) -> AgentResult:
        """The attempt's result: the one already committed for its key, else the one a worker commits after this
        publishes the SPAWN. A failure of the cluster before anything may have been published becomes an error
        result (retried by the workflow's policy); once the SPAWN may be in the stream (published, or this is an
        interrupted attempt run again after a restart) it is waited for through every outage: giving up would let a
        retry under a new key run alongside it. A worker silent past ``unreachable_after_s`` ends the wait with an
        error the person decides on. A cancellation (the daemon stopping) leaves the remote attempt running, and
        the next start finds its result."""
        if cfg.kind != "command":
            return error_result(
                "bad_request", f"agent {req.agent!r} is kind: {cfg.kind}; " + AI_ON_WORKERS.format(kind=cfg.kind)
            )
        may_be_published = req.resumed is not None and req.resumed.why == "restart"
        while True:
            try:
                link = await self.link()
                if self._taken is not None:
                    raise NamespaceTakenError(self._taken)
                await self._consumer(link, req.agent)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the cluster's failure is this attempt's error, never the daemon's
                if not may_be_published:
                    log.warning("remote_failed", key=req.key, error=str(exc))
                    return error_result("spawn_failed", f"the cluster could not run the attempt: {exc}")
                log.warning("remote_wait_retry", key=req.key, error=str(exc))
                await asyncio.sleep(_RECHECK_S)
        key = kv_key(req.key)
        done = await _retrying(req.key, lambda: _done(link, key))
        if done is not None:
            log.info("remote_reattached", key=req.key, worker=done.worker, host=done.host)
            return done.result
        work = Work(
            key=req.key,
            run_id=req.run_id,
            item=req.item,
            attempt=req.attempt,
            agent=req.agent,
            namespace=self.names.namespace,
            runner=cfg.model_dump(mode="json", exclude={"dispatch"}),  # where it runs is the daemon's business
            packet=req.packet,
            vars=dict(req.vars),
            handoff=req.bounded_handoff(),
            resumed=resumed_record(req.resumed),
            lease_s=self.lease_s,
        )
        ack = await _retrying(
            req.key,
            lambda: link.js.publish(
                self.names.work_subject(req.agent), work.to_bytes(), headers={"Nats-Msg-Id": req.key}
            ),
        )
        log.info("remote_dispatched", key=req.key, agent=req.agent, duplicate=bool(ack.duplicate))
        done = await self._wait(link, key, req)
        log.info("remote_result", key=req.key, worker=done.worker, host=done.host, status=done.result.status)
        return done.result

    async def _wait(self, link: Link, key: str, req: RunRequest) -> Done:
        """Until the attempt's entry is a result: watch it, and read it again every few seconds. A lease that does
        not change for ``unreachable_after_s`` (of this daemon's time, counted again after each moment the daemon
        itself could not reach the server) is closed by the daemon: see :meth:`_close`."""
        from nats.errors import TimeoutError as NatsTimeout

        watcher: Any = None
        seen: int | None = None  # the entry's revision last seen
        changed_at = time.monotonic()
        try:
            while True:
                try:
                    if watcher is None:
                        watcher = await link.attempts.watch(key, inactive_threshold=_WATCH_GONE_S)
                    with contextlib.suppress(NatsTimeout, asyncio.TimeoutError):
                        update = await watcher.updates(timeout=_RECHECK_S)
                        if update is not None:
                            found = entry_from(update.value)
                            if isinstance(found, Done):
                                return found
                    entry, revision = await _entry(link, key)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - an outage: the SPAWN is out, so wait through it
                    log.warning("remote_wait_retry", key=req.key, error=str(exc))
                    if watcher is not None:
                        with contextlib.suppress(Exception):
                            await watcher.stop()
                        watcher = None
                    await asyncio.sleep(_RECHECK_S)
                    changed_at = time.monotonic()  # cut off ourselves, we could not see a renewal
                    continue
                if isinstance(entry, Done):
                    return entry
                now = time.monotonic()
                if revision != seen:
                    seen, changed_at = revision, now
                elif unreachable(entry, now - changed_at, self.unreachable_after_s) and revision is not None:
                    assert isinstance(entry, Lease)
                    closed = await self._close(link, key, req, entry, revision, now - changed_at)
                    if closed is not None:
                        return closed
        finally:
            if watcher is not None:
                with contextlib.suppress(Exception):
                    await watcher.stop()

    async def _close(
        self, link: Link, key: str, req: RunRequest, lease: Lease, revision: int, silent_s: float
    ) -> Done | None:
        """End an attempt whose worker went silent: an error result written in its entry by the same compare-and-set
        a worker's commit is, on the revision of the silent lease. From then on the silent worker's renewal and
        commit are refused (it stops its agent when it comes back), and a redelivery of the SPAWN finds the attempt
        done. None when the entry changed first (the worker came back, or committed): the wait goes on."""
        from nats.js.errors import KeyWrongLastSequenceError

        done = Done(
            DAEMON,
            socket.gethostname(),
            error_result("worker_unreachable", unreachable_message(lease, req.agent, silent_s)),
        )
        try:
            await link.attempts.update(key, entry_bytes(done), last=revision)
        except KeyWrongLastSequenceError:
            return None
        except Exception as exc:  # noqa: BLE001 - an outage: look again
            log.warning("remote_wait_retry", key=req.key, error=str(exc))
            return None
        log.warning(
            "remote_unreachable",
            key=req.key,
            agent=req.agent,
            worker=lease.worker,
            host=lease.host,
            silent_s=round(silent_s, 1),
        )
        return done


async def _retrying(key: str, call: Callable[[], Awaitable[T]]) -> T:
    """``call`` until it answers: a failure around a reconnect may hide a publish that was stored, and publishing
    again is safe (``Nats-Msg-Id``); giving up would let the engine retry the item under a new attempt key while
    this one may still run."""
    said = 0.0
    while True:
        try:
            return await call()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - an outage of the server: try again
            if time.monotonic() - said >= 30.0:  # said once, then every 30 s of a long outage
                log.warning("remote_publish_retry", key=key, error=str(exc))
                said = time.monotonic()
            await asyncio.sleep(0.5)


async def _release(link: Link, me: Holder) -> None:
    """Delete the holder record if it is still this daemon's (same brain, same pid)."""
    from nats.js.errors import KeyWrongLastSequenceError, NotFoundError

    try:
        current: Any = await link.attempts.get(HOLDER_KEY)
        found = Holder.from_bytes(current.value)
        if found is not None and found.same_brain(me) and found.pid == me.pid:
            await link.attempts.delete(HOLDER_KEY, last=int(current.revision))
    except (NotFoundError, KeyWrongLastSequenceError):
        pass  # gone already, or rewritten by another holder
    except Exception as exc:  # noqa: BLE001 - the server away at the stop: the record goes stale instead
        log.debug("cluster_release_failed", error=str(exc))


async def _entry(link: Link, key: str) -> tuple[Entry | None, int | None]:
    """The attempt's entry and its revision; (None, None) when there is none yet."""
    from nats.js.errors import KeyNotFoundError

    try:
        current: Any = await link.attempts.get(key)
    except KeyNotFoundError:
        return None, None
    return entry_from(current.value), int(current.revision)


async def _done(link: Link, key: str) -> Done | None:
    found, _ = await _entry(link, key)
    return found if isinstance(found, Done) else None
