"""Shared by the notification tests: a loopback HTTP server apprise's real code posts to, as itself (``fake``) and
as the Telegram Bot API of apprise's Telegram plugin (``tg``), and the secret canary that must never leak (S-06)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from apprise.plugins.telegram import NotifyTelegram

TOKEN = "5550001234:AAEcanaryZZcanaryZZcanaryZZcanary12"  # the secret canary (S-06)


class FakeServer:
    """A loopback HTTP server recording POSTs, answering with scripted statuses (then 200)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, Any, int]] = []
        self.script: list[tuple[str, int]] = []  # (path prefix, status), used once each, in order
        self.cond = threading.Condition()
        self.release = threading.Event()  # frees handlers of /slow paths
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                if self.path.startswith("/slow"):
                    server.release.wait(10)
                with server.cond:
                    status = server.next_status(self.path)
                    server.requests.append((self.path, body, status))
                    server.cond.notify_all()
                payload: dict[str, Any] = {"ok": status == 200, "result": {"message_id": len(server.requests)}}
                if status == 429:
                    payload = {"ok": False, "error_code": 429, "description": "Too Many Requests: retry after 1"}
                elif status != 200:
                    payload = {"ok": False, "error_code": status, "description": "Internal Server Error"}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def respond(self, *statuses: int, path: str = "/") -> None:
        """Answer the next requests whose path starts with ``path`` with these statuses."""
        with self.cond:
            self.script.extend((path, s) for s in statuses)

    def next_status(self, path: str) -> int:
        for i, (prefix, status) in enumerate(self.script):
            if path.startswith(prefix):
                del self.script[i]
                return status
        return 200

    def wait_for(self, count: int, timeout: float = 10.0) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: len(self.requests) >= count, timeout)

    @property
    def delivered(self) -> list[tuple[str, Any, int]]:
        return [r for r in self.requests if r[2] == 200]


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    """A running fake server on 127.0.0.1."""
    srv = FakeServer()
    srv.thread.start()
    yield srv
    srv.release.set()
    srv.httpd.shutdown()
    srv.httpd.server_close()


@pytest.fixture
def tg(fake: FakeServer, monkeypatch: pytest.MonkeyPatch) -> FakeServer:
    """The fake server as the Telegram Bot API for apprise's Telegram plugin (RELIABILITY finding 7)."""
    monkeypatch.setattr(NotifyTelegram, "notify_url", f"http://127.0.0.1:{fake.port}/bot")
    return fake
