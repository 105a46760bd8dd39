"""Serving the console: ``ambient web`` in the foreground (:func:`serve`), or hosted by the daemon in a thread of
its own with its own event loop (:class:`HostedConsole`), so that no browser, however slow or numerous, can stall
the daemon's loop: the daemon's loop never runs a line of the console, they share only the files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Final

import uvicorn

from ambient.core.errors import InputError
from ambient.core.lazylog import get_logger
from ambient.core.process import own_start_time, process_alive
from ambient.service.writer_threads import lower_priority
from ambient.storage.fsutil import PRIVATE_FILE, atomic_write, private_dir
from ambient.storage.guard import FileGuard, shared_guard
from ambient.storage.paths import BrainPaths
from ambient.web.app import create_app
from ambient.web.live import Hub
from ambient.web.security import console_prefix, is_loopback, load_token

log = get_logger(__name__)

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8765


@dataclass(frozen=True)
class Bind:
    """Where the console listens and how (TLS files, or an explicit insecure non-loopback bind)."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    tls_cert: Path | None = None
    tls_key: Path | None = None
    insecure_bind: bool = False

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def check(self) -> str | None:
        """Refuse what would expose the console carelessly (:class:`InputError`); the warning of an insecure bind."""
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InputError("--tls-cert and --tls-key go together: give both files, or neither")
        for f in (self.tls_cert, self.tls_key):
            if f is not None and not f.is_file():
                raise InputError(f"{f}: no such file (a PEM certificate and its key are needed for TLS)")
        if not 0 <= self.port <= 65535:
            raise InputError(f"port {self.port}: must be 0 (any free port) to 65535")
        if is_loopback(self.host) or self.tls:
            return None
        if not self.insecure_bind:
            raise InputError(
                f"refusing to serve the console on {self.host} without TLS: anyone who can reach that address "
                "could see the token go by and act as you. Give --tls-cert and --tls-key, or --insecure-bind if the "
                "network is yours alone (e.g. a VPN), or keep the default 127.0.0.1 and use an SSH tunnel"
            )
        return (
            f"warning: serving the console on {self.host} over plain HTTP (--insecure-bind): everyone on that "
            "network can read every page, the escalations' questions and the token, and then answer escalations, "
            "start workflows and approve gates as you"
        )


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free port, read back from the socket)."""
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise InputError(f"cannot serve on {host!r}: {exc.strerror}") from None
    sock = socket.socket(info[0], socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(info[4])
    except OSError as exc:
        sock.close()
        raise InputError(f"cannot serve on {host}:{port}: {exc.strerror} (another console? try --port 0)") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def console_url(bind: Bind, port: int, token: str | None = None) -> str:
    """The console's address (``scheme://host:port/``), or with ``token`` the URL to open (:func:`token_url`); a
    wildcard bind is named by this machine's host name."""
    host = bind.host
    if host in ("0.0.0.0", "::", ""):  # noqa: S104 - names the wildcard, binds nothing
        host = socket.gethostname()
    if ":" in host:
        host = f"[{host}]"
    url = f"{'https' if bind.tls else 'http'}://{host}:{port}/"
    return token_url(url, token) if token else url


def token_url(address: str, token: str) -> str:
    """The URL to open: the console's secret path under ``address`` (``scheme://host:port/``), and the token, which
    the console exchanges for a sign-in cookie (:mod:`ambient.web.security`)."""
    return f"{address.rstrip('/')}{console_prefix(token)}/?token={token}"


def hosted_path(paths: BrainPaths) -> Path:
    """Where the consoles serving this brain (``ambient web``s, the daemon's) say where they listen: for each, its
    address without the token nor its secret path, its pid and start time, for ``ambient web --url``. Each console
    adds its own entry when it listens and removes it, and only it, when it stops."""
    return paths.state / "web" / "hosted.json"


def _hosted_guard(paths: BrainPaths) -> FileGuard:
    """The flock around each read-modify-write of ``hosted.json`` (two consoles starting or stopping at once)."""
    return shared_guard(paths.state / "web" / "hosted.guard")


@dataclass(frozen=True)
class Serving:
    """A console serving the brain, as ``hosted.json`` says: where (no token), and which process."""

    url: str
    pid: int
    start_time: float | None

    def alive(self) -> bool:
        """Whether its process still runs (a console killed with -9 leaves its entry behind: pid and start time)."""
        return process_alive(self.pid, self.start_time)


def _entry(raw: object) -> Serving | None:
    if not isinstance(raw, dict):
        return None
    url, pid, start = raw.get("url"), raw.get("pid"), raw.get("start_time")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")) or not isinstance(pid, int):
        return None
    return Serving(url, pid, float(start) if isinstance(start, int | float) else None)


def serving_records(paths: BrainPaths) -> list[Serving]:
    """Every console ``hosted.json`` names, oldest first (live or not); ``[]`` when none or unreadable. An earlier
    version's file, one console's record, reads as a list of one."""
    try:
        data = json.loads(hosted_path(paths).read_text())
    except (OSError, ValueError):
        return []
    rows = data.get("consoles") if isinstance(data, dict) and "consoles" in data else [data]
    return [e for e in map(_entry, rows if isinstance(rows, list) else []) if e is not None]


