"""The model gateway's hooks (:mod:`ambient.runners.gateway`): a call is let out by its run's budget and recorded in
its run's journal.

Both go to the run's executor (:meth:`ambient.engine.runs.RunExecutor.over_budget` and ``record_call``), so the
budget rules stay in :mod:`ambient.engine.budget` and the spend in the run journal, where a restart reads it back
before any run starts an agent, hence before any call is let out.
"""

from __future__ import annotations

from ambient.engine.events import CallFields
from ambient.engine.manager import RunManager
from ambient.runners.gateway import Grant, MeteredCall


class RunMetering:
    """What the daemon decides and keeps for the gateway, run by run."""

    def __init__(self, manager: RunManager) -> None:
        self.manager = manager

    def admit(self, grant: Grant) -> str | None:
        """Why a call of ``grant`` may not go out now: its run's or the day's budget is reached."""
        executor = self.manager.executors.get(grant.run_id)
        return executor.over_budget() if executor is not None else None

    async def record(self, grant: Grant, call: MeteredCall) -> None:
        """The call in its run's journal, fsync'd (its run ended meanwhile: RuntimeError, the call is logged)."""
        executor = self.manager.executors.get(grant.run_id)
        if executor is None:
            raise RuntimeError(f"run {grant.run_id} is not running any more: call {call.id} is not recorded")
        fields: CallFields = {
            "item": grant.item,
            "attempt": grant.attempt,
            "agent": grant.agent,
            "key": grant.key,
            "id": call.id,
            "usage": call.usage.to_record(),
            "sent": call.sent,
        }
        if call.stream:
            fields["stream"] = True
        if call.partial:
            fields["partial"] = True
        await executor.record_call(fields)
