"""The spawner process: starts command agents for the daemon, reads their output, and reports how they ended.

Run as ``python -I -S spawner_helper.py FD`` by :class:`ambient.runners.spawner.Spawner`; standard library only, so
that it starts in a few milliseconds and imports nothing of the daemon. FD is its end of a ``SOCK_SEQPACKET``
socket pair. Every message is a ``marshal``-ed tuple (both ends run the same interpreter):

- daemon → spawner: ``(SPAWN, rid, argv, env, cwd, stdin, out_cap, err_tail)`` (bytes everywhere); a large
  request comes as ``(SPAWN, rid)`` with a memfd holding the tuple as ``SCM_RIGHTS``. ``(RELEASE, pid)``: stop
  reading that agent's output and report it now (the daemon gave up waiting for its pipes).
- spawner → daemon: ``(STARTED, rid, pid, boot_clock)`` (``CLOCK_BOOTTIME`` read just before the start) or
  ``(FAILED, rid, errno, message)``; then for that pid, as they happen, ``(OVER, pid)`` (stdout passed
  ``out_cap``: the rest is discarded), ``(EXITED, pid, code, out_eof)`` (the agent exited, something still
  holds its pipes; ``out_eof``: stdout is closed already), ``(OUT_EOF, pid)`` (stdout closed after that), and
  last ``(DONE, pid, code, stdout, stderr_tail, over)``: the agent exited and both pipes reached EOF, or the
  output was released (``code`` is None if it has not exited yet: an ``EXITED`` follows). A report over
  ``INLINE_MAX`` comes as ``(DONE, pid)`` with a memfd holding the tuple. A short-lived agent costs the daemon
  two messages.

The agent's stdin is a memfd holding the request's ``stdin`` (EOF where the packet ends, nothing to feed); its
stdout and stderr are pipes read here: the first ``out_cap`` bytes of stdout are kept, and the last ``err_tail``
bytes of stderr. An agent starts like ``subprocess.Popen(..., start_new_session=True, close_fds=True,
restore_signals=True)``: its own session, only descriptors 0-2 (everything else here is close-on-exec), default
dispositions for the standard signals (glibc's ``posix_spawn`` leaves its two internal ones, 32 and 33, ignored;
glibc programs install their own handlers for them when they need them), an empty signal mask, ``argv[0]``
looked up in the agent's own ``PATH`` when it has no slash. The spawner ignores the terminal's and the service
manager's stop signals: the daemon stops it by closing the socket, once its agents are gone, so that their exit
codes still reach it while it drains them. Killing agents (timeouts, output caps, shutdown) stays the daemon's
job: it signals their process groups itself. What escapes a group (a ``setsid()`` child, a double fork) is
reparented to the spawner, a child subreaper, which ends it once its agent has ended (``sweep``), and ends every
such stray when the daemon stops it.
"""

from __future__ import annotations

import array
import contextlib
import errno
import marshal
import os
import select
import selectors
import signal
import socket
import sys
import time
from typing import Any

# Requests and releases (daemon → spawner).
SPAWN, RELEASE = 0, 1
# Reports (spawner → daemon).
STARTED, FAILED, OVER, EXITED, OUT_EOF, DONE = 0, 1, 2, 3, 4, 5
#: Output larger than this travels in a memfd (a unix datagram is capped by the socket's buffer, ~200 KiB).
INLINE_MAX = 32 * 1024
_MAX_FDS = 4
_CMSG_SPACE = socket.CMSG_SPACE(_MAX_FDS * array.array("i").itemsize)
_MAX_MESSAGE = 1 << 16
_MAX_LARGE = 64 << 20
_CHUNK = 64 * 1024
_RECV_FLAGS = int(socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)  # an int once: enum flags cost ~4 us per |
_READS_PER_EVENT = 4  # then the other agents get their turn: a flood cannot starve them
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
            return os.posix_spawn(
                exe, argv, env, file_actions=actions, setsid=True, setsigmask=(), setsigdef=_DEFAULT_SIGNALS
            )
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR) and saved is None:
                saved = exc
            last = exc
    raise saved or last


