"""structlog only when a line is logged: module loggers that import it on first use, and a set-up that runs when it
is imported.

structlog brings asyncio and its renderers: a short command that logs nothing (``ambient status``) should not pay for
them because the modules it imports keep a logger. ``log = get_logger(__name__)`` behaves as
``structlog.get_logger(__name__)`` once a line is logged; :func:`set_up_on_import` (the CLI's quiet logging) sets
structlog up right after its module has run, whoever imports it, before any line can be logged.

Why (``bench/query.py``: ``ambient status``, target ≤ 0.3 s): on a fresh brain, 2026-12-07 at a load of 12, status
took 167 ms of CPU (median of 20) with structlog set up on import and 223 ms with it imported at once to be set up
(685 against 518 ms of wall time); bench/README.md, "Spare files, the import hook and the code stamp".
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
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


def set_up_on_import(set_up: Callable[[], None]) -> None:
    """Run ``set_up`` right after structlog is imported, or now if it is (a later call replaces an earlier one that
    has not run yet)."""
    if "structlog" in sys.modules:
        set_up()
        return
    for finder in sys.meta_path:
        if isinstance(finder, _SetUpOnImport):
            finder.set_up = set_up
            return
    sys.meta_path.insert(0, _SetUpOnImport(set_up))


class _SetUpOnImport:
    """A finder on ``sys.meta_path`` that finds nothing itself: when structlog is imported, it lets the other finders
    find it and runs its set-up right after structlog's module has run. It leaves ``sys.meta_path`` at once."""

    def __init__(self, set_up: Callable[[], None]) -> None:
        self.set_up = set_up

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "structlog":
            return None
        import importlib.util

        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run, set_up = loader.exec_module, self.set_up

        def exec_module(module: Any) -> None:
            run(module)
            set_up()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
