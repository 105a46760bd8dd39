"""Loading workflow files: file:line problems, the agents and matrix callbacks, reloads, fuzzing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambient.config.workflows import check_workflow, load_workflow, load_workflow_bytes, load_workflows
from ambient.storage.paths import BrainPaths
from ambient.workflows.spec import parse_workflow
from tests.unit.workflows.documents import EXAMPLES, load_text

# --- check_workflow callbacks -----------------------------------------------------------------------


def test_check_workflow_agents_and_matrix() -> None:
    """Agents must exist; may_spawn gets (sender, agent, zone, files) and its reason becomes the problem."""
    wf, _ = load_workflow(EXAMPLES / "deploy-batch.yml")
    assert wf is not None
    calls: list[tuple[str, str, str, list[str]]] = []

    def may_spawn(sender: str, agent: str, zone: str, files: Any) -> str | None:
        calls.append((sender, agent, zone, list(files)))
        return "deploy may not work in zone project"

    assert check_workflow(wf, lambda name: True) == []
    problems = check_workflow(wf, lambda name: name != "deploy", may_spawn)
    assert [str(p) for p in problems] == [
        f"{wf.source}:9: spawn: agent 'deploy' does not exist in agents/",
    ]
    problems = check_workflow(wf, lambda name: True, may_spawn)
    assert calls == [("ambient", "deploy", "project", ["infrastructure/vps/configs/instance-01.yml"])]
    assert [p.message for p in problems] == [
        "'ambient' may not SPAWN 'deploy' in zone project: deploy may not work in zone project"
    ]


def test_check_workflow_chain_calls() -> None:
    """For a chain, every step's agent is checked with the zone of its scope; drafts only warn."""
    wf, _ = load_workflow(EXAMPLES / "feature-chain.yml")
    assert wf is not None
    seen: list[tuple[str, str, list[str]]] = []

    def may_spawn(sender: str, agent: str, zone: str, files: Any) -> str | None:
        seen.append((agent, zone, list(files)))
        return None

    assert check_workflow(wf, {"coder", "tester", "scribe", "vps"}.__contains__, may_spawn) == []
    assert seen == [
        ("coder", "project", ["projets/feature/"]),
        ("tester", "project", ["projets/feature/"]),
        ("scribe", "project", ["projets/feature/README.md"]),
        ("vps", "project", ["infrastructure/vps/"]),
    ]
    draft, _ = load_text("name: d\nstatus: draft\nchain:\n  - step: 1\n    type: code\n    scope: x/\n")
    assert draft is not None
    problems = check_workflow(draft, lambda name: False)
    assert [p.severity for p in problems] == ["warning"] and "default agent for type code, 'coder'" in problems[
        0
    ].message


def test_cross_workflow_triggers(tmp_path: Path) -> None:
    """trigger:<workflow>/<step> must name a loaded chain workflow and one of its steps."""
    wdir = tmp_path / "workflows"
    wdir.mkdir()
    (wdir / "a.yml").write_text("name: a\nchain:\n  - {step: 1, type: code, scope: x/, on_done: 'trigger:b/2'}\n")
    (wdir / "b.yml").write_text("name: b\nchain:\n  - {step: 1, type: code, scope: x/}\n")
    (wdir / "c.yml").write_text("name: c\nchain:\n  - {step: 1, type: code, scope: x/, on_done: 'trigger:zz/1'}\n")
    (wdir / "d.yml").write_text("name: d\nchain:\n  - {step: 1, type: code, scope: x/, on_done: 'trigger:b/1'}\n")
    workflows, problems = load_workflows(BrainPaths(tmp_path))
    assert sorted(workflows) == ["b", "d"]
    assert sorted(str(p) for p in problems) == [
        "workflows/a.yml:3: trigger:b/2: workflow 'b' has no step 2",
        "workflows/c.yml:3: trigger:zz/1: no workflow is named 'zz'",
    ]