def _spawn_confined(argv: list[bytes], env: dict[bytes, bytes], stdio: list[int], jail: dict[str, Any]) -> int:
    """Start one agent confined: fork, then in the child confine it under Landlock if asked (``read``/``write``/
    ``abi``, and ``connect``: the TCP ports it may reach; see ambient.runners.landlock), take the agent's own user
    if asked (``uid``/``gid``: the daemon runs as root; every capability dropped, see :func:`drop_privileges`), and
    exec. posix_spawn runs no code between the two, so this path forks (the spawner is small and single-threaded: a
    fork is safe) and waits for the exec, up to ``_EXEC_WAIT_MS``: until then every page either process writes is
    copied, and the spawner writes many as soon as it goes on (bench/fanout.py (b)). The agent's Landlock ruleset
    is built here, before the fork, while still the daemon's user (its read paths opened once and kept, see
    ``landlock.ruleset``): the child only applies it, and drops its user with the calls prepared here (once per
    user), so that it runs as few Python steps as it can between fork and exec (each touches pages the fork
    shares: bench/README.md). A confinement or exec that fails is said on the
    agent's stderr, and the agent exits 127, as a shell says a command it cannot run."""
    rules = -1
    problem: BaseException | None = None
    if jail.get("abi"):
        if _LANDLOCK not in sys.modules:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # noqa: PTH100, PTH120 - stdlib, -I -S
        import landlock  # type: ignore[import-not-found,unused-ignore]  # ambient/runners/landlock.py, a sibling

        try:
            rules = landlock.ruleset(jail["read"], jail["write"], jail["abi"], jail.get("connect"))
        except Exception as exc:  # noqa: BLE001 - said by the child on the agent's stderr, as before its exec
            problem = exc
    drop = _drop_for(jail["uid"], jail["gid"]) if "uid" in jail else None
    exes = _executables(argv[0], env)
    exec_r, exec_w = os.pipe2(os.O_CLOEXEC)  # its end closes when the child execs or exits
    try:
        pid = os.fork()
    except BaseException:
        for fd in (exec_r, exec_w, rules):
            if fd >= 0:
                os.close(fd)
        raise
    if pid:
        os.close(exec_w)
        if rules >= 0:
            os.close(rules)  # the child keeps its copy until its exec (close-on-exec)
        try:
            # Until the child has exec'd, each page this process writes is copied for the fork: waiting for the
            # exec saved ~0.4 ms of CPU per agent (bench/README.md). Bounded: an exec stuck on a hung filesystem
            # does not hold the next starts.
            gate = select.poll()  # not select(): the spawner may hold more than FD_SETSIZE descriptors
            gate.register(exec_r, select.POLLIN)
            gate.poll(_EXEC_WAIT_MS)
        finally:
            os.close(exec_r)
        return pid
    os.close(exec_r)
    # The child: nothing here may return into the spawner's loop.
    message = "confinement failed"
    try:
        os.setsid()
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
        for sig in _DEFAULT_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        if problem is not None:
            raise problem
        if rules >= 0:
            landlock.restrict(rules)
        if drop is not None:
            drop.apply()
            reach = jail.get("reach")
            if reach and not os.access(reach, os.X_OK):
                raise OSError(
                    errno.EACCES,
                    f"its user (uid {jail['uid']}) cannot reach the brain {reach.decode(errors='replace')}: give it "
                    "search permission on each folder above (chmod o+x, or setfacl -m u:USER:x), or name another "
                    "user in its runner (user:)",
                )
        last: OSError = OSError(errno.ENOENT, os.strerror(errno.ENOENT))
        for exe in exes:
            try:
                os.execve(exe, argv, env)  # noqa: S606 - the agent's argv, as posix_spawn takes it
            except OSError as exc:
                last = exc
                if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                    break
        message = f"cannot start {argv[0].decode(errors='replace')!r}: {last.strerror or last}"
    except OSError as exc:
        message = f"cannot confine the agent: {exc.strerror or exc}"
    except BaseException as exc:  # noqa: BLE001 - said on its stderr, then this child ends
        message = f"cannot confine the agent: {exc!r}"
    with contextlib.suppress(OSError):
        os.write(2, f"ambient: {message}\n".encode(errors="replace"))
    os._exit(127)


