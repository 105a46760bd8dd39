"""The protocol between the engine and a runner: the :class:`RunRequest` of one SPAWN, the :class:`Runner` that
carries it out and returns an :class:`~ambient.runners.result.AgentResult`, and the ``Watch`` an AI runner reports
its turns through.

An agent's runner configuration is :mod:`ambient.runners.runner_config`, the result :mod:`ambient.runners.result`, the
answer it came from :mod:`ambient.runners.answer`; the runners (command, callable, assisted, claude, llm) do the I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ambient.runners.result import AgentResult, Resumed

#: Handoff text (DESIGN §8) is bounded to this many characters.
MAX_HANDOFF_CHARS = 4096


def idempotency_key(run_id: str, item: str, attempt: int) -> str:
    """The idempotency key of one SPAWN: ``run/item/attempt`` (RELIABILITY §1.1, Temporal's lesson)."""
    return f"{run_id}/{item}/{attempt}"


@dataclass(frozen=True, slots=True)
class RunRequest:
    """Everything a runner needs to carry out one SPAWN.

    ``packet`` is the SPAWN packet as a JSON-ready mapping (what the agent receives on stdin). ``channel_token`` is
    the per-spawn secret the agent may use to talk back; it is never part of ``repr`` and never logged.
    ``vars`` are the workflow's template values for argv (``{{item}}`` and friends); the built-in names ``item``,
    ``run_id``, ``attempt``, ``key``, ``agent``, ``brain`` and ``python`` always win over them.
    ``before_start`` is a short blocking job a command runner runs on the event loop just before the agent starts
    (the agent is not started if it raises): the daemon writes the channel file there (a few syscalls; a thread hop
    per agent cost more, see ``ChannelRegistry.mint``); other runners ignore it.
    """

    packet: Mapping[str, Any]
    agent: str
    run_id: str
    item: str
    attempt: int
    key: str
    channel_token: str = field(repr=False)
    brain: Path
    vars: Mapping[str, str] = field(default_factory=dict)
    handoff: str | None = None
    before_start: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    prompt_file: Path | None = None  # agents/<name>.md: an AI runner's system prompt is its body
    resumed: Resumed | None = None  # why the item runs again (None: its first attempt)
    #: The ``ambient worker`` running this attempt for the daemon (cluster), in the agent's ``AMBIENT_WORKER``: a
    #: daemon started again on the same host must not take the worker's agents for orphans of its own.
    worker: str | None = None

    def template_values(self, python: str) -> dict[str, str]:
        """The values argv templates may use (``python`` is the daemon's interpreter path)."""
        values = {str(k): v for k, v in self.vars.items()}
        values.update(
            item=self.item,
            run_id=self.run_id,
            attempt=str(self.attempt),
            key=self.key,
            agent=self.agent,
            brain=str(self.brain),
            python=python,
        )
        return values

    def bounded_handoff(self) -> str | None:
        """The handoff text cut to :data:`MAX_HANDOFF_CHARS`."""
        if self.handoff is None:
            return None
        return self.handoff[:MAX_HANDOFF_CHARS]


#: What an AI runner reports as its agent works, for the live thread and ``ambient status``: ``(request, kind, text)``
#: with kind ``assistant`` (a message of the model), ``tool_call`` (``Bash: pytest -q``), ``tool_result`` or
#: ``denied`` (a tool call refused by the permissions). Called on the event loop; it must not block.
Watch = Callable[["RunRequest", str, str], None]


class Runner(Protocol):
    """Carries out one SPAWN. ``run`` never raises for agent failures (they become results); it re-raises
    ``CancelledError`` after cleaning up (killing the agent's processes)."""

    async def run(self, req: RunRequest, cfg: Any) -> AgentResult:
        """Run the agent for ``req`` as configured by ``cfg`` (its own kind's config) and return what came back."""
        ...
