"""The web console's figures, on a brain of 20,000 claims and 2,000 finished runs (``bigbrain.py``).

(pages)   Server time of the overview ``/`` and of the 1,000-item run's page ``/runs/<id>``: ``ambient web --port 0``
          on the brain as a subprocess, each page fetched ``--requests`` times with httpx (the token as Bearer) on
          loopback, after one first fetch printed apart; median and p90 of the time measured by the client (request
          sent → body read), and of the ``Server-Timing`` header's ``dur`` when the app sends one. The server's start
          (the query store built from the files) is printed too. Target ≤ 200 ms.
(events)  A journal event reaches an open page: with that server, an SSE client on ``/events``; ``--events`` times
          a line is appended to an unfinished run's journal as the daemon appends (``O_APPEND``, one write, fsync),
          and the time to the ``change`` event naming ``run:<id>`` is taken. ``browser``: the same with the run's page
          open in Chromium (Playwright), up to the moment a live part of the page was swapped (a MutationObserver in
          the page). Target: median ≤ 500 ms.
(spawn)   50 live clients against none: the daemon (``ambient run``) on the same brain hosting the console (``web:``
          in ``profil/ambient.yml``; ``--console beside``: ``ambient web`` next to it), one-item workflows dropped
          into it ``--drops`` times per block, blocks of 0 and ``--clients`` clients, ABBA order; each drop's latency to
          its run's first ``accepted`` record (written just before the SPAWN), as ``fanout.py`` (d). The clients are
          one process (httpx, asyncio): each holds ``/events`` open and, as ``app.js`` does, re-fetches the overview's
          live parts (``data-fragment``) whose ``data-live`` topics an event names. Client 0 also timestamps its
          events: drop → ``change`` naming ``runs`` with the daemon and the clients busy. Target: medians < 10 % apart.

Usage: ``python bench/web.py [--claims 20000] [--runs 2000] [--big-items 1000] [--requests 30] [--events 20]
[--drops 10 --blocks 4 --clients 50] [--console daemon|beside] [--skip pages,events,browser,spawn] [--profile]``
Run it with the project's interpreter and ``PYTHONPATH=src`` from the repository root.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from _common import BENCH, PY, Steal, TempDir, daemon_argv, daemon_env, epoch, foreach_yaml
from bigbrain import BigBrain, load_big_brain, make_big_brain

URL_RE = re.compile(r"https?://[^\s]+")
LIVE_RE = re.compile(r"<[^>]*\bdata-live=\"([^\"]*)\"[^>]*>", re.S)
FRAGMENT_RE = re.compile(r"\bdata-fragment=\"([^\"]*)\"")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


# ------------------------------------------------------------------------------------------------ figures and load


def load() -> str:
    """The machine's load averages (1, 5, 15 min), as ``uptime`` prints them."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def pct(values: Sequence[float], q: float) -> float:
    vals = sorted(values)
    return vals[min(len(vals) - 1, int(q * (len(vals) - 1) + 0.5))] if vals else float("nan")


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median, p90 and max of values in seconds, as ms."""
    if not values:
        return {"n": 0, "median_ms": float("nan"), "p90_ms": float("nan"), "max_ms": float("nan")}
    return {
        "n": len(values),
        "median_ms": statistics.median(values) * 1000,
        "p90_ms": pct(values, 0.9) * 1000,
        "max_ms": max(values) * 1000,
    }


def fmt(s: dict[str, float]) -> str:
    return f"median {s['median_ms']:.1f} ms, p90 {s['p90_ms']:.1f} ms, max {s['max_ms']:.1f} ms (n={s['n']:.0f})"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# ------------------------------------------------------------------------------------------------ the console server


class Console:
    """A console the bench talks to: its base URL and token, and the process serving it (None: the daemon's)."""

    def __init__(self, base: str, token: str, proc: subprocess.Popen[bytes] | None = None) -> None:
        self.base, self.token, self.proc = base, token, proc

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def parse_url(text: str) -> tuple[str, str]:
    """(base URL, token) from the line ``ambient web`` prints: the base is the console's secret path, under which its
    pages are (``http://127.0.0.1:PORT/c/<secret>``)."""
    m = URL_RE.search(text)
    if m is None or "token=" not in m.group(0):
        raise RuntimeError(f"no console URL with a token in {text[-1000:]!r}")
    url = httpx.URL(m.group(0))
    token = url.params["token"]
    return f"{url.scheme}://{url.host}:{url.port}{url.path.rstrip('/')}", token


def ambient(root: Path, *args: str) -> list[str]:
    return [PY, "-m", "ambient", "--brain", str(root), *args]


def start_console(root: Path, log: Path, timeout: float = 600, nice: int = 0) -> tuple[Console, float]:
    """``ambient web --port 0`` on ``root`` (``nice``: at that niceness); the console and the seconds until it
    answered its first page."""
    t0 = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ambient(root, "web", "--port", "0"),
            env=daemon_env([BENCH]),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=(lambda: os.nice(nice)) if nice else None,
        )
    deadline = time.monotonic() + timeout
    while True:
        text = log.read_text(errors="replace")
        if "token=" in text:
            break
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"ambient web did not print its URL: {text[-2000:]}")
        time.sleep(0.02)
    base, token = parse_url(text)
    console = Console(base, token, proc)
    while True:  # the URL may be printed before the server listens
        try:
            if httpx.get(base + "/", headers=console.headers, timeout=timeout).status_code < 500:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"ambient web did not answer: {log.read_text()[-2000:]}")
        time.sleep(0.02)
    return console, time.perf_counter() - t0


