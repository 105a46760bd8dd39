"""The console's locks, over real HTTP against a real ``ambient web``: the token (URL → a sign-in cookie of the secret
path → redirect), 401 without it, the Host check, CSRF on every POST (a forged POST changes nothing), the security
headers, the bind rule (a non-loopback address needs TLS or --insecure-bind) and the token file's mode. The attacks
from another port of the same host are in tests/attacks/test_console_origin.py."""

from __future__ import annotations

import stat

import httpx
import pytest

from tests.acceptance.harness import Brain
from tests.web.conftest import Console, ask_workflow, asking_agent, start_console

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


def _client(console: Console, *, signed_in: bool = True) -> httpx.Client:
    cookies = console.cookies() if signed_in else {}
    headers = {"Origin": console.origin}  # as a browser's POSTs say (the console refuses those that do not)
    return httpx.Client(base_url=console.base, cookies=cookies, headers=headers, follow_redirects=False, timeout=10)


def test_without_the_token_every_page_is_401_and_says_what_to_open(console: Console) -> None:
    with _client(console, signed_in=False) as http:
        for path in ("/", "/escalations", "/events", "/static/app.js", "/?token=wrong"):
            res = http.get(path)
            assert res.status_code == 401, (path, res.status_code)
        assert "ambient web" in res.text and "token" in res.text
        assert http.post("/escalations/esc-aaaaaa/decide", data={"option": "retry"}).status_code == 401
    with httpx.Client(base_url=console.origin, cookies=console.cookies(), timeout=10) as outside:
        for path in ("/", "/escalations", "/static/app.js", "/c/", "/c/x/"):  # outside the secret path: nothing
            res = outside.get(path)
            assert res.status_code == 401 and console.root not in res.text, (path, res.status_code)


def test_the_token_in_the_url_becomes_a_cookie_and_a_redirect_without_it(console: Console) -> None:
    with _client(console, signed_in=False) as http:
        res = http.get(f"/escalations?status=pending&token={console.token}")
        assert res.status_code == 303
        assert res.headers["location"] == f"{console.root}/escalations?status=pending"
        cookie = res.headers["set-cookie"]
        assert cookie.startswith("ambient_signin=") and console.token not in cookie  # a sign-in, not the token
        assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
        assert f"Path={console.root}/;" in cookie  # sent to the console's secret path only, on no other port
        assert "Secure" not in cookie  # plain HTTP on loopback: a Secure cookie would never come back
        page = http.get("/escalations?status=pending")
        assert page.status_code == 200 and "Escalations" in page.text
        bare = http.get(console.origin + console.root)  # typed without its last slash: the cookie's path has it
        assert bare.status_code == 303 and bare.headers["location"] == console.root + "/"
    with httpx.Client(base_url=console.base, headers={"Authorization": f"Bearer {console.token}"}) as bearer:
        assert bearer.get("/").status_code == 200  # a script with the token itself (no cookie: any path)
    with httpx.Client(base_url=console.origin, cookies={"ambient_console": console.token}) as old:
        res = old.get("/")  # an earlier version's cookie (the token itself) is no credential, and is expired
        assert res.status_code == 401
        assert "ambient_console=; Path=/; Max-Age=0" in res.headers["set-cookie"]


def test_a_foreign_host_header_is_refused(console: Console) -> None:
    """DNS rebinding: a page of evil.example resolved to 127.0.0.1 sends ``Host: evil.example``."""
    with _client(console) as http:
        assert http.get("/", headers={"Host": f"evil.example:{console.port}"}).status_code == 400
        assert http.get("/", headers={"Host": f"localhost:{console.port}"}).status_code == 200


def test_every_response_carries_the_security_headers(console: Console) -> None:
    with _client(console) as http, _client(console, signed_in=False) as anonymous:
        for res in (http.get("/"), http.get("/static/app.css"), anonymous.get("/"), http.get("/nowhere")):
            assert res.headers["content-security-policy"] == CSP
            assert res.headers["x-content-type-options"] == "nosniff"
            assert res.headers["referrer-policy"] == "same-origin"
            assert res.headers["x-frame-options"] == "DENY"
        assert http.get("/").headers["cache-control"] == "no-store"
        page = http.get("/").text
        assert "<script>" not in page and "style=" not in page and " on" + "click" not in page


