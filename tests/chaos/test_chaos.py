"""R-01: kill -9 the real daemon mid fan-out, again and again, and check exactly-once completion.

Each iteration drops a for_each workflow (stub agents sleeping a seeded 10-200 ms, ``--witness``) into a fresh
brain, starts ``ambient run --until-idle`` in its own session, kills it at seeded random times and restarts it
until the run finishes. K1 kills the daemon only (its agents are orphaned, as outside systemd); K2 kills the
daemon and every process it started (systemd's ``KillMode=mixed`` final SIGKILL to the cgroup: agents lead
their own process groups, so a bare ``killpg`` of the daemon's group would not reach them).

Checked on disk after each iteration: one run, every item done, exactly one successful ``finished`` per item
in the journal, one summary in ``runs.jsonl``; witness lines per item ≤ 1 + kills that found it in flight;
items done before a kill never run again; every attempt an agent ran was ``accepted`` first; item claims agree
with the journal and every claim/lock file loads; no ``*.tmp.*`` and no lock left. The figures of
RELIABILITY §1.5 R-01 are printed (``pytest -s``). CI profile: 6 iterations of 30 items; ``pytest -m chaos``:
100 items, 25 K1 + 25 K2 iterations. The seed is ``AMBIENT_CHAOS_SEED`` (default below), printed.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import statistics
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest

from ambient.claims.lockfile import parse_lock
from ambient.claims.store import ClaimStore
from ambient.engine.runstate import fold
from ambient.storage.fsutil import TMP_MARK
from ambient.storage.journal import read_jsonl
from ambient.storage.paths import BrainPaths
from ambient.storage.yamlfile import load_file
from tests.e2e.helpers import DaemonProcess, foreach_workflow, make_brain, stub_agent_md, wait_for, witness

DEFAULT_SEED = 20261130
WORKFLOW = "chaos"


# ---------------------------------------------------------------- records of one iteration


@dataclass
class Orphan:
    """An agent left running by a K1 kill, watched until it exits."""

    pid: int
    item: str
    attempt: int
    exited_at: float | None = None


@dataclass
class Kill:
    """One kill: when, how, and what the journal showed in flight / done at that moment."""

    mode: str
    at: float
    in_flight: set[str]
    done: set[str]
    witness_at_kill: Counter[str]
    orphans: list[Orphan] = field(default_factory=list)


@dataclass
class Iteration:
    """Everything one iteration observed, for the checks and the figures."""

    seed: int
    mode: str
    n_items: int
    root: Path
    kills: list[Kill] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)  # wall time of each daemon start
    final_rc: int | None = None
    total_s: float = 0.0
    last_log: str = ""  # tail of the last daemon's log, for a failure message


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _journal(paths: BrainPaths) -> list[dict[str, Any]]:
    files = sorted(paths.run_journals.glob("*.jsonl")) if paths.run_journals.is_dir() else []
    return [r for f in files for r in read_jsonl(f).records]


def _agent_identity(proc: psutil.Process) -> tuple[str, int] | None:
    try:
        env = proc.environ()
    except (psutil.Error, OSError):
        return None
    if "AMBIENT_ITEM" not in env:
        return None
    return env["AMBIENT_ITEM"], int(env.get("AMBIENT_ATTEMPT", "0") or 0)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _watch_orphans(orphans: list[Orphan]) -> threading.Thread:
    """Record when each orphan exits (polls every 2 ms; a thread, so the test goes on restarting)."""
    procs: dict[int, psutil.Process] = {}
    for o in orphans:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs[o.pid] = psutil.Process(o.pid)

    def watch() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pending = [o for o in orphans if o.exited_at is None]
            if not pending:
                return
            for o in pending:
                p = procs.get(o.pid)
                if p is None or _gone(p):
                    o.exited_at = time.time()
            time.sleep(0.002)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def _kill(d: DaemonProcess, mode: str) -> list[Orphan]:
    """K1: SIGKILL the daemon only; K2: freeze it, then SIGKILL it and every process it started."""
    pid = d.pid
    if mode == "K1":
        kids = _descendants(pid)
        os.kill(pid, signal.SIGKILL)
        d.wait(timeout=10)
        orphans = []
        for p in kids:
            ident = _agent_identity(p)
            if ident is not None and not _gone(p):
                orphans.append(Orphan(p.pid, ident[0], ident[1]))
            d.known_children.add(p.pid)
        return orphans
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGSTOP)  # frozen: no agent can be started between the snapshot and the kill
    kids = _descendants(pid)
    for p in kids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)  # agents lead their own process group (pgid == pid)
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    d.wait(timeout=10)
    return []


def kill_record(paths: BrainPaths, wit: Path, mode: str, orphans: list[Orphan] | None = None) -> Kill:
    """A kill as the journal on disk shows it now: the items in flight and done, the witness lines so far."""
    records = _journal(paths)
    state = fold(records) if records else None
    return Kill(
        mode=mode,
        at=time.time(),
        in_flight={i.name for i in state.in_flight()} if state else set(),
        done={i.name for i in state.items if i.status == "done"} if state else set(),
        witness_at_kill=Counter(w[0] for w in witness(wit)),
        orphans=orphans or [],
    )


def wait_last(d: DaemonProcess, it: Iteration) -> None:
    """Wait for the last daemon of an iteration (the one no kill came for) to finish the run and exit."""
    try:
        it.final_rc = d.wait(timeout=120)
    finally:
        d.kill()
        it.last_log = d.tail(5)


def run_iteration(
    base: Path,
    seed: int,
    mode: str,
    n_items: int,
    max_kills: int,
    window: tuple[float, float],
    *,
    sleep_ms: str = "10-200",
    concurrency: int = 4,
    kill_with_agents: bool = False,
) -> Iteration:
    """One brain, one fan-out, 1..max_kills kills at seeded random times, restarts until the run is done
    (``kill_with_agents``: the time counted from the moment this start's agents run, so that a loaded machine's
    slow start does not move every kill before the first agent).

    Every agent holds its item's overlap witness (``--overlap-dir``): two agents of one item at once, across
    kills and restarts, leave a line in ``overlaps.log``.
    """
    rng = random.Random(seed)
    root = base / f"it-{seed}-{mode}"
    wit = base / f"witness-{seed}-{mode}.log"
    lockdir = base / f"overlap-{seed}-{mode}"
    lockdir.mkdir()
    stub_args = ["--witness", str(wit), "--seed", str(seed), "--sleep-ms", sleep_ms, "--overlap-dir", str(lockdir)]
    stub = stub_agent_md("stub", stub_args, kill_grace_s=1)
    paths = make_brain(root, example_agents=False, agents={"stub": stub}, config=f"concurrency: {concurrency}\n")
    items = [f"item-{i:03d}" for i in range(n_items)]
    (paths.workflows / f"{WORKFLOW}.yml").write_text(foreach_workflow(WORKFLOW, items, concurrency=concurrency))
    it = Iteration(seed, mode, n_items, root)
    planned = rng.randint(1, max_kills)
    watchers: list[threading.Thread] = []
    t0 = time.monotonic()
    while True:
        d = DaemonProcess(paths, "--until-idle").start()
        it.starts.append(time.time())
        if len(it.kills) < planned:
            delay = rng.uniform(*window)
            if kill_with_agents:
                wait_for(lambda: d.agent_pids() or d.proc is None or d.proc.poll() is not None, 60, "agents running")
            try:
                it.final_rc = d.wait(timeout=delay)
                break  # finished before the kill came
            except subprocess.TimeoutExpired:
                pass
            orphans = _kill(d, mode)
            it.kills.append(kill_record(paths, wit, mode, orphans))
            if orphans:
                watchers.append(_watch_orphans(orphans))
            continue
        wait_last(d, it)
        break
    it.total_s = time.monotonic() - t0
    for w in watchers:
        w.join(timeout=30)
    return it


# ---------------------------------------------------------------- checks


def check_iteration(it: Iteration) -> list[str]:
    """Every violation of R-01's pass criteria in one iteration (empty: pass)."""
    paths = BrainPaths(it.root)
    bad: list[str] = []
    tag = f"[seed {it.seed} {it.mode}]"
    if it.final_rc != 0:
        bad.append(f"{tag} last daemon exited {it.final_rc}: {it.last_log}")
    journals = sorted(paths.run_journals.glob("*.jsonl")) if paths.run_journals.is_dir() else []
    if len(journals) != 1:
        return [*bad, f"{tag} expected exactly one run of {WORKFLOW}, found {len(journals)} journal(s)"]
    res = read_jsonl(journals[0])
    records = res.records
    state = fold(records)
    if not state.finished or state.outcome != "success":
        bad.append(f"{tag} run not finished with success: {state.outcome}")
    not_done = [i.name for i in state.items if i.status != "done"]
    if not_done:
        bad.append(f"{tag} items not done: {not_done[:5]}")
    successes = Counter(r["item"] for r in records if r.get("ev") == "finished" and r.get("result") == "success")
    dup = {k: v for k, v in successes.items() if v != 1}
    if dup or len(successes) != it.n_items:
        bad.append(f"{tag} successful finished records per item must be exactly 1: {dup or len(successes)}")
    # No attempt after an item's success.
    done_at: dict[str, int] = {}
    for n, r in enumerate(records):
        if r.get("ev") == "finished" and r.get("result") == "success":
            done_at.setdefault(r["item"], n)
        elif r.get("ev") == "accepted" and r.get("item") in done_at:
            bad.append(f"{tag} {r['item']} accepted again after it succeeded")
    # Witness: every run was accepted first; at most 1 + kills that found the item in flight.
    wit = witness(it.root.parent / f"witness-{it.seed}-{it.mode}.log")
    accepted_keys = {r.get("key") for r in records if r.get("ev") == "accepted"}
    phantom = [w for w in wit if w[2] not in accepted_keys]
    if phantom:
        bad.append(f"{tag} agents ran attempts that were never accepted: {phantom[:3]}")
    runs_per_item = Counter(w[0] for w in wit)
    for name in (i.name for i in state.items):
        in_flight_kills = sum(1 for k in it.kills if name in k.in_flight)
        if runs_per_item[name] > 1 + in_flight_kills:
            bad.append(f"{tag} {name} ran {runs_per_item[name]} times with {in_flight_kills} kill(s) in flight")
        if runs_per_item[name] < 1:
            bad.append(f"{tag} {name} never ran (no witness line)")
    for k in it.kills:
        for name in k.done:
            if runs_per_item[name] != k.witness_at_kill[name]:
                bad.append(f"{tag} {name} was done before a kill and ran again")
    overlap_log = it.root.parent / f"overlap-{it.seed}-{it.mode}" / "overlaps.log"
    if overlap_log.exists() and overlap_log.read_text():
        bad.append(f"{tag} two agents of one item ran at once: {overlap_log.read_text().splitlines()[:5]}")
    # One summary record.
    summaries = [r for r in read_jsonl(paths.runs_log).records if r.get("run_id") == state.run_id]
    if len(summaries) != 1:
        bad.append(f"{tag} {len(summaries)} summaries of {state.run_id} in runs.jsonl, expected 1")
    # Claims and locks: every file loads; item claims agree with the journal; nothing left behind.
    loaded = ClaimStore(paths).load()
    errors = [str(p) for p in loaded.problems if p.severity == "error"]
    if errors:
        bad.append(f"{tag} claim files that do not load: {errors[:3]}")
    for item in state.items:
        sess = f"{state.run_id}-item-{item.index + 1:03d}"
        claim = loaded.claims.get(sess)
        if claim is None or claim.status != "closed":
            bad.append(f"{tag} claim {sess} is {claim.status if claim else 'missing'}, journal says done")
    run_claim = loaded.claims.get(state.run_id)
    if run_claim is None or run_claim.status != "closed":
        bad.append(f"{tag} run claim {state.run_id} is {run_claim.status if run_claim else 'missing'}")
    for f in sorted(paths.locks.iterdir()):
        if f.name.endswith(".lock"):
            bad.append(f"{tag} lock left held after the run: {f.name}")
            with contextlib.suppress(Exception):
                parse_lock(f.read_bytes(), f.name)
    for f in sorted(paths.claims.iterdir()):
        if f.suffix in (".yml", ".yaml") and not f.name.startswith("."):
            try:
                load_file(f, max_bytes=64 * 1024)
            except Exception as exc:
                bad.append(f"{tag} {f.name} does not load: {exc}")
    for d in (paths.claims, paths.locks, paths.state, paths.run_journals):
        left = [p.name for p in d.iterdir() if TMP_MARK in p.name]
        if left:
            bad.append(f"{tag} temp files left in {d.name}/: {left[:3]}")
    return bad