_LANDLOCK = "landlock"
_EXEC_WAIT_MS = 50

_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
#: SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP, SECBIT_NO_CAP_AMBIENT_RAISE and KEEP_CAPS off, each locked: uid 0 is
#: given no capability back, by exec or otherwise.
_SECUREBITS_ROOT_POWERLESS = 0b1110_1111
_CAPABILITY_VERSION_3 = 0x20080522


def drop_privileges(uid: int, gid: int) -> None:
    """Become ``uid``/``gid`` with no capability, none to gain again: no_new_privs (a setuid program gives
    nothing), the bounding and ambient sets emptied, then the user taken (groups first, while still allowed).
    ``uid`` 0 (a runner's ``user: root``, the person's choice) keeps root's files but no power of root: no
    module loading, clock, reboot, ptrace, ``chown``, reading others' files, and securebits locked so that no
    exec gives root's capabilities back. Raises OSError when any step fails (the agent then does not run)."""
    _Drop(uid, gid).apply()


class _Drop:
    """The steps of :func:`drop_privileges`, prepared (the C library, the capabilities this kernel has, each call's
    arguments) by the spawner before its fork, so that the child only makes the calls."""

    __slots__ = ("capset", "data", "gid", "header", "libc", "prctls", "uid")

    def __init__(self, uid: int, gid: int) -> None:
        import ctypes  # loaded already (_become_subreaper): the import costs nothing

        self.uid, self.gid = uid, gid
        self.libc = _c_library()
        calls = [(_PR_SET_NO_NEW_PRIVS, 1, 0), (_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0)]
        calls += [(_PR_CAPBSET_DROP, cap, 0) for cap in range(_last_cap() + 1)]
        if uid == 0:
            calls.append((_PR_SET_SECUREBITS, _SECUREBITS_ROOT_POWERLESS, 0))
        zero = ctypes.c_ulong(0)
        self.prctls = [(call, (*(ctypes.c_ulong(a) for a in call), zero, zero)) for call in calls]
        self.header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)  # struct __user_cap_header_struct
        self.data = (ctypes.c_uint32 * 6)()  # two of effective, permitted, inheritable: all zero

    def apply(self) -> None:
        import ctypes

        prctl = self.libc.prctl
        for call, args in self.prctls:
            if prctl(*args) != 0:
                code = ctypes.get_errno()
                raise OSError(code, f"prctl{call}: {os.strerror(code)}")
        os.setgroups([])
        os.setgid(self.gid)
        os.setuid(self.uid)
        if self.libc.capset(self.header, self.data) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"capset: {os.strerror(code)}")


_CACHED: dict[str, Any] = {}
_DROPS: dict[tuple[int, int], _Drop] = {}


def _drop_for(uid: int, gid: int) -> _Drop:
    """The prepared drop to ``uid``/``gid``, made once per pair (~45 calls' arguments: built at every start before)."""
    drop = _DROPS.get((uid, gid))
    if drop is None:
        drop = _DROPS[(uid, gid)] = _Drop(uid, gid)
    return drop


def _c_library() -> Any:
    """The C library, loaded once per process (``CDLL(None)``: the running program's own symbols)."""
    if "libc" not in _CACHED:
        import ctypes

        _CACHED["libc"] = ctypes.CDLL(None, use_errno=True)
    return _CACHED["libc"]


def _last_cap() -> int:
    """The highest capability this kernel knows, read once."""
    if "last_cap" not in _CACHED:
        with open("/proc/sys/kernel/cap_last_cap", "rb") as f:  # noqa: PTH123 - stdlib only
            _CACHED["last_cap"] = int(f.read())
    last: int = _CACHED["last_cap"]
    return last


def read_some(fd: int) -> bytes | None:
    """One read of an agent's pipe: None when it would block, b"" at EOF (a failed read counts as EOF)."""
    try:
        return os.read(fd, _CHUNK)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


