"""File events → engine wake-ups. Decides nothing: events are hints, evaluators re-read the files.

Directories are watched, not files, so editors' atomic-rename saves are seen (watchfiles #127).
ambient's own churn is filtered out (temp files, locks, journals, live context), so the daemon
never wakes itself in a loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from pathlib import Path

import structlog

from ambient.storage.fsutil import TMP_MARK, private_dir
from ambient.storage.paths import BrainPaths

log = structlog.get_logger(__name__)

# The sub-trees of a brain whose changes mean something to the engine.
_WATCHED_SUFFIXES = (".yml", ".yaml", ".json", ".md")


class BrainFilter:
    """watchfiles filter: keep changes under the watched folders, drop ambient's own churn."""

    def __init__(self, paths: BrainPaths) -> None:
        self._roots = tuple(str(p) for p in watched_dirs(paths))

    def __call__(self, change: object, path: str) -> bool:
        name = path.rsplit("/", 1)[-1]
        if TMP_MARK in name or name.startswith(".") or not name.endswith(_WATCHED_SUFFIXES):
            return False
        return path.startswith(self._roots)

    def __repr__(self) -> str:
        return f"BrainFilter({len(self._roots)} dirs)"


def watched_dirs(paths: BrainPaths) -> list[Path]:
    """The folders whose changes wake the engine."""
    return [paths.workflows, paths.claims, paths.profil, paths.agents, paths.escalations, paths.inbox]


async def watch_brain(
    paths: BrainPaths,
    on_change: Callable[[Iterable[Path]], None],
    stop: asyncio.Event,
    *,
    debounce_ms: int = 20,
    step_ms: int = 10,
    ready: asyncio.Event | None = None,
    ignore: Callable[[str], bool] | None = None,
) -> None:
    """Call ``on_change(paths)`` for every batch of relevant changes until ``stop`` is set.

    ``ready`` is set once the watches are in place, so the daemon sends READY=1 only then: a file dropped
    right after READY is seen at once instead of at the next timed tick (found by the end-to-end tests).
    ``ignore(path)``: changes that are ambient's own writes (the claims it mirrors); a batch of only those
    wakes nothing (a fan-out writes one claim per item, and each woke the engine).
    """
    from watchfiles import awatch  # imported here: only the daemon pays for it

    dirs = watched_dirs(paths)
    for d in dirs:
        if paths.state in d.parents:
            private_dir(d)  # ambient's state: 0700, never a link
        else:
            d.mkdir(parents=True, exist_ok=True)
    if ready is not None:
        # Setting the event does not yield: the first step of ``async for`` below runs in this same task step and
        # builds the inotify watches (RustNotify) synchronously, before any waiter of ``ready`` can run.
        ready.set()
    async for changes in awatch(
        *dirs,
        watch_filter=BrainFilter(paths),
        debounce=debounce_ms,
        step=step_ms,
        stop_event=stop,
        recursive=False,
        ignore_permission_denied=True,
    ):
        changed = [Path(p) for p in {p for _, p in changes} if ignore is None or not ignore(p)]
        if not changed:
            continue
        log.debug("files_changed", count=len(changed))
        on_change(changed)
