"""What the console derived from a file, kept while the file is unchanged: a finished run's journal never changes,
yet its page would read and parse all of it (a 1,000-item run: ~1 MiB of JSON lines) at every request and every
live refresh. One bounded cache per server process, keyed by the file's (inode, size, mtime_ns) and what the caller
derived it with; shared by the worker threads that render pages, hence its lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")


class FileCache(Generic[T]):
    """The newest ``size`` values derived from files (least recently used dropped first)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._values: OrderedDict[tuple[str, int, int, int, Hashable], T] = OrderedDict()

    def get(self, path: Path, extra: Hashable, derive: Callable[[Path], T]) -> T:
        """``derive(path)``, or what it gave for this very file (same inode, size and mtime) and ``extra`` before.

        The file is stat'ed before it is read: a write in between gives a value newer than its key, which a later
        request (seeing the new size or mtime) does not find, so it is read again, never served stale.
        """
        try:
            st = path.stat()
        except OSError:  # gone or unreadable: whatever ``derive`` makes of it, not kept
            return derive(path)
        key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, extra)
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key]
        value = derive(path)
        with self._lock:
            self._values[key] = value
            self._values.move_to_end(key)
            while len(self._values) > self.size:
                self._values.popitem(last=False)
        return value

    def clear(self) -> None:
        """Forget every value (tests)."""
        with self._lock:
            self._values.clear()
