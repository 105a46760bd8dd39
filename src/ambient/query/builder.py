"""Build a brain's query store in the background: ``python -m ambient.query.builder BRAIN``, started detached by
``ambient status`` when the store is missing and the brain large (:func:`start`), so that the person's command
answers at once (:mod:`ambient.query.glance`) and the next one reads the store.

One build at a time: :meth:`~ambient.query.store.QueryStore.refresh` reads the claims under the build lock, in short
transactions (readers get turns; a builder killed half way is taken up where it was by the next one); a second
builder, or the daemon's keeper, finding the lock held leaves the claims to its holder. The builder runs at a lower
priority (``nice``): it is background work on a machine the person uses. What goes wrong is written to
``.ambient/query-build.log``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Final

from ambient.query.store import QueryStore
from ambient.storage.fsutil import open_private, private_dir
from ambient.storage.paths import BrainPaths

LOG_NAME: Final = "query-build.log"
_NICE: Final = 10


def start(paths: BrainPaths) -> bool:
    """Start a builder of ``paths``'s store, detached, unless one holds the build lock; whether one was started."""
    if QueryStore(paths).building():
        return False
    try:
        private_dir(paths.state)
        log = open_private(paths.state / LOG_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    except OSError:
        return False  # a read-only .ambient/: every reader builds a store in memory anyway
    try:
        subprocess.Popen(  # noqa: S603 (our own interpreter and module, the brain's path as one argument)
            [sys.executable, "-m", "ambient.query.builder", str(paths.root)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            cwd=paths.root,
            start_new_session=True,  # not stopped by the person's Ctrl-C of the command that started it
            close_fds=True,
        )
    except OSError:
        return False
    finally:
        os.close(log)
    return True


def build(paths: BrainPaths) -> None:
    """Fill the store of ``paths`` (every file read once; the claims in short transactions under the build lock)."""
    store = QueryStore(paths)
    try:
        store.refresh()
    finally:
        store.close()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m ambient.query.builder BRAIN\n")
        return 2
    with contextlib.suppress(OSError):
        os.nice(_NICE)
    build(BrainPaths(Path(argv[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
