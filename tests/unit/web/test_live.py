"""The live layer's rules: which topics a changed file means, bounded client queues (overflow → one resync), the
cap on clients."""

from __future__ import annotations

import asyncio
from pathlib import Path

from starlette.testclient import TestClient

from ambient.storage.paths import BrainPaths
from ambient.web.app import create_app
from ambient.web.live import QUEUE_SIZE, Hub, change_event, topics_of
from ambient.web.storethread import StoreThread


def test_each_file_the_daemon_writes_maps_to_its_topics(tmp_path: Path) -> None:
    paths = BrainPaths(tmp_path)
    s = str(paths.state)
    assert topics_of(paths, [f"{s}/runs/sess-1.jsonl"]) == {"runs", "run:sess-1"}
    assert topics_of(paths, [f"{s}/escalations/esc-abcdef.yml"]) == {"escalations"}
    assert topics_of(paths, [f"{paths.claims}/c.yml", f"{paths.locks}/x.lock"]) == {"claims", "locks"}
    assert topics_of(paths, [f"{s}/runs.jsonl"]) == {"records", "runs"}
    assert topics_of(paths, [f"{s}/daemon.json", f"{s}/now.json"]) == {"daemon", "now"}
    assert topics_of(paths, [f"{s}/workers.json"]) == {"workers"}  # the cluster's workers (the overview)
    # the store's own writes, temp files and anything else mean nothing (no refresh loop)
    assert topics_of(paths, [f"{s}/query.sqlite3", f"{s}/query.sqlite3-wal", f"{s}/runs/.x.jsonl.tmp.1"]) == set()


async def test_a_slow_client_gets_one_resync_instead_of_a_backlog(tmp_path: Path) -> None:
    paths = BrainPaths(tmp_path)
    hub = Hub(paths, StoreThread(paths), max_clients=2)
    client = hub.subscribe()
    assert client is not None
    for i in range(QUEUE_SIZE + 5):
        hub.publish({f"run:{i}"})
    queued = [client.queue.get_nowait() for _ in range(client.queue.qsize())]
    assert len(queued) <= QUEUE_SIZE
    assert any(e is not None and e.startswith(b"event: resync") for e in queued)
    assert hub.subscribe() is not None and hub.subscribe() is None  # the cap
    hub.close_clients()
    await asyncio.sleep(0)


def test_past_the_cap_events_answer_503(tmp_path: Path) -> None:
    app = create_app(BrainPaths(tmp_path), token="t" * 43, live=False, max_clients=0)
    with TestClient(app, base_url="http://127.0.0.1:1") as http:
        res = http.get("/events", headers={"Authorization": "Bearer " + "t" * 43})
        assert res.status_code == 503 and "tabs" in res.text


async def test_a_burst_of_changes_is_told_once_to_fifty_pages_after_one_refresh(tmp_path: Path) -> None:
    """Fifty open pages, four changes within one frame: one refresh of the store, one ``change`` naming them all,
    the same bytes queued for every page; the pages' fetches at that generation refresh nothing more. The claims,
    listed at start, are owed (their interval) and told with a later frame, once listed."""
    for sub in ("agents", "claims", "locks", "profil", "workflows"):
        (tmp_path / sub).mkdir()
    paths = BrainPaths(tmp_path)
    store = StoreThread(paths)
    hub = Hub(paths, store, frame_s=0.01, claims_interval_s=3600)
    refreshes: list[tuple[int | None, bool]] = []
    real = store._refresh

    def counted(generation: int | None = None, claims: bool = True) -> set[str]:
        refreshes.append((generation, claims))
        return real(generation, claims)

    store._refresh = counted  # type: ignore[method-assign]
    await hub.start()
    try:
        pages = [hub.subscribe() for _ in range(50)]
        assert all(p is not None for p in pages)
        clients = [p for p in pages if p is not None]
        refreshes.clear()
        for topics in ({"runs", "run:a"}, {"claims"}, {"records", "runs"}, {"locks"}):
            hub.note(topics)
        events = [await asyncio.wait_for(c.queue.get(), 30) for c in clients]
        assert len({id(e) for e in events}) == 1  # one buffer for every page
        assert events[0] == change_event({"runs", "run:a", "records", "locks"})
        assert refreshes == [(hub.changes, False)]  # one refresh, the claims left for their interval
        for _ in range(50):  # every page's fetch of a live part at this generation
            await store.read(lambda conn: None, generation=hub.generation())
        assert len(refreshes) == 1 and hub.tells == 1
        assert all(c.queue.empty() for c in clients)

        hub.claims_interval_s = 0  # the interval passed: the next frame lists the claims and tells them
        hub.note({"locks"})
        events = [await asyncio.wait_for(c.queue.get(), 30) for c in clients]
        assert set(events) == {change_event({"claims", "locks"})}
        assert refreshes[1:] == [(hub.changes, True)] and hub.tells == 2
    finally:
        await hub.stop()
        store.close()
