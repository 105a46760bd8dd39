"""The command runner: an agent is a program run from an argv list, never through a shell (S-07).

It owns the process group of every agent it starts: stdin gets the SPAWN packet, stdout is read in bounded chunks
under a cap, stderr is kept as a bounded tail, a timeout, a cap overrun, a shutdown or a cancellation kill the whole
group (SIGTERM, grace, SIGKILL), and the agent is always reaped. The environment is explicit and minimal (S-06).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from ambient.core.errors import InputError
from ambient.core.health import describe, resource_of
from ambient.core.process import start_time_now
from ambient.runners import confinement
from ambient.runners.base import (
    MAX_ENV_PACKET_BYTES,
    MAX_PACKET_BYTES,
    AgentResult,
    AnyRunnerConfig,
    CommandRunnerConfig,
    Reason,
    RunRequest,
    TemplateError,
    error_result,
    interpret_output,
    render_argv,
)
from ambient.runners.spawner import SpawnedAgent, Spawner, SpawnerLost
from ambient.runners.spawner_helper import keep_output, read_some
from ambient.runners.waiter import Waiter
from ambient.storage.fsutil import resolve_in_brain, write_all

log = structlog.get_logger(__name__)

#: Variables taken from the daemon's own environment; nothing else of ``os.environ`` reaches an agent (S-06).
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ")
#: After the agent exits, how long its stdout may stay open (a leftover child holding the pipe) before the group
#: is killed so that the result can be read.
_LINGER_S = 0.5
#: After the group is dead, how long the pipes may take to reach EOF (only a process that left the group with
#: setsid() can hold them longer; it is then abandoned and logged).
_DRAIN_S = 2.0
#: How long to wait for the kernel to let a SIGKILLed leader be reaped.
_REAP_S = 10.0
_POLL_S = 0.02
#: How long to wait for SIGKILLed members to be gone.
_KILL_WAIT_S = 5.0
_REDACTED = "[REDACTED:channel-token]"

#: ``on_spawn(req, pid, start_time)``: ``start_time`` is the agent's start (epoch s, from /proc) when known.
SpawnHook = Callable[[RunRequest, int, float | None], None]


class _Proc(Protocol):
    """What the runner needs of an agent's process: asyncio's ``Process``, or :class:`_Child`."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


class _Output(Protocol):
    """An agent's stdout and stderr being read: by the runner (:class:`_Pipes`) or by the spawner
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


# ---------------------------------------------------------------------------------------------------------------
# Process groups


def use_pidfd_watcher() -> bool:
    """On Python 3.11, have asyncio wait for its subprocesses through pidfds instead of one thread per child.

    3.11's default child watcher starts a thread per child process; starting it needs a GIL hand-off with a
    busy event loop. Agents are waited for through pidfds by the runner itself (:class:`_Child`); this serves
    the daemon's other asyncio subprocesses (git) and agents where the runner falls back to asyncio.
    3.12 and later pick pidfds by themselves (and deprecate watchers), so this does nothing there. Call it
    before the event loop starts; False when pidfds are not available (old kernel, other OS).
    """
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        asyncio.set_child_watcher(asyncio.PidfdChildWatcher())
    return True


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False if the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member changed uid (setuid program); the others were still signalled
        return True
    return True


def group_alive(pgid: int) -> bool:
    """True while process group ``pgid`` has a member that is not a zombie.

    ``killpg(pgid, 0)`` alone is not enough: a killed grandchild reparented to a PID 1 that does not reap stays a
    zombie in the group forever, and zombies cannot be killed twice.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs: trust killpg
        return True
    for name in entries:
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        # fields: state, ppid, pgrp, ... (proc(5))
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


