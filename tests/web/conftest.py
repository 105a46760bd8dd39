"""The web console as a person meets it: ``ambient web`` as a real process on 127.0.0.1 (port 0, the URL it prints),
httpx for what the HTTP layer promises, and a real browser (Playwright driving the distribution's Chromium,
``/usr/bin/chromium``; never a downloaded one) for what a person sees and clicks.

Screenshots of every page a browser test opens go to ``$AMBIENT_SCREENSHOTS`` or ``tests/web/.screenshots/``
(git-ignored): test artifacts, to look at. Without Chromium the browser tests skip, except under ``CI=true``
where they fail (``.ci/run`` installs it).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.acceptance.harness import AMBIENT, Brain, clean_env, wait

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: How long a click or a wait of the browser may take: Playwright's 30 s default, doubled, since the suite runs on
#: every core at once (pytest -n auto) on machines shared with other work.
BROWSER_WAIT_MS = 60_000
SCREENSHOTS = Path(os.environ.get("AMBIENT_SCREENSHOTS") or Path(__file__).resolve().parent / ".screenshots")
_URL = re.compile(r"ambient console: (https?://\S+)")


@dataclass
class Console:
    """A running ``ambient web``: its process, the URL it printed (with the token) and what it said."""

    proc: subprocess.Popen[str]
    url: str
    lines: list[str] = field(default_factory=list)
    pump: threading.Thread | None = None
    signin: dict[str, str] | None = None

    @property
    def base(self) -> str:
        """``http://127.0.0.1:PORT/c/<secret>``: the console's pages are under it (no slash, no token)."""
        return self.url.split("/?", 1)[0].rstrip("/")

    @property
    def root(self) -> str:
        """The console's secret path (``/c/<secret>``), which its links and redirects start with."""
        return urlsplit(self.base).path

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:PORT``: what the console's own pages send as ``Origin``."""
        where = urlsplit(self.url)
        return f"{where.scheme}://{where.netloc}"

    @property
    def token(self) -> str:
        return self.url.rsplit("token=", 1)[1]

    @property
    def port(self) -> int:
        port = urlsplit(self.url).port
        assert port is not None
        return port

    def cookies(self) -> dict[str, str]:
        """The cookie a browser gets by opening the printed URL (opened once per console, then reused)."""
        if self.signin is None:
            res = httpx.get(self.url, follow_redirects=False, timeout=20)
            assert res.status_code == 303, res
            self.signin = dict(res.cookies)
        return self.signin

    def csrf(self) -> str:
        """The CSRF secret of that sign-in, as every page carries it (``<meta name="csrf-token">``)."""
        page = httpx.get(self.base + "/", cookies=self.cookies(), timeout=20).text
        marker = '<meta name="csrf-token" content="'
        start = page.index(marker) + len(marker)
        return page[start : page.index('"', start)]

    def stop(self, sig: int = signal.SIGINT, timeout: float = 15) -> int:
        """Signal it (SIGINT, as Ctrl-C does) and wait; killed if it does not stop in time (the test then fails)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=timeout)
            raise
        finally:
            if self.pump is not None:
                self.pump.join(timeout)
            if self.proc.stdout is not None:
                self.proc.stdout.close()


def start_console(brain: Brain, *args: str, env: dict[str, str] | None = None) -> Console:
    """``ambient --brain B web --port 0 ARGS``, once it printed its URL."""
    proc = subprocess.Popen(
        [*AMBIENT, "--brain", str(brain.root), "web", "--port", "0", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env({**brain.env, **(env or {})}),
        start_new_session=True,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    stdout = proc.stdout

    def pump() -> None:  # the console's output, read as it comes (a full pipe would stall it)
        for line in stdout:
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()

    def printed() -> str | None:
        if proc.poll() is not None:
            raise AssertionError(f"ambient web exited ({proc.returncode}):\n" + "\n".join(lines))
        found = next((m.group(1) for m in map(_URL.search, lines) if m), None)
        return found

    try:
        url: str = wait(printed, "ambient web to print its URL")
    except BaseException:
        Console(proc, "", lines, reader).stop()
        raise
    return Console(proc, url, lines, reader)


@pytest.fixture
def brain(tmp_path: Path) -> Brain:
    """``ambient init --no-example``."""
    return Brain.init(tmp_path / "brain", "--no-example")


@pytest.fixture
def console(brain: Brain) -> Iterator[Console]:
    """``ambient web`` on ``brain``, stopped (SIGINT) at the end."""
    c = start_console(brain)
    try:
        yield c
    finally:
        c.stop()


# ---------------------------------------------------------------- the browser


def _browser_missing() -> None:
    why = f"no Chromium at {CHROMIUM} (apt-get install chromium chromium-driver)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why}: the browser tests must run in CI")
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium driven by Playwright (sync API), one per test module: Playwright's sync API keeps an event loop
    marked running in this thread while it is open, which would break the async tests of later modules."""
    if not CHROMIUM.exists():
        _browser_missing()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _browser_missing()
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def open_console(browser: Any, console: Console) -> Iterator[Callable[..., Any]]:
    """Factory: a page opened with the console's token URL (then on the cookie), at ``path``; errors on the
    page's console are collected on ``page.errors``."""
    contexts: list[Any] = []

    def _open(path: str = "/", *, width: int = 1280, height: int = 900, dark: bool = False, js: bool = True) -> Any:
        ctx = browser.new_context(
            viewport={"width": width, "height": height},
            color_scheme="dark" if dark else "light",
            java_script_enabled=js,
        )
        contexts.append(ctx)
        ctx.set_default_timeout(BROWSER_WAIT_MS)
        page = ctx.new_page()
        page.errors = []
        page.on("pageerror", lambda exc: page.errors.append(str(exc)))
        page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
        page.goto(console.url)
        if path != "/":
            page.goto(console.base + path)
        return page

    yield _open
    for ctx in contexts:
        ctx.close()


def screenshot(page: Any, name: str) -> Path:
    """Save a full-page screenshot as ``<name>.png`` under the screenshots folder (a test artifact)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


# ---------------------------------------------------------------- an agent that asks the person


#: Asks its question (``ESCALATE``, options retry/skip) on its first attempt; answered ``retry``, it is run again
#: and succeeds.
ASKER = """
    import json, os, sys
    json.load(sys.stdin)
    if os.environ["AMBIENT_ATTEMPT"] == "1":
        print(json.dumps({"signal": "ESCALATE", "question": os.environ.get("ASK", "Deploy now?"),
                          "options": ["retry", "skip"]}))
    else:
        print(json.dumps({"status": "ok"}))
"""


def asking_agent(brain: Brain, question: str) -> None:
    """The agent ``asker`` (:data:`ASKER`) asking ``question``."""
    brain.write("bin/asker.py", "import os\nos.environ.setdefault('ASK', " + repr(question) + ")\n")
    code = brain.read("bin/asker.py") + ASKER.replace("\n    ", "\n")
    brain.write("bin/asker.py", code)
    from tests.acceptance.harness import agent_md

    brain.write("agents/asker.md", agent_md("asker", ["{{python}}", "bin/asker.py"]))


def ask_workflow(brain: Brain, name: str = "ask", items: tuple[str, ...] = ("eu-1",)) -> None:
    """A for_each of ``asker`` over ``items`` (the daemon starts it when it sees the file)."""
    from tests.acceptance.harness import for_each

    brain.workflow(name, for_each(name, "asker", list(items)))
