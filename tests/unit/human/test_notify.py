"""Notifications through apprise's real code against local HTTP servers; the retry outbox (R-10, S-06, S-09)."""

from __future__ import annotations

import asyncio
import html
import io
import json
import random
import re
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from apprise.plugins.telegram import NotifyTelegram
from hypothesis import given
from hypothesis import strategies as st

from ambient.cli import main
from ambient.core.clock import SystemClock
from ambient.core.errors import InputError
from ambient.core.redact import SecretRegistry
from ambient.human.messages import (
    TELEGRAM_MAX_CHARS,
    Message,
    clean_text,
    cut_text,
    escalation_message,
    format_escalation,
    text_length,
)
from ambient.human.notify import (
    AppriseNotifier,
    CompositeNotifier,
    DeliveryError,
    SendReport,
    TargetResult,
    notify_urls_from,
)
from ambient.human.outbox import Outbox, RetryPolicy, drain, next_attempt_at, run_outbox
from ambient.storage.paths import BrainPaths
from tests.conftest import async_wait_until, debug_log_buffer

TOKEN = "5550001234:AAEcanaryZZcanaryZZcanaryZZcanary12"  # the secret canary (S-06)
T0 = datetime(2026, 11, 3, 12, 0, tzinfo=UTC)
EVIL = '<a href="https://evil.example/approve">Approve now</a> '


# --------------------------------------------------------------------------------------------- fake server


class FakeServer:
    """A loopback HTTP server recording POSTs, answering with scripted statuses (then 200)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, Any, int]] = []
        self.script: list[tuple[str, int]] = []  # (path prefix, status), used once each, in order
        self.cond = threading.Condition()
        self.release = threading.Event()  # frees handlers of /slow paths
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                if self.path.startswith("/slow"):
                    server.release.wait(10)
                with server.cond:
                    status = server.next_status(self.path)
                    server.requests.append((self.path, body, status))
                    server.cond.notify_all()
                payload: dict[str, Any] = {"ok": status == 200, "result": {"message_id": len(server.requests)}}
                if status == 429:
                    payload = {"ok": False, "error_code": 429, "description": "Too Many Requests: retry after 1"}
                elif status != 200:
                    payload = {"ok": False, "error_code": status, "description": "Internal Server Error"}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def respond(self, *statuses: int, path: str = "/") -> None:
        """Answer the next requests whose path starts with ``path`` with these statuses."""
        with self.cond:
            self.script.extend((path, s) for s in statuses)

    def next_status(self, path: str) -> int:
        for i, (prefix, status) in enumerate(self.script):
            if path.startswith(prefix):
                del self.script[i]
                return status
        return 200

    def wait_for(self, count: int, timeout: float = 10.0) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: len(self.requests) >= count, timeout)

    @property
    def delivered(self) -> list[tuple[str, Any, int]]:
        return [r for r in self.requests if r[2] == 200]


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    """A running fake server on 127.0.0.1."""
    srv = FakeServer()
    srv.thread.start()
    yield srv
    srv.release.set()
    srv.httpd.shutdown()
    srv.httpd.server_close()


@pytest.fixture
def tg(fake: FakeServer, monkeypatch: pytest.MonkeyPatch) -> FakeServer:
    """The fake server as the Telegram Bot API for apprise's Telegram plugin (RELIABILITY finding 7)."""
    monkeypatch.setattr(NotifyTelegram, "notify_url", f"http://127.0.0.1:{fake.port}/bot")
    return fake


@pytest.fixture
def logbuf() -> Iterator[io.StringIO]:
    """All logging at DEBUG into a buffer (JSON lines), with the canary registered; restored afterwards."""
    with debug_log_buffer(TOKEN) as buf:
        yield buf


