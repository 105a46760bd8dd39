"""Template variables (DESIGN 5): which ``{{name}}`` each place of a workflow may use, and their values.

The one home of both sides: each place's names are declared once, as a TypedDict; `ambient validate`
(:mod:`ambient.workflows.checks`) refuses a template naming anything else, and the executors render with the
mappings the builders below return, which mypy holds to exactly those keys. So a template that passes validation
always renders ({{error_count}} once passed validation, then crashed a run's end).
"""

from __future__ import annotations

from typing import Any, Final, TypedDict

from ambient.workflows.spec import ChainStep, ChainWorkflow, ForEachWorkflow


class ItemVariables(TypedDict):
    """A for_each item's values (its scope files, ``for_each.context``)."""

    item: str
    index: int  # from 1
    total: int
    workflow: str
    run_id: str


class StepVariables(TypedDict):
    """A chain step's values (its scope, story_angle, input_contract, a trigger's scope)."""

    workflow: str
    step: str
    run_id: str
    prior: Any  # the output of the last step done before it ({{prior.result.status}}); {} before the first
    branch: str
    pilote: str


class CompletionVariables(TypedDict):
    """A finished run's values (``on_complete.payload``)."""

    total: int
    success_count: int
    fail_count: int  # errors included
    error_count: int
    skipped_count: int
    workflow: str
    run_id: str


#: The names validation allows in each place: the keys of the mappings the executors render with.
ITEM_VARS: Final[frozenset[str]] = ItemVariables.__required_keys__
STEP_VARS: Final[frozenset[str]] = StepVariables.__required_keys__
COMPLETE_VARS: Final[frozenset[str]] = CompletionVariables.__required_keys__


def item_values(*, item: str, index: int, total: int, workflow: str, run_id: str) -> ItemVariables:
    """A for_each item's values; ``index`` counts from 1."""
    return {"item": item, "index": index, "total": total, "workflow": workflow, "run_id": run_id}


def step_values(*, workflow: str, step: str, run_id: str, prior: Any, branch: str, pilote: str) -> StepVariables:
    """A chain step's values; ``prior``: the output of the last step done before it, None before the first."""
    return {
        "workflow": workflow,
        "step": step,
        "run_id": run_id,
        "prior": _prior(prior),
        "branch": branch,
        "pilote": pilote,
    }


def _prior(output: Any) -> Any:
    """The step before's output as templates read it: ``{{prior.status}}``, and ``{{prior.result.status}}`` as the
    sources write it (spec/002 names a step's output its ``result``), unless the output has a ``result`` of its own."""
    if output is None:
        return {}
    if isinstance(output, dict) and "result" not in output:
        return {**output, "result": output}
    return output


def completion_values(
    *, total: int, success: int, failed: int, errors: int, skipped: int, workflow: str, run_id: str
) -> CompletionVariables:
    """A finished run's values: items done, failed (errors included), failed by an error, skipped."""
    return {
        "total": total,
        "success_count": success,
        "fail_count": failed,
        "error_count": errors,
        "skipped_count": skipped,
        "workflow": workflow,
        "run_id": run_id,
    }


def item_runner_values(values: ItemVariables, attempt: int) -> dict[str, Any]:
    """An item's values as one attempt carries them (``Attempt.vars``, also what its files and context are rendered
    with): the item's own and ``attempt``; the runner adds its built-in names to its argv's (item, key, agent...)."""
    return {**values, "attempt": attempt}


def step_runner_values(values: StepVariables) -> dict[str, Any]:
    """A chain step's values as its attempt hands them to the runner (``Attempt.vars``, for its argv): the step,
    the workflow and the run; ``prior`` is data for the step's templates and its context, not for an argv."""
    return {"step": values["step"], "workflow": values["workflow"], "run_id": values["run_id"]}


# -- from a spec (validation and the loader render with these: an item or step as the executor will)


def spec_item_values(spec: ForEachWorkflow, index: int, run_id: str = "run") -> ItemVariables:
    """The values of item ``index`` (the list index) of a for_each spec."""
    items = spec.for_each.items
    return item_values(item=items[index], index=index + 1, total=len(items), workflow=spec.name, run_id=run_id)


def spec_step_values(spec: ChainWorkflow, step: ChainStep, run_id: str = "run", prior: Any = None) -> StepVariables:
    """The values of a chain step of a spec; ``prior`` is the previous step's output (``{{prior.result...}}``)."""
    return step_values(
        workflow=spec.name,
        step=step.key,
        run_id=run_id,
        prior=prior,
        branch=spec.branch or "",
        pilote=spec.pilote or "",
    )