# ---------------------------------------------------------------- figures


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def figures(iterations: list[Iteration], seed: int) -> dict[str, Any]:
    """R-01's figures over every iteration."""
    kills = sum(len(it.kills) for it in iterations)
    total_items = sum(it.n_items for it in iterations)
    reruns = 0
    max_reruns = 0
    dup_completions = 0
    progress: list[float] = []
    orphans = 0
    overlaps = 0
    kills_in_flight = 0
    witnessed = 0
    for it in iterations:
        paths = BrainPaths(it.root)
        records = _journal(paths)
        overlap_log = it.root.parent / f"overlap-{it.seed}-{it.mode}" / "overlaps.log"
        witnessed += len(overlap_log.read_text().splitlines()) if overlap_log.exists() else 0
        wit = Counter(w[0] for w in witness(it.root.parent / f"witness-{it.seed}-{it.mode}.log"))
        reruns += sum(1 for v in wit.values() if v > 1)
        max_reruns = max([max_reruns, *(v - 1 for v in wit.values())])
        ok = Counter(r["item"] for r in records if r.get("ev") == "finished" and r.get("result") == "success")
        dup_completions += sum(v - 1 for v in ok.values() if v > 1)
        finished_times = sorted(_epoch(r["at"]) for r in records if r.get("ev") in ("finished", "finished_run"))
        for start in it.starts[1:]:
            nxt = next((t for t in finished_times if t >= start), None)
            if nxt is not None:
                progress.append(nxt - start)
        accepted = [
            (r["item"], int(r.get("attempt", 0)), _epoch(r["at"])) for r in records if r.get("ev") == "accepted"
        ]
        for k in it.kills:
            kills_in_flight += bool(k.in_flight)
            for o in k.orphans:
                orphans += 1
                # Run again after the kill: the same attempt (its key kept, an interrupted attempt is redone) or a
                # later one.
                again = [t for item, att, t in accepted if item == o.item and att >= o.attempt and t > k.at]
                if again and o.exited_at is not None and min(again) < o.exited_at:
                    overlaps += 1
    return {
        "seed": seed,
        "iterations": len(iterations),
        "K1": sum(1 for it in iterations if it.mode == "K1"),
        "K2": sum(1 for it in iterations if it.mode == "K2"),
        "kills": kills,
        "kills_mid_fanout": kills_in_flight,
        "items": total_items,
        "items_rerun": reruns,
        "items_rerun_pct": round(100 * reruns / total_items, 2) if total_items else 0.0,
        "max_reruns_one_item": max_reruns,
        "duplicate_completions": dup_completions,
        "restart_to_progress_p50_s": round(_pct(progress, 0.5), 3),
        "restart_to_progress_p95_s": round(_pct(progress, 0.95), 3),
        "run_time_median_s": round(statistics.median(it.total_s for it in iterations), 2),
        "total_s": round(sum(it.total_s for it in iterations), 1),
        "orphans_K1": orphans,
        "orphans_running_when_item_rerun": overlaps,
        "overlaps_witnessed": witnessed,
    }


