"""The daemon's signals: SIGTERM/SIGINT stop it, SIGHUP reloads it, and a stop under way is never cut short.

asyncio's ``loop.add_signal_handler`` puts the default dispositions back when its loop closes (and Python's own
finalization does the same for any Python handler), so a SIGTERM repeated while the daemon exits (an impatient
operator, a supervisor signalling again) killed a daemon whose state was already saved: exit -15, which systemd
counts as a failure. These handlers are plain ``signal.signal`` ones that hand the signal to the loop while it
runs; once the daemon has stopped, the CLI's process ignores the signals (``SIG_IGN``) until it has exited. A
wakeup fd that the loop reads makes a signal the kernel delivered to another thread (a writer, a to_thread worker)
wake the loop at once, as asyncio's own handlers do.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any


class SignalTrap:
    """Signal handlers for the life of one event loop (install in the main thread, from a coroutine on it)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, handlers: Mapping[signal.Signals, Callable[[signal.Signals], None]]
    ) -> None:
        self.loop = loop
        self.handlers = dict(handlers)
        self.closed = False
        self._previous: dict[signal.Signals, Any] = {}
        self._wakeup: tuple[socket.socket, socket.socket] | None = None
        self._old_wakeup_fd = -1

    def install(self) -> None:
        rsock, wsock = socket.socketpair()
        for s in (rsock, wsock):
            s.setblocking(False)
        self._wakeup = (rsock, wsock)
        self.loop.add_reader(rsock.fileno(), self._drain)
        self._old_wakeup_fd = signal.set_wakeup_fd(wsock.fileno(), warn_on_full_buffer=False)
        for sig in self.handlers:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def close(self, *, keep_ignoring: bool) -> None:
        """Stop handing signals to the loop. ``keep_ignoring``: the process ends next (the CLI), so every further
        signal is ignored until it has; otherwise (a daemon served inside another program) the previous handlers are
        put back."""
        self.closed = True
        for sig, previous in self._previous.items():
            # SIG_IGN, not a Python handler that ignores: Python's finalization puts SIG_DFL back in place of those.
            signal.signal(sig, signal.SIG_IGN if keep_ignoring else previous)
        signal.set_wakeup_fd(self._old_wakeup_fd)
        if self._wakeup is not None:
            rsock, wsock = self._wakeup
            with contextlib.suppress(ValueError, RuntimeError):
                self.loop.remove_reader(rsock.fileno())
            rsock.close()
            wsock.close()
            self._wakeup = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.closed or self.loop.is_closed():
            return
        sig = signal.Signals(signum)
        with contextlib.suppress(RuntimeError):  # the loop closing under us: the stop is under way anyway
            self.loop.call_soon_threadsafe(self.handlers[sig], sig)

    def _drain(self) -> None:
        """The wakeup bytes only wake the loop; the Python handler above does the work."""
        if self._wakeup is None:
            return
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while self._wakeup[0].recv(4096):
                pass