def console_url(root: Path) -> tuple[str, str]:
    """``ambient web --url``: the daemon-hosted console's URL with its token."""
    out = subprocess.run(ambient(root, "web", "--url"), env=daemon_env(), capture_output=True, text=True, check=True)
    return parse_url(out.stdout + out.stderr)


# ------------------------------------------------------------------------------------------------ (pages)


def time_page(client: httpx.Client, path: str, n: int) -> dict[str, Any] | None:
    """Fetch ``path`` once (printed apart), then ``n`` times: client time and Server-Timing ``dur``. None: no page."""
    if client.get(path).status_code == 404:
        return None
    first = _get(client, path)
    client_s: list[float] = []
    server_s: list[float] = []
    size = 0
    for _ in range(n):
        dt, st, size = _get(client, path)
        client_s.append(dt)
        if st is not None:
            server_s.append(st)
    return {
        "path": path,
        "first_ms": first[0] * 1000,
        "bytes": size,
        "client": summary(client_s),
        "server": summary(server_s) if server_s else None,
    }


def _get(client: httpx.Client, path: str) -> tuple[float, float | None, int]:
    t = time.perf_counter()
    r = client.get(path)
    body = r.content
    dt = time.perf_counter() - t
    if r.status_code != 200:
        raise RuntimeError(f"GET {path}: {r.status_code} {body[:300]!r}")
    return dt, server_timing(r.headers.get("server-timing")), len(body)


def server_timing(header: str | None) -> float | None:
    """The sum of the ``dur`` values (ms) of a ``Server-Timing`` header, in seconds."""
    if not header:
        return None
    durs = [float(m) for m in re.findall(r"dur=([0-9.]+)", header)]
    return sum(durs) / 1000 if durs else None


def bench_pages(console: Console, brain: BigBrain, n: int) -> dict[str, Any]:
    with httpx.Client(base_url=console.base, headers=console.headers, timeout=60) as client:
        return {
            "overview": time_page(client, "/", n),
            "run": time_page(client, f"/runs/{brain.big_run}", n),
        }


def profile_pages(root: Path, brain: BigBrain, n: int) -> None:
    """The same pages rendered in this process through the ASGI app (no socket) under cProfile: where time goes."""
    import cProfile
    import pstats

    from ambient.storage.paths import BrainPaths
    from ambient.web.app import create_app

    app = create_app(BrainPaths(root), token="bench", live=False)

    async def go() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://127.0.0.1", headers={"Authorization": "Bearer bench"}
        ) as client:
            for path in ("/", f"/runs/{brain.big_run}"):
                await client.get(path)
                prof = cProfile.Profile()
                times = []
                for _ in range(n):
                    t = time.perf_counter()
                    prof.enable()
                    r = await client.get(path)
                    prof.disable()
                    times.append(time.perf_counter() - t)
                    assert r.status_code == 200, (path, r.status_code)
                print(f"\nin-process (ASGI, no socket) {path}: {fmt(summary(times))}")
                pstats.Stats(prof).sort_stats("cumulative").print_stats(25)

    asyncio.run(go())


