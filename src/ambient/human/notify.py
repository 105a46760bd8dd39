"""Notification delivery: sending a message to each configured target through apprise, and finding those targets.

Delivers text and decides nothing about what or whether to send (DESIGN §6). A :class:`Notifier` reports, target by
target, who accepted a message; the durable retry around it is :mod:`ambient.human.outbox`'s. The targets are the
apprise URLs of ``notify.urls`` (or ``$AMBIENT_NOTIFY_URLS``), a Telegram token filled in from a systemd credential.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import warnings
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ambient.core.errors import DeliveryError, InputError
from ambient.core.lazylog import get_logger
from ambient.core.redact import SecretRegistry, redact_text, redact_url
from ambient.human.messages import Message, fit_message
from ambient.storage.fsutil import read_capped
from ambient.storage.yamlfile import MAX_CONFIG_BYTES, expect_mapping, load_file

if TYPE_CHECKING:
    from ambient.storage.paths import BrainPaths

log = get_logger(__name__)

ENV_URLS = "AMBIENT_NOTIFY_URLS"
TOKEN_PLACEHOLDER = "{telegram_token}"  # noqa: S105 - a placeholder, not a secret
TOKEN_CREDENTIAL = "telegram-token"  # noqa: S105 - credential file name ($CREDENTIALS_DIRECTORY, LoadCredential=)
_MAX_CREDENTIAL_BYTES = 4096


# --------------------------------------------------------------------------------------------- delivery


@dataclass(frozen=True)
class TargetResult:
    """How one target (one apprise URL, one Telegram chat) took a message. Safe to log and store."""

    key: str  # stable, secret-free id of the target (a hash of its URL)
    display: str  # the target with secrets masked (apprise ``url(privacy=True)``)
    ok: bool
    detail: str = ""  # redacted reason on failure
    ref: str = ""  # delivery reference when the target gives one (the Telegram message id)


@dataclass(frozen=True)
class SendReport:
    """Per-target outcome of one send."""

    results: tuple[TargetResult, ...] = ()

    @property
    def ok(self) -> bool:
        """True when every attempted target accepted the message."""
        return all(r.ok for r in self.results)

    @property
    def delivered(self) -> frozenset[str]:
        """Keys of the targets that accepted the message."""
        return frozenset(r.key for r in self.results if r.ok)

    @property
    def failed(self) -> tuple[TargetResult, ...]:
        """The targets that did not accept it."""
        return tuple(r for r in self.results if not r.ok)

    def merge(self, other: SendReport) -> SendReport:
        """Both reports' results, in order."""
        return SendReport(self.results + other.results)


def delivery_error(report: SendReport, message: str | None = None) -> DeliveryError[SendReport]:
    """The :class:`DeliveryError` of ``report``; its message names each target that failed and why, unless given."""
    if message is None:
        failed = report.failed
        parts = "; ".join(f"{r.display}: {r.detail or 'failed'}" for r in failed)
        message = f"{len(failed)} of {len(report.results)} notification targets failed: {parts}"
    return DeliveryError(report, message)


class Notifier(Protocol):
    """Sends a message to its targets, skipping those whose keys are in ``skip`` (already delivered).

    Returns the report when every attempted target accepted the message; raises :class:`DeliveryError`
    (carrying the report) otherwise. Never blocks the event loop.
    """

    async def send(self, message: Message, *, skip: Set[str] = frozenset()) -> SendReport: ...


def target_key(kind: str, ident: str) -> str:
    """A stable id for a target that does not reveal it (its URL may hold a token)."""
    return f"{kind}:{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


@dataclass
class _AppriseTarget:
    key: str
    display: str
    apobj: Any | None  # apprise.Apprise holding this URL only, None if the URL was refused


