"""`ambient validate` and the bad workflow files of examples/workflows-bad: one clear file:line problem each."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from ambient.cli import main
from ambient.config.workflows import check_workflow, load_workflow

REPO = Path(__file__).resolve().parents[2]
BAD = REPO / "examples" / "workflows-bad"
EXAMPLE_WORKFLOWS = REPO / "examples" / "brain" / "workflows"
AGENTS = {"deploy", "coder", "tester", "scribe", "vps"}

# file → (line or None, a fragment of the message)
BAD_FILES: dict[str, tuple[int | None, str]] = {
    "malformed-yaml.yml": (7, "quote text that contains {{...}}"),
    "wrong-type.yml": (6, "for_each.concurrency: Input should be a valid integer"),
    "unknown-form.yml": (2, "has neither a for_each: block"),
    "both-forms.yml": (8, "has both for_each: and chain:"),
    "missing-items.yml": (3, "for_each.items: Field required"),
    "unknown-agent.yml": (5, "spawn: agent 'deployer' does not exist in agents/"),
    "bad-exit-trigger.yml": (8, "bad exit-trigger action 'jump:2': unknown action 'jump'"),
    "missing-step.yml": (8, "trigger:7 names no step of this chain (steps: 1, 2)"),
    "cycle.yml": (16, "on_done makes a loop (1 → 2 → 3 → 1)"),
    "duplicate-step.yml": (12, "step '2' is declared twice"),
    "path-traversal.yml": (7, "leaves the brain root whatever the item"),
    "traversal-item.yml": (6, "item '../../etc/passwd' in scope file 1"),
    "unknown-variable.yml": (7, "unknown template variable {{itm}} in a scope file"),
    "template-expression.yml": (8, "never evaluate expressions"),
    "return-payload.yml": (8, "a RETURN payload carries result only; remove context"),
    "bad-duration.yml": (3, "timeout: 'soon' is not a duration"),
    "alias-bomb.yml": (4, "YAML aliases (*name) are not accepted"),
    "duplicate-keys.yml": (6, "duplicate key 'spawn' (first at line 5)"),
    "non-utf8.yml": (3, "is not valid UTF-8"),
    "control-char.yml": (3, "character U+0007 is not allowed in YAML text"),
    "oversized.yml": (None, "the limit for this kind of file is 1048576"),
}


@pytest.fixture(autouse=True)
def _agents_may_run_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The files' verdicts only: run as root, where the agent user cannot reach the interpreter, validate would add
    its warning about this machine to the summary (tests/acceptance/test_configuration.py checks that)."""
    monkeypatch.setenv("AMBIENT_AGENT_USER", "root")


AGENT_MD = """---
name: {name}
brain:
  ipc:
    receives_from: [orchestrator, human]
    sends_to: [orchestrator, human]
    zone_access: [{zones}]
    signals: [RETURN, ERROR, ESCALATE, BLOCKED_ON]
---
# {name}
"""


def _brain(root: Path, *, zones: str = "project", workflows: bool = True) -> Path:
    """A brain with the example workflows and agents whose gates admit ambient's SPAWNs in ``zones``."""
    (root / "agents").mkdir(parents=True)
    (root / "workflows").mkdir()
    for name in sorted(AGENTS):
        (root / "agents" / f"{name}.md").write_text(AGENT_MD.format(name=name, zones=zones))
    if workflows:
        for f in EXAMPLE_WORKFLOWS.glob("*.yml"):
            shutil.copy(f, root / "workflows" / f.name)
    return root


def test_every_kind_is_present() -> None:
    """The table covers every file of examples/workflows-bad (and they are more than ten kinds)."""
    assert sorted(p.name for p in BAD.glob("*.yml")) == sorted(BAD_FILES)
    assert len(BAD_FILES) >= 13


@pytest.mark.parametrize(("name", "expected"), sorted(BAD_FILES.items()), ids=sorted(BAD_FILES))
def test_bad_file_gives_one_clear_problem(name: str, expected: tuple[int | None, str]) -> None:
    """Each bad file is refused whole, with exactly one error at the expected line naming the fault."""
    line, fragment = expected
    wf, problems = load_workflow(BAD / name, source=name)
    if wf is not None:
        problems += check_workflow(wf, AGENTS.__contains__)
    errors = [p for p in problems if p.severity == "error"]
    assert len(errors) == 1, [str(p) for p in problems]
    assert errors[0].file == name and errors[0].line == line
    assert fragment in errors[0].message
    assert str(errors[0]).startswith(f"{name}:{line}: " if line else f"{name}: ")


