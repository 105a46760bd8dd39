"""``ambient status`` on a big brain, cold and warm: the query store against another checkout.

Builds a brain with ``--claims`` claims (20,000), ``--runs`` finished runs (2,000: journal, claims, record), a few
runs in progress with escalations waiting, writing the files directly in the formats ambient writes (the journal
events of :mod:`ambient.engine.events`, claims as the claims writer writes them, escalations as
:func:`ambient.human.escalation_store.to_yaml` does); then times ``ambient --brain B status`` as a subprocess:

- **cold**: every file of the brain, of the code's ``src/`` and of the venv and the standard library evicted from the
  page cache first (``os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`` on each file; ``/proc/sys/vm/drop_caches``
  when writable: it also drops inodes and dentries; which one was used is printed);
- **warm**: the same command again at once.

- **first look**: the store deleted first (``.ambient/query.sqlite3*``), cold and warm: ``status`` answers from what is
  cheap and starts a builder in the background (killed after each timed run, by its pid, so that it takes no CPU
  from the next); then once more, the builder left to finish: how long the store takes to build in the background,
  and the first ``status`` that gives every figure.

Median of ``--repeats`` runs each. ``--old DIR`` times another checkout too (its ``src/`` on PYTHONPATH), e.g.
``--old /work/main`` before the query store; the first ``status`` of the old code builds the store (printed apart).

    python bench/query.py [--claims 20000] [--runs 2000] [--repeats 5] [--old /path/to/checkout]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
EXAMPLE = REPO / "examples" / "brain"
ITEMS = 8
PYCACHE = Path(tempfile.gettempdir()) / "ambient-bench-query-pycache"


def _iso(t: datetime) -> str:
    return t.isoformat(timespec="milliseconds")


def _journal(run_id: str, workflow: str, start: datetime, *, finished: bool, items: int = ITEMS) -> str:
    names = [f"item-{i:02d}" for i in range(items)]
    lines = [
        {
            "ev": "started",
            "run_id": run_id,
            "workflow": workflow,
            "form": "for_each",
            "spec_hash": "0" * 64,
            "spec": {"name": workflow},
            "items": names,
            "mode": "assisted",
            "trigger": "file",
            "context": {},
            "at": _iso(start),
        }
    ]
    t = start
    for n, name in enumerate(names):
        key = f"{run_id}/{name}/1"
        t += timedelta(milliseconds=50)
        lines.append({"ev": "accepted", "item": name, "attempt": 1, "key": key, "at": _iso(t)})
        if not finished and n >= items // 2:
            continue
        t += timedelta(milliseconds=400)
        lines.append(
            {
                "ev": "finished",
                "item": name,
                "attempt": 1,
                "agent": "deploy",
                "key": key,
                "result": "success",
                "output": {"status": "ok"},
                "error": None,
                "duration_ms": 400,
                "signal_in": "RETURN",
                "reply": "success",
                "question": None,
                "at": _iso(t),
            }
        )
    if finished:
        lines.append({"ev": "finished_run", "outcome": "success", "at": _iso(t)})
    return "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)


def _claim(sess_id: str, status: str, opened: datetime, parent: str | None) -> str:
    text = (
        f"sess_id: {sess_id}\ntype: satellite\nscope: projects/bench/{sess_id}.md\nagent: deploy\n"
        f'status: {status}\nopened_at: "{opened.isoformat(timespec="seconds")}"\n'
    )
    if parent:
        text += f"parent_satellite: {parent}\nworkflow: bench\nsatellite_level: leaf\n"
    if status == "closed":
        text += f'result:\n  status: ok\nclosed_at: "{opened.strftime("%Y-%m-%dT%H:%M")}"\n'
    return text


def _record(run_id: str, workflow: str, start: datetime) -> str:
    steps = [
        {
            "item": f"item-{i:02d}",
            "agent": "deploy",
            "signal_out": "SPAWN",
            "signal_in": "RETURN",
            "result": "success",
            "duration_ms": 400,
            "attempt": 1,
            "key": f"{run_id}/item-{i:02d}/1",
            "at": _iso(start + timedelta(seconds=i)),
            "reply": "success",
        }
        for i in range(ITEMS)
    ]
    rec = {
        "kind": "run",
        "run_id": run_id,
        "workflow": workflow,
        "spec_hash": "0" * 64,
        "started_at": _iso(start),
        "completed_at": _iso(start + timedelta(seconds=ITEMS)),
        "outcome": "success",
        "steps": steps,
        "escalations": 0,
        "errors": 0,
        "form": "for_each",
        "total": ITEMS,
        "done": ITEMS,
    }
    return json.dumps(rec, separators=(",", ":")) + "\n"


def _escalation(esc_id: str, run_id: str, item: str, created: datetime) -> str:
    stamp = created.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return (
        f"# ambient escalation (pending). Answer with: ambient decide {esc_id} <option name or number>\n"
        f"id: {esc_id}\nworkflow: bench\nrun_id: {run_id}\nitem: {item}\nagent: deploy\nkind: fail\n"
        f"question: 'deploy failed on {item}'\noptions:\n"
        "- key: retry\n  label: Run the item again\n  action: retry\n"
        "- key: skip\n  label: Skip this item and go on\n  action: skip\n"
        f"created_at: '{stamp}'\nreminded: false\ndetail: null\ndedupe_key: {run_id}/{item}/fail\n"
        f"nonce: bench{esc_id[-6:]}\nnotify:\n  attempts: []\n  count: 0\n  next_at: '{stamp}'\n"
        "  delivered_at: null\n  refs: {}\nstatus: pending\n"
    )


def build(root: Path, *, claims: int, runs: int, running: int = 3) -> None:
    """A brain at ``root``: the example brain's agents and settings, then runs, claims, records, escalations."""
    for sub in ("agents", "profil"):
        shutil.copytree(EXAMPLE / sub, root / sub)
    for sub in ("claims", "locks", "workflows", ".ambient/runs", ".ambient/escalations"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(root / ".ambient", 0o700)
    for sub in ("runs", "escalations"):
        os.chmod(root / ".ambient" / sub, 0o700)
    base = datetime.now(UTC) - timedelta(days=60)
    written = 0
    with (root / ".ambient" / "runs.jsonl").open("w") as records:
        for n in range(runs):
            start = base + timedelta(minutes=30 * n)
            run_id = f"sess-{start:%Y%m%d-%H%M}-bench-{n:05x}"
            (root / ".ambient" / "runs" / f"{run_id}.jsonl").write_text(_journal(run_id, "bench", start, finished=True))
            records.write(_record(run_id, "bench", start))
            (root / "claims" / f"{run_id}.yml").write_text(_claim(run_id, "closed", start, None))
            written += 1
            for i in range(ITEMS):
                if written >= claims:
                    break
                sid = f"{run_id}-item-{i:03d}"
                (root / "claims" / f"{sid}.yml").write_text(_claim(sid, "closed", start, run_id))
                written += 1
    now = datetime.now(UTC)
    for n in range(running):
        run_id = f"sess-{now:%Y%m%d-%H%M}-live-{n:04x}"
        (root / ".ambient" / "runs" / f"{run_id}.jsonl").write_text(_journal(run_id, "bench", now, finished=False))
        (root / "claims" / f"{run_id}.yml").write_text(_claim(run_id, "open", now, None))
        esc = f"esc-bench{n:02d}"
        (root / ".ambient" / "escalations" / f"{esc}.yml").write_text(_escalation(esc, run_id, "item-07", now))
        written += 1
    while written < claims:  # the rest: claims of sessions outside any run, a few still open
        sid = f"sess-manual-{written:06d}"
        status = "open" if written % 500 == 0 else "closed"
        (root / "claims" / f"{sid}.yml").write_text(_claim(sid, status, base, None))
        written += 1


def _files(*roots: Path) -> Iterator[Path]:
    for top in roots:
        for dirpath, _dirs, names in os.walk(top):
            for name in names:
                yield Path(dirpath) / name


def evict(*roots: Path) -> str:
    """Drop the files under ``roots`` from the page cache; which way it was done."""
    with contextlib.suppress(OSError):
        subprocess.run(["sync"], check=False)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "drop_caches (page cache, dentries and inodes)"
    for path in _files(*roots):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "posix_fadvise(DONTNEED) on every file (page cache only: dentries and inodes stay cached)"


def status_argv(src: Path, root: Path) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMBIENT_") and k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(src)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)  # compiled once, as an installed package is (not into the checkout)
    return [sys.executable, "-m", "ambient", "--brain", str(root), "status"], env


def time_status(src: Path, root: Path, *, cold: bool, repeats: int, evicted: tuple[Path, ...]) -> tuple[float, str]:
    argv, env = status_argv(src, root)
    times, how = [], "warm"
    for _ in range(repeats):
        if cold:
            how = evict(*evicted, src, root)
        t0 = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - t0)
        if done.returncode != 0:
            raise SystemExit(f"status failed ({done.returncode}): {done.stderr[-2000:]}")
    return statistics.median(times), how