class AppriseNotifier:
    """Sends through apprise to each configured URL, each in its own ``Apprise`` so results map to URLs.

    apprise is imported on first send, in a thread (its import and plugin scan cost ~0.3 s). Sends use
    ``async_notify`` (apprise's worker threads; the loop never blocks) with ``body_format=TEXT`` so
    agent text is escaped for HTML targets such as Telegram (S-09). Only ``url(privacy=True)`` and
    redacted details are ever logged or reported.
    """

    def __init__(self, urls: Sequence[str], *, timeout: float = 30.0, registry: SecretRegistry | None = None) -> None:
        self._urls = list(urls)
        self._timeout = timeout
        self._registry = registry
        self._targets: list[_AppriseTarget] | None = None
        self._lock = asyncio.Lock()

    @property
    def keys(self) -> list[str]:
        """Target keys, in URL order."""
        return [target_key("apprise", u) for u in self._urls]

    def _build(self) -> list[_AppriseTarget]:
        import apprise  # lazy: see the class docstring

        targets = []
        for url in self._urls:
            apobj = apprise.Apprise()
            with warnings.catch_warnings():
                # apprise's first add() scans its plugins, and the email plugin imports the deprecated
                # stdlib imghdr: keep that DeprecationWarning out of the daemon (and of -W error runs).
                warnings.filterwarnings("ignore", message=".*imghdr.*", category=DeprecationWarning)
                added = apobj.add(url)
            if added:
                # privacy=True masks the token; the query string is apprise's defaults, noise on a phone.
                display = str(apobj[0].url(privacy=True)).split("?", 1)[0]  # type: ignore[no-untyped-call]
                targets.append(_AppriseTarget(target_key("apprise", url), display, apobj))
            else:
                targets.append(_AppriseTarget(target_key("apprise", url), redact_url(url, self._registry), None))
        return targets

    async def targets(self) -> list[_AppriseTarget]:
        """The loaded targets (apprise imported on first call, off the loop)."""
        async with self._lock:
            if self._targets is None:
                self._targets = await asyncio.to_thread(self._build)
            return self._targets

    async def _send_one(self, target: _AppriseTarget, message: Message, title: str, body: str) -> TargetResult:
        if target.apobj is None:
            return TargetResult(target.key, target.display, False, "not a valid apprise URL")
        from apprise import NotifyFormat, NotifyType

        notify_type = NotifyType.WARNING if message.kind == "escalation" else NotifyType.INFO
        try:
            result = await target.apobj.async_notify(
                body=body,
                title=title,
                notify_type=notify_type,
                body_format=NotifyFormat.TEXT,
                timeout=self._timeout,
            )
        except Exception as exc:  # noqa: BLE001 - one broken plugin must not stop the other targets
            return TargetResult(target.key, target.display, False, self._clean(f"{type(exc).__name__}: {exc}"))
        # AppriseResult (2.x) is truthy only on SUCCESS (RELIABILITY finding 7).
        if result:
            return TargetResult(target.key, target.display, True)
        warnings = [e.message for e in result.logs() if e.level in ("WARNING", "ERROR", "CRITICAL")]
        detail = warnings[-1] if warnings else f"apprise status {result.status.name}"
        return TargetResult(target.key, target.display, False, self._clean(detail))

    def _clean(self, text: str) -> str:
        return redact_text(text, self._registry)[:300]

    async def send(self, message: Message, *, skip: Set[str] = frozenset()) -> SendReport:
        """Send to every URL not in ``skip``; raise :class:`DeliveryError` if any refused it."""
        if not self._urls:
            raise delivery_error(SendReport(), "no notification URL is configured")
        targets = [t for t in await self.targets() if t.key not in skip]
        title, body = fit_message(message.title, message.body)
        results = await asyncio.gather(*(self._send_one(t, message, title, body) for t in targets))
        report = SendReport(tuple(results))
        for r in report.results:
            if r.ok:
                log.info("notify_sent", target=r.display, message=message.dedupe_id)
            else:
                log.warning("notify_failed", target=r.display, message=message.dedupe_id, detail=r.detail)
        if not report.ok:
            raise delivery_error(report)
        return report


