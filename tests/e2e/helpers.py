"""Harness for end-to-end tests of the real daemon: brains in tmp, the daemon as a subprocess, waits on disk.

The daemon runs as ``python -m ambient run --brain DIR --log-format json`` in its own session; its stderr
(JSON log lines) goes to a file the test reads. A fake ``NOTIFY_SOCKET`` (an ``AF_UNIX`` datagram socket in a
short tmp dir) records every sd_notify datagram with its arrival time. Nothing here sleeps to wait for an
event: every wait polls a condition on disk (or on the socket) with a timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from ambient.engine.runstate import RunState, fold
from ambient.storage.fsutil import atomic_write
from ambient.storage.journal import read_jsonl
from ambient.storage.paths import BrainPaths
from tests.acceptance.harness import JsonLog, pause_after

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_BRAIN = REPO / "examples" / "brain"
BAD_WORKFLOWS = REPO / "examples" / "workflows-bad"
PY = sys.executable


class WaitTimeout(AssertionError):
    """A condition did not hold in time (the message says which, and what was seen)."""


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.01) -> Any:
    """Poll ``predicate`` until it returns a truthy value (returned); raise :class:`WaitTimeout` after ``timeout``.
    A costly check is paced (tests/acceptance/harness.py, :func:`pause_after`), a cheap one (a file read) polled
    every ``interval``."""
    deadline = time.monotonic() + timeout
    while True:
        began = time.monotonic()
        value = predicate()
        if value:
            return value
        now = time.monotonic()
        if now >= deadline:
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(min(pause_after(now - began, interval), max(0.0, deadline - now)))


# ---------------------------------------------------------------- brains


def stub_agent_md(
    name: str, stub_args: Sequence[str] = (), *, timeout_s: float = 60, kill_grace_s: float = 2, confine: bool = False
) -> str:
    """An agent file whose command runner is :mod:`ambient.testing.stub_agent` with ``stub_args``."""
    return command_agent_md(
        name,
        ["{{python}}", "-m", "ambient.testing.stub_agent", *stub_args],
        timeout_s=timeout_s,
        kill_grace_s=kill_grace_s,
        confine=confine,
    )


#: A daemon run as root runs its agents as the unprivileged ``ambient-agent`` (docs/agents-and-runners.md, "Agents
#: never run as root"), which can neither write the tests' witnesses in pytest's temp folders (root's, 0700) nor
#: run an interpreter installed under /root: the tests' daemons run theirs as root without any capability
#: (``agent_user: root``, by its environment variable). tests/attacks/test_root_and_modes.py drives the default.
TEST_AGENT_ENV = {"AMBIENT_AGENT_USER": "root"} if os.geteuid() == 0 else {}


def command_agent_md(
    name: str,
    argv: Sequence[str],
    *,
    timeout_s: float = 60,
    kill_grace_s: float = 2,
    confine: bool = False,
    user: str | None = None,
) -> str:
    """An agent file (a project agent that talks with the orchestrator) run by the command runner with ``argv``.

    Unconfined unless asked: these fault tests' agents write their witnesses outside the brain (the acceptance
    tests run agents confined, as a user's are; tests/attacks/test_containment.py attacks the confinement itself).
    ``user``: the runner's ``user:`` (None: the daemon's ``agent_user``)."""
    return (
        "---\n"
        f"name: {name}\n"
        "type: agent\n"
        "status: active\n"
        f'description: "test agent {name}"\n'
        "brain:\n"
        "  version: 1\n"
        "  type: metier\n"
        "  scope: project\n"
        "  ipc:\n"
        "    receives_from: [orchestrator, human, ambient]\n"
        "    sends_to: [orchestrator, human, ambient]\n"
        "    zone_access: [project]\n"
        "    signals: [RETURN, ERROR, ESCALATE, BLOCKED_ON]\n"
        "ambient:\n"
        "  runner:\n"
        "    kind: command\n"
        f"    argv: {json.dumps(list(argv))}\n"
        f"    timeout_s: {timeout_s}\n"
        f"    kill_grace_s: {kill_grace_s}\n"
        f"    confine: {'true' if confine else 'false'}\n"
        f"{f'    user: {user}' + chr(10) if user else ''}"
        "---\n"
        f"# Agent: {name}\n\nA test agent.\n"
    )


def foreach_workflow(
    name: str,
    items: Iterable[str],
    *,
    agent: str = "stub",
    concurrency: int = 4,
    status: str | None = None,
    files: str | None = "projets/{{workflow}}/{{item}}.md",
    extra: str = "",
) -> str:
    """A for_each workflow over ``items`` spawning ``agent``; ``files`` is the templated scope (locks)."""
    lines = [f"workflow: {name}"]
    if status:
        lines.append(f"status: {status}")
    lines += [
        "for_each:",
        f"  items: {json.dumps(list(items))}",
        f"  spawn: {agent}",
        f"  concurrency: {concurrency}",
    ]
    if files:
        lines += ["  scope:", "    zone: project", f"    files: [{json.dumps(files)}]"]
    lines += ["  on_return:", "    success: → next_item", "    fail: → ESCALATE pilote"]
    return "\n".join(lines) + "\n" + extra


def make_brain(
    root: Path,
    *,
    example_agents: bool = True,
    example_workflows: bool = False,
    agents: Mapping[str, str] | None = None,
    config: str | None = None,
) -> BrainPaths:
    """A brain in ``root``: the example brain's agents and routing (optionally its workflows), plus ``agents``
    (name → agent file text), plus ``profil/ambient.yml`` when ``config`` is given."""
    if example_agents:
        shutil.copytree(EXAMPLE_BRAIN, root, symlinks=True)
        if not example_workflows:
            for wf in (root / "workflows").iterdir():
                wf.unlink()
    for sub in ("agents", "claims", "locks", "profil", "workflows"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for name, text in (agents or {}).items():
        (root / "agents" / f"{name}.md").write_text(text)
    if config is not None:
        (root / "profil" / "ambient.yml").write_text(config)
    return BrainPaths(root)


def drop(paths: BrainPaths, filename: str, text: str | bytes) -> float:
    """Drop a workflow file the way an editor saves (atomic rename); returns the wall time of the drop."""
    t = time.time()
    atomic_write(paths.workflows / filename, text)
    return t


# ---------------------------------------------------------------- reading results


def journals(paths: BrainPaths) -> dict[str, list[dict[str, Any]]]:
    """Every run journal's records, by run id."""
    out: dict[str, list[dict[str, Any]]] = {}
    if paths.run_journals.is_dir():
        for p in sorted(paths.run_journals.glob("*.jsonl")):
            out[p.stem] = read_jsonl(p).records
    return out


