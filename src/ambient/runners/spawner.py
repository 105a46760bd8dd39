"""Starting command agents from a small helper process, so that the event loop never waits for an ``exec``.

``subprocess.Popen`` vforks: the calling thread waits until the child has exec'd, and in the daemon that thread is
the event loop. In a fan-out of command agents a start took ~0.5 ms of the loop's time, half of it waiting for
the child (bench/fanout.py (b), bench/README.md, finding 36), and an ``exec`` stuck on a hung network filesystem would
freeze the whole daemon. Starting agents in a thread is no way out: each start becomes GIL hand-offs with the busy loop
(measured slower, see :class:`ambient.runners.child.Child`). So the daemon keeps one helper process, the
spawner (``spawner_helper.py``, standard library only), in the spirit of Erlang's ``erl_child_setup`` and ports:
the loop sends it a request (argv, environment, the SPAWN packet for stdin, the output caps) and goes on; the
spawner ``posix_spawn``s the agent, reads its stdout and stderr, reaps it, and reports its pid, then its output
and exit code, in one message for an agent that simply ran and exited. The loop never touches an agent's pipes:
in a fan-out their creation, reads and closing were about half of what a command agent cost the loop
(bench/README.md, finding 39), and the spawner does that work on the other core.

The agent is the spawner's child, not the daemon's, and nothing else changes: it still runs in its own session,
the daemon still decides and signals its process group directly (timeouts, output caps, shutdown), still records
its pid and start time for the reconciliation after a crash. If the daemon dies, the spawner starts none of the
requests still queued (``daemon_gone`` in the helper), reads EOF and exits; its agents are then orphans, exactly
as the daemon's own children would be, stopped by the next start (:mod:`ambient.runners.orphans`). If the spawner dies
(someone killed it), the exit codes of the running agents are lost: the daemon kills their groups, their
attempts end as errors (and are retried by policy), and the next start brings a new spawner up. A spawner that
cannot even start is given up on for good and agents start through ``Popen`` again (``broken``).
"""

from __future__ import annotations

import array
import asyncio
import collections
import contextlib
import errno
import marshal
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import structlog

from ambient.core.errors import SpawnerLost
from ambient.core.process import start_time_at
from ambient.runners import spawner_helper as _helper
from ambient.runners.waiter import Waiter
from ambient.storage.fsutil import write_all

log = structlog.get_logger("ambient.spawner")

_HELPER: Final = Path(_helper.__file__)
#: Requests and reports larger than this travel in a memfd (a unix datagram is capped by the socket's buffer).
INLINE_MAX: Final = _helper.INLINE_MAX
_RECV_SPACE: Final = socket.CMSG_SPACE(array.array("i").itemsize)
_READS_PER_CALLBACK: Final = 256
_RELEASE_WAIT_S: Final = 5.0  # for the spawner's report after a release (it is lost with the spawner otherwise)
_FS_ENCODING: Final = (sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())


class SpawnedAgent(Waiter):
    """An agent started by the spawner: its pid (= process group id), and what the spawner reports of it.

    The spawner reads its output: :attr:`stdout` (the first ``out_cap`` bytes) and :attr:`stderr_tail` are set by
    the final report, when :attr:`closed` becomes true; :attr:`over` and :attr:`out_closed` may come before it.
    """

    def __init__(self, pid: int, start_time: float | None, spawner: Spawner) -> None:
        super().__init__(asyncio.get_running_loop())
        self.pid = pid
        self.start_time = start_time
        self.returncode: int | None = None
        self.on_exit: Callable[[], None] | None = None
        self.stdout = b""
        self.stderr_tail = b""
        self.over = False  # stdout passed its cap
        self.out_closed = False  # stdout reached EOF
        self.closed = False  # both pipes reached EOF (or were released): stdout and stderr_tail are final
        self._spawner = spawner
        self._exited: asyncio.Future[int] = self._loop.create_future()

    def _set_exit(self, code: int) -> None:
        if self.returncode is not None:
            return
        self.returncode = code
        self._exited.set_result(code)
        self.wake()
        if self.on_exit is not None:
            self.on_exit()

    def _set_output(self, stdout: bytes, stderr_tail: bytes, over: bool) -> None:
        self.stdout, self.stderr_tail = stdout, stderr_tail
        self.over = self.over or over
        self.out_closed = self.closed = True
        self.wake()

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    async def release(self) -> None:
        """Have what was read so far: the spawner stops reading pipes held by a process that escaped the group."""
        if not self.closed:
            self._spawner._release(self.pid)
            await self.until(lambda: self.closed, self._loop.time() + _RELEASE_WAIT_S)

    def close(self) -> None:
        """Stop waiting for the output (cancellation, errors): the spawner stops reading it."""
        if not self.closed:
            self._spawner._release(self.pid)
            self.closed = self.out_closed = True


