"""The daemon's side of notifications: notifiers built from the settings, the outbox sender and the Telegram
answerer as tasks, rebuilt whole when the settings or the secrets they read change, and the state of each channel.

A reload (SIGHUP, or ``profil/ambient.yml`` edited) hands the new settings to :meth:`NotifyService.configure`:
when ``notify`` or ``telegram`` changed, or the content of a secret file they read (the bot token: compared by
hash), the running sender and answerer are stopped and new ones start, so a new URL or token is used for the very
next message. Each channel's state (up, off and why) is written to ``.ambient/notifications.json`` at each change,
for ``ambient doctor`` and ``ambient notify test`` (:func:`read_channels`). A Telegram bot that comes up is sent the
escalations still pending that it never got. ``ambient notify test`` builds its notifiers with the same
:func:`build_notifiers`, so it tests exactly what the daemon sends through (the Telegram answers bot included).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Coroutine, Mapping, Set
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from ambient.config.settings import NotifySettings, Settings, TelegramSettings
from ambient.core.clock import Clock
from ambient.core.errors import AmbientError, DeliveryError, NotifyError
from ambient.core.lazylog import get_logger
from ambient.core.redact import SecretRegistry, redact_text, redact_url
from ambient.human.channelstate import (
    ChannelsReport,
    ChannelState,
    State,
    digests,
    moved,
    secrets_changed,
    with_state,
)
from ambient.human.escalation_store import EscalationStore
from ambient.human.messages import Message
from ambient.human.notify import (
    TOKEN_CREDENTIAL,
    AppriseNotifier,
    CompositeNotifier,
    Notifier,
    SendReport,
    expand_urls,
    read_credential,
    target_key,
)
from ambient.human.outbox import Outbox, RetryPolicy, run_outbox
from ambient.service.instance import daemon_up, running_pid
from ambient.storage.fsutil import PRIVATE_FILE, atomic_write

# The Telegram module (httpx) is imported where a bot is built: ``ambient notify test`` and ``ambient doctor`` use
# this module too, and pay for it only when Telegram answers are configured (the start-up time of a CLI command).
if TYPE_CHECKING:
    from ambient.human.telegram import BotApi, OnPress
    from ambient.storage.paths import BrainPaths

log = get_logger(__name__)

#: The channels' states, written by the daemon (``.ambient/notifications.json``).
CHANNELS_FILE = "notifications.json"
#: The name of each secret a reload compares (never its value): the credential file, the ``token_file`` setting.
TOKEN_CREDENTIAL_NAME = f"$CREDENTIALS_DIRECTORY/{TOKEN_CREDENTIAL}"
TOKEN_FILE_NAME = "telegram.token_file"  # noqa: S105 - a setting's name, not a secret
#: The key of the URLs as one channel when they cannot be built at all (a ``{telegram_token}`` without credential).
URLS_KEY = "apprise:config"

#: Told when a channel comes up: (its key, its display, the keys of the other targets); returns how many pending
#: escalations were queued for it.
OnChannelUp = Callable[[str, str, frozenset[str]], Coroutine[Any, Any, int]]


@dataclass
class Notifiers:
    """What the settings say to send through: apprise URLs, the Telegram answers bot, and what went wrong."""

    apprise: AppriseNotifier | None = None
    bot: BotApi | None = None
    chat_id: str | None = None
    problems: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)  # the URLs of ``apprise``, secrets filled in
    urls_problem: str | None = None  # the URLs could not be built (each problem is in ``problems`` too)
    telegram_problem: str | None = None  # Telegram answers are on but no bot could be built

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


def token_secrets(settings: Settings, environ: Mapping[str, str]) -> dict[str, str | None]:
    """Each file a bot token may come from, by name, with its content (None: absent or unreadable)."""
    found: dict[str, str | None] = {TOKEN_CREDENTIAL_NAME: None}
    with contextlib.suppress(OSError, AmbientError):
        found[TOKEN_CREDENTIAL_NAME] = read_credential(TOKEN_CREDENTIAL, environ)
    if settings.telegram.token_file:
        found[TOKEN_FILE_NAME] = None
        with contextlib.suppress(OSError, UnicodeDecodeError):
            found[TOKEN_FILE_NAME] = Path(settings.telegram.token_file).read_text().strip() or None
    return found


def read_token(settings: Settings, environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The bot token and, when there is none, why: ``$CREDENTIALS_DIRECTORY/telegram-token`` (systemd
    ``LoadCredential=``), else ``token_file``."""
    try:
        token = read_credential(TOKEN_CREDENTIAL, environ)
    except (OSError, AmbientError) as exc:
        return None, f"{TOKEN_CREDENTIAL_NAME} cannot be read: {getattr(exc, 'strerror', None) or exc}"
    if token is not None:
        return token, None
    path = settings.telegram.token_file
    if not path:
        return None, "no bot token was found: set LoadCredential=telegram-token:... (systemd) or telegram.token_file"
    try:
        text = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"telegram.token_file {path} cannot be read: {getattr(exc, 'strerror', None) or exc}"
    return (text, None) if text else (None, f"telegram.token_file {path} is empty")


