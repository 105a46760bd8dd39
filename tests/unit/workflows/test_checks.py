"""Checks of a spec beyond its schema: structure, warnings, typos, template variables per place, item paths."""

from __future__ import annotations

from typing import Any

from ambient.workflows.checks import spec_issues
from ambient.workflows.spec import parse_workflow
from tests.unit.workflows.documents import chain_doc, for_each_doc, load_text, step_doc


def _issues(data: dict[str, Any]) -> list[tuple[str, str]]:
    from ambient.engine.compile import workflow_issues

    return [(i.severity, i.message) for i in workflow_issues(parse_workflow(data))]


def test_chain_structure_checks() -> None:
    """Duplicate steps, missing trigger targets and loops are errors, with the loop spelled out."""
    assert "declared twice" in _issues(chain_doc(step_doc(1), step_doc(1)))[0][1]
    assert "names no step" in _issues(chain_doc(step_doc(1, on_done="trigger:9")))[0][1]
    loop = _issues(chain_doc(step_doc(1), step_doc(2), step_doc(3, on_done="trigger:1")))
    assert loop == [("error", "on_done makes a loop (1 → 2 → 3 → 1); loops are not supported, use retry:")]
    self_loop = _issues(chain_doc(step_doc(1, on_fail="trigger:1")))
    assert self_loop[0][0] == "error" and "loop (1 → 1)" in self_loop[0][1]
    # A forward jump is fine, and the skipped step is unreachable (a warning)...
    assert _issues(chain_doc(step_doc(1, on_done="trigger:3", on_fail="abort"), step_doc(2), step_doc(3))) == [
        ("warning", "step 2 is never reached from the first step")
    ]
    # ... unless a failure of step 1 leads there: the person may skip it (the executor's rule).
    assert _issues(chain_doc(step_doc(1, on_done="trigger:3"), step_doc(2), step_doc(3))) == []
    # A partial result's default human gate continues to the next step: no loop, everything reachable.
    assert _issues(chain_doc(step_doc(1), step_doc(2, gate="human"))) == []
    # notify: decides nothing: the chain goes on (as the executor does), so the next step is reached.
    assert _issues(chain_doc(step_doc(1), step_doc(2, on_done='notify:"deployed"'), step_doc(3))) == []
    # A failed step the person skips goes on too; abort and gate: never end the chain.
    assert _issues(chain_doc(step_doc(1, on_done="abort", on_partial="abort", on_fail="abort"), step_doc(2))) == [
        ("warning", "step 2 is never reached from the first step")
    ]


def test_chain_warnings() -> None:
    """Likely mistakes are warnings: 0-failures on a non-test step, gate never that goes on, swarm not ready."""
    assert ("warning", "gate 0-failures reads test results; step 1 is type code") in _issues(
        chain_doc(step_doc(1, gate="0-failures"))
    )
    never = _issues(chain_doc(step_doc(1, gate="never", on_done="trigger:next"), step_doc(2)))
    assert ("warning", "step 1 has gate: never (terminal) but on_done goes on") in never
    assert ("warning", "mode: swarm on a workflow not marked swarm_ready: true") in _issues(
        chain_doc(step_doc(1), mode="swarm")
    )
    contracts = _issues(chain_doc(step_doc(1), step_doc(2), swarm_ready=True))
    assert contracts == [("error", "step 2 has no input_contract; contracts are required before swarm_ready: true")]


def test_unknown_keys_are_kept_and_typos_flagged() -> None:
    """Unknown keys survive (extra=allow); close misspellings and misplaced keys are warnings."""
    spec = parse_workflow(for_each_doc(note="free text", spwan="x", on_timeout="approve"))
    assert spec.model_extra == {"note": "free text", "spwan": "x", "on_timeout": "approve"}
    messages = [i.message for i in spec_issues(spec)]
    assert messages == [
        "unknown key 'spwan' is kept but not used; did you mean 'for_each.spawn'?",
        "unknown key 'on_timeout' is kept but not used; did you mean 'on_escalate.on_timeout'?",
    ]
    # In a step (and a for_each block) every key changes how the work runs: an unknown key is an error.
    step_typo = _issues(chain_doc(step_doc(1, gaet="human")))
    assert len(step_typo) == 1 and step_typo[0][0] == "error", step_typo
    assert step_typo[0][1].startswith("unknown key 'gaet' in step 1: did you mean 'gate'? every key of step 1")
    fe = for_each_doc()
    concurency = _issues({**fe, "for_each": {**fe["for_each"], "concurency": 2}})
    assert concurency[0][0] == "error" and "did you mean 'concurrency'?" in concurency[0][1]


def test_for_each_checks() -> None:
    """for_each: local triggers and satellites in on_return are errors; an elided item list is a warning."""
    goto = for_each_doc(for_each={**for_each_doc()["for_each"], "on_return": {"fail": "trigger:2"}})
    assert "has no steps" in _issues(goto)[0][1]
    spawn = for_each_doc(for_each={**for_each_doc()["for_each"], "on_return": {"fail": "trigger → type:test"}})
    assert "chain step action" in _issues(spawn)[0][1]
    elided = for_each_doc(for_each={**for_each_doc()["for_each"], "items": ["instance-01", "...", "instance-10"]})
    assert ("warning", "item '...' looks like an elision; list every item") in _issues(elided)


def test_zone_must_match_the_files() -> None:
    """A declared scope.zone that the rendered files do not have is an error."""
    fe = {**for_each_doc()["for_each"], "scope": {"zone": "kernel", "files": ["infrastructure/{{item}}.yml"]}}
    issues = _issues(for_each_doc(for_each=fe))
    assert issues and "scope.zone is 'kernel'" in issues[0][1]


def test_template_variables_are_checked_per_place() -> None:
    """Each place has its own variables: {{item}} in a chain step or {{step}} in a scope file is an error."""
    assert "unknown template variable {{item}}" in _issues(chain_doc(step_doc(1, story_angle="do {{item}}")))[0][1]
    fe = {**for_each_doc()["for_each"], "scope": {"files": ["x/{{step}}.yml"]}}
    assert "unknown template variable {{step}}" in _issues(for_each_doc(for_each=fe))[0][1]
    done = for_each_doc(on_complete={"payload": {"result": "{{item}}"}})
    assert "unknown template variable {{item}} in on_complete" in _issues(done)[0][1]
    fine = chain_doc(step_doc(1, scope="projets/{{workflow}}/", story_angle="after {{prior.result.status}}"))
    assert _issues(fine) == []


def test_item_paths_are_checked_at_load() -> None:
    """S-01 at load: an item that would leave its folder is reported at that item's line."""
    text = (
        "workflow: w\nfor_each:\n  items:\n    - ok\n    - ../../etc/passwd\n"
        "  spawn: d\n  scope:\n    files: ['x/{{item}}']\n"
    )
    wf, problems = load_text(text)
    assert wf is None and [(p.line, "may not contain '/'" in p.message) for p in problems] == [(5, True)]


def test_many_bad_items_are_summarised() -> None:
    """A hundred bad items give five reports and a count, not a hundred lines."""
    fe = {**for_each_doc()["for_each"], "items": [f"../{i}" for i in range(100)]}
    issues = spec_issues(parse_workflow(for_each_doc(for_each=fe)))
    assert len(issues) == 6 and issues[-1].message == "and 95 more bad item paths"
