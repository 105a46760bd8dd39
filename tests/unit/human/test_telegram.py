"""Interactive answers from Telegram against a fake Bot API on 127.0.0.1: buttons, presses, offsets, safety."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambient.core.errors import DeliveryError, NotifyError, TelegramError
from ambient.core.redact import SecretRegistry
from ambient.human.escalations import new_nonce
from ambient.human.messages import Message, QuestionCard, escalation_message
from ambient.human.outbox import RetryPolicy
from ambient.human.telegram import (
    CALLBACK_DATA_MAX_BYTES,
    BotApi,
    OnPress,
    PressResult,
    TelegramAnswerer,
    TelegramNotifier,
    TelegramSettings,
    TelegramState,
    TelegramUser,
    callback_data,
    decision_text,
    nonce_matches,
    parse_callback_data,
)
from tests.conftest import async_wait_until, debug_log_buffer

TOKEN = "7770001111:AAGcanaryTGcanaryTGcanaryTGcanary99"  # the secret canary (S-06)
CHAT = 4242
ALICE = {"id": 7, "is_bot": False, "first_name": "Alice", "username": "alice"}
T0 = datetime(2026, 11, 3, 12, 0, tzinfo=UTC)


# --------------------------------------------------------------------------------------------- fake Bot API


class FakeBotApi:
    """Just enough of the Bot API: sendMessage, getUpdates (long poll, offset), answerCallbackQuery, editMessageText."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.updates: list[dict[str, Any]] = []
        self.failures: list[tuple[str, int]] = []  # (method, status) to answer once each
        self.next_update_id = 1000
        self.next_message_id = 1
        self.cond = threading.Condition()
        self.closing = False
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                payload = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                token, _, method = self.path.removeprefix("/bot").partition("/")
                status, body = api.handle(token, method, payload)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def handle(self, token: str, method: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if token != TOKEN:
            return 401, {"ok": False, "error_code": 401, "description": "Unauthorized"}
        with self.cond:
            self.calls.append((method, payload))
            self.cond.notify_all()
            for i, (m, status) in enumerate(self.failures):
                if m == method:
                    del self.failures[i]
                    return status, {"ok": False, "error_code": status, "description": "Bad Gateway"}
        if method == "sendMessage":
            with self.cond:
                mid, self.next_message_id = self.next_message_id, self.next_message_id + 1
            msg = {"message_id": mid, "chat": {"id": payload["chat_id"]}, "text": payload["text"]}
            return 200, {"ok": True, "result": msg}
        if method == "getUpdates":
            offset = payload.get("offset", 0)
            with self.cond:
                # Telegram semantics: an offset confirms (forgets) every update before it.
                self.updates = [u for u in self.updates if u["update_id"] >= offset]
                self.cond.wait_for(lambda: self.updates or self.closing, timeout=payload.get("timeout", 0))
                return 200, {"ok": True, "result": list(self.updates)}
        if method in ("answerCallbackQuery", "editMessageText"):
            return 200, {"ok": True, "result": True}
        if method == "getMe":
            return 200, {"ok": True, "result": {"id": 1, "is_bot": True, "username": "ambient_test_bot"}}
        return 404, {"ok": False, "error_code": 404, "description": "Not Found"}

    def press(self, data: str, *, chat: int = CHAT, user: dict[str, Any] | None = None, text: str = "Decision?") -> int:
        """Queue a button press (a callback_query update); returns its update id."""
        with self.cond:
            uid, self.next_update_id = self.next_update_id, self.next_update_id + 1
            self.updates.append(
                {
                    "update_id": uid,
                    "callback_query": {
                        "id": f"cq{uid}",
                        "from": user or ALICE,
                        "message": {"message_id": 1, "chat": {"id": chat, "type": "private"}, "text": text},
                        "chat_instance": "ci",
                        "data": data,
                    },
                }
            )
            self.cond.notify_all()
        return uid

    def of(self, method: str) -> list[dict[str, Any]]:
        with self.cond:
            return [p for m, p in self.calls if m == method]


@pytest.fixture
def bot() -> Iterator[FakeBotApi]:
    """A running fake Bot API on 127.0.0.1."""
    fake = FakeBotApi()
    fake.thread.start()
    yield fake
    with fake.cond:
        fake.closing = True
        fake.cond.notify_all()
    fake.httpd.shutdown()
    fake.httpd.server_close()


@pytest.fixture
def logbuf() -> Iterator[io.StringIO]:
    """All logging at DEBUG (httpx included) into a buffer; restored afterwards."""
    with debug_log_buffer(TOKEN) as buf:
        yield buf


class Book:
    """The decision side, as the escalation store would do it: checks the nonce, decides once."""

    def __init__(self) -> None:
        self.nonce = new_nonce()
        self.options = ["retry", "skip", "abort"]
        self.decided: tuple[str, str] | None = None
        self.calls: list[tuple[str, int, str, TelegramUser]] = []
        self.called = asyncio.Event()

    async def __call__(self, esc: str, index: int, nonce: str, user: TelegramUser) -> PressResult:
        self.calls.append((esc, index, nonce, user))
        self.called.set()
        if esc != "e-abc123" or not nonce_matches(self.nonce, nonce) or index >= len(self.options):
            return PressResult("invalid", "This button is not valid any more.")
        if self.decided is not None:
            return PressResult("already_decided", f"Already decided: {self.decided[0]} by {self.decided[1]}")
        self.decided = (self.options[index], user.name)
        return PressResult("decided", decision_text(self.options[index], user, T0, verb="chosen"))


def _settings(bot: FakeBotApi, **kw: Any) -> TelegramSettings:
    return TelegramSettings(chat_id=CHAT, api_base=bot.base, poll_timeout=0, **kw)


def _answerer(bot: FakeBotApi, state: Path, on_press: OnPress, **kw: Any) -> TelegramAnswerer:
    settings = _settings(bot, **kw)
    api = BotApi(TOKEN, api_base=settings.api_base, registry=SecretRegistry())
    return TelegramAnswerer(api, settings, state, on_press, policy=RetryPolicy(base=timedelta(milliseconds=10)))


# --------------------------------------------------------------------------------------------- buttons


class TestCallbackData:
    def test_roundtrip_and_size(self) -> None:
        """callback_data carries escalation, option and nonce within 64 bytes, and parses back."""
        nonce = new_nonce()
        data = callback_data("e-abc123", 2, nonce)
        assert len(data.encode()) <= CALLBACK_DATA_MAX_BYTES
        assert parse_callback_data(data) == ("e-abc123", 2, nonce)

    @pytest.mark.parametrize(
        ("esc", "index", "nonce"),
        [("e:1", 0, "a" * 22), ("e 1", 0, "a" * 22), ("e" * 41, 0, "a" * 22), ("e1", 100, "a" * 22), ("e1", 0, "x")],
    )
    def test_refused(self, esc: str, index: int, nonce: str) -> None:
        """Ids with separators, oversized data, bad indexes and short nonces are refused."""
        with pytest.raises(ValueError):
            callback_data(esc, index, nonce)

    @pytest.mark.parametrize("data", ["", "a:b", "e1:x:" + "a" * 22, "e1:1:short", "e1:1:" + "a" * 22 + ":x", "a" * 64])
    def test_foreign_data_is_not_ours(self, data: str) -> None:
        """Anything not shaped like our callback_data parses to None."""
        assert parse_callback_data(data) is None

    @pytest.mark.slow
    @given(esc=st.from_regex(r"[A-Za-z0-9._-]{1,36}", fullmatch=True), index=st.integers(0, 99))
    def test_roundtrip_property(self, esc: str, index: int) -> None:
        """Every valid (id, index, nonce) fits 64 bytes and round-trips."""
        nonce = new_nonce()
        data = callback_data(esc, index, nonce)
        assert len(data.encode()) <= CALLBACK_DATA_MAX_BYTES and parse_callback_data(data) == (esc, index, nonce)

    def test_nonce_check(self) -> None:
        """nonce_matches accepts the exact nonce only."""
        assert nonce_matches("abcdefgh12", "abcdefgh12") and not nonce_matches("abcdefgh12", "abcdefgh13")
        assert not nonce_matches(None, "abcdefgh12")


# --------------------------------------------------------------------------------------------- sending


class TestSend:
    async def test_escalation_with_inline_buttons(self, bot: FakeBotApi) -> None:
        """sendMessage goes to the chat with one button per option and plain text (no parse_mode)."""
        api = BotApi(TOKEN, api_base=bot.base)
        book = Book()
        msg = escalation_message(
            QuestionCard(
                escalation_id="e-abc123",
                what="item failed",
                question='<a href="https://evil">approve</a>',
                options=book.options,
                nonce=book.nonce,
                workflow="wf",
            ),
            telegram_buttons=True,
        )
        report = await TelegramNotifier(api, CHAT).send(msg)
        (sent,) = bot.of("sendMessage")
        assert sent["chat_id"] == CHAT and "parse_mode" not in sent
        assert "Decision needed: item failed" in sent["text"] and "tap one of the buttons" in sent["text"]
        assert '<a href="https://evil">' in sent["text"]  # literal text: Telegram does not render it
        rows = sent["reply_markup"]["inline_keyboard"]
        assert [r[0]["text"] for r in rows] == ["1. retry", "2. skip", "3. abort"]
        assert [parse_callback_data(r[0]["callback_data"]) for r in rows] == [
            ("e-abc123", i, book.nonce) for i in range(3)
        ]
        assert sent["disable_notification"] is False
        assert report.ok and report.results[0].ref == "1"
        await api.aclose()

    async def test_info_messages_are_silent_and_buttonless(self, bot: FakeBotApi) -> None:
        """A result message has no buttons and does not buzz the phone."""
        api = BotApi(TOKEN, api_base=bot.base)
        await TelegramNotifier(api, CHAT).send(Message(title="Run done", body="3 items"))
        (sent,) = bot.of("sendMessage")
        assert "reply_markup" not in sent and sent["disable_notification"] is True
        await api.aclose()

    async def test_refused_send_is_delivery_error_without_token(self, bot: FakeBotApi) -> None:
        """A Bot API error becomes a DeliveryError whose text never holds the token."""
        bot.failures.append(("sendMessage", 502))
        api = BotApi(TOKEN, api_base=bot.base)
        with pytest.raises(DeliveryError) as caught:
            await TelegramNotifier(api, CHAT).send(
                escalation_message(QuestionCard(escalation_id="e-1", what="x", question="q", options=["ok"]))
            )
        assert "502" in str(caught.value) and TOKEN not in str(caught.value)
        await api.aclose()

    async def test_connection_error_hides_token(self, logbuf: io.StringIO) -> None:
        """A refused connection is a TelegramError without the token, and nothing logged holds it."""
        api = BotApi(TOKEN, api_base="http://127.0.0.1:9")
        with pytest.raises(TelegramError) as caught:
            await api.send_escalation(CHAT, "hello")
        assert TOKEN not in str(caught.value) and TOKEN not in repr(api)
        assert TOKEN not in logbuf.getvalue()
        await api.aclose()

    def test_malformed_token_refused(self) -> None:
        """A malformed token is refused without being echoed."""
        with pytest.raises(NotifyError, match="malformed") as caught:
            BotApi("not-a-token-at-all")
        assert "not-a-token" not in str(caught.value)


# --------------------------------------------------------------------------------------------- answering


class TestAnswer:
    async def test_press_becomes_decision_once(self, bot: FakeBotApi, tmp_path: Path, logbuf: io.StringIO) -> None:
        """A press calls on_press once, answers the callback, edits the message and persists the offset."""
        book = Book()
        state = tmp_path / "telegram.json"
        uid = bot.press(callback_data("e-abc123", 1, book.nonce), text="Decision needed: item failed")
        answerer = _answerer(bot, state, book)
        assert await answerer.poll_once() == 1
        assert [(c[0], c[1], c[2], c[3].name) for c in book.calls] == [("e-abc123", 1, book.nonce, "Alice")]
        assert book.decided == ("skip", "Alice")
        (poll,) = bot.of("getUpdates")
        assert poll["allowed_updates"] == ["callback_query"] and "offset" not in poll
        (answer,) = bot.of("answerCallbackQuery")
        assert answer["callback_query_id"] == f"cq{uid}" and "skip" in answer["text"]
        (edit,) = bot.of("editMessageText")
        assert edit["chat_id"] == CHAT and edit["message_id"] == 1 and "reply_markup" not in edit
        assert edit["text"].startswith("Decision needed: item failed\n\n✅ skip — chosen by Alice at 2026-11-03")
        assert TelegramState.model_validate_json(state.read_text()) == TelegramState(offset=uid + 1)
        assert TOKEN not in logbuf.getvalue() and TOKEN not in state.read_text()

        # A restarted answerer starts from the saved offset and does not act again.
        again = _answerer(bot, state, book)
        assert await again.poll_once() == 0
        assert bot.of("getUpdates")[-1]["offset"] == uid + 1
        assert len(book.calls) == 1

    async def test_press_from_other_chat_is_ignored(self, bot: FakeBotApi, tmp_path: Path) -> None:
        """A press from another chat never reaches on_press and gets no answer; the offset moves on."""
        book = Book()
        uid = bot.press(callback_data("e-abc123", 0, book.nonce), chat=999)
        answerer = _answerer(bot, tmp_path / "telegram.json", book)
        assert await answerer.poll_once() == 0
        assert book.calls == [] and bot.of("answerCallbackQuery") == [] and book.decided is None
        assert answerer.load_state().offset == uid + 1

    async def test_press_from_unlisted_user_is_ignored(self, bot: FakeBotApi, tmp_path: Path) -> None:
        """With user_ids set, a press by anyone else in the chat is ignored."""
        book = Book()
        bot.press(callback_data("e-abc123", 0, book.nonce), user={"id": 8, "first_name": "Mallory"})
        answerer = _answerer(bot, tmp_path / "telegram.json", book, user_ids=(7,))
        assert await answerer.poll_once() == 0
        assert book.calls == [] and book.decided is None

    async def test_forged_nonce_changes_nothing(self, bot: FakeBotApi, tmp_path: Path) -> None:
        """A button with a forged nonce is answered 'not valid' and decides nothing."""
        book = Book()
        bot.press(callback_data("e-abc123", 0, new_nonce()))
        bot.press("garbage-data")
        answerer = _answerer(bot, tmp_path / "telegram.json", book)
        await answerer.poll_once()
        assert book.decided is None and len(book.calls) == 1  # the garbage never reaches on_press
        answers = bot.of("answerCallbackQuery")
        assert len(answers) == 2 and all("not valid" in a["text"] for a in answers)
        assert bot.of("editMessageText") == []

    async def test_already_decided(self, bot: FakeBotApi, tmp_path: Path) -> None:
        """A second press on a decided escalation says so and does not decide again."""
        book = Book()
        bot.press(callback_data("e-abc123", 0, book.nonce))
        bot.press(callback_data("e-abc123", 2, book.nonce), user={"id": 7, "first_name": "Alice"})
        answerer = _answerer(bot, tmp_path / "telegram.json", book)
        assert await answerer.poll_once() == 2
        assert book.decided == ("retry", "Alice")
        answers = [a["text"] for a in bot.of("answerCallbackQuery")]
        assert "retry" in answers[0] and answers[1].startswith("Already decided: retry")
        assert "Already decided" in bot.of("editMessageText")[1]["text"]

    async def test_press_saved_before_acting_survives_a_crash(self, bot: FakeBotApi, tmp_path: Path) -> None:
        """A crash after the offset moved but before acting: the restart acts on the saved press, once."""

        class Crash(BaseException):
            pass

        book = Book()
        state = tmp_path / "telegram.json"
        uid = bot.press(callback_data("e-abc123", 0, book.nonce))

        def crashing(esc: str, index: int, nonce: str, user: TelegramUser) -> PressResult:
            raise Crash

        answerer = _answerer(bot, state, crashing)
        with pytest.raises(Crash):
            await answerer.poll_once()
        saved = TelegramState.model_validate_json(state.read_text())
        assert saved.offset == uid + 1 and len(saved.pending) == 1

        restarted = _answerer(bot, state, book)
        assert await restarted.poll_once() == 1
        assert book.decided == ("retry", "Alice") and len(book.calls) == 1
        assert TelegramState.model_validate_json(state.read_text()) == TelegramState(offset=uid + 1)

    async def test_on_press_error_is_answered(self, bot: FakeBotApi, tmp_path: Path) -> None:
        """An exception in on_press is logged and the presser told to retry; the answerer goes on."""

        def broken(esc: str, index: int, nonce: str, user: TelegramUser) -> str:
            raise OSError("disk full")

        bot.press(callback_data("e-abc123", 0, new_nonce()))
        answerer = _answerer(bot, tmp_path / "telegram.json", broken)
        assert await answerer.poll_once() == 1
        assert "Could not record" in bot.of("answerCallbackQuery")[0]["text"]

    async def test_sync_on_press_returning_text(self, bot: FakeBotApi, tmp_path: Path) -> None:
        """A plain function returning a string counts as 'decided' with that text."""
        bot.press(callback_data("e-abc123", 0, new_nonce()), text="Q")

        def simple(esc: str, index: int, nonce: str, user: TelegramUser) -> str:
            return f"approved by {user.name}"

        answerer = _answerer(bot, tmp_path / "telegram.json", simple)
        await answerer.poll_once()
        assert bot.of("editMessageText")[0]["text"] == "Q\n\napproved by Alice"

    async def test_run_long_polls_and_stops(self, bot: FakeBotApi, tmp_path: Path, logbuf: io.StringIO) -> None:
        """run() recovers from a failed poll, acts on a press as it arrives, and stops promptly on request."""
        book = Book()
        bot.failures.append(("getUpdates", 502))
        settings = TelegramSettings(chat_id=CHAT, api_base=bot.base, poll_timeout=5)
        api = BotApi(TOKEN, api_base=bot.base)
        answerer = TelegramAnswerer(
            api, settings, tmp_path / "telegram.json", book, policy=RetryPolicy(base=timedelta(milliseconds=10))
        )
        stop = asyncio.Event()
        task = asyncio.create_task(answerer.run(stop))
        assert await async_wait_until(lambda: len(bot.of("getUpdates")) >= 2, timeout=10)
        bot.press(callback_data("e-abc123", 0, book.nonce))
        await asyncio.wait_for(book.called.wait(), 10)
        assert await async_wait_until(lambda: len(bot.of("editMessageText")) == 1, timeout=10)
        stop.set()  # the long poll in flight is cancelled, not waited for
        await asyncio.wait_for(task, 3)
        assert book.decided == ("retry", "Alice")
        assert "telegram_poll_failed" in logbuf.getvalue() and TOKEN not in logbuf.getvalue()
        await api.aclose()

    async def test_run_tells_whether_the_bot_works_and_why_not(self, bot: FakeBotApi, tmp_path: Path) -> None:
        """A token the Bot API refuses is told as off with the 401 (once per reason, never the token); the same
        answerer with a working link is told up at its first getMe, before any long poll returns."""
        told: list[tuple[bool, str | None]] = []
        settings = TelegramSettings(chat_id=CHAT, api_base=bot.base, poll_timeout=5)
        wrong = BotApi("7770001111:AAGrefusedrefusedrefusedrefused00", api_base=bot.base)
        refused = TelegramAnswerer(
            wrong,
            settings,
            tmp_path / "telegram.json",
            Book(),
            policy=RetryPolicy(base=timedelta(milliseconds=10)),
            on_state=lambda up, why: told.append((up, why)),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(refused.run(stop))
        assert await async_wait_until(lambda: len(told) >= 2, timeout=10)
        stop.set()
        await asyncio.wait_for(task, 3)
        assert {up for up, _ in told} == {False}
        assert all(why and "401" in why and "refused the bot token" in why for _, why in told)
        assert bot.of("getUpdates") == []  # refused at getMe: no poll was tried with it
        await wrong.aclose()

        told.clear()
        api = BotApi(TOKEN, api_base=bot.base)
        works = TelegramAnswerer(
            api, settings, tmp_path / "telegram.json", Book(), on_state=lambda up, why: told.append((up, why))
        )
        stop = asyncio.Event()
        task = asyncio.create_task(works.run(stop))
        assert await async_wait_until(lambda: told[:1] == [(True, None)], timeout=10)
        assert len(bot.of("getMe")) == 1
        stop.set()
        await asyncio.wait_for(task, 3)
        await api.aclose()

    def test_unreadable_state_starts_fresh(self, tmp_path: Path, bot: FakeBotApi) -> None:
        """A damaged state file is reported and replaced by a fresh state, never a crash."""
        state = tmp_path / "telegram.json"
        state.write_text("{not json")
        assert _answerer(bot, state, Book()).load_state() == TelegramState()