# ------------------------------------------------------------------------------------------------ SSE clients


class SseListener:
    """One SSE client in a thread of this process: every ``change`` event as (wall time, topics) on a queue."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.events: queue.Queue[tuple[float, list[str]]] = queue.Queue()
        self.ready = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        if not self.ready.wait(30):
            raise RuntimeError("the SSE client did not connect")

    async def _run(self) -> None:
        c = httpx.AsyncClient(base_url=self.console.base, headers=self.console.headers, timeout=None)
        async with c, c.stream("GET", "/events") as r:
            if r.status_code != 200:
                raise RuntimeError(f"/events: {r.status_code}")
            self.ready.set()
            async for ev, data in sse_events(r.aiter_lines()):
                if self._stop:
                    return
                if ev == "change":
                    self.events.put((time.time(), json.loads(data).get("topics", [])))
                elif ev == "resync":
                    self.events.put((time.time(), ["resync"]))

    def drain(self) -> None:
        while not self.events.empty():
            self.events.get_nowait()

    def wait_for(self, topic: str, since: float, timeout: float = 10) -> float:
        """The wall time of the first ``change`` naming ``topic`` (or a resync) received after ``since``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"no change event naming {topic} within {timeout} s")
            try:
                t, topics = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if t >= since and (topic in topics or "resync" in topics):
                return t

    def close(self) -> None:
        self._stop = True


async def sse_events(lines: Any) -> Any:
    """(event, data) pairs of a server-sent event stream."""
    ev, data = "message", []
    async for line in lines:
        if not line:
            if data or ev != "message":
                yield ev, "\n".join(data)
            ev, data = "message", []
        elif line.startswith("event:"):
            ev = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())


def append_event(journal: Path, text: str) -> float:
    """Append a ``note`` event to a run journal as the daemon appends (one write, fsync); the wall time before it."""
    line = json.dumps({"ev": "note", "text": text, "at": datetime.now(UTC).isoformat(timespec="milliseconds")})
    t = time.time()
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return t


def bench_events(console: Console, root: Path, run_id: str, n: int, gap: float) -> dict[str, Any]:
    journal = root / ".ambient" / "runs" / f"{run_id}.jsonl"
    sse = SseListener(console)
    time.sleep(gap)
    lat: list[float] = []
    try:
        for k in range(n):
            time.sleep(gap)
            sse.drain()
            t = append_event(journal, f"bench event {k}")
            lat.append(sse.wait_for(f"run:{run_id}", t) - t)
    finally:
        sse.close()
    return summary(lat)


def bench_browser(console: Console, root: Path, run_id: str, n: int, gap: float) -> dict[str, Any]:
    """The run's page open in Chromium: journal append → a live part of the page swapped."""
    from playwright.sync_api import sync_playwright

    journal = root / ".ambient" / "runs" / f"{run_id}.jsonl"
    lat: list[float] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{console.base}/?token={console.token}")
            response = page.goto(f"{console.base}/runs/{run_id}")
            if response is None or response.status != 200 or page.locator("[data-live]").count() == 0:
                print(f"  /runs/{run_id}: no page with a live part (data-live) yet: skipped")
                return summary([])
            page.wait_for_timeout(500)  # the page's EventSource connects
            page.evaluate(
                """() => {
                    window.__swaps = [];
                    new MutationObserver(() => window.__swaps.push(Date.now())).observe(
                        document.body, {childList: true, subtree: true, characterData: true});
                }"""
            )
            for k in range(n):
                page.wait_for_timeout(gap * 1000)
                page.evaluate("() => { window.__swaps = []; }")
                t = append_event(journal, f"browser event {k}")
                page.wait_for_function("() => window.__swaps.length > 0", timeout=10_000)
                first = page.evaluate("() => window.__swaps[0]") / 1000
                lat.append(first - t)
        finally:
            browser.close()
    return summary(lat)


# ------------------------------------------------------------------------------------------------ (spawn)


def live_parts(html: str) -> list[tuple[set[str], str]]:
    """(topics, fragment) of each live part of a page, as ``app.js`` finds them."""
    out = []
    for m in LIVE_RE.finditer(html):
        frag = FRAGMENT_RE.search(m.group(0))
        if frag:
            out.append((set(m.group(1).split()), frag.group(1)))
    return out


