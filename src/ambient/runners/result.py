"""What came back from one agent execution: :class:`AgentResult`, why it is not a success, what it cost; and why an
item's attempt follows an earlier one (:class:`Resumed`, told to a resumed session). Pure.

Every runner returns one (a runner never raises for an agent's failure); the engine maps it onto the workflow's
``on_return`` outcomes and the run records carry :meth:`AgentResult.to_record`. How an agent's answer becomes one is
:mod:`ambient.runners.answer`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

AgentStatus = Literal["success", "fail", "error", "escalate", "blocked"]
ResultStatus = Literal["ok", "partial", "failed"]
#: Why a result is not a plain success. ``None`` for success, escalate and blocked.
Reason = Literal[
    "agent_failed",  # the agent reported a business failure (status failed, or exit code 1)
    "agent_error",  # the agent reported an ERROR (signal ERROR or status error)
    "exit_code",  # exit code 2..255
    "signal",  # the agent died from a signal ambient did not send (crash, abort, OOM kill)
    "timeout",  # ambient killed the process group at timeout_s
    "output_over_cap",  # ambient killed the process group: stdout over max_output_bytes
    "shutdown",  # ambient killed the process group because the daemon is stopping
    "bad_output",  # exit 0 but stdout is not a valid agent answer (see the protocol)
    "sender_mismatch",  # the answer claims to come from someone else than the spawned agent (S-05)
    "spawn_failed",  # the program could not be started (not found, not executable, bad cwd)
    "daemon_resources",  # ambient itself ran out of something starting it (descriptors, memory): not the agent
    "bad_request",  # the request could not be turned into a process (template, NUL, packet too big, import)
    "exception",  # a callable agent raised
    "provider_refused",  # the model provider refused the key (401/403): the person must act, no retry helps
    "provider_failed",  # the model provider kept failing (429/5xx after retries)
    "provider_unreachable",  # the model API cannot be reached or is not one (connection refused, 404): the person acts
    "budget",  # the agent's own max_budget_usd or max_turns ended it
    "over_budget",  # the model gateway refused a call: the run's or the day's budget is reached (the run holds)
    "worker_unreachable",  # the worker running a dispatched attempt was silent past cluster.unreachable_after_s
]

#: Errors no automatic retry may follow: the agent's own ERROR (it said the failure is unrecoverable), and a worker
#: gone silent (the person decides: another try may meet the same partition, or the item may be skipped).
NOT_RETRIED: frozenset[str] = frozenset({"agent_error", "worker_unreachable"})

_SIGNAL_OF_STATUS: dict[str, str] = {
    "success": "RETURN",
    "fail": "RETURN",
    "error": "ERROR",
    "escalate": "ESCALATE",
    "blocked": "BLOCKED_ON",
}


@dataclass(frozen=True, slots=True)
class Usage:
    """What one AI agent execution consumed: the figures run records and ``ambient stats`` carry.

    ``cost_usd`` is None when nobody knows the price (a model outside the built-in table with no ``price:``).
    """

    model: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float | None = None
    turns: int = 0
    session_id: str | None = None
    #: The model gateway metered these calls one by one (each a ``call`` event of the run's journal, counted there):
    #: this is the attempt's total, not a figure to add again.
    metered: bool = False
    refused_calls: int = 0  # model calls the gateway refused (a budget reached): not sent, not billed

    def to_record(self) -> dict[str, Any]:
        """JSON-ready, zero and unknown figures left out."""
        out: dict[str, Any] = {}
        for name in self.__slots__:
            value = getattr(self, name)
            if value not in (None, 0, False):
                out[name] = value
        return out


@dataclass(frozen=True, slots=True)
class AgentResult:
    """What came back from one agent execution, already mapped onto ``on_return`` outcomes.

    ``status``: success | fail (business failure) | error | escalate | blocked. ``output`` is the JSON object the
    agent printed, as parsed (``None`` if none). ``result`` is the normalised result mapping of a RETURN (success
    or fail), with ``result_status`` ok | partial | failed for chain exit triggers (spec/004). ``options`` and
    ``question`` come with escalate; ``context`` with error and blocked. ``reason`` says why a result is not a
    success; ``killed`` is True when ambient signalled the agent's process group.
    """

    status: AgentStatus
    output: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    result_status: ResultStatus | None = None
    options: list[str] | None = None
    question: str | None = None
    context: dict[str, Any] | None = None
    exit_code: int | None = None
    duration_ms: int = 0
    stderr_tail: str = ""
    error: str | None = None
    killed: bool = False
    reason: Reason | None = None
    pid: int | None = None
    usage: Usage | None = None  # an AI agent's tokens, cost, turns and session
    #: A tool call the agent waits on the person for (``ambient.runners.permissions``): its ESCALATE is about that.
    permission: dict[str, Any] | None = None

    @property
    def signal(self) -> str:
        """The packet signal this result becomes: RETURN, ERROR, ESCALATE or BLOCKED_ON."""
        return _SIGNAL_OF_STATUS[self.status]

    @property
    def ok(self) -> bool:
        """True for a success."""
        return self.status == "success"

    def with_process(self, **changes: Any) -> AgentResult:
        """A copy with process facts (exit code, duration, stderr tail, pid...) filled in."""
        return replace(self, **changes)

    def to_record(self) -> dict[str, Any]:
        """A JSON-ready summary for run records (no raw output, which may be large)."""
        out: dict[str, Any] = {"status": self.status, "signal": self.signal, "duration_ms": self.duration_ms}
        for name in ("result_status", "exit_code", "error", "reason", "pid"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.killed:
            out["killed"] = True
        if self.usage is not None:
            out["usage"] = self.usage.to_record()
        return out


def error_result(reason: Reason, message: str, **extra: Any) -> AgentResult:
    """An ``error`` result with a reason code and a human message."""
    return AgentResult(status="error", reason=reason, error=message, **extra)


#: Why an item runs again: the person answered its escalation, a retry after the attempt before failed, or ambient
#: stopped (a restart, a crash) while it ran.
ResumeWhy = Literal["answered", "retry", "restart"]


@dataclass(frozen=True, slots=True)
class Resumed:
    """Why this attempt follows an earlier one of the same item, as the run journal says: a resumed session is told
    exactly what happened (told "interrupted" after an answer, a real model may redo work it has done)."""

    why: ResumeWhy
    question: str | None = None  # answered: what the person was asked
    answer: str | None = None  # answered: their answer (the option, in the agent's words when it proposed it)
    error: str | None = None  # retry: how the attempt before ended
    crash: bool = False  # restart: the daemon died (kill, power loss) rather than being stopped
