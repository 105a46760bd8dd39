"""Template variables: the names each place allows are the keys the executors render with."""

from __future__ import annotations

from ambient.config.workflows import load_workflow
from ambient.workflows.checks import spec_issues
from ambient.workflows.spec import ChainWorkflow, ForEachWorkflow, parse_workflow
from ambient.workflows.templating import render
from ambient.workflows.variables import (
    COMPLETE_VARS,
    ITEM_VARS,
    STEP_VARS,
    completion_values,
    item_runner_values,
    item_values,
    spec_item_values,
    spec_step_values,
    step_runner_values,
    step_values,
)
from tests.unit.workflows.documents import EXAMPLES, chain_doc, for_each_doc, step_doc


def test_variable_sets_per_place() -> None:
    """The documented variable sets for items, completion and chain steps."""
    assert {"item", "index", "total", "workflow", "run_id"} == ITEM_VARS
    assert {"success_count", "fail_count", "total"} <= COMPLETE_VARS
    assert {"workflow", "step", "run_id", "prior"} <= STEP_VARS


def _every(names: frozenset[str]) -> str:
    return " ".join("{{" + n + "}}" for n in sorted(names))


def test_validation_allows_exactly_the_names_the_builders_give() -> None:
    """One home: the names `ambient validate` allows in each place are the keys of the values the executors render
    with; every one of them passes in its place, and a name of another place is refused."""
    item = item_values(item="a", index=1, total=2, workflow="w", run_id="r")
    step = step_values(workflow="w", step="1", run_id="r", prior=None, branch="", pilote="")
    done = completion_values(total=2, success=2, failed=0, errors=0, skipped=0, workflow="w", run_id="r")
    assert (set(item), set(step), set(done)) == (ITEM_VARS, STEP_VARS, COMPLETE_VARS)
    fe = for_each_doc()["for_each"]
    fan = for_each_doc(
        for_each={**fe, "context": {"all": _every(ITEM_VARS)}},
        on_complete={"payload": {"result": _every(COMPLETE_VARS)}},
    )
    assert spec_issues(parse_workflow(fan)) == []
    assert spec_issues(parse_workflow(chain_doc(step_doc(1, story_angle=_every(STEP_VARS))))) == []
    for name in sorted(STEP_VARS - ITEM_VARS):
        wrong = parse_workflow(for_each_doc(for_each={**fe, "context": {"x": "{{" + name + "}}"}}))
        assert [i.message.split(";")[0] for i in spec_issues(wrong)] == [
            "unknown template variable {{" + name + "}} in for_each.context"
        ]
    for name in sorted(ITEM_VARS - STEP_VARS):
        issues = spec_issues(parse_workflow(chain_doc(step_doc(1, story_angle="{{" + name + "}}"))))
        assert [i.message.split(";")[0] for i in issues] == [
            "unknown template variable {{" + name + "}} in story_angle"
        ]


def test_what_an_attempt_hands_the_runner() -> None:
    """An item's attempt carries its values and ``attempt``; a chain step's, the step, the workflow and the run."""
    item = item_values(item="a", index=1, total=2, workflow="w", run_id="r")
    assert item_runner_values(item, 3) == {**item, "attempt": 3}
    step = step_values(workflow="w", step="2", run_id="r", prior={"result": {}}, branch="b", pilote="p")
    assert step_runner_values(step) == {"step": "2", "workflow": "w", "run_id": "r"}


def test_step_and_completion_values() -> None:
    """step_values and completion_values give exactly the variables validation allows."""
    wf, _ = load_workflow(EXAMPLES / "feature-chain.yml")
    assert wf is not None and isinstance(wf.spec, ChainWorkflow)
    values = spec_step_values(wf.spec, wf.spec.chain[1], "r1", {"result": {"status": "ok"}})
    assert set(values) == STEP_VARS
    assert render("{{workflow}} {{step}} {{prior.result.status}}", values) == "feature-chain 2 ok"
    done = completion_values(total=10, success=9, failed=1, errors=0, skipped=0, workflow="w", run_id="r")
    assert set(done) == COMPLETE_VARS
    fan = parse_workflow(for_each_doc())
    assert isinstance(fan, ForEachWorkflow)
    assert set(spec_item_values(fan, 0)) == ITEM_VARS  # the values rendering uses are the names validation allows
    assert render("{{success_count}}/{{total}}, {{fail_count}} failed", done) == "9/10, 1 failed"


def test_a_step_reads_the_step_befores_output_as_prior_and_as_prior_result() -> None:
    """The sources write ``{{prior.result.status}}`` (spec/002 names a step's output its result); the output's own
    fields read as ``{{prior.status}}`` too, and an output with a ``result`` of its own keeps it."""

    def said(prior: object, template: str) -> str:
        return render(template, step_values(workflow="w", step="2", run_id="r", prior=prior, branch="", pilote=""))

    output = {"status": "ok", "tests": {"failed": 0}}
    assert said(output, "{{prior.result.status}} {{prior.status}} {{prior.result.tests.failed}}") == "ok ok 0"
    assert said({"result": {"status": "partial"}}, "{{prior.result.status}}") == "partial"