def telegram_token(settings: Settings, environ: Mapping[str, str]) -> str | None:
    """The bot token, or None when there is none (:func:`read_token` says why)."""
    return read_token(settings, environ)[0]


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
        out.urls_problem = str(exc)
        urls = []
    if urls:
        out.apprise = AppriseNotifier(urls, timeout=timeout, registry=registry)
        out.urls = urls
    tg = settings.telegram
    if tg.answers and tg.chat_id:
        from ambient.human.telegram import BotApi

        token, why = read_token(settings, environ)
        if token is None:
            out.telegram_problem = f"telegram.answers is on but {why}"
        else:
            with contextlib.suppress(ValueError):  # too short to be a token: BotApi says it is malformed
                registry.add(token)
            try:
                out.bot = BotApi(token, api_base=tg.api_base, registry=registry, timeout=timeout)
            except NotifyError as exc:
                out.telegram_problem = str(exc)
            else:
                out.chat_id = tg.chat_id
        if out.telegram_problem is not None:
            out.problems.append(out.telegram_problem)
    return out


def telegram_key(chat_id: int | str) -> str:
    """The target key of the Telegram answers bot's chat (as its notifier names it)."""
    return target_key("telegram", str(chat_id))


def channels_path(state_dir: Path) -> Path:
    """``.ambient/notifications.json``: the running daemon's channels."""
    return state_dir / CHANNELS_FILE


def read_channels(state_dir: Path) -> ChannelsReport | None:
    """The channels the daemon last wrote (None: no file, or it does not read); check the daemon runs first."""
    try:
        return ChannelsReport.model_validate_json(channels_path(state_dir).read_bytes())
    except (OSError, ValidationError, ValueError):
        return None


def running_channels(paths: BrainPaths) -> ChannelsReport | None:
    """The channels of the daemon running on the brain now, as it wrote them; None when no daemon runs or it
    did not write them (the file of a daemon gone is not the running one's: its pid says whose it is)."""
    if not daemon_up(paths):
        return None
    report = read_channels(paths.state)
    pid = running_pid(paths)
    return report if report is not None and (pid is None or report.pid == pid) else None


