"""The daemon's notification service alone: what a reload reads again (secrets, by hash) and the channels' states
it writes for the CLI."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from ambient.config.settings import settings_from
from ambient.core.clock import SystemClock
from ambient.core.redact import SecretRegistry
from ambient.human.escalation_store import EscalationStore
from ambient.human.outbox import Outbox
from ambient.service.notifications import TOKEN_CREDENTIAL_NAME, NotifyService, channels_path, read_channels
from ambient.storage.paths import BrainPaths

TOKEN_A = "123456789:AAH-firstToken_abcdefghijklmnopqrst"
TOKEN_B = "123456789:AAH-secondToken_abcdefghijklmnopqrs"


def _service(tmp_path: Path, creds: Path, stop: asyncio.Event) -> NotifyService:
    paths = BrainPaths(tmp_path / "brain")
    paths.state.mkdir(parents=True)

    def spawn(coro: Coroutine[Any, Any, object], name: str) -> asyncio.Task[object]:
        return asyncio.create_task(coro, name=name)

    return NotifyService(
        Outbox.for_brain(paths),
        EscalationStore(paths),
        SystemClock(),
        SecretRegistry(),
        {"CREDENTIALS_DIRECTORY": str(creds)},
        paths.state,
        lambda *a: "decided",
        spawn,
        stop,
    )


async def test_a_changed_credential_rebuilds_the_channels_and_is_named_never_shown(tmp_path: Path) -> None:
    """Same settings, a new token in $CREDENTIALS_DIRECTORY: configure rebuilds (a new notifier) and names the
    credential; unchanged, it does nothing. The URL using {telegram_token} is rebuilt with the new token too."""
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "telegram-token").write_text(TOKEN_A)
    stop = asyncio.Event()
    service = _service(tmp_path, creds, stop)
    settings = settings_from({"notify": {"urls": ["json://127.0.0.1:9/hook/{telegram_token}"]}}, {})
    try:
        assert await service.configure(settings) == []
        first = service.notifier
        assert await service.configure(settings) == [] and service.notifier is first
        (creds / "telegram-token").write_text(TOKEN_B + "\n")
        changed = await service.configure(settings)
        assert changed == [TOKEN_CREDENTIAL_NAME] and TOKEN_B not in str(changed)
        assert service.notifier is not first and TOKEN_B in service.secrets
        report = read_channels(service.state_dir)
        assert report is not None and [(c.channel, c.state) for c in report.channels] == [("apprise", "untried")]
        assert TOKEN_B not in channels_path(service.state_dir).read_text()
    finally:
        stop.set()
        await service.close()


async def test_an_unreadable_token_file_is_an_off_channel_with_its_reason_in_a_private_file(tmp_path: Path) -> None:
    """Telegram answers on, the token file missing: the bot is off and says which file; the states file is 0600."""
    stop = asyncio.Event()
    service = _service(tmp_path, tmp_path / "no-creds", stop)
    missing = tmp_path / "nowhere" / "bot-token"
    settings = settings_from({"telegram": {"answers": True, "chat_id": "42", "token_file": str(missing)}}, {})
    try:
        await service.configure(settings)
        report = read_channels(service.state_dir)
        assert report is not None
        [bot] = report.channels
        assert (bot.channel, bot.state) == ("telegram", "off")
        assert bot.why is not None and f"telegram.token_file {missing} cannot be read" in bot.why
        assert stat.S_IMODE(channels_path(service.state_dir).stat().st_mode) == 0o600
        missing.parent.mkdir()
        missing.write_text(TOKEN_A)
        assert await service.configure(settings) == ["telegram.token_file"]
        report = read_channels(service.state_dir)
        assert report is not None and [c.state for c in report.channels] == ["checking"]
    finally:
        stop.set()
        await service.close()
