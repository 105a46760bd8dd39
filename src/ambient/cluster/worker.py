"""The worker's side (``ambient worker``): pull SPAWNs of its agents from JetStream, run each under a lease with the
same command runner the daemon uses (same confinement), and commit its result under that lease.

Each slot is one pull subscription per agent, fetching one message at a time (concurrent fetches on one
subscription share an inbox and are not safe). For each message:

1. Read the attempt's entry. A result already there: ack (a redelivery of a committed attempt). A live lease of
   another worker: ``nak`` until it lapses. Free, or lapsed: take the lease by compare-and-set (``create``, or
   ``update(last=revision)``); the revision the server returns is this holder's fencing token.
2. Run the agent. Every third of the lease: ``+WPI`` (the server keeps the message ours) and renew the lease by
   ``update(last=token)``. A renewal refused means another worker holds the attempt now: the agent is stopped and
   nothing is committed. A renewal that cannot reach the server for a whole lease stops the agent too.
3. Commit the result with ``update(last=token)``: one compare-and-set ends the lease and writes the result. A
   worker that stalled past its lease (SIGSTOP, a paused VM) and comes back is refused there. Then ack,
   best-effort: a lost ack only means a redelivery that finds the result at step 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ambient.cluster.link import Link, connect
from ambient.cluster.protocol import (
    DEFAULT_NAMESPACE,
    HOLDER_KEY,
    HOLDER_STALE_S,
    MAX_RESULT_BYTES,
    Done,
    Holder,
    Lease,
    Names,
    Work,
    entry_bytes,
    entry_from,
    kv_key,
    lease_verdict,
    name_token,
    renew_every,
    worker_foreign,
)
from ambient.cluster.roster import HEARTBEAT_S
from ambient.core.errors import NamespaceTakenError, RunnerConfigError
from ambient.core.lazylog import get_logger
from ambient.runners.base import RunRequest
from ambient.runners.command import CommandRunner
from ambient.runners.confinement import TEMP_DIRS
from ambient.runners.result import AgentResult, error_result
from ambient.runners.runner_config import CommandRunnerConfig, parse_runner_config

log = get_logger(__name__)

_T = TypeVar("_T")

#: How long one fetch waits for a message before the slot looks at its next agent.
FETCH_S = 1.0
#: Items a slot takes from one agent in a row while it has work, before it looks at the slot's next agent.
BURST = 32
#: How often a worker says it is alive in the workers bucket.
ALIVE_S = HEARTBEAT_S
#: Two records of a worker are at least this far apart (s), however often its items change.
BEAT_GAP_S = 0.5


@dataclass(frozen=True)
class WorkerOptions:
    """What ``ambient worker`` was given."""

    urls: list[str]
    creds: str | None
    brain: Path
    agents: Sequence[str]
    slots: int = 1
    name: str = ""
    namespace: str = DEFAULT_NAMESPACE  # the brain's cluster.namespace, read from its copy of the brain


class Worker:
    """Serves its agents' SPAWNs until :meth:`stop`."""

    def __init__(self, options: WorkerOptions, runner: CommandRunner) -> None:
        self.options = options
        self.runner = runner
        self.host = socket.gethostname()
        self.name = options.name or f"{self.host}-{os.getpid()}"
        self.names = Names(options.namespace)
        self._stopping = asyncio.Event()
        self._link: Link | None = None
        self.busy = 0
        self.running: set[str] = set()  # the attempt keys it runs now (its heartbeat says them)
        self._changed = asyncio.Event()  # the items it runs changed: say it now, not at the next beat
        self.waiting: list[str] = []  # its agents the daemon has not dispatched yet (found at each look)
        self._said_waiting: set[str] = set()
        self.refused = False  # the server refused our credentials (revoked): serve stops and raises

    def _refused(self) -> None:
        if not self.refused:
            self.refused = True
            log.error("worker_refused", worker=self.name, reason="the server refused this worker's credentials")
        self._stopping.set()

    def stop(self) -> None:
        self._stopping.set()

    async def serve(self) -> None:
        """Serve until :meth:`stop`, which works at any moment: connecting (the server down), waiting for the
        daemon to dispatch an agent, or serving."""
        log.info("worker_connecting", worker=self.name, urls=self.options.urls)
        TEMP_DIRS.sweep_left_behind()  # agents' temp dirs a killed worker or daemon made ahead
        link = await self._unless_stopped(
            connect(
                self.options.urls,
                self.options.creds,
                name=f"ambient-worker {self.name}",
                names=self.names,
                on_refused=self._refused,
            )
        )
        if link is None:
            if self.refused:
                raise PermissionError("the NATS server refused the credentials (Authorization Violation)")
            self._stopped()
            return
        self._link = link
        tasks: list[asyncio.Task[None]] = []
        try:
            await self._same_brain(link)
            # The heartbeat first: a worker waiting for dispatch is listed, saying for which agents.
            tasks.append(asyncio.create_task(self._alive(link), name="alive"))
            subs = await self._unless_stopped(self._subscribe_all(link))
            if subs is not None:
                log.info(
                    "worker_ready",
                    worker=self.name,
                    host=self.host,
                    agents=list(self.options.agents),
                    slots=self.options.slots,
                )
                tasks += [asyncio.create_task(self._slot(link, s), name=f"slot:{i}") for i, s in enumerate(subs)]
                watched = list(tasks)  # a slot or the heartbeat ending ends the worker; the late joiner may end
                if self.waiting:
                    tasks.append(asyncio.create_task(self._join_late(link, subs), name="join-late"))
                stopping = asyncio.create_task(self._stopping.wait())
                await asyncio.wait([stopping, *watched], return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
                for t in tasks:
                    if t.done() and not t.cancelled() and t.exception() is not None:
                        raise t.exception()  # type: ignore[misc]
            if self.refused:
                raise PermissionError("the server refused this worker's credentials (Authorization Violation)")
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            with contextlib.suppress(Exception):
                await asyncio.wait_for(link.workers.delete(name_token(self.name)), timeout=2.0)
            await link.close()
        self._stopped()

    async def _same_brain(self, link: Link) -> None:
        """Refuse to serve another brain: the namespace's daemon runs on this host in another folder (two brains left
        on one namespace), so this worker would run that brain's items in its own folder."""
        from nats.js.errors import NotFoundError

        try:
            current: Any = await link.attempts.get(HOLDER_KEY)
        except NotFoundError:
            return
        found = Holder.from_bytes(current.value)
        if found is None or time.time() - found.beat >= HOLDER_STALE_S:
            return
        theirs, mine = await asyncio.to_thread(
            lambda: (os.path.realpath(found.brain), os.path.realpath(self.options.brain))
        )
        if worker_foreign(Holder(found.host, theirs, found.pid, found.beat), self.host, mine):
            said = (
                f"the cluster namespace {self.names.namespace!r} is the brain {found.brain}'s (its daemon runs on this "
                f"host), not this worker's {self.options.brain}: it would run that brain's items here. Give each brain "
                "its own cluster.namespace in profil/ambient.yml (docs/cluster.md)"
            )
            log.error("worker_foreign_namespace", worker=self.name, error=said)
            raise NamespaceTakenError(said)

    def _stopped(self) -> None:
        log.info("worker_stopped", worker=self.name)

    async def _unless_stopped(self, step: Coroutine[Any, Any, _T]) -> _T | None:
        """``step``'s result, or None when the worker is stopped first (``step`` is cancelled then)."""
        task = asyncio.ensure_future(step)
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        return None

    async def _subscribe_all(self, link: Link) -> list[list[tuple[str, Any]]]:
        """One pull subscription per agent and slot, bound to the durable consumers the daemon created, as soon as
        one of its agents has one; the agents the daemon has not dispatched yet are said in :attr:`waiting` (the
        heartbeat shows it) and joined later by :meth:`_join_late` (a worker of ``slow,hello`` with ``hello`` not
        dispatched served neither)."""
        while True:
            ready = await self._look(link, self.options.agents)
            if ready:
                break
            await asyncio.sleep(1.0)
        out: list[list[tuple[str, Any]]] = [[] for _ in range(self.options.slots)]
        await self._bind(link, out, ready)
        return out

    async def _join_late(self, link: Link, slots: list[list[tuple[str, Any]]]) -> None:
        """The agents still waiting for dispatch join every slot once the daemon has made their consumer."""
        while self.waiting:
            await asyncio.sleep(1.0)
            ready = await self._look(link, list(self.waiting))
            if ready:
                await self._bind(link, slots, ready)
                log.info("worker_serves", worker=self.name, agents=ready)

    async def _look(self, link: Link, agents: Sequence[str]) -> list[str]:
        """Which of ``agents`` the daemon has dispatched (their consumer exists); the others are :attr:`waiting`."""
        from nats.js.errors import NotFoundError

        ready, waiting = [], []
        for agent in agents:
            try:
                await link.js.consumer_info(link.names.stream, link.names.consumer(agent))
                ready.append(agent)
            except NotFoundError:
                waiting.append(agent)
                if agent not in self._said_waiting:
                    log.warning("worker_waits_for_dispatch", agent=agent, namespace=link.names.namespace)
                    self._said_waiting.add(agent)
        if waiting != self.waiting:
            self.waiting = waiting
            self._changed.set()
        return ready

    async def _bind(self, link: Link, slots: list[list[tuple[str, Any]]], agents: list[str]) -> None:
        for subs in slots:
            for agent in agents:
                sub = await link.js.pull_subscribe_bind(durable=link.names.consumer(agent), stream=link.names.stream)
                subs.append((agent, sub))

    async def _alive(self, link: Link) -> None:
        """The worker's record in the workers bucket (``ambient cluster workers`` reads it)."""
        while True:
            record = {
                "worker": self.name,
                "host": self.host,
                "agents": list(self.options.agents),
                "slots": self.options.slots,
                "busy": self.busy,
                "running": sorted(self.running),
                "waiting": list(self.waiting),
                "at": time.time(),
            }
            self._changed.clear()
            with contextlib.suppress(Exception):  # a missed heartbeat only ages the record
                await link.workers.put(name_token(self.name), json.dumps(record).encode())
            await asyncio.sleep(BEAT_GAP_S)  # items that start and end fast: one record for the lot, not one each
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=ALIVE_S - BEAT_GAP_S)

    async def _slot(self, link: Link, subs: list[tuple[str, Any]]) -> None:
        from nats.errors import TimeoutError as NatsTimeout

        fetch_s = max(0.2, FETCH_S / max(1, len(subs)))
        while not self._stopping.is_set():
            for _agent, sub in subs:
                # A slot stays with an agent that has work (up to BURST items) before it looks at the next: moving
                # on after each item made it wait out an idle agent's fetch between two items of a busy one (a
                # worker of two agents ran a fan-out at a quarter of its rate, bench/cluster.py).
                for _ in range(BURST):
                    if self._stopping.is_set():
                        return
                    try:
                        msgs = await sub.fetch(1, timeout=fetch_s)
                    except (TimeoutError, NatsTimeout):
                        break
                    except Exception as exc:  # noqa: BLE001 - a reconnect: the next fetch tries again
                        log.warning("worker_fetch_failed", error=str(exc))
                        await asyncio.sleep(fetch_s)
                        break
                    await self._handle_all(link, msgs)

    async def _handle_all(self, link: Link, msgs: list[Any]) -> None:
        for msg in msgs:
            self.busy += 1
            try:
                await self.handle(link, msg)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - an outage mid-item: the lease lapses, the item is redelivered
                log.warning("worker_item_failed", error=str(exc))
            finally:
                self.busy -= 1

    # ------------------------------------------------------------ one message

    async def handle(self, link: Link, msg: Any) -> None:
        try:
            work = Work.from_bytes(msg.data)
        except ValueError as exc:
            log.error("work_unreadable", error=str(exc))
            with contextlib.suppress(Exception):
                await msg.term()
            return
        if work.namespace != self.names.namespace:
            # Only a publisher of another brain writing into this namespace's stream puts it here: redelivered, it
            # would come back to this namespace's workers alone, each refusing it, for ever. Terminated, it is gone
            # from the queue, said once here, and its attempt (another brain's) is never run in this brain's copy.
            log.error(
                "work_wrong_namespace",
                key=work.key,
                agent=work.agent,
                namespace=work.namespace,
                ours=self.names.namespace,
                worker=self.name,
            )
            with contextlib.suppress(Exception):
                await msg.term()
            return
        if work.agent not in self.options.agents:
            log.error("work_not_ours", agent=work.agent)
            with contextlib.suppress(Exception):
                await msg.nak(delay=1.0)
            return
        key = kv_key(work.key)
        token = await self._acquire(link, work, key, msg)
        if token is None:
            return
        log.info("attempt_started", key=work.key, worker=self.name, token=token)
        self._running(work.key, True)
        try:
            ran = await self._run(link, work, key, token, msg)
        except asyncio.CancelledError:
            await self._give_back(link, work, key, msg)  # the worker stops: the item goes on elsewhere at once
            raise
        finally:
            self._running(work.key, False)
        if ran is None:
            return
        result, token = ran
        if await self._commit(link, work, key, token, result):
            with contextlib.suppress(Exception):  # best-effort: a redelivery finds the result committed
                await msg.ack()

    def _running(self, key: str, now: bool) -> None:
        (self.running.add if now else self.running.discard)(key)
        self._changed.set()

    async def _give_back(self, link: Link, work: Work, key: str, msg: Any) -> None:
        """A stopping worker ends its lease (if it still holds it) and hands the message back, best-effort: what
        is not done here the lease's lapse and the redelivery do later."""
        lapsed = Lease(self.name, self.host, 0.0)
        with contextlib.suppress(Exception):
            current: Any = await asyncio.wait_for(link.attempts.get(key), timeout=2.0)
            entry = entry_from(current.value)
            if isinstance(entry, Lease) and entry.worker == self.name:
                await asyncio.wait_for(
                    link.attempts.update(key, entry_bytes(lapsed), last=current.revision), timeout=2.0
                )
        with contextlib.suppress(Exception):
            await asyncio.wait_for(msg.nak(), timeout=2.0)
        log.info("attempt_given_back", key=work.key, worker=self.name)

    async def _acquire(self, link: Link, work: Work, key: str, msg: Any) -> int | None:
        """The lease's revision (this holder's fencing token), or None: the attempt is done or another holds it."""
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

        while True:
            try:
                current: Any = await link.attempts.get(key)
            except KeyNotFoundError:
                current = None
            entry = entry_from(current.value) if current is not None else None
            verdict = lease_verdict(entry, time.time())
            if current is not None and entry is None:
                verdict = "expired"  # an unreadable value: taken over like a lapsed lease
            if verdict == "done":
                log.info("attempt_already_done", key=work.key)
                with contextlib.suppress(Exception):
                    await msg.ack()
                return None
            if verdict == "held":
                assert isinstance(entry, Lease)
                wait_s = max(0.1, entry.until - time.time() + 0.1)
                log.info("attempt_held_elsewhere", key=work.key, holder=entry.worker, retry_in_s=round(wait_s, 2))
                with contextlib.suppress(Exception):
                    await msg.nak(delay=wait_s)
                return None
            lease = Lease(self.name, self.host, time.time() + work.lease_s)
            try:
                if verdict == "free":
                    rev: int = await link.attempts.create(key, entry_bytes(lease))
                else:
                    rev = await link.attempts.update(key, entry_bytes(lease), last=current.revision)
                    log.warning("attempt_taken_over", key=work.key, previous=getattr(entry, "worker", None))
                return rev
            except KeyWrongLastSequenceError:
                continue  # someone else wrote first: look again

    async def _run(self, link: Link, work: Work, key: str, token: int, msg: Any) -> tuple[AgentResult, int] | None:
        """The agent's result and the token to commit it with; None when the lease was lost (agent stopped)."""
        from nats.js.errors import KeyWrongLastSequenceError

        try:
            cfg = parse_runner_config(dict(work.runner))
        except RunnerConfigError as exc:
            return error_result("bad_request", f"the worker cannot read the runner: {exc}"), token
        if not isinstance(cfg, CommandRunnerConfig):
            return error_result("bad_request", f"a worker runs only kind: command, not {cfg.kind}"), token
        req = RunRequest(
            packet=work.packet,
            agent=work.agent,
            run_id=work.run_id,
            item=work.item,
            attempt=work.attempt,
            key=work.key,
            channel_token="",  # no channel back to the daemon from another host: the answer is the result
            brain=self.options.brain,
            vars=work.vars,
            handoff=work.handoff,
            resumed=work.resumed_as(),
            worker=self.name,  # a daemon restarted on this host leaves the agent alone (not its orphan)
        )
        task = asyncio.create_task(self.runner.run(req, cfg), name=f"agent:{work.key}")
        every = renew_every(work.lease_s)
        renewed = time.monotonic()
        try:
            while True:
                await asyncio.wait({task}, timeout=every)
                if task.done():
                    return task.result(), token
                with contextlib.suppress(Exception):
                    await msg.in_progress()
                lease = Lease(self.name, self.host, time.time() + work.lease_s)
                try:
                    # Bounded by the renewal period: a write lost with a dying server must not outwait the lease.
                    token = await asyncio.wait_for(
                        link.attempts.update(key, entry_bytes(lease), last=token), timeout=every
                    )
                    renewed = time.monotonic()
                except KeyWrongLastSequenceError:
                    # Our own renewal stored just before its reply was lost (a timeout) moved the revision on.
                    with contextlib.suppress(Exception):
                        current: Any = await asyncio.wait_for(link.attempts.get(key), timeout=every)
                        entry = entry_from(current.value)
                        if isinstance(entry, Lease) and entry.worker == self.name:
                            token, renewed = int(current.revision), time.monotonic()
                            continue
                    log.warning("attempt_fenced", key=work.key, worker=self.name, at="renew", refused=True)
                    return None
                except Exception as exc:  # noqa: BLE001 - unreachable server: the lease may lapse
                    if time.monotonic() - renewed >= work.lease_s:
                        log.warning("attempt_lease_lapsed", key=work.key, worker=self.name, error=str(exc))
                        return None
        finally:
            if not task.done():
                task.cancel()  # the command runner kills the agent's process group
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _commit(self, link: Link, work: Work, key: str, token: int, result: AgentResult) -> bool:
        """Write the result under the lease (compare-and-set on ``token``); False when refused."""
        from nats.js.errors import KeyWrongLastSequenceError

        done = Done(self.name, self.host, result)
        payload = entry_bytes(done)
        if len(payload) > MAX_RESULT_BYTES:
            done = Done(
                self.name,
                self.host,
                error_result("output_over_cap", f"the result is over {MAX_RESULT_BYTES} bytes, too big to send back"),
            )
            payload = entry_bytes(done)
        deadline = time.monotonic() + max(30.0, work.lease_s)  # a server restart: the compare-and-set stays safe
        while time.monotonic() < deadline:
            try:
                # A write lost with a dying server is not waited for (10 s) but tried again once it is back.
                await asyncio.wait_for(
                    link.attempts.update(key, payload, last=token), timeout=renew_every(work.lease_s)
                )
                log.info("attempt_committed", key=work.key, worker=self.name, status=result.status)
                return True
            except KeyWrongLastSequenceError:
                # Refused: another holder took the attempt, or an earlier try of ours went through before a timeout.
                with contextlib.suppress(Exception):
                    entry = entry_from((await link.attempts.get(key)).value)
                    if isinstance(entry, Done) and entry.worker == self.name:
                        log.info("attempt_committed", key=work.key, worker=self.name, status=result.status)
                        return True
                log.warning("attempt_fenced", key=work.key, worker=self.name, at="commit", refused=True)
                return False
            except Exception as exc:  # noqa: BLE001 - a timeout around a reconnect: try the same write again
                log.warning("attempt_commit_retry", key=work.key, error=str(exc))
                await asyncio.sleep(0.5)
        return False
