"""The model gateway: every model call of an AI agent goes through the daemon, which meters it and keeps its budget.

An HTTP server on 127.0.0.1 (a free port), in the daemon's own event loop. ``kind: claude`` gets it as
``ANTHROPIC_BASE_URL``, ``kind: llm`` as its SDK's ``base_url``; the key either sees is a **grant**: a random token
made for one attempt (run, item, attempt, agent), refused once the attempt ends. The gateway forwards each request to
the attempt's real API (the runner's ``base_url``, else the daemon's ``ANTHROPIC_BASE_URL``/``OPENAI_BASE_URL``, else
the provider's) with the real key, which never enters an agent's environment, argv or files. Any path is forwarded
(the Messages API, ``count_tokens``, Chat Completions, a model list); what is metered is what bills.

For each request of a grant, in order:

1. **Its turn**, when the settings' ``model_calls`` caps the calls in flight at once to one model API (a
   provider's concurrency or rate limit): the others wait.
2. **Refused once past the budget.** ``admit`` (the daemon: the run's and the day's budget rules of
   :mod:`ambient.engine.budget`, over the spend recorded so far) may refuse it: the agent gets HTTP 400 with an error
   body in its provider's shape saying why, nothing reaches the provider, and the attempt ends held (the runner says
   so: :attr:`Grant.refused`). A call already sent is never cut: the budget may be passed by the calls in flight.
3. **Forwarded**, streaming or not (server-sent events are handed on event by event, as they come). An OpenAI stream
   is asked to include its usage (``stream_options.include_usage``).
4. **Metered before it is handed on.** The response's usage is read as it passes (:mod:`ambient.runners.metering`),
   priced (:mod:`ambient.runners.pricing`, the runner's ``price:`` first) and recorded by ``record`` (the daemon: a
   ``call`` event of the run's journal, fsync'd) *before* the agent gets the body, or a stream's last event. A
   stream cut short (the agent killed, the provider failing) is recorded with what it said so far.

An attempt's cost is then the sum of its calls whatever becomes of the agent (a timeout, a kill, a crash of the
daemon, a resumed session that reports a running total): :meth:`Grant.usage`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from ambient.core.lazylog import get_logger
from ambient.runners.metering import CallMeter, Provider, error_body
from ambient.runners.result import AgentResult, Usage, error_result
from ambient.runners.runner_config import Price

if TYPE_CHECKING:  # imported when the gateway starts: a daemon of command agents only never loads them (~55 ms)
    import h11
    import httpx

log = get_logger(__name__)

#: A request body larger than this is refused (413): no model request is this big.
MAX_BODY = 64 * 1024 * 1024
#: How long the end of an attempt waits for its calls still in flight to be recorded.
SETTLE_S = 2.0
#: Headers that belong to one connection (RFC 9110 §7.6.1) or that the gateway sets itself.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "content-encoding",
        "accept-encoding",
    }
)
#: Where a client puts its key: dropped, the real key is set instead.
_KEY_HEADERS = frozenset({"x-api-key", "authorization", "api-key"})
_READ = 64 * 1024


def _iso(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class Upstream:
    """Where an attempt's calls go: the provider, its base URL, and the headers that carry the real key (never
    shown: ``repr`` hides them)."""

    provider: Provider
    base_url: str
    auth: tuple[tuple[str, str], ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class MeteredCall:
    """One model call as the gateway recorded it: the response's id, its usage and cost, when it was sent."""

    id: str
    usage: Usage
    sent: str  # when the request went to the provider (ISO 8601, UTC)
    path: str
    stream: bool
    partial: bool = False  # the response was cut short: the usage is what it said so far

    def to_record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "usage": self.usage.to_record(), "sent": self.sent}
        if self.stream:
            out["stream"] = True
        if self.partial:
            out["partial"] = True
        return out