class CompositeNotifier:
    """Several notifiers as one (e.g. apprise URLs plus the interactive Telegram bot)."""

    def __init__(self, notifiers: Sequence[Notifier]) -> None:
        self._notifiers = list(notifiers)

    async def send(self, message: Message, *, skip: Set[str] = frozenset()) -> SendReport:
        """Send through each notifier; raise :class:`DeliveryError` with the merged report if any failed."""
        outcomes = await asyncio.gather(*(n.send(message, skip=skip) for n in self._notifiers), return_exceptions=True)
        report, errors = SendReport(), list[DeliveryError[SendReport]]()
        for outcome in outcomes:
            if isinstance(outcome, DeliveryError):
                report, errors = report.merge(outcome.report), [*errors, outcome]
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                report = report.merge(outcome)
        if errors:
            raise delivery_error(report) if report.results else errors[0]
        return report


# --------------------------------------------------------------------------------------------- configuration


def read_credential(name: str, environ: Mapping[str, str]) -> str | None:
    """A secret from ``$CREDENTIALS_DIRECTORY/<name>`` (systemd ``LoadCredential=``), or None if absent."""
    directory = environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return None
    path = Path(directory) / name
    try:
        raw = read_capped(path, _MAX_CREDENTIAL_BYTES)
    except FileNotFoundError:
        return None
    value = raw.decode("utf-8", "replace").strip()
    return value or None


def split_urls(text: str) -> list[str]:
    """URLs separated by commas and/or whitespace."""
    return [u for u in re.split(r"[,\s]+", text) if u]


def notify_urls_from(
    paths: BrainPaths, environ: Mapping[str, str], registry: SecretRegistry | None = None
) -> list[str]:
    """The notification URLs of a brain: ``$AMBIENT_NOTIFY_URLS`` if set, else ``notify.urls`` in
    ``profil/ambient.yml``.

    ``{telegram_token}`` in a URL is replaced by ``$CREDENTIALS_DIRECTORY/telegram-token``. Every secret
    found (the token, passwords and tokens inside URLs) is added to ``registry``.
    """
    source = f"${ENV_URLS}"
    env_value = environ.get(ENV_URLS, "").strip()
    if env_value:
        urls = split_urls(env_value)
    elif paths.config.is_file():
        name = str(paths.config)
        data, lines = load_file(paths.config, max_bytes=MAX_CONFIG_BYTES)
        source = name
        if data is None:
            return []
        notify = expect_mapping(data, source=name, what="profil/ambient.yml").get("notify")
        if notify is None:
            return []
        if not isinstance(notify, dict):
            raise InputError("notify must be a mapping with a 'urls' list", file=name, line=lines.line_for(("notify",)))
        raw = notify.get("urls", [])
        if isinstance(raw, str):
            raw = split_urls(raw)
        if not isinstance(raw, list) or not all(isinstance(u, str) for u in raw):
            raise InputError(
                "notify.urls must be a list of apprise URLs (strings)",
                file=name,
                line=lines.line_for(("notify", "urls")),
            )
        urls = [u.strip() for u in raw if u.strip()]
    else:
        return []
    return expand_urls(urls, environ, registry, source=source)


def expand_urls(
    urls: Sequence[str], environ: Mapping[str, str], registry: SecretRegistry | None = None, *, source: str = "URL"
) -> list[str]:
    """Replace ``{telegram_token}`` by the credential and register every secret of the URLs."""
    urls = list(urls)
    if any(TOKEN_PLACEHOLDER in u for u in urls):
        token = read_credential(TOKEN_CREDENTIAL, environ)
        if token is None:
            raise InputError(
                f"a notification URL uses {TOKEN_PLACEHOLDER} but no credential file "
                f"$CREDENTIALS_DIRECTORY/{TOKEN_CREDENTIAL} was found; under systemd add "
                f"'LoadCredential={TOKEN_CREDENTIAL}:/etc/ambient/{TOKEN_CREDENTIAL}' to the unit, elsewhere "
                f"export CREDENTIALS_DIRECTORY=<a 0700 directory holding the file {TOKEN_CREDENTIAL}>",
                file=source,
            )
        if registry is not None:
            registry.add(token)
        urls = [u.replace(TOKEN_PLACEHOLDER, token) for u in urls]
    if registry is not None:
        for u in urls:
            registry.add_url(u)
    return urls
