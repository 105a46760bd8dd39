"""The spawner process: starts command agents for the daemon and tells it when they exit.

Run as ``python -I -S spawner_helper.py FD`` by :class:`ambient.runners.spawner.Spawner`; standard library only, so
that it starts in a few milliseconds and imports nothing of the daemon. FD is its end of a ``SOCK_SEQPACKET``
socket pair. Every message is a ``marshal``-ed tuple (both ends run the same interpreter):

- daemon → spawner: ``(rid, argv, env, cwd)`` (bytes everywhere) with the agent's stdin, stdout and stderr as
  ``SCM_RIGHTS``; a large request comes as ``(rid,)`` with a fourth descriptor, a memfd holding the tuple.
- spawner → daemon: ``(STARTED, rid, pid)``, ``(FAILED, rid, errno, message)``, ``(EXITED, pid, exit_code)``.

An agent starts like ``subprocess.Popen(..., start_new_session=True, close_fds=True, restore_signals=True)``:
its own session, only descriptors 0-2 (everything else here is close-on-exec), default dispositions for the
standard signals (glibc's ``posix_spawn`` leaves its two internal ones, 32 and 33, ignored; glibc programs
install their own handlers for them when they need them), an empty signal mask, ``argv[0]`` looked up in the
agent's own ``PATH`` when it has no slash. The spawner ignores the terminal's and the service manager's stop
signals: the daemon stops it by closing the socket, once its agents are gone, so that their exit codes still
reach it while it drains them.
"""

from __future__ import annotations

import array
import contextlib
import errno
import marshal
import os
import selectors
import signal
import socket
import sys
from typing import Any

STARTED, FAILED, EXITED = 0, 1, 2
_MAX_FDS = 4
_CMSG_SPACE = socket.CMSG_SPACE(_MAX_FDS * array.array("i").itemsize)
_MAX_MESSAGE = 1 << 16
_MAX_LARGE = 64 << 20
# Reset in every agent: ignored here (the stop signals) or by Python at start-up (SIGPIPE, SIGXFSZ).
_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def _executables(file: bytes, env: dict[bytes, bytes]) -> list[bytes]:
    """Where ``argv[0]`` may be: itself when it has a slash, else each directory of the agent's ``PATH``."""
    if b"/" in file:
        return [file]
    path = env.get(b"PATH", os.defpath.encode())
    return [os.path.join(d, file) for d in path.split(b":")]  # noqa: PTH118 - bytes, as exec takes them


def _spawn(argv: list[bytes], env: dict[bytes, bytes], stdio: list[int]) -> int:
    """Start one agent; its pid. Raises OSError as exec would (the first telling error of a PATH search)."""
    actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(stdio)]
    saved: OSError | None = None
    last = OSError(errno.ENOENT, os.strerror(errno.ENOENT))
    for exe in _executables(argv[0], env):
        try:
            return os.posix_spawn(exe, argv, env, file_actions=actions, setsid=True, setsigmask=(),
                                  setsigdef=_DEFAULT_SIGNALS)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR) and saved is None:
                saved = exc
            last = exc
    raise saved or last


class _Spawner:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.selector = selectors.DefaultSelector()
        self.selector.register(sock, selectors.EVENT_READ, None)
        self.cwd = os.getcwdb()  # noqa: PTH109 - bytes, compared with the requests' cwd

    def serve(self) -> None:
        while True:
            for key, _ in self.selector.select():
                if key.data is None:
                    if not self._requests():
                        return
                else:
                    self._reap(key.fileobj, key.data)  # type: ignore[arg-type]

    def _requests(self) -> bool:
        """Handle every request waiting; False once the daemon has closed its end."""
        while True:
            try:
                data, ancillary, _flags, _addr = self.sock.recvmsg(
                    _MAX_MESSAGE, _CMSG_SPACE, socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                return True
            except ConnectionError:
                return False
            if not data:
                return False
            fds = array.array("i")
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
            try:
                self._request(data, list(fds))
            finally:
                for fd in fds:
                    os.close(fd)

    def _request(self, data: bytes, fds: list[int]) -> None:
        request: Any = marshal.loads(data)  # noqa: S302 - from the daemon that started us, over a private pair
        rid = request[0]
        try:
            if len(request) == 1:  # a large request: the tuple is in the memfd after the three stdio fds
                size = os.fstat(fds[3]).st_size
                if size > _MAX_LARGE:
                    raise ValueError(f"request of {size} bytes")
                request = marshal.loads(os.pread(fds[3], size, 0))  # noqa: S302 - as above
            _rid, argv, env, cwd = request
            if cwd != self.cwd:
                os.chdir(cwd)
                self.cwd = cwd
            pid = _spawn(argv, env, fds[:3])
        except OSError as exc:
            self._send((FAILED, rid, exc.errno or errno.EIO, exc.strerror or str(exc)))
            return
        except Exception as exc:  # noqa: BLE001 - a bad request fails that agent, not the spawner
            self._send((FAILED, rid, errno.EINVAL, f"bad spawn request: {exc!r}"))
            return
        try:
            pidfd = os.pidfd_open(pid)  # our unreaped child: valid even if it has exited already
        except OSError:
            os.waitpid(pid, 0)  # cannot watch it: wait for it here rather than lose its exit code
            self._send((STARTED, rid, pid))
            self._send((EXITED, pid, 255))
            return
        self.selector.register(pidfd, selectors.EVENT_READ, pid)
        self._send((STARTED, rid, pid))

    def _reap(self, pidfd: int, pid: int) -> None:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 255 << 8
        if done == 0:
            return
        self.selector.unregister(pidfd)
        os.close(pidfd)
        self._send((EXITED, pid, os.waitstatus_to_exitcode(status)))

    def _send(self, message: tuple[Any, ...]) -> None:
        # Blocking: if the daemon is slow to read, the spawner waits for it (it never waits on the spawner).
        self.sock.send(marshal.dumps(message))


def main(argv: list[str]) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    sock = socket.socket(fileno=int(argv[1]))
    os.set_inheritable(sock.fileno(), False)
    with contextlib.suppress(BrokenPipeError):  # the daemon is gone
        _Spawner(sock).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