@dataclass(eq=False)
class Grant:
    """One attempt's key to the gateway: who it is for, where its calls go, and what they used."""

    token: str = field(repr=False)
    run_id: str
    item: str
    attempt: int
    agent: str
    key: str
    upstream: Upstream
    price: Price | None = None
    model: str | None = None  # the model the runner asks for: prices a response that names none
    calls: list[Usage] = field(default_factory=list)  # recorded
    refused: str | None = None  # why the last refused call was refused (a budget)
    refusals: int = 0
    in_flight: int = 0
    open: bool = True
    _idle: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def __post_init__(self) -> None:
        self._idle.set()

    def usage(self, session_id: str | None = None) -> Usage | None:
        """What the attempt's recorded calls used, added up (None: no call billed); ``metered`` in its record."""
        if not self.calls:
            return None
        costs = [c.cost_usd for c in self.calls]
        models = [c.model for c in self.calls if c.model]
        return Usage(
            model=models[-1] if models else self.model,
            input_tokens=sum(c.input_tokens for c in self.calls),
            output_tokens=sum(c.output_tokens for c in self.calls),
            cache_read_tokens=sum(c.cache_read_tokens for c in self.calls),
            cache_write_tokens=sum(c.cache_write_tokens for c in self.calls),
            cost_usd=None if any(c is None for c in costs) else round(sum(c or 0.0 for c in costs), 8),
            turns=len(self.calls),
            session_id=session_id,
        )


class GatewayHooks(Protocol):
    """What the daemon decides and keeps for the gateway."""

    def admit(self, grant: Grant) -> str | None:
        """Why a call of ``grant`` may not go out now (a budget reached), or None."""

    async def record(self, grant: Grant, call: MeteredCall) -> None:
        """Keep ``call`` durably before its response is handed on (raise: the agent gets an error instead)."""


def metered(res: AgentResult, grant: Grant) -> AgentResult:
    """An attempt's result with the usage its grant metered (whatever the agent said of it: a resumed session
    reports its running total, a killed one nothing), marked ``metered``; a call refused for the budget makes it an
    ``over_budget`` error, which holds the run."""
    said = res.usage
    usage = grant.usage(session_id=said.session_id if said is not None else None)
    if grant.refusals:
        usage = replace(usage or Usage(model=grant.model), refused_calls=grant.refusals)
    usage = replace(usage, metered=True) if usage is not None else None
    if grant.refused is not None:
        return error_result("over_budget", f"a model call was refused: {grant.refused}", usage=usage)
    return replace(res, usage=usage)


