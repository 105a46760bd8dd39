"""systemd integration: sd_notify datagrams on a fake NOTIFY_SOCKET, the loop-driven watchdog, the shipped units."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import secrets
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from ambient.service import systemd
from tests.conftest import REPO, async_wait_until

UNITS = REPO / "examples" / "systemd"
MAX_EXPOSURE = 2.5


class FakeManager:
    """A bound AF_UNIX datagram socket standing in for systemd; a thread timestamps each datagram."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(0.05)
        self.received: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.received.append((time.monotonic(), data.decode()))

    def messages(self, count: int, timeout: float = 5.0) -> list[str]:
        """Wait until ``count`` datagrams arrived and return their texts."""
        deadline = time.monotonic() + timeout
        while len(self.received) < count and time.monotonic() < deadline:
            self._stop.wait(0.005)
        return [m for _, m in self.received]

    def close(self) -> None:
        """Stop the reader and close the socket."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No systemd variables leak in from the environment running the tests; failure-log state reset."""
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(systemd, "_failing", False)


@pytest.fixture
def manager(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeManager]:
    """A fake manager on a filesystem socket (short path: AF_UNIX paths are limited to 108 bytes)."""
    directory = tempfile.mkdtemp(prefix="sdn-", dir="/tmp")
    path = os.path.join(directory, "notify")
    fake = FakeManager(path)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    try:
        yield fake
    finally:
        fake.close()
        shutil.rmtree(directory, ignore_errors=True)


