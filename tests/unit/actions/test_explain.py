"""``ambient.actions.explain``: the verdict and rule of ``ambient matrix explain``, and who may send what."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ambient.actions.explain import explain, load_matrix, sends
from ambient.cli import main
from ambient.core.errors import InputError, UnsafePathError
from ambient.storage.paths import BrainPaths
from tests.acceptance.harness import agent_md


@pytest.fixture
def paths(tmp_path: Path) -> BrainPaths:
    root = tmp_path / "brain"
    (root / "agents").mkdir(parents=True)
    (root / "agents" / "w.md").write_text(agent_md("w", ["true"]))
    return BrainPaths(root)


def test_same_verdict_as_the_cli(paths: BrainPaths, capsys: pytest.CaptureFixture[str]) -> None:
    """Allow and deny, with the rule and reasons the CLI prints (exit 0 allow, 1 deny)."""
    for sender, receiver, signal, code in (("w", "human", "ESCALATE", 0), ("w", "bsi", "SPAWN", 1)):
        verdict = explain(paths, sender, receiver, signal)
        assert verdict.decision.allowed is (code == 0)
        assert main(["matrix", "explain", sender, receiver, signal, "--json", "--brain", str(paths.root)]) == code
        assert json.loads(capsys.readouterr().out) == verdict.to_json()
    assert explain(paths, "w", "human", "ESCALATE", zone="project").packet == "w → human ESCALATE zone project"


def test_bad_input_is_an_input_error(paths: BrainPaths) -> None:
    """Unknown signal, bad zone, a path leaving the brain: InputError with the CLI's message."""
    with pytest.raises(InputError, match="unknown signal 'NOPE'"):
        explain(paths, "w", "human", "NOPE")
    with pytest.raises(InputError, match="is not a zone name"):
        explain(paths, "w", "human", "SPAWN", zone="../x")
    with pytest.raises(UnsafePathError):
        explain(paths, "w", "human", "SPAWN", files=["../etc/passwd"])
    with pytest.raises(InputError, match="not a directory"):
        load_matrix(BrainPaths(paths.root / "missing"))


def test_sends_agrees_with_explain(paths: BrainPaths) -> None:
    """Every (sender, receiver, signal) the table lists is allowed by explain, and w reaches human."""
    bm = load_matrix(paths)
    table = sends(bm)
    w = next(s for s in table if s.row.name == "w")
    to = dict(w.to)
    assert "ESCALATE" in to["human"]
    for s in table:
        for receiver, signals in s.to:
            for sig in signals:
                assert explain(paths, s.row.name, receiver, sig, matrix=bm).decision.allowed
