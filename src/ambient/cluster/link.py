"""The connection to NATS and the JetStream objects both sides use: the work-queue stream, one durable pull consumer
per dispatched agent, and the KV buckets of attempts and workers. Creating them is idempotent (the same config
again is no change), so the daemon and every worker may both ensure them.

``nats`` (the ``cluster`` extra) is imported inside these functions only: a brain without ``cluster:`` never
imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ambient.cluster.protocol import DUPLICATE_WINDOW_S, MAX_RESULT_BYTES, Names
from ambient.core.lazylog import get_logger

log = get_logger(__name__)

#: How long a short command (``ambient cluster workers``) tries to reach the server.
ONCE_S = 8.0


@dataclass
class Link:
    """An open connection: the client, its JetStream context, the two KV buckets and the names of the namespace
    they all belong to."""

    nc: Any  # nats.aio.client.Client
    js: Any  # nats.js.JetStreamContext
    attempts: Any  # nats.js.kv.KeyValue
    workers: Any  # nats.js.kv.KeyValue
    names: Names

    async def close(self, timeout_s: float = 2.0) -> None:
        """Flush and close, each within ``timeout_s``: a stop is never held by the client. Not ``drain()``: with pull
        subscriptions it waited its whole timeout (30 s) at every stop; every publish that matters was acknowledged by
        the server already (JetStream publishes wait for it)."""
        try:
            await asyncio.wait_for(self.nc.flush(), timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - closing: nothing left to save
            log.debug("nats_flush_failed", error=str(exc))
        try:
            await asyncio.wait_for(self.nc.close(), timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - closing: nothing left to save (a close that hangs: let go)
            log.debug("nats_close_failed", error=repr(exc))


class Outage:
    """Which client errors are worth a warning: while the server is unreachable the client retries every half
    second and reports the same error each time; the first of each kind is said, the repeats go to debug until
    the connection is back."""

    def __init__(self) -> None:
        self.said: set[str] = set()

    def first(self, error: str) -> bool:
        """Whether ``error`` is new since the connection was last up."""
        if error in self.said:
            return False
        self.said.add(error)
        return True

    def over(self) -> None:
        """The connection is back: the next error is news again."""
        self.said.clear()


def refused(exc: BaseException) -> bool:
    """Whether the server refused the credentials (unknown user, wrong password, a user removed by a reload)."""
    return "authorization violation" in str(exc).lower()


async def connect(
    urls: list[str],
    creds: str | None,
    *,
    name: str,
    names: Names,
    once: bool = False,
    on_refused: Callable[[], None] | None = None,
) -> Link:
    """Connect (reconnecting for ever; ``once``: a short command, which fails at once instead) and open or create
    the stream and buckets of the namespace ``names``. ``on_refused``: called when the server refuses the
    credentials (a worker whose user was removed stops instead of knocking for ever)."""
    from nats.aio.client import Client  # the cluster extra, only imported where cluster: is configured

    refusal: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    outage = Outage()

    async def error_cb(exc: Exception) -> None:
        # Permission errors of core publish/subscribe arrive here, not at the call (docs/cluster.md).
        (log.warning if outage.first(str(exc)) else log.debug)("nats_error", error=str(exc))
        if refused(exc):
            if not refusal.done():
                refusal.set_result(None)
            if on_refused is not None:
                on_refused()

    async def disconnected_cb() -> None:
        if nc.is_closed:  # the close we asked for (a command's end, a worker stopped): nothing went wrong
            log.debug("nats_closed")
        else:
            log.warning("nats_disconnected")

    async def reconnected_cb() -> None:
        outage.over()
        log.info("nats_reconnected")

    nc = Client()
    options: dict[str, Any] = {
        "servers": urls,
        **credentials(creds),
        "name": name,
        "max_reconnect_attempts": 1 if once else -1,
        "allow_reconnect": not once,
        "connect_timeout": 2.0,
        "reconnect_time_wait": 0.5,
        "error_cb": error_cb,
        "disconnected_cb": disconnected_cb,
        "reconnected_cb": reconnected_cb,
    }
    connecting = asyncio.ensure_future(nc.connect(**options))
    # A short command gives up after a few seconds; the daemon and the workers wait for the server, but not for
    # one that refuses their credentials (it would refuse them for ever).
    await asyncio.wait({connecting, refusal}, timeout=ONCE_S if once else None, return_when=asyncio.FIRST_COMPLETED)
    if not connecting.done():
        connecting.cancel()
        with contextlib.suppress(BaseException):
            await connecting
        with contextlib.suppress(Exception):
            await nc.close()
        if refusal.done():
            raise PermissionError("the NATS server refused the credentials (Authorization Violation)")
        raise TimeoutError(f"no NATS server answered at {', '.join(urls)} within {ONCE_S:g} s")
    connecting.result()
    js = nc.jetstream(timeout=10.0)
    try:
        attempts, workers = await ensure(js, names)
    except BaseException:
        await nc.close()
        raise
    return Link(nc, js, attempts, workers, names)


def credentials(path: str | None) -> dict[str, Any]:
    """What a credentials file gives ``nats.connect``: a NATS ``.creds`` file (a user JWT and its seed), or a file
    whose first line is ``user:password`` (what ``ambient cluster creds`` writes)."""
    if path is None:
        return {}
    with open(path, encoding="utf-8") as f:  # noqa: PTH123 - a small private file, read once at the start
        text = f.read(64 * 1024)
    if "BEGIN NATS USER JWT" in text:
        return {"user_credentials": path}
    first = text.strip().splitlines()[0] if text.strip() else ""
    user, sep, password = first.partition(":")
    if not sep or not user:
        raise ValueError(f"{path}: not a NATS .creds file nor a line user:password")
    return {"user": user, "password": password}


async def ensure(js: Any, names: Names) -> tuple[Any, Any]:
    """The namespace's work stream and its two buckets, created when missing."""
    from nats.js.api import DiscardPolicy, KeyValueConfig, RetentionPolicy, StorageType, StreamConfig
    from nats.js.errors import NotFoundError

    try:
        await js.stream_info(names.stream)
    except NotFoundError:
        await js.add_stream(
            StreamConfig(
                name=names.stream,
                subjects=[f"{names.work_prefix}.>"],
                retention=RetentionPolicy.WORK_QUEUE,
                storage=StorageType.FILE,
                duplicate_window=DUPLICATE_WINDOW_S,
                discard=DiscardPolicy.NEW,
            )
        )
    buckets = []
    for bucket, history in ((names.attempts, 1), (names.workers, 1)):
        try:
            kv = await js.key_value(bucket)
        except Exception:  # noqa: BLE001 - BucketNotFoundError and kin: create it
            kv = await js.create_key_value(
                KeyValueConfig(
                    bucket=bucket,
                    history=history,
                    storage=StorageType.FILE,
                    max_value_size=MAX_RESULT_BYTES + 4096,
                    direct=True,  # reads by direct get, whose subject names the key: permissions can restrict it
                )
            )
        buckets.append(kv)
    return buckets[0], buckets[1]


