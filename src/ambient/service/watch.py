"""File events → engine wake-ups. Decides nothing: events are hints, evaluators re-read the files.

Directories are watched, not files, so editors' atomic-rename saves are seen (watchfiles #127).
ambient's own churn is filtered out (temp files, locks, journals, live context), so the daemon
never wakes itself in a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import struct
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from ambient.core.lazylog import get_logger
from ambient.storage.fsutil import TMP_MARK, private_dir
from ambient.storage.paths import BrainPaths

log = get_logger(__name__)

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

    On Linux the inotify descriptor is read by the event loop itself (:class:`Inotify`): a change is seen as the
    kernel reports it. watchfiles looks every ``step_ms`` and hands a batch on once a step brings nothing new:
    15-20 ms from a dropped workflow to the engine's wake-up, most of the drop → first SPAWN latency
    (bench/fanout.py (d)), and a thread taking the GIL 100 times a second meanwhile. watchfiles stays the way
    elsewhere, or where inotify cannot be had (no instance left: ``fs.inotify.max_user_instances``).
    """
    dirs = watched_dirs(paths)
    for d in dirs:
        if paths.state in d.parents:
            private_dir(d)  # ambient's state: 0700, never a link
        else:
            d.mkdir(parents=True, exist_ok=True)
    keep = BrainFilter(paths)
    try:
        notify = Inotify()
    except OSError as exc:
        log.info("inotify_unavailable", error=str(exc))
    else:
        with notify:
            await _watch_inotify(notify, dirs, keep, on_change, stop, ready, ignore)
        return
    await _watch_watchfiles(dirs, keep, on_change, stop, ready, ignore, debounce_ms, step_ms)


def _changed(paths: Iterable[str], keep: BrainFilter, ignore: Callable[[str], bool] | None) -> list[Path]:
    """The paths of a batch that mean something to the engine (filtered, ambient's own writes left out)."""
    return [Path(p) for p in dict.fromkeys(paths) if keep(None, p) and (ignore is None or not ignore(p))]


async def _watch_inotify(
    notify: Inotify,
    dirs: list[Path],
    keep: BrainFilter,
    on_change: Callable[[Iterable[Path]], None],
    stop: asyncio.Event,
    ready: asyncio.Event | None,
    ignore: Callable[[str], bool] | None,
) -> None:
    loop = asyncio.get_running_loop()
    lost: list[Path] = []  # watched folders gone (deleted or moved away): watched again once they are back
    for d in dirs:
        if not notify.add(d):
            lost.append(d)
    if ready is not None:
        ready.set()

    def readable() -> None:
        found: list[str] = []
        for folder, name, mask in notify.read():
            if mask & (_IN_IGNORED | _IN_Q_OVERFLOW):
                # The queue overflowed, or a folder's watch went with it: look at everything (events are hints).
                on_change(dirs)
                if mask & _IN_IGNORED and folder is not None:
                    lost.append(folder)
                continue
            if folder is not None and name:
                found.append(f"{folder}/{name}")
        changed = _changed(found, keep, ignore)
        if changed:
            log.debug("files_changed", count=len(changed))
            on_change(changed)

    loop.add_reader(notify.fd, readable)
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)  # a lost folder is looked for once a second
            for d in list(lost):
                if notify.add(d):
                    lost.remove(d)
                    on_change([d])  # what changed while it was not watched
    finally:
        loop.remove_reader(notify.fd)


async def _watch_watchfiles(
    dirs: list[Path],
    keep: BrainFilter,
    on_change: Callable[[Iterable[Path]], None],
    stop: asyncio.Event,
    ready: asyncio.Event | None,
    ignore: Callable[[str], bool] | None,
    debounce_ms: int,
    step_ms: int,
) -> None:
    from watchfiles import awatch  # imported here: only a daemon without inotify pays for it

    if ready is not None:
        # Setting the event does not yield: the first step of ``async for`` below runs in this same task step and
        # builds the inotify watches (RustNotify) synchronously, before any waiter of ``ready`` can run.
        ready.set()
    async for changes in awatch(
        *dirs,
        watch_filter=keep,
        debounce=debounce_ms,
        step=step_ms,
        stop_event=stop,
        recursive=False,
        ignore_permission_denied=True,
    ):
        changed = _changed((p for _, p in changes), keep, ignore)
        if not changed:
            continue
        log.debug("files_changed", count=len(changed))
        on_change(changed)


_IN_MODIFY = 0x00000002
_IN_ATTRIB = 0x00000004
_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_FROM = 0x00000040
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_DELETE = 0x00000200
_IN_DELETE_SELF = 0x00000400
_IN_MOVE_SELF = 0x00000800
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_ONLYDIR = 0x01000000
_IN_DONT_FOLLOW = 0x02000000
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
#: What a folder's watch reports: its entries created, written, renamed, deleted, their modes changed; the folder
#: itself deleted or moved (its watch then ends with IN_IGNORED).
_MASK = (
    _IN_MODIFY
    | _IN_ATTRIB
    | _IN_CLOSE_WRITE
    | _IN_MOVED_FROM
    | _IN_MOVED_TO
    | _IN_CREATE
    | _IN_DELETE
    | _IN_DELETE_SELF
    | _IN_MOVE_SELF
    | _IN_ONLYDIR
    | _IN_DONT_FOLLOW
)
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name, NUL-padded)


class Inotify:
    """One inotify instance (Linux), its folders' watches, its events read without blocking (the event loop reads
    it when the descriptor is readable). Raises OSError where there is none to be had."""

    def __init__(self) -> None:
        if not sys.platform.startswith("linux"):
            raise OSError(errno.ENOSYS, "inotify is Linux only")
        libc = ctypes.CDLL(None, use_errno=True)
        self._add_watch = libc.inotify_add_watch
        self._add_watch.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        self._add_watch.restype = ctypes.c_int
        self._rm_watch = libc.inotify_rm_watch
        self._rm_watch.argtypes = (ctypes.c_int, ctypes.c_int)
        self._rm_watch.restype = ctypes.c_int
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self.fd: int = fd
        self._folders: dict[int, Path] = {}

    def add(self, folder: Path) -> bool:
        """Watch ``folder`` (not what is below it); False when it is not there or may not be read."""
        wd = self._add_watch(self.fd, os.fsencode(folder), _MASK)
        if wd < 0:
            log.debug("folder_not_watched", folder=str(folder), error=os.strerror(ctypes.get_errno()))
            return False
        self._folders[wd] = folder
        return True

    def read(self) -> list[tuple[Path | None, str, int]]:
        """The events waiting, as (folder, name, mask): folder None for an overflow; a folder whose watch ended
        (IN_IGNORED) is forgotten."""
        out: list[tuple[Path | None, str, int]] = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return out
            except InterruptedError:
                continue
            at = 0
            while at + _EVENT.size <= len(data):
                wd, mask, _cookie, size = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size : at + _EVENT.size + size].split(b"\0", 1)[0]
                at += _EVENT.size + size
                if mask & _IN_MOVE_SELF and wd in self._folders:
                    self._rm_watch(self.fd, wd)  # moved away: its events would name the old place (IN_IGNORED follows)
                folder = self._folders.pop(wd, None) if mask & _IN_IGNORED else self._folders.get(wd)
                out.append((folder, os.fsdecode(name), mask))

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Inotify:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
