"""Chains through the real daemon: the corpus brain-engine workflow, theme branches in git, and the
orchestrator interface (ORCHESTRATE / ABORT / ADAPT in, STEP_DONE / GATE_PENDING / DONE out)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ambient.cli import main
from ambient.engine.runstate import fold
from ambient.kernel.router import read_audit
from ambient.storage.journal import read_jsonl
from ambient.storage.paths import BrainPaths
from tests.conftest import EXAMPLE_BRAIN
from tests.e2e.helpers import TEST_AGENT_ENV


def _brain(tmp_path: Path, *, keep: tuple[str, ...] = ()) -> Path:
    root = tmp_path / "brain"
    shutil.copytree(EXAMPLE_BRAIN, root)
    for wf in (root / "workflows").glob("*.yml"):
        if wf.name not in keep:
            wf.unlink()
    return root


def _run(root: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMBIENT_")}
    env.update(TEST_AGENT_ENV)
    res = subprocess.run(
        [sys.executable, "-m", "ambient", "run", "--brain", str(root), "--until-idle", "--log-format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def _pending(root: Path) -> list[Any]:
    from ambient.human.escalation_store import EscalationStore

    return EscalationStore(BrainPaths(root)).list(status="pending")


def _states(root: Path) -> list[Any]:
    paths = BrainPaths(root)
    return [fold(read_jsonl(p).records) for p in sorted(paths.run_journals.glob("*.jsonl"))]


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_corpus_brain_engine_runs_and_stops_at_human_gate(tmp_path: Path, corpus: Path) -> None:
    """brain-engine.yml (draft removed) runs steps 1-3 on the example agents, waits at step 4's gate, then ends."""
    root = _brain(tmp_path)
    text = (corpus / "workflows" / "brain-engine.yml").read_text()
    assert "status: draft" in text
    (root / "workflows" / "brain-engine.yml").write_text(text.replace("status: draft\n", ""))
    if shutil.which("git"):
        _git(root, "init", "-q", "-b", "main")
        _git(root, "-c", "user.email=t@example.org", "-c", "user.name=t", "add", "-A")
        _git(root, "-c", "user.email=t@example.org", "-c", "user.name=t", "commit", "-qm", "brain")
    _run(root)
    (state,) = _states(root)
    assert [i.status for i in state.items] == ["done", "done", "done", "escalated"]
    (esc,) = _pending(root)
    assert esc.kind == "gate" and "gate: human" in esc.question
    if shutil.which("git"):
        assert _git(root, "rev-parse", "--abbrev-ref", "HEAD") == "theme/brain-engine"  # opened at the start
        (root / "brain-engine").mkdir(exist_ok=True)
        (root / "brain-engine" / "feature.py").write_text("X = 1\n")  # what the satellites committed
        _git(root, "add", "brain-engine/feature.py")
        _git(root, "-c", "user.email=t@example.org", "-c", "user.name=t", "commit", "-qm", "feature")
    assert main(["--brain", str(root), "decide", esc.id, "approve"]) == 0
    _run(root)
    (state,) = _states(root)
    assert state.outcome == "success" and all(i.status == "done" for i in state.items)
    audit = list(read_audit(BrainPaths(root).audit))
    sent = [(a.get("signal"), a.get("to")) for a in audit if a.get("from") == "ambient"]
    assert sent.count(("STEP_DONE", "human")) == 4 and ("GATE_PENDING", "human") in sent and ("DONE", "human") in sent
    if shutil.which("git"):
        assert _git(root, "rev-parse", "--abbrev-ref", "HEAD") == "main"  # merged back at the end
        assert "theme/brain-engine" in _git(root, "log", "--merges", "--format=%s", "-1")


def test_draft_never_runs(tmp_path: Path, corpus: Path) -> None:
    """The corpus brain-engine.yml as shipped (status: draft) is loaded, never run."""
    root = _brain(tmp_path)
    shutil.copy(corpus / "workflows" / "brain-engine.yml", root / "workflows" / "brain-engine.yml")
    shutil.copy(corpus / "workflows" / "_template.yml", root / "workflows" / "_template.yml")
    _run(root)
    assert _states(root) == []


def _send(root: Path, packet: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> int:
    f = tmp_path / "packet.json"
    f.write_text(json.dumps(packet))
    code = main(["--brain", str(root), "send", str(f)])
    capsys.readouterr()
    return code


def test_orchestrator_packets_in_and_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ORCHESTRATE starts a run at a step, ADAPT skips an item, ABORT stops a run; a forbidden sender is denied."""
    root = _brain(tmp_path, keep=("feature-chain.yml", "deploy-batch.yml"))
    (root / "workflows" / "feature-chain.yml").rename(tmp_path / "feature-chain.yml")
    (root / "workflows" / "deploy-batch.yml").rename(tmp_path / "deploy-batch.yml")
    _run(root)  # nothing to run yet: the daemon has seen no workflow
    (tmp_path / "feature-chain.yml").rename(root / "workflows" / "feature-chain.yml")
    _run(root)  # first sight: one run, waits at step 4's gate
    # ORCHESTRATE at step 3 with context (human → ambient, through the router)
    orch = {
        "from": "human",
        "to": "ambient",
        "signal": "ORCHESTRATE",
        "payload": {"context": {"workflow": "feature-chain", "step": "3", "context": {"ticket": "BE-7"}}},
    }
    assert _send(root, orch, tmp_path, capsys) == 0
    _run(root)
    states = {s.trigger: s for s in _states(root)}
    started = states["orchestrate:human"]
    # The steps before the one it started at are skipped (not run), so the outcome counts only what ran.
    assert started.context == {"ticket": "BE-7"} and [i.status for i in started.items][:2] == ["skipped", "skipped"]
    assert started.items[2].status == "done"
    # ABORT the first run (waiting at its gate)
    first = states["file"]
    abort = {
        "from": "human",
        "to": "ambient",
        "signal": "ABORT",
        "payload": {"context": {"workflow": first.run_id, "reason": "changed my mind"}},
    }
    assert _send(root, abort, tmp_path, capsys) == 0
    _run(root)
    assert {s.run_id: s for s in _states(root)}[first.run_id].outcome == "aborted"
    # A worker agent may not orchestrate: denied by the matrix, recorded, nothing started.
    forged = dict(orch, **{"from": "deploy"})
    assert _send(root, forged, tmp_path, capsys) == 1
    denied = [a for a in read_audit(BrainPaths(root).audit) if a.get("status") == "denied"]
    assert denied and denied[-1].get("signal") == "ORCHESTRATE"
