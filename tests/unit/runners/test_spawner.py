"""The spawner process (ambient.runners.spawner): agents start like Popen's, and its failures lose no agent.

Real helper processes, real agents (``sys.executable -c``, ``/bin/echo``) and real signals; Linux only, as the
spawner is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambient.core.errors import SpawnerLost
from ambient.runners import CommandRunner, CommandRunnerConfig, RunRequest, idempotency_key
from ambient.runners.confinement import landlock_abi, policy
from ambient.runners.spawner import INLINE_MAX, SpawnedAgent, Spawner, available
from ambient.runners.spawner_helper import keep_output
from tests.conftest import async_wait_until, wait_until

pytestmark = pytest.mark.skipif(not available(), reason="the spawner needs Linux (posix_spawn, pidfds)")

PY = sys.executable


@pytest.fixture
async def spawner() -> AsyncIterator[Spawner]:
    s = Spawner()
    yield s
    s.close()


async def run(
    spawner: Spawner,
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    stdin: bytes = b"",
    out_cap: int = 1 << 20,
) -> tuple[int, str]:
    """Start ``argv`` through ``spawner`` and wait for it: (exit code, stdout)."""
    agent = await spawner.spawn(
        argv, env if env is not None else {"PATH": os.defpath}, cwd or Path.cwd(), stdin, out_cap, 4096
    )
    assert await agent.until(lambda: agent.closed, asyncio.get_running_loop().time() + 30)
    return await agent.wait(), agent.stdout.decode()


async def sleeper(spawner: Spawner, marker: str) -> SpawnedAgent:
    return await spawner.spawn(
        [PY, "-c", "import time; time.sleep(60)", marker], {"PATH": os.defpath}, Path.cwd(), b"", 1024, 1024
    )


def children_with(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if marker in " ".join(p.info["cmdline"] or []):
            found.append(p)
    return found


def the_spawner_process() -> psutil.Process:
    """The one spawner this test process runs."""
    (helper,) = [p for p in psutil.Process().children() if "spawner_helper" in " ".join(p.cmdline())]
    return helper


class TestStart:
    async def test_output_and_exit_codes_come_back(self, spawner: Spawner) -> None:
        assert await run(spawner, ["/bin/echo", "hello"]) == (0, "hello\n")
        assert (await run(spawner, [PY, "-c", "raise SystemExit(3)"]))[0] == 3
        code, _ = await run(spawner, [PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
        assert code == -signal.SIGKILL

    async def test_agent_gets_only_its_stdio_its_own_session_and_default_signals(
        self, spawner: Spawner, tmp_path: Path
    ) -> None:
        code = (
            "import os, json\n"
            "fds = []\n"
            "for fd in range(3, 1024):\n"
            "    try:\n"
            "        os.fstat(fd)\n"
            "    except OSError:\n"
            "        continue\n"
            "    fds.append(fd)\n"
            "print(json.dumps({'fds': fds, 'sid': os.getsid(0), 'pgid': os.getpgid(0), 'pid': os.getpid()}))\n"
        )
        # Descriptors the daemon holds (inheritable ones included) must not reach the agent.
        leak = os.open(tmp_path / "leak", os.O_CREAT | os.O_WRONLY)
        os.set_inheritable(leak, True)
        try:
            rc, out = await run(spawner, [PY, "-c", code])
        finally:
            os.close(leak)
        assert rc == 0
        seen = json.loads(out)
        assert seen["fds"] == []
        assert seen["sid"] == seen["pgid"] == seen["pid"]
        # Read by a program that changes no disposition itself (Python would ignore SIGPIPE and SIGXFSZ again).
        rc, out = await run(spawner, ["/bin/cat", "/proc/self/status"])
        status = dict(line.split(":", 1) for line in out.splitlines())
        standard = (1 << 31) - 1  # signals 1-31; glibc's posix_spawn leaves its internal 32 and 33 ignored
        assert int(status["SigIgn"], 16) & standard == 0  # SIGPIPE and the spawner's stop signals: default again
        assert int(status["SigBlk"], 16) == 0

    @pytest.mark.skipif(landlock_abi() < 1, reason="this kernel has no Landlock")
    async def test_a_confined_agent_also_gets_default_signals_and_an_empty_mask(
        self, spawner: Spawner, tmp_path: Path
    ) -> None:
        """The confined path forks the spawner and execs from the child: the spawner's own stop signals and those
        Python ignores must be default again there too, and nothing blocked."""
        jail = policy(tmp_path, [], tmp_path, "/bin/cat").as_request(landlock_abi())
        agent = await spawner.spawn(
            ["/bin/cat", "/proc/self/status"], {"PATH": os.defpath}, tmp_path, b"", 1 << 20, 4096, jail
        )
        assert await agent.until(lambda: agent.closed, asyncio.get_running_loop().time() + 30)
        assert await agent.wait() == 0, agent.stderr_tail
        status = dict(line.split(":", 1) for line in agent.stdout.decode().splitlines())
        assert int(status["SigIgn"], 16) & ((1 << 31) - 1) == 0
        assert int(status["SigBlk"], 16) == 0
        assert int(status["NoNewPrivs"]) == 1  # it was confined

    async def test_argv_elements_stay_whole_and_env_is_exactly_what_was_given(self, spawner: Spawner) -> None:
        hostile = "a b; rm -rf / $(id) `id` \"' \\ é ✓"
        rc, out = await run(
            spawner,
            [PY, "-c", "import os, sys, json; print(json.dumps([sys.argv[1:], dict(os.environ)]))", hostile, ""],
            env={"ONLY": "this", "PATH": os.defpath},
        )
        assert rc == 0
        argv, env = json.loads(out)
        assert argv == [hostile, ""]
        assert {k: v for k, v in env.items() if k != "LC_CTYPE"} == {"ONLY": "this", "PATH": os.defpath}

    async def test_cwd_is_the_requests_each_time(self, spawner: Spawner, tmp_path: Path) -> None:
        a, b = tmp_path / "a", tmp_path / "b"
        a.mkdir()
        b.mkdir()
        for cwd in (a, b, a):
            assert await run(spawner, [PY, "-c", "import os; print(os.getcwd())"], cwd=cwd) == (0, f"{cwd}\n")
        with pytest.raises(FileNotFoundError):
            await run(spawner, ["/bin/echo"], cwd=tmp_path / "missing")
        assert await run(spawner, ["/bin/echo", "still fine"], cwd=a) == (0, "still fine\n")

    async def test_a_bare_name_is_looked_up_in_the_agents_path(self, spawner: Spawner, tmp_path: Path) -> None:
        first, second = tmp_path / "first", tmp_path / "second"
        first.mkdir()
        second.mkdir()
        (first / "tool").write_text("not executable\n")  # skipped, as execvp would
        (second / "tool").write_text("#!/bin/sh\necho from-second\n")
        (second / "tool").chmod(0o755)
        env = {"PATH": f"{first}:{second}"}
        assert await run(spawner, ["tool"], env=env) == (0, "from-second\n")
        with pytest.raises(FileNotFoundError):
            await run(spawner, ["no-such-tool-here"], env=env)
        with pytest.raises(PermissionError):  # found, but not executable: that error, not "not found"
            await run(spawner, ["tool"], env={"PATH": str(first)})

    async def test_a_request_over_the_inline_limit_travels_in_a_memfd(self, spawner: Spawner) -> None:
        big = "x" * (INLINE_MAX * 3)
        rc, out = await run(
            spawner, [PY, "-c", "import os; print(len(os.environ['BIG']))"], env={"BIG": big, "PATH": os.defpath}
        )
        assert (rc, out) == (0, f"{len(big)}\n")

    async def test_stdin_holds_the_packet_and_output_comes_back_whole_or_capped(self, spawner: Spawner) -> None:
        assert await run(spawner, [PY, "-c", "import sys; print(sys.stdin.read()[::-1])"], stdin=b"packet") == (
            0,
            "tekcap\n",
        )
        big = INLINE_MAX * 4  # the report is larger than a datagram: it comes in a memfd
        assert await run(spawner, [PY, "-c", f"import sys; sys.stdout.write('z' * {big})"]) == (0, "z" * big)
        agent = await spawner.spawn(
            [PY, "-c", "import sys; sys.stdout.write('o' * 100_000); sys.stderr.write('e' * 5000 + 'END')"],
            {"PATH": os.defpath},
            Path.cwd(),
            b"",
            1000,
            100,
        )
        assert await agent.until(lambda: agent.closed, asyncio.get_running_loop().time() + 30)
        assert agent.over and len(agent.stdout) <= 1000  # past the cap: reported, the rest discarded
        assert agent.stderr_tail == b"e" * 97 + b"END"  # the last 100 bytes
        assert await agent.wait() == 0

    async def test_an_exit_with_a_pipe_still_held_says_which(self, spawner: Spawner) -> None:
        """The agent exits, a child of its group keeps stderr: the exit is reported at once with stdout known
        closed (the runner's linger for stdout has nothing to wait for), and the output once the child is gone.
        (The spawner's sweep ends such a stray as soon as its agent has ended: on a loaded machine the output may
        already be in when the test looks, so only stdout's state at the exit is asserted.)"""
        code = "import os, sys, time\nos.close(1)\nif os.fork() == 0:\n    time.sleep(60)\n"
        agent = await spawner.spawn([PY, "-c", code], {"PATH": os.defpath}, Path.cwd(), b"", 1024, 1024)
        deadline = asyncio.get_running_loop().time() + 30
        assert await agent.until(lambda: agent.returncode is not None, deadline)
        assert agent.returncode == 0 and agent.out_closed
        with contextlib.suppress(ProcessLookupError):  # the child: the group outlives its leader (unless gone)
            os.killpg(agent.pid, signal.SIGKILL)
        assert await agent.until(lambda: agent.closed, deadline)

    async def test_start_times_are_the_agents_own_even_when_starts_queue(self, spawner: Spawner) -> None:
        """Recorded for reconciliation after a crash, which compares them with /proc to 50 ms."""
        from ambient.core.process import process_start_time

        agents = await asyncio.gather(
            *(
                spawner.spawn(
                    [PY, "-c", "import time; time.sleep(5)"], {"PATH": os.defpath}, Path.cwd(), b"", 1024, 1024
                )
                for _ in range(20)
            )
        )
        try:
            for agent in agents:
                from_proc = process_start_time(agent.pid)
                assert agent.start_time is not None and from_proc is not None
                assert abs(agent.start_time - from_proc) <= 0.05
        finally:
            for agent in agents:
                os.killpg(agent.pid, signal.SIGKILL)
            await asyncio.gather(*(agent.wait() for agent in agents))

    @pytest.mark.slow
    async def test_many_starts_at_once_queue_when_the_socket_is_full(self, spawner: Spawner) -> None:
        # 200 requests of ~20 KiB each are ~4 MiB: far more than the socket holds, so most wait in the outbox.
        filler = {"FILL": "y" * 20_000, "PATH": os.defpath}
        results = await asyncio.gather(*(run(spawner, ["/bin/echo", f"n{i}"], env=filler) for i in range(200)))
        assert results == [(0, f"n{i}\n") for i in range(200)]


class TestFailures:
    async def test_a_start_cancelled_in_flight_has_its_agent_killed(self, spawner: Spawner) -> None:
        marker = f"cancelled-start-{os.getpid()}-{time.monotonic_ns()}"
        await run(spawner, ["/bin/echo", "warm"])  # the spawner is up: the request below goes at once
        task = asyncio.ensure_future(sleeper(spawner, marker))
        await asyncio.sleep(0)  # the request is sent; its answer cannot be read while this loop is held
        assert wait_until(lambda: len(children_with(marker)) == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await async_wait_until(lambda: not children_with(marker))

    async def test_a_killed_spawner_ends_its_agents_and_the_next_start_brings_a_new_one(self, spawner: Spawner) -> None:
        marker = f"orphaned-agent-{os.getpid()}-{time.monotonic_ns()}"
        agent = await sleeper(spawner, marker)
        first = the_spawner_process()
        first.kill()
        assert await asyncio.wait_for(agent.wait(), 10) == -signal.SIGKILL
        assert await async_wait_until(lambda: not children_with(marker))
        assert not spawner.broken  # it had answered before: a crash, not a spawner that cannot run
        assert await run(spawner, ["/bin/echo", "again"]) == (0, "again\n")
        assert the_spawner_process().pid != first.pid

    async def test_a_spawner_that_cannot_run_is_given_up_on(self, tmp_path: Path) -> None:
        missing = Spawner(python=str(tmp_path / "no-python"))
        with pytest.raises(SpawnerLost):
            await run(missing, ["/bin/echo"])
        assert missing.broken
        dies = Spawner(python="/bin/false")  # starts, then exits before answering anything
        with pytest.raises(SpawnerLost):
            await run(dies, ["/bin/echo"])
        assert dies.broken
        with pytest.raises(SpawnerLost):  # and it is not started again
            await run(dies, ["/bin/echo"])
        missing.close()
        dies.close()

    async def test_close_kills_what_still_runs_and_reaps_the_spawner(self, spawner: Spawner) -> None:
        marker = f"left-running-{os.getpid()}-{time.monotonic_ns()}"
        await sleeper(spawner, marker)
        helper = the_spawner_process()
        spawner.close()
        assert not spawner.running
        assert await async_wait_until(lambda: not children_with(marker))
        assert not helper.is_running()  # exited on EOF and reaped (no zombie left)


class TestThroughTheRunner:
    """The command runner with a spawner: results as before, and Popen when the spawner cannot run."""

    @staticmethod
    def request(brain: Path) -> RunRequest:
        return RunRequest(
            packet={"from": "a", "to": "b", "signal": "SPAWN"},
            agent="b",
            run_id="run-1",
            item="i",
            attempt=1,
            key=idempotency_key("run-1", "i", 1),
            channel_token="t",
            brain=brain,
        )

    @pytest.mark.parametrize("python", [None, "/bin/false"])
    async def test_agent_result_with_a_working_or_a_broken_spawner(self, tmp_path: Path, python: str | None) -> None:
        spawner = Spawner(python=python)
        seen: list[Any] = []
        runner = CommandRunner(spawner=spawner, on_spawn=lambda req, pid, started: seen.append((pid, started)))
        cfg = CommandRunnerConfig(
            kind="command",
            argv=[
                PY,
                "-c",
                "import json, sys; d = json.load(sys.stdin); print(json.dumps({'status': 'success', 'output': d}))",
            ],
        )
        try:
            res = await runner.run(self.request(tmp_path), cfg)
        finally:
            runner.close()
        assert res.status == "success", res
        assert res.output == {"status": "success", "output": {"from": "a", "to": "b", "signal": "SPAWN"}}
        assert len(seen) == 1 and seen[0][1] is not None
        assert spawner.broken is (python is not None)

    @pytest.mark.slow
    async def test_a_timeout_kills_the_group_of_a_spawned_agent(self, tmp_path: Path) -> None:
        runner = CommandRunner(spawner=Spawner())
        marker = f"slow-agent-{os.getpid()}-{time.monotonic_ns()}"
        cfg = CommandRunnerConfig(
            kind="command", argv=[PY, "-c", "import time; time.sleep(60)", marker], timeout_s=0.5, kill_grace_s=0.2
        )
        try:
            res = await runner.run(self.request(tmp_path), cfg)
        finally:
            runner.close()
        assert res.status == "error" and res.reason == "timeout" and res.killed
        assert not children_with(marker)


@given(
    st.lists(st.tuples(st.booleans(), st.binary(max_size=40)), max_size=30), st.integers(1, 100), st.integers(0, 100)
)
def test_output_caps_keep_the_head_of_stdout_and_the_tail_of_stderr(
    chunks: list[tuple[bool, bytes]], out_cap: int, err_tail: int
) -> None:
    """The one rule of both readers (the spawner's and the runner's own pipes), as they apply it."""
    out, err, over = bytearray(), bytearray(), False
    for from_err, data in chunks:
        if (from_err or not over) and not keep_output(out, err, data, from_err, out_cap, err_tail):
            over = True
    all_out = b"".join(d for e, d in chunks if not e)
    all_err = b"".join(d for e, d in chunks if e)
    assert len(out) <= out_cap and all_out.startswith(out)
    assert over == (len(all_out) > out_cap)
    assert bytes(err) == (all_err[-err_tail:] if err_tail else b"")


def test_spawned_agent_reports_its_exit_once() -> None:
    async def main() -> list[int]:
        agent = SpawnedAgent(123, None, Spawner())
        calls: list[int] = []
        agent.on_exit = lambda: calls.append(agent.returncode or 0)
        agent._set_exit(4)
        agent._set_exit(5)  # a late duplicate (a kill racing the exit report) changes nothing
        assert await agent.wait() == 4
        return calls

    assert asyncio.run(main()) == [4]


@pytest.mark.slow
def test_the_daemon_brings_its_spawner_up_at_start_only_for_a_brain_with_command_agents(tmp_path: Path) -> None:
    """Up before READY (its start-up is not spent inside the first run), gone with the daemon; none without
    command agents."""
    from tests.e2e.helpers import is_spawner, make_brain, running, stub_agent_md

    def spawners(pid: int) -> list[psutil.Process]:
        return [p for p in psutil.Process(pid).children() if is_spawner(p)]

    with running(make_brain(tmp_path / "a", example_agents=False, agents={"stub": stub_agent_md("stub")})) as d:
        (helper,) = spawners(d.pid)
        assert d.stop() == 0
    assert not helper.is_running()
    with running(make_brain(tmp_path / "b", example_agents=False)) as d:
        assert spawners(d.pid) == []


_DIES_WITH_ITS_AGENT = """
import asyncio, os, sys
from pathlib import Path
from ambient.runners import CommandRunner, RunRequest
from ambient.runners.runner_config import parse_runner_config
from ambient.runners.spawner import Spawner

async def main() -> None:
    runner = CommandRunner(spawner=Spawner(end_with_parent=sys.argv[1] == "end"), agent_user=None)
    cfg = parse_runner_config({"kind": "command", "argv": [sys.executable, "-c", "import time; time.sleep(60)"],
                               "confine": False})
    req = RunRequest(packet={}, agent="a", run_id="r", item="i", attempt=1, key="r/i/1", channel_token="",
                     brain=Path(sys.argv[2]))
    task = asyncio.create_task(runner.run(req, cfg))
    while not runner.live_pids:
        await asyncio.sleep(0.01)
    print("AGENT", runner.live_pids[0], flush=True)
    os.kill(os.getpid(), 9)  # the worker dies, with its agent running

asyncio.run(main())
"""


@pytest.mark.parametrize("end", [True, False])
def test_a_workers_agents_end_with_it_a_daemons_outlive_it(tmp_path: Path, end: bool) -> None:
    """A worker of the cluster starts its spawner with ``end_with_parent``: killed, its agents go with it (another
    worker takes their items over). A daemon's agents outlive it: its successor recognises and stops them."""
    import subprocess

    done = subprocess.run(
        [PY, "-c", _DIES_WITH_ITS_AGENT, "end" if end else "keep", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    pid = int(next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("AGENT ")))

    def gone() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    try:
        if end:
            assert wait_until(gone, timeout=20), "the agent outlived its worker"
        else:
            assert not gone()
    finally:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