def _profile(
    base: Path,
    seed: int,
    modes: list[str],
    n_items: int,
    max_kills: int,
    window: tuple[float, float],
    **options: Any,
) -> tuple[list[Iteration], list[str], dict[str, Any]]:
    iterations: list[Iteration] = []
    violations: list[str] = []
    for n, mode in enumerate(modes):
        it = run_iteration(base, seed + n, mode, n_items, max_kills, window, **options)
        iterations.append(it)
        violations += check_iteration(it)
    figs = figures(iterations, seed)
    print("\nR-01 " + " | ".join(f"{k}={v}" for k, v in figs.items()))
    return iterations, violations, figs


def _seed() -> int:
    return int(os.environ.get("AMBIENT_CHAOS_SEED", DEFAULT_SEED))


# ---------------------------------------------------------------- tests


def test_kill9_mid_fanout_ci_profile(tmp_path: Path) -> None:
    """6 iterations (K1/K2), 30 items, 1-3 kill -9 each: every item completes exactly once, re-runs only in flight."""
    seed = _seed()
    iterations, violations, figs = _profile(
        tmp_path, seed, ["K1", "K2"] * 3, n_items=30, max_kills=3, window=(0.3, 2.2)
    )
    assert violations == [], "\n".join(violations)
    assert figs["duplicate_completions"] == 0
    assert figs["kills"] >= 1, "no kill landed: the kill window misses the run"
    assert all(it.final_rc == 0 for it in iterations)


