"""Module loggers that import structlog on first use.

structlog brings asyncio and its renderers (~50 ms): a short command that logs nothing (``ambient status``) should
not pay for them because the modules it imports keep a logger. ``log = get_logger(__name__)`` behaves as
``structlog.get_logger(__name__)`` once a line is logged.
"""

from __future__ import annotations

from typing import Any


class LazyLogger:
    """``structlog.get_logger(name)``, fetched at the first attribute asked of it."""

    __slots__ = ("_logger", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, attr: str) -> Any:
        if self._logger is None:
            import structlog

            self._logger = structlog.get_logger(self._name)
        return getattr(self._logger, attr)


def get_logger(name: str) -> Any:
    """A logger named ``name`` that imports structlog only when it first logs."""
    return LazyLogger(name)