def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(brain: Brain) -> None:
    asking_agent(brain, "Deploy eu-1 now?")
    ask_workflow(brain)
    brain.until_idle()
    [esc] = brain.escalations()
    console = start_console(brain)
    try:
        with _client(console) as http:
            url = f"/escalations/{esc['id']}/decide"
            assert http.post(url, data={"option": "retry"}).status_code == 403
            assert http.post(url, data={"option": "retry", "csrf": "0" * 64}).status_code == 403
            assert http.post(url, data={"option": "retry"}, headers={"X-CSRF-Token": "forged"}).status_code == 403
            assert [e["id"] for e in brain.escalations()] == [esc["id"]]  # still pending: nothing changed

            csrf = _csrf(http.get("/escalations").text)
            res = http.post(url, data={"option": "retry", "note": "from the console", "csrf": csrf, "back": "/"})
            assert res.status_code == 303
            assert res.headers["location"].startswith(f"{console.root}/?notice=")
            again = http.post(url, data={"option": "skip", "csrf": csrf, "back": "//evil.example/"})
            assert again.status_code == 303
            assert again.headers["location"].startswith(f"{console.root}/escalations?notice=")
            assert "level=error" in again.headers["location"]
    finally:
        console.stop()
    [answered] = brain.escalations(all=True)
    assert (answered["decision"], answered["channel"], answered["note"]) == ("retry", "web", "from the console")


def _csrf(page: str) -> str:
    marker = 'name="csrf" value="'
    start = page.index(marker) + len(marker)
    return page[start : page.index('"', start)]


def test_a_non_loopback_bind_needs_tls_or_insecure_bind(brain: Brain) -> None:
    res = brain.cli("web", "--host", "0.0.0.0", "--port", "0")
    assert res.rc == 2
    assert "TLS" in res.err and "--insecure-bind" in res.err
    half = brain.cli("web", "--tls-cert", str(brain.root / "cert.pem"), "--port", "0")
    assert half.rc == 2 and "--tls-key" in half.err
    console = start_console(brain, "--host", "0.0.0.0", "--insecure-bind")
    try:
        warning = "\n".join(console.lines)
        assert "plain HTTP" in warning and "token" in warning
        with httpx.Client(base_url=f"http://127.0.0.1:{console.port}") as http:
            assert http.get("/").status_code == 401
    finally:
        console.stop()


def test_the_token_file_is_private_reused_and_rotated_on_demand(brain: Brain, console: Console) -> None:
    token_file = brain.root / ".ambient" / "web" / "token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
    assert token_file.read_text().strip() == console.token
    console.cookies()  # a browser signs in: kept server-side (a hash of its cookie, its CSRF secret), 0600
    signins = token_file.parent / "signins.json"
    assert stat.S_IMODE(signins.stat().st_mode) == 0o600
    assert console.cookies()["ambient_signin"] not in signins.read_text()
    again = brain.ok("web", "--url").out.strip()
    assert again == console.url  # the console serving now, on its real port (0 asked for any free one)
    rotated = brain.ok("web", "--url", "--new-token").out.strip()
    assert console.token not in rotated
    assert token_file.read_text().strip() == rotated.rsplit("=", 1)[1]
    assert not signins.exists()  # every browser signs in again, with the new URL
    assert console.root not in rotated  # the secret path moved with the token


def test_a_stopped_console_exits_cleanly_on_sigint_and_sigterm(brain: Brain) -> None:
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        console = start_console(brain)
        with httpx.Client(base_url=console.base, cookies=console.cookies()) as http:
            with http.stream("GET", "/events") as events:  # an open live stream must not hold the server up
                assert events.status_code == 200
                assert console.stop(sig) == 0


@pytest.mark.parametrize("fragment", ["summary", "runs", "escalations", "errors", "breakers"])
def test_each_live_part_of_the_overview_renders_alone(console: Console, fragment: str) -> None:
    with _client(console) as http:
        res = http.get("/", params={"fragment": fragment})
        assert res.status_code == 200 and "<html" not in res.text
        assert http.get("/", params={"fragment": "nope"}).status_code == 400


def test_the_url_is_printed_only_while_a_console_serves(brain: Brain) -> None:
    """``ambient web --url`` once printed a URL on port 8765 when nothing listened there (a new user's finding): it
    names the console serving the brain, and says so when none does."""
    console = start_console(brain)
    assert brain.ok("web", "--url").out.strip() == console.url
    assert console.stop() == 0
    res = brain.cli("web", "--url")
    assert res.rc == 1 and res.out == "", res
    assert "no console serves this brain now" in res.err and "ambient web" in res.err, res
