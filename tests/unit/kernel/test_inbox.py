"""The inbox: sealed packet files from whoever routed them, read back and validated again."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ambient.kernel.inbox import inbox_handler, read_inbox, write_inbox
from ambient.kernel.packet import make_packet
from ambient.storage.paths import BrainPaths

NOW = datetime(2026, 3, 18, 10, 0, tzinfo=UTC)


@pytest.fixture
def brain(make_brain: Callable[..., Path]) -> Path:
    """A copy of the example brain."""
    return make_brain()


def test_inbox_round_trip(brain: Path) -> None:
    """write_inbox writes <id>.<seal>.json atomically; read_inbox validates again, reports bad files, and says
    which packets carry a valid seal (a copy under another name, or with a byte changed, does not)."""
    paths = BrainPaths(brain)
    p = make_packet("human", "deploy", "SPAWN", now=NOW, zone="project")
    path = write_inbox(paths, p)
    assert path.name.startswith(f"{p.id}.") and path.name.endswith(".json")
    (paths.inbox / "bad.json").write_text('{"from": "x"}')
    forged = paths.inbox / f"{p.id}.json"
    forged.write_bytes(path.read_bytes())
    tampered = paths.inbox / path.name.replace(p.id, p.id + "x")
    tampered.write_bytes(path.read_bytes().replace(b"deploy", b"deplox"))
    got = {f: (pkt, sealed) for f, pkt, sealed in read_inbox(paths)}
    assert got[path] == (p, True)
    assert got[forged] == (p, False) and got[tampered][1] is False
    assert "Field required" in str(got[paths.inbox / "bad.json"][0])


async def test_inbox_handler(brain: Path) -> None:
    """The inbox handler delivers by writing the inbox."""
    paths = BrainPaths(brain)
    p = make_packet("human", "deploy", "SPAWN", now=NOW)
    await inbox_handler(paths)(p)
    assert len(list(paths.inbox.glob(f"{p.id}.*.json"))) == 1