@pytest.mark.parametrize("name", sorted(BAD_FILES), ids=sorted(BAD_FILES))
def test_cli_reports_each_bad_file(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ambient validate FILE` prints file:line: message and exits 1 for every bad file."""
    brain = _brain(tmp_path / "brain", workflows=False)
    code = main(["validate", "--brain", str(brain), str(BAD / name)])
    out = capsys.readouterr().out
    assert code == 1
    line, fragment = BAD_FILES[name]
    where = f"{BAD / name}:{line}: " if line else f"{BAD / name}: "
    assert any(row.startswith(where) and fragment in row for row in out.splitlines()), out
    assert out.splitlines()[-1] == "1 error(s), 0 warning(s) in 1 file(s)"


def test_clean_brain_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A brain whose workflows are all good: exit 0 and an ok summary."""
    brain = _brain(tmp_path / "brain")
    assert main(["validate", "--brain", str(brain)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "ok: 3 workflow(s) (0 draft), 0 warning(s)"


def test_bad_file_among_good_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad file in workflows/ is reported with its brain-relative name; the good ones still count."""
    brain = _brain(tmp_path / "brain")
    shutil.copy(BAD / "cycle.yml", brain / "workflows" / "cycle.yml")
    assert main(["validate", "--brain", str(brain)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("workflows/cycle.yml:16: on_done makes a loop")
    assert out[-1] == "1 error(s), 0 warning(s) in 1 file(s)"


def test_one_files_problems_come_together_in_line_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Checks of different kinds find a file's problems in their own order: they are printed by file, then line."""
    brain = _brain(tmp_path / "brain", workflows=False)
    (brain / "workflows" / "w.yml").write_text(
        "workflow: w\ntimout: 5\nfor_each:\n  items: [a]\n  spawn: nosuch\n"
        "  scope: {zone: project, files: ['x/{{index}}']}\n"
    )
    runner = "ambient:\n  runner:\n    kind: command\n    argvs: [/bin/true]\n    timout_s: 5\n"
    (brain / "agents" / "typo.md").write_text(
        AGENT_MD.format(name="typo", zones="project").replace("---\n# typo", runner + "---\n# typo")
    )
    assert main(["validate", "--brain", str(brain)]) == 1
    rows = capsys.readouterr().out.splitlines()[:-1]
    where = [(r.split(":")[0], int(r.split(":")[1])) for r in rows]
    assert where == sorted(where) and {f for f, _ in where} == {"agents/typo.md", "workflows/w.yml"}, rows


def test_directory_argument(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A directory argument validates its workflow files: every bad example at once."""
    brain = _brain(tmp_path / "brain", workflows=False)
    assert main(["validate", "--brain", str(brain), str(BAD)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"{len(BAD_FILES)} error(s), 0 warning(s) in {len(BAD_FILES)} file(s)"
    assert all(re.match(r"^/.+\.yml(:\d+)?: ", row) for row in out[:-1])


def test_warnings_and_strict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Warnings are printed but exit 0; --strict makes them count."""
    brain = _brain(tmp_path / "brain", workflows=False)
    wf = brain / "workflows" / "typo.yml"
    wf.write_text(
        "workflow: typo\nfor_each:\n  items: [a]\n  spawn: deploy\n"
        "  scope:\n    files: ['infrastructure/{{item}}.yml']\nretyr: {attempts: 2}\n"
    )
    assert main(["validate", "--brain", str(brain)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "workflows/typo.yml:7: warning: unknown key 'retyr' is kept but not used; did you mean 'retry'?"
    assert out[-1] == "ok: 1 workflow(s) (0 draft), 1 warning(s)"
    assert main(["validate", "--brain", str(brain), "--strict"]) == 1


def test_draft_with_missing_agents_only_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str], corpus: Path) -> None:
    """The corpus draft brain-engine.yml names default agents that may not exist: warnings, exit 0."""
    brain = _brain(tmp_path / "brain", workflows=False)
    (brain / "agents" / "coder.md").unlink()
    shutil.copy(corpus / "workflows" / "brain-engine.yml", brain / "workflows")
    assert main(["validate", "--brain", str(brain)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("workflows/brain-engine.yml:13: warning: step 1 names no agents:")
    assert out[-1] == "ok: 1 workflow(s) (1 draft), 1 warning(s)"


def test_matrix_denial_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An agent whose gate does not admit the scope's zone cannot be spawned there: an error with the reason."""
    pytest.importorskip("ambient.kernel.routing_table")
    brain = _brain(tmp_path / "brain", zones="kernel")
    assert main(["validate", "--brain", str(brain), str(brain / "workflows" / "deploy-batch.yml")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(
        f"{brain / 'workflows' / 'deploy-batch.yml'}:9: 'ambient' may not SPAWN 'deploy' in zone project"
    )


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A path that does not exist, a bad option, or a brain that is not a directory: exit 2."""
    (tmp_path / "agents").mkdir()
    assert main(["validate", "--brain", str(tmp_path), str(tmp_path / "nope.yml")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    assert main(["validate", "--no-such-option"]) == 2
    assert main(["validate", "--brain", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_brain_without_workflows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A brain without workflows is valid: ok, 0 workflows (a directory with none of a brain's folders is not)."""
    (tmp_path / "agents").mkdir()
    assert main(["validate", "--brain", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "ok: 0 workflow(s) (0 draft), 0 warning(s)"


def test_other_files_are_checked_read_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without PATH, agents and claims are checked too, and validate writes nothing into the brain."""
    pytest.importorskip("ambient.claims.store")
    brain = _brain(tmp_path / "brain")
    (brain / "claims").mkdir()
    (brain / "claims" / "sess-broken.yml").write_text("sess_id: [\n")
    before = sorted(p.relative_to(brain) for p in brain.rglob("*"))
    assert main(["validate", "--brain", str(brain)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert any(row.startswith("claims/sess-broken.yml:2: ") for row in out), out
    assert sorted(p.relative_to(brain) for p in brain.rglob("*")) == before
