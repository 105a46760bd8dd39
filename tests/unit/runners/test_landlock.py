"""Landlock's TCP rules as ambient applies them (runners/landlock.py), in a child process of the test: a confined
process binds no TCP port and connects only to the listed ports; ``connect=None`` leaves its TCP alone."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ambient.runners import landlock
from ambient.runners.confinement import landlock_abi

pytestmark = pytest.mark.skipif(landlock_abi() < landlock.NET_ABI, reason="needs Landlock ABI 4 (Linux 6.7+)")

_CHILD = """
import json, socket, sys
sys.path.insert(0, sys.argv[1])
import landlock
ports, connect = json.loads(sys.argv[2]), json.loads(sys.argv[3])
landlock.confine([b"/"], [], landlock.abi(), connect)
said = {}
for port in ports:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
        said[str(port)] = "connected"
    except OSError as exc:
        said[str(port)] = exc.strerror
try:
    socket.socket().bind(("127.0.0.1", 0))
    said["bind"] = "bound"
except OSError as exc:
    said["bind"] = exc.strerror
print(json.dumps(said))
"""


@pytest.fixture
def ports() -> Iterator[list[int]]:
    """Two ports on 127.0.0.1 that accept connections."""
    socks = [socket.socket(), socket.socket()]
    for s in socks:
        s.bind(("127.0.0.1", 0))
        s.listen(4)
    try:
        yield [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _confined(ports: list[int], connect: list[int] | None) -> dict[str, str]:
    where = str(Path(landlock.__file__).parent)
    argv = [sys.executable, "-I", "-c", _CHILD, where, json.dumps(ports), json.dumps(connect)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    said: dict[str, str] = json.loads(out)
    return said


def test_a_listed_port_connects_another_does_not_and_nothing_binds(ports: list[int]) -> None:
    said = _confined(ports, [ports[0]])
    assert said == {str(ports[0]): "connected", str(ports[1]): "Permission denied", "bind": "Permission denied"}


def test_no_list_leaves_tcp_alone(ports: list[int]) -> None:
    said = _confined(ports, None)
    assert said == {str(ports[0]): "connected", str(ports[1]): "connected", "bind": "bound"}


def test_an_empty_list_is_no_network(ports: list[int]) -> None:
    said = _confined(ports, [])
    assert set(said.values()) == {"Permission denied"}