class _Watched:
    """A notifier whose every send tells, target by target, whether the channel took the message."""

    def __init__(self, inner: Notifier, seen: Callable[[SendReport], None]) -> None:
        self._inner = inner
        self._seen = seen

    async def send(self, message: Message, *, skip: Set[str] = frozenset()) -> SendReport:
        try:
            report = await self._inner.send(message, skip=skip)
        except DeliveryError as exc:
            self._seen(exc.report)
            raise
        self._seen(report)
        return report


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
        *,
        wake: asyncio.Event | None = None,
        on_channel_up: OnChannelUp | None = None,
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
        # Set after a message is queued: it goes out at once (``wake``: the event the queuers were given).
        self.wake = asyncio.Event() if wake is None else wake
        self.notifier: Notifier | None = None
        self.on_channel_up = on_channel_up  # queues the pending escalations a channel never got
        self.channels: dict[str, ChannelState] = {}
        self._config: tuple[NotifySettings, TelegramSettings] | None = None
        self._digests: dict[str, str] = {}
        self._tasks: list[asyncio.Task[object]] = []
        self._catch_ups: set[asyncio.Task[None]] = set()
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

    async def configure(self, settings: Settings) -> list[str]:
        """Build the notifiers of ``settings`` and (re)start the sender and the answerer when they changed, or when
        a secret they read changed (its content, by hash: a token file fixed and SIGHUP brings the bot back).

        Returns the names of the secrets that changed since the last call (never their values). Nothing is sent
        from here; queued messages wait in the outbox.
        """
        found = await asyncio.to_thread(token_secrets, settings, self.environ)
        now_digests = digests(found)
        first = self._config is None
        changed = [] if first else secrets_changed(self._digests, now_digests)
        config = (settings.notify, settings.telegram)
        if config == self._config and not changed:
            return []
        self._config = config
        self._digests = now_digests
        await self._stop_tasks()
        built = await asyncio.to_thread(build_notifiers, settings, self.environ, self.secrets)
        self._bot = built.bot
        for problem in built.problems:
            log.error("notify_config_invalid", error=problem)
        notifier = built.notifier()
        self.notifier = None if notifier is None else _Watched(notifier, self._seen)
        self._reset_channels(settings, built)
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
            key, chat = telegram_key(built.chat_id), built.chat_id

            def on_state(up: bool, why: str | None) -> None:
                self._set("telegram", key, f"telegram bot -> chat {chat}", "up" if up else "off", why)

            bot = TelegramAnswerer(built.bot, answerer, state, self.on_press, on_state=on_state)
            self._tasks.append(self._spawn(bot.run(self.stop), "telegram"))
        if not first:
            log.info(
                "notifications_reconfigured",
                sending=self.notifier is not None,
                telegram_answers=built.bot is not None,
                secrets_changed=changed,
            )
        self.wake.set()
        return changed

    # -- the channels' states

    def _reset_channels(self, settings: Settings, built: Notifiers) -> None:
        """Every channel of the new notifiers: URLs untried (until a send says up or off), the bot being checked or
        off. A URL is never said up before a message went through it: a dead URL read "up" until the first send."""
        self.channels = {}
        if built.urls_problem is not None:
            self._set("apprise", URLS_KEY, "notify.urls", "off", built.urls_problem, write=False)
        if built.apprise is not None:  # apprise itself is imported at the first send
            for key, url in zip(built.apprise.keys, built.urls, strict=True):
                why = "nothing sent to it since it was loaded (`ambient notify test` sends a message)"
                self._set("apprise", key, redact_url(url, self.secrets), "untried", why, write=False)
        tg = settings.telegram
        if tg.answers and tg.chat_id:
            key, display = telegram_key(tg.chat_id), f"telegram bot -> chat {tg.chat_id}"
            if built.bot is None:
                self._set("telegram", key, display, "off", built.telegram_problem, write=False)
            else:
                self._set("telegram", key, display, "checking", "the Bot API is being asked", write=False)
        self._write()

    def _set(
        self,
        channel: Literal["telegram", "apprise"],
        key: str,
        target: str,
        state: State,
        why: str | None,
        *,
        write: bool = True,
    ) -> None:
        """A channel's state; a change is logged (``channel_up``, ``channel_off``) and written for the CLI, and a
        Telegram bot that comes up is sent what it missed."""
        # What is written and logged never holds a secret (apprise's masked display keeps a token in a json:// path).
        target = redact_text(target, self.secrets)
        why = None if why is None else redact_text(why, self.secrets)
        old = self.channels.get(key)
        if not moved(old, state, why):
            return
        self.channels[key] = with_state(
            old, channel=channel, key=key, target=target, state=state, why=why, now=self.clock.now()
        )
        if state == "up":
            log.info("channel_up", channel=channel, target=target)
        elif state == "off":
            log.warning("channel_off", channel=channel, target=target, why=why)
        if write:
            self._write()
        if state == "up" and channel == "telegram" and (old is None or old.state != "up"):
            task = asyncio.get_running_loop().create_task(self._catch_up(key, target))
            self._catch_ups.add(task)
            task.add_done_callback(self._catch_ups.discard)

    def _seen(self, report: SendReport) -> None:
        """A send's results: a target that took the message is up, one that refused it is off (and says why)."""
        for r in report.results:
            old = self.channels.get(r.key)
            if old is None or (not r.ok and old.state == "off"):  # off already: its first reason stands (no flapping)
                continue
            why = None if r.ok else f"the last message failed: {r.detail or 'refused'}"
            self._set(old.channel, r.key, old.target, "up" if r.ok else "off", why)

    async def _catch_up(self, key: str, target: str) -> None:
        """Queue for a channel that came up the pending escalations it never got (only for it: the others had
        theirs)."""
        if self.on_channel_up is None:
            return
        others = frozenset(k for k in self.channels if k != key)
        try:
            queued = await self.on_channel_up(key, target, others)
        except (AmbientError, OSError) as exc:
            log.warning("channel_catch_up_failed", target=target, error=redact_text(str(exc)))
            return
        channel = self.channels[key].channel if key in self.channels else "telegram"
        log.info("channel_caught_up", channel=channel, target=target, queued=queued)
        if queued:
            self.wake.set()

    def _write(self) -> None:
        report = ChannelsReport(pid=os.getpid(), written_at=self.clock.now(), channels=tuple(self.channels.values()))
        try:
            atomic_write(
                channels_path(self.state_dir),
                report.model_dump_json(indent=1) + "\n",
                mode=PRIVATE_FILE,
                durable=False,
            )
        except OSError as exc:  # a full disk: the log lines above said it; the next change writes it again
            log.warning("channels_not_written", error=str(exc))

    async def close(self) -> None:
        """Stop the sender and the answerer (shutdown)."""
        await self._stop_tasks()

    async def _stop_tasks(self) -> None:
        tasks, self._tasks = self._tasks, []
        catch_ups, self._catch_ups = list(self._catch_ups), set()
        for task in [*tasks, *catch_ups]:
            task.cancel()
        await asyncio.gather(*tasks, *catch_ups, return_exceptions=True)
        bot, self._bot = self._bot, None
        if bot is not None:
            with contextlib.suppress(Exception):  # closing a client that failed to connect may fail: nothing lost
                await bot.aclose()
