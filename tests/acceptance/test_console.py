"""docs/console.md as a person meets it: the token replaced while consoles serve the brain (``ambient web`` and the
daemon's), every sign-in made with the old token refused by each of them, and ``ambient web --url`` telling the
truth while several consoles come and go. ``ambient`` runs as subprocesses; the browser is an HTTP client that
opens the printed URL and keeps its cookie, as a browser does."""

from __future__ import annotations

import re
import subprocess
from urllib.parse import urlsplit

import httpx
import pytest

from tests.acceptance.harness import Brain, Result, wait
from tests.web.conftest import Console, start_console

_URL = re.compile(r"ambient console: (https?://\S+)")


def _sign_in(url: str) -> dict[str, str]:
    """Open a printed URL (token included) as a browser does: the sign-in cookie it sets."""
    res = httpx.get(url, follow_redirects=False, timeout=20)
    assert res.status_code == 303, (res.status_code, res.text[:200])
    return dict(res.cookies)


def _base(url: str) -> str:
    """A printed URL without its token: the console's secret path (``http://127.0.0.1:P/c/<hex>``)."""
    return url.split("/?", 1)[0].rstrip("/")


def _origin(url: str) -> str:
    where = urlsplit(url)
    return f"{where.scheme}://{where.netloc}"


def _status(base: str, cookies: dict[str, str]) -> int:
    """What a page of the console answers to a cookie sent as a header (as ``curl -H "Cookie: ..."`` does: to any
    path, whatever the path the cookie was set for)."""
    header = "; ".join(f"{k}={v}" for k, v in cookies.items())
    return httpx.get(base + "/", headers={"Cookie": header}, timeout=20).status_code


def _rotate(brain: Brain) -> Result:
    """``ambient web --new-token`` while a console serves the brain: it must say so and return, not serve."""
    try:
        return brain.cli("web", "--new-token", "--port", "0", timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("ambient web --new-token started a second console beside the running one instead of returning")


def test_new_token_while_a_console_serves_rotates_its_token_and_refuses_the_old_signins(brain: Brain) -> None:
    console = start_console(brain)
    try:
        old = console.cookies()
        assert _status(console.base, old) == 200
        res = _rotate(brain)
        assert res.rc == 0, res
        printed = _URL.findall(res.out)
        assert len(printed) == 1 and _origin(printed[0]) == console.origin, res.out  # the running console's URL
        assert "token" in res.out.lower() and console.token not in res.out
        new_url = printed[0]
        new_token = new_url.rsplit("token=", 1)[1]
        assert new_token != console.token
        assert console.proc.poll() is None  # still serving: it took the new token, nothing was started beside it
        # Every sign-in made with the old token is refused, on the old secret path and on the new one.
        assert _status(console.base, old) == 401
        assert _status(_base(new_url), old) == 401
        # The old token opens nothing any more; the new one does, on the same console.
        assert httpx.get(console.url, follow_redirects=False, timeout=20).status_code == 401
        fresh = _sign_in(new_url)
        assert _status(_base(new_url), fresh) == 200
        assert brain.ok("web", "--url").out.strip() == new_url
    finally:
        assert console.stop() == 0


def test_a_signin_made_with_the_old_token_opens_no_console_of_the_brain(brain: Brain) -> None:
    """The old console, still running when another rotates the token, signs nobody in with the old token; a
    console started after the rotation knows no sign-in of the old token (they share the sign-ins' file)."""
    first = start_console(brain)
    second: Console | None = None
    try:
        before = first.cookies()
        assert _rotate(brain).rc == 0
        second = start_console(brain)
        assert second.token != first.token
        assert httpx.get(first.url, follow_redirects=False, timeout=20).status_code == 401  # the old token's URL
        assert _status(second.base, before) == 401
        assert _status(first.base, before) == 401
        assert _status(second.base.replace(second.origin, first.origin), before) == 401
        # A sign-in of the new token opens both (the sign-ins are the brain's, not one console's).
        now = _sign_in(second.url)
        assert _status(second.base.replace(second.origin, first.origin), now) == 200
    finally:
        if second is not None:
            assert second.stop() == 0
        assert first.stop() == 0


def test_web_url_still_names_a_running_console_after_another_one_stops(brain: Brain) -> None:
    first = start_console(brain)
    try:
        second = start_console(brain)
        assert brain.ok("web", "--url").out.strip().startswith(second.origin + "/")
        assert second.stop() == 0
        res = brain.cli("web", "--url")
        assert res.rc == 0, res  # the first console still serves: --url says so
        assert res.out.strip() == first.url
        assert httpx.get(res.out.strip(), follow_redirects=True, timeout=20).status_code == 200
    finally:
        assert first.stop() == 0
    res = brain.cli("web", "--url")
    assert res.rc == 1 and "no console serves this brain now" in res.err


def test_the_daemon_hosted_console_takes_a_new_token_without_a_restart(brain: Brain) -> None:
    brain.config("web:\n  port: 0\n")
    with brain.daemon() as daemon:
        [served] = daemon.wait_log("web_console_serving")
        url = brain.ok("web", "--url").out.strip()
        old = _sign_in(url)
        assert _status(_base(url), old) == 200
        res = _rotate(brain)
        assert res.rc == 0, res
        [new_url] = _URL.findall(res.out)
        assert new_url.startswith(served["url"]) and new_url != url
        assert brain.ok("web", "--url").out.strip() == new_url
        assert _status(_base(url), old) == 401
        assert _status(_base(new_url), old) == 401
        assert httpx.get(url, follow_redirects=False, timeout=20).status_code == 401
        assert _status(_base(new_url), _sign_in(new_url)) == 200
        assert daemon.stop() == 0
    assert wait(lambda: brain.cli("web", "--url").rc == 1, "--url to say no console serves once the daemon stopped")
