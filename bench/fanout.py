"""Fan-out throughput of the real daemon, against LangGraph+SQLite and a plain-asyncio floor, in one run.

(a) a 1000-item for_each with in-process no-op agents (``kind: callable``, ``bench/noop_agent.py``), durable as
    the daemon does it (each item ``accepted`` in the fsync'd run journal before its agent starts, every
    completion recorded, item claims and locks written): items/s and µs per item, timed from the run's
    ``started`` event to its ``finished_run`` event in the journal (``python -m ambient run --until-idle``);
(b) 200 items with a command agent (``/bin/echo {}``) at concurrency 16, against bare
    ``asyncio.create_subprocess_exec`` of the same program at the same concurrency;
(c) the peers of ``shared/bench/peers``: LangGraph Send fan-out with the SQLite checkpointer (needs a venv with
    langgraph, see the peers' README; skipped with a message otherwise) and the asyncio floor;
(d) the latency from dropping a workflow file to its first SPAWN (the item's ``accepted`` record), median of 20.

Usage: ``python bench/fanout.py [--n 1000] [--repeats 3] [--lg-python /tmp/lg/bin/python] [--json out.json]``.
Targets (issue 4): (a) ≥ 2x LangGraph+SQLite items/s (~1,300/s here), stretch 2,000/s; (b) ≥ 0.7 of bare
subprocesses; (d) median < 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    BENCH,
    PY,
    REPO,
    Steal,
    TempDir,
    agent_md,
    creation_cost,
    daemon_argv,
    daemon_env,
    epoch,
    filesystem_note,
    foreach_yaml,
    journal_records,
    median,
    new_brain,
    peer_summary,
    run_until_idle,
)

NOOP = agent_md("noop", {"kind": "callable", "target": "noop_agent:noop", "timeout_s": 60})
ECHO = agent_md("echo", {"kind": "command", "argv": ["/bin/echo", "{}"], "timeout_s": 60})


def bench_daemon(base: Path, label: str, agent: str, agent_md_text: str, n: int, concurrency: int,
                 repeats: int) -> dict[str, Any]:
    """The real daemon on a fresh brain per repeat; the median run span from the journal."""
    spans: list[float] = []
    walls: list[float] = []
    env = daemon_env([BENCH])
    for k in range(repeats):
        root = new_brain(base, f"{label}-{k}", {agent: agent_md_text})
        items = [f"item-{i:05d}" for i in range(n)]
        (root / "workflows" / f"{label}.yml").write_text(foreach_yaml(label, items, agent, concurrency))
        walls.append(run_until_idle(root, env))
        (records,) = journal_records(root)
        ok = sum(1 for r in records if r.get("ev") == "finished" and r.get("result") == "success")
        if ok != n:
            raise RuntimeError(f"{label}: {ok}/{n} items succeeded")
        start = next(r for r in records if r.get("ev") == "started")
        end = next(r for r in records if r.get("ev") == "finished_run")
        spans.append(epoch(end["at"]) - epoch(start["at"]))
    span = median(spans)
    return {"n": n, "concurrency": concurrency, "repeats": repeats, "median_s": span, "runs_s": spans,
            "items_per_s": n / span, "us_per_item": span / n * 1e6, "daemon_wall_median_s": median(walls)}


async def _bare(argv: list[str], n: int, concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with sem:
            proc = await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                        stderr=subprocess.PIPE, start_new_session=True)
            out, _ = await proc.communicate()
            json.loads(out)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return time.perf_counter() - t0


def bench_bare(n: int, concurrency: int, repeats: int) -> dict[str, Any]:
    """Bare ``create_subprocess_exec`` of ``/bin/echo {}``, output read and parsed, same concurrency."""
    asyncio.run(_bare(["/bin/echo", "{}"], 20, concurrency))  # warm-up
    spans = [asyncio.run(_bare(["/bin/echo", "{}"], n, concurrency)) for _ in range(repeats)]
    span = median(spans)
    return {"n": n, "concurrency": concurrency, "median_s": span, "items_per_s": n / span,
            "us_per_item": span / n * 1e6}


def bench_drop_latency(base: Path, drops: int) -> dict[str, Any]:
    """Drop ``drops`` one-item workflows into a running daemon; latency to each run's first ``accepted``."""
    root = new_brain(base, "drop", {"noop": NOOP})
    env = daemon_env([BENCH])
    log = (base / "drop-daemon.log").open("wb")
    proc = subprocess.Popen(daemon_argv(root, "--log-level", "info"), env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    lat: list[float] = []
    try:
        deadline = time.monotonic() + 30
        while b"daemon_ready" not in (base / "drop-daemon.log").read_bytes():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the daemon did not get ready")
            time.sleep(0.01)
        from ambient.fsutil import atomic_write

        for k in range(drops):
            time.sleep(0.3)  # spaced drops: each is an isolated change (a burst is debounced on purpose, R-08)
            before = len(journal_records(root))
            t = time.time()
            atomic_write(root / "workflows" / f"drop-{k:02d}.yml", foreach_yaml(f"drop-{k:02d}", ["x"], "noop", 1))
            deadline = time.monotonic() + 10
            while True:
                runs = journal_records(root)
                if len(runs) > before:
                    acc = [r for recs in runs for r in recs
                           if r.get("ev") == "accepted" and recs[0].get("workflow") == f"drop-{k:02d}"]
                    if acc:
                        lat.append(epoch(acc[0]["at"]) - t)
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"drop {k}: no SPAWN within 10 s")
                time.sleep(0.002)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()
    lat.sort()
    return {"drops": drops, "median_ms": median(lat) * 1000, "p90_ms": lat[int(0.9 * (len(lat) - 1))] * 1000,
            "max_ms": lat[-1] * 1000}


