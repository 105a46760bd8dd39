"""Workflow documents the tests of ambient.workflows build on: small for_each and chain mappings, the examples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ambient.config.workflows import LoadedWorkflow, load_workflow_bytes

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "brain" / "workflows"


def for_each_doc(**over: Any) -> dict[str, Any]:
    """A valid for_each document (two items, one scope file); ``over`` replaces top-level keys."""
    data: dict[str, Any] = {
        "workflow": "wf",
        "for_each": {"items": ["a", "b"], "spawn": "deploy", "scope": {"files": ["infrastructure/{{item}}.yml"]}},
    }
    data.update(over)
    return data


def chain_doc(*steps: dict[str, Any], **over: Any) -> dict[str, Any]:
    """A chain document of these steps; ``over`` adds or replaces top-level keys."""
    data: dict[str, Any] = {"name": "ch", "chain": list(steps)}
    data.update(over)
    return data


def step_doc(n: int | str, **over: Any) -> dict[str, Any]:
    """A valid code step ``n``; ``over`` adds or replaces its keys."""
    step: dict[str, Any] = {"step": n, "type": "code", "scope": "projets/x/", "agents": ["coder"]}
    step.update(over)
    return step


def load_text(text: str, name: str = "t.yml") -> tuple[LoadedWorkflow | None, list[Any]]:
    """Load a workflow file's text as the daemon would, problems at their lines."""
    return load_workflow_bytes(text.encode(), source=name)
