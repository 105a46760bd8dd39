"""The console hosted by the daemon (``web:`` in profil/ambient.yml): served while ``ambient run`` runs, its URL
from ``ambient web --url``, gone with the daemon; a ``web:`` that would expose it carelessly is refused."""

from __future__ import annotations

import re

import httpx

from tests.acceptance.harness import Brain, wait


def test_the_daemon_hosts_the_console_when_web_is_set(brain: Brain) -> None:
    brain.config("web:\n  port: 0\n")
    with brain.daemon() as daemon:
        [served] = daemon.wait_log("web_console_serving")
        assert "token" not in served["url"]  # the log never carries the token
        url = brain.ok("web", "--url").out.strip()
        assert url.startswith(served["url"] + "?token=")
        with httpx.Client(follow_redirects=True, timeout=10) as http:
            page = http.get(url)
            assert page.status_code == 200
            assert re.search(r'class="dot st-done"></span>\s*up', page.text)
        assert daemon.stop() == 0
    base = url.split("?", 1)[0]
    assert wait(lambda: _refused(base), "the hosted console to stop with the daemon")
    assert not (brain.root / ".ambient" / "web" / "hosted.json").exists()


def _refused(url: str) -> bool:
    try:
        httpx.get(url, timeout=2)
    except httpx.TransportError:
        return True
    return False


def test_a_web_setting_that_exposes_the_console_without_tls_is_an_error(brain: Brain) -> None:
    brain.config("web:\n  host: 0.0.0.0\n")
    res = brain.cli("validate")
    assert res.rc == 1
    assert "profil/ambient.yml" in res.out + res.err and "insecure_bind" in res.out + res.err
