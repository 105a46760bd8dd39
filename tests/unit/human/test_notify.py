"""Delivery through apprise's real code against local HTTP servers, the configured targets, `ambient notify test`
(S-06, S-09)."""

from __future__ import annotations

import asyncio
import html
import io
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ambient.cli import main
from ambient.core.errors import DeliveryError, InputError
from ambient.core.redact import SecretRegistry
from ambient.human.messages import TELEGRAM_MAX_CHARS, Message
from ambient.human.notify import (
    AppriseNotifier,
    CompositeNotifier,
    SendReport,
    TargetResult,
    delivery_error,
    notify_urls_from,
)
from ambient.storage.paths import BrainPaths
from tests.conftest import debug_log_buffer
from tests.unit.human.conftest import TOKEN, FakeServer
from tests.unit.human.test_messages import EVIL, _message


@pytest.fixture
def logbuf() -> Iterator[io.StringIO]:
    """All logging at DEBUG into a buffer (JSON lines), with the canary registered; restored afterwards."""
    with debug_log_buffer(TOKEN) as buf:
        yield buf


# --------------------------------------------------------------------------------------------- apprise


class TestApprise:
    async def test_json_endpoint_receives_escalation(self, fake: FakeServer) -> None:
        """apprise json:// posts the escalation title and body to the local endpoint."""
        notifier = AppriseNotifier([f"json://127.0.0.1:{fake.port}/hook"])
        report = await notifier.send(_message())
        assert report.ok and len(report.results) == 1
        path, body, _ = fake.requests[0]
        assert path == "/hook"
        assert body["title"] == "Decision needed: item failed"
        assert "ambient decide e-abc123 retry" in body["message"] and "1. retry" in body["message"]
        assert body["type"] == "warning"

    async def test_telegram_plugin_sends_message(self, tg: FakeServer, logbuf: io.StringIO) -> None:
        """apprise's Telegram plugin POSTs /bot<TOKEN>/sendMessage with the chat id and the text."""
        notifier = AppriseNotifier([f"tgram://{TOKEN}/4242"], registry=SecretRegistry([TOKEN]))
        report = await notifier.send(_message())
        assert report.ok
        path, body, _ = tg.requests[0]
        assert path == f"/bot{TOKEN}/sendMessage"
        assert str(body["chat_id"]) == "4242"
        assert "Decision needed: item failed" in body["text"] and "ambient decide e-abc123 retry" in body["text"]
        assert TOKEN not in report.results[0].display and "tgram://" in report.results[0].display
        assert TOKEN not in logbuf.getvalue()

    async def test_agent_html_is_escaped_and_cut(self, tg: FakeServer) -> None:
        """S-09: agent HTML reaches Telegram escaped (never a link), and the visible text fits 4096."""
        notifier = AppriseNotifier([f"tgram://{TOKEN}/4242"])
        await notifier.send(_message(EVIL + "z" * 5000))
        text = tg.requests[0][1]["text"]
        assert tg.requests[0][1]["parse_mode"] == "HTML"
        assert "<a href" not in text and "&lt;a href=" in text
        visible = html.unescape(re.sub(r"</?b>", "", text))
        assert len(visible.encode("utf-16-le")) // 2 <= TELEGRAM_MAX_CHARS
        assert "ambient decide e-abc123" in visible

    async def test_failure_reports_per_url(self, fake: FakeServer, tg: FakeServer) -> None:
        """One failing URL raises DeliveryError whose report says which URL worked and which did not."""
        fake.respond(500, path="/bot")
        urls = [f"tgram://{TOKEN}/4242", f"json://127.0.0.1:{fake.port}/hook"]
        with pytest.raises(DeliveryError) as caught:
            await AppriseNotifier(urls).send(_message())
        report = caught.value.report
        assert [r.ok for r in report.results] == [False, True]
        assert "error=500" in report.results[0].detail
        assert TOKEN not in str(caught.value) and TOKEN not in repr(report)

    async def test_invalid_url_is_reported(self) -> None:
        """A URL apprise does not understand is a failed target, shown redacted."""
        with pytest.raises(DeliveryError) as caught:
            await AppriseNotifier(["nosuchscheme://user:Sup3rSecretPass@host"]).send(_message())
        (result,) = caught.value.report.results
        assert not result.ok and "not a valid apprise URL" in result.detail
        assert "Sup3rSecretPass" not in result.display

    async def test_no_urls(self) -> None:
        """Sending with no URL configured is a DeliveryError, not a silent success."""
        with pytest.raises(DeliveryError, match="no notification URL"):
            await AppriseNotifier([]).send(_message())

    @pytest.mark.slow
    async def test_hung_server_does_not_block_the_loop(self, fake: FakeServer) -> None:
        """A server that never answers gives a failure at the time limit while the loop keeps running."""
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        notifier = AppriseNotifier([f"json://127.0.0.1:{fake.port}/slow"], timeout=0.5)
        await notifier.targets()  # apprise import and plugin scan, off the loop
        ticks = 0
        start = time.monotonic()
        with pytest.raises(DeliveryError):
            await notifier.send(_message())
        elapsed = time.monotonic() - start
        task.cancel()
        assert elapsed < 5
        assert ticks >= 10  # the loop ran while apprise waited in its threads


# --------------------------------------------------------------------------------------------- several notifiers


