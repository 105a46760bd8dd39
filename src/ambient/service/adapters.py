"""The real ports through which a run acts: :class:`AgentDelegate` runs one attempt end to end (pre-flight, locks
kept alive by :mod:`~.leases`, SPAWN through the router, the runner, the reply through the router) and
:class:`RouterEmitter` sends the packets ambient sends on a run's behalf. The run's other ports are
:class:`~.escalator.StoreEscalator` (escalations) and :class:`~.claims_writer.ClaimsWriter` (claims mirroring runs).
Blocking file work goes through ``to_thread``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ambient.claims.locks import LockGrant, LockManager
from ambient.claims.preflight import PreflightProblem, exit_code
from ambient.claims.snapshot import run_preflight
from ambient.cluster.dispatch import Dispatcher
from ambient.config.brain import Brain, gate_typo, why_no_runner
from ambient.core.clock import Clock
from ambient.core.errors import AmbientError, LockHeldError, PacketError
from ambient.core.lazylog import get_logger
from ambient.core.redact import SecretRegistry, redact
from ambient.engine.budget import Limits
from ambient.engine.ports import Attempt, AttemptResult
from ambient.engine.runstate import RunState
from ambient.kernel.channels import Channel
from ambient.kernel.packet import Packet, make_packet
from ambient.kernel.router import Router
from ambient.live.context import HANDOFF_NAME, LiveContext
from ambient.runners import AgentResult, Runners, RunRequest
from ambient.runners.result import NOT_RETRIED
from ambient.runners.runner_config import AnyRunnerConfig
from ambient.service.leases import LeaseGuard, Leases

log = get_logger(__name__)

HANDOFF_RECHECK_S = 0.25


class BrainRef:
    """The current brain snapshot, swapped whole on reload (SIGHUP or a changed file)."""

    def __init__(self, brain: Brain) -> None:
        self.brain = brain

    def budget_limits(self) -> Limits:
        """The budgets of the settings loaded now (the spend meter reads them at each check, so a reload counts)."""
        return self.brain.settings.budget.limits()


class AgentDelegate:
    """One attempt end to end: pre-flight → locks → SPAWN → runner → reply → release."""

    def __init__(
        self,
        ref: BrainRef,
        router: Router,
        runners: Runners,
        locks: LockManager,
        clock: Clock,
        live: LiveContext | None = None,
        lock_wait_s: float = 30.0,
        secrets: SecretRegistry | None = None,
    ) -> None:
        self.ref = ref
        self.router = router
        self.runners = runners
        self.locks = locks
        self.leases = Leases(locks)
        self.clock = clock
        self.live = live
        self.lock_wait_s = lock_wait_s
        self.secrets = secrets  # masked in what an agent says before any of it is stored or sent
        self.remote: Dispatcher | None = None  # cluster: in the settings: the agents that run on workers
        # (agent, run) -> (handoff.md signature, handoff text); see _handoff.
        self._handoffs: dict[tuple[str, str], tuple[tuple[int, int] | None, asyncio.Future[str]]] = {}
        self._handoff_checked: dict[tuple[str, str], float] = {}  # key → when handoff.md was last stat'ed

    async def attempt(self, a: Attempt) -> AttemptResult:
        started = time.monotonic()
        brain = self.ref.brain
        cfg = brain.runners.get(a.agent)
        if cfg is None:
            return AttemptResult(result="error", error=why_no_runner(brain, a.agent))
        if a.timeout_s is not None and hasattr(cfg, "timeout_s"):
            cfg = cfg.model_copy(update={"timeout_s": a.timeout_s})  # validated field, same type
        if a.preflight and a.claim_id:
            problem = await self._preflight(a)
            if problem is not None:
                return AttemptResult(result="blocked", error=problem, duration_ms=_ms(started))
        try:
            spawn = make_packet(
                a.sender,
                a.agent,
                "SPAWN",
                now=self.clock.now(),
                files=list(a.files),
                zone=a.zone,
                context=dict(a.context),
                session_id=a.claim_id,
                key=a.key,
                correlation_id=a.key,
                return_to=a.sender,
                packet_id=self.router.next_id(),
            )
        except PacketError as exc:
            return AttemptResult(result="error", error=f"SPAWN refused: {exc.message}")
        sent = await self.router.send(spawn, Channel.internal(a.sender))
        if not sent.ok or sent.packet is None:
            why = sent.reason + (gate_typo(brain.matrix, sent.decision, a.sender, a.agent) if sent.decision else "")
            return AttemptResult(result="error", error=f"SPAWN denied by the router: {why}")
        grants: list[LockGrant] = []
        guard = LeaseGuard()
        try:
            for f in a.files:
                try:
                    grant = await self.locks.acquire_async(
                        f, a.claim_id or a.key, ttl_s=brain.settings.lock_ttl_min * 60, wait=self.lock_wait_s
                    )
                except LockHeldError as exc:
                    return AttemptResult(
                        result="blocked", error=f"{f} is locked by another session: {exc}", duration_ms=_ms(started)
                    )
                grants.append(grant)
                self.leases.hold(grant, guard.lost)
            ran = await guard.run(self._run(a, sent.packet, cfg))
            for g in grants:
                if not guard.lost_files and not await self.leases.still_held(g):
                    guard.lost_files.append(g.file)
            if guard.lost_files or ran is None:
                # A holder that outlived its lease cannot write (README, Locks): the agent was stopped (or had
                # ended), and what it returned counts for nothing; the item is retried or escalated by policy.
                log.warning("attempt_void_lease_lost", item=a.item, attempt=a.attempt, files=guard.lost_files)
                return AttemptResult(
                    result="error",
                    error=(
                        f"the lease on {', '.join(guard.lost_files)} was lost while the agent ran (ambient was held "
                        "up past lock_ttl_min and another holder took the lock): the agent was stopped and its "
                        "result is void"
                    ),
                    duration_ms=_ms(started),
                )
            res = ran
            if res.reason == "daemon_resources":  # ambient's own failure: no ERROR packet in the agent's name
                return AttemptResult(
                    result="error",
                    error=res.error,
                    duration_ms=_ms(started),
                    trouble=str((res.context or {}).get("resource") or "") or None,
                )
        finally:
            for g in grants:
                try:
                    await self.locks.release_async(self.leases.drop(g))
                except AmbientError as exc:  # taken over after expiry: nothing of ours to release
                    log.warning("lock_release_refused", file=g.file, error=str(exc))
        return await self._reply(a, res, started)

    async def _run(self, a: Attempt, packet: Packet, cfg: AnyRunnerConfig) -> AgentResult:
        registry = self.router.registry
        channel = publish = None
        remote = self.remote if self.remote is not None and self.remote.dispatches(a.agent) else None
        if cfg.kind == "command" and registry is not None and remote is None:
            # The token is live here at once; its file is written just before the agent starts (``before_start``)
            # and renamed aside as soon as it has exited (see the ``finally`` below).
            channel, publish = registry.mint(a.agent, spawn=a.key)
        handoff = await self._handoff(a) if self.live is not None else None
        req = RunRequest(
            packet=packet.to_dict(),
            agent=a.agent,
            run_id=a.run_id,
            item=a.item,
            attempt=a.attempt,
            key=a.key,
            channel_token=channel.token if channel is not None and channel.token else "",
            brain=self.ref.brain.paths.root,
            vars={k: str(v) for k, v in a.vars.items() if _scalar(v)},
            handoff=handoff or None,
            before_start=publish,
            prompt_file=spec.path if (spec := self.ref.brain.matrix.agents.get(a.agent)) is not None else None,
            resumed=a.resumed,
        )
        try:
            if remote is not None:  # on a worker host: no channel back (its answer is its result)
                return await remote.run(req, cfg)
            return await self.runners.run(req, cfg)
        finally:
            if channel is not None and registry is not None:
                registry.disown(channel)  # void for this process's router even if the file cannot go
                # On the loop: one rename. Performance (bench/fanout.py (b), bench/README.md, finding 31): handing it to
                # a cleanup thread cost a GIL hand-off per command agent with the busy loop; done here, the
                # fan-out ran 1.20x the agents/s on 17 % less CPU per agent (median of 4 interleaved pairs).
                try:
                    registry.revoke(channel)
                except OSError as exc:  # the file stays until the next start-up's revoke_all; the token is void
                    log.warning("channel_revoke_failed", agent=a.agent, error=str(exc))

    async def _handoff(self, a: Attempt) -> str:
        """The agent's handoff, read once per (agent, run) unless ``handoff.md`` is rewritten meanwhile.

        Performance (bench/fanout.py): building the handoff may summarise the agent's live thread (see
        ``LiveContext.handoff_for``), and a fan-out appends two turns per item to that thread, so doing it for every
        item was quadratic (1000 items: ~60 s). The items of one run are one session (spec/001: the handoff is
        given at session change and checkpoints), so they share it; a CHECKPOINT/HANDOFF rewrites handoff.md,
        whose (mtime, size) is checked at most every ``HANDOFF_RECHECK_S`` (the daemon itself rewrites it from
        batches of turns written every 0.25 s; a stat per item cost ~5 % of a fan-out's loop).
        """
        assert self.live is not None
        key = (a.agent, a.run_id)
        hit = self._handoffs.get(key)
        now = time.monotonic()
        if hit is not None and now - self._handoff_checked.get(key, -1.0) < HANDOFF_RECHECK_S:
            return await hit[1]
        self._handoff_checked[key] = now
        try:
            st = (self.live.thread_dir(a.agent) / HANDOFF_NAME).stat()
            sig: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except (OSError, AmbientError):
            sig = None
        if hit is not None and hit[0] == sig:
            return await hit[1]
        # One summary in flight per key: the items of a fan-out start together and share it (no herd).
        future: asyncio.Future[str] = asyncio.ensure_future(asyncio.to_thread(self.live.handoff_for, a.agent))
        if len(self._handoffs) >= 256:
            self._handoffs.clear()
            self._handoff_checked.clear()
        self._handoffs[key] = (sig, future)
        return await future

    async def _reply(self, a: Attempt, res: AgentResult, started: float) -> AttemptResult:
        """The agent's answer becomes a packet through the router: agents are checked too.

        Agent text is untrusted and may quote a secret (a bot token in a failing request's URL, on stderr): it is
        masked here, before the journal, the escalation file, the outbox or a notification ever hold it."""
        res = _masked(res, self.secrets)
        signal = res.signal
        now = self.clock.now()
        try:
            fields: dict[str, Any]
            if signal == "RETURN":
                result = dict(res.result or res.output or {})
                if res.status == "fail" and not result:  # exit 1, nothing on stdout: the thread shows why all the same
                    result = {"status": "failed", "error": res.error or "the agent exited with code 1"}
                fields = {"result": result}
            elif signal == "ESCALATE":
                fields = {
                    "options": list(res.options or [])[:20] or ["continue"],
                    "context": {"question": res.question} if res.question else None,
                }
            else:
                ctx = dict(res.context or {})
                ctx.setdefault("error", res.error or res.reason or signal)
                fields = {"context": ctx}
            reply = make_packet(
                a.agent,
                a.sender,
                signal,
                now=now,
                session_id=a.claim_id,
                key=a.key,
                correlation_id=a.key,
                packet_id=self.router.next_id(),
                **fields,
            )
        except PacketError as exc:
            return AttemptResult(
                result="error",
                error=f"the agent's answer is not a valid packet: {exc.message}",
                duration_ms=_ms(started),
            )
        back = await self.router.send(reply, Channel.internal(a.agent))
        if not back.ok:
            # An exit or a crash becomes an ERROR the agent's gate may not list: its cause leads, the refusal follows.
            cause = res.error or (_detail(res.context) if res.status in ("blocked", "error") else None)
            typo = gate_typo(self.ref.brain.matrix, back.decision, a.agent, a.sender) if back.decision else ""
            denied = f"the agent's {signal} was denied: {back.reason}{typo}"
            return AttemptResult(
                result="error",
                error=f"{cause} ({denied})" if cause else denied,
                duration_ms=_ms(started),
                signal_in=signal,
            )
        output = res.result if res.result is not None else res.output  # the normalised result mapping
        error = res.error or (_detail(res.context) if res.status in ("blocked", "error") else None)
        return AttemptResult(
            result=res.status,
            output=output,
            error=error,
            duration_ms=res.duration_ms or _ms(started),
            signal_in=signal,
            question=res.question,
            options=list(res.options or []),
            retryable=res.reason not in NOT_RETRIED,  # the agent's own ERROR, a silent worker: the person decides
            usage=res.usage.to_record() if res.usage is not None else None,
            permission=res.permission,
            hold=res.reason if res.reason in ("provider_refused", "provider_unreachable", "over_budget") else None,
        )

    async def _preflight(self, a: Attempt) -> str | None:
        brain = self.ref.brain
        zones: dict[str, frozenset[str]] | None = None
        gate = brain.matrix.matrix.gate(a.agent)
        if gate is not None and gate.zone_access:
            zones = {a.agent: frozenset(gate.zone_access)}
        problems: list[PreflightProblem] = []
        for f in a.files or ("",):
            if not f:
                continue
            found = await asyncio.to_thread(
                run_preflight,
                brain.paths,
                a.claim_id or "",
                f,
                threshold=brain.settings.breaker_threshold + 1,
                agent_zones=zones,
                zone_rules=brain.matrix.zone_rules,
            )
            # The chain's own breaker decides on failures (it escalates); pre-flight checks the rest.
            problems += [p for p in found if p.code != 3]
        if problems:
            return f"pre-flight failed (exit {exit_code(problems)}): " + "; ".join(p.message for p in problems)
        return None


def _masked(res: AgentResult, secrets: SecretRegistry | None) -> AgentResult:
    """The agent's answer with secrets masked in every piece of text it carries."""
    return replace(
        res,
        output=redact(res.output, secrets),
        result=redact(res.result, secrets),
        context=redact(res.context, secrets),
        options=redact(res.options, secrets),
        question=redact(res.question, secrets),
        error=redact(res.error, secrets),
        stderr_tail=redact(res.stderr_tail, secrets),
        permission=redact(res.permission, secrets),  # a command may carry a token: the journal keeps its signature
    )


def _detail(context: Mapping[str, Any] | None) -> str | None:
    """What a BLOCKED_ON (or an ERROR) context says, for the person: ``missing: the VPN key``."""
    if not context:
        return None
    parts = [f"{k}: {v}" for k, v in context.items() if isinstance(v, str | int | float) and not isinstance(v, bool)]
    return "; ".join(parts)[:500] or None


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _scalar(v: object) -> bool:
    return isinstance(v, str | int | float) and not isinstance(v, bool)


class RouterEmitter:
    """Packets ambient sends on behalf of a run (on_complete, STEP_DONE, DONE, ERROR...), via the router."""

    def __init__(self, router: Router, clock: Clock, sender: str = "ambient") -> None:
        self.router = router
        self.clock = clock
        self.sender = sender

    async def emit(self, signal: str, to: str, payload: Mapping[str, Any], run: RunState) -> bool:
        try:
            kwargs: dict[str, Any] = {"session_id": run.run_id, "correlation_id": run.run_id}
            if signal == "RETURN":
                kwargs["result"] = payload.get("result")
            else:
                kwargs["context"] = dict(payload.get("context") or {})
            pkt = make_packet(self.sender, to, signal, now=self.clock.now(), **kwargs)
        except PacketError as exc:
            log.warning("packet_not_emitted", signal=signal, to=to, error=exc.message)
            return False
        out = await self.router.send(pkt, Channel.internal(self.sender))
        if not out.ok:
            log.warning("packet_denied", signal=signal, to=to, reason=out.reason)
        return out.ok