def _no_canary_in_files(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            assert TOKEN not in path.read_text(errors="replace"), path


def _message(question: str = "The summariser failed 3 times: timeout.") -> Message:
    return escalation_message(
        escalation_id="e-abc123",
        what="item failed",
        question=question,
        options=["retry", "skip", "abort"],
        workflow="weekly-review",
        item="notes/a.md",
        step="summarise",
        agent="writer",
    )


# --------------------------------------------------------------------------------------------- formatting


class TestFormat:
    def test_escalation_is_readable(self) -> None:
        """The body says what happened, where, the numbered options and the exact answer command."""
        title, body = format_escalation(
            escalation_id="e-abc123",
            what="item failed",
            question="Timeout after 120 s.",
            options=["retry", "skip", "abort"],
            workflow="weekly-review",
            item="notes/a.md",
        )
        assert title == "Decision needed: item failed"
        assert "Workflow: weekly-review" in body and "Item: notes/a.md" in body
        assert "1. retry\n2. skip\n3. abort" in body
        assert "ambient decide e-abc123 retry" in body and "Ref: e-abc123" in body
        assert "button" not in body

    def test_buttons_mentioned_when_enabled(self) -> None:
        """With Telegram buttons on, the message says the person can tap one."""
        _, body = format_escalation(
            escalation_id="e-1", what="gate", question="ok?", options=["approve", "reject"], telegram_buttons=True
        )
        assert "tap one of the buttons under this message in Telegram" in body

    def test_options_with_spaces_are_quoted(self) -> None:
        """The answer command is shell-quoted."""
        _, body = format_escalation(escalation_id="e-1", what="x", question="q", options=["retry later"])
        assert "ambient decide e-1 'retry later'" in body

    def test_long_agent_text_is_cut_but_instructions_survive(self) -> None:
        """S-09: 5000 characters of agent text are cut so the message fits 4096; options and answer stay."""
        title, body = format_escalation(
            escalation_id="e-abc123", what="x", question=EVIL + "y" * 5000, options=["retry", "skip"]
        )
        assert text_length(title) + 2 + text_length(body) <= TELEGRAM_MAX_CHARS
        assert "[cut:" in body and "2. skip" in body and "ambient decide e-abc123" in body
        assert body.endswith("Ref: e-abc123")  # the end of the message is never what gets cut
        assert EVIL.strip() in body  # kept as literal text; notifiers never render it

    @given(
        what=st.text(max_size=300),
        question=st.text(max_size=6000),
        options=st.lists(st.text(min_size=1, max_size=150), min_size=1, max_size=8),
        workflow=st.text(max_size=300),
    )
    def test_always_fits_and_keeps_the_answer(
        self, what: str, question: str, options: list[str], workflow: str
    ) -> None:
        """Whatever the agent wrote, the message fits 4096 and still ends with how to answer."""
        title, body = format_escalation(
            escalation_id="e-1", what=what, question=question, options=options, workflow=workflow
        )
        assert text_length(title) + 2 + text_length(body) <= TELEGRAM_MAX_CHARS
        assert "ambient decide e-1 OPTION" in body and body.endswith("Ref: e-1")

    def test_astral_characters_count_double(self) -> None:
        """Cutting counts UTF-16 units, as Telegram does, so emoji-heavy text still fits."""
        text = cut_text("😀" * 3000, 4096)
        assert text_length(text) <= 4096

    def test_control_and_bidi_characters_removed(self) -> None:
        """Agent text loses control and bidi-override characters (no visual spoofing)."""
        assert clean_text("ok\x00\x1b[31m\u202eevorppa\r\nnext") == "ok[31mevorppa\nnext"

    def test_needs_options(self) -> None:
        """An escalation without options is a programming error."""
        with pytest.raises(ValueError, match="at least one option"):
            format_escalation(escalation_id="e-1", what="x", question="q", options=[])

    def test_dedupe_id_defaults(self) -> None:
        """An escalation's dedupe id comes from its id; other messages from their content."""
        assert _message().dedupe_id == "escalation-e-abc123"
        a, b = Message(title="t", body="b"), Message(title="t", body="b")
        assert a.dedupe_id == b.dedupe_id != Message(title="t", body="c").dedupe_id
        assert a.silent and not _message().silent


# --------------------------------------------------------------------------------------------- backoff


class TestBackoff:
    @pytest.mark.parametrize(("attempts", "ceiling"), [(1, 5), (2, 10), (3, 20), (7, 320), (8, 600), (50, 600)])
    def test_ceiling(self, attempts: int, ceiling: float) -> None:
        """The delay's ceiling doubles per attempt up to the cap."""

        class Top:
            def uniform(self, a: float, b: float) -> float:
                return b

        at = next_attempt_at(attempts, T0, timedelta(seconds=5), timedelta(minutes=10), Top())
        assert at == T0 + timedelta(seconds=ceiling)

    @given(attempts=st.integers(min_value=0, max_value=10_000), seed=st.integers(min_value=0, max_value=2**32))
    def test_full_jitter_is_bounded(self, attempts: int, seed: int) -> None:
        """Any attempt count gives a time between now and now + cap (full jitter)."""
        cap = timedelta(minutes=15)
        at = next_attempt_at(attempts, T0, timedelta(seconds=5), cap, random.Random(seed))
        assert T0 <= at <= T0 + cap


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


# --------------------------------------------------------------------------------------------- outbox


class TestOutbox:
    async def test_retried_with_backoff_and_survives_restart(
        self, tg: FakeServer, tmp_path: Path, logbuf: io.StringIO
    ) -> None:
        """R-10: 500 then 429, then recovery: retried with backoff, delivered once, across a restart."""
        tg.respond(500, 429)
        rng = random.Random(7)
        outbox = Outbox(tmp_path / "outbox")
        entry = outbox.put(_message(), T0)
        assert (tmp_path / "outbox" / "escalation-e-abc123.json").is_file()  # on disk before any send

        notifier = AppriseNotifier([f"tgram://{TOKEN}/4242"], registry=SecretRegistry([TOKEN]))
        report = await drain(outbox, notifier, T0, rng=rng)
        assert report.failed == [entry.id] and report.sent == []
        first = outbox.get(entry.id)
        assert first is not None and first.attempts == 1 and "error=500" in (first.last_error or "")
        assert T0 < first.next_at <= T0 + timedelta(seconds=5)

        # Not due yet: nothing is sent.
        report = await drain(outbox, notifier, first.next_at - timedelta(milliseconds=1), rng=rng)
        assert report.failed == report.sent == [] and len(tg.requests) == 1

        report = await drain(outbox, notifier, first.next_at, rng=rng)
        second = outbox.get(entry.id)
        assert report.failed == [entry.id] and second is not None and second.attempts == 2
        assert first.next_at < second.next_at <= first.next_at + timedelta(seconds=10)

        # Restart: new objects on the same directory.
        outbox2 = Outbox(tmp_path / "outbox")
        notifier2 = AppriseNotifier([f"tgram://{TOKEN}/4242"], registry=SecretRegistry([TOKEN]))
        assert outbox2.next_due() == second.next_at
        report = await drain(outbox2, notifier2, second.next_at, rng=rng)
        assert report.sent == [entry.id] and report.next_due is None
        assert outbox2.entries() == []
        assert [r[2] for r in tg.requests] == [500, 429, 200]  # delivered exactly once
        assert "Decision needed" in tg.delivered[0][1]["text"]
        assert TOKEN not in logbuf.getvalue()
        assert "notification_retry" in logbuf.getvalue()
        _no_canary_in_files(tmp_path)

    async def test_escalations_are_never_dropped(self, fake: FakeServer, tmp_path: Path) -> None:
        """An escalation failing for days is still retried; an info message is parked (not deleted)."""
        fake.respond(500, 500)
        outbox = Outbox(tmp_path / "outbox")
        esc = outbox.put(_message(), T0)
        info = outbox.put(Message(title="Run finished", body="3 items done"), T0)
        notifier = AppriseNotifier([f"json://127.0.0.1:{fake.port}/hook"])
        later = T0 + timedelta(days=3)
        report = await drain(outbox, notifier, later, policy=RetryPolicy(give_up_after=timedelta(hours=24)))
        assert report.failed == [esc.id] and report.parked == [info.id]
        assert outbox.get(esc.id) is not None and outbox.get(info.id) is None
        assert (tmp_path / "outbox" / "expired" / f"{info.id}.json").is_file()
        report = await drain(outbox, notifier, later + timedelta(hours=1))
        assert report.sent == [esc.id]

    async def test_delivered_targets_are_not_sent_again(self, fake: FakeServer, tg: FakeServer, tmp_path: Path) -> None:
        """When one of two URLs fails, the retry goes only to the one that failed."""
        fake.respond(500, path="/hook")
        outbox = Outbox(tmp_path / "outbox")
        entry = outbox.put(_message(), T0)
        urls = [f"tgram://{TOKEN}/4242", f"json://127.0.0.1:{fake.port}/hook"]
        await drain(outbox, AppriseNotifier(urls), T0)
        pending = outbox.get(entry.id)
        assert pending is not None and len(pending.delivered) == 1
        await drain(outbox, AppriseNotifier(urls), pending.next_at)
        assert outbox.get(entry.id) is None
        assert [p.split("/")[-1] for p, _, _ in fake.requests].count("sendMessage") == 1
        assert len(fake.requests) == 3 and fake.requests[2][0] == "/hook"

    def test_put_is_deduplicated(self, tmp_path: Path) -> None:
        """Queueing the same message twice while it is pending keeps one entry."""
        outbox = Outbox(tmp_path / "outbox")
        a = outbox.put(_message(), T0)
        b = outbox.put(_message(), T0 + timedelta(minutes=5))
        assert a == b and len(outbox.entries()) == 1

    def test_odd_ids_get_safe_file_names(self, tmp_path: Path) -> None:
        """A dedupe id that is not a safe file name is hashed, never used as a path."""
        outbox = Outbox(tmp_path / "outbox")
        entry = outbox.put(Message(title="t", body="b", dedupe_id="../../etc/passwd"), T0)
        names = [p.name for p in (tmp_path / "outbox").iterdir()]
        assert len(names) == 1 and names[0].startswith("h-")
        assert outbox.get(entry.id) == entry

    async def test_notifier_crash_is_a_failed_attempt(self, tmp_path: Path) -> None:
        """A notifier raising an unexpected error counts as a failed attempt; the loop goes on."""

        class Broken:
            async def send(self, message: Message, *, skip: frozenset[str] = frozenset()) -> SendReport:
                raise RuntimeError(f"boom {TOKEN}")

        outbox = Outbox(tmp_path / "outbox")
        entry = outbox.put(_message(), T0)
        report = await drain(outbox, Broken(), T0)
        stored = outbox.get(entry.id)
        assert report.failed == [entry.id] and stored is not None
        assert "RuntimeError" in (stored.last_error or "") and TOKEN not in (stored.last_error or "")

    async def test_run_outbox_delivers_on_wake(self, fake: FakeServer, tmp_path: Path) -> None:
        """The drain loop sends a new message as soon as it is woken, and stops on request."""
        outbox = Outbox(tmp_path / "outbox")
        stop, wake = asyncio.Event(), asyncio.Event()
        notifier = AppriseNotifier([f"json://127.0.0.1:{fake.port}/hook"])
        task = asyncio.create_task(run_outbox(outbox, notifier, clock=SystemClock(), stop=stop, wake=wake))
        outbox.put(_message(), SystemClock().now())
        wake.set()
        assert await async_wait_until(lambda: len(fake.delivered) == 1 and not outbox.entries(), timeout=10)
        stop.set()
        await asyncio.wait_for(task, 5)

    async def test_composite_merges_reports(self) -> None:
        """A composite notifier reports every target and fails if any of its notifiers failed."""

        class Fixed:
            def __init__(self, key: str, ok: bool) -> None:
                self.key, self.ok = key, ok

            async def send(self, message: Message, *, skip: frozenset[str] = frozenset()) -> SendReport:
                report = SendReport((TargetResult(self.key, self.key, self.ok),))
                if not self.ok:
                    raise DeliveryError(report)
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


# --------------------------------------------------------------------------------------------- CLI


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