class ModelGateway:
    """The gateway server (see the module docstring). ``hooks`` None: every call admitted, none recorded (tests)."""

    def __init__(self, hooks: GatewayHooks | None = None, *, timeout_s: float = 600.0) -> None:
        self.hooks = hooks
        self.timeout_s = timeout_s
        self.port: int | None = None
        self._grants: dict[str, Grant] = {}
        self._server: asyncio.Server | None = None
        self._client: httpx.AsyncClient | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        #: Calls refused for a budget since the start (``ambient stats`` reads the journals).
        self.refused_calls = 0
        #: Calls in flight at once per model API (base URL), all grants together; None: no limit.
        self.max_calls: int | None = None
        self._slots: dict[str, asyncio.Semaphore] = {}
        #: Calls waiting for a slot now.
        self.waiting = 0

    @property
    def url(self) -> str:
        """The gateway's base URL (the server is started)."""
        if self.port is None:
            raise RuntimeError("the model gateway is not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def started(self) -> bool:
        return self.port is not None

    async def start(self) -> str:
        """Listen on a free port of 127.0.0.1; the base URL."""
        import httpx

        if self._server is None:
            timeout = httpx.Timeout(self.timeout_s, connect=30.0)
            self._client = httpx.AsyncClient(timeout=timeout, follow_redirects=False)
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=_READ)
            self.port = int(self._server.sockets[0].getsockname()[1])
        return self.url

    async def close(self) -> None:
        """Stop listening, end the open connections, close the client."""
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        self.port = None

    def limit(self, max_calls: int | None) -> None:
        """Calls in flight at once per model API from now on (``model_calls`` in the settings; None: no limit).
        Calls already under way keep their slot."""
        if max_calls != self.max_calls:
            self.max_calls = max_calls
            self._slots = {}

    def _slot(self, upstream: Upstream) -> contextlib.AbstractAsyncContextManager[Any]:
        if self.max_calls is None:
            return contextlib.nullcontext()
        found = self._slots.get(upstream.base_url)
        if found is None:
            found = self._slots[upstream.base_url] = asyncio.Semaphore(self.max_calls)
        return found

    # -- grants

    def grant(
        self,
        *,
        run_id: str,
        item: str,
        attempt: int,
        agent: str,
        key: str,
        upstream: Upstream,
        price: Price | None = None,
        model: str | None = None,
    ) -> Grant:
        """A new key for one attempt's calls (valid until :meth:`release`)."""
        token = "ambient-" + secrets.token_urlsafe(32)
        found = Grant(token, run_id, item, attempt, agent, key, upstream, price, model)
        self._grants[token] = found
        return found

    async def release(self, grant: Grant, settle_s: float = SETTLE_S) -> None:
        """The attempt ended: its key is refused from now on; its calls still in flight get ``settle_s`` to be
        recorded (one recorded later still counts for the run: its journal has it)."""
        grant.open = False
        self._grants.pop(grant.token, None)
        if grant.in_flight:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(grant._idle.wait(), settle_s)

    # -- the server

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import h11

        conn = h11.Connection(h11.SERVER)
        self._writers.add(writer)
        try:
            while True:
                got = await self._read_request(conn, reader, writer)
                if got is None:
                    break
                request, body = got
                await self._handle(conn, writer, request, body)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError, asyncio.IncompleteReadError, TimeoutError):
            pass
        except Exception as exc:  # noqa: BLE001 - one bad connection never stops the gateway
            log.error("gateway_connection_failed", error=repr(exc))
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _read_request(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[h11.Request, bytes] | None:
        import h11

        request: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(_READ))
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    await self._reply(conn, writer, 413, error_body("anthropic", 413, "request too large"))
                    return None
            elif isinstance(event, h11.EndOfMessage) and request is not None:
                return request, bytes(body)
            else:  # ConnectionClosed, PAUSED
                return None

    async def _send(self, conn: h11.Connection, writer: asyncio.StreamWriter, event: Any) -> None:
        data = conn.send(event)
        if data:
            writer.write(data)
            await writer.drain()

    async def _reply(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        status: int,
        payload: Any,
        headers: Sequence[tuple[str, str]] = (),
        raw: bytes | None = None,
    ) -> None:
        import h11

        data = raw if raw is not None else json.dumps(payload).encode()
        out = [*headers, ("content-length", str(len(data)))]
        if raw is None:
            out.append(("content-type", "application/json"))
        await self._send(conn, writer, h11.Response(status_code=status, headers=out))
        await self._send(conn, writer, h11.Data(data=data))
        await self._send(conn, writer, h11.EndOfMessage())

    async def _handle(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request, body: bytes
    ) -> None:
        headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in request.headers]
        named = dict(headers)
        target = request.target.decode("latin-1")
        token = named.get("x-api-key") or named.get("api-key") or _bearer(named.get("authorization"))
        found = self._grants.get(token) if token else None
        if found is None:
            provider: Provider = "anthropic" if "x-api-key" in named or target.startswith("/v1/messages") else "openai"
            message = "this key is not valid (an agent's key to ambient's model gateway ends with its attempt)"
            await self._reply(conn, writer, 401, error_body(provider, 401, message))
            return
        grant = found
        provider = grant.upstream.provider
        grant.in_flight += 1
        grant._idle.clear()
        try:
            self.waiting += 1
            try:
                slot = self._slot(grant.upstream)
                await slot.__aenter__()
            finally:
                self.waiting -= 1
            try:  # the budget is asked once the call may go: one that waited for its turn is judged now
                refusal = self.hooks.admit(grant) if self.hooks is not None else None
                if refusal is not None:
                    grant.refused = refusal
                    grant.refusals += 1
                    self.refused_calls += 1
                    log.warning("model_call_refused", run_id=grant.run_id, agent=grant.agent, reason=refusal)
                    await self._reply(conn, writer, 400, error_body(provider, 400, refusal))
                    return
                await self._forward(conn, writer, grant, request.method.decode("latin-1"), target, headers, body)
            finally:
                await slot.__aexit__(None, None, None)
        finally:
            grant.in_flight -= 1
            if not grant.in_flight:
                grant._idle.set()

    async def _forward(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        grant: Grant,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> None:
        import h11
        import httpx

        assert self._client is not None
        upstream = grant.upstream
        out = [(k, v) for k, v in headers if k not in _HOP and k not in _KEY_HEADERS]
        out += list(upstream.auth)
        out.append(("accept-encoding", "identity"))
        body = _ask_usage(upstream.provider, body)
        url = upstream.base_url.rstrip("/") + target
        sent = _iso(datetime.now(UTC))
        path = target.split("?", 1)[0]
        try:
            resp = await self._client.send(
                self._client.build_request(method, url, headers=out, content=body), stream=True
            )
        except httpx.HTTPError as exc:
            message = f"ambient's model gateway cannot reach {upstream.base_url}: {type(exc).__name__} {exc}"[:500]
            await self._reply(conn, writer, 502, error_body(upstream.provider, 502, message))
            return
        meter = CallMeter(upstream.provider)
        recorded = False
        stream = "text/event-stream" in resp.headers.get("content-type", "")
        back = [(k, v) for k, v in resp.headers.multi_items() if k.lower() not in _HOP]
        try:
            if not stream:
                data = await resp.aread()
                meter.feed_body(data)
                if meter.billed:
                    recorded = True  # tried: a failure is answered, never recorded twice
                    await self._record(grant, meter, sent, path, stream=False)
                await self._reply(conn, writer, resp.status_code, None, back, raw=data)
                return
            # An agent that goes away mid-answer (killed, timed out) stops getting bytes, but the answer is read to
            # its end: the provider bills it whole, and its last event carries the usage that says how much.
            gone = False

            async def hand_on(event: Any) -> None:
                nonlocal gone
                if gone:
                    return
                try:
                    await self._send(conn, writer, event)
                except (OSError, h11.LocalProtocolError):
                    gone = True

            await hand_on(h11.Response(status_code=resp.status_code, headers=back))
            async for chunk in resp.aiter_bytes():
                for raw, last in meter.feed_stream(chunk):
                    if last and meter.billed and not recorded:
                        recorded = True
                        await self._record(grant, meter, sent, path, stream=True)
                    await hand_on(h11.Data(data=raw))
            rest = meter.rest()
            if rest:
                await hand_on(h11.Data(data=rest))
            if meter.billed and not recorded:
                recorded = True
                await self._record(grant, meter, sent, path, stream=True, partial=not meter.ended)
            await hand_on(h11.EndOfMessage())
        finally:
            if meter.billed and not recorded:  # the agent went away mid-answer, or the provider cut it: billed
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._record(grant, meter, sent, path, stream=stream, partial=True))
            await resp.aclose()

    async def _record(
        self, grant: Grant, meter: CallMeter, sent: str, path: str, *, stream: bool, partial: bool = False
    ) -> None:
        usage = meter.usage(grant.price, model=grant.model)
        call = MeteredCall(
            id=meter.id or f"unnamed-{secrets.token_hex(8)}",
            usage=usage,
            sent=sent,
            path=path,
            stream=stream,
            partial=partial,
        )
        if self.hooks is not None:
            try:
                await self.hooks.record(grant, call)
            except Exception as exc:
                log.error("model_call_not_recorded", run_id=grant.run_id, item=grant.item, error=repr(exc))
                raise
        grant.calls.append(usage)


def _bearer(value: str | None) -> str | None:
    if value and value[:7].lower() == "bearer ":
        return value[7:].strip() or None
    return None


def _ask_usage(provider: Provider, body: bytes) -> bytes:
    """An OpenAI streaming request asks for its usage in the stream (else a stream carries none)."""
    if provider != "openai" or b'"stream"' not in body:
        return body
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return body
    if not isinstance(data, dict) or data.get("stream") is not True:
        return body
    options = data.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        return body
    data["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return json.dumps(data).encode()


def upstream_auth(provider: Provider, name: str | None, value: str | None) -> tuple[tuple[str, str], ...]:
    """The headers that carry the real key ``value`` of the variable ``name`` to the provider."""
    if not value:
        return ()
    if provider == "openai" or name in ("ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"):
        auth: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {value}"),)
        if name == "CLAUDE_CODE_OAUTH_TOKEN":
            auth += (("anthropic-beta", "oauth-2025-04-20"),)
        return auth
    return (("x-api-key", value),)