def keep_output(out: bytearray, err: bytearray, data: bytes, from_err: bool, out_cap: int, err_tail: int) -> bool:
    """Keep what the caps allow of ``data``, read from an agent's stderr or stdout: the last ``err_tail`` bytes of
    stderr, the first ``out_cap`` of stdout. False when stdout would pass its cap: ``data`` is dropped, and the
    caller drops what comes after it too. The one rule of both readers: the spawner's and the runner's own.
    """
    if from_err:
        err += data
        if len(err) > err_tail:
            del err[: len(err) - err_tail]
        return True
    if len(out) + len(data) > out_cap:
        return False
    out += data
    return True


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


class _DaemonGone(Exception):
    """The daemon died with requests still queued: start none of them, exit."""


class _Agent:
    """One running agent: its pidfd, its output pipes (-1 once at EOF) and what was read from them."""

    __slots__ = ("code", "err", "err_buf", "out", "out_buf", "out_cap", "over", "pid", "pidfd", "released", "tail")

    def __init__(self, pid: int, pidfd: int, out: int, err: int, out_cap: int, tail: int) -> None:
        self.pid, self.pidfd, self.out, self.err = pid, pidfd, out, err
        self.out_cap, self.tail = out_cap, tail
        self.out_buf = bytearray()
        self.err_buf = bytearray()
        self.over = False
        self.released = False
        self.code: int | None = None


_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_DUMPABLE = 4
_SWEEP_S = 1.0  # how often strays are looked for (an agent's end looks at once)


