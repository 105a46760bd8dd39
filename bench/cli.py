"""Wall time of short CLI commands (``ambient lock acquire`` / ``release``, ``ambient send``) against
``python -c "import pydantic, yaml"`` measured in the same run, interleaved so machine noise hits all alike.

Agents and scripts call these often, so a command must not pay for what it does not use. Target:
each command at most 1.5x the baseline. ``send`` is timed twice: routing the packet in its own process (no
daemon), and handing it to a daemon running on a second brain (``send-daemon``, its send socket).
Usage: ``python bench/cli.py [--rounds 15]``; ``--importtime CMD`` prints the slowest imports of one command
(``python -X importtime``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import PY, REPO, TempDir, median

PACKET = "from: human\nto: deploy\nsignal: SPAWN\nscope:\n  zone: project\n  files: [infrastructure/vps/a.yml]\n"


def _time(argv: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, env=env, check=False)
    dt = time.perf_counter() - t0
    if proc.returncode not in ok:
        raise RuntimeError(f"{' '.join(argv[2:])} exited {proc.returncode}: {proc.stderr.decode(errors='replace')}")
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--dir", default=None)
    ap.add_argument(
        "--importtime",
        choices=("acquire", "release", "send", "check"),
        default=None,
        help="print the 15 slowest cumulative imports of one command and exit",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with TempDir(args.dir) as base:
        brain = base / "brain"
        shutil.copytree(REPO / "examples" / "brain", brain)
        for sub in ("claims", "locks"):
            (brain / sub).mkdir(exist_ok=True)
        packet = base / "packet.yml"
        packet.write_text(PACKET)
        amb = [PY, "-m", "ambient", "--brain", str(brain)]
        served = base / "served"  # a second brain with its daemon running: `send` is answered over its socket
        shutil.copytree(REPO / "examples" / "brain", served)
        # Bytecode caches as a user has them: PYTHONDONTWRITEBYTECODE (set in some sandboxes) would make every
        # ambient command compile its modules while pydantic and yaml load their installed .pyc; the caches go to
        # a temp prefix so the source tree is not touched.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(base / "pycache")
        cmds = {
            "baseline": [PY, "-c", "import pydantic, yaml"],
            "acquire": [*amb, "lock", "acquire", "projects/bench.md", "sess-bench"],
            "release": [*amb, "lock", "release", "projects/bench.md", "sess-bench"],
            "send": [*amb, "send", str(packet)],
            "check": [*amb, "lock", "check", "projects/bench.md"],
            "send-daemon": [PY, "-m", "ambient", "--brain", str(served), "send", str(packet)],
        }
        if args.importtime:
            argv = cmds[args.importtime]
            subprocess.run(argv, capture_output=True, env=env, check=False)  # write the bytecode caches
            proc = subprocess.run(
                [argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True, env=env, check=False
            )
            rows = [line.split("|") for line in proc.stderr.splitlines() if line.startswith("import time:")]
            rows = [r for r in rows if r[1].strip().isdigit()]
            for r in sorted(rows, key=lambda r: -int(r[1]))[:15]:
                print(f"{int(r[1]) / 1000:8.1f} ms  {r[2].rstrip()}")
            return 0
        daemon = subprocess.Popen(
            [PY, "-m", "ambient", "--brain", str(served), "run", "--log-level", "warning"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            sock = served / ".ambient" / "run" / "send.sock"
            deadline = time.monotonic() + 60
            while not sock.exists() and time.monotonic() < deadline and daemon.poll() is None:
                time.sleep(0.05)  # the daemon's start-up, once
            if not sock.exists():
                raise RuntimeError("the daemon of the second brain did not open its send socket")
            for argv in cmds.values():  # warm-up: bytecode caches, page cache
                _time(argv, env, ok=(0, 1, 2))
            times: dict[str, list[float]] = {k: [] for k in cmds}
            for _ in range(args.rounds):
                for name, argv in cmds.items():
                    times[name].append(_time(argv, env, ok=(0, 1) if name == "check" else (0,)))
        finally:
            daemon.terminate()
            daemon.wait(60)
    med = {k: median(v) for k, v in times.items()}
    base_s = med["baseline"]
    print(f"baseline python -c 'import pydantic, yaml': {base_s * 1000:.0f} ms (median of {args.rounds})")
    for name in ("acquire", "release", "check", "send", "send-daemon"):
        ratio = med[name] / base_s
        print(
            f"ambient {name:11s} {med[name] * 1000:6.0f} ms  = {ratio:.2f}x baseline "
            f"({'ok' if ratio <= 1.5 else 'OVER'} target 1.5x)"
        )
    pair = med["acquire"] + med["release"]
    print(f"lock acquire + release: {pair * 1000:.0f} ms = {pair / (2 * base_s):.2f}x two baselines")
    if args.json:
        Path(args.json).write_text(json.dumps({"median_s": med, "rounds": args.rounds}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
