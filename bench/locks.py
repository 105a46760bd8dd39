"""Lock-file mutex throughput: ambient's acquire+release against a bare O_CREAT|O_EXCL + unlink loop.

Prints cycles/s uncontended (one process) and under 4-way contention (4 processes on one path),
for both, and the ratios. The uncontended runs are interleaved in rounds so that noise from a
shared machine hits both alike. Usage: ``python bench/locks.py [--seconds 2] [--dir DIR] [--durable]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from ambient.claims.locks import LockManager
from ambient.storage.paths import BrainPaths


def bare_cycles(lock: Path, n: int) -> None:
    """n create-exclusive + unlink cycles (no content, no holder, no expiry: the floor)."""
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
    for _ in range(n):
        fd = os.open(lock, flags, 0o644)
        os.close(fd)
        os.unlink(lock)


def ambient_cycles(manager: LockManager, n: int) -> None:
    """n acquire + release cycles through the library."""
    for _ in range(n):
        grant = manager.acquire("bench/target.txt", "sess-bench", ttl_s=60)
        manager.release_grant(grant)


def uncontended(root: Path, rounds: int, per_round: int, durable: bool) -> tuple[float, float, list[float]]:
    """Interleaved rounds; returns (bare/s, ambient/s, per-round ratios)."""
    manager = LockManager(BrainPaths(root), durable=durable)
    bare_lock = root / "bare.lock"
    ambient_cycles(manager, 50)  # warm-up: guard file, directories, caches
    bare_cycles(bare_lock, 50)
    t_bare = t_amb = 0.0
    ratios: list[float] = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        bare_cycles(bare_lock, per_round)
        t1 = time.perf_counter()
        ambient_cycles(manager, per_round)
        t2 = time.perf_counter()
        t_bare += t1 - t0
        t_amb += t2 - t1
        ratios.append((t1 - t0) / (t2 - t1))
    manager.close()
    n = rounds * per_round
    return n / t_bare, n / t_amb, ratios


def _bare_worker(lock: str, seconds: float, out: mp.Queue[int]) -> None:
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
    done = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            fd = os.open(lock, flags, 0o644)
        except FileExistsError:
            time.sleep(0.0001)
            continue
        os.close(fd)
        os.unlink(lock)
        done += 1
    out.put(done)


def _ambient_worker(root: str, seconds: float, out: mp.Queue[int]) -> None:
    manager = LockManager(BrainPaths(Path(root)))
    done = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        grant = manager.acquire("bench/target.txt", f"sess-{os.getpid()}", ttl_s=60, wait=5)
        manager.release_grant(grant)
        done += 1
    out.put(done)


def contended(root: Path, procs: int, seconds: float) -> tuple[float, float]:
    """procs processes hammering one path for ``seconds``; returns (bare/s, ambient/s)."""
    ctx = mp.get_context("fork")
    results: list[float] = []
    for target, arg in ((_bare_worker, str(root / "bare-c.lock")), (_ambient_worker, str(root))):
        queue: mp.Queue[int] = ctx.Queue()
        workers = [ctx.Process(target=target, args=(arg, seconds, queue)) for _ in range(procs)]
        for w in workers:
            w.start()
        total = sum(queue.get(timeout=seconds + 30) for _ in workers)
        for w in workers:
            w.join()
        results.append(total / seconds)
    return results[0], results[1]


def main() -> None:
    """Run both measurements and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=2.0, help="duration of each contended run")
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--dir", type=Path, default=None, help="where to run (default: a temp dir)")
    parser.add_argument("--durable", action="store_true", help="fsync each lock file and its directory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        (root / "locks").mkdir()
        bare, amb, ratios = uncontended(root, args.rounds, args.per_round, args.durable)
        print(f"uncontended  bare O_EXCL+unlink: {bare:9.0f} cycles/s")
        print(f"uncontended  ambient acquire+release{' (durable)' if args.durable else ''}: {amb:9.0f} cycles/s")
        print(
            f"uncontended  ratio ambient/bare: {amb / bare:.2f} (median of rounds {statistics.median(ratios):.2f}, "
            f"target >= 0.5)"
        )
        cbare, camb = contended(root, args.procs, args.seconds)
        print(f"{args.procs}-way        bare O_EXCL+unlink: {cbare:9.0f} cycles/s")
        print(f"{args.procs}-way        ambient acquire+release: {camb:9.0f} cycles/s")
        print(f"{args.procs}-way        ratio ambient/bare: {camb / cbare:.2f}")


if __name__ == "__main__":
    main()
