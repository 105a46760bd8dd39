"""The daemon's send socket: ``ambient send`` hands its packet to the running daemon instead of routing it itself.

Why: in its own process ``ambient send`` imports pydantic, builds the packet models and loads the brain's agents
and routing table for a single packet (~0.3 s here; bench/cli.py), and agents call it in their loops. The daemon
has all of that warm, so when it runs the command only reads the packet file and asks it.

Nothing else changes: the same router decides (validation, the channel's identity, the matrix, the routing
table), the same audit record is written, and an allowed packet is delivered as before, by writing
``.ambient/inbox/<id>.json`` (fsync'd before the answer), which the daemon's inbox evaluator then consumes.

Protocol, one request per connection on an ``AF_UNIX`` stream socket at ``.ambient/run/send.sock`` (its folder
is 0700; a peer of another uid is refused): the client writes one JSON line ``{"token": str | null, "size": n}``
and then the ``n`` bytes of the packet file as they are; the daemon answers one JSON line (:func:`summary`) and
closes. The client falls back to routing in its own process when nothing listens (no daemon, a socket file
left by a crash, a path too long for ``AF_UNIX``). Once its request is sent it does not fall back: a daemon
that closes without answering may have delivered the packet already, so that is reported, not retried.

The client half (:func:`ask_daemon`) uses the standard library only: it runs before anything heavy is imported.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ambient.core.errors import NoAnswer

if TYPE_CHECKING:
    import asyncio

    from ambient.kernel.router import Outcome

#: The largest packet file (as ``packet.MAX_PACKET_BYTES``, which imports pydantic; a test keeps them equal).
MAX_PACKET_BYTES: Final = 256 * 1024
#: The agent's channel token (as ``ambient.kernel.channels.TOKEN_ENV``).
TOKEN_ENV: Final = "AMBIENT_CHANNEL_TOKEN"  # noqa: S105 - the variable's name, not a secret
SOCKET_DIR: Final = "run"
SOCKET_NAME: Final = "send.sock"
_MAX_HEADER: Final = 4096
_MAX_PATH: Final = 107  # sun_path is 108 bytes with its NUL
READ_TIMEOUT_S: Final = 10.0
#: How long the daemon gives a client to send its whole request, and how many it serves at once: an idle
#: connection flood must not take the daemon's descriptors; ``ambient send`` needs milliseconds.
SERVE_TIMEOUT_S: Final = 2.0
MAX_CLIENTS: Final = 32
#: How long a client waits for the answer (the daemon routes a packet in well under a millisecond when idle).
ANSWER_TIMEOUT_S: Final = 60.0

#: ``route(raw, token, peer_pid) -> summary``: the daemon's routing of one sent packet (the peer's pid from the
#: kernel, None where it cannot be known).
Route = Callable[[bytes, "str | None", "int | None"], Awaitable[dict[str, Any]]]


def socket_path(state_dir: Path) -> Path:
    """Where the running daemon of the brain whose state folder is ``state_dir`` listens."""
    return state_dir / SOCKET_DIR / SOCKET_NAME


def summary(outcome: Outcome) -> dict[str, Any]:
    """What ``ambient send`` reports of an outcome (the answer on the socket, and ``--json``)."""
    pkt = outcome.packet
    return {
        "status": outcome.status,
        "id": pkt.id if pkt else None,
        "from": pkt.from_ if pkt else None,
        "to": pkt.to if pkt else None,
        "signal": str(pkt.signal) if pkt else None,
        "rule": outcome.decision.rule if outcome.decision else None,
        "reason": outcome.reason,
    }


# ---------------------------------------------------------------------------------------------------------------
# The client (``ambient send``)


def ask_daemon(
    state_dir: Path, raw: bytes, token: str | None, *, timeout: float = ANSWER_TIMEOUT_S
) -> dict[str, Any] | None:
    """The daemon's answer for ``raw``, or None when no daemon listens (route it in this process then).

    Raises :class:`NoAnswer` when the daemon took the request but did not answer.
    """
    path = socket_path(state_dir)
    if _too_long(path):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(min(timeout, READ_TIMEOUT_S))
        try:
            sock.connect(os.fsencode(path))
        except OSError:  # no socket, a socket nobody listens on (a crashed daemon), not permitted
            return None
        sock.settimeout(timeout)
        try:
            fields: dict[str, Any] = {"token": token, "size": len(raw)}
            whole = getattr(raw, "whole_size", None), getattr(raw, "whole_sha256", None)
            if whole[0] is not None:  # an oversized packet: what the audit records of it is the whole input's
                fields["whole"] = list(whole)
            header = json.dumps(fields).encode() + b"\n"
            sock.sendall(header + raw)
            sock.shutdown(socket.SHUT_WR)
            answer = _read_line(sock)
        except OSError as exc:
            raise NoAnswer(exc.errno or 0, f"the daemon did not answer: {exc}") from exc
        if not answer:
            raise NoAnswer(0, "the daemon closed the connection without answering")
        try:
            result = json.loads(answer)
        except ValueError as exc:
            raise NoAnswer(0, "the daemon's answer is not JSON") from exc
        if not isinstance(result, dict) or "status" not in result:
            raise NoAnswer(0, "the daemon's answer has no status")
        return result
    finally:
        sock.close()


def _too_long(path: Path) -> bool:
    """Too long for ``sun_path``: no daemon listens there, and the command routes the packet itself."""
    return len(os.fsencode(path)) > _MAX_PATH


def _read_line(sock: socket.socket) -> bytes:
    data = b""
    while b"\n" not in data and len(data) <= _MAX_HEADER * 4:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0]


# ---------------------------------------------------------------------------------------------------------------
# The server (the daemon)


async def serve(state_dir: Path, route: Route, log: Any) -> asyncio.AbstractServer | None:
    """Listen at :func:`socket_path`; None (logged) when that cannot be (the clients then route themselves)."""
    import asyncio

    path = socket_path(state_dir)
    if _too_long(path):
        log.info("send_socket_unavailable", reason="path too long for a unix socket", path=str(path))
        return None
    try:
        from ambient.storage.fsutil import private_dir

        # The folder is the gate (0700; a link there refused by name): whoever can reach the socket can send.
        private_dir(path.parent)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by a crash: this daemon holds the brain's single-instance lock
        clients = [0]

        async def serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if clients[0] >= MAX_CLIENTS:  # a flood: closed at once, the daemon's descriptors are its own
                writer.close()
                log.warning("send_socket_busy", clients=clients[0])
                return
            clients[0] += 1
            try:
                await _serve_one(reader, writer, route, log)
            finally:
                clients[0] -= 1

        server = await asyncio.start_unix_server(serve_one, path=str(path))
    except OSError as exc:
        log.warning("send_socket_unavailable", reason=str(exc), path=str(path))
        return None
    return server


async def close(server: asyncio.AbstractServer | None, state_dir: Path) -> None:
    """Stop listening and remove the socket file."""
    if server is None:
        return
    server.close()
    await server.wait_closed()
    with contextlib.suppress(FileNotFoundError):
        socket_path(state_dir).unlink()


async def _serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, route: Route, log: Any) -> None:
    import asyncio

    try:
        peer = _peer(writer)
        if peer is not None and peer[1] != os.getuid():
            log.warning("send_socket_refused", reason="peer of another user")
            return
        async with asyncio.timeout(SERVE_TIMEOUT_S):
            line = await reader.readuntil(b"\n")
            header = json.loads(line) if len(line) <= _MAX_HEADER else None
            if not isinstance(header, dict):
                return
            size, token = header.get("size"), header.get("token")
            if (
                not isinstance(size, int)
                or not 0 <= size <= MAX_PACKET_BYTES + 1
                or not (token is None or isinstance(token, str))
            ):
                return
            raw = await reader.readexactly(size)
            whole = header.get("whole")
            if (
                size == MAX_PACKET_BYTES + 1
                and isinstance(whole, list)
                and len(whole) == 2
                and isinstance(whole[0], int)
                and isinstance(whole[1], str)
                and len(whole[1]) == 64
            ):
                from ambient.kernel.router import CutInput

                raw = CutInput(raw, whole[0], whole[1])
        answer = await route(raw, token, peer[0] if peer is not None else None)
        writer.write(json.dumps(answer).encode() + b"\n")
        await writer.drain()
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, OSError) as exc:
        log.info("send_socket_request_dropped", error=type(exc).__name__)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _peer(writer: asyncio.StreamWriter) -> tuple[int, int] | None:
    """The peer's (pid, uid) from the kernel; None where it cannot say (not Linux: the 0700 folder is the gate)."""
    sock = writer.get_extra_info("socket")
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return int(pid), int(uid)
