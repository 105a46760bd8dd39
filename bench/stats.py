"""Benchmark: summarise 100,000 run-record lines (``ambient stats``) in-process; target < 2 s.

Generates a seeded history (five workflows, nine agents, 26 weeks, recurring errors with varying
numbers/paths/ids, escalations falling over time, some decided by rules) in a temp brain, then
times ``summarise_file`` (read + parse + summarise) and the whole ``ambient stats`` command.

    /work/venv/bin/python bench/stats.py [--runs 100000] [--repeats 3] [--keep DIR]

``--keep DIR`` writes the history to ``DIR/.ambient/runs.jsonl`` and keeps it (for examples).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import resource
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ambient.cli import main
from ambient.cli.stats import PARALLEL_MIN_BYTES, summarise_file

WORKFLOWS = {
    "deploy-batch": ["deploy", "vps"],
    "nightly-tests": ["testing", "debug"],
    "docs-refresh": ["scribe"],
    "backup-verify": ["monitoring"],
    "dependency-bump": ["refacto", "code-review", "security"],
}
ERRORS = {  # each workflow fails its own ways
    "deploy-batch": [
        "connection to 10.0.{a}.{b}:22 timed out after {n}s",
        "lock held by sess-{hex} on vps/configs/instance-{i:02d}.yml",
        "deploy script exited with code {code} (pid {pid})",
    ],
    "nightly-tests": ["{k} of {m} tests failed in tests/test_{mod}.py"],
    "docs-refresh": ["permission denied: '/srv/docs/page-{i:02d}.md'"],
    "backup-verify": ["checksum mismatch for backup-{hex}.tar.zst"],
    "dependency-bump": ['unknown option "--{opt}" in workflows/dependency-bump.yml'],
}
OPTIONS = ["retry", "skip", "abort"]


def _error(rng: random.Random, wf: str) -> str:
    template = rng.choice(ERRORS[wf])
    return template.format(
        a=rng.randrange(256),
        b=rng.randrange(256),
        n=rng.choice([10, 30, 60]),
        i=rng.randrange(1, 40),
        code=rng.choice([1, 2, 127, 137]),
        pid=rng.randrange(1000, 99999),
        hex=f"{rng.getrandbits(32):08x}",
        k=rng.randrange(1, 9),
        m=rng.randrange(10, 400),
        mod=rng.choice(["api", "locks", "claims", "engine"]),
        opt=rng.choice(["force", "dry", "fast"]),
    )


def generate(path: Path, runs: int, seed: int = 42, start: datetime | None = None, weeks: int = 26) -> int:
    """Write ``runs`` run-record lines to ``path``; returns the number of bytes."""
    rng = random.Random(seed)
    t0 = start or datetime(2026, 1, 5, tzinfo=UTC)  # a Monday
    span = timedelta(weeks=weeks).total_seconds()
    names = list(WORKFLOWS)
    written = 0
    with path.open("w", encoding="utf-8") as fh:
        for n in range(runs):
            progress = n / runs
            started = t0 + timedelta(seconds=span * progress + rng.uniform(0, 600))
            wf = rng.choices(names, weights=[35, 30, 15, 10, 10])[0]
            p_bad = 0.14 * (1 - 0.65 * progress)  # the loop works: fewer failures and escalations
            steps = []
            escalations = errors = 0
            decisions = []
            clock = started
            for i in range(rng.randint(1, 6)):
                agent = rng.choice(WORKFLOWS[wf])
                duration = int(rng.lognormvariate(7.0, 0.8))
                result = "success"
                step: dict[str, object] = {
                    "item": f"instance-{i + 1:02d}",
                    "agent": agent,
                    "signal_out": "SPAWN",
                    "signal_in": "RETURN",
                    "duration_ms": duration,
                    "attempt": 1,
                }
                if rng.random() < p_bad:
                    result = rng.choice(["fail", "error"])
                    step["error"] = _error(rng, wf)
                    if result == "error":
                        errors += 1
                        step["signal_in"] = "ERROR"
                    escalations += 1
                    step["escalation"] = f"esc-{n}-{i}"  # the step that raised it (a StepRecord extra)
                    auto = rng.random() < 0.5 * progress
                    decisions.append(
                        {
                            "escalation": f"esc-{n}-{i}",
                            "option": rng.choice(OPTIONS),
                            "by": "rule" if auto else "human",
                            "channel": "rule" if auto else rng.choice(["cli", "telegram"]),
                            "latency_s": 0.0 if auto else round(rng.lognormvariate(5.5, 1.0), 1),
                            "auto": auto,
                        }
                    )
                step["result"] = result
                clock += timedelta(milliseconds=duration)
                steps.append(step)
            outcome = "success" if escalations == 0 else rng.choice(["partial", "failed", "success"])
            rec = {
                "kind": "run",
                "run_id": f"run-{n:06d}",
                "workflow": wf,
                "spec_hash": "sha256:0f3a",
                "started_at": started.isoformat(),
                "completed_at": (clock + timedelta(seconds=rng.uniform(0.1, 2))).isoformat(),
                "outcome": outcome,
                "steps": steps,
                "escalations": escalations,
                "errors": errors,
                "decisions": decisions,
            }
            line = json.dumps(rec, separators=(",", ":")) + "\n"
            written += len(line)
            fh.write(line)
    return written


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (the forked workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _workers(size: int) -> int:
    return min(len(os.sched_getaffinity(0)), 4, max(1, size // PARALLEL_MIN_BYTES))


def time_parsers(runs_log: Path, repeats: int) -> None:
    """Reading every line into what the statistics count, best of ``repeats``, in one process: ``json.loads`` and
    the hand parser (``StatsBuilder._parse``: plain dicts, exact type checks), against the typed model
    (``RunRecord.model_validate_json``, pydantic's Rust core), then the same accumulation after each."""
    from ambient.engine.records import RunRecord, is_failure
    from ambient.learning.stats import StatsBuilder

    lines = runs_log.read_bytes().splitlines()
    parse = StatsBuilder()._parse

    def hand() -> None:
        for raw in lines:
            parse(json.loads(raw))

    def model() -> None:
        for raw in lines:
            RunRecord.model_validate_json(raw)

    def model_read() -> None:  # the model, then what _parse takes from a record read off its attributes
        for raw in lines:
            rec = RunRecord.model_validate_json(raw)
            steps = [
                (s.agent, s.result, s.duration_ms, s.error, s.signal_in == "ESCALATE", s.result == "error",
                 is_failure({"result": s.result, "signal_in": s.signal_in, **(s.model_extra or {})}), s.usage or None)
                for s in rec.steps
            ]  # fmt: skip
            ruled = {d.escalation for d in rec.decisions if d.auto}
            asked = [a["agent"] for a in rec.asked if type(a.get("agent")) is str and a.get("escalation") not in ruled]
            latencies = [d.latency_s for d in rec.decisions if not d.auto and d.latency_s is not None]
            _run = (rec.workflow, rec.started_at, rec.completed_at, rec.outcome, rec.escalations, rec.errors, steps,
                    asked, latencies, rec.calls_by or [])  # fmt: skip

    def model_then_hand() -> None:  # the model's dump is what the statistics would read from it
        for raw in lines:
            parse(RunRecord.model_validate_json(raw).to_json_dict())

    for name, fn in (("json.loads + hand parser", hand), ("RunRecord.model_validate_json", model),
                     ("the model + its attributes read as _parse reads a dict", model_read),
                     ("the model, dumped, + hand parser", model_then_hand)):  # fmt: skip
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        print(f"{name}: best of {repeats}: {best:.3f}s for {len(lines):,} lines = {len(lines) / best:,.0f} lines/s")


def main_bench() -> None:
    """Generate, time, print."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--keep", metavar="DIR", help="write the history into DIR/.ambient/runs.jsonl and keep it")
    ap.add_argument("--parsers", action="store_true", help="only time the hand parser against the typed model")
    args = ap.parse_args()

    with contextlib.ExitStack() as stack:
        if args.keep:
            brain = Path(args.keep)
        else:
            brain = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ambient-bench-")))
        state = brain / ".ambient"
        state.mkdir(parents=True, exist_ok=True)
        runs_log = state / "runs.jsonl"
        t = time.perf_counter()
        size = generate(runs_log, args.runs, args.seed)
        print(f"generated {args.runs:,} run records, {size / 1e6:.1f} MB, in {time.perf_counter() - t:.1f}s")
        if args.parsers:
            time_parsers(runs_log, args.repeats)
            return

        best = cpu = float("inf")
        for _ in range(args.repeats):
            c0 = _cpu()
            t = time.perf_counter()
            stats, _res = summarise_file(runs_log)
            wall = time.perf_counter() - t
            if wall < best:
                best, cpu = wall, _cpu() - c0
        assert stats.runs == args.runs
        print(
            f"summarise_file (read + parse + summarise): best of {args.repeats}: {best:.3f}s wall "
            f"= {args.runs / best:,.0f} lines/s, {size / 1e6 / best:.0f} MB/s; {cpu:.2f}s CPU over "
            f"{_workers(size)} process(es) (target < 2 s)"
        )
        single = float("inf")
        for _ in range(args.repeats):
            t = time.perf_counter()
            summarise_file(runs_log, workers=1)
            single = min(single, time.perf_counter() - t)
        rate = args.runs / single
        print(f"summarise_file in one process: best of {args.repeats}: {single:.3f}s = {rate:,.0f} lines/s")

        best_cli = float("inf")
        for _ in range(args.repeats):
            sink = io.StringIO()
            t = time.perf_counter()
            with contextlib.redirect_stdout(sink):
                code = main(["stats", "--brain", str(brain)])
            best_cli = min(best_cli, time.perf_counter() - t)
            assert code == 0
        print(
            f"`ambient stats` in-process (summary + table): best of {args.repeats}: {best_cli:.3f}s "
            f"= {args.runs / best_cli:,.0f} lines/s ({'OK' if best_cli < 2 else 'OVER'} the 2 s target)"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main_bench()