async def ensure_consumers(js: Any, names: Names, agents: Iterable[str], lease_s: float) -> None:
    """One durable pull consumer per agent, shared by every worker of it: explicit ack, redelivered ``lease_s``
    after its last sign of life (a delivery, or ``+WPI``), never given up (``max_deliver`` unlimited: a worker's
    crash must not lose an item; an agent's own failure is a result, not a redelivery)."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
    from nats.js.errors import NotFoundError

    for agent in agents:
        name = names.consumer(agent)
        try:
            await js.consumer_info(names.stream, name)
            continue
        except NotFoundError:
            pass
        await js.add_consumer(
            names.stream,
            ConsumerConfig(
                durable_name=name,
                filter_subject=names.work_subject(agent),
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                ack_wait=lease_s,
                max_deliver=-1,
                max_ack_pending=-1,
            ),
        )


async def workers(link: Link) -> list[dict[str, Any]]:
    """The records the workers keep in the workers bucket (``ambient cluster workers``), unreadable ones left out."""
    import json

    from nats.js.errors import KeyNotFoundError, NoKeysError

    try:
        keys = await link.workers.keys()
    except NoKeysError:
        return []
    out: list[dict[str, Any]] = []
    for key in sorted(keys):
        try:
            entry = await link.workers.get(key)
            record = json.loads(entry.value or b"")
        except (KeyNotFoundError, ValueError):
            continue
        if isinstance(record, dict):
            out.append(record)
    return out
