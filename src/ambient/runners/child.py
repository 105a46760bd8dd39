"""Starting an agent: through the daemon's spawner when there is one, else ``subprocess.Popen`` on the loop waited
for through a pidfd (:class:`Child`), else asyncio's subprocesses; and being told when it has exited.

The agent starts in its own session (its process group can be killed whole), runs as the user and under the
confinement its config asks (:func:`ambient.runners.confinement.jail`), after the request's ``before_start``.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import os
import signal
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ambient.core.errors import SetupError, SpawnerLost
from ambient.core.process import start_time_now
from ambient.runners import confinement
from ambient.runners.base import RunRequest
from ambient.runners.pipes import Output, Pipes, child_stdio
from ambient.runners.process_group import Proc, signal_group
from ambient.runners.runner_config import CommandRunnerConfig
from ambient.runners.spawner import SpawnedAgent, Spawner


def waits_by_pidfd() -> bool:
    """Whether agents are started by ``subprocess.Popen`` and waited for through a pidfd (Linux 5.3+).

    Elsewhere they start through asyncio's subprocesses (one child watcher per agent).
    """
    return hasattr(os, "pidfd_open")


def use_pidfd_watcher() -> bool:
    """On Python 3.11, have asyncio wait for its subprocesses through pidfds instead of one thread per child.

    3.11's default child watcher starts a thread per child process; starting it needs a GIL hand-off with a
    busy event loop. Agents are waited for through pidfds by the runner itself (:class:`Child`); this serves
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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        asyncio.set_child_watcher(asyncio.PidfdChildWatcher())
    return True


class Child:
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


def _before_start(req: RunRequest) -> None:
    if req.before_start is not None:
        try:
            req.before_start()
        except Exception as exc:
            raise SetupError(str(exc)) from exc


async def start_agent(
    req: RunRequest,
    argv: list[str],
    packet: bytes,
    env: dict[str, str],
    cwd: Path,
    cfg: CommandRunnerConfig,
    spawner: Spawner | None = None,
    agent_user: str | None = None,
) -> tuple[Proc, Output]:
    """Start an agent in its own session (its group can be killed whole): (process, its output being read).

    Through ``spawner`` when there is one (not given up on), within ``cfg.timeout_s``; it then reads the output
    itself. ``agent_user``: whom it runs as when its runner names no ``user:`` (None: ambient's own user). Raises
    OSError if it cannot start (:class:`StdinError` when its stdin could not be made),
    :class:`SetupError` when ``req.before_start`` failed (the agent is then not started).
    """
    _before_start(req)
    if spawner is not None and not spawner.broken:
        jail = confinement.jail(req, cfg, argv, env, agent_user)
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
    if (user := confinement.run_as(cfg, agent_user)) is not None:
        raise OSError(errno.EPERM, f"cannot run the agent as {user!r}: that needs ambient's spawner (Linux)")
    if not waits_by_pidfd():
        with child_stdio(packet) as (stdin_fd, out_w, err_w, out_r, err_r):
            # S603 reviewed: as in spawn_child.
            proc: Proc = await asyncio.create_subprocess_exec(
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
        proc, out_r, err_r = spawn_child(argv, packet, env, cwd)
    try:
        return proc, Pipes(out_r, err_r, cfg.max_output_bytes, cfg.stderr_tail_bytes)
    except BaseException:
        signal_group(proc.pid, signal.SIGKILL)
        raise


def spawn_child(argv: list[str], packet: bytes, env: dict[str, str], cwd: Path) -> tuple[Child, int, int]:
    """Start an agent with ``Popen`` on the loop: it waits until the child has exec'd (vfork; see :class:`Child`)."""
    started = start_time_now()
    with child_stdio(packet) as (stdin_fd, out_w, err_w, out_r, err_r):
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
    return Child(popen, pidfd, started), out_r, err_r


def on_exit(proc: Proc, callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback`` when ``proc`` has exited (its returncode is set); returns the undo."""
    if isinstance(proc, (Child, SpawnedAgent)):
        proc.on_exit = callback
        return functools.partial(setattr, proc, "on_exit", None)
    waiting = asyncio.ensure_future(proc.wait())  # asyncio's subprocess (no pidfd here): rare path
    waiting.add_done_callback(lambda _: callback())

    def undo() -> None:
        waiting.cancel()

    return undo


def close_transport(proc: Proc) -> None:
    # asyncio.subprocess.Process has no public close(); closing its transport avoids "unclosed transport"
    # ResourceWarnings. The runner only calls this once the leader has exited, so nothing is killed here.
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()