def available() -> bool:
    """Whether agents can start through a spawner here (Linux: posix_spawn, pidfds, an interpreter to run it)."""
    return (
        sys.platform == "linux"
        and hasattr(os, "posix_spawn")
        and hasattr(os, "pidfd_open")
        and hasattr(os, "memfd_create")
        and bool(sys.executable)
    )


class Spawner:
    """The daemon's end of the spawner: started at the first agent, used from the event loop only."""

    def __init__(self, python: str | None = None, *, end_with_parent: bool = False) -> None:
        self._python = python or sys.executable
        #: Kill every agent when this process dies (a worker of the cluster, whose items another worker takes over
        #: once its lease lapses: its agents must not outlive it). A daemon's agents outlive it instead: its
        #: successor recognises and stops them (ambient.runners.orphans).
        self.end_with_parent = end_with_parent
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[SpawnedAgent]] = {}
        self._agents: dict[int, SpawnedAgent] = {}
        # Requests the socket had no room for: (id, message, duplicated descriptors), sent when it drains.
        self._outbox: collections.deque[tuple[int, bytes, list[int]]] = collections.deque()
        self._answered = False  # this spawner process has answered at least once
        self._buf = bytearray(INLINE_MAX + 4096)  # one report (a larger one comes in a memfd)
        self.broken = False  # the spawner could not be started: use Popen from now on

    @property
    def running(self) -> bool:
        return self._sock is not None

    def start(self) -> None:
        """Bring the spawner up now rather than at the first agent (from the event loop; a failure is logged).

        The daemon calls this at start-up when the brain has command agents: the helper's ~20 ms of interpreter
        start-up is then not spent inside the first run.
        """
        with contextlib.suppress(SpawnerLost):
            self._ensure(asyncio.get_running_loop())

    async def spawn(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        stdin: bytes,
        out_cap: int,
        err_tail: int,
        jail: dict[str, Any] | None = None,
    ) -> SpawnedAgent:
        """Start an agent reading ``stdin``; returns once it runs. Raises OSError if it cannot start.

        The spawner keeps the first ``out_cap`` bytes of its stdout and the last ``err_tail`` of its stderr (see
        :class:`SpawnedAgent`). Cancelled after the request left, the agent is killed as soon as its pid arrives.
        Its ``start_time`` is read by the spawner just before the start: a start queued behind others still gets
        its own (reconciliation after a crash compares it with ``/proc`` to 50 ms).
        """
        loop = asyncio.get_running_loop()
        sock = self._ensure(loop)
        self._next_id += 1
        rid = self._next_id
        # As os.fsencode does, without its per-call checks (bench: ~20 strings per agent).
        enc, errors = _FS_ENCODING
        message = marshal.dumps(
            (
                _helper.SPAWN,
                rid,
                [a.encode(enc, errors) for a in argv],
                {k.encode(enc, errors): v.encode(enc, errors) for k, v in env.items()},
                os.fsencode(cwd),
                stdin,
                out_cap,
                err_tail,
                *((jail,) if jail else ()),  # its user, Landlock's paths: the spawner forks, confines, execs
            )
        )
        fds: list[int] = []
        if len(message) > INLINE_MAX:
            big = os.memfd_create("ambient-spawn-request", os.MFD_CLOEXEC)
            fds.append(big)
            write_all(big, message)
            message = marshal.dumps((_helper.SPAWN, rid))
        future: asyncio.Future[SpawnedAgent] = loop.create_future()
        self._pending[rid] = future
        try:
            self._send(sock, rid, message, fds)
            return await future
        finally:
            _close_all(fds)
            if self._pending.pop(rid, None) is not None:  # cancelled or failed before its answer came
                self._drop_queued(rid)

    def _release(self, pid: int) -> None:
        sock = self._sock
        if sock is not None and pid in self._agents:
            self._send(sock, 0, marshal.dumps((_helper.RELEASE, pid)), [])

    def _ensure(self, loop: asyncio.AbstractEventLoop) -> socket.socket:
        if self.broken:
            raise SpawnerLost(errno.ECHILD, "the spawner process could not be started")
        if self._sock is not None:
            if self._loop is loop:
                return self._sock
            self.close()  # left behind by an event loop that has ended (tests): start afresh on this one
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # A fixed argv, the interpreter running the daemon and a file of this package; no environment, no
            # site (-I -S): nothing of the daemon's environment reaches it, and it starts in a few ms.
            self._proc = subprocess.Popen(  # noqa: S603
                [
                    self._python,
                    "-I",
                    "-S",
                    str(_HELPER),
                    str(theirs.fileno()),
                    *(["end-with-parent"] if self.end_with_parent else []),
                ],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env={},
                close_fds=True,
            )
        except OSError as exc:
            ours.close()
            self.broken = True
            log.error("spawner_start_failed", error=str(exc))
            raise SpawnerLost(exc.errno or errno.ECHILD, f"the spawner process could not be started: {exc}") from exc
        finally:
            theirs.close()
        ours.setblocking(False)
        loop.add_reader(ours.fileno(), self._readable)
        self._sock, self._loop, self._answered = ours, loop, False
        log.debug("spawner_started", pid=self._proc.pid)
        return ours

    def _send(self, sock: socket.socket, rid: int, message: bytes, fds: list[int]) -> None:
        if not self._outbox:
            try:
                _sendmsg(sock, message, fds)
                return
            except BlockingIOError:
                pass
            except OSError as exc:  # the spawner is gone (EPIPE, ECONNRESET): every start in flight fails
                self._lost(f"send: {exc}")
                return
        # No room in the socket: keep copies of the descriptors (the caller may close its own) until it drains.
        self._outbox.append((rid, message, [os.dup(fd) for fd in fds]))
        if len(self._outbox) == 1:
            assert self._loop is not None
            self._loop.add_writer(sock.fileno(), self._drain)

    def _drain(self) -> None:
        sock = self._sock
        while sock is not None and self._outbox:
            _rid, message, fds = self._outbox[0]
            try:
                _sendmsg(sock, message, fds)
            except BlockingIOError:
                return
            except OSError as exc:
                self._lost(f"send: {exc}")
                return
            self._outbox.popleft()
            _close_all(fds)
        if sock is not None and self._loop is not None:
            self._loop.remove_writer(sock.fileno())

    def _drop_queued(self, rid: int) -> None:
        for entry in list(self._outbox):
            if entry[0] == rid:
                self._outbox.remove(entry)
                _close_all(entry[2])
        if not self._outbox and self._sock is not None and self._loop is not None:
            self._loop.remove_writer(self._sock.fileno())

    def _readable(self) -> None:
        buf = self._buf
        for _ in range(_READS_PER_CALLBACK):
            sock = self._sock
            if sock is None:
                return
            try:
                size, ancillary, _flags, _addr = sock.recvmsg_into([buf], _RECV_SPACE, socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._lost(f"recv: {exc}")
                return
            if not size:
                self._lost("it exited" if self._answered else "it exited before answering")
                return
            self._answered = True
            message = marshal.loads(memoryview(buf)[:size])  # noqa: S302 - our own helper, a private socket pair
            if ancillary:  # a large report: the whole tuple is in the memfd
                message = _read_memfd(ancillary)
            self._message(message)

    def _message(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind in (_helper.STARTED, _helper.FAILED):
            self._answer(message)
            return
        agent = self._agents.get(message[1])
        if agent is None:  # an agent whose start was cancelled, or one already reported
            return
        if kind == _helper.DONE:
            _kind, _pid, code, stdout, stderr_tail, over = message
            agent._set_output(stdout, stderr_tail, over)
            if code is not None:
                del self._agents[agent.pid]
                agent._set_exit(code)
        elif kind == _helper.EXITED:
            if agent.closed:
                del self._agents[agent.pid]
            agent.out_closed = agent.out_closed or message[3]
            agent._set_exit(message[2])
        elif kind == _helper.OVER:
            agent.over = True
            agent.wake()
        elif kind == _helper.OUT_EOF:
            agent.out_closed = True
            agent.wake()

    def _answer(self, message: tuple[Any, ...]) -> None:
        pending = self._pending.pop(message[1], None)
        if message[0] == _helper.STARTED:
            pid = message[2]
            agent = SpawnedAgent(pid, start_time_at(message[3]), self)
            self._agents[pid] = agent
            if pending is None or pending.done():
                # Its caller was cancelled meanwhile: nobody supervises this agent, so it goes at once.
                _kill_group(pid)
            else:
                pending.set_result(agent)
        elif pending is not None and not pending.done():
            pending.set_exception(OSError(message[2], message[3]))

    def _lost(self, why: str) -> None:
        """The spawner is gone: fail the starts in flight, kill the agents whose exit codes went with it."""
        broken = not self._answered
        killed = self._stop(f"the spawner process is gone ({why})", timeout=0.0)
        if killed or broken:
            log.error("spawner_lost", reason=why, agents_killed=killed)
        if broken:
            self.broken = True  # it died before answering once: do not start it again and again

    def _stop(self, why: str, timeout: float) -> int:
        """Kill the agents nobody will report on (their exit is SIGKILL), fail the starts in flight, close the
        socket (the spawner exits on EOF) and reap the spawner within ``timeout`` s; how many agents were killed.
        """
        agents, self._agents = self._agents, {}
        for pid, agent in agents.items():
            _kill_group(pid)
            agent._set_output(agent.stdout, agent.stderr_tail, agent.over)  # nothing more will be read
            agent._set_exit(-signal.SIGKILL)
        self._close_socket()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(SpawnerLost(errno.EPIPE, why))
        self._reap(timeout)
        return len(agents)

    def _close_socket(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(sock.fileno())
            self._loop.remove_writer(sock.fileno())
        for _rid, _message, fds in self._outbox:
            _close_all(fds)
        self._outbox.clear()
        sock.close()

    def _reap(self, timeout: float = 0.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self, timeout: float = 2.0) -> None:
        """Stop the spawner (it exits on EOF); agents still running are killed first, as nobody would watch them.

        Blocking for at most ``timeout`` s: call it at shutdown, once the agents are drained.
        """
        self._stop("the spawner was closed", timeout)


def _sendmsg(sock: socket.socket, message: bytes, fds: list[int]) -> None:
    if not fds:
        sock.send(message)
        return
    sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _read_memfd(ancillary: list[tuple[int, int, bytes]]) -> tuple[Any, ...]:
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    try:
        size = os.fstat(fds[0]).st_size
        message: tuple[Any, ...] = marshal.loads(os.pread(fds[0], size, 0))  # noqa: S302 - as in _readable
        return message
    finally:
        _close_all(list(fds))


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
