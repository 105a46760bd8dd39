"""A large brain written straight in ambient's formats, for the benches of the query store and the web console.

Running thousands of runs through a daemon would take an hour; a person's brain after a year or two holds about
this: ``claims`` claim files (a run claim per run, a claim per item, the rest open sessions), ``runs`` finished runs
(each a journal under ``.ambient/runs/`` and a summary line of ``.ambient/runs.jsonl``, spread over a year so the
learning page has weeks), one finished run of ``big_items`` items, and a few runs waiting on ``pending`` escalations
(their journals unfinished, their escalation files pending). The bytes are those the daemon writes (journal events,
run records, claim documents and escalation files as ``bench/README.md``'s sample run showed them): plain writes, no
fsync, no rename, so 20,000 claims take a few seconds. Every workflow is marked already seen in
``.ambient/workflows.json`` and its agent is the in-process no-op of ``noop_agent.py``, so a daemon started on the
brain runs nothing by itself.

Usage (a module of the benches, also a command)::

    python bench/bigbrain.py DIR [--claims 20000] [--runs 2000] [--big-items 1000] [--pending 12]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import agent_md

NOOP = agent_md("noop", {"kind": "callable", "target": "noop_agent:noop", "timeout_s": 60})
WORKFLOWS = 20
INFO = "bench-brain.json"  # what make_big_brain wrote, at the brain's root
ERRORS = (
    "exit status 2: deploy target unreachable",
    "timeout after 600 s",
    "ERROR: schema check failed on field 'owner'",
    "the agent answered off the protocol: no JSON on stdout",
)


@dataclass
class BigBrain:
    """What was written, for the benches to find their way in it."""

    root: Path
    big_run: str
    running_runs: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    runs: int = 0
    claims: int = 0
    seconds: float = 0.0


def _iso_ms(t: datetime) -> str:
    """A journal's ``at``: ``2026-12-02T18:05:18.227+00:00``."""
    return t.isoformat(timespec="milliseconds")


def _iso_z(t: datetime) -> str:
    """A run record's time: ``2026-12-02T18:05:18.227000Z``."""
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _spec(name: str, items: list[str]) -> dict[str, Any]:
    """The spec a run pins (as the daemon writes it in ``started``)."""
    return {
        "name": name,
        "description": None,
        "status": "active",
        "mode": "assisted",
        "branch": None,
        "pilote": None,
        "swarm_ready": False,
        "supervisor": "human",
        "sender": "ambient",
        "timeout": None,
        "retry": None,
        "schedule": None,
        "on_complete": None,
        "on_escalate": {
            "notify": [],
            "wait": "human_decision",
            "options": [],
            "timeout": None,
            "on_timeout": "reject",
            "remind_before": None,
        },
        "for_each": {
            "items": items,
            "spawn": "noop",
            "scope": {"zone": "project", "files": [f"projects/{name}/{{{{item}}}}.md"]},
            "context": {},
            "on_return": {
                "success": "trigger:next",
                "fail": "signal:ESCALATE pilote",
                "error": "signal:ERROR + log + signal:ESCALATE pilote",
                "escalate": None,
                "blocked": None,
            },
            "concurrency": 4,
        },
    }


def _workflow_yaml(name: str) -> str:
    return (
        f"workflow: {name}\nfor_each:\n  items: [a, b, c]\n  spawn: noop\n  concurrency: 4\n"
        f'  scope:\n    zone: project\n    files: ["projects/{name}/{{{{item}}}}.md"]\n'
    )


def _claim_yaml(doc: list[tuple[str, str]]) -> str:
    # As ambient writes them: a nested mapping's key ends its line (``result:``), no space after it.
    return "".join(f"{k}:{v}\n" if v.startswith("\n") else f"{k}: {v}\n" for k, v in doc)


