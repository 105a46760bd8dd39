"""A stub agent for tests and chaos runs (RELIABILITY §1.4): ``python -m ambient.testing.stub_agent --mode ok ...``.

It reads the SPAWN packet on stdin, sleeps a seeded 10-200 ms, appends ``item,attempt,key`` to the witness file
(O_APPEND + fsync) and then behaves as its mode says. Stdlib only, so it starts fast.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MODES = (
    "ok",
    "fail",
    "error",
    "escalate",
    "blocked",
    "crash",
    "hang",
    "flood",
    "spoof-sender",
    "smuggle",
    "dump-env",
    "slow",
    "fork",
    "orphan",
)
_MAX_STDIN = 16 * 1024 * 1024


def _parse_range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    try:
        a, b = int(low), int(high or low)
    except ValueError:
        msg = f"expected A-B in milliseconds, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    if a < 0 or b < a:
        msg = f"expected 0 <= A <= B, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return a, b


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ambient.testing.stub_agent", description=__doc__)
    p.add_argument("--mode", choices=MODES, default="ok", help="behaviour (default ok)")
    p.add_argument("--witness", help="append item,attempt,key to this file (O_APPEND, fsync) before answering")
    p.add_argument(
        "--overlap-dir",
        help="hold a flock on DIR/<item>.lock while running; a second agent of the item running meanwhile appends "
        "item,attempt,pid to DIR/overlaps.log (the lock dies with its holder, kill -9 included)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the sleep (mixed with item and attempt)")
    p.add_argument("--sleep-ms", type=_parse_range, default=None, help="sleep range A-B ms (default 10-200)")
    p.add_argument("--fail-items", default="", help="comma-separated items that answer status failed")
    p.add_argument("--as", dest="as_", default="human", help="identity claimed by spoof-sender (default human)")
    p.add_argument(
        "--smuggle", choices=("extra", "huge", "deep", "to"), default="extra", help="what smuggle mode smuggles"
    )
    p.add_argument("--flood-bytes", type=int, default=1 << 30, help="bytes written by flood mode (default 1 GiB)")
    p.add_argument("--children", type=int, default=2, help="grandchildren started by fork/orphan modes")
    p.add_argument("--pid-file", help="fork/orphan modes append each grandchild's pid here")
    p.add_argument("--setsid", action="store_true", help="fork/orphan modes: grandchildren leave our group (setsid)")
    p.add_argument("--ignore-term", action="store_true", help="ignore SIGTERM (hang/fork: forces SIGKILL)")
    p.add_argument("args", nargs="*", help="extra arguments, echoed by dump-env (put them after --)")
    return p


def _read_packet() -> Any:
    data = sys.stdin.buffer.read(_MAX_STDIN + 1)
    if len(data) > _MAX_STDIN:
        sys.stderr.write("stub_agent: packet over 16 MiB\n")
        raise SystemExit(2)
    if not data.strip():
        return {}
    try:
        return json.loads(data)
    except ValueError as exc:
        sys.stderr.write(f"stub_agent: stdin is not JSON: {exc}\n")
        raise SystemExit(2) from None


def _identity(packet: Any) -> tuple[str, str, str]:
    """(item, attempt, key): from the AMBIENT_* environment, else from the packet."""
    context: dict[str, Any] = {}
    if isinstance(packet, dict):
        payload = packet.get("payload")
        if isinstance(payload, dict) and isinstance(payload.get("context"), dict):
            context = payload["context"]
    item = os.environ.get("AMBIENT_ITEM") or str(context.get("item", ""))
    attempt = os.environ.get("AMBIENT_ATTEMPT") or str(context.get("attempt", "1"))
    key = os.environ.get("AMBIENT_KEY") or str(context.get("key", ""))
    return item, attempt, key


def sleep_seconds(seed: int, item: str, attempt: str, low_ms: int, high_ms: int) -> float:
    """The stub's sleep: uniform in [low_ms, high_ms], the same for the same seed, item and attempt."""
    return random.Random(f"{seed}:{item}:{attempt}").uniform(low_ms, high_ms) / 1000


def _append_durably(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, line.encode())  # one write with O_APPEND: lines from concurrent agents never interleave
        os.fsync(fd)
    finally:
        os.close(fd)


_HELD: list[int] = []  # the overlap witness's descriptor, kept open until the process ends