async def terminate_group(pgid: int, *, grace: float, leader: _Proc | None = None) -> bool:
    """SIGTERM (and SIGCONT, for a stopped agent) the group, wait up to ``grace`` s, then SIGKILL what is left.

    Returns True when SIGKILL was needed. When ``leader`` is given (our child), it is waited for first, then the
    rest of the group is polled.
    """
    if not group_alive(pgid):
        return False
    signal_group(pgid, signal.SIGTERM)
    signal_group(pgid, signal.SIGCONT)
    deadline = time.monotonic() + grace
    if leader is not None and leader.returncode is None:
        waiter = asyncio.ensure_future(leader.wait())
        try:
            await asyncio.wait({waiter}, timeout=grace)
        finally:
            if not waiter.done():
                waiter.cancel()
    # Grandchildren are not our children: no event tells when they die, so their group is polled.
    while group_alive(pgid) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(_POLL_S)
    if not group_alive(pgid):
        return False
    signal_group(pgid, signal.SIGKILL)
    # SIGKILL is delivered asynchronously: wait (bounded) until the kernel has really ended every member, so that
    # "run() returned" means "nothing of the agent runs any more" (a process in uninterruptible I/O may lag).
    deadline = time.monotonic() + _KILL_WAIT_S
    while group_alive(pgid) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(_POLL_S / 4)
    if group_alive(pgid):
        log.error("agent_group_survived_sigkill", pgid=pgid)
    return True


# ---------------------------------------------------------------------------------------------------------------
# Request → process inputs


def build_env(req: RunRequest, cfg: CommandRunnerConfig, packet_json: str) -> dict[str, str]:
    """The explicit environment of an agent: a few inherited basics, ``cfg.env``, then the AMBIENT_* channel.

    Never NOTIFY_SOCKET, WATCHDOG_*, CREDENTIALS_DIRECTORY or anything else of the daemon's environment (S-06).
    """
    env = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
    env.setdefault("PATH", os.defpath)
    env.setdefault("LANG", "C.UTF-8")
    env.update(cfg.env)  # validated: cannot name AMBIENT_*, NOTIFY_SOCKET, WATCHDOG_*, LISTEN_*, LD_*
    env.update(
        AMBIENT_AGENT=req.agent,
        AMBIENT_RUN_ID=req.run_id,
        AMBIENT_ITEM=req.item,
        AMBIENT_ATTEMPT=str(req.attempt),
        AMBIENT_KEY=req.key,
        AMBIENT_BRAIN=str(req.brain),
        AMBIENT_CHANNEL_TOKEN=req.channel_token,
    )
    if len(packet_json.encode()) <= MAX_ENV_PACKET_BYTES:
        env["AMBIENT_PACKET"] = packet_json
    handoff = req.bounded_handoff()
    if handoff:
        env["AMBIENT_HANDOFF"] = handoff
    for name, value in env.items():
        if "\x00" in value:
            msg = f"environment value {name} contains a NUL byte"
            raise TemplateError(msg)
    return env


