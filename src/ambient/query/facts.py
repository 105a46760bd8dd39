"""What ``ambient status`` needs of the loaded brain, kept in the query store (table ``brain_facts``).

Loading the brain (settings, agents, every workflow checked) costs a third of a second of imports and work;
status only needs two facts of it: whether notifications are set up, and which workflow files do not load. They
are kept with the signature of what they were loaded from (:func:`inputs`: the entries of ``workflows/``,
``agents/`` and ``profil/`` by inode, size and mtime, and the ``AMBIENT_*`` variables), and loaded again only when
that changed. The loading itself is the caller's (``load``): this package sits below ``ambient.config``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from ambient import __version__

if TYPE_CHECKING:
    from ambient.query.store import QueryStore
    from ambient.storage.paths import BrainPaths

#: A file changed this recently may change again within its mtime's granularity: facts are then not kept (the
#: store's "racy" rule for folders, ``store._RACY_NS``).
_RACY_NS: Final = 100_000_000


@dataclass(frozen=True)
class BrainFacts:
    """The facts of a loaded brain that ``ambient status`` shows."""

    notifications: bool  # a notification URL (or Telegram answers) is configured
    broken: tuple[tuple[str, tuple[str, ...]], ...]  # each workflow file that does not load, the names it serves

    def to_json(self) -> str:
        return json.dumps({"notifications": self.notifications, "broken": [[f, list(n)] for f, n in self.broken]})

    @classmethod
    def from_json(cls, text: str) -> BrainFacts | None:
        """The facts kept as ``text`` (None: not facts of this shape, they are loaded again)."""
        try:
            data = json.loads(text)
            broken = tuple((str(f), tuple(str(n) for n in names)) for f, names in data["broken"])
            notifications = data["notifications"]
        except (ValueError, TypeError, KeyError):
            return None
        return cls(notifications=notifications, broken=broken) if isinstance(notifications, bool) else None


def inputs(paths: BrainPaths, environ: Mapping[str, str]) -> str | None:
    """The signature of what loading the brain reads: every entry of ``workflows/``, ``agents/`` and ``profil/``
    (the loaders read only the top of each), the ``AMBIENT_*`` variables and ambient's version. None when a file
    changed too recently for its mtime to tell a later change (the facts are then loaded, not kept)."""
    h = hashlib.sha256(f"{__version__}\0".encode())
    now = time.time_ns()
    for folder in (paths.workflows, paths.agents, paths.profil):
        try:
            names = sorted(os.listdir(folder))
        except OSError as exc:
            h.update(f"{folder.name}:{exc.errno}\0".encode())
            continue
        h.update(f"{folder.name}/\0".encode())
        for name in names:
            try:
                st = (folder / name).lstat()
            except OSError:
                continue  # gone since the listing
            if now - st.st_mtime_ns < _RACY_NS:
                return None
            h.update(f"{name}:{st.st_mode}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}\0".encode())
    for key in sorted(k for k in environ if k.startswith("AMBIENT_")):
        h.update(f"{key}={environ[key]}\0".encode())
    return h.hexdigest()


def brain_facts(store: QueryStore, environ: Mapping[str, str], load: Callable[[], BrainFacts]) -> BrainFacts:
    """The facts of the brain of ``store``: the kept ones when their inputs did not change, else ``load()``'s
    (kept for the next time; a store that cannot be written only costs the speed)."""
    signature = inputs(store.paths, environ)
    if signature is not None:
        with store.reading() as conn:
            kept = dict(conn.execute("SELECT key, value FROM brain_facts").fetchall())
        if kept.get("inputs") == signature:
            facts = BrainFacts.from_json(kept.get("facts", ""))
            if facts is not None:
                return facts
    facts = load()
    if signature is not None:
        try:
            with store.writing() as conn:
                conn.executemany(
                    "INSERT OR REPLACE INTO brain_facts (key, value) VALUES (?, ?)",
                    [("inputs", signature), ("facts", facts.to_json())],
                )
        except sqlite3.Error:
            pass
    return facts
