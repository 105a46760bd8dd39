"""``ambient send`` through the running daemon's send socket, and its fall-back when no daemon answers.

The real daemon (a subprocess) and the real command; a fake daemon end for what a real one never does.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ambient.kernel import channels, packet, sendsocket
from ambient.kernel.channels import ChannelRegistry
from ambient.kernel.router import read_audit
from ambient.storage.paths import BrainPaths
from tests.e2e.helpers import DaemonProcess, make_brain, running, wait_for

REPO = Path(__file__).resolve().parents[3]
SPAWN = {
    "from": "human",
    "to": "deploy",
    "signal": "SPAWN",
    "scope": {"zone": "project", "files": ["infrastructure/vps/a.yml"]},
}


def send(
    brain: BrainPaths,
    body: dict[str, Any] | bytes,
    *args: str,
    token: str | None = None,
    python: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMBIENT_")}
    env["PYTHONPATH"] = str(REPO / "src")
    if token is not None:
        env[channels.TOKEN_ENV] = token
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return subprocess.run(
        [sys.executable, *python, "-m", "ambient", "--brain", str(brain.root), "send", *args, "-"],
        input=data.decode(errors="surrogateescape"),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def audit(brain: BrainPaths) -> list[dict[str, Any]]:
    return list(read_audit(brain.audit)) if brain.audit.exists() else []


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[BrainPaths, DaemonProcess]]:
    paths = make_brain(tmp_path / "brain")
    with running(paths) as d:
        yield paths, d


def test_constants_match_the_modules_they_stand_for() -> None:
    """The client's copies (it must not import pydantic) equal the originals."""
    assert sendsocket.MAX_PACKET_BYTES == packet.MAX_PACKET_BYTES
    assert sendsocket.TOKEN_ENV == channels.TOKEN_ENV


class TestThroughTheDaemon:
    @pytest.mark.slow
    def test_a_packet_is_routed_recorded_and_delivered_by_the_daemon(
        self, daemon: tuple[BrainPaths, DaemonProcess]
    ) -> None:
        paths, d = daemon
        sock = sendsocket.socket_path(paths.state)
        assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
        done = send(paths, SPAWN)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("delivered pkt_") and "human → deploy SPAWN" in done.stdout
        pid = done.stdout.split()[1].rstrip(":")
        (logged,) = d.wait_logged("packet_sent", via="socket")
        assert logged["packet"] == pid and logged["status"] == "delivered"
        # The daemon's inbox evaluator consumes what it delivered, as it does what the command writes itself.
        wait_for(lambda: list((paths.inbox / "done").glob(f"{pid}.*.json")), 15, "the packet consumed")
        # The SPAWN also runs its agent (a one-item run: its own packets follow); the person's packet is delivered.
        wait_for(
            lambda: (
                [r["status"] for r in audit(paths) if r.get("id") == pid and r["status"] != "allowed"] == ["delivered"]
            ),
            15,
            "the audit record",
        )
        assert d.stop() == 0
        assert not sock.exists()  # gone with the daemon: the next command routes by itself

    @pytest.mark.slow
    def test_identity_comes_from_the_token_the_command_presents(self, daemon: tuple[BrainPaths, DaemonProcess]) -> None:
        paths, d = daemon
        token = ChannelRegistry(paths).issue("vps").token or ""  # after start-up, which revokes every token
        ok = {"from": "vps", "to": "ambient", "signal": "ESCALATE", "payload": {"options": ["retry", "skip"]}}
        forged = {"from": "human", "to": "ambient", "signal": "RETURN", "payload": {"result": "approved"}}
        assert send(paths, ok, token=token).returncode == 0
        denied = send(paths, forged, token=token)
        assert denied.returncode == 1 and "identity comes from the channel" in denied.stderr
        dead = send(paths, ok, token="Q" * 43)
        assert dead.returncode == 1
        as_json = send(paths, {"from": "human", "signal": "RETURN"}, "--json")
        assert as_json.returncode == 2 and json.loads(as_json.stdout)["status"] == "invalid"
        assert len(d.logged("packet_sent", via="socket")) == 4
        # (the daemon's re-check when it consumes the delivered packet from the inbox is recorded as "allowed")
        decided = lambda: [(r["status"], r["channel"]) for r in audit(paths) if r["status"] != "allowed"]  # noqa: E731
        wait_for(lambda: len(decided()) == 4, 15, "four audit records")
        assert decided() == [
            ("delivered", "vps"),
            ("denied", "vps"),
            ("denied", "unauthenticated"),
            ("invalid", "human"),
        ]
        assert token not in paths.audit.read_text() and token not in "\n".join(d.lines())