def _drop_store(root: Path) -> None:
    for path in (root / ".ambient").glob("query.sqlite3*"):
        path.unlink()


def _builders(root: Path) -> list[int]:
    """The pids of builders of this brain's store (``python -m ambient.query.builder ROOT``)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"ambient.query.builder" in argv and str(root).encode() in argv:
            found.append(int(proc.name))
    return found


def _stop_builders(root: Path) -> None:
    """Kill the builders this bench's status started (by pid) and wait until they are gone."""
    for pid in _builders(root):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    deadline = time.monotonic() + 30
    while _builders(root) and time.monotonic() < deadline:
        time.sleep(0.05)


def time_first_look(src: Path, root: Path, *, cold: bool, repeats: int, evicted: tuple[Path, ...]) -> float:
    """Median wall time of ``status`` on the brain with its store deleted (each builder killed after)."""
    argv, env = status_argv(src, root)
    times = []
    for _ in range(repeats):
        _stop_builders(root)
        _drop_store(root)
        if cold:
            evict(*evicted, src, root)
        t0 = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - t0)
        if done.returncode != 0 or "being indexed" not in done.stdout:
            raise SystemExit(f"first look failed ({done.returncode}): {done.stdout[-2000:]} {done.stderr[-2000:]}")
    _stop_builders(root)
    return statistics.median(times)


