"""Shared fixtures: brains laid out in tmp dirs, the shared corpus, condition waits."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog
from hypothesis import HealthCheck, settings

# CI runs on shared 2-core machines: a draw that takes seconds is the machine pausing, not a strategy that
# generates too much (seen once: 1 input in 2.7 s). Examples and shrinking are unchanged; only that timing
# check and the per-example deadline are off, for every property test.
settings.register_profile("ambient", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ambient")

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_BRAIN = REPO / "examples" / "brain"
CORPUS = Path(__file__).resolve().parent / "fixtures" / "cortex-template"  # vendored from ../shared/corpus

#: The suites of real processes (the daemon, the CLI, agents as subprocesses, kill -9, attacks, the web console and
#: its browser): the slow lane
#: whole. ``pytest -m "not slow"`` is the inner loop (tests/unit, a unit test over ~0.2 s marked slow by hand);
#: CI runs everything.
PROCESS_SUITES = ("acceptance", "e2e", "chaos", "attacks", "web")


#: Set by :func:`pytest_configure` when it made the bytecode cache of the tests' subprocesses (removed at the end).
_PYCACHE_MADE: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Under ``PYTHONDONTWRITEBYTECODE`` (some shells and sandboxes set it) no ``.pyc`` is ever written, so each
    ``ambient`` a test starts compiles ambient's sources again: a third of a daemon's start (0.35 s of CPU of
    about 1 s), thousands of times a run. The tests' subprocesses get a bytecode cache of their own instead, in a
    temporary folder (``PYTHONPYCACHEPREFIX``): nothing is written in the source tree or the venv, and the first
    start of each module fills it for every later one. Set before pytest-xdist starts its workers, who inherit it."""
    if not sys.flags.dont_write_bytecode or "PYTHONPYCACHEPREFIX" in os.environ or "PYTEST_XDIST_WORKER" in os.environ:
        return
    folder = tempfile.mkdtemp(prefix="ambient-tests-pycache-")
    _PYCACHE_MADE.append(folder)
    os.environ["PYTHONPYCACHEPREFIX"] = folder
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The tests' bytecode cache goes with the run that made it."""
    for folder in _PYCACHE_MADE:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop("PYTHONPYCACHEPREFIX", None)
        os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    _PYCACHE_MADE.clear()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test of a process suite is ``slow``, without a marker to forget in each new file."""
    tests = Path(__file__).resolve().parent
    for item in items:
        rel = item.path.relative_to(tests).parts if item.path.is_relative_to(tests) else ()
        if rel and rel[0] in PROCESS_SUITES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _reset_structlog() -> None:
    """Each test starts from structlog's defaults (no leaked configuration)."""
    structlog.reset_defaults()


@pytest.fixture
def corpus() -> Path:
    """The real public brain corpus (tests/fixtures/cortex-template): read it, or copy it before changing it."""
    return CORPUS


@pytest.fixture
def make_brain(tmp_path: Path) -> Callable[..., Path]:
    """Factory: a fresh brain in a tmp dir, copied from examples/brain (or empty)."""

    def _make(name: str = "brain", *, example: bool = True) -> Path:
        root = tmp_path / name
        if example and EXAMPLE_BRAIN.is_dir():
            shutil.copytree(EXAMPLE_BRAIN, root, symlinks=True)
        for sub in ("agents", "claims", "locks", "profil", "workflows"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        return root

    return _make


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.01) -> bool:
    """Poll a condition until it holds or the timeout passes (for subprocess tests)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


async def async_wait_until(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.01) -> bool:
    """Async twin of :func:`wait_until`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(interval)
    return predicate()


@contextlib.contextmanager
def logging_restored() -> Iterator[None]:
    """Put the logging configuration (root handlers and level, chatty libraries' levels) back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {n: logging.getLogger(n).level for n in ("apprise", "httpx", "httpcore", "urllib3", "requests")}
    try:
        yield
    finally:
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
        root.setLevel(level)
        for n, lv in levels.items():
            logging.getLogger(n).setLevel(lv)


@contextlib.contextmanager
def debug_log_buffer(*secrets: str) -> Iterator[io.StringIO]:
    """All logging at DEBUG (apprise and httpx included) as JSON lines into a buffer, with ``secrets``
    registered for redaction; the logging configuration is restored afterwards."""
    from ambient.core.redact import SecretRegistry
    from ambient.service.logsetup import configure_logging

    with logging_restored():
        buf = io.StringIO()
        configure_logging("DEBUG", True, SecretRegistry(secrets), stream=buf)
        yield buf
