"""How runs start: a workflow pinned to the version loaded now (by its file, its schedule, a chain's trigger, an
ORCHESTRATE), optionally at a step; a SPAWN handed in by ``ambient send`` as a one-item run; an answer to an agent's
own ESCALATE, which runs the agent again with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from ambient.config.workflows import LoadedWorkflow
from ambient.core.clock import Clock
from ambient.core.errors import AmbientError
from ambient.core.lazylog import get_logger
from ambient.engine import events
from ambient.engine.compile import items_of
from ambient.engine.manager import RunManager
from ambient.engine.runs import new_run_id
from ambient.human.escalations import Escalation
from ambient.kernel.packet import Packet
from ambient.service.adapters import BrainRef
from ambient.storage.paths import BrainPaths
from ambient.workflows.spec import ChainWorkflow, parse_workflow

log = get_logger(__name__)


def respawn_run_id(esc: Escalation) -> str:
    """The run an answer to an agent's own ESCALATE (sent outside any run) starts: the same for the same answer."""
    return new_run_id(f"spawn-{esc.respawn}", esc.answered_at or esc.created_at, esc.id.removeprefix("esc-"))


class RunStarts:
    """Every start of a run goes through here, so that each is journaled, counted and shown alike."""

    def __init__(
        self,
        paths: BrainPaths,
        ref: BrainRef,
        manager: RunManager,
        clock: Clock,
        progress: Callable[[str], None],
        mark_started: Callable[[str, str, datetime], None],
    ) -> None:
        self.paths = paths
        self.ref = ref
        self.manager = manager
        self.clock = clock
        self.progress = progress  # live progress lines (a terminal)
        self.mark_started = mark_started  # the workflows evaluator's memory: a started workflow is not "new"

    def start_run(
        self,
        wf: LoadedWorkflow,
        *,
        trigger: str,
        context: Mapping[str, Any] | None = None,
        mode: str | None = None,
        at_step: str | None = None,
    ) -> str:
        """Start a run pinned to this version of the workflow (its spec and hash are in the journal)."""
        spec = wf.spec
        items = items_of(spec)
        run_id = self.manager.start(
            workflow=spec.name,
            form=spec.form,
            spec=spec.model_dump(mode="json"),
            spec_hash=wf.spec_hash,
            items=items,
            mode=mode or spec.mode,
            trigger=trigger,
            context=context,
        )
        if at_step is not None and isinstance(spec, ChainWorkflow):
            ex = self.manager.executors[run_id]
            idx = next((i for i, s in enumerate(spec.chain) if s.key == str(at_step)), None)
            if idx is None:
                log.warning("start_step_unknown", workflow=spec.name, step=at_step, run_id=run_id)
            elif idx:
                for earlier in spec.chain[:idx]:  # not run: skipped, so the run's outcome counts only what ran
                    ex.event(events.skipped, item=earlier.key, before_start=True)
                ex.event(events.cursor, index=idx)
        self.progress(
            f"run started: {spec.name} ({len(items)} {'items' if spec.form == 'for_each' else 'steps'}) — {run_id}"
        )
        return run_id

    def by_trigger(self, name: str, step: str | None, context: Mapping[str, Any], trigger: str) -> str | None:
        """A chain's ``trigger:<workflow>/<step>``: a run of that workflow, at that step."""
        wf = self.ref.brain.workflows.get(name)
        if wf is None or not wf.spec.runnable:
            log.warning("trigger_unknown_workflow", workflow=name)
            return None
        self.mark_started(name, wf.spec_hash, self.clock.now())
        return self.start_run(wf, trigger=trigger, context=context, at_step=step)

    def has_active_run(self, workflow: str) -> bool:
        return any(ex.state.workflow == workflow for ex in self.manager.executors.values())

    def start_spawn(self, pkt: Packet) -> str | None:
        """A SPAWN handed in by ``ambient send`` runs its agent: a one-item run ``spawn-<agent>``, seen in ``status``
        and ``runs`` like any other, its SPAWN sent from the packet's sender (the matrix decides it again), the
        packet's files locked, its ``payload.context`` handed to the agent, its questions escalated to the sender."""
        return self._start_one(
            pkt.to,
            pkt.from_,
            list(pkt.scope.files),
            pkt.scope.zone,
            dict(pkt.payload.context or {}),
            item=pkt.id,
            trigger=f"send:{pkt.from_}",
        )

    def _start_one(
        self,
        agent: str,
        sender: str,
        files: list[str],
        zone: str | None,
        context: dict[str, Any],
        *,
        item: str,
        trigger: str,
        run_id: str | None = None,
    ) -> str | None:
        if any("{{" in f for f in files):
            log.warning("spawn_refused", agent=agent, item=item, reason="a file of the SPAWN contains '{{'")
            return None
        doc = {
            "workflow": f"spawn-{agent}",
            "description": f"a SPAWN of {agent} sent by {sender}",
            "sender": sender,
            "supervisor": sender,
            "for_each": {"items": [item], "spawn": agent, "scope": {"zone": zone, "files": files}},
        }
        try:
            spec = parse_workflow(doc)
        except AmbientError as exc:
            log.warning("spawn_refused", agent=agent, item=item, reason=str(exc))
            return None
        run_id = self.manager.start(
            workflow=spec.name,
            form=spec.form,
            spec=spec.model_dump(mode="json"),
            spec_hash=None,
            items=[item],
            trigger=trigger,
            context=context,
            run_id=run_id,
        )
        self.progress(f"run started: {spec.name} (a SPAWN from {sender}) — {run_id}")
        return run_id

    def respawn(self, esc: Escalation) -> None:
        """The answer to an agent's own ESCALATE (see :meth:`~.packets.PacketDesk.escalate_sent`): the agent runs
        again with it."""
        option = esc.decided_option
        answer = option.label if option is not None else str(esc.decision)
        assert esc.respawn is not None
        # One run per answer, whatever restarts come: its id comes from the escalation, and a journal under that id
        # means the answer was acted on already (every start re-reads the answered escalations).
        run_id = respawn_run_id(esc)
        if self.paths.run_journal(run_id).exists():
            return
        self._start_one(
            esc.respawn,
            "human",
            [],
            None,
            {"decision": answer, "question": esc.question, "escalation": esc.id},
            item=esc.id,
            trigger=f"decision:{esc.id}",
            run_id=run_id,
        )