def _become_subreaper() -> bool:
    """Descendants an agent orphans (a ``setsid()`` child, a double fork) are reparented to us, not to init, so we
    can end them with their agent. Also not dumpable, as the daemon: our memory holds every
    agent's request (its channel token), closed so to an agent of our own user. Linux only; False where it
    cannot be."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _children() -> list[int]:
    """Our children now (the kernel's list; empty where it does not keep one)."""
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children", "rb") as f:  # noqa: PTH123 - one read, stdlib only
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _agent_key(pid: int) -> bytes | None:
    """The AMBIENT_KEY a process inherited from its agent (None: unreadable or none)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:  # noqa: PTH123 - stdlib only
            env = f.read()
    except OSError:
        return None
    for entry in env.split(b"\0"):
        if entry.startswith(b"AMBIENT_KEY="):
            return entry[len(b"AMBIENT_KEY=") :]
    return None


class _Spawner:
    def __init__(self, sock: socket.socket, *, end_with_parent: bool = False) -> None:
        self.sock = sock
        self.end_with_parent = end_with_parent  # the parent's death ends every agent (a worker's spawner)
        self.selector = selectors.DefaultSelector()
        self.selector.register(sock, selectors.EVENT_READ, None)
        self.cwd = os.getcwdb()  # noqa: PTH109 - bytes, compared with the requests' cwd
        self.agents: dict[int, _Agent] = {}
        self.daemon = os.getppid()
        self.hangup = select.poll()
        self.hangup.register(sock, 0)  # POLLHUP and POLLERR are always reported
        self.keys: dict[int, bytes] = {}  # live agent pid → its AMBIENT_KEY (inherited by all it starts)
        self.subreaper = _become_subreaper()
        self.swept = time.monotonic()

    def daemon_gone(self) -> bool:
        """Whether the daemon that asked for agents has closed its end or died.

        Requests it queued before it died are still in the socket: starting them would run agents that no
        journal knows of, beside the ones its successor starts for the same items. POLLHUP is set
        as soon as the daemon's end closes, queued data or not; the parent check catches a daemon that died
        while the socket was passed on.
        """
        return bool(self.hangup.poll(0)) or os.getppid() != self.daemon

    def serve(self) -> None:
        try:
            while True:
                for key, _ in self.selector.select(_SWEEP_S if self.subreaper else None):
                    if key.data is None:
                        if not self._requests():
                            return
                        continue
                    agent, what = key.data
                    if what == 0:
                        self._reap(agent)
                    else:
                        self._read(agent, key.fd)
                if self.subreaper and time.monotonic() - self.swept >= _SWEEP_S:
                    self.sweep()
        finally:
            if self.end_with_parent:  # a stop comes after every agent ended; a death closes the socket first
                self.end_agents()  # (its files close before it is reparented: getppid() may not show it yet)
            if self.subreaper and (os.getppid() == self.daemon or self.end_with_parent):
                self.sweep(everything=True)  # a stop, not the daemon's death: nothing stays

    def end_agents(self) -> None:
        """SIGKILL every live agent's process group: its parent died, and another holder will run its item."""
        for pid in list(self.agents):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)

    def sweep(self, *, everything: bool = False) -> None:
        """End the strays: processes an agent left behind (reparented to us) whose agent has ended, or all of
        them when the daemon stops. They are killed with their process group (a ``setsid()`` child leads one)
        and reaped. Strays of an agent still running are its own business until it ends. A daemon that dies
        leaves them running, like its agents: the next start stops them (ambient.runners.orphans)."""
        self.swept = time.monotonic()
        live = set(self.keys.values())
        for pid in _children():
            if pid in self.agents:
                continue
            key = None if everything else _agent_key(pid)
            if key is None or key not in live:
                with contextlib.suppress(OSError):
                    group = os.getpgid(pid)
                    if group not in (os.getpgrp(), 0, 1):
                        os.killpg(group, signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)  # a zombie now or at a later sweep

    def _requests(self) -> bool:
        """Handle every request waiting; False once the daemon has closed its end."""
        while True:
            try:
                data, ancillary, _flags, _addr = self.sock.recvmsg(_MAX_MESSAGE, _CMSG_SPACE, _RECV_FLAGS)
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
            except _DaemonGone:
                return False
            finally:
                for fd in fds:
                    os.close(fd)

    def _request(self, data: bytes, fds: list[int]) -> None:
        request: Any = marshal.loads(data)  # noqa: S302 - from the daemon that started us, over a private pair
        if request[0] == SPAWN and self.daemon_gone():
            raise _DaemonGone
        if request[0] == RELEASE:
            agent = self.agents.get(request[1])
            if agent is not None and not agent.released:
                self._done(agent)
            return
        rid = request[1]
        try:
            if len(request) == 2:  # a large request: the tuple is in the memfd
                size = os.fstat(fds[0]).st_size
                if size > _MAX_LARGE:
                    raise ValueError(f"request of {size} bytes")
                request = marshal.loads(os.pread(fds[0], size, 0))  # noqa: S302 - as above
            _op, _rid, argv, env, cwd, stdin, out_cap, tail, *more = request
            if cwd != self.cwd:
                os.chdir(cwd)
                self.cwd = cwd
            self._start(rid, argv, env, stdin, out_cap, tail, more[0] if more else None)
        except _DaemonGone:
            raise
        except OSError as exc:
            self._send((FAILED, rid, exc.errno or errno.EIO, exc.strerror or str(exc)))
        except Exception as exc:  # noqa: BLE001 - a bad request fails that agent, not the spawner
            self._send((FAILED, rid, errno.EINVAL, f"bad spawn request: {exc!r}"))

    def _start(
        self,
        rid: int,
        argv: list[bytes],
        env: dict[bytes, bytes],
        stdin: bytes,
        out_cap: int,
        tail: int,
        confine: Any = None,
    ) -> None:
        mine: list[int] = []  # our ends, closed if the start fails
        theirs: list[int] = []  # the agent's ends, closed once it has its own copies
        try:
            theirs.append(_memfd("ambient-spawn-packet", stdin))
            for _ in range(2):
                r, w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
                os.set_blocking(w, True)  # the agent's end blocks as a pipe normally does
                mine.append(r)
                theirs.append(w)
            started = time.clock_gettime(time.CLOCK_BOOTTIME)  # the frame of /proc's start times
            if self.daemon_gone():  # checked again right before the start: the pipes took time
                raise _DaemonGone
            pid = _spawn(argv, env, theirs) if confine is None else _spawn_confined(argv, env, theirs, confine)
        except BaseException:
            for fd in mine:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        try:
            pidfd = os.pidfd_open(pid)  # our unreaped child: valid even if it has exited already
        except OSError:  # cannot watch it (a kernel before 5.3): it must not run unwatched
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            for fd in mine:
                os.close(fd)
            raise
        agent = _Agent(pid, pidfd, mine[0], mine[1], out_cap, tail)
        self.agents[pid] = agent
        self.keys[pid] = env.get(b"AMBIENT_KEY", b"%d" % pid)
        self._send((STARTED, rid, pid, started))
        self.selector.register(pidfd, selectors.EVENT_READ, (agent, 0))
        self.selector.register(mine[0], selectors.EVENT_READ, (agent, 1))
        self.selector.register(mine[1], selectors.EVENT_READ, (agent, 2))

    def _read(self, agent: _Agent, fd: int) -> None:
        for _ in range(_READS_PER_EVENT):
            data = read_some(fd)
            if data is None:
                return
            if not data:
                self._eof(agent, fd)
                return
            if (fd == agent.err or not agent.over) and not keep_output(
                agent.out_buf, agent.err_buf, data, fd == agent.err, agent.out_cap, agent.tail
            ):
                agent.over = True
                self._send((OVER, agent.pid))

    def _eof(self, agent: _Agent, fd: int) -> None:
        self._close_pipe(fd)
        if fd == agent.out:
            agent.out = -1
            if agent.code is not None and agent.err >= 0:
                self._send((OUT_EOF, agent.pid))
        else:
            agent.err = -1
        if agent.out < 0 and agent.err < 0 and agent.code is not None:
            self._done(agent)

    def _reap(self, agent: _Agent) -> None:
        try:
            done, status = os.waitpid(agent.pid, os.WNOHANG)
        except ChildProcessError:
            done, status = agent.pid, 255 << 8
        if done == 0:
            return
        self.selector.unregister(agent.pidfd)
        os.close(agent.pidfd)
        self.keys.pop(agent.pid, None)
        self._exited(agent, os.waitstatus_to_exitcode(status))
        if self.subreaper:
            self.sweep()  # what it left behind goes with it

    def _exited(self, agent: _Agent, code: int) -> None:
        agent.code = code
        if agent.out < 0 and agent.err < 0 and not agent.released:
            self._done(agent)
            return
        if agent.released:  # its output was reported already: this is the last word on it
            del self.agents[agent.pid]
        self._send((EXITED, agent.pid, code, agent.out < 0))

    def _done(self, agent: _Agent) -> None:
        """The final report: what was read, and the exit code if the agent has exited (then it is forgotten)."""
        for fd in (agent.out, agent.err):
            if fd >= 0:
                self._close_pipe(fd)
        agent.out = agent.err = -1
        agent.released = True
        if agent.code is not None:
            del self.agents[agent.pid]
        report = marshal.dumps((DONE, agent.pid, agent.code, bytes(agent.out_buf), bytes(agent.err_buf), agent.over))
        if len(report) <= INLINE_MAX:
            self.sock.send(report)
            return
        fd = _memfd("ambient-agent-output", report)  # a large report: the tuple travels in a memfd
        try:
            self.sock.sendmsg(
                [marshal.dumps((DONE, agent.pid))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
            )
        finally:
            os.close(fd)

    def _close_pipe(self, fd: int) -> None:
        self.selector.unregister(fd)
        os.close(fd)

    def _send(self, message: tuple[Any, ...]) -> None:
        # Blocking: if the daemon is slow to read, the spawner waits for it (it never waits on the spawner).
        self.sock.send(marshal.dumps(message))


def main(argv: list[str]) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    sock = socket.socket(fileno=int(argv[1]))
    os.set_inheritable(sock.fileno(), False)
    with contextlib.suppress(BrokenPipeError):  # the daemon is gone
        _Spawner(sock, end_with_parent=argv[2:3] == ["end-with-parent"]).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
