"""An agent's stdio when the runner starts it itself: stdin holding the SPAWN packet, stdout and stderr read under
their caps (:class:`Pipes`); and :class:`Output`, what the runner needs of an agent's output, whoever reads it.

asyncio's own PIPEs make ``Process.wait()`` wait for every pipe to close too (3.11), so a leftover child holding
stdout, or a paused reader, would hide the leader's exit. The runner owns its pipes instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Protocol

from ambient.core.errors import StdinError
from ambient.runners.spawner_helper import keep_output, read_some
from ambient.runners.waiter import Waiter
from ambient.storage.fsutil import unnamed_file


class Output(Protocol):
    """An agent's stdout and stderr being read: by the runner (:class:`Pipes`) or by the spawner
    (:class:`~ambient.runners.spawner.SpawnedAgent`)."""

    @property
    def stdout(self) -> bytes: ...

    @property
    def stderr_tail(self) -> bytes: ...

    @property
    def over(self) -> bool: ...

    @property
    def out_closed(self) -> bool: ...

    @property
    def closed(self) -> bool: ...

    def wake(self) -> None: ...

    async def until(self, ready: Callable[[], bool], deadline: float) -> bool: ...

    async def release(self) -> None: ...

    def close(self) -> None: ...


def packet_fd(data: bytes) -> int:
    """A readable fd positioned at 0 holding ``data``: the agent's stdin (a memfd; an unlinked temp file elsewhere).

    A file rather than a pipe: nothing to feed, nothing to block on, and EOF is where the packet ends.
    """
    return unnamed_file(data)


@contextlib.contextmanager
def child_stdio(packet: bytes) -> Iterator[tuple[int, int, int, int, int]]:
    """The agent's stdio: (stdin holding the packet, stdout writer, stderr writer, stdout reader, stderr reader).

    The readers are non-blocking (the agent's ends stay blocking). The child's ends are closed on leaving (the
    child holds its own copies); the readers too if starting failed.
    """
    try:
        stdin_fd = packet_fd(packet)
    except OSError as exc:
        raise StdinError(exc.errno, f"cannot prepare the packet for stdin: {exc}") from exc
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        os.set_blocking(out_r, False)
        os.set_blocking(err_r, False)
        yield stdin_fd, out_w, err_w, out_r, err_r
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        for fd in (stdin_fd, out_w, err_w):
            os.close(fd)


class Pipes(Waiter):
    """The agent's stdout and stderr, read by ``add_reader`` callbacks, and one waiter woken when something changes.

    Keeps the first ``out_cap`` bytes of stdout (past them: discarded and ``over`` set, the group is then killed)
    and the last ``err_tail`` bytes of stderr. Owns both (non-blocking) fds from construction: :meth:`close`.

    Performance (bench/fanout.py (b)): two read transports with their protocols and futures, plus the tasks and
    ``asyncio.wait`` calls of supervision, cost ~45 loop callbacks per agent; this costs about six (a read or two
    per pipe, the exit, a wake-up per wait).
    """

    def __init__(self, out_fd: int, err_fd: int, out_cap: int, err_tail: int) -> None:
        super().__init__(asyncio.get_running_loop())
        self._out_fd, self._err_fd = out_fd, err_fd
        self._open = {out_fd, err_fd}
        self._out_cap, self._err_tail = out_cap, err_tail
        self._out = bytearray()
        self._err = bytearray()
        self.over = False
        try:
            for fd in (out_fd, err_fd):
                self._loop.add_reader(fd, self._readable, fd)
        except BaseException:
            self.close()
            raise

    @property
    def stdout(self) -> bytes:
        return bytes(self._out)

    @property
    def stderr_tail(self) -> bytes:
        return bytes(self._err)

    @property
    def out_closed(self) -> bool:
        """Stdout reached EOF: every process that held it has closed it."""
        return self._out_fd not in self._open

    @property
    def closed(self) -> bool:
        return not self._open

    def _readable(self, fd: int) -> None:
        # A few reads per call: the data and the EOF right behind it usually come in one callback; bounded so
        # that a flood cannot keep the loop from its other work.
        for _ in range(4):
            data = read_some(fd)
            if data is None:
                return
            if not data:
                self._close(fd)
                self.wake()
                return
            if (fd == self._err_fd or not self.over) and not keep_output(
                self._out, self._err, data, fd == self._err_fd, self._out_cap, self._err_tail
            ):
                self.over = True
                self.wake()

    def _close(self, fd: int) -> None:
        if fd in self._open:
            self._open.discard(fd)
            self._loop.remove_reader(fd)
            os.close(fd)

    async def release(self) -> None:
        """Stop reading and keep what was read (pipes held by a process that escaped the group)."""
        self.close()

    def close(self) -> None:
        """Stop reading; close what is still open (a pipe held by a process that escaped the group is abandoned)."""
        for fd in list(self._open):
            self._close(fd)
