"""Agent runners: how an agent carries out a SPAWN (DESIGN §5), configured per agent by ``kind``.

``command`` runs a program (argv, no shell), ``callable`` a Python function, ``assisted`` waits for a person or an
external tool to close a claim. :class:`Runners` holds one runner per kind for the daemon and drains them on stop.
The agent protocol (what an agent receives and may answer) is :func:`ambient.runners.base.interpret_output`.
"""

from __future__ import annotations

from ambient.errors import RunnerError
from ambient.runners.base import (
    AgentResult,
    AgentStatus,
    AssistedRunnerConfig,
    CallableRunnerConfig,
    CommandRunnerConfig,
    Reason,
    ResultStatus,
    Runner,
    RunnerConfig,
    RunnerConfigError,
    RunRequest,
    TemplateError,
    error_result,
    idempotency_key,
    interpret_output,
    parse_runner_config,
    render_arg,
    render_argv,
)
from ambient.runners.callable import CallableRunner, ImportFromStringError, import_from_string
from ambient.runners.command import CommandRunner, group_alive, signal_group, terminate_group

__all__ = [
    "AgentResult",
    "AgentStatus",
    "AssistedRunnerConfig",
    "CallableRunner",
    "CallableRunnerConfig",
    "CommandRunner",
    "CommandRunnerConfig",
    "ImportFromStringError",
    "Reason",
    "ResultStatus",
    "RunRequest",
    "Runner",
    "RunnerConfig",
    "RunnerConfigError",
    "Runners",
    "TemplateError",
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

    The assisted runner lives on top of the claim store, so the daemon passes it in; without one, an agent
    configured as ``assisted`` cannot be run (``get`` raises :class:`RunnerError`).
    """

    def __init__(
        self,
        *,
        command: CommandRunner | None = None,
        callable_runner: CallableRunner | None = None,
        assisted: Runner | None = None,
    ) -> None:
        self.command = command or CommandRunner()
        self.callable = callable_runner or CallableRunner()
        self.assisted = assisted

    def get(self, cfg: CommandRunnerConfig | CallableRunnerConfig | AssistedRunnerConfig) -> Runner:
        """The runner for ``cfg.kind``."""
        if isinstance(cfg, CommandRunnerConfig):
            return self.command
        if isinstance(cfg, CallableRunnerConfig):
            return self.callable
        if self.assisted is None:
            msg = "no assisted runner is configured in this daemon"
            raise RunnerError(msg)
        return self.assisted

    async def run(
        self, req: RunRequest, cfg: CommandRunnerConfig | CallableRunnerConfig | AssistedRunnerConfig
    ) -> AgentResult:
        """Shortcut for ``self.get(cfg).run(req, cfg)``."""
        return await self.get(cfg).run(req, cfg)

    async def terminate_all(self, grace: float | None = None) -> int:
        """Kill every running command agent's process group (SIGTERM, ``grace``, SIGKILL); refuse new ones."""
        return await self.command.terminate_all(grace)

    def close(self) -> None:
        """Release what the runners hold (the command runner's spawner): after :meth:`terminate_all`."""
        self.command.close()
