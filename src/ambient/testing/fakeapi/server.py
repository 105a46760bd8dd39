"""The shared machinery of the fakes: a loopback HTTP server in a daemon thread, the record of the requests it got,
injected failures, prompt-cache accounting, and the chunked (SSE) replies. A provider subclasses :class:`FakeServer`
with its own error format and routes."""

from __future__ import annotations

import abc
import hashlib
import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, ClassVar
from urllib.parse import urlsplit

_MAX_BODY = 64 * 1024 * 1024
_DELTA_CHARS = 24


@dataclass(frozen=True, slots=True)
class Recorded:
    """One request as the fake received it: path without the query string, lower-case headers, the JSON body
    (``None`` when there was none or it was not JSON)."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None
    method: str = "POST"
    query: str = ""


@dataclass(frozen=True, slots=True)
class Billed:
    """One response the fake sent, as a provider bills it: the response's id, its model and usage (the provider's own
    field names), whether it streamed. Written down before the first byte is sent: a client that hangs up or dies
    mid-answer is billed all the same, as by a real provider."""

    id: str
    model: str
    usage: dict[str, Any]
    stream: bool
    path: str


def tokens(value: Any) -> int:
    """A token count good enough for a fake: the characters of the JSON text over four."""
    if value is None:
        return 0
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    return max(1, len(text) // 4) if text else 0


def chunks(text: str) -> Iterator[str]:
    """The pieces a text is streamed in (one SSE delta each), short so that clients really assemble them."""
    for i in range(0, len(text), _DELTA_CHARS):
        yield text[i : i + _DELTA_CHARS]


class Handler(BaseHTTPRequestHandler):
    """One connection: records each request on its :class:`FakeServer` (``fake``, set per server), then lets it answer
    (or fail it as told); the provider writes through ``send_json`` or ``start_sse``/``send_chunk``/``end_sse``."""

    protocol_version = "HTTP/1.1"
    server_version = "ambient-fakeapi/1"
    # Each SSE event leaves at once, as from a real API: with Nagle's algorithm a small write waits for the ACK of
    # the one before, which the client delays (40 ms), and a stream of small events took that per event.
    disable_nagle_algorithm = True
    fake: ClassVar[FakeServer]

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read ``requests``
        return

    def _read_body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            parts: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(min(length, _MAX_BODY)) if length > 0 else b""

    def _handle(self) -> None:
        raw = self._read_body()
        body: dict[str, Any] | None = None
        if raw:
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = None
            body = parsed if isinstance(parsed, dict) else None
        parts = urlsplit(self.path)
        rec = Recorded(
            path=parts.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            method=self.command,
            query=parts.query,
        )
        self.fake._record(rec)
        if self.fake.delay_s > 0:
            time.sleep(self.fake.delay_s)
        try:
            failure = self.fake._take_failure()
            if failure is not None:
                status, payload, headers = self.fake._error(failure)
                self.send_json(status, payload, headers)
                return
            self.fake._respond(self, rec)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_POST = _handle
    do_GET = _handle
    do_PUT = _handle
    do_DELETE = _handle
    do_PATCH = _handle

    def send_json(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def start_sse(self, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()

    def send_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def end_sse(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class FakeServer(abc.ABC):
    """The shared machinery: a loopback HTTP server in a daemon thread, the record of requests, injected failures."""

    provider: ClassVar[str] = ""

    def __init__(self, *, port: int = 0, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self._cond = threading.Condition()
        self._requests: list[Recorded] = []
        self._billed: list[Billed] = []
        self._fail_status: int | None = None
        self._fail_times: int | None = None
        self._cache: set[str] = set()
        self._ids = itertools.count(1)
        handler = type("Handler", (Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    # -- lifecycle

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"fake-{self.provider}",
                daemon=True,
            )
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> FakeServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- what tests read and set

    @property
    def requests(self) -> list[Recorded]:
        """Every request received so far (a copy)."""
        with self._cond:
            return list(self._requests)

    @property
    def billed(self) -> list[Billed]:
        """The billing ledger: every answer sent so far with its usage, in order (a copy)."""
        with self._cond:
            return list(self._billed)

    def wait_billed(self, count: int, timeout: float = 30.0) -> list[Billed]:
        """Block until at least ``count`` answers are billed; the ledger then. ``TimeoutError`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._billed) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"fake {self.provider} API: {count} answers not billed within {timeout}s")
                self._cond.wait(left)
            return list(self._billed)

    def fail(self, status: int | None, times: int | None = None) -> None:
        """The next ``times`` requests (every following one when ``None``) get ``status`` with the provider's error
        JSON. ``fail(None)`` stops failing."""
        with self._cond:
            self._fail_status = status
            self._fail_times = times if status is not None else None

    def wait_for(self, predicate: Callable[[list[Recorded]], bool], timeout: float = 30.0) -> list[Recorded]:
        """Block until ``predicate(requests)`` is true; return the requests then. ``TimeoutError`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(list(self._requests)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"fake {self.provider} API: condition not met within {timeout}s")
                self._cond.wait(left)
            return list(self._requests)

    # -- internals

    def _record(self, rec: Recorded) -> None:
        with self._cond:
            self._requests.append(rec)
            self._cond.notify_all()

    def _bill(self, billed: Billed) -> None:
        with self._cond:
            self._billed.append(billed)
            self._cond.notify_all()

    def _take_failure(self) -> int | None:
        with self._cond:
            status = self._fail_status
            if status is None:
                return None
            if self._fail_times is not None:
                self._fail_times -= 1
                if self._fail_times <= 0:
                    self._fail_status = None
                    self._fail_times = None
            return status

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):04d}{uuid.uuid4().hex[:20]}"

    def _cache_lookup(self, prefixes: Sequence[str]) -> tuple[int, int]:
        """Cache accounting for cumulative prefixes (each a breakpoint): ``(read, created)`` tokens. The longest
        prefix seen before is read, the rest up to the last breakpoint is created; every prefix is seen from now."""
        if not prefixes:
            return 0, 0
        keys = [hashlib.sha256(p.encode()).hexdigest() for p in prefixes]
        with self._cond:
            read = 0
            for prefix, key in zip(prefixes, keys, strict=True):
                if key in self._cache:
                    read = tokens(prefix)
            self._cache.update(keys)
        total = tokens(prefixes[-1])
        return read, max(0, total - read)

    @abc.abstractmethod
    def _error(self, status: int) -> tuple[int, Any, dict[str, str]]:
        """The provider's error reply for ``status``: (status, JSON body, headers)."""

    @abc.abstractmethod
    def _respond(self, handler: Handler, rec: Recorded) -> None:
        """Answer one recorded request in the provider's own format."""