def time_background_build(src: Path, root: Path) -> tuple[float, float]:
    """(seconds until the store is built in the background after a first look, that first look's seconds)."""
    argv, env = status_argv(src, root)
    _stop_builders(root)
    _drop_store(root)
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, capture_output=True, check=True)
    look = time.perf_counter() - t0
    while True:
        out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
        if "being" not in out:
            return time.perf_counter() - t0, look
        time.sleep(1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--claims", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=2_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--old", type=Path, help="another checkout to time (its src/), e.g. /work/main")
    ap.add_argument("--keep", action="store_true", help="keep the brain (its path is printed)")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ambient-bench-query-"))
    root = base / "brain"
    t0 = time.perf_counter()
    build(root, claims=args.claims, runs=args.runs)
    print(
        f"brain: {args.claims:,} claims, {args.runs:,} finished runs, 3 in progress ({time.perf_counter() - t0:.1f}s)"
    )
    venv = Path(sys.prefix)
    stdlib = Path(os.__file__).parent
    evicted = (venv, stdlib, PYCACHE)
    codes = [("new", REPO / "src")]
    if args.old is not None:  # first: its census writes the claims index, which the new store's rebuild reads
        codes.insert(0, ("old", args.old.resolve() / "src"))
    try:
        for name, src in codes:
            argv, env = status_argv(src, root)
            if name == "new":
                subprocess.run(argv, env=env, capture_output=True, check=True)  # compiles the code once (pycache)
                cold = time_first_look(src, root, cold=True, repeats=args.repeats, evicted=evicted)
                warm = time_first_look(src, root, cold=False, repeats=args.repeats, evicted=evicted)
                n = args.repeats
                print(f"{name}: first look (store deleted) cold {cold:.3f}s, warm {warm:.3f}s (median of {n})")
                built, look = time_background_build(src, root)
                print(f"{name}: store built in the background {built:.1f}s after a first look of {look:.2f}s")
            else:
                t0 = time.perf_counter()
                subprocess.run(argv, env=env, capture_output=True, check=True)
                print(f"{name}: first status (builds its index/store): {time.perf_counter() - t0:.2f}s")
            cold, how = time_status(src, root, cold=True, repeats=args.repeats, evicted=evicted)
            warm, _ = time_status(src, root, cold=False, repeats=args.repeats, evicted=evicted)
            print(f"{name}: status cold {cold:.3f}s, warm {warm:.3f}s (median of {args.repeats}; cold: {how})")
    finally:
        if args.keep:
            print(f"kept: {root}")
        else:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
