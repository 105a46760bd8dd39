"""The shared render of live parts: one render per (URL, fragment) and change generation however many pages fetch
it; a new generation renders again; whole pages, notices and actions are never shared; the store's refresh is
skipped for a live part's fetch only at a generation it was already refreshed at."""

from __future__ import annotations

import asyncio
from pathlib import Path

from starlette.types import Message, Receive, Scope, Send

from ambient.storage.paths import BrainPaths
from ambient.web.fragcache import FragmentCache, fragment_key
from ambient.web.live import Hub
from ambient.web.security import CSRF_SCOPE
from ambient.web.storethread import StoreThread


class Page:
    """A stand-in for the console's pages: counts its renders, answers the render's number; may hold at a gate."""

    def __init__(self, status: int = 200) -> None:
        self.calls = 0
        self.status = status
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls += 1
        n = self.calls
        self.entered.set()
        await self.gate.wait()
        await send({"type": "http.response.start", "status": self.status, "headers": [(b"content-type", b"text/html")]})
        await send({"type": "http.response.body", "body": f"render {n}".encode()})


def scope(query: str = "fragment=runs", *, method: str = "GET", path: str = "/") -> Scope:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "root_path": "",
        "scheme": "http",
        "query_string": query.encode(),
        "headers": [(b"host", b"127.0.0.1:8765")],
    }


async def get(app: FragmentCache, s: Scope) -> bytes:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(s, receive, send)
    assert sent[0]["type"] == "http.response.start"
    return b"".join(m.get("body", b"") for m in sent[1:])


async def test_concurrent_fetches_of_one_generation_share_one_render() -> None:
    page = Page()
    page.gate.clear()
    cache = FragmentCache(page, generation=lambda: 7)
    fetches = [asyncio.create_task(get(cache, scope())) for _ in range(50)]
    await page.entered.wait()  # the first render runs; the others, started with it, wait on it
    page.gate.set()
    bodies = await asyncio.gather(*fetches)
    assert page.calls == 1 and cache.renders == 1
    assert set(bodies) == {b"render 1"}
    assert await get(cache, scope()) == b"render 1"  # later, same generation: the same bytes
    assert page.calls == 1


async def test_a_new_generation_renders_again() -> None:
    page = Page()
    generation = [1]
    cache = FragmentCache(page, generation=lambda: generation[0])
    assert await get(cache, scope()) == b"render 1"
    generation[0] = 2
    assert await get(cache, scope()) == b"render 2"
    assert await get(cache, scope()) == b"render 2"
    assert await get(cache, scope("fragment=escalations")) == b"render 3"  # another part: its own render
    assert page.calls == 3


async def test_notices_pages_and_actions_are_never_shared() -> None:
    page = Page()
    cache = FragmentCache(page, generation=lambda: 1)
    personal = [
        scope("fragment=runs&notice=done&level=ok"),
        scope("fragment=runs&form_note=hello"),
        scope(""),  # the whole page
        scope("fragment=runs", method="POST"),
    ]
    for s in personal + personal:
        await get(cache, s)
    assert page.calls == 8 and cache.renders == 0
    assert fragment_key(scope("fragment=runs&token=x")) == fragment_key(scope("fragment=runs"))
    assert fragment_key(scope("fragment=runs", path="/runs/a")) != fragment_key(scope("fragment=runs"))
    # A fragment's forms carry the CSRF secret of the browser's sign-in: another browser renders its own.
    other_browser = {**scope("fragment=runs"), CSRF_SCOPE: "another sign-in's secret"}
    assert fragment_key(other_browser) != fragment_key(scope("fragment=runs"))


async def test_nothing_is_shared_without_a_watcher_nor_past_its_age_nor_when_refused() -> None:
    page = Page()
    cache = FragmentCache(page, generation=lambda: None)
    await get(cache, scope())
    await get(cache, scope())
    assert page.calls == 2

    now = [0.0]
    page = Page()
    cache = FragmentCache(page, generation=lambda: 1, max_age_s=2.0, clock=lambda: now[0])
    await get(cache, scope())
    now[0] = 2.5  # what no watcher tells (a relative time) is at most max_age_s old
    assert await get(cache, scope()) == b"render 2"

    page = Page(status=400)
    cache = FragmentCache(page, generation=lambda: 1)
    await get(cache, scope())
    await get(cache, scope())
    assert page.calls == 2


async def test_the_cache_is_bounded() -> None:
    page = Page()
    cache = FragmentCache(page, generation=lambda: 1, max_entries=3)
    for n in range(10):
        await get(cache, scope(f"fragment=f{n}"))
    await get(cache, scope("fragment=f0"))  # long evicted: rendered again
    assert page.calls == 11


async def test_the_hub_moves_its_generation_before_it_tells_the_pages(tmp_path: Path) -> None:
    paths = BrainPaths(tmp_path)
    hub = Hub(paths, StoreThread(paths))
    assert hub.generation() is None  # no watcher: nothing is shared, every read refreshes
    client = hub.subscribe()
    assert client is not None
    before = hub.changes
    hub.publish({"runs"})
    hub.publish(set())  # nothing changed: nothing told, no new generation
    assert hub.changes == before + 1 and client.queue.qsize() == 1
    hub.close_clients()


async def test_a_live_fetch_skips_the_refresh_only_at_a_generation_already_refreshed(tmp_path: Path) -> None:
    for sub in ("agents", "claims", "locks", "profil", "workflows"):
        (tmp_path / sub).mkdir()
    store = StoreThread(BrainPaths(tmp_path))
    refreshes: list[int | None] = []
    real = store._refresh

    def counted(generation: int | None = None, claims: bool = True) -> set[str]:
        refreshes.append(generation)
        return real(generation, claims)

    store._refresh = counted  # type: ignore[method-assign]
    try:
        await store.refresh(3)  # the hub's refresh after the change told at generation 3
        await store.read(lambda conn: None, generation=3)
        await store.read(lambda conn: None, generation=3)
        await store.read(lambda conn: None, generation=4)  # a change since: refreshed
        await store.read(lambda conn: None)  # a whole page: always refreshed
        await store.read(lambda conn: None, generation=4)  # ...and it began at no known generation
        assert refreshes == [3, 4, None, 4]
    finally:
        store.close()


async def test_the_live_parts_of_one_page_read_its_data_once_per_generation(tmp_path: Path) -> None:
    """The overview's live parts each render one block of the same data: after a change their fetches read it once
    (each gets its own copy); a new generation reads again; a read not shared (a closure over the request) always
    reads."""
    for sub in ("agents", "claims", "locks", "profil", "workflows"):
        (tmp_path / sub).mkdir()
    store = StoreThread(BrainPaths(tmp_path))
    reads: list[int] = []

    def data(conn: object) -> dict[str, int]:
        reads.append(1)
        return {"n": len(reads)}

    try:
        await store.refresh(3)
        parts = [await store.read(data, generation=3, share=True) for _ in range(5)]
        assert len(reads) == 1 and parts == [{"n": 1}] * 5
        parts[0]["mine"] = 1  # a page adds its own keys to its copy: the others' stay as read
        assert await store.read(data, generation=3, share=True) == {"n": 1}
        assert await store.read(data, generation=4, share=True) == {"n": 2}  # a change since: read again
        await store.read(data, generation=4)
        await store.read(data, generation=4)
        assert len(reads) == 4
    finally:
        store.close()
