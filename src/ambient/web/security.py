"""The console's locks: a random token (a file under ``.ambient/web/``) exchanged for a sign-in cookie scoped to a
secret path, a CSRF secret per sign-in kept server-side, the Origin check of every POST, the Host check against DNS
rebinding and the security headers, all in one ASGI middleware so no page can forget them.

Why one middleware and not per-route checks: a page added later gets the sign-in check, the origin and CSRF checks
of its POSTs and the Content-Security-Policy without a line of its own.

Why a secret path: cookies are per host, not per port, so a page served on another port of 127.0.0.1 (an agent's)
would receive a cookie set with ``Path=/``. The console lives under ``/c/<32 hex>/`` (:func:`console_prefix`, an
HMAC of the token: known to whoever holds the token, to nobody else) and its cookie says ``Path=/c/<32 hex>/``: a
browser sends it to no other path, so to no page of another port that does not already know the token. The pages
speak in console paths (``/escalations``); the middleware maps them under the prefix both ways (``root_path`` in,
``Location`` out), and the templates prefix their links with ``root``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import secrets
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import parse_qsl, quote, urlencode

import structlog
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ambient.storage.fsutil import PRIVATE_FILE, atomic_write, private_dir
from ambient.storage.paths import BrainPaths

log = structlog.get_logger(__name__)

#: The sign-in cookie: a random id, looked up server-side (never the token).
COOKIE: Final = "ambient_signin"
#: The cookie of earlier versions, whose value was the token itself, sent to every port: expired when seen.
OLD_COOKIE: Final = "ambient_console"
CSRF_FIELD: Final = "csrf"
CSRF_HEADER: Final = "x-csrf-token"
#: Where the CSRF secret of a request's sign-in is put in its ASGI scope, for the templates ("" without one).
CSRF_SCOPE: Final = "ambient.csrf"
#: How many sign-ins (browsers that opened the printed URL) are kept; the oldest goes first.
MAX_SIGNINS: Final = 64
#: A POST body larger than this is refused (413): forms here are a note and a few fields.
MAX_BODY: Final = 1 << 20

CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS: Final[tuple[tuple[bytes, bytes], ...]] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    # same-origin, not no-referrer: under no-referrer a browser sends ``Origin: null`` with the console's own forms,
    # and the Origin check could not tell them from a sandboxed frame's. No address is ever sent to another origin.
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
)
_LOOPBACK_NAMES: Final = frozenset({"localhost", "127.0.0.1", "::1"})


def token_path(paths: BrainPaths) -> Path:
    """Where the console's token lives (``.ambient/web/token``, 0600 in a 0700 folder)."""
    return paths.state / "web" / "token"


def load_token(paths: BrainPaths, *, rotate: bool = False) -> str:
    """The console's token, made on first use and reused across starts (a bookmarked URL keeps working);
    ``rotate`` replaces it, which logs out every open browser (the sign-ins are forgotten and the secret path moves)."""
    path = token_path(paths)
    private_dir(path.parent)
    if rotate:
        signins_path(paths).unlink(missing_ok=True)
    else:
        try:
            text = path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            text = ""
        if len(text) >= 32 and text.isascii() and text.replace("-", "").replace("_", "").isalnum():
            return text
    token = secrets.token_urlsafe(32)
    atomic_write(path, token + "\n", mode=PRIVATE_FILE)
    return token


def signins_path(paths: BrainPaths) -> Path:
    """Where the console's sign-ins are kept (``.ambient/web/signins.json``, 0600), so a restart logs nobody out."""
    return paths.state / "web" / "signins.json"


def console_prefix(token: str) -> str:
    """The console's secret path prefix, ``/c/<32 hex>``: an HMAC of the token, so the printed URL and ``ambient web
    --url`` carry it, a new token moves it, and nothing short of the token (not the cookie) gives it."""
    return "/c/" + hmac.new(token.encode(), b"console path", hashlib.sha256).hexdigest()[:32]


def in_prefix(path: str, prefix: str) -> bool:
    """Whether a request path is one of the console's own (under its secret prefix)."""
    return path == prefix or path.startswith(prefix + "/")


def landing(path: str, prefix: str) -> str:
    """Where the token URL redirects (its path, the token off): the same page under the prefix, or the overview
    when the path is not a plain path of the console (``//host``, ``\\host``, an encoded or a control character).
    Always ``prefix + "/..."``, so never another site, whatever the path."""
    rest = path[len(prefix) :] if in_prefix(path, prefix) else path
    plain = rest.startswith("/") and "//" not in rest and not any(c in rest for c in "\\%") and rest.isprintable()
    return prefix + (quote(rest, safe="/:@!$&'()*+,;=-._~") if plain else "/")