def runs(paths: BrainPaths, workflow: str | None = None) -> list[RunState]:
    """The folded state of every run (of ``workflow``), oldest first."""
    states = [fold(records) for records in journals(paths).values() if records]
    states = [s for s in states if workflow is None or s.workflow == workflow]
    return sorted(states, key=lambda s: s.started_at or "")


def events(paths: BrainPaths, workflow: str, ev: str | None = None) -> list[dict[str, Any]]:
    """The journal events of every run of ``workflow`` (of kind ``ev``)."""
    out: list[dict[str, Any]] = []
    for records in journals(paths).values():
        if records and records[0].get("workflow") == workflow:
            out += [r for r in records if ev is None or r.get("ev") == ev]
    return out


def finished_run(paths: BrainPaths, workflow: str) -> RunState | None:
    """The first finished run of ``workflow``, if any."""
    return next((s for s in runs(paths, workflow) if s.finished), None)


def run_records(paths: BrainPaths) -> list[dict[str, Any]]:
    """``.ambient/runs.jsonl``: one summary per finished run."""
    return read_jsonl(paths.runs_log).records if paths.runs_log.exists() else []


def witness(path: Path) -> list[tuple[str, int, str]]:
    """The stub agents' witness lines: (item, attempt, key)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        item, attempt, key = line.split(",", 2)
        out.append((item, int(attempt), key))
    return out


def lock_files(paths: BrainPaths) -> list[Path]:
    """Lock files left under ``locks/`` (temp files included)."""
    return sorted(p for p in paths.locks.rglob("*") if p.is_file()) if paths.locks.is_dir() else []


# ---------------------------------------------------------------- fake NOTIFY_SOCKET


@dataclass(frozen=True)
class Datagram:
    """One sd_notify datagram as received: monotonic arrival time and its ``KEY=VALUE`` lines."""

    t: float
    text: str

    @property
    def fields(self) -> dict[str, str]:
        return dict(line.split("=", 1) for line in self.text.splitlines() if "=" in line)

    def has(self, key: str, value: str | None = None) -> bool:
        f = self.fields
        return key in f and (value is None or f[key] == value)


class NotifySocket:
    """An ``AF_UNIX`` ``SOCK_DGRAM`` socket bound in a short tmp dir, read by a thread; stands in for systemd."""

    def __init__(self) -> None:
        # AF_UNIX paths are limited to 108 bytes: pytest's tmp dirs can be longer.
        self._dir = tempfile.mkdtemp(prefix="ambnotify-", dir="/tmp")
        self.path = os.path.join(self._dir, "notify.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.bind(self.path)
        self._sock.settimeout(0.05)
        self._lock = threading.Lock()
        self._messages: list[Datagram] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="fake-notify", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._messages.append(Datagram(time.monotonic(), data.decode("utf-8", "replace")))

    @property
    def messages(self) -> list[Datagram]:
        with self._lock:
            return list(self._messages)

    def index_of(self, key: str, value: str | None = None, start: int = 0) -> int | None:
        """Index of the first datagram from ``start`` on that sets ``key`` (to ``value``)."""
        for i, m in enumerate(self.messages[start:], start):
            if m.has(key, value):
                return i
        return None

    def wait_for(self, key: str, value: str | None = None, *, start: int = 0, timeout: float = 10) -> int:
        """Wait for a datagram setting ``key`` (to ``value``) at index ``start`` or later; its index."""
        found: list[int] = []

        def seen() -> bool:
            index = self.index_of(key, value, start)
            if index is not None:
                found.append(index)  # index 0 is falsy: keep it out of wait_for's truth test
            return index is not None

        wait_for(seen, timeout, f"sd_notify {key}={value}")
        return found[-1]

    def env(self, watchdog_usec: int | None = None) -> dict[str, str]:
        """Environment variables that point a daemon at this socket."""
        env = {"NOTIFY_SOCKET": self.path}
        if watchdog_usec is not None:
            env["WATCHDOG_USEC"] = str(watchdog_usec)
        return env

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close()
        shutil.rmtree(self._dir, ignore_errors=True)


# ---------------------------------------------------------------- the daemon subprocess


def _clean_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMBIENT_", "NOTIFY_SOCKET", "WATCHDOG_"))}
    env.update(TEST_AGENT_ENV)
    env.update(extra or {})
    return env


def ambient_cli(
    brain: Path,
    *args: str,
    timeout: float = 30,
    env: Mapping[str, str] | None = None,
    input_text: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ambient --brain BRAIN ARGS...`` to completion (``input_text`` on its stdin)."""
    return subprocess.run(
        [PY, "-m", "ambient", "--brain", str(brain), *args],
        input=input_text,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_clean_env(env),
        check=False,
    )


