"""The command runner: an agent is a program run from an argv list, never through a shell (S-07).

It owns the process group of every agent it starts: stdin gets the SPAWN packet, stdout is read in bounded chunks
under a cap, stderr is kept as a bounded tail, a timeout, a cap overrun, a shutdown or a cancellation kill the whole
group (SIGTERM, grace, SIGKILL), and the agent is always reaped. The environment is explicit and minimal (S-06).

Here: supervising each agent from its start to its result, and what its exit and output mean. The parts it is
made of: :mod:`~ambient.runners.agent_env` (what the agent is given), :mod:`~ambient.runners.child` (starting it),
:mod:`~ambient.runners.pipes` (its stdio), :mod:`~ambient.runners.process_group` (ending its group),
:mod:`~ambient.runners.confinement` (its user and Landlock paths).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ambient.core.errors import InputError, SetupError, SpawnTemplateError, StdinError
from ambient.core.health import describe, resource_of
from ambient.core.lazylog import get_logger
from ambient.core.terminal import quoted
from ambient.runners.agent_env import agent_cwd, build_env, encode_packet
from ambient.runners.answer import interpret_output, stated_error
from ambient.runners.argv import render_argv
from ambient.runners.base import RunRequest
from ambient.runners.child import close_transport, on_exit, start_agent
from ambient.runners.confinement import drop_tmp, run_as
from ambient.runners.pipes import Output
from ambient.runners.process_group import Proc, group_alive, signal_group, terminate_group
from ambient.runners.result import AgentResult, Reason, error_result
from ambient.runners.runner_config import AnyRunnerConfig, CommandRunnerConfig
from ambient.runners.spawner import Spawner

log = get_logger(__name__)

#: After the agent exits, how long its stdout may stay open (a leftover child holding the pipe) before the group
#: is killed so that the result can be read.
_LINGER_S = 0.5
#: After the group is dead, how long the pipes may take to reach EOF (only a process that left the group with
#: setsid() can hold them longer; it is then abandoned and logged).
_DRAIN_S = 2.0
#: How long to wait for the kernel to let a SIGKILLed leader be reaped.
_REAP_S = 10.0
_REDACTED = "[REDACTED:channel-token]"
#: How the spawner's child says a confined agent could not be started (runners/spawner_helper.py).
_NOT_STARTED = 127
_NOT_STARTED_SAYS = ("ambient: cannot start ", "ambient: cannot confine ")

#: ``on_spawn(req, pid, start_time)``: ``start_time`` is the agent's start (epoch s, from /proc) when known.
SpawnHook = Callable[[RunRequest, int, float | None], None]


@dataclass
class _Live:
    """One running agent: its process and why ambient is killing it, if it is."""

    proc: Proc
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
    loop (a vfork: the loop waits until the child has exec'd). ``agent_user``: whom an agent whose runner names
    no ``user:`` runs as (the daemon's choice when it runs as root:
    :func:`ambient.runners.confinement.default_agent_user`); None: ambient's own user. Call :meth:`close` at the end.
    """

    def __init__(
        self,
        *,
        on_spawn: SpawnHook | None = None,
        python: str | None = None,
        spawner: Spawner | None = None,
        agent_user: str | None = None,
    ) -> None:
        self._live: dict[int, _Live] = {}
        self._closing = False
        self._on_spawn = on_spawn
        self._python = python or sys.executable
        self._spawner = spawner
        self.agent_user = agent_user

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
            cwd = agent_cwd(req, cfg)
        except (SpawnTemplateError, InputError) as exc:
            return error_result("bad_request", _redact(str(exc), req))
        try:
            return await self._run_started(req, cfg, argv, packet_json, env, cwd, started)
        finally:
            drop_tmp(env)

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
            proc, output = await start_agent(
                req, argv, packet_json.encode(), env, cwd, cfg, self._spawner, self.agent_user
            )
        except SetupError as exc:
            return error_result("spawn_failed", _redact(f"cannot prepare the agent's start: {exc}", req))
        except OSError as exc:
            # Descriptors, memory, processes: the daemon's (or its spawner's) own limits, not the agent's fault.
            kind = resource_of(exc, spawning=True)
            if kind is not None:
                detail = f"starting {req.agent!r}: {exc.strerror or exc}"
                return error_result(
                    "daemon_resources", describe(kind, detail), context={"resource": kind}, duration_ms=_ms(started)
                )
            if isinstance(exc, StdinError):
                return error_result("spawn_failed", exc.strerror or str(exc))
            why = _whom(f"cannot start {argv[0]!r}: {exc.strerror or exc}", run_as(cfg, self.agent_user))
            return error_result("spawn_failed", why, duration_ms=_ms(started))
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

    async def _supervise(self, live: _Live, cfg: CommandRunnerConfig, pipes: Output, started: float) -> AgentResult:
        proc = live.proc
        unhook = on_exit(proc, pipes.wake)
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
                close_transport(proc)
        return self._result(live, cfg, pipes, started)

    async def _watch(self, cfg: CommandRunnerConfig, pipes: Output, proc: Proc) -> Reason | None:
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

    async def _drain(self, live: _Live, pipes: Output) -> None:
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

    def _result(self, live: _Live, cfg: CommandRunnerConfig, pipes: Output, started: float) -> AgentResult:
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
            # Its own stated error (the JSON's error, message or reason) is its words, else stderr's last line: the
            # question and a learned rule's situation need them (a bare exit code tells no failure from another).
            said = stated_error(result) if result is not None else None
            words = said or last
            message = "agent exited with code 1" + (f": {words}" if words else "")
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
            why = _whom(last.removeprefix("ambient: "), run_as(cfg, self.agent_user))
            return error_result("spawn_failed", why, **facts)
        message = f"agent exited with code {rc}" + (f": {last}" if last else "")
        return error_result("exit_code", message, **facts)


def _whom(why: str, user: str | None) -> str:
    """A start refused for permission, by an agent run as another user: whose permission (a folder above the
    program, such as /root at 0700, is closed to that user), and where the fix is."""
    if user is None or not why.startswith("cannot start ") or not why.endswith(os.strerror(errno.EACCES)):
        return why
    return f"{why} (the agent runs as {user!r}: a folder on the way is closed to that user; `ambient doctor` names it)"


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
        start = quoted(data[: _SHOWN * 4].decode("utf-8", "replace")[:_SHOWN])
        return None, f"agent stdout is not one JSON object: {str(exc)[:200]} (stdout starts {start})"


#: How many characters of an agent's stdout an error about it quotes.
_SHOWN = 60


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