def test_load_workflows_isolates_bad_files(tmp_path: Path) -> None:
    """One bad file is reported and left out; duplicates keep the first file; _ files and dotfiles are skipped."""
    wdir = tmp_path / "workflows"
    wdir.mkdir()
    good = "for_each:\n  items: [a]\n  spawn: deploy\n  scope:\n    files: ['x/{{item}}']\n"
    (wdir / "a-good.yml").write_text("workflow: one\n" + good)
    (wdir / "b-dup.yaml").write_text("workflow: one\n" + good)
    (wdir / "c-bad.yml").write_text("workflow: two\nfor_each: [")
    (wdir / "_template.yml").write_text("not: [valid")
    (wdir / ".hidden.yml").write_text("not: [valid")
    (wdir / "notes.txt").write_text("ignored")
    (wdir / "link.yml").symlink_to(wdir / "a-good.yml")
    workflows, problems = load_workflows(BrainPaths(tmp_path))
    assert list(workflows) == ["one"] and workflows["one"].source == "workflows/a-good.yml"
    lines = sorted(str(p) for p in problems)
    assert len(lines) == 3
    assert lines[0].startswith("workflows/b-dup.yaml:1: workflow name 'one' is already used by workflows/a-good.yml")
    assert lines[1].startswith("workflows/c-bad.yml:2: ")
    assert lines[2].startswith("workflows/link.yml: is a symlink")


def test_missing_workflows_dir(tmp_path: Path) -> None:
    """A brain without workflows/ has no workflows and no problems."""
    assert load_workflows(BrainPaths(tmp_path)) == ({}, [])


_YAML_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=12), st.sampled_from(
        ["trigger:next", "→ ESCALATE pilote", "{{item}}", "x/{{item}}", "human", "0-failures", "code", "deploy", "1h"]
    )),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(
            ["name", "workflow", "for_each", "chain", "items", "spawn", "scope", "files", "zone", "step", "type",
             "on_done", "on_fail", "gate", "agents", "retry", "on", "timeout", "on_return", "success", "schedule",
             "every", "on_complete", "payload", "result", "status", "mode", "context", "on_escalate"]
        ), inner, max_size=5),
    ),
    max_leaves=20,
)  # fmt: skip


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(_YAML_VALUES)
def test_loading_never_raises(data: Any) -> None:
    """Fuzz: any YAML document becomes a workflow or problems; the loader never raises."""
    from ambient.storage.yamlfile import dump_yaml

    raw = dump_yaml(data).encode()
    wf, problems = load_workflow_bytes(raw, source="fuzz.yml")
    assert (wf is None) == any(p.severity == "error" for p in problems)
    if wf is not None:
        assert parse_workflow(wf.spec.model_dump(mode="json")) == wf.spec


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_loading_bytes_never_raises(raw: bytes) -> None:
    """Fuzz: arbitrary bytes give problems, never an exception."""
    wf, problems = load_workflow_bytes(raw, source="fuzz.yml")
    assert wf is None and problems