class TestComposite:
    async def test_composite_merges_reports(self) -> None:
        """A composite notifier reports every target and fails if any of its notifiers failed."""

        class Fixed:
            def __init__(self, key: str, ok: bool) -> None:
                self.key, self.ok = key, ok

            async def send(self, message: Message, *, skip: frozenset[str] = frozenset()) -> SendReport:
                report = SendReport((TargetResult(self.key, self.key, self.ok),))
                if not self.ok:
                    raise delivery_error(report)
                return report

        with pytest.raises(DeliveryError) as caught:
            await CompositeNotifier([Fixed("a", True), Fixed("b", False)]).send(_message())
        assert caught.value.report.delivered == {"a"}


# --------------------------------------------------------------------------------------------- configuration


class TestConfig:
    def _brain(self, tmp_path: Path, yml: str) -> BrainPaths:
        (tmp_path / "profil").mkdir(exist_ok=True)
        (tmp_path / "profil" / "ambient.yml").write_text(yml)
        return BrainPaths(tmp_path)

    def test_urls_from_file(self, tmp_path: Path) -> None:
        """notify.urls in profil/ambient.yml is read; other keys are ignored."""
        paths = self._brain(
            tmp_path, "tick: 5\nnotify:\n  urls:\n    - json://127.0.0.1:1/a\n    - json://127.0.0.1:1/b\n"
        )
        assert notify_urls_from(paths, {}) == ["json://127.0.0.1:1/a", "json://127.0.0.1:1/b"]

    def test_env_overrides_file(self, tmp_path: Path) -> None:
        """$AMBIENT_NOTIFY_URLS (comma or space separated) replaces the file's list."""
        paths = self._brain(tmp_path, "notify:\n  urls: [json://127.0.0.1:1/a]\n")
        env = {"AMBIENT_NOTIFY_URLS": "json://h:1/x, json://h:1/y json://h:1/z"}
        assert notify_urls_from(paths, env) == ["json://h:1/x", "json://h:1/y", "json://h:1/z"]

    def test_no_config(self, tmp_path: Path) -> None:
        """No file and no variable: no URLs."""
        assert notify_urls_from(BrainPaths(tmp_path), {}) == []

    def test_token_placeholder_from_credentials(self, tmp_path: Path) -> None:
        """{telegram_token} is filled from $CREDENTIALS_DIRECTORY/telegram-token and registered as a secret."""
        creds = tmp_path / "creds"
        creds.mkdir()
        (creds / "telegram-token").write_text(TOKEN + "\n")
        paths = self._brain(tmp_path, "notify:\n  urls: ['tgram://{telegram_token}/4242']\n")
        registry = SecretRegistry()
        urls = notify_urls_from(paths, {"CREDENTIALS_DIRECTORY": str(creds)}, registry)
        assert urls == [f"tgram://{TOKEN}/4242"] and TOKEN in registry

    def test_missing_credential_is_explained(self, tmp_path: Path) -> None:
        """A placeholder without the credential file is a clear error naming LoadCredential."""
        paths = self._brain(tmp_path, "notify:\n  urls: ['tgram://{telegram_token}/4242']\n")
        with pytest.raises(InputError, match="LoadCredential=telegram-token"):
            notify_urls_from(paths, {"CREDENTIALS_DIRECTORY": str(tmp_path / "none")})

    def test_bad_urls_type_names_the_line(self, tmp_path: Path) -> None:
        """notify.urls that is not a list of strings is refused with file and line."""
        paths = self._brain(tmp_path, "notify:\n  urls:\n    a: 1\n")
        with pytest.raises(InputError, match=r"ambient.yml:2: notify.urls must be a list"):
            notify_urls_from(paths, {})


class TestCli:
    def test_notify_test_reports_each_url(
        self,
        fake: FakeServer,
        tg: FakeServer,
        make_brain: Any,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """`ambient notify test` says which URLs worked (redacted) and exits 1 when one failed."""
        brain = make_brain()
        creds = brain / "creds"
        creds.mkdir()
        (creds / "telegram-token").write_text(TOKEN)
        (brain / "profil" / "ambient.yml").write_text(
            f"notify:\n  urls:\n    - json://127.0.0.1:{fake.port}/hook\n    - tgram://{{telegram_token}}/4242\n"
        )
        monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
        monkeypatch.delenv("AMBIENT_NOTIFY_URLS", raising=False)
        fake.respond(500, path="/bot")
        code = main(["notify", "test", "--brain", str(brain)])
        out = capsys.readouterr()
        assert code == 1
        assert "1 of 2 notification channel(s) worked" in out.out
        assert re.search(r"ok\s+json://127\.0\.0\.1", out.out) and re.search(r"FAIL\s+tgram://", out.out)
        assert TOKEN not in out.out + out.err

    def test_notify_test_all_ok(self, fake: FakeServer, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """With --url and a working endpoint it exits 0; --json gives machine-readable results."""
        (tmp_path / "agents").mkdir()  # a brain, however empty
        code = main(["notify", "test", "--brain", str(tmp_path), "--json", "--url", f"json://127.0.0.1:{fake.port}/t"])
        data = json.loads(capsys.readouterr().out)
        assert code == 0 and data["ok"] and data["results"][0]["ok"]
        assert fake.requests[0][1]["title"] == "ambient: test notification"

    def test_notify_test_without_urls(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """No configured URL: exit 2 with a message saying where to configure them."""
        monkeypatch.delenv("AMBIENT_NOTIFY_URLS", raising=False)
        (tmp_path / "agents").mkdir()  # a brain, however empty
        assert main(["notify", "test", "--brain", str(tmp_path)]) == 2
        assert "notify.urls" in capsys.readouterr().err
