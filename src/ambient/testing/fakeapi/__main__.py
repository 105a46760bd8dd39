"""``python -m ambient.testing.fakeapi anthropic|openai [--port N] [--port-file F] [--delay-s S]``: serve one fake
model API until SIGTERM, for a process that cannot host the fake in a thread of its own."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from ambient.storage.fsutil import atomic_write

from .. import fakeapi
from .anthropic import FakeAnthropic
from .openai import FakeOpenAI
from .server import FakeServer


def main(argv: Sequence[str] | None = None) -> int:
    """Serve a fake API until SIGTERM/SIGINT, printing its URL (and writing its port to ``--port-file``)."""
    parser = argparse.ArgumentParser(
        prog="python -m ambient.testing.fakeapi", description=(fakeapi.__doc__ or "").partition("\n")[0]
    )
    parser.add_argument("provider", choices=["anthropic", "openai"])
    parser.add_argument("--port", type=int, default=0, help="the port (default: a free one)")
    parser.add_argument("--port-file", type=Path, help="write the port number there once listening")
    parser.add_argument("--delay-s", type=float, default=0.0, help="sleep before each reply")
    args = parser.parse_args(argv)
    cls: type[FakeServer] = FakeAnthropic if args.provider == "anthropic" else FakeOpenAI
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    api = cls(port=args.port, delay_s=args.delay_s)
    with api:
        if args.port_file is not None:
            atomic_write(args.port_file, f"{api.port}\n", durable=False)
        sys.stdout.write(api.url + "\n")
        sys.stdout.flush()
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
