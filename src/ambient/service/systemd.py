"""systemd service notifications over ``$NOTIFY_SOCKET`` with the stdlib only (RELIABILITY §2.4).

Every call is a no-op returning False when not run by systemd, and a failed send is logged, never
raised into the daemon. The watchdog is pinged from a task on the event loop, so a blocked loop
stops the pings and systemd restarts the service (R-09).
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import time
from collections.abc import Mapping

from ambient.core.lazylog import get_logger

log = get_logger(__name__)

# A datagram to a busy manager may block; never hold the event loop longer than this.
_SEND_TIMEOUT_S = 0.5
_MAX_STATUS_CHARS = 400

_failing = False  # log a run of send failures once, not at every watchdog ping


def _address(raw: str) -> str | None:
    if raw.startswith("/"):
        return raw
    if raw.startswith("@"):  # abstract namespace
        return "\0" + raw[1:]
    return None


def notify(msg: str | bytes) -> bool:
    """Send one notification datagram (``KEY=VALUE`` lines). True if sent, False otherwise.

    Not under systemd (``NOTIFY_SOCKET`` unset): False, silently. An unsupported address (neither a
    path nor ``@abstract``) or a send error: False, logged once per run of failures.
    """
    global _failing
    raw = os.environ.get("NOTIFY_SOCKET", "")
    if not raw:
        return False
    data = msg.encode("utf-8") if isinstance(msg, str) else msg
    addr = _address(raw)
    if addr is None:
        if not _failing:
            log.warning("sd_notify_unsupported_address", error=os.strerror(errno.EAFNOSUPPORT), address=raw[:64])
        _failing = True
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(_SEND_TIMEOUT_S)
            sock.connect(addr)
            sock.sendall(data)
    except OSError as exc:
        if not _failing:
            log.warning("sd_notify_failed", error=exc.strerror or str(exc), errno=exc.errno)
        _failing = True
        return False
    if _failing:
        log.info("sd_notify_recovered")
    _failing = False
    return True


def _one_line(text: str) -> str:
    # A newline would let text inject another assignment (e.g. READY=1) into the datagram.
    flat = " ".join(text.split())
    return flat[:_MAX_STATUS_CHARS]


def ready(status: str | None = None) -> bool:
    """``READY=1``: state recovered and watchers running (also ends a reload)."""
    return notify("READY=1" + (f"\nSTATUS={_one_line(status)}" if status else ""))


def reloading() -> bool:
    """``RELOADING=1`` with ``MONOTONIC_USEC``; send :func:`ready` when the reload is done."""
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify(f"RELOADING=1\nMONOTONIC_USEC={usec}")


def stopping(status: str | None = None) -> bool:
    """``STOPPING=1``: shutdown has begun (cannot be undone)."""
    return notify("STOPPING=1" + (f"\nSTATUS={_one_line(status)}" if status else ""))


def status(text: str) -> bool:
    """``STATUS=``: the one-line summary shown by ``systemctl status``."""
    return notify(f"STATUS={_one_line(text)}")


def extend_timeout(usec: int) -> bool:
    """``EXTEND_TIMEOUT_USEC=``: ask for more time to start or stop (e.g. while agents drain)."""
    return notify(f"EXTEND_TIMEOUT_USEC={max(0, int(usec))}")


def watchdog_ping() -> bool:
    """``WATCHDOG=1``: one keep-alive."""
    return notify("WATCHDOG=1")


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between watchdog pings (``WATCHDOG_USEC / 2``), or None when no watchdog applies.

    None when ``NOTIFY_SOCKET`` or ``WATCHDOG_USEC`` is unset or invalid, or when ``WATCHDOG_PID``
    names another process (the watchdog is for the main process only).
    """
    env = os.environ if environ is None else environ
    if not env.get("NOTIFY_SOCKET"):
        return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    return usec / 2 / 1_000_000


async def watchdog_task(stop_event: asyncio.Event, interval: float | None = None) -> None:
    """Ping ``WATCHDOG=1`` every ``interval`` seconds from the event loop until ``stop_event`` is set.

    ``interval`` defaults to :func:`watchdog_interval`; without a watchdog it just waits for the stop.
    The pings run on the loop itself: if the loop is blocked, they stop, which is the point.
    """
    every = watchdog_interval() if interval is None else interval
    if every is None or every <= 0:
        await stop_event.wait()
        return
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    while not stop_event.is_set():
        watchdog_ping()
        # Fixed rate: the time spent pinging is taken off the wait, so pings do not drift.
        next_at = max(next_at + every, loop.time())
        try:
            await asyncio.wait_for(stop_event.wait(), timeout=max(0.0, next_at - loop.time()))
        except TimeoutError:
            continue