async def run_clients(base: str, token: str, n: int, page: str, refetch: bool, log: Path) -> None:
    """``n`` open pages in one process: ``/events`` each, the page's live parts re-fetched on their topics.

    Prints ``ready N`` once every client is connected; client 0 logs each event's wall time and topics to ``log``.
    """
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=4 * n + 8, max_keepalive_connections=2 * n)
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=None, limits=limits) as client:
        html = (await client.get(page)).text
        parts = live_parts(html)
        connected = 0
        all_in = asyncio.Event()
        sep = "&" if "?" in page else "?"
        out = log.open("a")

        async def one(k: int) -> None:
            nonlocal connected
            async with client.stream("GET", "/events") as r:
                if r.status_code != 200:
                    print(f"client {k}: /events {r.status_code}", flush=True)
                    return
                connected += 1
                if connected == n:
                    all_in.set()
                in_flight: dict[str, asyncio.Task[Any]] = {}
                again: set[str] = set()

                async def fetch(frag: str) -> None:
                    while True:  # as app.js: a change during a fetch means one more fetch after it
                        again.discard(frag)
                        await client.get(f"{page}{sep}fragment={frag}")
                        if frag not in again:
                            return

                async for ev, data in sse_events(r.aiter_lines()):
                    topics = set(json.loads(data).get("topics", [])) if ev == "change" else {"resync"}
                    if k == 0:
                        out.write(json.dumps({"t": time.time(), "topics": sorted(topics)}) + "\n")
                        out.flush()
                    if not refetch:
                        continue
                    for wanted, frag in parts:  # fetches beside the stream, one at a time per part
                        if not ("resync" in topics or wanted & topics):
                            continue
                        busy = in_flight.get(frag)
                        if busy is not None and not busy.done():
                            again.add(frag)
                        else:
                            in_flight[frag] = asyncio.create_task(fetch(frag))

        tasks = [asyncio.create_task(one(k)) for k in range(n)]
        await asyncio.wait_for(all_in.wait(), 60)
        print(f"ready {n} parts={len(parts)}", flush=True)
        await asyncio.gather(*tasks)


@contextmanager
def clients_process(console: Console, n: int, refetch: bool, log: Path) -> Iterator[None]:
    """``n`` live clients in a subprocess (this script's ``--clients-only`` mode), connected inside the block."""
    if n == 0:
        yield
        return
    argv = [PY, __file__, "--clients-only", console.base, "--token", console.token, "--clients", str(n)]
    argv += ["--client-log", str(log)] + ([] if refetch else ["--no-refetch"])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=daemon_env())
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("ready"):
        proc.kill()
        raise RuntimeError(f"the clients did not connect: {line}{proc.stdout.read().decode()[-2000:]}")
    try:
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Daemon:
    """``ambient run`` on the brain (serving, not ``--until-idle``); up once ``daemon_ready`` is logged."""

    def __init__(self, root: Path, log: Path) -> None:
        self.root, self.log = root, log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                daemon_argv(root, "--log-level", "info"),
                env=daemon_env([BENCH]),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 300
        while b"daemon_ready" not in log.read_bytes():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"the daemon did not get ready: {log.read_bytes()[-2000:]!r}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)


def drop_to_spawn(root: Path, name: str, timeout: float = 20) -> tuple[float, float]:
    """Drop a one-item workflow; (wall time of the drop, seconds to its run's first ``accepted`` record).

    New journals are found by listing ``.ambient/runs/`` (only the new one is read: the brain holds thousands).
    """
    from ambient.storage.fsutil import atomic_write

    runs = root / ".ambient" / "runs"
    before = set(os.listdir(runs))
    t = time.time()
    atomic_write(root / "workflows" / f"{name}.yml", foreach_yaml(name, ["x"], "noop", 1))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for fname in set(os.listdir(runs)) - before:
            if f"-{name}-" not in fname:
                continue
            for line in (runs / fname).read_text().splitlines():
                rec = json.loads(line) if line.strip() else {}
                if rec.get("ev") == "accepted":
                    return t, epoch(rec["at"]) - t
        time.sleep(0.002)
    raise RuntimeError(f"{name}: no SPAWN within {timeout} s")


