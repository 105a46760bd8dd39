"""The daemon's side of notifications: notifiers built from the settings, the outbox sender and the Telegram
answerer as tasks, rebuilt whole when the settings change.

A reload (SIGHUP, or ``profil/ambient.yml`` edited) hands the new settings to :meth:`NotifyService.configure`:
when ``notify`` or ``telegram`` changed, the running sender and answerer are stopped and new ones start, so a new
URL is used for the very next message. ``ambient notify test`` builds its notifiers with the same
:func:`build_notifiers`, so it tests exactly what the daemon sends through (the Telegram answers bot included).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from ambient.config.settings import NotifySettings, Settings, TelegramSettings
from ambient.core.clock import Clock
from ambient.core.errors import AmbientError, NotifyError
from ambient.core.redact import SecretRegistry
from ambient.human.escalation_store import EscalationStore
from ambient.human.messages import Message
from ambient.human.notify import (
    TOKEN_CREDENTIAL,
    AppriseNotifier,
    CompositeNotifier,
    Notifier,
    expand_urls,
    read_credential,
)
from ambient.human.outbox import Outbox, RetryPolicy, run_outbox

# The Telegram module (httpx) is imported where a bot is built: ``ambient notify test`` and ``ambient doctor`` use
# this module too, and pay for it only when Telegram answers are configured (the start-up time of a CLI command).
if TYPE_CHECKING:
    from ambient.human.telegram import BotApi, OnPress

log = structlog.get_logger(__name__)


@dataclass
class Notifiers:
    """What the settings say to send through: apprise URLs, the Telegram answers bot, and what went wrong."""

    apprise: AppriseNotifier | None = None
    bot: BotApi | None = None
    chat_id: str | None = None
    problems: list[str] = field(default_factory=list)

    def notifier(self) -> Notifier | None:
        """One notifier for all targets, or None when there is nobody to tell."""
        found: list[Notifier] = []
        if self.apprise is not None:
            found.append(self.apprise)
        if self.bot is not None and self.chat_id is not None:
            from ambient.human.telegram import TelegramNotifier

            found.append(TelegramNotifier(self.bot, self.chat_id))
        if not found:
            return None
        return found[0] if len(found) == 1 else CompositeNotifier(found)


def telegram_token(settings: Settings, environ: Mapping[str, str]) -> str | None:
    """The bot token: ``$CREDENTIALS_DIRECTORY/telegram-token`` (systemd ``LoadCredential=``), else ``token_file``."""
    token = read_credential(TOKEN_CREDENTIAL, environ)
    if token is None and settings.telegram.token_file:
        with contextlib.suppress(OSError):
            token = Path(settings.telegram.token_file).read_text().strip() or None
    return token


def build_notifiers(
    settings: Settings, environ: Mapping[str, str], registry: SecretRegistry, *, timeout: float = 30.0
) -> Notifiers:
    """The notifiers of these settings; every secret met (URL tokens, the bot token) goes into ``registry``."""
    out = Notifiers()
    urls = [u.get_secret_value() for u in settings.notify.urls]
    try:
        urls = expand_urls(urls, environ, registry, source="profil/ambient.yml")
    except AmbientError as exc:
        out.problems.append(str(exc))
        urls = []
    if urls:
        out.apprise = AppriseNotifier(urls, timeout=timeout, registry=registry)
    tg = settings.telegram
    if tg.answers and tg.chat_id:
        from ambient.human.telegram import BotApi

        token = telegram_token(settings, environ)
        if token is None:
            out.problems.append(
                "telegram.answers is on but no bot token was found: set "
                "LoadCredential=telegram-token:... (systemd) or telegram.token_file"
            )
        else:
            registry.add(token)
            try:
                out.bot = BotApi(token, api_base=tg.api_base, registry=registry, timeout=timeout)
            except NotifyError as exc:
                out.problems.append(str(exc))
            else:
                out.chat_id = tg.chat_id
    return out


class NotifyService:
    """The outbox sender and the Telegram answerer of one daemon, (re)started from the current settings."""

    def __init__(
        self,
        outbox: Outbox,
        store: EscalationStore,
        clock: Clock,
        secrets: SecretRegistry,
        environ: Mapping[str, str],
        state_dir: Path,
        on_press: OnPress,
        spawn: Callable[[Coroutine[Any, Any, object], str], asyncio.Task[object]],
        stop: asyncio.Event,
    ) -> None:
        self.outbox = outbox
        self.store = store
        self.clock = clock
        self.secrets = secrets
        self.environ = environ
        self.state_dir = state_dir
        self.on_press = on_press
        self._spawn = spawn
        self.stop = stop
        self.wake = asyncio.Event()  # set after a message is queued: it goes out at once
        self.notifier: Notifier | None = None
        self._config: tuple[NotifySettings, TelegramSettings] | None = None
        self._tasks: list[asyncio.Task[object]] = []
        self._bot: BotApi | None = None

    @property
    def active(self) -> bool:
        """Whether anybody is told anything (a URL or the Telegram bot is configured)."""
        return self.notifier is not None

    def record(
        self, message: Message, ok: bool, error: str | None, next_at: datetime | None, refs: dict[str, str]
    ) -> None:
        """An attempt at an escalation's message goes into its file (``ambient status`` and ``doctor`` read it)."""
        if message.kind != "escalation" or not message.escalation_id:
            return
        try:
            self.store.record_attempt(message.escalation_id, ok, error, next_at, refs=refs)
        except AmbientError as exc:  # settled or gone meanwhile: its message no longer matters
            log.debug("notify_attempt_not_recorded", escalation=message.escalation_id, error=str(exc))

    def still_wanted(self, message: Message) -> bool:
        """A message about an escalation is sent only while it waits on the person (blocking: a file read)."""
        if message.kind != "escalation" or not message.escalation_id:
            return True
        return self.store.is_pending(message.escalation_id)

    async def configure(self, settings: Settings) -> bool:
        """Build the notifiers of ``settings`` and (re)start the sender and the answerer when they changed.

        Returns whether anything was restarted. Nothing is sent from here; queued messages wait in the outbox.
        """
        config = (settings.notify, settings.telegram)
        if config == self._config:
            return False
        first = self._config is None
        self._config = config
        await self._stop_tasks()
        built = build_notifiers(settings, self.environ, self.secrets)
        self._bot = built.bot
        for problem in built.problems:
            log.error("notify_config_invalid", error=problem)
        self.notifier = built.notifier()
        if self.notifier is not None:
            ns = settings.notify
            policy = RetryPolicy(base=timedelta(seconds=ns.retry_base_s), cap=timedelta(seconds=ns.retry_cap_s))
            self._tasks.append(
                self._spawn(
                    run_outbox(
                        self.outbox,
                        self.notifier,
                        clock=self.clock,
                        stop=self.stop,
                        wake=self.wake,
                        policy=policy,
                        still_wanted=self.still_wanted,
                        on_attempt=self.record,
                    ),
                    "outbox",
                )
            )
        if built.bot is not None and built.chat_id is not None:
            from ambient.human.telegram import STATE_FILE, TelegramAnswerer
            from ambient.human.telegram import TelegramSettings as AnswererSettings

            tg = settings.telegram
            answerer = AnswererSettings(
                chat_id=built.chat_id, user_ids=tuple(tg.user_ids), api_base=tg.api_base, poll_timeout=tg.poll_timeout_s
            )
            state = self.state_dir / STATE_FILE
            self._tasks.append(
                self._spawn(TelegramAnswerer(built.bot, answerer, state, self.on_press).run(self.stop), "telegram")
            )
        if not first:
            log.info(
                "notifications_reconfigured", sending=self.notifier is not None, telegram_answers=built.bot is not None
            )
        self.wake.set()
        return True

    async def close(self) -> None:
        """Stop the sender and the answerer (shutdown)."""
        await self._stop_tasks()

    async def _stop_tasks(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        bot, self._bot = self._bot, None
        if bot is not None:
            with contextlib.suppress(Exception):  # closing a client that failed to connect may fail: nothing lost
                await bot.aclose()
