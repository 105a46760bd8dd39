"""Shared helpers of the benchmarks: brains in a temp dir, the real daemon as a subprocess, journal timings."""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PY = sys.executable


def agent_md(name: str, runner: Mapping[str, Any]) -> str:
    """An agent file that ambient may SPAWN, with the given ``ambient.runner`` block."""
    return (
        "---\n"
        f"name: {name}\n"
        "type: agent\nstatus: active\n"
        f'description: "benchmark agent {name}"\n'
        "brain:\n  version: 1\n  type: metier\n  scope: project\n  ipc:\n"
        "    receives_from: [ambient, orchestrator, human]\n"
        "    sends_to: [ambient, orchestrator, human]\n"
        "    zone_access: [project]\n"
        "    signals: [RETURN, ERROR, ESCALATE, BLOCKED_ON]\n"
        "ambient:\n  runner:\n" + "".join(f"    {k}: {json.dumps(v)}\n" for k, v in runner.items()) + "---\n"
        f"# {name}\n"
    )


def foreach_yaml(name: str, items: Sequence[str], agent: str, concurrency: int) -> str:
    """A for_each workflow spawning ``agent`` over ``items`` (one lock per item: the scope is templated)."""
    return (
        f"workflow: {name}\n"
        "for_each:\n"
        f"  items: {json.dumps(list(items))}\n"
        f"  spawn: {agent}\n"
        f"  concurrency: {concurrency}\n"
        "  scope:\n    zone: project\n"
        f'    files: ["projects/{name}/{{{{item}}}}.md"]\n'
    )


def new_brain(base: Path, name: str, agents: Mapping[str, str], concurrency: int = 256) -> Path:
    """An empty brain with ``agents`` (name → agent file text). Its daemon-wide ``concurrency:`` cap is set to
    ``concurrency`` (the most the settings allow by default), so a workflow's own value is what a bench measures."""
    root = base / name
    for sub in ("agents", "claims", "locks", "profil", "workflows"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "profil" / "ambient.yml").write_text(f"concurrency: {concurrency}\n")
    for agent, text in agents.items():
        (root / "agents" / f"{agent}.md").write_text(text)
    return root


def daemon_env(extra_path: Iterable[Path] = ()) -> dict[str, str]:
    """The environment for the daemon subprocess: ours minus AMBIENT_*, plus PYTHONPATH entries."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMBIENT_", "NOTIFY_SOCKET", "WATCHDOG_"))}
    paths = [str(p) for p in extra_path]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def daemon_argv(root: Path, *args: str) -> list[str]:
    """``python -m ambient run`` on ``root`` with JSON logs at warning level."""
    return [PY, "-m", "ambient", "run", "--brain", str(root), "--log-format", "json", "--log-level", "warning", *args]


class ServingDaemon:
    """The real daemon serving ``root`` (not ``--until-idle``): workflows dropped into it one after another.

    A context manager: the daemon is up (``daemon_ready`` logged) inside it and stopped with SIGTERM after it.
    :meth:`run` times a run on this daemon, so that runs after the first are timed on a warm one (its lock spare
    pool filled, its caches made), as the peers time their runs after a warm-up run.
    """

    def __init__(self, root: Path, env: Mapping[str, str], log: Path) -> None:
        self.root, self.env, self.log = root, dict(env), log
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ServingDaemon:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                daemon_argv(self.root, "--log-level", "info"),
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while b"daemon_ready" not in self.log.read_bytes():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.__exit__()
                raise RuntimeError(f"the daemon did not get ready: {self.log.read_bytes()[-2000:]!r}")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)

    def run(self, name: str, workflow_text: str, timeout: float = 600) -> list[dict[str, Any]]:
        """Drop ``workflows/<name>.yml`` and wait until its run is summarised in runs.jsonl; its journal records.

        The wait looks at runs.jsonl's size every 20 ms (a ``stat``: reading the journal meanwhile would take CPU
        from the run on a 2-core machine).
        """
        from ambient.storage.fsutil import atomic_write

        runs_log = self.root / ".ambient" / "runs.jsonl"
        atomic_write(self.root / "workflows" / f"{name}.yml", workflow_text)
        deadline = time.monotonic() + timeout
        seen = -1
        while True:
            size = runs_log.stat().st_size if runs_log.exists() else 0
            if size != seen:
                seen = size
                # Whole lines only: a 1,000-item run's summary is ~200 KB, and it may be read while being written.
                for line in runs_log.read_bytes().split(b"\n")[:-1] if size else []:
                    summary = json.loads(line) if line.strip() else {}
                    if summary.get("workflow") == name:
                        journal = self.root / ".ambient" / "runs" / f"{summary['run_id']}.jsonl"
                        return [json.loads(rec) for rec in journal.read_text().splitlines() if rec.strip()]
            if time.monotonic() > deadline or (self.proc is not None and self.proc.poll() is not None):
                raise RuntimeError(f"{name}: no finished run within {timeout:g} s")
            time.sleep(0.02)


def journal_records(root: Path) -> list[list[dict[str, Any]]]:
    """Every run journal of the brain, parsed."""
    out = []
    for p in sorted((root / ".ambient" / "runs").glob("*.jsonl")):
        out.append([json.loads(line) for line in p.read_text().splitlines() if line.strip()])
    return out


def epoch(iso: str) -> float:
    """Seconds since the epoch of an ISO timestamp from a journal."""
    return datetime.fromisoformat(iso).timestamp()


def run_span(records: list[dict[str, Any]]) -> float:
    """Seconds from a run's ``started`` event to its ``finished_run`` event."""
    start = next(r for r in records if r.get("ev") == "started")
    end = next(r for r in records if r.get("ev") == "finished_run")
    return epoch(end["at"]) - epoch(start["at"])