def is_spawner(proc: psutil.Process) -> bool:
    """The daemon's spawner process (ambient.runners.spawner), which starts the agents: not an agent itself."""
    try:
        return any(arg.endswith("spawner_helper.py") for arg in proc.cmdline())
    except psutil.Error:
        return False


class DaemonProcess:
    """``ambient run`` as a subprocess in its own session; JSON log lines collected in a file."""

    def __init__(
        self, brain: BrainPaths, *args: str, env: Mapping[str, str] | None = None, log_name: str = "daemon"
    ) -> None:
        self.paths = brain
        self.args = args
        self.env = _clean_env(env)
        n = 0
        while (brain.root.parent / f"{log_name}-{n}.log").exists():
            n += 1
        self.log_path = brain.root.parent / f"{log_name}-{n}.log"
        self._log = JsonLog(self.log_path)
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.known_children: set[int] = set()

    def start(self) -> DaemonProcess:
        """Start the daemon (returns at once; wait with :meth:`wait_ready`)."""
        argv = [PY, "-m", "ambient", "run", "--brain", str(self.paths.root), "--log-format", "json", *self.args]
        self._log = JsonLog(self.log_path)  # the file is written anew: read it from its start
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self.started_at = time.monotonic()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def lines(self) -> list[str]:
        """Every complete line the daemon wrote so far."""
        if not self.log_path.exists():
            return []
        text = self.log_path.read_text(errors="replace")
        return text.splitlines() if text.endswith("\n") else text.splitlines()[:-1]

    def records(self) -> list[dict[str, Any]]:
        """The JSON log lines, parsed (non-JSON lines are skipped; see :meth:`lines`); read incrementally."""
        return self._log.records()

    def logged(self, event: str, **match: Any) -> list[dict[str, Any]]:
        """Log records whose ``event`` is ``event`` and whose fields equal ``match``."""
        return [r for r in self.records() if r.get("event") == event and all(r.get(k) == v for k, v in match.items())]

    def wait_logged(self, event: str, timeout: float = 15, count: int = 1, **match: Any) -> list[dict[str, Any]]:
        """Wait until ``count`` records of ``event`` (matching ``match``) were logged."""

        def found() -> list[dict[str, Any]] | None:
            hits = self.logged(event, **match)
            return hits if len(hits) >= count else None

        return wait_for(
            found,
            timeout,
            f"{count} log line(s) {event} {match or ''}; tail: {self.tail()}",
        )

    def wait_ready(self, timeout: float = 15) -> None:
        """Wait for the ``daemon_ready`` log line (the daemon also sends READY=1 then)."""
        self.wait_logged("daemon_ready", timeout=timeout)

    def tail(self, n: int = 8) -> str:
        return " | ".join(self.lines()[-n:])

    def agent_pids(self) -> list[int]:
        """The daemon's agents (its descendants but the spawner) right now; remembered for the cleanup."""
        try:
            kids = [p.pid for p in psutil.Process(self.pid).children(recursive=True) if not is_spawner(p)]
        except psutil.NoSuchProcess:
            return []
        self.known_children.update(kids)
        return kids

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        """Wait for the daemon to exit; its exit code."""
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and wait; its exit code."""
        if self.proc is not None and self.proc.poll() is None:
            self.agent_pids()
            self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        """Last resort (test cleanup): SIGKILL the daemon's group and every agent it started."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.agent_pids()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        for pid in self.known_children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # agents lead their own process group (pgid == pid)
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
        # SIGKILL is asynchronous: return once every agent is gone (or a zombie nobody reaps).
        with contextlib.suppress(WaitTimeout):
            wait_for(lambda: not any(alive(p) for p in self.known_children), 5, "killed agents to die")


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextlib.contextmanager
def running(
    brain: BrainPaths,
    *args: str,
    env: Mapping[str, str] | None = None,
    ready: bool = True,
) -> Iterator[DaemonProcess]:
    """A started daemon (ready unless ``ready=False``), always killed with its agents at the end."""
    d = DaemonProcess(brain, *args, env=env).start()
    try:
        if ready:
            d.wait_ready()
        yield d
    finally:
        d.kill()
