"""Logging set-up for the whole process, applied once by the CLI: structlog over stdlib logging.

Console output on a terminal, JSON lines otherwise (journald); stdlib records (apprise, asyncio) go
through the same processors; secrets are masked last (RELIABILITY §2.2, S-06). Library modules only
call ``structlog.get_logger(__name__)``.
"""

from __future__ import annotations

import logging
import sys
from typing import IO, Any

import structlog

from ambient.core.redact import RedactProcessor, SecretRegistry
from ambient.core.terminal import printable

# apprise writes the full Telegram URL, bot token included, at DEBUG (RELIABILITY finding 6);
# httpx/httpcore log every request URL (the Bot API URL carries the token) at INFO/DEBUG.
_QUIET_LOGGERS = ("apprise", "httpx", "httpcore", "urllib3", "requests", "watchfiles")


class _QuietFilter(logging.Filter):
    """Drop records under WARNING from the quiet loggers, even if someone lowered their level."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        name = record.name
        return not any(name == q or name.startswith(q + ".") for q in _QUIET_LOGGERS)


class _AmbientHandler(logging.StreamHandler[IO[str]]):
    """The one root handler ambient installs; recognised so a second configure replaces it."""


def _level_number(level: int | str) -> int:
    if isinstance(level, int):
        return level
    number = logging.getLevelName(level.strip().upper())
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {level!r}; expected DEBUG, INFO, WARNING, ERROR or CRITICAL")
    return number


def _printable_values(render: Any) -> Any:
    """The console renderer, with string values escaped for the terminal first (:mod:`ambient.core.terminal`).

    It writes the event and a traceback as they are (other fields as their ``repr``, which escapes control
    characters already), and both can carry agent text: a library's message, an exception's. JSON lines need
    nothing: ``json`` escapes them.
    """

    def _render(logger: Any, name: str, event_dict: Any) -> Any:
        for key, value in event_dict.items():
            if isinstance(value, str):
                event_dict[key] = printable(value)
        return render(logger, name, event_dict)

    return _render


def configure_logging(
    level: int | str = "INFO",
    json: bool | None = None,
    registry: SecretRegistry | None = None,
    *,
    stream: IO[str] | None = None,
) -> None:
    """Configure structlog and stdlib logging for this process (call once, from the CLI).

    Args:
        level: the root level (name or number).
        json: True for JSON lines, False for the console renderer, None to choose by whether
            ``stream`` is a TTY (JSON under systemd, where stderr is not a terminal).
        registry: secret values to mask in every line, in addition to the token patterns.
        stream: where lines go (default: ``sys.stderr``).
    """
    number = _level_number(level)
    out = stream if stream is not None else sys.stderr
    if json is None:
        isatty = getattr(out, "isatty", None)
        json = not (callable(isatty) and isatty())

    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,  # first: run_id/workflow/item bound around the work
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    console = structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)
    renderer: Any = structlog.processors.JSONRenderer(default=str) if json else _printable_values(console)
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,  # stdlib records (apprise, asyncio) get the same fields
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,  # tracebacks become strings ...
            RedactProcessor(registry),  # ... so the redaction, last, sees them (§2.2)
            renderer,
        ],
    )
    handler = _AmbientHandler(out)
    handler.setFormatter(formatter)
    handler.addFilter(_QuietFilter())

    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _AmbientHandler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(number)
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(number, logging.WARNING))

    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