def median(values: Iterable[float]) -> float:
    """Median (NaN for nothing)."""
    vals = list(values)
    return statistics.median(vals) if vals else float("nan")


class TempDir:
    """A temp dir removed at exit unless ``keep``."""

    def __init__(self, where: str | None, keep: bool = False) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="ambient-bench-", dir=where))
        self.path.chmod(0o711)  # a root daemon runs agents as its agent user: they must reach the brains inside
        self.keep = keep

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc: object) -> None:
        if not self.keep:
            shutil.rmtree(self.path, ignore_errors=True)


def peer_summary(stdout: str) -> dict[str, Any] | None:
    """The ``JSON {...}`` summary line printed by the peers in /work/shared/bench/peers."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("JSON "):
            data: dict[str, Any] = json.loads(line[5:])
            return data
    return None


class Steal:
    """The share of CPU time the hypervisor gave to others while a part ran (``steal`` in /proc/stat).

    On a shared VM it swings from a few % to over a third in minutes (2026-12-01: every figure, the peers' included,
    halved in such minutes); printed beside each part so that a slow figure can be told from a slow machine.
    None where /proc/stat has no steal column.
    """

    def __init__(self) -> None:
        self._start = _cpu_times()
        self.share: float | None = None

    def stop(self) -> str:
        """Stop counting; the figure as text for a report line ("" when unknown)."""
        end = _cpu_times()
        if self._start is None or end is None or end[1] <= self._start[1]:
            return ""
        self.share = (end[0] - self._start[0]) / (end[1] - self._start[1])
        return f" [steal {self.share * 100:.0f} %]"


def _cpu_times() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs, or None."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if fields[0] != "cpu" or len(fields) < 9:
        return None
    values = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return values[7], sum(values)


def creation_cost(base: Path, files: int = 200) -> float:
    """µs to create and write one small file in a new folder under ``base`` now (the files stay until ``base`` goes).

    What one claim file costs the kernel depends on what was deleted nearby lately (see :func:`filesystem_note`):
    17-30 µs on a quiet ext4 here, ~340 µs right after thousands of deletes (bench/README.md, finding 44). Printed
    beside the figures so that a run can be read with it.
    """
    folder = base / ".creation-probe"
    folder.mkdir()
    t0 = time.perf_counter()
    for i in range(files):
        fd = os.open(folder / f"f{i}.yml", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, b"x" * 512)
        finally:
            os.close(fd)
    return (time.perf_counter() - t0) / files * 1e6


def filesystem_note(path: Path) -> str | None:
    """A warning when ``path`` is on ext4 without a journal, where figures swing with the files deleted lately.

    There ext4's inode allocator skips every inode freed in the last minute (five while its table block is not
    written back), one lookup each, before it takes a free one: after a large delete nearby, each file created
    costs up to ~0.3 ms of kernel CPU (perf: ``find_inode_bit`` → ``recently_deleted``, 40-70 % of the claims
    writer's samples and up to 17 % of the event loop's in such runs; none in others).
    """
    try:
        target = os.stat(path).st_dev
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            major, minor = (int(x) for x in fields[2].split(":"))
            fstype, source = fields[fields.index("-") + 1], fields[fields.index("-") + 2]
            if os.makedev(major, minor) != target or fstype != "ext4":
                continue
            device, jbd2 = Path(source).name, Path("/proc/fs/jbd2")
            if not (jbd2.is_dir() and any(p.name.startswith(f"{device}-") for p in jbd2.iterdir())):
                return (
                    f"note: {path} is on ext4 without a journal ({source}): file creation slows for minutes "
                    "after large deletes nearby; figures swing with it (bench/README.md, finding 23)"
                )
            return None
    except (OSError, ValueError, IndexError):
        return None
    return None