def encode_packet(packet: Any) -> str:
    """The SPAWN packet as compact JSON text; raises TemplateError when not JSON-ready or too large."""
    try:
        text = json.dumps(packet, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        msg = f"SPAWN packet is not JSON-serialisable: {exc}"
        raise TemplateError(msg) from None
    if len(text.encode()) > MAX_PACKET_BYTES:
        msg = f"SPAWN packet is over {MAX_PACKET_BYTES} bytes"
        raise TemplateError(msg)
    return text


def _cwd(req: RunRequest, cfg: CommandRunnerConfig) -> Path:
    if cfg.cwd is None:
        return req.brain
    if cfg.cwd.startswith("/"):
        return Path(cfg.cwd)
    return resolve_in_brain(req.brain, cfg.cwd)


# ---------------------------------------------------------------------------------------------------------------
# Stdio. asyncio's own PIPEs make Process.wait() wait for every pipe to close too (3.11), so a leftover child
# holding stdout, or a paused reader, would hide the leader's exit. The runner owns its pipes instead.


def _packet_fd(data: bytes) -> int:
    """A readable fd positioned at 0 holding ``data``: the agent's stdin (a memfd; an unlinked temp file elsewhere).

    A file rather than a pipe: nothing to feed, nothing to block on, and EOF is where the packet ends.
    """
    try:
        fd = os.memfd_create("ambient-spawn-packet", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        fd, path = tempfile.mkstemp(prefix="ambient-packet-")
        Path(path).unlink()
    try:
        write_all(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Pipes(Waiter):
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


def _on_exit(proc: _Proc, callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` when ``proc`` has exited (its returncode is set); returns the undo."""
    if isinstance(proc, (_Child, SpawnedAgent)):
        proc.on_exit = callback
        return functools.partial(setattr, proc, "on_exit", None)
    waiting = asyncio.ensure_future(proc.wait())  # asyncio's subprocess (no pidfd here): rare path
    waiting.add_done_callback(lambda _: callback())

    def undo() -> None:
        waiting.cancel()

    return undo


def _close_transport(proc: _Proc) -> None:
    # asyncio.subprocess.Process has no public close(); closing its transport avoids "unclosed transport"
    # ResourceWarnings. The runner only calls this once the leader has exited, so nothing is killed here.
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()


# ---------------------------------------------------------------------------------------------------------------
# Starting agents


def waits_by_pidfd() -> bool:
    """Whether agents are started by ``subprocess.Popen`` and waited for through a pidfd (Linux 5.3+).

    Elsewhere they start through asyncio's subprocesses (one child watcher per agent).
    """
    return hasattr(os, "pidfd_open")


class _Child:
    """An agent started by ``subprocess.Popen`` on the loop, waited for through a pidfd (when there is no spawner).

    Performance (bench/fanout.py (b)): ``fork_exec`` vforks, so the loop waits until the child has exec'd (~0.26
    ms of a ~0.5 ms start in a busy fan-out). Starting agents in threads was measured slower: each start became
    GIL hand-offs with the busy loop, starts took ~5 ms and queued ~30 ms behind each other, and a fan-out ran
    310-330 agents/s against 410-480 started on the loop. The spawner process (:mod:`ambient.runners.spawner`)
    takes the wait off the loop without a thread.
    """

    def __init__(self, popen: subprocess.Popen[Any], pidfd: int, start_time: float | None = None) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.start_time = start_time
        self.returncode: int | None = None
        self.on_exit: Callable[[], None] | None = None
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        self._pidfd = pidfd  # of our unreaped child: valid even if it has exited already
        self._loop.add_reader(pidfd, self._reap)

    def _reap(self) -> None:
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped by someone else (a foreign waitpid(-1)): the status is lost
            pid, code = self.pid, 255
        else:
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
        self.returncode = self._popen.returncode = code  # Popen's own finaliser then stays quiet
        self._loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._exited.set_result(code)
        if self.on_exit is not None:
            self.on_exit()

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


class _StdinError(OSError):
    """The SPAWN packet could not be put where the agent reads its stdin."""


class _SetupError(Exception):
    """The request's ``before_start`` job failed: the agent was not started."""


@contextlib.contextmanager
def _child_stdio(packet: bytes) -> Iterator[tuple[int, int, int, int, int]]:
    """The agent's stdio: (stdin holding the packet, stdout writer, stderr writer, stdout reader, stderr reader).

    The readers are non-blocking (the agent's ends stay blocking). The child's ends are closed on leaving (the
    child holds its own copies); the readers too if starting failed.
    """
    try:
        stdin_fd = _packet_fd(packet)
    except OSError as exc:
        raise _StdinError(exc.errno, f"cannot prepare the packet for stdin: {exc}") from exc
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


def _before_start(req: RunRequest) -> None:
    if req.before_start is not None:
        try:
            req.before_start()
        except Exception as exc:
            raise _SetupError(str(exc)) from exc


async def _start(
    req: RunRequest,
    argv: list[str],
    packet: bytes,
    env: dict[str, str],
    cwd: Path,
    cfg: CommandRunnerConfig,
    spawner: Spawner | None = None,
) -> tuple[_Proc, _Output]:
    """Start an agent in its own session (its group can be killed whole): (process, its output being read).

    Through ``spawner`` when there is one (not given up on), within ``cfg.timeout_s``; it then reads the output
    itself. Raises OSError if it cannot start (:class:`_StdinError` when its stdin could not be made),
    :class:`_SetupError` when ``req.before_start`` failed (the agent is then not started).
    """
    _before_start(req)
    if spawner is not None and not spawner.broken:
        jail = {**_user(cfg, env), **(_confinement(req, cfg, argv, env) or {})}
        if "uid" in jail and env.get("TMPDIR"):
            os.chown(env["TMPDIR"], jail["uid"], jail["gid"])  # its private temp dir is its own
        try:
            async with asyncio.timeout(cfg.timeout_s):
                agent = await spawner.spawn(
                    argv, env, cwd, packet, cfg.max_output_bytes, cfg.stderr_tail_bytes, jail or None
                )
        except TimeoutError:
            msg = f"not started within {cfg.timeout_s:g} s (the spawner is stuck)"
            raise OSError(errno.ETIMEDOUT, msg) from None
        except SpawnerLost:
            if not spawner.broken:
                raise
            # The spawner never came up (it never answered): this agent and the next ones start through Popen.
        else:
            return agent, agent
    if cfg.user is not None:
        raise OSError(errno.EPERM, f"cannot run the agent as {cfg.user!r}: that needs ambient's spawner (Linux)")
    if not waits_by_pidfd():
        with _child_stdio(packet) as (stdin_fd, out_w, err_w, out_r, err_r):
            # S603 reviewed: as in _spawn.
            proc: _Proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=stdin_fd,
                stdout=out_w,
                stderr=err_w,
                env=env,
                cwd=cwd,
                start_new_session=True,
                close_fds=True,
            )
    else:
        proc, out_r, err_r = _spawn(argv, packet, env, cwd)
    try:
        return proc, _Pipes(out_r, err_r, cfg.max_output_bytes, cfg.stderr_tail_bytes)
    except BaseException:
        signal_group(proc.pid, signal.SIGKILL)
        raise


def _user(cfg: CommandRunnerConfig, env: dict[str, str]) -> dict[str, Any]:
    """The uid and gid of ``cfg.user`` (and its HOME and USER in ``env``); nothing when none is asked. OSError
    when it cannot be: no such user, or ambient is not root (only root can start a process as another user)."""
    if cfg.user is None:
        return {}
    import pwd

    try:
        entry = pwd.getpwnam(cfg.user)
    except KeyError:
        raise OSError(errno.EINVAL, f"no Unix user {cfg.user!r} (ambient.runner.user)") from None
    if entry.pw_uid != os.geteuid() and os.geteuid() != 0:
        raise OSError(errno.EPERM, f"cannot run the agent as {cfg.user!r}: ambient is not root")
    env["HOME"], env["USER"], env["LOGNAME"] = entry.pw_dir, entry.pw_name, entry.pw_name
    return {"uid": entry.pw_uid, "gid": entry.pw_gid}


#: How the spawner's child says a confined agent could not be started (runners/spawner_helper.py).
_NOT_STARTED = 127
_NOT_STARTED_SAYS = ("ambient: cannot start ", "ambient: cannot confine ")


def _confinement(
    req: RunRequest, cfg: CommandRunnerConfig, argv: list[str], env: dict[str, str]
) -> dict[str, Any] | None:
    """The Landlock paths of this agent (None: it runs unconfined: ``confine: false``, or no Landlock here).

    Its private temp dir is made here and named in its environment (TMPDIR); it is removed with the agent's
    process group at the end (:func:`_drop_tmp`)."""
    version = landlock_abi()
    if not cfg.confine or version <= 0:
        return None
    tmp = Path(tempfile.mkdtemp(prefix=f"ambient-{req.agent[:32]}-"))
    env["TMPDIR"] = env["TMP"] = env["TEMP"] = str(tmp)
    scope = req.packet.get("scope") if isinstance(req.packet, dict) else None
    files = [str(f) for f in (scope or {}).get("files") or [] if isinstance(f, str)]
    return confinement.policy(req.brain, files, tmp, argv[0]).as_request(version)


def _drop_tmp(env: dict[str, str]) -> None:
    """The private temp dir a confined agent had (nothing else reads it)."""
    tmp = env.get("TMPDIR", "")
    if tmp and Path(tmp).name.startswith("ambient-") and Path(tmp).parent == Path(tempfile.gettempdir()):
        shutil.rmtree(tmp, ignore_errors=True)


@functools.cache
def landlock_abi() -> int:
    """Landlock's ABI on this kernel (0: agents cannot be confined here), asked once."""
    from ambient.runners import landlock

    return landlock.abi()


def _spawn(argv: list[str], packet: bytes, env: dict[str, str], cwd: Path) -> tuple[_Child, int, int]:
    """Start an agent with ``Popen`` on the loop: it waits until the child has exec'd (vfork; see :class:`_Child`)."""
    started = start_time_now()
    with _child_stdio(packet) as (stdin_fd, out_w, err_w, out_r, err_r):
        # An argv list from a validated config, each template value one element; no shell (S-07).
        popen = subprocess.Popen(  # noqa: S603
            argv,
            stdin=stdin_fd,
            stdout=out_w,
            stderr=err_w,
            env=env,
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
        )
        try:
            pidfd = os.pidfd_open(popen.pid)  # our unreaped child: valid even if it has exited already
        except BaseException:
            signal_group(popen.pid, signal.SIGKILL)
            popen.wait()
            raise
    return _Child(popen, pidfd, started), out_r, err_r


# ---------------------------------------------------------------------------------------------------------------
# The runner


@dataclass
class _Live:
    """One running agent: its process and why ambient is killing it, if it is."""

    proc: _Proc
    req: RunRequest
    grace: float
    kill_reason: Reason | None = None

    @property
    def pgid(self) -> int:
        # start_new_session=True made the agent the leader of its own session and group: pgid == pid.
        return self.proc.pid


_KILL_MESSAGES: dict[str, str] = {
    "timeout": "agent timed out after {timeout:g} s; its process group was killed",
    "output_over_cap": "agent wrote more than {cap} bytes on stdout; its process group was killed",
    "shutdown": "ambient is shutting down; the agent's process group was terminated",
}


class CommandRunner:
    """Runs command agents and tracks every live process group so the daemon can drain them.

    One instance per daemon. ``on_spawn(req, pid)`` (optional, must not raise) is called right after an agent
    starts, e.g. to record its pid for orphan detection after a crash (the pid is also its process group id).
    With a ``spawner`` (the daemon's; :mod:`ambient.runners.spawner`), agents start from that helper process and
    the event loop never waits for an ``exec``; without one, or once it is given up on, through ``Popen`` on the
    loop (a vfork: the loop waits until the child has exec'd). Call :meth:`close` at the end.
    """

    def __init__(
        self, *, on_spawn: SpawnHook | None = None, python: str | None = None, spawner: Spawner | None = None
    ) -> None:
        self._live: dict[int, _Live] = {}
        self._closing = False
        self._on_spawn = on_spawn
        self._python = python or sys.executable
        self._spawner = spawner

    def close(self) -> None:
        """Stop the spawner, if any (blocking, briefly): after :meth:`terminate_all`, at the daemon's end."""
        if self._spawner is not None:
            self._spawner.close()

    @property
    def live_pids(self) -> list[int]:
        """Pids (= process group ids) of the agents running now."""
        return sorted(self._live)

    async def terminate_all(self, grace: float | None = None) -> int:
        """Stop accepting new agents, SIGTERM every live group, SIGKILL what is left after ``grace`` s.

        ``grace`` defaults to the largest ``kill_grace_s`` of the running agents. Their ``run`` calls return
        ``error`` results with reason ``shutdown`` (record them as interrupted). Returns how many groups were
        signalled.
        """
        self._closing = True
        lives = list(self._live.values())
        if not lives:
            return 0
        wait = grace if grace is not None else max(live.grace for live in lives)
        for live in lives:
            live.kill_reason = live.kill_reason or "shutdown"
        await asyncio.gather(*(terminate_group(live.pgid, grace=wait, leader=live.proc) for live in lives))
        log.info("agents_terminated", count=len(lives))
        return len(lives)

    def reopen(self) -> None:
        """Accept new agents again after :meth:`terminate_all` (tests, or a daemon that keeps running)."""
        self._closing = False

    async def run(self, req: RunRequest, cfg: AnyRunnerConfig) -> AgentResult:
        """Run the command agent of ``req``; never raises for agent failures; re-raises cancellation.

        ``req.before_start`` runs just before the agent starts (not at all if the request is refused first).
        """
        if not isinstance(cfg, CommandRunnerConfig):
            msg = f"CommandRunner cannot run a {cfg.kind!r} runner config"
            raise TypeError(msg)
        started = time.monotonic()
        if self._closing:
            return error_result("shutdown", "ambient is shutting down; the agent was not started")
        try:
            argv = render_argv(cfg.argv, req.template_values(self._python))
            packet_json = encode_packet(req.packet)
            env = build_env(req, cfg, packet_json)
            cwd = _cwd(req, cfg)
        except (TemplateError, InputError) as exc:
            return error_result("bad_request", _redact(str(exc), req))
        try:
            return await self._run_started(req, cfg, argv, packet_json, env, cwd, started)
        finally:
            _drop_tmp(env)

    async def _run_started(
        self,
        req: RunRequest,
        cfg: CommandRunnerConfig,
        argv: list[str],
        packet_json: str,
        env: dict[str, str],
        cwd: Path,
        started: float,
    ) -> AgentResult:
        try:
            proc, output = await _start(req, argv, packet_json.encode(), env, cwd, cfg, self._spawner)
        except _SetupError as exc:
            return error_result("spawn_failed", _redact(f"cannot prepare the agent's start: {exc}", req))
        except OSError as exc:
            # Descriptors, memory, processes: the daemon's (or its spawner's) own limits, not the agent's fault.
            kind = resource_of(exc, spawning=True)
            if kind is not None:
                detail = f"starting {req.agent!r}: {exc.strerror or exc}"
                return error_result(
                    "daemon_resources", describe(kind, detail), context={"resource": kind}, duration_ms=_ms(started)
                )
            if isinstance(exc, _StdinError):
                return error_result("spawn_failed", exc.strerror or str(exc))
            return error_result(
                "spawn_failed", f"cannot start {argv[0]!r}: {exc.strerror or exc}", duration_ms=_ms(started)
            )
        live = _Live(proc=proc, req=req, grace=cfg.kill_grace_s)
        self._live[proc.pid] = live
        if self._closing:  # terminate_all() ran while this agent was being started: it goes too
            live.kill_reason = "shutdown"
        log.debug("agent_started", agent=req.agent, run_id=req.run_id, item=req.item, attempt=req.attempt, pid=proc.pid)
        if self._on_spawn is not None:
            try:
                self._on_spawn(req, proc.pid, getattr(proc, "start_time", None))
            except Exception:  # a hook must not break the run; the agent is already running
                log.exception("agent_on_spawn_failed", agent=req.agent, pid=proc.pid)
        try:
            result = await self._supervise(live, cfg, output, started)
        finally:
            self._live.pop(proc.pid, None)
        if result.killed or result.status == "error":
            log.warning(
                "agent_result",
                agent=req.agent,
                run_id=req.run_id,
                item=req.item,
                attempt=req.attempt,
                status=result.status,
                reason=result.reason,
                exit_code=result.exit_code,
                killed=result.killed,
            )
        return result

    async def _supervise(self, live: _Live, cfg: CommandRunnerConfig, pipes: _Output, started: float) -> AgentResult:
        proc = live.proc
        unhook = _on_exit(proc, pipes.wake)
        try:
            reason = live.kill_reason or await self._watch(cfg, pipes, proc)
            reason = live.kill_reason or reason  # terminate_all() may have stopped it meanwhile (shutdown)
            if reason is not None:
                live.kill_reason = reason
                await terminate_group(live.pgid, grace=cfg.kill_grace_s, leader=proc)
            elif group_alive(live.pgid):
                # The agent exited but left processes in its group (a background child): they go with it.
                log.warning("agent_left_processes", agent=live.req.agent, pgid=live.pgid)
                await terminate_group(live.pgid, grace=cfg.kill_grace_s)
            await self._drain(live, pipes)
        except BaseException:
            # Cancellation (daemon shutdown) or an unexpected error: never leave the agent's tree running.
            live.kill_reason = live.kill_reason or "shutdown"
            try:
                await terminate_group(live.pgid, grace=cfg.kill_grace_s, leader=proc)
            except BaseException:  # cancelled again while waiting for the grace: no more grace
                signal_group(live.pgid, signal.SIGKILL)
                raise
            raise
        finally:
            pipes.close()
            unhook()
            if proc.returncode is not None:
                _close_transport(proc)
        return self._result(live, cfg, pipes, started)

    async def _watch(self, cfg: CommandRunnerConfig, pipes: _Output, proc: _Proc) -> Reason | None:
        """Wait for the agent to finish; the reason to kill it, or None if it ended by itself."""
        deadline = asyncio.get_running_loop().time() + cfg.timeout_s
        if not await pipes.until(lambda: proc.returncode is not None or pipes.over, deadline):
            return "timeout"
        if not pipes.over:
            # The leader exited: its stdout reaches EOF at once unless a leftover child still holds it.
            linger = min(deadline, asyncio.get_running_loop().time() + _LINGER_S)
            if not await pipes.until(lambda: pipes.out_closed or pipes.over, linger) and linger == deadline:
                return "timeout"
        return "output_over_cap" if pipes.over else None

    async def _drain(self, live: _Live, pipes: _Output) -> None:
        """Let the pipes reach EOF and the leader be reaped, each bounded in time."""
        proc = live.proc
        loop = asyncio.get_running_loop()
        if not await pipes.until(lambda: pipes.closed, loop.time() + _DRAIN_S):
            # Only a process that escaped the group with setsid() can still hold a pipe.
            log.warning("agent_pipe_held_open", agent=live.req.agent, pgid=live.pgid)
            await pipes.release()
        if not await pipes.until(lambda: proc.returncode is not None, loop.time() + _REAP_S):
            signal_group(live.pgid, signal.SIGKILL)
            log.error("agent_not_reaped", agent=live.req.agent, pid=proc.pid)

    def _result(self, live: _Live, cfg: CommandRunnerConfig, pipes: _Output, started: float) -> AgentResult:
        req = live.req
        stdout = pipes.stdout
        stderr_tail = _redact(pipes.stderr_tail.decode("utf-8", "replace"), req)
        rc = live.proc.returncode
        facts: dict[str, Any] = {
            "exit_code": rc,
            "duration_ms": _ms(started),
            "stderr_tail": stderr_tail,
            "pid": live.proc.pid,
        }
        if live.kill_reason is not None:
            message = _KILL_MESSAGES.get(live.kill_reason, "agent killed ({reason})").format(
                timeout=cfg.timeout_s, cap=cfg.max_output_bytes, reason=live.kill_reason
            )
            return error_result(live.kill_reason, message, killed=True, **facts)
        if rc == 0:
            parsed, problem = _parse_stdout(stdout)
            if problem is not None:
                return error_result("bad_output", problem, **facts)
            return interpret_output(parsed, agent=req.agent).with_process(**facts)
        last = _last_line(stderr_tail)
        if rc == 1:
            # Exit code 1: a business failure. A JSON object on stdout, if any, is kept as the result.
            parsed, _ = _parse_stdout(stdout)
            result = None
            output = parsed if isinstance(parsed, dict) else None
            if output is not None:
                inner = output.get("result")
                result = inner if output.get("signal") == "RETURN" and isinstance(inner, dict) else output
            message = "agent exited with code 1" + (f": {last}" if last else "")
            return AgentResult(
                status="fail",
                reason="agent_failed",
                output=output,
                result=result,
                result_status="failed",
                error=message,
                **facts,
            )
        if rc is not None and rc < 0:
            name = _signal_name(-rc)
            message = f"agent died from signal {name}" + (f": {last}" if last else "")
            return error_result("signal", message, **facts)
        if rc == _NOT_STARTED and last.startswith(_NOT_STARTED_SAYS):
            # A confined start that failed in the spawner's child (no program, a confinement refused): said there.
            return error_result("spawn_failed", last.removeprefix("ambient: "), **facts)
        message = f"agent exited with code {rc}" + (f": {last}" if last else "")
        return error_result("exit_code", message, **facts)


def _parse_stdout(data: bytes) -> tuple[object, str | None]:
    """(parsed JSON or None for empty output, problem or None)."""
    text = data.strip()
    if not text:
        return None, None
    try:
        return json.loads(text), None
    except RecursionError:
        return None, "agent stdout is JSON nested too deeply"
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        return None, f"agent stdout is not one JSON object: {str(exc)[:200]} (stdout starts {data[:60]!r})"


def _last_line(text: str) -> str:
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()[:300]
    return ""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _redact(text: str, req: RunRequest) -> str:
    # The channel token is a secret: never let it reach a record or a log through stderr or an error message.
    token = req.channel_token
    return text.replace(token, _REDACTED) if token else text


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
