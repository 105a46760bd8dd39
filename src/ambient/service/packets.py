"""Packets handed to ambient itself, the orchestrator interface of spec/004: those ``ambient send`` hands over the
send socket (routed as the command would route them, into the inbox) and those the inbox delivers (ORCHESTRATE
starts a run, ABORT stops runs, ADAPT changes what runs, a SPAWN runs its agent, an agent's ESCALATE asks the
person; anything else is a turn of its target's live thread).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

from ambient.core.clock import Clock
from ambient.core.lazylog import get_logger
from ambient.engine.manager import RunManager
from ambient.engine.planner import ANSWER, names_run
from ambient.engine.ports import EscalationRequest
from ambient.engine.runs import RunExecutor
from ambient.kernel import sendsocket
from ambient.kernel.channels import Channel
from ambient.kernel.inbox import write_inbox
from ambient.kernel.packet import AMBIENT, Packet, adapt_changes, adapt_changes_problem
from ambient.kernel.router import Router
from ambient.service.adapters import BrainRef
from ambient.service.escalator import StoreEscalator
from ambient.service.lineage import descends_from
from ambient.service.starts import RunStarts
from ambient.storage.paths import BrainPaths

log = get_logger(__name__)


class PacketDesk:
    """What ambient does with a packet addressed to it, or handed to it to route."""

    def __init__(
        self,
        paths: BrainPaths,
        ref: BrainRef,
        router: Router,
        manager: RunManager,
        starts: RunStarts,
        escalator: StoreEscalator,
        clock: Clock,
        deliver: Callable[[Packet], Awaitable[None]],
    ) -> None:
        self.paths = paths
        self.ref = ref
        self.router = router
        self.manager = manager
        self.starts = starts
        self.escalator = escalator
        self.clock = clock
        self.deliver = deliver  # a turn of the packet's target's live thread

    async def on_packet(self, pkt: Packet) -> None:
        """A packet ``ambient send`` delivered (the inbox): a turn of its target's live thread (a HANDOFF or a
        CHECKPOINT rewrites the handoff), then what it asks of ambient (the orchestrator interface of spec/004)."""
        await self.deliver(pkt)
        ctx = pkt.payload.context or {}
        sig = str(pkt.signal)
        if sig == "ORCHESTRATE":
            name = str(ctx.get("workflow"))
            wf = self.ref.brain.workflows.get(name)
            if wf is None:
                log.warning("orchestrate_unknown_workflow", workflow=name)
                return
            extra = ctx.get("context")
            step = ctx.get("step")
            self.starts.mark_started(name, wf.spec_hash, self.clock.now())
            self.starts.start_run(
                wf,
                trigger=f"orchestrate:{pkt.from_}",
                context=extra if isinstance(extra, dict) else None,
                at_step=str(step) if step is not None else None,
            )
        elif sig == "ABORT" and pkt.to == AMBIENT:
            self.abort_runs(pkt)
        elif sig == "ADAPT" and pkt.to == AMBIENT:
            self.adapt_runs(pkt)
        elif sig == "SPAWN" and (pkt.to in self.ref.brain.runners or pkt.to in self.ref.brain.matrix.agents):
            self.starts.start_spawn(pkt)
        elif sig == "ESCALATE" and pkt.from_ not in ("human", "ambient"):
            await self.escalate_sent(pkt)
        else:
            log.info("packet_received", signal=sig, sender=pkt.from_, to=pkt.to)

    def _named(self, pkt: Packet) -> list[RunExecutor]:
        """The unfinished runs an ABORT or ADAPT names (its ``workflow``: a run id or a workflow's name); none is
        said in the log, never dropped in silence."""
        name = str((pkt.payload.context or {}).get("workflow"))
        runs = [
            ex
            for ex in self.manager.executors.values()
            if not ex.state.finished and names_run(name, ex.state.run_id, ex.state.workflow)
        ]
        if not runs:
            log.warning(
                "packet_found_no_run",
                signal=str(pkt.signal),
                workflow=name,
                packet=pkt.id,
                sender=pkt.from_,
                reason="no unfinished run has that run id or workflow name",
            )
        return runs

    def abort_runs(self, pkt: Packet) -> None:
        """ABORT: each run it names is aborted (unfinished items aborted, running agents stopped; its questions are
        cancelled, saying why, as it ends)."""
        reason = str((pkt.payload.context or {}).get("reason", ""))
        for ex in self._named(pkt):
            log.info("run_aborting", run_id=ex.state.run_id, workflow=ex.state.workflow, by=pkt.from_, reason=reason)
            ex.abort(by=pkt.from_, reason=reason)

    def adapt_runs(self, pkt: Packet) -> None:
        """ADAPT ``changes: {skip: [...]}``: the named items of each run it names that have not started are skipped;
        what it skipped and what it did not (why) is logged and noted in the run's journal. The router refused any
        other ``changes`` (:func:`~ambient.kernel.packet.adapt_changes_problem`)."""
        ctx = pkt.payload.context or {}
        skip = adapt_changes(ctx.get("changes"))
        if skip is None:  # a packet the router let through under an older rule: said, not dropped in silence
            log.warning("adapt_refused", packet=pkt.id, reason=adapt_changes_problem(ctx.get("changes")))
            return
        for ex in self._named(pkt):
            skipped, refused = ex.adapt(by=pkt.from_, skip=skip)
            say = log.warning if refused else log.info
            say(
                "run_adapted",
                run_id=ex.state.run_id,
                workflow=ex.state.workflow,
                by=pkt.from_,
                skipped=skipped,
                not_skipped=refused,
            )

    async def escalate_sent(self, pkt: Packet) -> None:
        """An agent's ESCALATE handed in by ``ambient send``, outside any run: an escalation like any other (file,
        notification, ``ambient decide``, Telegram); the answer SPAWNs the agent again with it in
        ``payload.context.decision``, as a one-item run."""
        ctx = pkt.payload.context or {}
        question = str(ctx.get("question") or f"{pkt.from_} asks a decision")
        req = EscalationRequest(
            run_id=pkt.session_id or f"send-{pkt.id}",
            workflow=f"spawn-{pkt.from_}",
            item=None,
            agent=pkt.from_,
            kind="question",
            question=question[:2000],
            options=[(o, o, ANSWER) for o in pkt.payload.options],
            dedupe_key=f"send/{pkt.id}",
            respawn=pkt.from_,
        )
        await self.escalator.escalate(req)

    async def route_sent(self, raw: bytes, token: str | None, peer: int | None = None) -> dict[str, Any]:
        """A packet ``ambient send`` handed over the send socket: routed as the command would route it itself.

        No token is the person, unless the peer is one of the daemon's agents (its descendant, see
        :mod:`~.lineage`): an agent that unset its token is nobody the router vouches for."""
        registry = self.router.registry
        channel = registry.channel_for(token) if registry is not None else Channel.human()
        if not token and peer is not None and descends_from(peer, os.getpid()) is not False:
            channel = Channel("unauthenticated")
            log.warning("send_without_token_from_an_agent", peer=peer)
        outcome = await self.router.send(raw, channel, deliver=self._to_inbox)
        answer = sendsocket.summary(outcome)
        log.info("packet_sent", via="socket", status=answer["status"], packet=answer["id"], to=answer["to"])
        return answer

    async def _to_inbox(self, pkt: Packet) -> None:
        await asyncio.to_thread(write_inbox, self.paths, pkt)
