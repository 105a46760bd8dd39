"""Agent runners: how an agent carries out a SPAWN (DESIGN §5), configured per agent by ``kind``.

``command`` runs a program (argv, no shell), ``callable`` a Python function, ``assisted`` waits for a person or an
external tool to close a claim, ``claude`` runs the agent's prompt on Claude Code (the ``claude`` extra), ``llm`` makes
one model call (the ``llm`` extra). :class:`Runners` holds one runner per kind for the daemon and drains them on stop.

What every runner shares: ``base`` (the request of one SPAWN and the :class:`Runner` protocol), ``runner_config`` (an
agent's runner configuration, by kind), ``result`` (the :class:`AgentResult` a runner returns), ``answer`` (the agent
protocol: what an agent may answer and the result it becomes; an AI agent's reply read into it) and ``argv`` (a
command agent's ``{{name}}`` templates).

The command runner (``command``) is made of: ``agent_env`` (the agent's environment, packet and working folder),
``child`` (starting it: the spawner, or ``Popen`` waited for through a pidfd), ``pipes`` (its stdio),
``process_group`` (signalling and ending its group), ``confinement`` and ``landlock`` (its user and what it may
touch), ``spawner`` and ``spawner_helper`` (the helper process that starts agents off the event loop).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ambient.core.errors import RunnerError

if TYPE_CHECKING:  # at run time each name is imported when first used (:func:`__getattr__`)
    from ambient.runners.answer import interpret_output
    from ambient.runners.argv import render_arg, render_argv
    from ambient.runners.base import Runner, RunRequest, idempotency_key
    from ambient.runners.callable import CallableRunner, import_from_string
    from ambient.runners.command import CommandRunner
    from ambient.runners.process_group import group_alive, signal_group, terminate_group
    from ambient.runners.result import AgentResult, AgentStatus, Reason, ResultStatus, Usage, error_result
    from ambient.runners.runner_config import (
        AnyRunnerConfig,
        AssistedRunnerConfig,
        CallableRunnerConfig,
        ClaudeRunnerConfig,
        CommandRunnerConfig,
        LlmRunnerConfig,
        RunnerConfig,
        parse_runner_config,
    )

#: Where each name of this package lives. Importing one module of the package (``ambient.runners.result`` for a
#: run's state in ``ambient decide``) no longer imports every runner with it: the command runner, the spawner and
#: the runners' configuration models were a third of the CPU of such a command.
_HOMES = {
    "interpret_output": "answer",
    "render_arg": "argv",
    "render_argv": "argv",
    "Runner": "base",
    "RunRequest": "base",
    "idempotency_key": "base",
    "CallableRunner": "callable",
    "import_from_string": "callable",
    "CommandRunner": "command",
    "group_alive": "process_group",
    "signal_group": "process_group",
    "terminate_group": "process_group",
    "AgentResult": "result",
    "AgentStatus": "result",
    "Reason": "result",
    "ResultStatus": "result",
    "Usage": "result",
    "error_result": "result",
    "AnyRunnerConfig": "runner_config",
    "AssistedRunnerConfig": "runner_config",
    "CallableRunnerConfig": "runner_config",
    "ClaudeRunnerConfig": "runner_config",
    "CommandRunnerConfig": "runner_config",
    "LlmRunnerConfig": "runner_config",
    "RunnerConfig": "runner_config",
    "parse_runner_config": "runner_config",
}


def __getattr__(name: str) -> object:
    """A name of the package, imported from its module on first use (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


__all__ = [
    "AgentResult",
    "AgentStatus",
    "AnyRunnerConfig",
    "AssistedRunnerConfig",
    "CallableRunner",
    "CallableRunnerConfig",
    "ClaudeRunnerConfig",
    "CommandRunner",
    "CommandRunnerConfig",
    "LlmRunnerConfig",
    "Reason",
    "ResultStatus",
    "RunRequest",
    "Runner",
    "RunnerConfig",
    "Runners",
    "Usage",
    "error_result",
    "group_alive",
    "idempotency_key",
    "import_from_string",
    "interpret_output",
    "parse_runner_config",
    "render_arg",
    "render_argv",
    "signal_group",
    "terminate_group",
]


class Runners:
    """One runner per kind, owned by the daemon: ``get(cfg)`` picks the runner, ``terminate_all`` drains them.

    The assisted runner lives on top of the claim store, and the AI runners (``claude``, ``llm``) on the daemon's
    state and live threads, so the daemon passes them in; a kind without its runner cannot be run (``get`` raises
    :class:`RunnerError`).
    """

    def __init__(
        self,
        *,
        command: CommandRunner | None = None,
        callable_runner: CallableRunner | None = None,
        assisted: Runner | None = None,
        claude: Runner | None = None,
        llm: Runner | None = None,
    ) -> None:
        from ambient.runners.callable import CallableRunner
        from ambient.runners.command import CommandRunner

        self.command = command or CommandRunner()
        self.callable = callable_runner or CallableRunner()
        self.assisted = assisted
        self.claude = claude
        self.llm = llm

    def get(self, cfg: AnyRunnerConfig) -> Runner:
        """The runner for ``cfg.kind``."""
        from ambient.runners.runner_config import CallableRunnerConfig, CommandRunnerConfig

        if isinstance(cfg, CommandRunnerConfig):
            return self.command
        if isinstance(cfg, CallableRunnerConfig):
            return self.callable
        runner = {"assisted": self.assisted, "claude": self.claude, "llm": self.llm}[cfg.kind]
        if runner is None:
            msg = f"no {cfg.kind} runner is configured in this daemon"
            raise RunnerError(msg)
        return runner

    async def run(self, req: RunRequest, cfg: AnyRunnerConfig) -> AgentResult:
        """Shortcut for ``self.get(cfg).run(req, cfg)``."""
        return await self.get(cfg).run(req, cfg)

    async def terminate_all(self, grace: float | None = None) -> int:
        """Kill every running command agent's process group (SIGTERM, ``grace``, SIGKILL); refuse new ones."""
        return await self.command.terminate_all(grace)

    def close(self) -> None:
        """Release what the runners hold (the command runner's spawner): after :meth:`terminate_all`."""
        self.command.close()