class _Writer:
    """Plain writes (the benches own the folder; no daemon is looking yet)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = root / ".ambient"
        for sub in ("agents", "claims", "locks", "profil", "workflows"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        for sub in ("", "runs", "escalations", "inbox", "channels", "live", "outbox", "run"):
            (self.state / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.state / sub, 0o700)
        self.claims = 0
        self.records: list[str] = []

    def write(self, path: Path, text: str, private: bool = False) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def claim(self, sess_id: str, doc: list[tuple[str, str]]) -> None:
        self.write(self.root / "claims" / f"{sess_id}.yml", _claim_yaml([("sess_id", sess_id), *doc]))
        self.claims += 1


def _run(
    w: _Writer,
    rng: random.Random,
    workflow: str,
    start: datetime,
    n_items: int,
    *,
    finished: bool = True,
    pending: int = 0,
) -> str:
    """One for_each run: its journal, its claims, its record (finished) or its pending escalations (not)."""
    run_id = f"sess-{start:%Y%m%d-%H%M}-{workflow}-{rng.getrandbits(16):04x}"
    items = [f"item-{k:04d}" for k in range(n_items)]
    spec = _spec(workflow, items)
    spec_hash = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
    t = start
    ev: list[dict[str, Any]] = [
        {
            "ev": "started",
            "run_id": run_id,
            "workflow": workflow,
            "form": "for_each",
            "spec_hash": spec_hash,
            "spec": spec,
            "items": items,
            "mode": "assisted",
            "trigger": "file",
            "context": {},
            "at": _iso_ms(t),
        }
    ]
    steps: list[dict[str, Any]] = []
    asked: list[dict[str, Any]] = []
    decisions: list[dict[str, Any]] = []
    errors = 0
    done = 0
    ai = rng.random() < 0.25
    cost = 0.0
    # Items end at random moments of a window, a few at once (a timeline with concurrency and stragglers).
    waiting = set(rng.sample(range(n_items), pending)) if pending else set()
    for k, item in enumerate(items):
        key = f"{run_id}/{item}/1"
        t_acc = start + timedelta(milliseconds=10 + k * 40 + rng.randint(0, 30))
        dur = rng.randint(20, 400) if rng.random() > 0.02 else rng.randint(2000, 9000)
        t_fin = t_acc + timedelta(milliseconds=dur)
        ev.append({"ev": "accepted", "item": item, "attempt": 1, "key": key, "at": _iso_ms(t_acc)})
        fail = k in waiting or (rng.random() < 0.03)
        result = "fail" if fail else "success"
        err = rng.choice(ERRORS) if fail else None
        fin: dict[str, Any] = {
            "ev": "finished",
            "item": item,
            "attempt": 1,
            "agent": "noop",
            "key": key,
            "result": result,
            "output": {"status": "failed" if fail else "ok"},
            "error": err,
            "duration_ms": dur,
            "signal_in": "RETURN",
            "reply": "fail" if fail else "success",
            "question": None,
        }
        usage = None
        if ai:
            c = round(rng.uniform(0.001, 0.05), 4)
            cost += c
            usage = {"model": "claude-sonnet-4-5", "input_tokens": 1200, "output_tokens": 300, "cost_usd": c}
            fin["usage"] = usage
        fin["at"] = _iso_ms(t_fin)
        ev.append(fin)
        step: dict[str, Any] = {
            "item": item,
            "agent": "noop",
            "signal_out": "SPAWN",
            "signal_in": "RETURN",
            "result": result,
            "duration_ms": dur,
            "attempt": 1,
            "key": key,
            "at": _iso_z(t_fin),
            "reply": fin["reply"],
        }
        if err:
            step["error"] = err
        if usage:
            step["usage"] = usage
        steps.append(step)
        t = max(t, t_fin)
        if not fail:
            done += 1
            continue
        errors += 1
        esc = "esc-" + base64.b32encode(rng.randbytes(5)).decode().lower()[:6]
        question = f"{item} failed: {err}. Run it again?"
        asked.append({"escalation": esc, "kind": "fail", "item": item, "agent": "noop"})
        ev.append(
            {
                "ev": "asked",
                "escalation": esc,
                "request": {
                    "kind": "fail",
                    "question": question,
                    "options": [["retry", "Run it again", "retry"], ["skip", "Skip it and go on", "skip"]],
                    "item": item,
                    "agent": "noop",
                },
                "at": _iso_ms(t_fin),
            }
        )
        ev.append(
            {"ev": "escalated", "item": item, "escalation": esc, "kind": "fail", "agent": "noop", "at": _iso_ms(t_fin)}
        )
        if k in waiting:
            _escalation(w, esc, workflow, run_id, item, question, t_fin)
            continue
        t_dec = t_fin + timedelta(seconds=rng.randint(5, 3600))
        ev.append(
            {
                "ev": "decided",
                "item": item,
                "escalation": esc,
                "option": "skip",
                "action": "skip",
                "by": "human",
                "channel": "cli",
                "latency_s": (t_dec - t_fin).total_seconds(),
                "at": _iso_ms(t_dec),
            }
        )
        decisions.append(
            {
                "escalation": esc,
                "option": "skip",
                "by": "human",
                "channel": "cli",
                "latency_s": (t_dec - t_fin).total_seconds(),
                "auto": False,
            }
        )
        t = max(t, t_dec)
    outcome = "success" if done == n_items else ("partial" if done else "failed")
    parent = [
        ("type", "pilote"),
        ("scope", f"workflows/{workflow}"),
        ("agent", "ambient"),
        ("status", "closed" if finished else "open"),
        ("opened_at", f'"{start:%Y-%m-%dT%H:%M:%S+00:00}"'),
        ("workflow", workflow),
        ("story_angle", f'"ambient run of {workflow}"'),
        ("mode", "assisted"),
    ]
    if finished:
        t_end = t + timedelta(milliseconds=5)
        ev.append({"ev": "finished_run", "outcome": outcome, "at": _iso_ms(t_end)})
        parent += [("closed_at", f'"{t_end:%Y-%m-%dT%H:%M}"'), ("result", "\n  status: ok")]
        record: dict[str, Any] = {
            "kind": "run",
            "run_id": run_id,
            "workflow": workflow,
            "spec_hash": spec_hash,
            "started_at": _iso_z(start),
            "completed_at": _iso_z(t_end),
            "outcome": outcome,
            "steps": steps,
            "escalations": len(asked),
            "errors": errors,
            "decisions": decisions,
            "gated": [],
            "reached_end": False,
            "asked": asked,
            "form": "for_each",
            "total": n_items,
            "done": done,
        }
        if ai:
            record.update(cost_usd=round(cost, 4), input_tokens=1200 * n_items, output_tokens=300 * n_items)
            record.update(models=["claude-sonnet-4-5"], turns=n_items)
        w.records.append(json.dumps(record, separators=(",", ":")))
    w.write(
        w.state / "runs" / f"{run_id}.jsonl", "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in ev), True
    )
    w.claim(run_id, parent)
    for k, item in enumerate(items):
        w.claim(
            f"{run_id}-item-{k + 1:03d}",
            [
                ("type", "satellite"),
                ("scope", f"projects/{workflow}/{item}.md"),
                ("agent", "noop"),
                ("status", "closed" if finished or k not in waiting else "waiting_human"),
                ("opened_at", f'"{start:%Y-%m-%dT%H:%M:%S+00:00}"'),
                ("parent_satellite", run_id),
                ("workflow", workflow),
                ("story_angle", f'"{workflow}: {item}"'),
                ("satellite_level", "leaf"),
                ("attempt", "1"),
                ("result", "\n  status: ok"),
                ("closed_at", f'"{start:%Y-%m-%dT%H:%M}"'),
            ],
        )
    return run_id


def _escalation(w: _Writer, esc: str, workflow: str, run_id: str, item: str, question: str, t: datetime) -> None:
    """A pending escalation file (``human.escalation_store.to_yaml``'s layout)."""
    text = (
        f"# ambient escalation (pending). Answer with: ambient decide {esc} <option name or number>\n"
        f"id: {esc}\nworkflow: {workflow}\nrun_id: {run_id}\nitem: {item}\nagent: noop\nkind: fail\n"
        f'question: "{question}"\n'
        "options:\n- key: retry\n  label: Run it again\n  action: retry\n"
        "- key: skip\n  label: Skip it and go on\n  action: skip\n"
        f"created_at: '{t.isoformat()}'\nreminded: false\n"
        f"dedupe_key: {hashlib.sha256((run_id + item).encode()).hexdigest()[:24]}\n"
        f"nonce: {hashlib.sha256(esc.encode()).hexdigest()[:22]}\n"
        f"notify:\n  next_at: '{t.isoformat()}'\n  attempts: []\n  delivered_at: null\n  refs: {{}}\n"
        "status: pending\n"
    )
    w.write(w.state / "escalations" / f"{esc}.yml", text, True)


def make_big_brain(
    root: Path,
    *,
    claims: int = 20_000,
    runs: int = 2_000,
    big_items: int = 1_000,
    pending: int = 12,
    seed: int = 28,
) -> BigBrain:
    """Write the brain under ``root`` (made; must not hold a brain yet). ``runs`` counts the big run."""
    t0 = time.perf_counter()
    rng = random.Random(seed)
    w = _Writer(root)
    (root / "profil" / "ambient.yml").write_text("concurrency: 256\n")
    w.write(root / "agents" / "noop.md", NOOP)
    names = [f"wf-{i:02d}" for i in range(WORKFLOWS)]
    seen = {}
    now = datetime.now(UTC).replace(microsecond=0)
    for name in names:
        w.write(root / "workflows" / f"{name}.yml", _workflow_yaml(name))
        seen[name] = {"first_hash": "bench", "last_started": now.isoformat(), "runs": runs // WORKFLOWS}
    # Items per small run so that run and item claims come to ``claims`` (minus the running runs' and big run's).
    running = max(1, (pending + 3) // 4)
    small = runs - 1
    budget = claims - (big_items + 1) - running * 6 - small
    per_run = [budget // small + (1 if i < budget % small else 0) for i in range(small)] if small else []
    start0 = now - timedelta(days=365)
    span = (now - timedelta(hours=2) - start0).total_seconds()
    starts = sorted(start0 + timedelta(seconds=rng.uniform(0, span)) for _ in range(small))
    big_at = now - timedelta(hours=1)
    big_index = small // 2
    big_run = ""
    for i, start in enumerate(starts):
        if i == big_index:
            big_run = _run(w, rng, "wf-big", big_at - timedelta(days=30), big_items)
        _run(w, rng, names[i % WORKFLOWS], start, max(1, per_run[i]))
    if not small:
        big_run = _run(w, rng, "wf-big", big_at, big_items)
    seen["wf-big"] = {"first_hash": "bench", "last_started": now.isoformat(), "runs": 1}
    w.write(root / "workflows" / "wf-big.yml", _workflow_yaml("wf-big"))
    out = BigBrain(root=root, big_run=big_run, runs=runs)
    left = pending
    for j in range(running):
        n = left // (running - j)
        left -= n
        run_id = _run(
            w, rng, names[j % WORKFLOWS], now - timedelta(minutes=30 - j), 5, finished=False, pending=min(n, 5)
        )
        out.running_runs.append(run_id)
    for esc_file in sorted((w.state / "escalations").iterdir()):
        out.pending.append(esc_file.stem)
    w.write(w.state / "runs.jsonl", "".join(r + "\n" for r in w.records), True)
    w.write(w.state / "workflows.json", json.dumps(seen, indent=1), True)
    # The rest of the claims: a person's and agents' own sessions, open for a while.
    while w.claims < claims:
        i = w.claims
        w.claim(
            f"sess-20261101-0900-session-{i:05d}",
            [
                ("type", "satellite"),
                ("scope", f"projects/notes/{i}.md"),
                ("agent", "noop"),
                ("status", "closed"),
                ("opened_at", '"2026-11-01T09:00:00+00:00"'),
                ("story_angle", f'"session {i}"'),
                ("closed_at", '"2026-11-01T10:00"'),
            ],
        )
    out.claims = w.claims
    out.seconds = time.perf_counter() - t0
    (root / INFO).write_text(json.dumps({k: str(v) if k == "root" else v for k, v in vars(out).items()}))
    return out


def load_big_brain(root: Path) -> BigBrain:
    """A brain :func:`make_big_brain` wrote earlier (``--brain DIR`` of the benches: no waiting for a new one)."""
    data = json.loads((root / INFO).read_text())
    data["root"] = root
    return BigBrain(**data)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--claims", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=2_000)
    ap.add_argument("--big-items", type=int, default=1_000)
    ap.add_argument("--pending", type=int, default=12)
    args = ap.parse_args()
    b = make_big_brain(
        Path(args.dir), claims=args.claims, runs=args.runs, big_items=args.big_items, pending=args.pending
    )
    print(
        f"{b.root}: {b.claims} claims, {b.runs} finished runs (big run {b.big_run}), "
        f"{len(b.running_runs)} running runs, {len(b.pending)} pending escalations, written in {b.seconds:.1f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