class TestNotify:
    def test_lifecycle_messages_arrive_in_order(self, manager: FakeManager) -> None:
        """READY/STATUS, STATUS, RELOADING+MONOTONIC_USEC, READY, WATCHDOG, EXTEND, STOPPING arrive in order."""
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        assert systemd.ready("started: 3 workflows")
        assert systemd.status("1 run in progress, 0 escalations")
        assert systemd.reloading()
        after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        assert systemd.ready()
        assert systemd.watchdog_ping()
        assert systemd.extend_timeout(20_000_000)
        assert systemd.stopping("draining 2 agents")
        got = manager.messages(7)
        assert got[0] == "READY=1\nSTATUS=started: 3 workflows"
        assert got[1] == "STATUS=1 run in progress, 0 escalations"
        reload_lines = got[2].split("\n")
        assert reload_lines[0] == "RELOADING=1"
        key, _, usec = reload_lines[1].partition("=")
        assert key == "MONOTONIC_USEC" and before <= int(usec) <= after
        assert got[3:] == [
            "READY=1",
            "WATCHDOG=1",
            "EXTEND_TIMEOUT_USEC=20000000",
            "STOPPING=1\nSTATUS=draining 2 agents",
        ]

    def test_status_text_cannot_inject_assignments(self, manager: FakeManager) -> None:
        """A newline in status text is flattened, so it cannot smuggle READY=1 or MAINPID=."""
        assert systemd.status("workflow x\nREADY=1\nMAINPID=1")
        assert manager.messages(1) == ["STATUS=workflow x READY=1 MAINPID=1"]

    def test_abstract_namespace_address(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """NOTIFY_SOCKET=@name reaches a socket bound in the abstract namespace."""
        name = f"ambient-test-{secrets.token_hex(6)}"
        fake = FakeManager("\0" + name)
        try:
            monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
            assert systemd.ready()
            assert fake.messages(1) == ["READY=1"]
        finally:
            fake.close()

    def test_without_systemd_everything_is_a_silent_no_op(self) -> None:
        """NOTIFY_SOCKET unset: every call returns False, logs nothing, and no watchdog applies."""
        with capture_logs() as logs:
            results = [
                systemd.notify("READY=1"),
                systemd.ready("x"),
                systemd.reloading(),
                systemd.status("x"),
                systemd.stopping(),
                systemd.extend_timeout(1),
                systemd.watchdog_ping(),
            ]
        assert results == [False] * 7 and logs == []
        assert systemd.watchdog_interval() is None

    def test_send_errors_never_raise_and_are_logged_once(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        """A dead socket makes notify return False; a run of failures logs one warning, recovery one info."""
        monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
        with capture_logs() as logs:
            assert [systemd.watchdog_ping() for _ in range(3)] == [False] * 3
        assert [e["event"] for e in logs] == ["sd_notify_failed"]
        assert logs[0]["log_level"] == "warning"

    def test_unsupported_address_family_is_logged(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """An address that is neither a path nor @abstract (e.g. vsock) returns False with a warning."""
        monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
        with capture_logs() as logs:
            assert systemd.ready() is False
        assert [e["event"] for e in logs] == ["sd_notify_unsupported_address"]


class TestWatchdog:
    @pytest.mark.parametrize(
        ("env", "expected"),
        [
            ({"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "30000000"}, 15.0),
            ({"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "<self>"}, 1.0),
            ({"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}, None),
            ({"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "x"}, None),
            ({"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "0"}, None),
            ({"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "soon"}, None),
            ({"NOTIFY_SOCKET": "/run/x"}, None),
            ({"WATCHDOG_USEC": "2000000"}, None),
        ],
    )
    def test_interval(self, env: dict[str, str], expected: float | None) -> None:
        """The interval is WATCHDOG_USEC/2 seconds, only for our pid and only under a notify socket."""
        env = {k: (str(os.getpid()) if v == "<self>" else v) for k, v in env.items()}
        assert systemd.watchdog_interval(env) == expected

    @pytest.mark.slow
    async def test_pings_from_the_loop_and_stop_while_it_is_blocked(
        self, manager: FakeManager, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """WATCHDOG=1 comes every WATCHDOG_USEC/2; a loop blocked for 3 s sends nothing for those seconds.

        Half a second between pings (not 0.2 s): on a loaded machine a timer of the loop fired 0.4 s late, which the
        bound of two intervals must absorb without hiding the blocked loop's silence (six intervals)."""
        monkeypatch.setenv("WATCHDOG_USEC", "1000000")
        interval = systemd.watchdog_interval()
        assert interval == 0.5
        stop = asyncio.Event()
        task = asyncio.create_task(systemd.watchdog_task(stop))
        assert await async_wait_until(lambda: len(manager.received) >= 4, timeout=10)
        blocked_at = len(manager.received)
        block_s = 3.0
        asyncio.get_running_loop().call_soon(time.sleep, block_s)  # the test hook: a loop that hangs
        assert await async_wait_until(lambda: len(manager.received) >= blocked_at + 4, timeout=15)
        stop.set()
        await asyncio.wait_for(task, timeout=2)
        times = [t for t, m in manager.received if m == "WATCHDOG=1"]
        assert len(times) == len(manager.received)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        block_gaps = [g for g in gaps if g >= 0.9 * block_s]
        normal = [g for g in gaps if g < 0.9 * block_s]
        print(f"watchdog: interval {interval}s, largest gap outside the block {max(normal):.3f}s")
        assert len(block_gaps) == 1  # exactly one silence: while the loop was blocked
        assert max(normal) < 2 * interval  # under WATCHDOG_USEC: systemd never fires outside the block
        assert abs(statistics.median(normal) - interval) < 0.25 * interval  # pings at the interval, not slower

    async def test_without_watchdog_the_task_only_waits_for_stop(self, manager: FakeManager) -> None:
        """No WATCHDOG_USEC: the task sends nothing and returns once stopped."""
        stop = asyncio.Event()
        task = asyncio.create_task(systemd.watchdog_task(stop))
        await asyncio.sleep(0)
        assert not task.done()
        stop.set()
        await asyncio.wait_for(task, timeout=2)
        assert manager.received == []


# --------------------------------------------------------------------------- shipped unit files

ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")


def _stub(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def _system_unit_copy(tmp_path: Path) -> Path:
    """The system unit with ExecStart pointing at a stub (verify checks that the binary exists)."""
    stub = _stub(tmp_path / "venv" / "bin" / "ambient")
    text = (UNITS / "ambient.service").read_text()
    assert "/opt/ambient/venv/bin/ambient run --brain /srv/brain" in text
    unit = tmp_path / "units" / "ambient.service"
    unit.parent.mkdir()
    unit.write_text(text.replace("/opt/ambient/venv/bin/ambient", str(stub)))
    return unit


def _analyze(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    assert ANALYZE is not None
    return subprocess.run([ANALYZE, *args], capture_output=True, text=True, timeout=60, env=env, check=False)


def _our_lines(output: str) -> list[str]:
    # Only lines about our unit count: another unit on the host may have its own warnings.
    return [line for line in output.splitlines() if "ambient" in line]


@needs_analyze
def test_system_unit_verifies_without_warnings(tmp_path: Path) -> None:
    """`systemd-analyze verify` on the shipped system unit exits 0 with no warning about it."""
    unit = _system_unit_copy(tmp_path)
    res = _analyze("verify", str(unit))
    assert res.returncode == 0, res.stderr
    assert _our_lines(res.stdout + res.stderr) == []


@needs_analyze
def test_user_unit_verifies_without_warnings(tmp_path: Path) -> None:
    """`systemd-analyze --user verify` on the shipped user unit exits 0 with no warning about it."""
    home = tmp_path / "home"
    _stub(home / ".local" / "share" / "ambient" / "venv" / "bin" / "ambient")
    (home / "brain").mkdir()
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    unit = tmp_path / "units" / "ambient.service"
    unit.parent.mkdir()
    unit.write_text((UNITS / "ambient-user.service").read_text())
    env = dict(os.environ, HOME=str(home), XDG_RUNTIME_DIR=str(runtime))
    res = _analyze("--user", "verify", str(unit), env=env)
    if "Failed to initialize manager" in res.stderr:
        pytest.skip(f"no user manager can be simulated here: {res.stderr.strip()}")
    assert res.returncode == 0, res.stderr
    assert _our_lines(res.stdout + res.stderr) == []


@needs_analyze
def test_system_unit_exposure_is_at_most_2_5(tmp_path: Path) -> None:
    """`systemd-analyze security --offline=true` rates the shipped unit's exposure at 2.5 or less."""
    unit = _system_unit_copy(tmp_path)
    res = _analyze("security", "--offline=true", str(unit))
    assert res.returncode == 0, res.stderr
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", res.stdout)
    assert match is not None, res.stdout[-500:]
    exposure = float(match.group(1))
    print(f"systemd-analyze security exposure: {exposure}")
    assert exposure <= MAX_EXPOSURE


def test_units_carry_the_required_settings() -> None:
    """Both units: Type=notify, NotifyAccess=main, watchdog, restart, KillMode=mixed, credential, stop timeout."""
    required = {
        "Type": "notify",
        "NotifyAccess": "main",
        "WatchdogSec": "30s",
        "Restart": "on-failure",
        "RestartSec": "5s",
        "KillMode": "mixed",
        "TimeoutStopSec": "30s",
    }
    for name in ("ambient.service", "ambient-user.service"):
        settings: dict[str, str] = {}
        for line in (UNITS / name).read_text().splitlines():
            if "=" in line and not line.lstrip().startswith("#"):
                key, _, value = line.partition("=")
                settings.setdefault(key.strip(), value.strip())
        for key, value in required.items():
            assert settings.get(key) == value, (name, key)
        assert settings["LoadCredential"].startswith("telegram-token:")
        assert "Environment" not in settings or "token" not in settings["Environment"].lower()
    system = (UNITS / "ambient.service").read_text()
    for line in ("StateDirectory=ambient", "ReadWritePaths=/srv/brain", "ProtectSystem=strict", "User=ambient"):
        assert line in system


def _worker_unit_copy(tmp_path: Path) -> Path:
    """The worker's unit with ExecStart pointing at a stub (verify checks that the binary exists)."""
    stub = _stub(tmp_path / "venv" / "bin" / "ambient")
    unit = tmp_path / "units" / "ambient-worker.service"
    unit.parent.mkdir()
    unit.write_text((UNITS / "ambient-worker.service").read_text().replace("/opt/ambient/venv/bin/ambient", str(stub)))
    return unit


@needs_analyze
def test_worker_unit_verifies_and_its_exposure_is_at_most_2_5(tmp_path: Path) -> None:
    """The worker's unit runs agents as the daemon's does: same checks, same bound on its exposure."""
    unit = _worker_unit_copy(tmp_path)
    res = _analyze("verify", str(unit))
    assert res.returncode == 0, res.stderr
    assert _our_lines(res.stdout + res.stderr) == []
    res = _analyze("security", "--offline=true", str(unit))
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", res.stdout)
    assert match is not None, res.stdout[-500:]
    assert float(match.group(1)) <= MAX_EXPOSURE


def test_the_shipped_worker_unit_is_the_one_printed_for_its_example_host() -> None:
    from ambient.cluster.unit import worker_unit

    text = worker_unit(
        "/opt/ambient/venv/bin/ambient",
        "/srv/brain",
        ["nats://10.0.0.5:4222"],
        ["coder"],
        slots=2,
        creds="/etc/ambient/worker.creds",
    )
    assert (UNITS / "ambient-worker.service").read_text() == text
    plain = worker_unit("/a/ambient", "/b", ["nats://127.0.0.1:4222"], ["x"])
    assert "LoadCredential=" not in plain and " --creds %d" not in plain
    with pytest.raises(ValueError, match="cannot be written in a unit"):
        worker_unit("/a/ambient", "/b c", ["nats://127.0.0.1:4222"], ["x"])