@pytest.mark.slow
def test_kill9_of_the_daemon_alone_with_agents_outliving_it_never_runs_an_item_twice_at_once(tmp_path: Path) -> None:
    """Agents of 0.5-3 s, 12 at once, the daemon alone killed 1-3 times while they run: the
    restarts find every agent still running (started or queued at the kill) and stop it before its item runs
    again. The overlap witness stays empty."""
    seed = _seed()
    _, violations, figs = _profile(
        tmp_path,
        seed,
        ["K1"] * 3,
        n_items=24,
        max_kills=3,
        window=(0.2, 1.5),
        sleep_ms="500-3000",
        concurrency=12,
        kill_with_agents=True,
    )
    assert violations == [], "\n".join(violations)
    assert figs["overlaps_witnessed"] == 0
    assert figs["kills"] >= 3 and figs["orphans_K1"] >= 1, figs


def test_kill_between_run_start_and_seen_record_runs_the_workflow_once(tmp_path: Path) -> None:
    """A kill after a run's journal is written but before workflows.json records the file: resumed, not doubled."""
    wit = tmp_path / "witness.log"
    stub = stub_agent_md("stub", ["--witness", str(wit), "--sleep-ms", "300-400"])
    paths = make_brain(tmp_path / "brain", example_agents=False, agents={"stub": stub})
    (paths.workflows / f"{WORKFLOW}.yml").write_text(foreach_workflow(WORKFLOW, ["a", "b", "c"], concurrency=1))
    d = DaemonProcess(paths).start()
    try:
        wait_until_journal = time.monotonic() + 20
        while not _journal(paths) and time.monotonic() < wait_until_journal:
            time.sleep(0.01)
        assert _journal(paths), "the run never started"
        _kill(d, "K2")
    finally:
        d.kill()
    # The state a kill leaves between the two writes: the run's journal exists, the "seen" record does not.
    (paths.state / "workflows.json").unlink(missing_ok=True)
    d = DaemonProcess(paths, "--until-idle").start()
    try:
        assert d.wait(timeout=60) == 0
    finally:
        d.kill()
    journals = sorted(paths.run_journals.glob("*.jsonl"))
    assert len(journals) == 1, f"the workflow ran {len(journals)} times"
    state = fold(read_jsonl(journals[0]).records)
    assert state.outcome == "success"
    assert sorted(Counter(w[0] for w in witness(wit))) == ["a", "b", "c"]


@pytest.mark.chaos
@pytest.mark.timeout(3600)  # 50 iterations of 100 items: minutes, not the suite's 180 s
def test_kill9_mid_fanout_long_profile(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Opt-in (-m chaos): 50 iterations (25 K1 + 25 K2) of 100 items with 1-3 kills each, same invariants."""
    if "chaos" not in str(request.config.getoption("markexpr", "")):
        pytest.skip("long chaos profile: run with `pytest -m chaos`")
    seed = _seed()
    _, violations, figs = _profile(tmp_path, seed, ["K1", "K2"] * 25, n_items=100, max_kills=3, window=(0.3, 5.0))
    assert violations == [], "\n".join(violations)
    assert figs["duplicate_completions"] == 0
    outliving = tmp_path / "outliving"  # the second profile's own folder (it lays out brains by seed, as the first)
    outliving.mkdir()
    _, violations, figs = _profile(
        outliving,
        seed + 1000,
        ["K1"] * 20,
        n_items=60,
        max_kills=4,
        window=(0.2, 3.0),
        sleep_ms="500-6000",
        concurrency=16,
    )
    assert violations == [], "\n".join(violations)
    assert figs["overlaps_witnessed"] == 0