def bench_spawn(
    root: Path,
    base: Path,
    *,
    console_mode: str,
    clients: int,
    drops: int,
    blocks: int,
    gap: float,
    refetch: bool,
    console_nice: int = 0,
) -> dict[str, Any]:
    """Blocks of ``drops`` drops with 0 and ``clients`` live clients, interleaved, on one daemon."""
    cfg = root / "profil" / "ambient.yml"
    original = cfg.read_text()
    port = free_port()
    if console_mode == "daemon":
        cfg.write_text(original + f"web:\n  host: 127.0.0.1\n  port: {port}\n")
    daemon = Daemon(root, base / "spawn-daemon.log")
    beside: Console | None = None
    try:
        if console_mode == "daemon":
            url, token = console_url(root)
            console = Console(url, token)
            # A brain copied to another path has a query store of other folders: the console's first refresh reads
            # every claim again (minutes on 20,000 claims) before it answers.
            deadline = time.monotonic() + 600
            while True:
                try:
                    if httpx.get(url + "/", headers=console.headers, timeout=30).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the daemon's console does not answer on {url}")
                time.sleep(0.1)
        else:
            beside, _ = start_console(root, base / "spawn-web.log", nice=console_nice)
            console = beside
        time.sleep(3.0)  # the daemon's start-up ticks (its first look at every workflow and claim) settle
        tag = f"{int(time.time()) % 100_000:05d}"  # a new workflow name each session (a known one starts no run)
        for w in range(2):  # warm-up drops, not counted (the first run of a daemon is slower)
            drop_to_spawn(root, f"warm-{tag}-{w}")
            time.sleep(gap)
        lat: dict[int, list[float]] = {0: [], clients: []}
        sse_lat: list[float] = []
        k = 0
        for b in range(2 * blocks):
            # ABBA (0, N, N, 0, 0, N, ...): a daemon's drops get slower as runs pile up in the brain, and blocks
            # alternating 0, N, 0, N would put that drift on the clients' side; an even --blocks cancels it.
            n = clients if b % 4 in (1, 2) else 0
            log = base / f"clients-{b}.jsonl"
            log.write_text("")
            with clients_process(console, n, refetch, log):
                drop_times = []
                for _ in range(drops):
                    time.sleep(gap)  # spaced drops: each is an isolated change (a burst is debounced, R-08)
                    t, dt = drop_to_spawn(root, f"drop-{tag}-{k:03d}")
                    lat[n].append(dt)
                    drop_times.append(t)
                    k += 1
                time.sleep(1.0)  # the last drop's events reach the clients
            if n:
                events = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
                for t in drop_times:
                    seen = [
                        e["t"] for e in events if e["t"] >= t and ("runs" in e["topics"] or "resync" in e["topics"])
                    ]
                    if seen:
                        sse_lat.append(min(seen) - t)
            print(f"  block {b}: {n} clients, drop -> SPAWN {fmt(summary(lat[n][-drops:]))}", flush=True)
        s0, s1 = summary(lat[0]), summary(lat[clients])
        return {
            "console": console_mode,
            "console_nice": console_nice,
            "refetch": refetch,
            "no_clients": s0,
            "clients": s1,
            "n_clients": clients,
            "difference_pct": (s1["median_ms"] / s0["median_ms"] - 1) * 100,
            "drop_to_change_with_clients": summary(sse_lat),
        }
    finally:
        if beside is not None:
            beside.stop()
        daemon.stop()
        cfg.write_text(original)


