"""The console in a real browser, as a person uses it: a fresh brain, the daemon as a real process, an agent that
asks a question; the question appears on the open page without a reload, one click answers it, and the run is
seen resuming and finishing, live. An agent's question made of HTML stays text."""

from __future__ import annotations

from typing import Any

from tests.acceptance.harness import Brain
from tests.web.conftest import Console, ask_workflow, asking_agent, screenshot

XSS = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2"> Deploy eu-1 now?'
LIVE_S = 30_000  # ms: what a live update may take at worst on a loaded CI machine (the median is far below)


def _no_reload_marker(page: Any) -> None:
    page.evaluate("window.sameDocument = true")


def _same_document(page: Any) -> bool:
    return bool(page.evaluate("window.sameDocument === true"))


def test_an_escalation_appears_live_is_answered_by_a_click_and_the_run_finishes_live(
    brain: Brain, console: Console, open_console: Any
) -> None:
    asking_agent(brain, XSS)
    with brain.daemon():
        page = open_console("/")
        page.locator(".stat").first.get_by_text("up").wait_for(timeout=LIVE_S)
        _no_reload_marker(page)
        assert page.locator("#live-status.on").count() == 1 or page.locator("#live-status").wait_for() is None

        ask_workflow(brain)  # the daemon starts it; the agent asks; the page shows the question without reload
        card = page.locator("article.esc").first
        card.wait_for(timeout=LIVE_S)
        assert _same_document(page)
        question = card.locator(".question")
        assert question.inner_text() == XSS  # the HTML is shown as text
        assert card.locator("img").count() == 0 and page.locator("main script").count() == 0
        assert page.evaluate("typeof window.pwned") == "undefined"
        page.locator(".run .text-waiting", has_text="1 waiting").wait_for(timeout=LIVE_S)
        screenshot(page, "overview-escalation-waiting")

        escalations = open_console("/escalations")
        escalations.locator("article.esc").first.wait_for()
        screenshot(escalations, "escalations")
        phone = open_console("/", width=390, height=844)
        assert phone.evaluate("document.documentElement.scrollWidth <= 390")
        screenshot(phone, "overview-phone")

        card.get_by_role("button", name="retry").click()  # a form POST, then back to the overview with a notice
        page.locator(".notice-ok").wait_for(timeout=LIVE_S)
        assert "decided by" in page.locator(".notice-ok").inner_text()
        _no_reload_marker(page)
        page.get_by_text("No escalation waits for an answer.").wait_for(timeout=LIVE_S)
        page.get_by_text("Nothing running").wait_for(timeout=LIVE_S)  # the run resumed and finished, seen live
        assert _same_document(page)
        screenshot(page, "overview-after-answer")
        assert page.evaluate("typeof window.pwned") == "undefined"
        assert not [e for e in page.errors if "pwned" in e or "Refused" in e]

    [record] = brain.finished("ask")
    assert record["outcome"] == "success"
    [answered] = brain.escalations(all=True)
    assert (answered["decision"], answered["channel"]) == ("retry", "web")


def test_a_refused_answer_reads_like_the_cli(brain: Brain, console: Console, open_console: Any) -> None:
    """Answered elsewhere meanwhile (the CLI) while the page still shows it (here without JavaScript, so no live
    update removes the buttons first; the forms work without it): the click changes nothing and says so."""
    asking_agent(brain, "Roll back eu-2?")
    ask_workflow(brain)
    brain.until_idle()
    [esc] = brain.escalations()
    page = open_console("/escalations", js=False)
    card = page.locator(f"article#{esc['id']}")
    card.wait_for()
    brain.ok("decide", esc["id"], "skip")
    card.get_by_role("button", name="retry").click()
    notice = page.locator(".notice-error")
    notice.wait_for()
    assert "already answered" in notice.inner_text() and "skip" in notice.inner_text()
    screenshot(page, "escalations-refused")
    [answered] = brain.escalations(all=True)
    assert (answered["decision"], answered["channel"]) == ("skip", "cli")


def test_a_link_from_another_site_opens_the_console_in_a_browser_holding_its_cookie(
    console: Console, open_console: Any
) -> None:
    """A person taps a link to a run or a question in a notification, a mail or a chat (another site): the browser
    that once opened the token URL shows the page. (With a ``SameSite=Strict`` cookie it got the 401 page: found by
    a new user.)"""
    import http.server
    import threading

    link = f"{console.base}/escalations"

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = f'<!doctype html><a id="go" href="{link}">the question</a>'.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        page = open_console("/")  # the token URL once: the browser now holds the cookie
        page.goto(f"http://localhost:{other.server_address[1]}/")  # another site: localhost is not 127.0.0.1
        page.click("#go")
        page.wait_for_url(link)
        assert page.locator("h1").first.inner_text() == "Escalations", page.content()[:500]
    finally:
        other.shutdown()
        other.server_close()


def _set_hidden(page: Any, hidden: bool) -> None:
    """As the browser does when another tab comes to the front (or this one again): ``document.hidden`` and a
    ``visibilitychange`` event."""
    page.evaluate(
        "(h) => { Object.defineProperty(document, 'hidden', {configurable: true, get: () => h});"
        " document.dispatchEvent(new Event('visibilitychange')); }",
        hidden,
    )


def test_a_hidden_tab_fetches_no_live_part_until_it_is_shown(brain: Brain, console: Console, open_console: Any) -> None:
    """Two tabs of the overview, one behind another: a question arrives; the tab in front shows it live, the one
    behind asks the console for nothing, and shows the question as soon as it comes to the front."""
    asking_agent(brain, "Flush the CDN?")
    front, behind = open_console("/"), open_console("/")
    for page in (front, behind):
        page.locator("#live-status.on").wait_for(timeout=LIVE_S)
    _set_hidden(behind, True)
    fetched: list[str] = []
    behind.on("request", lambda r: fetched.append(r.url) if "fragment=" in r.url else None)
    _no_reload_marker(behind)

    ask_workflow(brain)
    brain.until_idle()
    # Told to both tabs at once; the one in front fetched and swapped its part (a round trip): a fetch by the tab
    # behind would have been sent by then.
    front.locator("article.esc").first.wait_for(timeout=LIVE_S)
    assert fetched == [] and behind.locator("article.esc").count() == 0

    _set_hidden(behind, False)
    behind.locator("article.esc").first.wait_for(timeout=LIVE_S)
    assert fetched and _same_document(behind)
