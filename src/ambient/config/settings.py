"""ambient's own configuration (``profil/ambient.yml`` + ``AMBIENT_*`` environment overrides).

Pure: built from the mappings the shell passes in (file contents, environ); reads nothing.
A typo in the file is an error (``extra="forbid"``), defaults work without any file, and
notification URLs are secrets (``SecretStr``): they may carry bot tokens.

Environment overrides (they win over the file):

=============================  ==========================================
``AMBIENT_TICK_SECONDS``       ``tick_seconds``
``AMBIENT_CONCURRENCY``        ``concurrency``
``AMBIENT_LOG_LEVEL``          ``log_level``
``AMBIENT_LOG_FORMAT``         ``log_format`` (auto|json|console)
``AMBIENT_NOTIFY_URLS``        ``notify.urls`` (comma or space separated)
``AMBIENT_SHUTDOWN_GRACE``     ``shutdown_grace_s``
``AMBIENT_BUDGET_PER_RUN_USD`` ``budget.per_run_usd`` (``none``: no budget)
``AMBIENT_BUDGET_DAILY_USD``   ``budget.daily_usd`` (``none``: no budget)
``AMBIENT_AGENT_USER``         ``agent_user``
=============================  ==========================================
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from ambient.cluster.protocol import DEFAULT_NAMESPACE, Names
from ambient.core.redact import redact_url
from ambient.engine.budget import Limits
from ambient.learning.rules import DEFAULT_AUTO_REPEATS, DEFAULT_BACKOFF_S
from ambient.runners.patterns import DEFAULT_PATTERN_AFTER
from ambient.workflows.fields import SATELLITE_TYPES

LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["auto", "json", "console"]
ResultNotify = Literal["none", "failures", "all"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NotifySettings(_Strict):
    """Where escalations and results are sent (apprise URLs)."""

    urls: list[SecretStr] = Field(default_factory=list)
    results: ResultNotify = "failures"
    digest: bool = False  # results and automatic decisions batched into one message per digest_hours
    digest_hours: float = Field(default=24.0, gt=0)
    retry_base_s: float = Field(default=5.0, gt=0)  # first retry within this; doubles each time
    retry_cap_s: float = Field(default=900.0, gt=0)  # escalations are retried for ever, at most this apart


class TelegramSettings(_Strict):
    """Answering escalations from Telegram buttons (opt-in)."""

    answers: bool = False
    chat_id: str | None = None
    user_ids: list[int] = Field(default_factory=list)
    api_base: str = "https://api.telegram.org"
    token_file: str | None = None  # default: $CREDENTIALS_DIRECTORY/telegram-token
    poll_timeout_s: int = Field(default=25, ge=0, le=50)

    @field_validator("chat_id", mode="before")
    @classmethod
    def _chat_id_as_written(cls, value: Any) -> Any:
        """``chat_id: 123456789`` unquoted is the chat it names (YAML reads a number; Telegram takes either)."""
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class BudgetSettings(_Strict):
    """What AI agents may spend (``ambient.engine.budget``): per run, and per UTC day across all runs; None: no budget.
    Reaching one holds the run (no new agent starts) and asks the person: raise | wait | abort."""

    per_run_usd: float | None = Field(default=None, gt=0, le=1_000_000)
    daily_usd: float | None = Field(default=None, gt=0, le=1_000_000)

    @field_validator("per_run_usd", "daily_usd", mode="before")
    @classmethod
    def _none_spelled(cls, value: Any) -> Any:
        """``none`` or an empty value (from the environment) is no budget."""
        if isinstance(value, str) and value.strip().lower() in ("", "none", "null", "off"):
            return None
        return value

    def limits(self) -> Limits:
        """The budgets as the engine checks them (:class:`ambient.engine.spend.SpendMeter` is given this)."""
        return Limits(self.per_run_usd, self.daily_usd)


class WebSettings(_Strict):
    """The web console the daemon hosts (``web:`` present = on; ``ambient web --url`` prints its URL with the token).
    Served in a thread of its own with its own event loop, so no browser can slow the daemon."""

    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)  # 0: any free port (``ambient web --url`` says which)
    tls_cert: str | None = None  # PEM files, relative to the brain or absolute: HTTPS
    tls_key: str | None = None
    insecure_bind: bool = False  # a non-loopback host over plain HTTP: everyone on that network can act as you

    @model_validator(mode="after")
    def _safe_bind(self) -> WebSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: give both, or neither")
        loopback = self.host in ("127.0.0.1", "localhost", "::1") or self.host.startswith("127.")
        if not loopback and self.tls_cert is None and not self.insecure_bind:
            raise ValueError(
                f"host {self.host} is reachable from other machines: give tls_cert and tls_key, or set "
                "insecure_bind: true if that network is yours alone"
            )
        return self


class LearningSettings(_Strict):
    """How far learned rules may go alone (docs/learning-loop.md): automatic decisions that lead back to the same
    situation on one item are at most ``auto_repeats``, the second after ``backoff_s``, doubled each time; then the
    item goes to the person and the rule back to shadow. And after how many commands of one shape the person allowed
    an AI agent its next question offers their pattern (``pattern_after``; 0: never)."""

    auto_repeats: int = Field(default=DEFAULT_AUTO_REPEATS, ge=1, le=20)
    backoff_s: float = Field(default=DEFAULT_BACKOFF_S, ge=0, le=3600)
    pattern_after: int = Field(default=DEFAULT_PATTERN_AFTER, ge=0, le=30)


_NATS_URL = re.compile(r"^(nats|tls)://[^\s/]+(:\d{1,5})?/?$")
_AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ClusterSettings(_Strict):
    """Agents run on worker hosts through NATS JetStream (docs/cluster.md; the ``cluster`` extra). ``dispatch``
    names the agents that run on the workers; every other agent runs here as before."""

    urls: list[str] = Field(min_length=1, max_length=16)  # nats://host:port or tls://host:port
    #: Every stream, subject, consumer and bucket of this brain on the server is named after it: two brains on one
    #: server need two namespaces (or an account each). The workers read it from their copy of the brain.
    namespace: str = DEFAULT_NAMESPACE
    creds: str | None = Field(default=None, min_length=1)  # the daemon's NATS credentials file, relative to the brain
    dispatch: dict[str, Literal["workers", "local"]] = Field(default_factory=dict, max_length=256)
    #: How long a worker holds an attempt without a sign of life before another worker takes it over (s); the
    #: work queue redelivers after the same time. Workers renew every third of it.
    lease_s: float = Field(default=30.0, ge=1, le=3600)
    #: A worker whose last heartbeat (every 5 s) is older than this is shown lost by ``status``, ``doctor`` and the
    #: console (s).
    lost_after_s: float = Field(default=20.0, ge=10, le=3600)
    #: How long the daemon waits for a sign of life of the worker holding an attempt (a renewal of its lease, or
    #: another worker taking it over) before it closes the attempt and escalates the item (s); null: for ever.
    unreachable_after_s: float | None = Field(default=600.0, ge=1, le=7 * 86400)

    @field_validator("urls", mode="before")
    @classmethod
    def _one_url(cls, value: Any) -> Any:
        """``urls: nats://host:4222`` alone is a list of one."""
        return [value] if isinstance(value, str) else value

    @field_validator("urls")
    @classmethod
    def _check_urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not _NATS_URL.match(url):
                raise ValueError(f"{url!r} is not a NATS server URL; expected nats://HOST:PORT or tls://HOST:PORT")
        return value

    @field_validator("namespace")
    @classmethod
    def _check_namespace(cls, value: str) -> str:
        Names(value)  # the rule of a namespace, in one home; raises ValueError saying what is expected
        return value

    def names(self) -> Names:
        """The names of this brain's streams, subjects, consumers and buckets on the server."""
        return Names(self.namespace)

    @model_validator(mode="after")
    def _deadline_after_lease(self) -> ClusterSettings:
        if self.unreachable_after_s is not None and self.unreachable_after_s < 2 * self.lease_s:
            raise ValueError(
                f"unreachable_after_s ({self.unreachable_after_s:g}) must be at least twice lease_s "
                f"({self.lease_s:g}): another worker takes a lapsed lease over (a lease, then the redelivery) before "
                "the daemon gives up on its worker; or null: wait for ever"
            )
        return self

    @field_validator("dispatch")
    @classmethod
    def _check_agents(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not _AGENT_NAME.match(name):
                raise ValueError(f"{name!r} is not an agent name")
        return value


class Settings(_Strict):
    """Every knob of the daemon, with defaults that work."""

    tick_seconds: float = Field(default=30.0, gt=0, le=86_400)
    concurrency: int = Field(default=4, ge=1, le=256)
    shutdown_grace_s: float = Field(default=10.0, ge=0, le=600)
    lock_ttl_min: float = Field(default=60, gt=0)  # minutes; renewed while its agent runs (service.leases.Leases)
    stale_claim_hours: float = Field(default=24.0, gt=0)
    breaker_threshold: int = Field(default=3, ge=1)
    log_level: LogLevel = "info"
    log_format: LogFormat = "auto"
    default_sender: str = "ambient"
    notify: NotifySettings = Field(default_factory=NotifySettings)
    telegram: TelegramSettings = Field(default_factory=TelegramSettings)
    runners: dict[str, dict[str, Any]] = Field(default_factory=dict)
    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    #: Model calls in flight at once to one model API (its base URL), all agents together; the model gateway makes
    #: the others wait their turn (a provider's concurrency or rate limit). None: no limit.
    model_calls: int | None = Field(default=None, ge=1, le=1024)
    learning: LearningSettings = Field(default_factory=LearningSettings)
    web: WebSettings | None = None  # the web console hosted by the daemon; absent: not hosted (``ambient web``)
    cluster: ClusterSettings | None = None  # agents run on worker hosts; absent: every agent runs here
    #: Whom a daemon run as root runs a command agent as when its runner names no ``user:`` (never root's powers:
    #: ``root`` keeps uid 0 without any capability). Ignored when ambient is not root.
    agent_user: str = Field(default="ambient-agent", min_length=1, max_length=64, pattern=r"^[a-z_][a-z0-9_-]*\$?$")
    # step type → agent, for chain steps without agents: and satellites (a workflow's own default_agents: wins)
    default_agents: dict[str, str] = Field(default_factory=dict)

    @field_validator("default_agents")
    @classmethod
    def _step_types(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - set(SATELLITE_TYPES))
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not a step type; expected one of {', '.join(SATELLITE_TYPES)}")
        return value

    def tells_the_person(self) -> bool:
        """Whether a notification reaches anyone: a notify URL, or Telegram answers with a chat to write to."""
        return bool(self.notify.urls) or (self.telegram.answers and bool(self.telegram.chat_id))

    def redacted(self) -> dict[str, Any]:
        """A JSON-ready dump with secrets masked, for ``ambient config show``."""
        data = self.model_dump(mode="json")
        # Only a URL's credentials (user:password, a token in the host, path or query) are masked, by the one rule
        # of secret redaction: a person checks which URL the daemon uses (a loopback json:// hook stays whole).
        data["notify"]["urls"] = [_mask_url(u.get_secret_value()) for u in self.notify.urls]
        return data


def _mask_url(url: str) -> str:
    return redact_url(url)


_ENV: dict[str, tuple[str, ...]] = {
    "AMBIENT_TICK_SECONDS": ("tick_seconds",),
    "AMBIENT_CONCURRENCY": ("concurrency",),
    "AMBIENT_LOG_LEVEL": ("log_level",),
    "AMBIENT_LOG_FORMAT": ("log_format",),
    "AMBIENT_SHUTDOWN_GRACE": ("shutdown_grace_s",),
    "AMBIENT_NOTIFY_URLS": ("notify", "urls"),
    "AMBIENT_AGENT_USER": ("agent_user",),
    "AMBIENT_BUDGET_PER_RUN_USD": ("budget", "per_run_usd"),
    "AMBIENT_BUDGET_DAILY_USD": ("budget", "daily_usd"),
}


def env_paths(environ: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """The ``AMBIENT_*`` variables set in ``environ`` and the setting each one sets."""
    return {var: path for var, path in _ENV.items() if var in environ}


def merge_environ(data: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """The file's mapping with ``AMBIENT_*`` overrides applied (environment wins)."""
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in data.items()}
    for var, path in _ENV.items():
        if var not in environ:
            continue
        raw = environ[var]
        value: Any = [u for u in re.split(r"[,\s]+", raw) if u] if path == ("notify", "urls") else raw
        node: Any = out
        for key in path[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                node = None  # `notify: none` in the file: left as written, validation reports its line
                break
            node = child
        if node is not None:
            node[path[-1]] = value
    return out


def settings_from(data: Mapping[str, Any] | None, environ: Mapping[str, str]) -> Settings:
    """Validate settings from file data and environment (raises pydantic ValidationError)."""
    return Settings.model_validate(merge_environ(data or {}, environ))


def settings_salvaged(data: Mapping[str, Any] | None, environ: Mapping[str, str]) -> Settings:
    """Settings from a file that does not validate, keeping every key that does: each key a problem names (an
    unknown key, a bad value) falls back to its default.

    A daemon starting with no previous good version to keep uses this: on bare defaults a typo (``concurency: 3``)
    silently cost it the file's notification URLs, and every question waited unseen. The problems are still
    reported, with their lines, as errors.
    """
    file = dict(data or {})
    env = dict(environ)
    merged: dict[str, Any] = merge_environ(file, env)
    for _ in range(8):  # each round drops what the last one named; a few rounds settle any file
        try:
            return Settings.model_validate(merged)
        except ValidationError as exc:
            locs = [tuple(e["loc"]) for e in exc.errors()]
            bad_vars = {v for v, path in env_paths(env).items() if any(loc[: len(path)] == path for loc in locs)}
            if bad_vars:  # a variable's bad value: the file's own value stands again
                env = {k: v for k, v in env.items() if k not in bad_vars}
                kept = merge_environ(file, env)
            else:
                file = _without(file, locs)
                kept = merge_environ(file, env)
            if kept == merged:
                break
            merged = kept
    return Settings()


def _without(data: dict[str, Any], locs: list[tuple[Any, ...]]) -> dict[str, Any]:
    """``data`` without the keys at ``locs`` (two levels deep at most: ``notify.urls``, not one URL of it)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for loc in locs:
        keys = [k for k in loc[:2] if isinstance(k, str)]
        if not keys:
            continue
        node: Any = out
        for key in keys[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(keys[-1], None)
    return out


def settings_changes(old: Settings, new: Settings) -> list[str]:
    """The dotted names of the settings that differ between two snapshots (secret values compared, never shown)."""
    return changed_keys(_revealed(old.model_dump()), _revealed(new.model_dump()))


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The dotted names (two levels: ``notify.urls``, ``runners.coder``) whose values differ in two dumps."""
    return _changed(dict(old), dict(new), "")


def _revealed(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, dict):
        return {k: _revealed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_revealed(v) for v in value]
    return value


def _changed(a: Any, b: Any, prefix: str) -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict) and prefix.count(".") < 2:  # notify.urls, runners.coder
        out: list[str] = []
        for key in sorted(set(a) | set(b)):
            out += _changed(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return [] if a == b else [prefix.rstrip(".")]