# ------------------------------------------------------------------------------------------------ main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--claims", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=2_000)
    ap.add_argument("--big-items", type=int, default=1_000)
    ap.add_argument("--pending", type=int, default=12)
    ap.add_argument("--requests", type=int, default=30, help="fetches of each page after the first")
    ap.add_argument("--events", type=int, default=20)
    ap.add_argument("--gap", type=float, default=0.3, help="seconds between events / drops")
    ap.add_argument("--drops", type=int, default=10, help="drops per block")
    ap.add_argument("--blocks", type=int, default=4, help="pairs of blocks (ABBA: 0, --clients, --clients, 0...)")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--console", choices=("daemon", "beside"), default="daemon")
    ap.add_argument("--console-nice", type=int, default=0, help="--console beside: the console at this niceness")
    ap.add_argument("--no-refetch", action="store_true", help="clients only listen (no fragment fetches)")
    ap.add_argument("--skip", default="", help="comma list: pages,events,browser,spawn")
    ap.add_argument("--profile", action="store_true", help="cProfile the pages rendered in this process")
    ap.add_argument("--dir", default=None, help="where the temp dir goes")
    ap.add_argument("--brain", default=None, help="a brain bigbrain.py wrote (reused; the run adds workflows to it)")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", default=None)
    # the clients' own process (run by the spawn part)
    ap.add_argument("--clients-only", metavar="BASE_URL", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--token", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--client-log", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.clients_only:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        asyncio.run(
            run_clients(args.clients_only, args.token, args.clients, "/", not args.no_refetch, Path(args.client_log))
        )
        return 0

    skip = set(filter(None, args.skip.split(",")))
    out: dict[str, Any] = {"cores": os.cpu_count(), "load_start": load()}
    print(f"load average {load()} ({os.cpu_count()} cores)")
    with TempDir(args.dir, keep=args.keep) as base:
        if args.brain:
            root = Path(args.brain).resolve()
            brain = load_big_brain(root)
        else:
            root = base / "brain"
            brain = make_big_brain(
                root, claims=args.claims, runs=args.runs, big_items=args.big_items, pending=args.pending
            )
        print(
            f"brain: {brain.claims} claims, {brain.runs} finished runs, a {args.big_items}-item run, "
            f"{len(brain.pending)} pending escalations (written in {brain.seconds:.1f} s) at {root}"
        )
        if args.profile:
            profile_pages(root, brain, 10)
        run_id = brain.running_runs[0]
        if not {"pages", "events", "browser"} <= skip:
            steal = Steal()
            had_store = (root / ".ambient" / "query.sqlite3").exists()
            console, start_s = start_console(root, base / "web.log")
            how = "query store already there" if had_store else "query store built from the files"
            print(f"ambient web: first page answered {start_s:.2f} s after the start ({how}){steal.stop()}")
            out["web_start_s"], out["web_start_built_store"] = start_s, not had_store
            steal = Steal()
            try:
                if "pages" not in skip:
                    r = bench_pages(console, brain, args.requests)
                    out["pages"] = r
                    for key, p in r.items():
                        if p is None:
                            print(f"(pages) {key}: no such page yet (404)")
                            continue
                        server = f"; server (Server-Timing) {fmt(p['server'])}" if p["server"] else ""
                        print(
                            f"(pages) {key} {p['path']} ({p['bytes'] / 1024:.0f} KiB): first {p['first_ms']:.0f} ms; "
                            f"client {fmt(p['client'])}{server} (target <= 200 ms)"
                        )
                    print(f"  load {load()}{steal.stop()}")
                if "events" not in skip:
                    steal = Steal()
                    r = bench_events(console, root, run_id, args.events, args.gap)
                    out["events_sse"] = r
                    print(f"(events) journal append -> SSE change: {fmt(r)} (target median <= 500 ms)")
                    print(f"  load {load()}{steal.stop()}")
                if "browser" not in skip:
                    steal = Steal()
                    r = bench_browser(console, root, run_id, args.events, args.gap)
                    out["events_browser"] = r
                    print(f"(events) journal append -> run page's live part swapped in Chromium: {fmt(r)}")
                    print(f"  load {load()}{steal.stop()}")
            finally:
                console.stop()
        if "spawn" not in skip:
            steal = Steal()
            print(
                f"(spawn) {args.blocks} x ({args.drops} drops without clients, {args.drops} with {args.clients}), "
                f"console {args.console}, clients {'listen only' if args.no_refetch else 're-fetch live parts'}:"
            )
            r = bench_spawn(
                root,
                base,
                console_mode=args.console,
                clients=args.clients,
                drops=args.drops,
                blocks=args.blocks,
                gap=args.gap,
                refetch=not args.no_refetch,
                console_nice=args.console_nice,
            )
            out["spawn"] = r
            print(
                f"(spawn) drop -> first SPAWN: 0 clients {fmt(r['no_clients'])}; {args.clients} clients "
                f"{fmt(r['clients'])}: {r['difference_pct']:+.1f} % (target < 10 %)"
            )
            print(f"  drop -> SSE change naming runs, with the clients: {fmt(r['drop_to_change_with_clients'])}")
            print(f"  load {load()}{steal.stop()}")
    out["load_end"] = load()
    print(f"load average {load()}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
