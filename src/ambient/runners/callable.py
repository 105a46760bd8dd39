"""The callable runner: an agent is a Python function named ``"pkg.module:function"``, run in the daemon.

A coroutine function is awaited on the loop; a plain function runs in a worker thread (``asyncio.to_thread``) so it
cannot block the loop. Its return value follows the same agent protocol as a command agent's stdout.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import time
from collections.abc import Callable, Mapping
from typing import Any

from ambient.core.errors import ImportFromStringError
from ambient.core.lazylog import get_logger
from ambient.runners.answer import interpret_output
from ambient.runners.base import RunRequest
from ambient.runners.result import AgentResult, error_result
from ambient.runners.runner_config import AnyRunnerConfig, CallableRunnerConfig

log = get_logger(__name__)


def import_from_string(target: str) -> Callable[..., Any]:
    """Import ``"pkg.module:attr.sub"`` and return the callable it names (messages in uvicorn's style)."""
    module_name, _, attrs = target.partition(":")
    if not module_name or not attrs:
        msg = f'Import string "{target}" must be in format "<module>:<attribute>".'
        raise ImportFromStringError(msg)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name and not module_name.startswith(f"{exc.name}."):
            msg = f'Could not import module "{module_name}": {exc}'
            raise ImportFromStringError(msg) from exc
        msg = f'Could not import module "{module_name}".'
        raise ImportFromStringError(msg) from None
    except Exception as exc:  # the module itself failed while importing: report it, never crash the daemon
        msg = f'Importing module "{module_name}" failed: {type(exc).__name__}: {exc}'
        raise ImportFromStringError(msg) from exc
    obj: Any = module
    try:
        for attr in attrs.split("."):
            obj = getattr(obj, attr)
    except AttributeError:
        msg = f'Attribute "{attrs}" not found in module "{module_name}".'
        raise ImportFromStringError(msg) from None
    if not callable(obj):
        msg = f'Attribute "{attrs}" in module "{module_name}" is not callable.'
        raise ImportFromStringError(msg)
    return obj  # type: ignore[no-any-return]


def _is_async(func: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))  # noqa: B004


class CallableRunner:
    """Runs in-process agents: ``func(req: RunRequest)`` returning a protocol mapping, an AgentResult or None.

    On timeout a coroutine is cancelled; a sync function cannot be stopped (Python threads cannot be killed): its
    result is discarded and its thread keeps a slot of the default executor until it returns. Prefer coroutine
    functions, or command agents, for work that may hang.
    """

    def __init__(self) -> None:
        self._cache: dict[str, Callable[..., Any]] = {}

    def load(self, target: str) -> Callable[..., Any]:
        """The callable for ``target``, imported once and cached."""
        func = self._cache.get(target)
        if func is None:
            func = import_from_string(target)
            self._cache[target] = func
        return func

    async def run(self, req: RunRequest, cfg: AnyRunnerConfig) -> AgentResult:
        """Call the agent function for ``req``; exceptions and timeouts become ``error`` results."""
        if not isinstance(cfg, CallableRunnerConfig):
            msg = f"CallableRunner cannot run a {cfg.kind!r} runner config"
            raise TypeError(msg)
        started = time.monotonic()
        try:
            func = self.load(cfg.target)
        except ImportFromStringError as exc:
            return error_result("bad_request", str(exc))
        try:
            async with asyncio.timeout(cfg.timeout_s):
                if _is_async(func):
                    value = await func(req)
                else:
                    value = await asyncio.to_thread(func, req)
                    if inspect.isawaitable(value):
                        value = await value
        except TimeoutError:
            return error_result(
                "timeout", f"agent {cfg.target} timed out after {cfg.timeout_s:g} s", duration_ms=_ms(started)
            )
        except Exception as exc:  # noqa: BLE001 - an agent's exception is its error result, never the daemon's crash
            log.warning("agent_raised", agent=req.agent, target=cfg.target, error=type(exc).__name__)
            return error_result("exception", f"{type(exc).__name__}: {exc}"[:1000], duration_ms=_ms(started))
        return _to_result(value, req).with_process(duration_ms=_ms(started))


def _to_result(value: object, req: RunRequest) -> AgentResult:
    if isinstance(value, AgentResult):
        return value
    if value is None:
        return interpret_output(None, agent=req.agent)
    if isinstance(value, Mapping):
        return interpret_output(dict(value), agent=req.agent)
    return error_result(
        "bad_output", f"agent function returned {type(value).__name__}; expected a mapping, an AgentResult or None"
    )


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
