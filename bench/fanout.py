"""Fan-out throughput of the real daemon, against LangGraph+SQLite and a plain-asyncio floor, in one run.

(a) a 1000-item for_each with in-process no-op agents (``kind: callable``, ``bench/noop_agent.py``), durable as
    the daemon does it (each item ``accepted`` in the fsync'd run journal before its agent starts, every
    completion recorded, item claims and locks written): items/s and µs per item, timed from the run's
    ``started`` event to its ``finished_run`` event in the journal. The workflows are dropped one after another
    into one running daemon (``python -m ambient run``): a first, cold run, then ``--repeats`` warm ones, each
    followed at once by one LangGraph Send fan-out with the SQLite checkpointer (``shared/bench/peers``, which
    times its run after a warm-up run of its own; needs a venv with langgraph, skipped with a message
    otherwise): the ratio is the median of the pairs' ratios, so that both sides of a pair see the same minute
    of a noisy machine;
(b) 200 items with a command agent (``/bin/echo {}``) at concurrency 16, paired the same way with bare
    ``asyncio.create_subprocess_exec`` of the same program at the same concurrency (after a warm-up run): also
    the CPU per item of both sides (the daemon's process tree: its threads, its spawner, the agents; bare: this
    process and its children), which the load of a shared machine moves less than their wall times. The agent is
    confined (the default); ``--unconfined`` runs it with ``confine: false``;
(c) the asyncio floors of ``shared/bench/peers``, for scale;
(d) the latency from dropping a workflow file to its first SPAWN (the item's ``accepted`` record), median of 20.

Usage: ``python bench/fanout.py [--n 1000] [--repeats 5] [--lg-python /tmp/lg/bin/python] [--json out.json]``.
Targets: (a) ≥ 2x LangGraph+SQLite items/s (~1,300/s here), stretch 2,000/s; (b) ≥ 0.7 of bare
subprocesses; (d) median < 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    BENCH,
    PY,
    REPO,
    ServingDaemon,
    Steal,
    TempDir,
    agent_md,
    creation_cost,
    daemon_env,
    epoch,
    filesystem_note,
    foreach_yaml,
    journal_records,
    median,
    new_brain,
    peer_summary,
    run_span,
)

NOOP = agent_md("noop", {"kind": "callable", "target": "noop_agent:noop", "timeout_s": 60})
ECHO = agent_md("echo", {"kind": "command", "argv": ["/bin/echo", "{}"], "timeout_s": 60})
ECHO_UNCONFINED = agent_md("echo", {"kind": "command", "argv": ["/bin/echo", "{}"], "timeout_s": 60, "confine": False})


def bench_daemon(
    base: Path,
    label: str,
    agent: str,
    agent_md_text: str,
    n: int,
    concurrency: int,
    repeats: int,
    paired: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """One daemon on a fresh brain; a first (cold) run, then ``repeats`` warm runs, each followed by ``paired()``
    (a peer's items/s, measured right after it so that both see the same minute of a noisy machine)."""
    root = new_brain(base, label, {agent: agent_md_text})
    items = [f"item-{i:05d}" for i in range(n)]
    spans: list[float] = []
    peer_rates: list[float] = []
    cpu_ms: list[float] = []
    t0 = time.perf_counter()
    with ServingDaemon(root, daemon_env([BENCH]), base / f"{label}-daemon.log") as daemon:
        for k in range(repeats + 1):
            before = tree_cpu(daemon.proc.pid if daemon.proc else 0)
            records = daemon.run(f"{label}-{k}", foreach_yaml(f"{label}-{k}", items, agent, concurrency))
            cpu_ms.append((tree_cpu(daemon.proc.pid if daemon.proc else 0) - before) / n * 1000)
            ok = sum(1 for r in records if r.get("ev") == "finished" and r.get("result") == "success")
            if ok != n:
                raise RuntimeError(f"{label}-{k}: {ok}/{n} items succeeded")
            spans.append(run_span(records))
            if k and paired is not None:
                peer_rates.append(paired())
    cold, warm = spans[0], spans[1:]
    span = median(warm)
    out: dict[str, Any] = {
        "n": n,
        "concurrency": concurrency,
        "repeats": repeats,
        "median_s": span,
        "runs_s": warm,
        "items_per_s": n / span,
        "us_per_item": span / n * 1e6,
        "cold_s": cold,
        "cold_items_per_s": n / cold,
        "daemon_wall_s": time.perf_counter() - t0,
        "cpu_ms_per_item": cpu_ms[1:],
    }
    if peer_rates:
        ratios = [n / s / rate for s, rate in zip(warm, peer_rates, strict=True)]
        out.update(
            peer_items_per_s=peer_rates, peer_median_items_per_s=median(peer_rates), ratios=ratios, ratio=median(ratios)
        )
    return out


def tree_cpu(pid: int) -> float:
    """CPU seconds of a daemon and its children (its spawner, whose count includes the agents it reaped), all
    threads: a cost per item that the load of a shared machine does not move as it moves wall time."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(x) for x in f.read().split()]
    except OSError:
        return 0.0
    for p, with_reaped in [(pid, False), *((k, True) for k in kids)]:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used = int(fields[11]) + int(fields[12]) + ((int(fields[13]) + int(fields[14])) if with_reaped else 0)
        total += used / tick
    return total


BARE_CPU: list[float] = []  # CPU ms per item of each timed bare run


async def _bare(argv: list[str], n: int, concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with sem:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
            )
            out, _ = await proc.communicate()
            json.loads(out)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return time.perf_counter() - t0


def bare_runner(n: int, concurrency: int) -> Callable[[], float]:
    """Bare ``create_subprocess_exec`` of ``/bin/echo {}``, output read and parsed, same concurrency: a function
    timing one run (items/s), after a warm-up run here."""
    asyncio.run(_bare(["/bin/echo", "{}"], 20, concurrency))

    def once() -> float:
        t = os.times()
        rate = n / asyncio.run(_bare(["/bin/echo", "{}"], n, concurrency))
        u = os.times()
        BARE_CPU.append(sum(u[:4]) - sum(t[:4]))
        BARE_CPU[-1] = BARE_CPU[-1] / n * 1000
        return rate

    return once


def langgraph_runner(lg_python: str, peers: Path, n: int, state_dir: Path) -> Callable[[], float]:
    """A function timing one LangGraph+SQLite fan-out of ``n`` items (items/s; the peer warms up first itself)."""

    def once() -> float:
        s = run_peer(
            [
                lg_python,
                str(peers / "langgraph_fanout.py"),
                "--n",
                str(n),
                "--repeats",
                "1",
                "--mode",
                "sync",
                "--checkpointer",
                "sqlite",
                "--state-dir",
                str(state_dir),
            ]
        )
        if s is None:
            raise RuntimeError("the LangGraph peer failed")
        return 1e6 / float(s["median_us_per_item"])

    return once


def bench_drop_latency(base: Path, drops: int) -> dict[str, Any]:
    """Drop ``drops`` one-item workflows into a running daemon; latency to each run's first ``accepted``."""
    root = new_brain(base, "drop", {"noop": NOOP})
    lat: list[float] = []
    with ServingDaemon(root, daemon_env([BENCH]), base / "drop-daemon.log"):
        from ambient.storage.fsutil import atomic_write

        for k in range(drops):
            time.sleep(0.3)  # spaced drops: each is an isolated change (a burst is debounced on purpose, R-08)
            before = len(journal_records(root))
            t = time.time()
            atomic_write(root / "workflows" / f"drop-{k:02d}.yml", foreach_yaml(f"drop-{k:02d}", ["x"], "noop", 1))
            deadline = time.monotonic() + 10
            while True:
                runs = journal_records(root)
                if len(runs) > before:
                    acc = [
                        r
                        for recs in runs
                        for r in recs
                        if r.get("ev") == "accepted" and recs[0].get("workflow") == f"drop-{k:02d}"
                    ]
                    if acc:
                        lat.append(epoch(acc[0]["at"]) - t)
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"drop {k}: no SPAWN within 10 s")
                time.sleep(0.002)
    lat.sort()
    return {
        "drops": drops,
        "median_ms": median(lat) * 1000,
        "p90_ms": lat[int(0.9 * (len(lat) - 1))] * 1000,
        "max_ms": lat[-1] * 1000,
    }


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
    ap.add_argument("--unconfined", action="store_true", help="(b) with `confine: false` (confined is the default)")
    ap.add_argument("--repeats", type=int, default=5, help="warm runs of (a) and (b), each paired with a peer run")
    ap.add_argument("--drops", type=int, default=20)
    ap.add_argument("--peers", default=str(REPO.parent / "shared" / "bench" / "peers"))
    ap.add_argument("--lg-python", default="/tmp/lg/bin/python", help="python of a venv with langgraph")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: inproc,command,peers,floors,drop")
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
        print(f"creating a small file here now: {out['creation_us']:.0f} us (bench/README.md, finding 44)")
        peers = Path(args.peers)
        lg_ok = "peers" not in skip and Path(args.lg_python).exists()
        if "peers" not in skip and not lg_ok:
            print(
                f"(c) LangGraph skipped: no {args.lg_python} (python3 -m venv /tmp/lg && /tmp/lg/bin/pip "
                f"install -r {peers}/requirements-langgraph.lock.txt)"
            )
        if "inproc" not in skip:
            steal = Steal()
            lg = langgraph_runner(args.lg_python, peers, args.n, base / "lg") if lg_ok else None
            r = bench_daemon(base, "inproc", "noop", NOOP, args.n, args.concurrency, args.repeats, paired=lg)
            out["inproc"] = r
            print(
                f"(a) in-process no-op fan-out, N={r['n']} concurrency={r['concurrency']}: "
                f"{r['items_per_s']:.0f} items/s, {r['us_per_item']:.0f} us/item (median of {r['repeats']} warm "
                f"runs on one daemon: {', '.join(f'{s:.3f}' for s in r['runs_s'])} s; its first, cold run "
                f"{r['cold_items_per_s']:.0f} items/s){steal.stop()}"
            )
            if "ratio" in r:
                print(
                    f"(a) LangGraph+SQLite, one run right after each: {r['peer_median_items_per_s']:.0f} items/s; "
                    f"ambient/LangGraph per pair {', '.join(f'{x:.2f}' for x in r['ratios'])}: median "
                    f"{r['ratio']:.2f} (target >= 2: {'met' if r['ratio'] >= 2 else 'MISSED'})"
                )
            print(
                "(a) each run on that daemon, items/s (CPU ms per item of its process tree, the run and what it "
                f"left running into the next): cold {r['cold_items_per_s']:.0f}, warm "
                + ", ".join(
                    f"{r['n'] / s:.0f} ({c:.2f})" for s, c in zip(r["runs_s"], r["cpu_ms_per_item"], strict=True)
                )
            )
            r["steal"] = steal.share
        if "command" not in skip:
            steal = Steal()
            bare = bare_runner(args.command_n, args.command_concurrency)
            echo = ECHO_UNCONFINED if args.unconfined else ECHO
            r = bench_daemon(
                base, "command", "echo", echo, args.command_n, args.command_concurrency, args.repeats, paired=bare
            )
            out["command"] = r
            print(
                f"(b) command agent /bin/echo{' unconfined' if args.unconfined else ''}, N={r['n']} "
                f"concurrency={r['concurrency']}: "
                f"{r['items_per_s']:.0f} items/s (cold run {r['cold_items_per_s']:.0f}); bare "
                f"create_subprocess_exec right after each: {r['peer_median_items_per_s']:.0f}/s; ratio per pair "
                f"{', '.join(f'{x:.2f}' for x in r['ratios'])}: median {r['ratio']:.2f} (target >= 0.7: "
                f"{'met' if r['ratio'] >= 0.7 else 'MISSED'}){steal.stop()}"
            )
            r["steal"] = steal.share
            r["bare_cpu_ms_per_item"] = list(BARE_CPU)
            print(
                f"(b) CPU per item, ms (the daemon, its spawner and the agents; bare: this process and its "
                f"children): {', '.join(f'{x:.2f}' for x in r['cpu_ms_per_item'])} (median "
                f"{median(r['cpu_ms_per_item']):.2f}); bare {', '.join(f'{x:.2f}' for x in BARE_CPU)} (median "
                f"{median(BARE_CPU):.2f}); ratio of CPU bare/ambient "
                f"{median([b / a for a, b in zip(r['cpu_ms_per_item'], BARE_CPU, strict=True)]):.2f}"
            )
        if "peers" not in skip and "floors" not in skip:
            steal = Steal()
            floor = run_peer(
                [
                    PY,
                    str(peers / "floor_asyncio.py"),
                    "--n",
                    str(args.n),
                    "--repeats",
                    "5",
                    "--state-dir",
                    str(base / "floor"),
                ]
            )
            floor_fsync = run_peer(
                [
                    PY,
                    str(peers / "floor_asyncio.py"),
                    "--n",
                    str(args.n),
                    "--repeats",
                    "5",
                    "--fsync",
                    "claims",
                    "--state-dir",
                    str(base / "floor"),
                ]
            )
            out["floor"], out["floor_fsync_claims"] = floor, floor_fsync
            print(f"(c) the floors below ran with{steal.stop() or ' [steal unknown]'}")
            out["peers_steal"] = steal.share
            for name, f in (("floor (no fsync)", floor), ("floor (fsync claims)", floor_fsync)):
                if f is None:
                    continue
                rate = 1e6 / f["median_us_per_item"]
                line = f"(c) {name}: {f['median_us_per_item']:.0f} us/item, {rate:.0f} items/s"
                if "inproc" in out:
                    line += f"; ambient/floor items/s ratio {out['inproc']['items_per_s'] / rate:.2f}"
                print(line)
        if "drop" not in skip:
            steal = Steal()
            r = bench_drop_latency(base, args.drops)
            out["drop_to_spawn"] = r
            print(
                f"(d) drop a workflow file -> first SPAWN: median {r['median_ms']:.1f} ms, p90 {r['p90_ms']:.1f} ms, "
                f"max {r['max_ms']:.1f} ms over {r['drops']} drops (target median < 50 ms){steal.stop()}"
            )
            r["steal"] = steal.share
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