def _write_serving(paths: BrainPaths, rows: list[Serving]) -> None:
    if not rows:
        with contextlib.suppress(FileNotFoundError):
            hosted_path(paths).unlink()
        return
    doc = {"consoles": [{"url": r.url, "pid": r.pid, "start_time": r.start_time} for r in rows]}
    atomic_write(hosted_path(paths), json.dumps(doc) + "\n", mode=PRIVATE_FILE)


def record_serving(paths: BrainPaths, url: str) -> None:
    """Say that this process serves the console at ``url`` (atomic, 0600: the address carries no token), beside the
    other live consoles of the brain (the entries of dead processes are dropped)."""
    private_dir(hosted_path(paths).parent)
    me = Serving(url, os.getpid(), own_start_time())
    with _hosted_guard(paths).hold():
        rows = [r for r in serving_records(paths) if r.alive() and (r.pid, r.url) != (me.pid, me.url)]
        _write_serving(paths, [*rows, me])


def forget_serving(paths: BrainPaths, url: str) -> None:
    """This process no longer serves at ``url``: remove its entry, and only its (the other consoles still serve)."""
    with _hosted_guard(paths).hold():
        rows = serving_records(paths)
        kept = [r for r in rows if (r.pid, r.url) != (os.getpid(), url)]
        if kept != rows:
            _write_serving(paths, kept)


def serving_urls(paths: BrainPaths) -> list[str]:
    """The addresses (without token) of the consoles serving this brain now, the newest first."""
    return [r.url for r in reversed(serving_records(paths)) if r.alive()]


def serving_url(paths: BrainPaths) -> str | None:
    """The address (without token) of the console serving this brain now (the newest, when several do), if one
    does."""
    return next(iter(serving_urls(paths)), None)


class _Server(uvicorn.Server):
    """uvicorn's server, which also ends the open event streams when told to stop (else they hold it open)."""

    def __init__(self, config: uvicorn.Config, hub: Hub) -> None:
        super().__init__(config)
        self.hub = hub
        self.on_started: Callable[[], None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.on_started is not None:
            self.on_started()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # A signal is how the console is meant to stop: exit 0 once drained, not uvicorn's re-raise of it.
        self._captured_signals.clear()
        self.hub.close_clients_threadsafe()

    def stop_soon(self) -> None:
        """Stop from another thread (the daemon hosting the console)."""
        self.should_exit = True


def _server(paths: BrainPaths, bind: Bind, token: str, *, max_clients: int) -> _Server:
    app = create_app(paths, token=token, secure_cookie=bind.tls, bound_host=bind.host, max_clients=max_clients)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        ssl_certfile=str(bind.tls_cert) if bind.tls_cert else None,
        ssl_keyfile=str(bind.tls_key) if bind.tls_key else None,
        timeout_graceful_shutdown=2,
        server_header=False,
    )
    return _Server(config, app.state.hub)


def serve(
    paths: BrainPaths,
    bind: Bind,
    *,
    token: str | None = None,
    on_ready: Callable[[str], None] = print,
    max_clients: int = 64,
) -> None:
    """Serve the console in the foreground until SIGINT/SIGTERM; ``on_ready(url)`` once it listens."""
    token = token or load_token(paths)
    sock = bind_socket(bind.host, bind.port)
    server = _server(paths, bind, token, max_clients=max_clients)
    port = sock.getsockname()[1]
    record_serving(paths, console_url(bind, port))
    try:
        on_ready(console_url(bind, port, token))
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        sock.close()
        forget_serving(paths, console_url(bind, port))


class HostedConsole:
    """The console hosted by the daemon: a thread with its own event loop and its own query-store connection."""

    def __init__(self, paths: BrainPaths, bind: Bind, *, max_clients: int = 64) -> None:
        self.paths = paths
        self.bind = bind
        self.max_clients = max_clients
        self.url: str | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    def start(self, timeout: float = 10.0) -> str:
        """Listen and serve in the background; the URL (without its token) once it listens."""
        warning = self.bind.check()
        if warning:
            log.warning("web_insecure_bind", message=warning)
        token = load_token(self.paths)
        sock = bind_socket(self.bind.host, self.bind.port)
        self._server = _server(self.paths, self.bind, token, max_clients=self.max_clients)
        self.url = console_url(self.bind, sock.getsockname()[1])
        server = self._server

        def run() -> None:
            # Ten nice steps below the daemon, as its background writers: the threads this one starts (the store's,
            # the watcher's, the request workers) inherit it, so on a busy CPU the kernel prefers the daemon's loop.
            lower_priority()
            try:
                asyncio.run(self._serve(server, sock))
            except BaseException as exc:  # noqa: BLE001 - reported by start()/stop(), never kills the daemon
                self._error = exc
                log.error("web_console_failed", error=repr(exc))
            finally:
                sock.close()
                self._started.set()

        self._thread = threading.Thread(target=run, name="ambient-web", daemon=True)
        self._thread.start()
        self._started.wait(timeout)
        if self._error is not None:
            raise InputError(f"the web console did not start: {self._error}")
        record_serving(self.paths, self.url)
        log.info("web_console_serving", url=self.url, full_url_from="ambient web --url")
        return self.url

    async def _serve(self, server: _Server, sock: socket.socket) -> None:
        server.on_started = self._started.set
        await server.serve(sockets=[sock])

    def stop(self, timeout: float = 5.0) -> None:
        """Close the live streams, stop serving, join the thread."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.stop_soon()
        server.hub.close_clients_threadsafe()
        thread.join(timeout)
        if self.url is not None:
            forget_serving(self.paths, self.url)
        self._server = self._thread = None