def test_a_reload_parses_only_the_files_that_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every change in workflows/ reloads the folder: unchanged bytes are not parsed again (bench/README, finding 32),
    a changed file is, and a file that is broken stays reported on every load, lines included."""
    from ambient.config import workflows as workflowload

    paths = BrainPaths(tmp_path)
    paths.workflows.mkdir(parents=True)
    good = (
        "name: w{k}\nfor_each:\n  items: [a, b]\n  spawn: coder\n"
        '  scope:\n    zone: project\n    files: ["projects/{{{{item}}}}.md"]\n'
    )
    for k in range(3):
        (paths.workflows / f"w{k}.yml").write_text(good.format(k=k))
    (paths.workflows / "bad.yml").write_text("name: bad\nfor_each:\n  items: [a]\n  spawn: coder\n  concurrency: -2\n")
    parsed: list[str] = []
    real = workflowload.parse_yaml

    def counting(text: str, *, source: str) -> Any:
        parsed.append(source)
        return real(text, source=source)

    monkeypatch.setattr(workflowload, "parse_yaml", counting)
    workflowload._PARSED.clear()
    first, first_problems = load_workflows(paths)
    assert sorted(first) == ["w0", "w1", "w2"] and len(parsed) == 4
    again, again_problems = load_workflows(paths)
    assert len(parsed) == 4  # nothing changed, nothing parsed
    assert again == first and again_problems == first_problems
    assert any(p.file == "workflows/bad.yml" and p.line == 5 for p in again_problems)

    (paths.workflows / "w1.yml").write_text(good.format(k=1).replace("[a, b]", "[a, b, c]"))
    changed, _ = load_workflows(paths)
    assert parsed[4:] == ["workflows/w1.yml"]
    assert changed["w1"].spec.for_each.items == ["a", "b", "c"]  # type: ignore[union-attr]
    assert changed["w0"] is first["w0"]  # the same frozen result, shared
    # The problems handed out are copies: a caller extending them does not change what the next load reports.
    again_problems.append(again_problems[0])
    assert load_workflows(paths)[1] == first_problems


def test_a_reload_renders_no_item_again_but_asks_the_matrix_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checking a for_each renders every item's scope; a reload of unchanged bytes renders none (a 1,000-item file
    cost ~10 ms per reload), while the SPAWN it stands for is put to the matrix at every load: a decision that
    changed between loads is seen, and a changed file is rendered again."""
    from ambient.config import workflows as workflowload
    from ambient.workflows import templating

    paths = BrainPaths(tmp_path)
    paths.workflows.mkdir(parents=True)
    text = (
        "name: big\nfor_each:\n  items: [{items}]\n  spawn: coder\n"
        '  scope:\n    zone: project\n    files: ["projects/{{{{item}}}}.md"]\n'
    )
    (paths.workflows / "big.yml").write_text(text.format(items=", ".join(f"i{n}" for n in range(50))))
    renders: list[str] = []
    real = templating.render_path

    def counting(template: str, values: Any, rules: Any = None) -> Any:
        renders.append(template)
        return real(template, values, rules) if rules is not None else real(template, values)

    monkeypatch.setattr(templating, "render_path", counting)
    workflowload._PARSED.clear()
    workflowload._FOR_EACH_SCOPES.clear()
    asked: list[tuple[str, str]] = []
    verdict: list[str | None] = [None]

    def may_spawn(sender: str, agent: str, zone: str, files: Any) -> str | None:
        asked.append((agent, zone))
        return verdict[0]

    first, problems = load_workflows(paths, may_spawn=may_spawn)
    assert "big" in first and problems == [] and asked == [("coder", "project")]
    rendered = len(renders)
    assert rendered >= 100  # the parse's own check and the SPAWN check, each item once
    verdict[0] = "coder is not allowed in project"
    again, problems = load_workflows(paths, may_spawn=may_spawn)
    assert len(renders) == rendered  # nothing rendered again
    assert asked == [("coder", "project")] * 2 and "big" not in again
    assert [p.message for p in problems] == [
        "'ambient' may not SPAWN 'coder' in zone project: coder is not allowed in project"
    ]
    (paths.workflows / "big.yml").write_text(text.format(items="i0, i1, i2"))
    verdict[0] = None
    changed, _ = load_workflows(paths, may_spawn=may_spawn)
    assert changed["big"].spec.for_each.items == ["i0", "i1", "i2"]  # type: ignore[union-attr]
    assert len(renders) > rendered


def test_the_parse_memo_is_bounded_in_entries_and_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Least recently used results go first, past MAX_ENTRIES or MAX_BYTES; a document over MAX_BYTES is not kept."""
    from ambient.config.workflows import _Parsed

    memo = _Parsed()
    monkeypatch.setattr(_Parsed, "MAX_ENTRIES", 3)
    monkeypatch.setattr(_Parsed, "MAX_BYTES", 100)
    for k in range(4):
        memo.put((k,), None, [], 10)
    assert memo.get((0,)) is None and memo.get((1,)) is not None  # 0 went first; 1 is now the most recent
    memo.put((9,), None, [], 60)  # 10 + 10 + 10 + 60 = 90: fits; 4 entries > 3: the least recent (2) goes
    assert memo.get((2,)) is None and memo.get((1,)) is not None
    memo.put((10,), None, [], 50)  # over 100 bytes: entries go, least recent first, until it fits
    assert memo.get((3,)) is None and memo.get((9,)) is None and memo.get((10,)) is not None
    memo.put((11,), None, [], 101)
    assert memo.get((11,)) is None