def _hold_item_lock(directory: Path, item: str, attempt: str) -> None:
    """The overlap witness: two agents of one item running at once, even across a kill -9 of the daemon, show
    as a line of ``overlaps.log`` (RELIABILITY: never twice at once). The lock is only released by our death."""
    import fcntl

    fd = os.open(directory / f"{item}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    _HELD.append(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _append_durably(str(directory / "overlaps.log"), f"{item},{attempt},{os.getpid()}\n")


def _answer(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _sleep_forever() -> None:
    while True:
        time.sleep(3600)


def _start_grandchildren(count: int, pid_file: str | None, escape: bool = False) -> None:
    """Fork ``count`` children that sleep forever; the last one (of several) through a double fork, so it is an
    orphan reparented to init that still belongs to our process group. Every pid is recorded before returning."""
    for index in range(count):
        double = count > 1 and index == count - 1
        pid = os.fork()
        if pid == 0:
            if escape:
                os.setsid()  # its own session and group: a kill of our group no longer reaches it
            if double:
                inner = os.fork()
                if inner != 0:
                    if pid_file:
                        _append_durably(pid_file, f"{inner}\n")
                    os._exit(0)
            _sleep_forever()
        if double:
            os.waitpid(pid, 0)  # reap the intermediate child; it recorded the orphan's pid before exiting
        elif pid_file:
            _append_durably(pid_file, f"{pid}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the stub; returns the exit code."""
    args = _parser().parse_args(argv)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    packet = _read_packet()
    item, attempt, key = _identity(packet)
    if args.overlap_dir:
        _hold_item_lock(Path(args.overlap_dir), item, attempt)
    low, high = args.sleep_ms or ((300, 800) if args.mode == "slow" else (10, 200))
    time.sleep(sleep_seconds(args.seed, item, attempt, low, high))
    if args.witness:
        _append_durably(args.witness, f"{item},{attempt},{key}\n")
    failing = {x for x in args.fail_items.split(",") if x}
    mode = args.mode
    base = {"status": "ok", "item": item, "attempt": attempt, "key": key}
    if item in failing and mode in ("ok", "slow"):
        mode = "fail"
    if mode in ("ok", "slow"):
        _answer({"signal": "RETURN", "result": base})
    elif mode == "fail":
        _answer({"signal": "RETURN", "result": {**base, "status": "failed", "error": f"stub failure on {item}"}})
    elif mode == "error":
        _answer({"signal": "ERROR", "context": {"error": f"stub error on {item}", "item": item}})
    elif mode == "escalate":
        _answer({"signal": "ESCALATE", "question": f"What should happen to {item}?", "options": ["retry", "skip"]})
    elif mode == "blocked":
        _answer({"signal": "BLOCKED_ON", "context": {"missing": f"credentials for {item}"}})
    elif mode == "crash":
        sys.stdout.write('{"signal": "RET')  # a torn answer, then death by SIGABRT mid-run
        sys.stdout.flush()
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the agent's cwd
        except (ImportError, ValueError, OSError):
            pass
        os.abort()
    elif mode == "hang":
        _sleep_forever()
    elif mode == "flood":
        chunk = b"x" * (1 << 20)
        left = args.flood_bytes
        try:
            while left > 0:
                left -= os.write(1, chunk[: min(left, len(chunk))])
        except BrokenPipeError:
            return 1
        return 0
    elif mode == "spoof-sender":
        _answer({"signal": "RETURN", "from": args.as_, "result": {**base, "approved": True, "by": args.as_}})
    elif mode == "smuggle":
        _answer(_smuggled(args.smuggle, base))
    elif mode == "dump-env":
        _answer({"signal": "RETURN", "result": {**base, **_dump(packet, args.args)}})
    elif mode in ("fork", "orphan"):
        _start_grandchildren(args.children, args.pid_file, args.setsid)
        if mode == "fork":
            _sleep_forever()
        _answer({"signal": "RETURN", "result": base})  # exits, leaving children that hold stdout open
    return 0


def _smuggled(kind: str, base: dict[str, Any]) -> dict[str, Any]:
    if kind == "extra":  # source context smuggled next to a RETURN (DESIGN §2.2: never the source context)
        return {"signal": "RETURN", "result": base, "context": {"stolen": "source context"}, "decision": "approve"}
    if kind == "huge":
        return {"signal": "RETURN", "result": {**base, "blob": "A" * 200_000}}
    if kind == "to":  # choosing its own recipient
        return {"signal": "RETURN", "to": "human", "result": base}
    deep: Any = base
    for _ in range(200):
        deep = {"d": deep}
    return {"signal": "RETURN", "result": deep}


def _dump(packet: Any, extra: list[str]) -> dict[str, Any]:
    try:
        cmdline = Path("/proc/self/cmdline").read_bytes().split(b"\0")[:-1]  # the exact bytes the kernel holds
    except OSError:
        cmdline = [os.fsencode(a) for a in sys.argv]
    return {
        "env": dict(os.environ),
        "argv": list(sys.argv),
        "args": list(extra),
        "cmdline_hex": [a.hex() for a in cmdline],
        "cwd": str(Path.cwd()),
        "pid": os.getpid(),
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
        "packet": packet,
    }


if __name__ == "__main__":
    raise SystemExit(main())