def origin_allowed(origin: str | None, fetch_site: str | None, own: str) -> bool:
    """Whether a POST comes from the console's own pages: its ``Origin`` is the console's (scheme, host AND port),
    and ``Sec-Fetch-Site``, when the browser sends it, says ``same-origin``. Another port of the same host is
    another origin (``same-site`` is refused); ``Origin: null`` (a sandboxed frame, a ``data:`` page) is refused.
    A request with neither header is not a browser's (browsers send ``Origin`` with every POST): a script holding
    the sign-in or the token, which is checked besides."""
    if fetch_site is not None and fetch_site.strip().lower() != "same-origin":
        return False
    return origin is None or origin.strip().lower() == own.lower()


@dataclass(frozen=True)
class SignIn:
    """A browser that opened the printed URL: its CSRF secret (random, unrelated to its cookie) and when."""

    csrf: str
    at: float


def _digest(signin_id: str) -> str:
    """What the store keys a sign-in by: a hash of its id, so the file does not hold the cookies themselves."""
    return hashlib.sha256(signin_id.encode()).hexdigest()


class SignIns:
    """The sign-ins of a console: hash(cookie) -> :class:`SignIn`, in memory (a request costs a hash and a dict
    lookup) and in ``path`` (0600), read again on a miss when the file changed (another console of the brain, the
    daemon's or an ``ambient web``, signed a browser in). ``path`` None: in memory only (unit tests)."""

    def __init__(self, path: Path | None, *, cap: int = MAX_SIGNINS) -> None:
        self.path = path
        self.cap = cap
        self._lock = threading.Lock()
        self._known: dict[str, SignIn] = {}
        self._seen: tuple[int, int, int] | None = None
        self._reload()

    def lookup(self, signin_id: str) -> SignIn | None:
        """The sign-in of a cookie's value, or None."""
        key = _digest(signin_id)
        found = self._known.get(key)
        if found is None and self._changed():
            with self._lock:
                self._reload()
            found = self._known.get(key)
        return found

    def create(self) -> tuple[str, SignIn]:
        """A new sign-in: its cookie value (random, 256 bits) and its CSRF secret (random, 256 bits); saved."""
        signin_id, made = secrets.token_urlsafe(32), SignIn(secrets.token_urlsafe(32), time.time())
        with self._lock:
            if self._changed():
                self._reload()
            known = {**self._known, _digest(signin_id): made}
            if len(known) > self.cap:
                known = dict(sorted(known.items(), key=lambda kv: kv[1].at)[-self.cap :])
            if self.path is not None:
                self._save(known)
            self._known = known
        return signin_id, made

    def _save(self, known: dict[str, SignIn]) -> None:
        """Write the sign-ins; a write that fails (a full disk) keeps them in memory only, until a restart."""
        assert self.path is not None
        doc = {k: {"csrf": v.csrf, "at": v.at} for k, v in known.items()}
        try:
            private_dir(self.path.parent)
            st = atomic_write(self.path, json.dumps({"signins": doc}) + "\n", mode=PRIVATE_FILE)
        except OSError as exc:
            log.warning("web_signins_not_saved", path=str(self.path), error=str(exc), kept="in memory until restart")
            return
        self._seen = (st.st_ino, st.st_mtime_ns, st.st_size)

    def _stat(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _changed(self) -> bool:
        return self.path is not None and self._stat() != self._seen

    def _reload(self) -> None:
        """Read the file (a missing or damaged one is no sign-in: the browsers open the printed URL again)."""
        self._seen = self._stat()
        if self.path is None:
            return
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
            rows = doc["signins"].items()
            self._known = {str(k): SignIn(str(v["csrf"]), float(v["at"])) for k, v in rows}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            self._known = {}


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


def cookie_values(header: str, name: str) -> list[str]:
    """Every value of cookie ``name`` in a Cookie header, in order. Leniently: another site of this host (any port)
    may set cookies the strict parser rejects whole; and a page of another port may set an ``ambient_signin`` of
    ``Path=/``, sent along with the console's own, which must not hide it (each value is tried)."""
    values = []
    for part in header.split(";"):
        key, eq, value = part.partition("=")
        if eq and key.strip() == name:
            values.append(value.strip().strip('"'))
    return values


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
    """Every request: Host check (400); the token by ``?token=`` (a sign-in: its cookie and a redirect under the
    prefix), else the sign-in cookie under the prefix or the token as a bearer (else 401); on POST, the Origin
    check, then the sign-in's CSRF secret (else 403); the security headers on every response."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str,
        host_names: Iterable[str],
        signins: SignIns,
        secure_cookie: bool = False,
    ) -> None:
        self.app = app
        self.token = token
        self.prefix = console_prefix(token)
        self.signins = signins
        self.host_names = frozenset(host_names)
        self.secure_cookie = secure_cookie

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        path: str = scope.get("path", "/")
        ours = in_prefix(path, self.prefix)
        static = path.startswith(f"{self.prefix}/static/" if ours else "/static/")
        cookie_header = headers.get("cookie", "")
        expire_old = bool(cookie_values(cookie_header, OLD_COOKIE))  # an earlier version's: the token, to every port

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                raw = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _SECURED]
                if ours:
                    raw = [(k, self._under_prefix(v) if k.lower() == b"location" else v) for k, v in raw]
                raw.extend(_HEADERS)
                if not static:
                    raw.append((b"cache-control", b"no-store"))
                if expire_old:
                    raw.append((b"set-cookie", f"{OLD_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Lax".encode()))
                message = {**message, "headers": raw}
            await send(message)

        if not host_allowed(headers.get("host", ""), self.host_names):
            await _plain(send_secured, 400, "Bad Host header: open the console by the address ambient web printed.")
            return
        query_string = scope.get("query_string", b"").decode("latin-1")
        if path == self.prefix and scope["method"] in ("GET", "HEAD"):  # the cookie's path ends with a slash
            await _redirect(send_secured, self.prefix + "/" + (f"?{query_string}" if query_string else ""))
            return
        query = parse_qsl(query_string, keep_blank_values=True)
        given = next((v for k, v in query if k == "token"), None)
        if given is not None and scope["method"] in ("GET", "HEAD"):
            await self._sign_in(given, path, query, send_secured)
            return
        bearer = _bearer(headers)
        by_token = bearer is not None and hmac.compare_digest(bearer.encode(), self.token.encode())
        signin = None
        if ours and not by_token:
            signin = next(filter(None, map(self.signins.lookup, cookie_values(cookie_header, COOKIE))), None)
        if not by_token and signin is None:
            await _html(send_secured, 401, _UNAUTHORIZED)
            return
        if scope["method"] not in ("GET", "HEAD", "OPTIONS"):
            own = f"{scope.get('scheme', 'http')}://{headers.get('host', '')}"
            if not origin_allowed(headers.get("origin"), headers.get("sec-fetch-site"), own):
                await _plain(send_secured, 403, "Refused: this request does not come from the console's own pages.")
                return
            body, too_big = await _read_body(receive)
            if too_big:
                await _plain(send_secured, 413, "Request too large.")
                return
            if signin is not None and not hmac.compare_digest(_csrf_of(headers, body).encode(), signin.csrf.encode()):
                await _plain(
                    send_secured, 403, "Refused: this form has no valid CSRF token. Reload the page and retry."
                )
                return
            receive = _replay(body, receive)
        scope = {**scope, "root_path": self.prefix if ours else "", CSRF_SCOPE: signin.csrf if signin else ""}
        await self.app(scope, receive, send_secured)

    async def _sign_in(self, given: str, path: str, query: list[tuple[str, str]], send: Send) -> None:
        """The printed URL: the token (and only the token) opens a new sign-in; 303 to the page asked for, under the
        prefix, with the sign-in's cookie."""
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            await _html(send, 401, _UNAUTHORIZED)
            return
        signin_id, _ = await asyncio.to_thread(self.signins.create)
        rest = urlencode([(k, v) for k, v in query if k != "token"])
        location = landing(path, self.prefix) + (f"?{rest}" if rest else "")
        cookie = f"{COOKIE}={signin_id}; Path={self.prefix}/; HttpOnly; SameSite=Lax" + (
            "; Secure" if self.secure_cookie else ""
        )
        await _redirect(send, location, cookie)

    def _under_prefix(self, location: bytes) -> bytes:
        """A redirect of a page to a console path (``/escalations?...``) goes under the prefix; any other (an
        absolute URL Starlette built from the full path) is left as it is."""
        local = location.startswith(b"/") and not location.startswith((b"//", b"/\\"))
        if local and not in_prefix(location.decode("latin-1").split("?", 1)[0], self.prefix):
            return self.prefix.encode() + location
        return location


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


async def _redirect(send: Send, location: str, cookie: str | None = None) -> None:
    headers = [(b"location", location.encode("latin-1"))]
    if cookie is not None:
        headers.append((b"set-cookie", cookie.encode()))
    await send({"type": "http.response.start", "status": 303, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


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
