"""Idle cost of the daemon: 30 s on a brain with 100 workflows (already run, or drafts) and 1,000 open claims.

Prints the CPU seconds the daemon used during the idle window (from /proc via psutil, after it is ready and its
start-up ticks have settled), the CPU of the start-up itself, and the peak RSS (VmHWM). Targets: under
0.3 s CPU for 30 s idle, under 80 MB RSS. Usage: ``python bench/idle.py [--seconds 30] [--claims 1000]``.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import TempDir, agent_md, daemon_argv, daemon_env, foreach_yaml, new_brain

from ambient.claims.claim import new_claim
from ambient.storage.yamlfile import dump_yaml


def make_idle_brain(base: Path, workflows: int, claims: int) -> Path:
    """Half the workflows already run (recorded in workflows.json), half drafts; ``claims`` open claims."""
    echo = agent_md("echo", {"kind": "command", "argv": ["/bin/echo", "{}"]})
    root = new_brain(base, "brain", {"echo": echo})
    seen = {}
    for i in range(workflows):
        name = f"wf-{i:03d}"
        text = foreach_yaml(name, [f"item-{k}" for k in range(5)], "echo", 2)
        if i % 2:
            text = text.replace(f"workflow: {name}\n", f"workflow: {name}\nstatus: draft\n")
        else:
            seen[name] = {"first_hash": "bench", "last_started": datetime.now(UTC).isoformat(), "runs": 1}
        (root / "workflows" / f"{name}.yml").write_text(text)
    (root / ".ambient").mkdir(exist_ok=True)
    (root / ".ambient" / "workflows.json").write_text(json.dumps(seen))
    now = datetime.now(UTC) - timedelta(minutes=5)
    for i in range(claims):
        claim = new_claim(f"sess-20261130-1200-idle-{i:04d}", "satellite", f"projects/idle/{i}.md", "echo", now)
        (root / "claims" / f"{claim.sess_id}.yml").write_text(dump_yaml(claim.to_document()))
    return root


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--settle", type=float, default=3.0, help="seconds after READY before the idle window")
    ap.add_argument("--workflows", type=int, default=100)
    ap.add_argument("--claims", type=int, default=1000)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--daemon-arg", action="append", default=[], help="extra argument for `ambient run`")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with TempDir(args.dir) as base:
        root = make_idle_brain(base, args.workflows, args.claims)
        log_path = base / "daemon.log"
        with log_path.open("wb") as log:
            argv = daemon_argv(root, "--log-level", "info", *args.daemon_arg)
            proc = subprocess.Popen(
                argv, env=daemon_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        p = psutil.Process(proc.pid)
        t0 = time.monotonic()
        try:
            while b"daemon_ready" not in log_path.read_bytes():
                if proc.poll() is not None or time.monotonic() - t0 > 60:
                    raise RuntimeError(f"daemon not ready: {log_path.read_text()[-2000:]}")
                time.sleep(0.01)
            ready_s = time.monotonic() - t0
            time.sleep(args.settle)  # the start-up ticks (first look at every workflow and claim) finish
            c0 = p.cpu_times()
            startup_cpu = c0.user + c0.system
            w0 = time.monotonic()
            time.sleep(args.seconds)
            c1 = p.cpu_times()
            window = time.monotonic() - w0
            idle_cpu = (c1.user + c1.system) - startup_cpu
            status = Path(f"/proc/{proc.pid}/status").read_text()
            hwm_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))
            rss_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
            wakeups = log_path.read_text().count('"event"')
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    res = {
        "workflows": args.workflows,
        "claims": args.claims,
        "ready_s": ready_s,
        "startup_cpu_s": startup_cpu,
        "idle_window_s": window,
        "idle_cpu_s": idle_cpu,
        "peak_rss_mb": hwm_kb / 1024,
        "rss_mb": rss_kb / 1024,
        "log_lines": wakeups,
    }
    print(f"idle brain: {args.workflows} workflows (half run, half drafts), {args.claims} open claims")
    print(f"start-up: ready in {ready_s:.2f} s, {startup_cpu:.2f} s CPU until the idle window")
    print(
        f"idle {window:.1f} s: {idle_cpu:.3f} s CPU ({'ok' if idle_cpu < 0.3 * window / 30 else 'OVER'} target "
        f"< 0.3 s per 30 s)"
    )
    print(
        f"peak RSS {hwm_kb / 1024:.1f} MB, RSS now {rss_kb / 1024:.1f} MB "
        f"({'ok' if hwm_kb / 1024 < 80 else 'OVER'} target < 80 MB)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
