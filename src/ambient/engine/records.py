"""Run records (ADR-027): the JSON shape of what the learning loop reads. No I/O.

One summary line per finished run is appended to ``.ambient/runs.jsonl``::

    {"kind": "run", "run_id": ..., "workflow": "deploy-batch", "spec_hash": ...,
     "started_at": ISO8601, "completed_at": ISO8601, "outcome": "success|partial|failed|aborted",
     "steps": [{"item": "instance-01", "agent": "deploy", "signal_out": "SPAWN",
                "signal_in": "RETURN", "result": "success", "duration_ms": 1240,
                "attempt": 1, "key": "run/item/attempt", "error": null}],
     "escalations": 1, "auto_decisions": 0, "errors": 1, "decisions": [{"escalation": id, "option": "retry",
                "by": "human", "channel": "cli", "latency_s": 12.5, "auto": false}],
     "cost_usd": 0.42, "input_tokens": 1200, "output_tokens": 300, "cache_read_tokens": 9000,
     "cache_write_tokens": 0, "turns": 7, "models": ["claude-sonnet-4-5"], "cost_unknown": 1}

A step of an AI agent carries ``usage`` (model, tokens, ``cost_usd``, turns, session id: ``Usage.to_record()``) and
the run its totals; ``cost_unknown`` counts the attempts without a price (their tokens are counted, their cost is
not: the run's ``cost_usd`` is then a lower bound). Runs of command agents, and records written before ambient
knew of costs, have none of these fields. A step whose agent asked for a tool permission carries its
``permission_signature`` (``Bash: rm -rf build/``).

``escalations`` counts those that reached the person; ``auto_decisions`` those a learned rule decided alone (a record
without ``auto_decisions``, written before, counted both in ``escalations``: readers subtract its automatic decisions).

``result`` is one of ``success``, ``fail``, ``error``, ``skipped``, ``interrupted``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

StepResult = Literal["success", "fail", "error", "skipped", "interrupted"]


def is_failure(step: Mapping[str, Any]) -> bool:
    """Whether a recorded step is a business failure (exit 1, ``status: failed``): not an error (exit 2+, the
    agent's ERROR, output off the protocol), not the agent's question (also recorded as ``fail``). Records older
    than ``reply`` are read from their result and signal."""
    if "reply" in step:
        return bool(step["reply"] == "fail")
    return step.get("result") == "fail" and step.get("signal_in") in (None, "RETURN")


def recovered(steps: Iterable[Mapping[str, Any]]) -> set[str]:
    """The items of a record whose last step succeeded: their earlier errors (a retry, the person's ``retry``) are no
    failures any more, and the lists of failures (``ambient status``, the console's overview) leave them out."""
    last: dict[str, Any] = {}
    for step in steps:
        last[str(step.get("item"))] = step.get("result")
    return {item for item, result in last.items() if result == "success"}


Outcome = Literal["success", "partial", "failed", "aborted", "running"]


class StepRecord(BaseModel):
    """One agent execution of a run (a for_each item or a chain step, one attempt)."""

    model_config = ConfigDict(extra="allow")

    item: str
    agent: str
    signal_out: str = "SPAWN"
    signal_in: str | None = None
    result: StepResult
    duration_ms: int = 0
    attempt: int = 1
    key: str | None = None
    error: str | None = None
    at: datetime | None = None
    usage: dict[str, Any] | None = None  # an AI agent's model, tokens, cost_usd, turns, session_id
    permission_signature: str | None = None  # the tool call its ESCALATE asked the person about


class DecisionRecord(BaseModel):
    """How an escalation of the run was decided."""

    model_config = ConfigDict(extra="allow")

    escalation: str
    option: str
    by: str = "human"
    channel: str = "cli"
    latency_s: float | None = None
    auto: bool = False
    rule: str | None = None


class RunRecord(BaseModel):
    """The summary of one run, as appended to ``runs.jsonl``."""

    model_config = ConfigDict(extra="allow")

    kind: Literal["run"] = "run"
    run_id: str
    workflow: str
    spec_hash: str | None = None
    started_at: datetime
    completed_at: datetime | None = None
    outcome: Outcome
    steps: list[StepRecord] = Field(default_factory=list)
    escalations: int = 0  # that reached the person (a learned rule's automatic decisions are not among them)
    auto_decisions: int | None = None  # escalations a learned rule decided alone (absent from older records)
    errors: int = 0
    decisions: list[DecisionRecord] = Field(default_factory=list)
    # chains: the steps a human gate asked about before they ran, and whether the run went past its last step
    # (ambient.learning.replay needs both: a gate rejected leaves no step behind)
    gated: list[str] = Field(default_factory=list)
    reached_end: bool = False
    # every escalation of the run: escalation, kind, item, agent (the agent's statistics count them)
    asked: list[dict[str, Any]] = Field(default_factory=list)
    form: Literal["for_each", "chain"] | None = None
    total: int | None = None  # items (for_each) or steps (chain) of the run, started or not
    done: int | None = None  # of them, done
    # what the run's AI agents consumed (ambient.engine.budget.UsageTotals.to_record): absent for runs without any
    cost_usd: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    turns: int | None = None
    models: list[str] | None = None
    cost_unknown: int | None = None  # attempts whose cost is unknown: cost_usd is then a lower bound
    spent_by_day: dict[str, float] | None = None  # UTC day → what the run spent that day (today's budget at a start)
    # the model calls the gateway metered or refused, per agent and model: agent, model, calls, tokens, cost_usd,
    # cost_unknown, refused
    calls_by: list[dict[str, Any]] | None = None

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON-ready dict written as one line."""
        return self.model_dump(mode="json", exclude_none=True)
