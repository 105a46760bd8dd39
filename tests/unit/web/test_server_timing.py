"""Every response says how long the server took (``Server-Timing``), so the benchmark can tell it from the wire."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest

from ambient.storage.paths import BrainPaths
from ambient.web.app import create_app


@pytest.mark.slow  # the app's first request imports the pages and the query store
def test_a_page_carries_its_server_time(tmp_path: Path) -> None:
    for sub in ("agents", "claims", "locks", "profil", "workflows"):
        (tmp_path / sub).mkdir()
    app = create_app(BrainPaths(tmp_path), token="t0ken", live=False)

    async def get(headers: dict[str, str]) -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await client.get("/", headers=headers)

    ok = asyncio.run(get({"Authorization": "Bearer t0ken"}))
    refused = asyncio.run(get({}))
    assert ok.status_code == 200
    assert re.fullmatch(r"app;dur=\d+\.\d", ok.headers["server-timing"])
    assert refused.status_code == 401 and "server-timing" in refused.headers
