"""The query store's refresh after one claim is written, on a big brain (the daemon's ``QueryKeeper`` and
the console's watcher refresh after each write, on a thread that shares the GIL with the event loop).

Opens the store of ``DIR`` (built from the files first if it has none: printed apart), then ``--rounds`` times:
writes one claim file as the claims writer does (a temp file renamed into ``claims/``) and times
:meth:`~ambient.query.store.QueryStore.refresh`; the same for a claim rewritten (renamed over an existing one), a
journal append, and nothing changed. Each refresh also runs in a fresh process's store once (``restart``: the first
refresh of a new process). The claims it wrote are removed at the end. Run it with another checkout's ``src/`` on
PYTHONPATH for an A/B.

    python bench/refresh.py DIR [--rounds 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from ambient.query.store import QueryStore
from ambient.storage.paths import BrainPaths


def _claim(sess_id: str, status: str = "open") -> str:
    return (
        f"sess_id: {sess_id}\ntype: satellite\nscope: projects/bench/{sess_id}.md\nagent: noop\nstatus: {status}\n"
        f'opened_at: "2026-12-02T10:00:00+00:00"\nworkflow: bench\n'
    )


def _put(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _timed(store: QueryStore, change: Callable[[int], None], rounds: int) -> list[float]:
    out = []
    for n in range(rounds):
        change(n)
        t0 = time.perf_counter()
        store.refresh()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    paths = BrainPaths(args.dir.resolve())
    store = QueryStore(paths)
    t0 = time.perf_counter()
    store.refresh()
    print(f"first refresh (a store built from the files if none): {time.perf_counter() - t0:.2f} s")
    store.refresh()
    mine = [paths.claims / f"sess-bench-refresh-{n:03d}.yml" for n in range(args.rounds)]
    journal = next(iter(sorted(paths.run_journals.glob("*.jsonl"))))
    parts: dict[str, list[float]] = {}
    parts["one new claim"] = _timed(store, lambda n: _put(mine[n], _claim(mine[n].stem)), args.rounds)
    parts["one claim rewritten (rename over)"] = _timed(
        store, lambda n: _put(mine[n], _claim(mine[n].stem, "closed")), args.rounds
    )

    def append(n: int) -> None:
        with journal.open("a") as fh:
            fh.write("")  # the journal's mtime: an unfinished run's journal is stat'd anyway

    parts["nothing changed"] = _timed(store, append, args.rounds)
    store.close()
    restart = []
    for n in range(min(5, args.rounds)):
        _put(mine[n], _claim(mine[n].stem))
        other = QueryStore(paths)
        t0 = time.perf_counter()
        other.refresh()
        restart.append((time.perf_counter() - t0) * 1000)
        other.close()
    parts["one claim, first refresh of a new process"] = restart
    for path in mine:
        path.unlink(missing_ok=True)
    store = QueryStore(paths)
    store.refresh()
    store.close()
    for name, ms in parts.items():
        print(
            f"{name:45s} median {statistics.median(ms):8.1f} ms  min {min(ms):8.1f}  max {max(ms):8.1f}  (n={len(ms)})"
        )
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
