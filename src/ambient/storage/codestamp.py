"""The stamp of the code that fills a derived file, so that a file filled by other code is rebuilt.

A derived file (the claims census's index, the query store) keeps what ambient's rules read from the brain's files.
Other rules, other content: it carries :func:`code_stamp` of the code that filled it, and a reader whose own stamp
differs discards it and rebuilds. The stamp covers ambient's version (an upgrade), the file's format number (bumped
by hand when a table or a field changes) and the size and mtime of each module whose rules decide the content (an
edit of a checkout, where the version stays the same).

The modules are named, found with ``importlib.util.find_spec`` and ``stat``ed, never imported: a reader that finds
nothing changed imports none of them. ``bench/query.py`` needs it: ``ambient status`` answers from the query store
without pydantic (0.09-0.12 s warm, target ≤ 0.3 s), and importing the store's rule modules to stamp it took 1.0-1.1 s
at a load of 8 (2026-12-07; bench/README.md, "Spare files, the import hook and the code stamp"). Stamping by
content instead of mtime measured the same (0.4-0.8 ms against 1-12 ms, most of both finding the packages), but a
checkout whose files are touched without a change would keep its store: no benchmark asks for that.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path

from ambient import __version__


@functools.cache
def code_stamp(fmt: int, modules: tuple[str, ...]) -> str:
    """16 hex digits naming ambient's version, ``fmt`` and the size and mtime of ``modules`` (dotted names; one
    that cannot be found or read counts as absent). Computed once per process."""
    h = hashlib.sha256(f"{__version__}:{fmt}".encode())
    for name in modules:
        spec = importlib.util.find_spec(name)
        where = spec.origin if spec is not None else None
        if where is None:
            continue
        try:
            st = Path(where).stat()
        except OSError:
            continue
        h.update(f"{name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()[:16]
