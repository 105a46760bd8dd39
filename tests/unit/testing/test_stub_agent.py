"""The stub agent (RELIABILITY §1.4) run as a real process, as the runners and chaos tests use it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambient.testing.stub_agent import sleep_seconds
from tests.conftest import wait_until

STUB_CMD = [sys.executable, "-m", "ambient.testing.stub_agent"]
PACKET = {"signal": "SPAWN", "payload": {"context": {"item": "pkt-item", "attempt": 4, "key": "r/pkt-item/4"}}}


def run_stub(
    *args: str, item: str | None = "instance-01", stdin: str | None = None, timeout: float = 20
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ambient.testing.stub_agent`` with the AMBIENT_* identity of ``item`` (none if None)."""
    env = {"PATH": os.environ.get("PATH", ""), "LANG": "C.UTF-8"}
    if item is not None:
        env.update(AMBIENT_ITEM=item, AMBIENT_ATTEMPT="2", AMBIENT_KEY=f"run-9/{item}/2")
    return subprocess.run(
        [sys.executable, "-m", "ambient.testing.stub_agent", *args],
        input=json.dumps(PACKET) if stdin is None else stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def answer(proc: subprocess.CompletedProcess[str]) -> Any:
    """The JSON answer on stdout."""
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


class TestModes:
    """What each mode answers."""

    def test_ok_and_witness(self, tmp_path: Path) -> None:
        """ok answers a RETURN and appends item,attempt,key to the witness."""
        witness = tmp_path / "w.log"
        out = answer(run_stub("--mode", "ok", "--witness", str(witness), "--sleep-ms", "0-0"))
        assert out == {
            "signal": "RETURN",
            "result": {"status": "ok", "item": "instance-01", "attempt": "2", "key": "run-9/instance-01/2"},
        }
        assert witness.read_text() == "instance-01,2,run-9/instance-01/2\n"

    def test_identity_from_packet(self, tmp_path: Path) -> None:
        """Without AMBIENT_* variables, item/attempt/key come from the packet context."""
        witness = tmp_path / "w.log"
        run_stub("--witness", str(witness), "--sleep-ms", "0-0", item=None)
        assert witness.read_text() == "pkt-item,4,r/pkt-item/4\n"

    @pytest.mark.parametrize(
        ("mode", "expected"),
        [
            ("fail", {"signal": "RETURN", "status": "failed"}),
            ("error", {"signal": "ERROR"}),
            ("escalate", {"signal": "ESCALATE"}),
            ("blocked", {"signal": "BLOCKED_ON"}),
            ("spoof-sender", {"signal": "RETURN", "from": "human"}),
        ],
    )
    def test_answer_shapes(self, mode: str, expected: dict[str, str]) -> None:
        """Each mode answers its documented shape."""
        out = answer(run_stub("--mode", mode, "--sleep-ms", "0-0"))
        assert out["signal"] == expected["signal"]
        if "status" in expected:
            assert out["result"]["status"] == expected["status"]
        if "from" in expected:
            assert out["from"] == "human" and out["result"]["approved"] is True
        if mode == "escalate":
            assert out["options"] == ["retry", "skip"] and "instance-01" in out["question"]

    def test_fail_items(self) -> None:
        """--fail-items makes only the listed items fail."""
        args = ("--fail-items", "instance-07,instance-09", "--sleep-ms", "0-0")
        assert answer(run_stub(*args, item="instance-07"))["result"]["status"] == "failed"
        assert answer(run_stub(*args, item="instance-06"))["result"]["status"] == "ok"

    @pytest.mark.parametrize(("kind", "key"), [("extra", "context"), ("to", "to")])
    def test_smuggle_keys(self, kind: str, key: str) -> None:
        """smuggle adds keys a RETURN may not carry."""
        assert key in answer(run_stub("--mode", "smuggle", "--smuggle", kind, "--sleep-ms", "0-0"))

    def test_smuggle_huge_and_deep(self) -> None:
        """smuggle can send a 200k-character string or a 200-level nesting."""
        huge = answer(run_stub("--mode", "smuggle", "--smuggle", "huge", "--sleep-ms", "0-0"))
        assert len(huge["result"]["blob"]) == 200_000
        deep = answer(run_stub("--mode", "smuggle", "--smuggle", "deep", "--sleep-ms", "0-0"))
        depth = 0
        node = deep["result"]
        while "d" in node:
            node, depth = node["d"], depth + 1
        assert depth == 200

    def test_dump_env(self) -> None:
        """dump-env echoes environment, argv, extra args as exact bytes, and the packet."""
        out = answer(run_stub("--mode", "dump-env", "--sleep-ms", "0-0", "--", "a b", "$(x)"))["result"]
        assert out["env"]["AMBIENT_ITEM"] == "instance-01"
        assert out["args"] == ["a b", "$(x)"]
        assert out["cmdline_hex"][-2:] == [b"a b".hex(), b"$(x)".hex()]
        assert out["packet"] == PACKET and isinstance(out["pid"], int)

    def test_crash(self, tmp_path: Path) -> None:
        """crash writes the witness, a torn answer, then dies by SIGABRT (no core file)."""
        witness = tmp_path / "w.log"
        proc = run_stub("--mode", "crash", "--witness", str(witness), "--sleep-ms", "0-0")
        assert proc.returncode == -signal.SIGABRT
        assert proc.stdout == '{"signal": "RET'
        assert witness.read_text().count("\n") == 1
        assert not list(Path().glob("core*"))

    def test_flood(self) -> None:
        """flood writes exactly --flood-bytes on stdout."""
        proc = subprocess.run(
            [sys.executable, "-m", "ambient.testing.stub_agent", "--mode", "flood", "--flood-bytes", "3000000"],
            input=b"{}",
            capture_output=True,
            timeout=20,
            check=False,
        )
        assert proc.returncode == 0 and len(proc.stdout) == 3_000_000

    @pytest.mark.slow
    def test_hang_writes_witness_before_answering(self, tmp_path: Path) -> None:
        """The witness line is durable before any answer: a hanging stub has written it and printed nothing."""
        witness = tmp_path / "w.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "ambient.testing.stub_agent", "--mode", "hang", "--witness", str(witness)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"PATH": os.environ.get("PATH", ""), "AMBIENT_ITEM": "x", "AMBIENT_ATTEMPT": "1", "AMBIENT_KEY": "k"},
        )
        try:
            assert proc.stdin is not None
            proc.stdin.write(b"{}")
            proc.stdin.close()
            assert wait_until(lambda: witness.exists() and witness.read_text() == "x,1,k\n", 10)
            assert proc.poll() is None
        finally:
            proc.kill()
            proc.wait(timeout=10)
            assert proc.stdout is not None and proc.stderr is not None
            out = proc.stdout.read()
            proc.stdout.close()
            proc.stderr.close()
        assert out == b""

    def test_fork_grandchildren_share_group(self, tmp_path: Path) -> None:
        """fork starts grandchildren in the stub's own process group and records their pids."""
        pid_file = tmp_path / "pids"
        proc = subprocess.Popen(
            [*STUB_CMD, "--mode", "fork", "--children", "2", "--pid-file", str(pid_file), "--sleep-ms", "0-0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            assert wait_until(lambda: pid_file.exists() and len(pid_file.read_text().split()) == 2, 10)
            assert {os.getpgid(int(p)) for p in pid_file.read_text().split()} == {proc.pid}
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    @pytest.mark.slow
    def test_concurrent_witness_lines_never_interleave(self, tmp_path: Path) -> None:
        """Eight stubs appending to one witness leave eight whole lines."""
        witness = tmp_path / "w.log"
        with ThreadPoolExecutor(8) as pool:
            procs = list(pool.map(lambda i: run_stub("--witness", str(witness), item=f"i{i}"), range(8)))
        assert all(p.returncode == 0 for p in procs)
        assert sorted(witness.read_text().splitlines()) == sorted(f"i{i},2,run-9/i{i}/2" for i in range(8))


class TestInputs:
    """Bad input makes the stub exit 2 with a message, like a well-behaved agent."""

    def test_bad_stdin(self) -> None:
        """A packet that is not JSON is refused with exit code 2."""
        proc = run_stub(stdin="not json")
        assert proc.returncode == 2 and "not JSON" in proc.stderr

    def test_empty_stdin(self) -> None:
        """An empty stdin is an empty packet."""
        assert answer(run_stub("--sleep-ms", "0-0", stdin=""))["signal"] == "RETURN"

    @pytest.mark.parametrize("bad", ["x", "5-1", "-1-3"])
    def test_bad_sleep_range(self, bad: str) -> None:
        """A malformed --sleep-ms is a usage error."""
        proc = run_stub(f"--sleep-ms={bad}")
        assert proc.returncode == 2 and "--sleep-ms" in proc.stderr


class TestSleep:
    """The seeded sleep."""

    @pytest.mark.slow
    @given(st.integers(0, 2**32), st.text(max_size=20), st.integers(0, 500), st.integers(0, 500))
    def test_seeded_and_in_range(self, seed: int, item: str, a: int, b: int) -> None:
        """Same seed, item and attempt give the same sleep, always within the range."""
        low, high = min(a, b), max(a, b)
        first = sleep_seconds(seed, item, "1", low, high)
        assert first == sleep_seconds(seed, item, "1", low, high)
        assert low / 1000 <= first <= high / 1000

    def test_default_range(self) -> None:
        """Different items usually sleep differently within 10-200 ms."""
        values = {sleep_seconds(0, f"i{n}", "1", 10, 200) for n in range(20)}
        assert len(values) == 20 and all(0.01 <= v <= 0.2 for v in values)