class TestFallBack:
    @pytest.mark.slow
    def test_without_a_daemon_or_with_a_dead_socket_the_command_routes_by_itself(self, tmp_path: Path) -> None:
        paths = make_brain(tmp_path / "brain")
        assert send(paths, SPAWN).returncode == 0
        # A socket file left by a crashed daemon: bound, nobody listening.
        sock = sendsocket.socket_path(paths.state)
        sock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        left.bind(str(sock))
        left.close()
        done = send(paths, SPAWN)
        assert done.returncode == 0, done.stderr
        assert [r["status"] for r in audit(paths)] == ["delivered", "delivered"]
        assert len(list(paths.inbox.glob("*.json"))) == 2

    @pytest.mark.slow
    def test_a_daemon_that_closes_without_answering_is_reported_not_retried(self, tmp_path: Path) -> None:
        paths = make_brain(tmp_path / "brain")
        sock = sendsocket.socket_path(paths.state)
        sock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(sock))
        server.listen()

        def take_and_hang_up() -> None:
            conn, _ = server.accept()
            conn.recv(65536)
            conn.close()

        t = threading.Thread(target=take_and_hang_up)
        t.start()
        try:
            done = send(paths, SPAWN)
        finally:
            t.join(10)
            server.close()
        assert done.returncode == 2
        assert "without answering" in done.stderr and "may have been delivered" in done.stderr
        assert not paths.inbox.exists() or not list(paths.inbox.glob("*.json"))  # not routed a second time
        assert audit(paths) == []

    @pytest.mark.slow
    def test_a_packet_the_daemon_answers_costs_the_command_no_router(self, tmp_path: Path) -> None:
        """The point of the socket is the command's start-up: answered by the daemon, it never imports the router
        (pydantic, the packet models: ~0.2 s); bench/cli.py measures it (send-daemon)."""
        paths = make_brain(tmp_path / "brain")
        sock = sendsocket.socket_path(paths.state)
        sock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(sock))
        server.listen()
        answer = {"status": "delivered", "id": "pkt_1", "from": "human", "to": "deploy", "signal": "SPAWN"}

        def answer_it() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(json.dumps(answer).encode() + b"\n")

        t = threading.Thread(target=answer_it)
        t.start()
        try:
            done = send(paths, SPAWN, python=("-X", "importtime"))
        finally:
            t.join(10)
            server.close()
        assert done.returncode == 0 and done.stdout.startswith("delivered pkt_1"), done.stderr
        imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
        assert "ambient.kernel.sendsocket" in imported and "ambient.kernel.router" not in imported


class TestServer:
    """The daemon's end with a stand-in router: what a client may not send is dropped, never routed."""

    async def test_requests_it_cannot_take_are_dropped(self, tmp_path: Path) -> None:
        seen: list[tuple[bytes, str | None]] = []

        async def route(raw: bytes, token: str | None, peer: int | None) -> dict[str, Any]:
            seen.append((raw, token))
            return {"status": "delivered", "id": "pkt_1", "reason": ""}

        class Log:
            def __getattr__(self, name: str) -> Any:
                return lambda *a, **k: None

        server = await sendsocket.serve(tmp_path, route, Log())
        assert server is not None
        path = str(sendsocket.socket_path(tmp_path))

        def raw_request(data: bytes) -> bytes:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(10)
                s.connect(path)
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)
                return s.recv(65536)

        try:
            answer = await asyncio.to_thread(sendsocket.ask_daemon, tmp_path, b"from: human", "tok")
            assert answer == {"status": "delivered", "id": "pkt_1", "reason": ""}
            too_big = json.dumps({"token": None, "size": sendsocket.MAX_PACKET_BYTES + 2}).encode() + b"\n"
            for bad in (
                b"not json\n",
                b'["a list"]\n',
                b'{"size": "3"}\n',
                b'{"size": 5, "token": 7}\nabcde',
                too_big,
                b'{"size": 10, "token": null}\nshort',
            ):
                assert await asyncio.to_thread(raw_request, bad) == b""
            assert seen == [(b"from: human", "tok")]
        finally:
            await sendsocket.close(server, tmp_path)
        assert not Path(path).exists()
