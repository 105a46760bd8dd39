"""Answering escalations from Telegram (opt-in): a small Bot API client and a long-polling answerer.

Why a few lines on httpx rather than python-telegram-bot: ambient needs five Bot API methods
(sendMessage, getUpdates, answerCallbackQuery, editMessageText), httpx is already a dependency,
its ``AsyncClient`` runs on our event loop and a long poll is cancelled like any task at shutdown,
and the base URL is one string tests point at a local fake. python-telegram-bot brings its own
Application, job queue and persistence layer, which would compete with the daemon's own lifecycle.

Safety: presses count only from the configured chat (and user ids, if set); ``callback_data`` carries
an unguessable per-escalation nonce that the decision callback checks; the update offset and the
presses not yet acted upon are saved atomically *before* acting, so after a crash each press is
replayed (the decision side answers "already decided") and none is lost. The bot token is a secret:
it is only ever in the request URL, never logged, and registered for redaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
import secrets
from collections.abc import Awaitable, Callable, Sequence, Set
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from ambient.core.errors import NotifyError, TelegramError
from ambient.core.lazylog import get_logger
from ambient.core.redact import SecretRegistry, redact_text
from ambient.human.channelstate import telegram_off_reason
from ambient.human.messages import TELEGRAM_MAX_CHARS, Message, clean_text, cut_text, fit_message
from ambient.human.notify import SendReport, TargetResult, delivery_error, target_key
from ambient.human.outbox import RetryPolicy, next_attempt_at
from ambient.storage.fsutil import atomic_write, read_capped

if TYPE_CHECKING:  # imported when a bot is made: a daemon without Telegram never loads httpx (~50 ms of its start)
    import httpx

log = get_logger(__name__)

DEFAULT_API_BASE = "https://api.telegram.org"
CALLBACK_DATA_MAX_BYTES = 64  # Bot API limit for InlineKeyboardButton.callback_data
CALLBACK_ANSWER_MAX = 200  # Bot API limit for answerCallbackQuery.text
STATE_FILE = "telegram.json"  # under .ambient/

_ESCALATION_ID = re.compile(r"[A-Za-z0-9._-]{1,40}")
_NONCE = re.compile(r"[A-Za-z0-9_-]{8,43}")


class TelegramSettings(BaseModel):
    """Interactive answering settings (``notify.telegram`` in ``profil/ambient.yml``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    chat_id: int | str  # numeric chat id, negative group id, or "@channel"
    user_ids: tuple[int, ...] = ()  # when set, only these users' presses count
    api_base: str = DEFAULT_API_BASE
    poll_timeout: int = Field(50, ge=0, le=50)  # long-poll seconds per getUpdates


# --------------------------------------------------------------------------------------------- buttons


def callback_data(escalation_id: str, option_index: int, nonce: str) -> str:
    """``<escalation id>:<option index>:<nonce>``, checked against the 64-byte Bot API limit."""
    if not _ESCALATION_ID.fullmatch(escalation_id):
        raise ValueError(f"escalation id {escalation_id!r} must be 1-40 characters of A-Z a-z 0-9 . _ -")
    if not _NONCE.fullmatch(nonce):
        raise ValueError("nonce must be 8-43 URL-safe base64 characters (see ambient.human.escalations.new_nonce())")
    if not 0 <= option_index < 100:
        raise ValueError("option index must be between 0 and 99")
    data = f"{escalation_id}:{option_index}:{nonce}"
    if len(data.encode()) > CALLBACK_DATA_MAX_BYTES:
        raise ValueError(f"callback_data {len(data.encode())} bytes long; the Bot API allows {CALLBACK_DATA_MAX_BYTES}")
    return data


def parse_callback_data(data: str) -> tuple[str, int, str] | None:
    """``(escalation id, option index, nonce)`` from a button's data, or None if it is not ours."""
    parts = data.split(":")
    if len(parts) != 3:
        return None
    esc, idx, nonce = parts
    if not (_ESCALATION_ID.fullmatch(esc) and idx.isdigit() and len(idx) <= 2 and _NONCE.fullmatch(nonce)):
        return None
    return esc, int(idx), nonce


def nonce_matches(expected: str | None, given: str) -> bool:
    """Constant-time nonce check for the decision callback."""
    return expected is not None and secrets.compare_digest(expected.encode(), given.encode())


@dataclass(frozen=True)
class TelegramUser:
    """Who pressed a button."""

    id: int
    name: str  # "First Last" or "@username", plain text


@dataclass(frozen=True)
class PressResult:
    """What the decision callback made of a press.

    ``decided``: the decision was recorded; the message is edited to ``text`` and loses its buttons.
    ``already_decided``: nothing changed; the presser is told ``text``, and the message is edited to show ``line``
    (the earlier decision, as its own press showed it), else ``text``.
    ``invalid``: forged/stale nonce, unknown escalation or option; only the presser sees ``text``.
    """

    status: Literal["decided", "already_decided", "invalid"]
    text: str
    line: str | None = None


# on_press(escalation_id, option_index, nonce, user) -> PressResult (or a str, meaning "decided"); sync or async.
OnPress = Callable[[str, int, str, TelegramUser], Awaitable[PressResult | str] | PressResult | str]
# on_state(up, why): the bot works (why None) or does not (why: in words a person acts on); told after each poll.
OnState = Callable[[bool, str | None], None]


def decision_text(option: str, user: TelegramUser | str, when: datetime, *, verb: str = "chosen") -> str:
    """The line shown under a decided escalation, e.g. ``✅ approve — chosen by Ana at 2026-11-03 14:02 UTC``."""
    who = user.name if isinstance(user, TelegramUser) else user
    return f"✅ {clean_text(option)} — {verb} by {clean_text(who)} at {when.strftime('%Y-%m-%d %H:%M %Z').strip()}"


# --------------------------------------------------------------------------------------------- Bot API


def token_problem(token: str) -> str | None:
    """Why ``token`` cannot be a bot token (None: it looks like one of BotFather's). Never says the token."""
    if re.fullmatch(r"\d+:[A-Za-z0-9_-]{20,}", token.strip()):
        return None
    return (
        "the Telegram bot token is malformed; expected '<digits>:<20 or more letters, digits, _ or ->' "
        "(BotFather's look like 123456789:AAE… with 35 characters after the colon)"
    )


class BotApi:
    """The few Bot API methods ambient uses, on an ``httpx.AsyncClient``."""

    def __init__(
        self,
        token: str,
        *,
        api_base: str = DEFAULT_API_BASE,
        client: httpx.AsyncClient | None = None,
        timeout: float = 10.0,
        registry: SecretRegistry | None = None,
    ) -> None:
        problem = token_problem(token)
        if problem is not None:
            raise NotifyError(problem)
        self._token = token.strip()
        self._base = api_base.rstrip("/")
        self._timeout = timeout
        self._registry = registry if registry is not None else SecretRegistry()
        self._registry.add(self._token)
        import httpx

        self._client = client or httpx.AsyncClient(timeout=httpx.Timeout(timeout))
        self._own_client = client is None

    def __repr__(self) -> str:  # never show the token
        return f"BotApi(api_base={self._base!r})"

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it."""
        if self._own_client:
            await self._client.aclose()

    async def call(self, method: str, payload: dict[str, Any], *, http_timeout: float | None = None) -> Any:
        """POST one Bot API method; return its ``result`` or raise :class:`TelegramError`."""
        import httpx

        url = f"{self._base}/bot{self._token}/{method}"
        try:
            response = await self._client.post(url, json=payload, timeout=http_timeout or self._timeout)
        except httpx.HTTPError as exc:
            # httpx messages can carry the request URL, which carries the token: redact.
            raise TelegramError(f"{method}: {type(exc).__name__}: {redact_text(str(exc), self._registry)}") from None
        try:
            body = response.json()
        except ValueError:
            status = response.status_code
            raise TelegramError(f"{method}: HTTP {status} (not JSON)", code=status) from None
        if not isinstance(body, dict) or not body.get("ok"):
            description = body.get("description", "") if isinstance(body, dict) else ""
            params = body.get("parameters") if isinstance(body, dict) else None
            retry_after = params.get("retry_after") if isinstance(params, dict) else None
            raise TelegramError(
                f"{method}: HTTP {response.status_code}: {redact_text(str(description), self._registry)[:200]}",
                code=response.status_code,
                retry_after=float(retry_after) if isinstance(retry_after, int | float) else None,
            )
        return body.get("result")

    async def send_escalation(
        self, chat_id: int | str, text: str, buttons: Sequence[tuple[str, str]] = (), *, silent: bool = False
    ) -> int:
        """Send plain ``text`` (no parse_mode: nothing in it is rendered) with one inline button per row.

        ``buttons`` are ``(label, callback_data)`` pairs; returns the message id.
        """
        payload: dict[str, Any] = {
            "chat_id": chat_id,
            "text": cut_text(text, TELEGRAM_MAX_CHARS),
            "link_preview_options": {"is_disabled": True},
            "disable_notification": silent,
        }
        if buttons:
            for _, data in buttons:
                if len(data.encode()) > CALLBACK_DATA_MAX_BYTES:
                    raise ValueError(f"callback_data over {CALLBACK_DATA_MAX_BYTES} bytes")
            payload["reply_markup"] = {
                "inline_keyboard": [[{"text": label[:64], "callback_data": data}] for label, data in buttons]
            }
        result = await self.call("sendMessage", payload)
        return int(result["message_id"]) if isinstance(result, dict) and "message_id" in result else 0

    async def poll_updates(
        self, offset: int | None, *, wait: int = 50, allowed_updates: Sequence[str] = ("callback_query",)
    ) -> list[dict[str, Any]]:
        """``getUpdates`` long poll: waits up to ``wait`` s; confirms every update below ``offset``."""
        payload: dict[str, Any] = {"timeout": wait, "allowed_updates": list(allowed_updates), "limit": 100}
        if offset:
            payload["offset"] = offset
        # The HTTP read deadline is the long-poll time plus a margin, so a dead link cannot hang us.
        result = await self.call("getUpdates", payload, http_timeout=wait + self._timeout)
        if not isinstance(result, list):
            raise TelegramError("getUpdates: result is not a list")
        return [u for u in result if isinstance(u, dict) and isinstance(u.get("update_id"), int)]

    async def answer_callback_query(self, callback_query_id: str, text: str = "") -> None:
        """Stop the button's spinner and show ``text`` (at most 200 characters) to the presser."""
        payload: dict[str, Any] = {"callback_query_id": callback_query_id}
        if text:
            payload["text"] = text[:CALLBACK_ANSWER_MAX]
        await self.call("answerCallbackQuery", payload)

    async def edit_message_text(self, chat_id: int | str, message_id: int, text: str) -> None:
        """Replace a message's text; without ``reply_markup`` its inline buttons go away."""
        payload: dict[str, Any] = {
            "chat_id": chat_id,
            "message_id": message_id,
            "text": cut_text(text, TELEGRAM_MAX_CHARS),
            "link_preview_options": {"is_disabled": True},
        }
        await self.call("editMessageText", payload)


class TelegramNotifier:
    """A :class:`ambient.human.notify.Notifier` sending through the bot itself, with one button per option.

    Use it *instead of* an apprise ``tgram://`` URL for the same chat when interactive answers are on
    (apprise cannot attach buttons), or the person gets every escalation twice.
    """

    def __init__(self, api: BotApi, chat_id: int | str, *, buttons: bool = True) -> None:
        self._api = api
        self._chat_id = chat_id
        self._buttons = buttons
        self.key = target_key("telegram", str(chat_id))
        self.display = f"telegram bot -> chat {chat_id}"

    def buttons_for(self, message: Message) -> list[tuple[str, str]]:
        """Inline buttons for an escalation carrying a nonce; none otherwise."""
        if not (self._buttons and message.kind == "escalation" and message.escalation_id and message.nonce):
            return []
        return [
            (f"{i + 1}. {clean_text(opt)}", callback_data(message.escalation_id, i, message.nonce))
            for i, opt in enumerate(message.options)
        ]

    async def send(self, message: Message, *, skip: Set[str] = frozenset()) -> SendReport:
        """Send the message to the chat; raise :class:`DeliveryError` if the Bot API refused it."""
        if self.key in skip:
            return SendReport()
        title, body = fit_message(message.title, message.body, TELEGRAM_MAX_CHARS - 2)
        text = f"{title}\n\n{body}" if title else body
        try:
            message_id = await self._api.send_escalation(
                self._chat_id, text, self.buttons_for(message), silent=message.silent
            )
        except TelegramError as exc:
            result = TargetResult(self.key, self.display, False, str(exc))
            log.warning("notify_failed", target=self.display, message=message.dedupe_id, detail=str(exc))
            raise delivery_error(SendReport((result,))) from None
        log.info("notify_sent", target=self.display, message=message.dedupe_id)
        return SendReport((TargetResult(self.key, self.display, True, ref=str(message_id)),))


# --------------------------------------------------------------------------------------------- answering


class TelegramState(BaseModel):
    """What survives a restart: the next update offset and the presses saved but not yet acted upon."""

    model_config = ConfigDict(extra="forbid")

    offset: int = 0
    pending: list[dict[str, JsonValue]] = []


def _user_of(query: dict[str, Any]) -> TelegramUser:
    sender = query.get("from")
    if not isinstance(sender, dict):
        sender = {}
    full = " ".join(str(sender.get(k, "")) for k in ("first_name", "last_name")).strip()
    name = full or (f"@{sender['username']}" if sender.get("username") else "") or str(sender.get("id", "?"))
    uid = sender.get("id")
    return TelegramUser(id=uid if isinstance(uid, int) else 0, name=clean_text(name)[:64])


class TelegramAnswerer:
    """Reads button presses with ``getUpdates`` long polling and turns them into decisions via ``on_press``.

    ``state_path`` (e.g. ``.ambient/telegram.json``) holds the offset and the accepted presses not yet
    acted upon; it is written atomically before acting.
    """

    def __init__(
        self,
        api: BotApi,
        settings: TelegramSettings,
        state_path: Path,
        on_press: OnPress,
        *,
        policy: RetryPolicy | None = None,
        on_state: OnState | None = None,
    ) -> None:
        self.api = api
        self.settings = settings
        self.state_path = state_path
        self._on_press = on_press
        self._policy = policy or RetryPolicy(base=timedelta(seconds=2), cap=timedelta(minutes=5))
        self._state: TelegramState | None = None
        self._on_state = on_state
        self.up: bool | None = None  # None: not checked yet; then whether the last call to the Bot API worked

    # -- state

    def load_state(self) -> TelegramState:
        """The saved state (a fresh one if the file is missing or unreadable)."""
        try:
            raw = read_capped(self.state_path, 4 * 1024 * 1024)
        except FileNotFoundError:
            return TelegramState()
        try:
            return TelegramState.model_validate_json(raw)
        except ValidationError:
            # Only ambient writes this file (atomically), so this is damage: start over rather than stop
            # answering. Telegram re-sends unconfirmed updates, so at worst a press is seen twice.
            log.error("telegram_state_unreadable", file=str(self.state_path))
            return TelegramState()

    async def _save(self, state: TelegramState) -> None:
        self._state = state
        data = state.model_dump_json() + "\n"
        await asyncio.to_thread(atomic_write, self.state_path, data, mode=0o600)

    # -- sending

    async def send_escalation(self, text: str, buttons: Sequence[tuple[str, str]]) -> int:
        """Send an escalation with buttons to the configured chat; returns the message id."""
        return await self.api.send_escalation(self.settings.chat_id, text, buttons)

    # -- receiving

    def _accepted(self, update: dict[str, Any]) -> bool:
        query = update.get("callback_query")
        if not isinstance(query, dict):
            return False
        message = query.get("message")
        chat = message.get("chat") if isinstance(message, dict) else None
        if not isinstance(chat, dict):
            return False
        wanted = str(self.settings.chat_id)
        username = chat.get("username")
        if str(chat.get("id")) != wanted and not (username and f"@{username}" == wanted):
            log.warning("telegram_press_ignored", reason="other chat", chat=chat.get("id"))
            return False
        user = _user_of(query)
        if self.settings.user_ids and user.id not in self.settings.user_ids:
            log.warning("telegram_press_ignored", reason="user not allowed", user=user.id)
            return False
        return True

    async def _act(self, update: dict[str, Any]) -> None:
        query: dict[str, Any] = update["callback_query"]
        query_id = str(query.get("id", ""))
        message = query["message"]
        user = _user_of(query)
        parsed = parse_callback_data(str(query.get("data", "")))
        if parsed is None:
            result = PressResult("invalid", "This button is not valid.")
        else:
            esc, index, nonce = parsed
            try:
                outcome = self._on_press(esc, index, nonce, user)
                if inspect.isawaitable(outcome):
                    outcome = await outcome
            except Exception as exc:  # noqa: BLE001 - one bad press must not stop the answerer
                log.error("telegram_press_failed", escalation=esc, error=redact_text(str(exc)))
                outcome = PressResult("invalid", "Could not record this answer; try again or use the CLI.")
            result = outcome if isinstance(outcome, PressResult) else PressResult("decided", str(outcome))
            log.info("telegram_press", escalation=esc, option=index, user=user.id, status=result.status)
        try:
            await self.api.answer_callback_query(query_id, result.text)
        except TelegramError as exc:  # e.g. "query is too old" after a restart: the decision stands
            log.info("telegram_answer_failed", error=str(exc))
        if result.status == "invalid":
            return
        original = str(message.get("text", ""))
        line = result.line or result.text
        if line in original:  # the message shows it already (a second press on a decided message)
            return
        room = TELEGRAM_MAX_CHARS - len(line) - 2
        try:
            await self.api.edit_message_text(
                message["chat"]["id"], int(message["message_id"]), f"{cut_text(original, room)}\n\n{line}"
            )
        except (TelegramError, KeyError, TypeError, ValueError) as exc:
            log.info("telegram_edit_failed", error=str(exc))

    async def poll_once(self) -> int:
        """Replay saved presses, then one long poll; returns how many presses were acted upon."""
        state = self._state or self.load_state()
        acted = 0
        while state.pending:
            # Saved before a crash or a cancellation: act now (the decision side is idempotent).
            await self._act(state.pending[0])
            state = TelegramState(offset=state.offset, pending=state.pending[1:])
            await self._save(state)
            acted += 1
        self._state = state
        updates = await self.api.poll_updates(state.offset or None, wait=self.settings.poll_timeout)
        if not updates:
            return acted
        accepted = [u for u in updates if self._accepted(u)]
        # Persist the new offset and the accepted presses BEFORE acting: no press is acted on twice
        # by a restart that re-reads them, and none is lost by a crash after the offset moved.
        state = TelegramState(offset=max(u["update_id"] for u in updates) + 1, pending=accepted)
        await self._save(state)
        while state.pending:
            await self._act(state.pending[0])
            state = TelegramState(offset=state.offset, pending=state.pending[1:])
            await self._save(state)
            acted += 1
        return acted

    def _tell(self, up: bool, why: str | None) -> None:
        """Whether the bot works, told after each call (the listener keeps only the changes)."""
        self.up = up
        if self._on_state is not None:
            self._on_state(up, why)

    async def _cycle(self) -> int:
        """One poll; while the bot is not known to work, ``getMe`` first: it answers at once, where a long poll
        waiting for presses would leave the bot's state unknown for up to ``poll_timeout`` seconds."""
        if not self.up:
            await self.api.call("getMe", {})
            self._tell(True, None)
        acted = await self.poll_once()
        self._tell(True, None)
        return acted

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop`` is set; errors are logged and retried with capped backoff, never raised."""
        failures = 0
        while not stop.is_set():
            poll = asyncio.ensure_future(self._cycle())
            stopper = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({poll, stopper}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (poll, stopper):
                    if not task.done():
                        task.cancel()
                await asyncio.gather(poll, stopper, return_exceptions=True)
            if stop.is_set() or poll.cancelled():
                return
            exc = poll.exception()
            if exc is None:
                failures = 0
                continue
            failures += 1
            if not isinstance(exc, TelegramError | OSError):
                # A bug, not the network: log it with its traceback, keep answering after a pause.
                log.error("telegram_poll_crashed", error=redact_text(f"{type(exc).__name__}: {exc}"))
            detail = redact_text(str(exc))[:200]
            if isinstance(exc, TelegramError):
                self._tell(False, telegram_off_reason(exc.code, detail))
            else:
                self._tell(False, f"the answerer failed: {type(exc).__name__}: {detail}")
            now = datetime.now(UTC)
            retry_after = exc.retry_after if isinstance(exc, TelegramError) else None
            delay = (
                retry_after
                or (next_attempt_at(failures, now, self._policy.base, self._policy.cap, _rng) - now).total_seconds()
            )
            log.warning(
                "telegram_poll_failed", error=redact_text(str(exc)), failures=failures, retry_in=round(delay, 1)
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(delay, 0.05))


_rng = secrets.SystemRandom()
