"""The console's locks: a random token (a file under ``.ambient/web/``), its cookie, CSRF on every POST, the Host
check against DNS rebinding and the security headers, all in one ASGI middleware so no page can forget them.

Why one middleware and not per-route checks: a page added later gets the token check, the CSRF check of its POSTs
and the Content-Security-Policy without a line of its own.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import socket
from collections.abc import Iterable
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Final
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ambient.storage.fsutil import PRIVATE_FILE, atomic_write, private_dir
from ambient.storage.paths import BrainPaths

COOKIE: Final = "ambient_console"
CSRF_FIELD: Final = "csrf"
CSRF_HEADER: Final = "x-csrf-token"
#: A POST body larger than this is refused (413): forms here are a note and a few fields.
MAX_BODY: Final = 1 << 20

CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS: Final[tuple[tuple[bytes, bytes], ...]] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
)
_LOOPBACK_NAMES: Final = frozenset({"localhost", "127.0.0.1", "::1"})


def token_path(paths: BrainPaths) -> Path:
    """Where the console's token lives (``.ambient/web/token``, 0600 in a 0700 folder)."""
    return paths.state / "web" / "token"


def load_token(paths: BrainPaths, *, rotate: bool = False) -> str:
    """The console's token, made on first use and reused across starts (a bookmarked URL keeps working);
    ``rotate`` replaces it, which logs out every open browser."""
    path = token_path(paths)
    private_dir(path.parent)
    if not rotate:
        try:
            text = path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            text = ""
        if len(text) >= 32 and text.isascii() and text.replace("-", "").replace("_", "").isalnum():
            return text
    token = secrets.token_urlsafe(32)
    atomic_write(path, token + "\n", mode=PRIVATE_FILE)
    return token


def csrf_token(token: str) -> str:
    """The CSRF token: HMAC(token, "csrf"); the same for every page, so forms work in several tabs at once."""
    return hmac.new(token.encode(), b"csrf", hashlib.sha256).hexdigest()


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` exposes the console to this machine only."""
    if host.strip("[]") in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_host_names(bound: str) -> frozenset[str]:
    """Host names a request may name (DNS rebinding defence): loopback names, the bound host and, for a wildcard
    bind, this machine's names. Any IP literal is accepted as well (:func:`host_allowed`): rebinding needs a name."""
    names = set(_LOOPBACK_NAMES) | {bound.strip("[]").lower()}
    if bound in ("0.0.0.0", "::", ""):  # noqa: S104 - names the wildcard, binds nothing
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    return frozenset(names)


def host_allowed(host_header: str, names: Iterable[str]) -> bool:
    """Whether a Host header (``name[:port]``) is one this console answers to."""
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    if not host:
        return False
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return host in set(names)


def _cookie_token(headers: Headers) -> str | None:
    raw = headers.get("cookie")
    if not raw:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(raw)
    except Exception:  # noqa: BLE001 - a malformed cookie header is just no cookie
        return None
    morsel = jar.get(COOKIE)
    return morsel.value if morsel is not None else None


def _bearer(headers: Headers) -> str | None:
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return None


_UNAUTHORIZED: Final = (
    "<!doctype html><html lang=en><head><meta charset=utf-8><title>ambient console — sign-in needed</title></head>"
    "<body><h1>Open the console with its link</h1><p>This page needs the console's token. Open the URL that "
    "<code>ambient web</code> printed (it ends in <code>?token=…</code>), or run <code>ambient web --url</code> in "
    "the brain to print it again.</p></body></html>"
)


class SecurityMiddleware:
    """Every request: Host check (400), token by ``?token=`` (cookie + redirect), cookie or bearer (else 401), CSRF
    on POST (else 403), and the security headers on every response."""

    def __init__(self, app: ASGIApp, *, token: str, host_names: Iterable[str], secure_cookie: bool = False) -> None:
        self.app = app
        self.token = token
        self.csrf = csrf_token(token)
        self.host_names = frozenset(host_names)
        self.secure_cookie = secure_cookie

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        path: str = scope.get("path", "/")
        static = path.startswith("/static/")

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                raw = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _SECURED]
                raw.extend(_HEADERS)
                if not static:
                    raw.append((b"cache-control", b"no-store"))
                message = {**message, "headers": raw}
            await send(message)

        if not host_allowed(headers.get("host", ""), self.host_names):
            await _plain(send_secured, 400, "Bad Host header: open the console by the address ambient web printed.")
            return
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True))
        given = query.get("token")
        if given is not None and scope["method"] in ("GET", "HEAD"):
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                await _html(send_secured, 401, _UNAUTHORIZED)
                return
            rest = urlencode([(k, v) for k, v in parse_qsl(scope["query_string"].decode("latin-1")) if k != "token"])
            location = path + (f"?{rest}" if rest else "")
            cookie = f"{COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Lax" + (
                "; Secure" if self.secure_cookie else ""
            )
            await send_secured(
                {
                    "type": "http.response.start",
                    "status": 303,
                    "headers": [(b"location", location.encode("latin-1")), (b"set-cookie", cookie.encode())],
                }
            )
            await send_secured({"type": "http.response.body", "body": b""})
            return
        presented = _cookie_token(headers) or _bearer(headers)
        if presented is None or not hmac.compare_digest(presented.encode(), self.token.encode()):
            await _html(send_secured, 401, _UNAUTHORIZED)
            return
        if scope["method"] not in ("GET", "HEAD", "OPTIONS"):
            body, too_big = await _read_body(receive)
            if too_big:
                await _plain(send_secured, 413, "Request too large.")
                return
            if not hmac.compare_digest(_csrf_of(headers, body).encode(), self.csrf.encode()):
                await _plain(
                    send_secured, 403, "Refused: this form has no valid CSRF token. Reload the page and retry."
                )
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, send_secured)


_SECURED: Final = frozenset({k for k, _ in _HEADERS} | {b"cache-control"})


def _csrf_of(headers: Headers, body: bytes) -> str:
    """The CSRF token a POST carries: the header, else the form field of an urlencoded body."""
    if CSRF_HEADER in headers:
        return headers[CSRF_HEADER]
    if headers.get("content-type", "").split(";")[0].strip() == "application/x-www-form-urlencoded":
        for key, value in parse_qsl(body.decode("latin-1"), keep_blank_values=True):
            if key == CSRF_FIELD:
                return value
    return ""


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            return b"", True
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks), False


def _replay(body: bytes, upstream: Receive) -> Receive:
    """A ``receive`` that hands the already-read body to the app, then the server's own messages (disconnect)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await upstream()

    return receive


async def _plain(send: Send, status: int, text: str) -> None:
    await _respond(send, status, text.encode(), b"text/plain; charset=utf-8")


async def _html(send: Send, status: int, text: str) -> None:
    await _respond(send, status, text.encode(), b"text/html; charset=utf-8")


async def _respond(send: Send, status: int, body: bytes, ctype: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
