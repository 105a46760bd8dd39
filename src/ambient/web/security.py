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

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ambient.core.lazylog import get_logger
from ambient.storage.fsutil import PRIVATE_FILE, atomic_write, private_dir
from ambient.storage.paths import BrainPaths

log = get_logger(__name__)

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
    ``rotate`` replaces it, which logs out every open browser of every console of the brain: each console reads the
    file again when it changes (:class:`TokenFile`), its secret path moves, and it refuses every sign-in made with
    another token (a sign-in carries its token's digest)."""
    path = token_path(paths)
    private_dir(path.parent)
    if rotate:
        signins_path(paths).unlink(missing_ok=True)
    else:
        text = _read_token(path)
        if text is not None:
            return text
    token = secrets.token_urlsafe(32)
    atomic_write(path, token + "\n", mode=PRIVATE_FILE)
    return token


def _read_token(path: Path) -> str | None:
    """The token the file holds, or None (missing, unreadable, or not a token: too short, not URL-safe)."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if len(text) >= 32 and text.isascii() and text.replace("-", "").replace("_", "").isalnum():
        return text
    return None


def token_digest(token: str) -> str:
    """What a sign-in records of the token it was made with: a hash, so the sign-ins' file holds no token."""
    return hashlib.sha256(b"ambient console token\0" + token.encode()).hexdigest()


def file_identity(path: Path | None) -> tuple[int, int, int] | None:
    """A file's (inode, mtime, size): it changed when this changes; None when there is no file to read."""
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


@dataclass(frozen=True)
class Key:
    """A token with what follows from it: the console's secret path and the digest its sign-ins carry."""

    token: str
    prefix: str
    digest: str

    @classmethod
    def of(cls, token: str) -> Key:
        return cls(token, console_prefix(token), token_digest(token))


class TokenFile:
    """The token a console serves with, as its file says now: a ``stat`` per request, the file read again only when
    it changed (``ambient web --new-token`` replaced it), so every console of the brain, the daemon's included, takes
    a new token at its next request, without a restart. A file that went missing or holds no token keeps the last
    one (a rotation writes a whole new file, never removes it). ``path`` None: the given token only (unit tests)."""

    def __init__(self, path: Path | None, token: str) -> None:
        self.path = path
        self._key = Key.of(token)
        self._seen = self._stat()

    def current(self) -> Key:
        """The token now (and its prefix and digest)."""
        seen = self._stat()
        if seen is not None and seen != self._seen:
            assert self.path is not None
            text = _read_token(self.path)
            self._seen = seen
            if text is not None and text != self._key.token:
                self._key = Key.of(text)
                log.info("web_token_changed", prefix_moved=True)
        return self._key

    def _stat(self) -> tuple[int, int, int] | None:
        return file_identity(self.path)


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


def post_refusal(origin: str | None, fetch_site: str | None, own: str, *, by_token: bool) -> str | None:
    """Why a POST does not come from the console's own pages, or None when it does: its ``Origin`` is the console's
    (scheme, host AND port), or, from a browser that sends no ``Origin``, ``Sec-Fetch-Site`` says ``same-origin``;
    ``Sec-Fetch-Site``, when sent, must say ``same-origin`` in any case. Another port of the same host is another
    origin (``same-site`` is refused); ``Origin: null`` (a sandboxed frame, a ``data:`` page) is refused, and so is
    a POST by a sign-in cookie that names no origin at all (a replayed cookie: the cookie alone is not the person).
    ``by_token``: the token itself as ``Authorization: Bearer`` (a script; no browser sends it by itself) may name
    no origin, but one it names must be the console's."""
    site = None if fetch_site is None else fetch_site.strip().lower()
    if site is not None and site != "same-origin":
        return f"Sec-Fetch-Site is {site!r}, not 'same-origin': this request comes from another page than the console's"
    if origin is not None:
        if origin.strip().lower() != own.lower():
            return f"its Origin {origin.strip()!r} is not the console's ({own})"
        return None
    if site == "same-origin" or by_token:
        return None
    return (
        "it carries no Origin header (nor Sec-Fetch-Site: same-origin), so nothing says it comes from the console's "
        f"own pages: a browser sends one with every form; a script sends Origin: {own}, or the token as a bearer"
    )


@dataclass(frozen=True)
class SignIn:
    """A browser that opened the printed URL: its CSRF secret (random, unrelated to its cookie), when, and the
    digest of the token it opened (:func:`token_digest`): a sign-in opens the consoles of that token only."""

    csrf: str
    at: float
    token: str = ""


def _digest(signin_id: str) -> str:
    """What the store keys a sign-in by: a hash of its id, so the file does not hold the cookies themselves."""
    return hashlib.sha256(signin_id.encode()).hexdigest()


class SignIns:
    """The sign-ins of a console: hash(cookie) -> :class:`SignIn`, in memory (a request costs a hash and a dict
    lookup) and in ``path`` (0600), read again on a miss when the file changed (another console of the brain, the
    daemon's or an ``ambient web``, signed a browser in). ``path`` None: in memory only (unit tests). A sign-in is
    found only with the digest of the token it was made with: after a new token, none made before opens anything,
    in any console, whatever any console still holds in memory or writes back."""

    def __init__(self, path: Path | None, *, cap: int = MAX_SIGNINS) -> None:
        self.path = path
        self.cap = cap
        self._lock = threading.Lock()
        self._known: dict[str, SignIn] = {}
        self._seen: tuple[int, int, int] | None = None
        self._reload()

    def lookup(self, signin_id: str, token: str) -> SignIn | None:
        """The sign-in of a cookie's value, if it was made with the token of digest ``token``; else None."""
        key = _digest(signin_id)
        found = self._known.get(key)
        if found is None and self._changed():
            with self._lock:
                self._reload()
            found = self._known.get(key)
        if found is None or not found.token or not hmac.compare_digest(found.token.encode(), token.encode()):
            return None
        return found

    def create(self, token: str) -> tuple[str, SignIn]:
        """A new sign-in of the token of digest ``token``: its cookie value (random, 256 bits) and its CSRF secret
        (random, 256 bits); saved, and the sign-ins of other tokens dropped."""
        signin_id, made = secrets.token_urlsafe(32), SignIn(secrets.token_urlsafe(32), time.time(), token)
        with self._lock:
            if self._changed():
                self._reload()
            kept = {k: v for k, v in self._known.items() if v.token == token}
            known = {**kept, _digest(signin_id): made}
            if len(known) > self.cap:
                known = dict(sorted(known.items(), key=lambda kv: kv[1].at)[-self.cap :])
            if self.path is not None:
                self._save(known)
            self._known = known
        return signin_id, made

    def _save(self, known: dict[str, SignIn]) -> None:
        """Write the sign-ins; a write that fails (a full disk) keeps them in memory only, until a restart."""
        assert self.path is not None
        doc = {k: {"csrf": v.csrf, "at": v.at, "token": v.token} for k, v in known.items()}
        try:
            private_dir(self.path.parent)
            st = atomic_write(self.path, json.dumps({"signins": doc}) + "\n", mode=PRIVATE_FILE)
        except OSError as exc:
            log.warning("web_signins_not_saved", path=str(self.path), error=str(exc), kept="in memory until restart")
            return
        self._seen = (st.st_ino, st.st_mtime_ns, st.st_size)

    def _stat(self) -> tuple[int, int, int] | None:
        return file_identity(self.path)

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
            self._known = {str(k): SignIn(str(v["csrf"]), float(v["at"]), str(v.get("token", ""))) for k, v in rows}
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
    prefix), else a sign-in cookie of the current token under the prefix, or the token as a bearer (else 401); on
    POST, the Origin check, then the sign-in's CSRF secret (else 403); the security headers on every response. The
    token, hence the prefix, is the token file's now (:class:`TokenFile`): a new token takes effect at once."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        tokens: TokenFile,
        host_names: Iterable[str],
        signins: SignIns,
        secure_cookie: bool = False,
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.signins = signins
        self.host_names = frozenset(host_names)
        self.secure_cookie = secure_cookie

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        path: str = scope.get("path", "/")
        key = self.tokens.current()  # the token file's now: a new token moves the prefix and ends the old sign-ins
        prefix = key.prefix
        ours = in_prefix(path, prefix)
        static = path.startswith(f"{prefix}/static/" if ours else "/static/")
        cookie_header = headers.get("cookie", "")
        expire_old = bool(cookie_values(cookie_header, OLD_COOKIE))  # an earlier version's: the token, to every port

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                raw = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _SECURED]
                if ours:
                    raw = [(k, _under_prefix(v, prefix) if k.lower() == b"location" else v) for k, v in raw]
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
        if path == prefix and scope["method"] in ("GET", "HEAD"):  # the cookie's path ends with a slash
            await _redirect(send_secured, prefix + "/" + (f"?{query_string}" if query_string else ""))
            return
        query = parse_qsl(query_string, keep_blank_values=True)
        given = next((v for k, v in query if k == "token"), None)
        if given is not None and scope["method"] in ("GET", "HEAD"):
            await self._sign_in(key, given, path, query, send_secured)
            return
        bearer = _bearer(headers)
        by_token = bearer is not None and hmac.compare_digest(bearer.encode(), key.token.encode())
        signin = None
        if ours and not by_token:
            found = (self.signins.lookup(value, key.digest) for value in cookie_values(cookie_header, COOKIE))
            signin = next(filter(None, found), None)
        if not by_token and signin is None:
            await _html(send_secured, 401, _UNAUTHORIZED)
            return
        if scope["method"] not in ("GET", "HEAD", "OPTIONS"):
            own = f"{scope.get('scheme', 'http')}://{headers.get('host', '')}"
            why = post_refusal(headers.get("origin"), headers.get("sec-fetch-site"), own, by_token=by_token)
            if why is not None:
                await _plain(
                    send_secured, 403, f"Refused: this request does not come from the console's own pages: {why}."
                )
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
        scope = {**scope, "root_path": prefix if ours else "", CSRF_SCOPE: signin.csrf if signin else ""}
        await self.app(scope, receive, send_secured)

    async def _sign_in(self, key: Key, given: str, path: str, query: list[tuple[str, str]], send: Send) -> None:
        """The printed URL: the token (and only the token now in the token file) opens a new sign-in of that token;
        303 to the page asked for, under the prefix, with the sign-in's cookie."""
        if not hmac.compare_digest(given.encode(), key.token.encode()):
            await _html(send, 401, _UNAUTHORIZED)
            return
        signin_id, _ = await asyncio.to_thread(self.signins.create, key.digest)
        rest = urlencode([(k, v) for k, v in query if k != "token"])
        location = landing(path, key.prefix) + (f"?{rest}" if rest else "")
        cookie = f"{COOKIE}={signin_id}; Path={key.prefix}/; HttpOnly; SameSite=Lax" + (
            "; Secure" if self.secure_cookie else ""
        )
        await _redirect(send, location, cookie)


def _under_prefix(location: bytes, prefix: str) -> bytes:
    """A redirect of a page to a console path (``/escalations?...``) goes under the prefix; any other (an absolute
    URL Starlette built from the full path) is left as it is."""
    local = location.startswith(b"/") and not location.startswith((b"//", b"/\\"))
    if local and not in_prefix(location.decode("latin-1").split("?", 1)[0], prefix):
        return prefix.encode() + location
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
