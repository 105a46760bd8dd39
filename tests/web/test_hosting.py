"""The console hosted by the daemon (``web:`` in profil/ambient.yml): served while ``ambient run`` runs, its URL
from ``ambient web --url``, gone with the daemon; a ``web:`` that would expose it carelessly is refused."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import httpx
import pytest

from tests.acceptance.harness import Brain, wait


def test_the_daemon_hosts_the_console_when_web_is_set(brain: Brain) -> None:
    brain.config("web:\n  port: 0\n")
    with brain.daemon() as daemon:
        [served] = daemon.wait_log("web_console_serving")
        assert "token" not in served["url"] and "/c/" not in served["url"]  # the log: no token, no secret path
        url = brain.ok("web", "--url").out.strip()
        assert url.startswith(served["url"] + "c/") and "/?token=" in url
        with httpx.Client(follow_redirects=True, timeout=10) as http:
            page = http.get(url)
            assert page.status_code == 200
            assert re.search(r'class="dot st-done"></span>\s*up', page.text)
        assert daemon.stop() == 0
    base = url.split("?", 1)[0]
    assert wait(lambda: _refused(base), "the hosted console to stop with the daemon")
    assert not (brain.root / ".ambient" / "web" / "hosted.json").exists()


def _nices(pid: int) -> list[int]:
    """The nice value of each thread of a process (what `ps -L -o nice` shows)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out.append(int((task / "stat").read_text().rsplit(") ", 1)[1].split()[16]))
        except (OSError, IndexError, ValueError):
            continue
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own nice value is Linux's")
def test_the_hosted_console_runs_ten_nice_steps_below_the_daemon(brain: Brain) -> None:
    """The console's threads (its loop, its store thread, its request workers) sit ten nice steps below the daemon,
    as the background writers do: on a busy CPU the kernel prefers the daemon's loop to any browser's request."""
    brain.config("web:\n  port: 0\n")
    with brain.daemon() as daemon:
        daemon.wait_log("web_console_serving")
        url = brain.ok("web", "--url").out.strip()
        base = int(Path(f"/proc/{daemon.pid}/stat").read_text().rsplit(") ", 1)[1].split()[16])
        before = _nices(daemon.pid)
        with httpx.Client(follow_redirects=True, timeout=10) as http:
            for path in ("", "escalations", "workflows", "claims"):
                assert http.get(url.replace("/?", f"/{path}?")).status_code == 200
        after = _nices(daemon.pid)
        assert after.count(base + 10) > before.count(base + 10) >= 1, (base, before, after)
        assert after.count(base) == before.count(base), (base, before, after)  # nothing new at the daemon's own
        assert daemon.stop() == 0


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