def run_peer(argv: list[str], timeout: float = 900) -> dict[str, Any] | None:
    """Run a peer benchmark; its JSON summary, or None (with a message) if it failed."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        print(f"  peer failed ({' '.join(argv[:2])}...): {proc.stderr[-500:]}")
        return None
    return peer_summary(proc.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="items of the in-process fan-out (default 1000)")
    ap.add_argument("--concurrency", type=int, default=256, help="for_each.concurrency of (a) (default 256)")
    ap.add_argument("--command-n", type=int, default=200, help="items of the command-agent fan-out (default 200)")
    ap.add_argument("--command-concurrency", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--drops", type=int, default=20)
    ap.add_argument("--peers", default=str(REPO.parent / "shared" / "bench" / "peers"))
    ap.add_argument("--lg-python", default="/tmp/lg/bin/python", help="python of a venv with langgraph")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: inproc,command,peers,drop")
    ap.add_argument("--dir", default=None, help="where to make the temp brains (default: the system temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the brains for inspection")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    out: dict[str, Any] = {"python": sys.version.split()[0]}
    with TempDir(args.dir, args.keep) as base:
        note = filesystem_note(base)
        if note:
            print(note)
        out["creation_us"] = creation_cost(base)
        print(f"creating a small file here now: {out['creation_us']:.0f} us (bench/README item 44)")
        if "inproc" not in skip:
            steal = Steal()
            r = bench_daemon(base, "inproc", "noop", NOOP, args.n, args.concurrency, args.repeats)
            out["inproc"] = r
            print(f"(a) in-process no-op fan-out, N={r['n']} concurrency={r['concurrency']}: "
                  f"{r['items_per_s']:.0f} items/s, {r['us_per_item']:.0f} us/item "
                  f"(median of {r['repeats']}; runs {', '.join(f'{s:.3f}' for s in r['runs_s'])} s; "
                  f"daemon wall incl. start-up {r['daemon_wall_median_s']:.2f} s){steal.stop()}")
            r["steal"] = steal.share
        if "command" not in skip:
            steal = Steal()
            r = bench_daemon(base, "command", "echo", ECHO, args.command_n, args.command_concurrency, args.repeats)
            bare = bench_bare(args.command_n, args.command_concurrency, args.repeats)
            out["command"], out["bare_subprocess"] = r, bare
            print(f"(b) command agent /bin/echo, N={r['n']} concurrency={r['concurrency']}: "
                  f"{r['items_per_s']:.0f} items/s; bare create_subprocess_exec: {bare['items_per_s']:.0f}/s; "
                  f"ratio {r['items_per_s'] / bare['items_per_s']:.2f} (target >= 0.7){steal.stop()}")
            r["steal"] = steal.share
        if "peers" not in skip:
            steal = Steal()
            peers = Path(args.peers)
            floor = run_peer([PY, str(peers / "floor_asyncio.py"), "--n", str(args.n), "--repeats", "5",
                              "--state-dir", str(base / "floor")])
            floor_fsync = run_peer([PY, str(peers / "floor_asyncio.py"), "--n", str(args.n), "--repeats", "5",
                                    "--fsync", "claims", "--state-dir", str(base / "floor")])
            out["floor"], out["floor_fsync_claims"] = floor, floor_fsync
            lg = None
            if Path(args.lg_python).exists():
                lg = run_peer([args.lg_python, str(peers / "langgraph_fanout.py"), "--n", str(args.n), "--repeats",
                               "3", "--mode", "sync", "--checkpointer", "sqlite", "--state-dir", str(base / "lg")])
            else:
                print(f"(c) LangGraph skipped: no {args.lg_python} (python3 -m venv /tmp/lg && /tmp/lg/bin/pip "
                      f"install -r {peers}/requirements-langgraph.lock.txt)")
            out["langgraph_sqlite"] = lg
            print(f"(c) the peers below ran with{steal.stop() or ' [steal unknown]'}")
            out["peers_steal"] = steal.share
            for name, s in (("floor (no fsync)", floor), ("floor (fsync claims)", floor_fsync),
                            ("LangGraph+SQLite sync", lg)):
                if s is None:
                    continue
                rate = 1e6 / s["median_us_per_item"]
                line = f"(c) {name}: {s['median_us_per_item']:.0f} us/item, {rate:.0f} items/s"
                if "inproc" in out:
                    line += f"; ambient/peer items/s ratio {out['inproc']['items_per_s'] / rate:.2f}"
                print(line)
            if lg is not None and "inproc" in out:
                target = 2 * 1e6 / lg["median_us_per_item"]
                got = out["inproc"]["items_per_s"]
                print(f"    target: ambient >= 2x LangGraph = {target:.0f} items/s; measured {got:.0f} "
                      f"({'met' if got >= target else 'MISSED'})")
        if "drop" not in skip:
            steal = Steal()
            r = bench_drop_latency(base, args.drops)
            out["drop_to_spawn"] = r
            print(f"(d) drop a workflow file -> first SPAWN: median {r['median_ms']:.1f} ms, p90 {r['p90_ms']:.1f} ms, "
                  f"max {r['max_ms']:.1f} ms over {r['drops']} drops (target median < 50 ms){steal.stop()}")
            r["steal"] = steal.share
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
