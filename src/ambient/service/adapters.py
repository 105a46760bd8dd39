"""The real ports of the run executors, and the evaluators of the daemon's tick.

Adapters: :class:`AgentDelegate` (SPAWN through the router, locks, pre-flight, runner, reply
through the router), :class:`StoreEscalator` (escalation on disk first, then the outbox),
:class:`ClaimsWriter` (claims mirroring runs), :class:`RouterEmitter` (packets from ambient).
Evaluators: workflows (start runs), inbox (packets from ``ambient send``), escalations
(decisions, timeouts, reminders), stale claims. Blocking file work goes through ``to_thread``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from ambient.claims.claim import Claim, new_claim, new_claim_doc
from ambient.core.clock import Clock
from ambient.core.errors import AmbientError, InputError, LockHeldError, PacketError
from ambient.core.health import resource_of
from ambient.core.redact import SecretRegistry, redact
from ambient.engine.manager import RunManager
from ambient.engine.planner import ANSWER
from ambient.engine.ports import Attempt, AttemptResult, EscalationRequest
from ambient.engine.runs import item_claim_id
from ambient.engine.runstate import ItemState, RunState, ended_because
from ambient.engine.tick import Tick
from ambient.human.escalations import (
    ENGINE_ACTIONS,
    AlreadyAnsweredError,
    Escalation,
    EscalationStore,
    new_escalation,
    next_timer,
    offered_options,
    rebuild,
)
from ambient.human.notify import Message, Outbox, escalation_message
from ambient.kernel.packet import Packet, make_packet
from ambient.kernel.router import Channel, Router, read_inbox
from ambient.live.context import HANDOFF_NAME
from ambient.runners import AgentResult, Runners, RunRequest
from ambient.service.writer_threads import background_executor

if TYPE_CHECKING:
    from ambient.claims.locks import LockGrant, LockManager
    from ambient.claims.store import ClaimStore
    from ambient.config.brain import Brain
    from ambient.live.context import LiveContext

log = structlog.get_logger(__name__)

HANDOFF_RECHECK_S = 0.25


class BrainRef:
    """The current brain snapshot, swapped whole on reload (SIGHUP or a changed file)."""

    def __init__(self, brain: Brain) -> None:
        self.brain = brain


# ---------------------------------------------------------------- delegate


class Leases:
    """The scope locks running agents hold, renewed at a third of their TTL while the agents run: an agent that runs
    longer than ``lock_ttl_min`` keeps its scope (a contender takes over an expired lock). One timer for all of
    them, not one task per agent (a fan-out holds a lock per item)."""

    def __init__(self, locks: LockManager, clock: Callable[[], float] = time.time) -> None:
        self.locks = locks
        self.clock = clock
        self._held: dict[tuple[str, int], LockGrant] = {}
        self._on_lost: dict[tuple[str, int], Callable[[str], None]] = {}
        self._task: asyncio.Task[None] | None = None

    def hold(self, grant: LockGrant, on_lost: Callable[[str], None] | None = None) -> None:
        """Renew ``grant`` while its agent runs; ``on_lost(file)`` if another holder took it over meanwhile."""
        key = (grant.file, grant.token)
        self._held[key] = grant
        if on_lost is not None:
            self._on_lost[key] = on_lost
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._renew(), name="leases")

    def current(self, grant: LockGrant) -> LockGrant:
        """The grant as last renewed."""
        return self._held.get((grant.file, grant.token), grant)

    def drop(self, grant: LockGrant) -> LockGrant:
        """Stop renewing; the grant as last renewed (its release must name the same token, which renewal keeps)."""
        self._on_lost.pop((grant.file, grant.token), None)
        return self._held.pop((grant.file, grant.token), grant)

    async def still_held(self, grant: LockGrant) -> bool:
        """Whether a lease is still ours at the end of its attempt. Only a lease past its expiry by our clock can
        have been taken over (a contender waits for expiry and grace), so only such a one is looked at: renewed if
        nobody took it (nothing happened meanwhile), lost if somebody did (a daemon held up past its lease)."""
        current = self.current(grant)
        if self.clock() < current.expires:
            return True
        try:
            renewed = await asyncio.to_thread(self.locks.renew, current)
        except (AmbientError, OSError):
            return False
        if (grant.file, grant.token) in self._held:
            self._held[(grant.file, grant.token)] = renewed
        return True

    def _due(self, grant: LockGrant) -> float:
        return grant.expires - grant.ttl_s * 2 / 3  # renewed once a third of the lease has gone by

    async def _renew(self) -> None:
        while self._held:
            wait = min(self._due(g) for g in self._held.values()) - self.clock()
            if wait > 0:
                await asyncio.sleep(min(wait, 60.0))  # a timer: re-read the set, grants come and go meanwhile
                continue
            now = self.clock()
            for key, grant in [(k, g) for k, g in self._held.items() if self._due(g) <= now]:
                try:
                    renewed = await asyncio.to_thread(self.locks.renew, grant)
                except (AmbientError, OSError) as exc:  # the lease is lost (taken over, released): stop renewing it
                    log.warning("lock_lease_lost", file=grant.file, holder=grant.holder, error=str(exc))
                    self._held.pop(key, None)
                    lost = self._on_lost.pop(key, None)
                    if lost is not None:
                        lost(grant.file)  # its agent is stopped: what it does now is no longer under a lease
                    continue
                if key in self._held:  # not dropped while renewing
                    self._held[key] = renewed
                log.debug("lock_lease_renewed", file=grant.file, holder=grant.holder)


class _LeaseGuard:
    """One attempt's agent, stopped when a lease of its scope is lost while it runs (issue 24, 2): the lease
    renewal's callback cancels the attempt's own task while (and only while) the agent runs; the runner kills the
    agent's process group on cancellation, and the attempt goes on to give a void result. No task of its own:
    a fan-out makes one of these per item."""

    __slots__ = ("lost_files", "running", "task")

    def __init__(self) -> None:
        self.lost_files: list[str] = []
        self.task: asyncio.Task[Any] | None = None
        self.running = False

    def lost(self, file: str) -> None:
        self.lost_files.append(file)
        if self.running and self.task is not None:
            self.task.cancel()

    async def run(self, work: Awaitable[AgentResult]) -> AgentResult | None:
        self.task = asyncio.current_task()
        self.running = True
        try:
            return await work
        except asyncio.CancelledError:
            if not self.lost_files or self.task is None:
                raise
            if self.task.uncancel() > 0:  # a stop cancelled it too: that one wins
                raise
            return None  # only our own cancel: the attempt goes on, with a void result
        finally:
            self.running = False


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
        # (agent, run) -> (handoff.md signature, handoff text); see _handoff.
        self._handoffs: dict[tuple[str, str], tuple[tuple[int, int] | None, asyncio.Future[str]]] = {}
        self._handoff_checked: dict[tuple[str, str], float] = {}  # key → when handoff.md was last stat'ed

    async def attempt(self, a: Attempt) -> AttemptResult:
        started = time.monotonic()
        brain = self.ref.brain
        cfg = brain.runners.get(a.agent)
        if cfg is None:
            return AttemptResult(
                result="error",
                error=(
                    f"agent {a.agent!r} has no runner: declare `ambient: runner:` in agents/{a.agent}.md "
                    f"or `runners: {a.agent}:` in profil/ambient.yml"
                ),
            )
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
            return AttemptResult(result="error", error=f"SPAWN denied by the router: {sent.reason}")
        grants: list[LockGrant] = []
        guard = _LeaseGuard()
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

    async def _run(self, a: Attempt, packet: Packet, cfg: Any) -> AgentResult:
        registry = self.router.registry
        channel = publish = None
        if getattr(cfg, "kind", None) == "command" and registry is not None:
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
        )
        try:
            return await self.runners.run(req, cfg)
        finally:
            if channel is not None and registry is not None:
                registry.disown(channel)  # void for this process's router even if the file cannot go
                # On the loop: one rename. Performance (bench/fanout.py (b), bench/README item 31): handing it to
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
            return AttemptResult(
                result="error",
                error=f"the agent's {signal} was denied: {back.reason}",
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
            retryable=res.reason != "agent_error",  # the agent's own ERROR: unrecoverable (README), never retried
            usage=res.usage.to_record() if res.usage is not None else None,
            permission=res.permission,
            hold=res.reason if res.reason in ("provider_refused", "provider_unreachable") else None,
        )

    async def _preflight(self, a: Attempt) -> str | None:
        from ambient.claims.breakers import run_preflight
        from ambient.claims.preflight import exit_code

        brain = self.ref.brain
        zones: dict[str, frozenset[str]] | None = None
        gate = brain.matrix.matrix.gate(a.agent)
        if gate is not None and gate.zone_access:
            zones = {a.agent: frozenset(gate.zone_access)}
        problems: list[Any] = []
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
            problems += [p for p in found if getattr(p, "code", 0) != 3]
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


def _scalar(v: Any) -> bool:
    return isinstance(v, str | int | float) and not isinstance(v, bool)


# ---------------------------------------------------------------- escalations


class Learner:
    """The learning loop's hands: learn from the person's answers, decide where a rule may (opt-in)."""

    def __init__(self, paths: Any, clock: Clock) -> None:
        from ambient.learning.rulestore import rules_path

        self.path = rules_path(paths)
        self.clock = clock

    @staticmethod
    def situation(esc: Escalation) -> Any:
        from ambient.learning.stats import situation_of

        # An escalation written before its ``detail`` was kept: its question is the closest there is.
        detail = esc.detail if esc.detail is not None else esc.question
        return situation_of(esc.workflow, esc.agent, esc.kind, detail=detail, step=esc.step or esc.item)

    def observe(self, esc: Escalation) -> None:
        """Record a human decision as evidence (blocking: call through ``to_thread``)."""
        from ambient.learning.rulestore import update_rules
        from ambient.learning.stats import observe

        if esc.decision is None or esc.channel in ("rule", "timeout"):
            return
        sit = self.situation(esc)
        now = self.clock.now()
        try:
            update_rules(
                self.path,
                lambda b: b.with_rules(
                    observe(b.rules, sit, str(esc.decision), esc.run_id, now, promote_after=b.promote_after)
                ),
            )
        except (AmbientError, OSError) as exc:
            log.warning("rules_not_updated", error=str(exc))

    def rule_for(self, esc: Escalation) -> Any:
        """The active, opted-in rule that may decide this escalation alone, or None."""
        from ambient.learning.rulestore import load_rules
        from ambient.learning.stats import may_auto_decide, predict

        if not self.path.exists():
            return None
        book, _ = load_rules(self.path)
        rule = predict(book.rules, self.situation(esc))
        options = [o.key for o in esc.options]
        return rule if may_auto_decide(rule, book.policy, options=options) else None

    def prediction_for(self, esc: Escalation) -> str | None:
        """What a learned rule that does not decide alone would choose, for the message (you still decide)."""
        from ambient.learning.rulestore import load_rules
        from ambient.learning.stats import may_auto_decide, predict, shadow_hint

        if not self.path.exists():
            return None
        book, _ = load_rules(self.path)
        rule = predict(book.rules, self.situation(esc))
        options = [o.key for o in esc.options]
        if rule is None or rule.option not in options or may_auto_decide(rule, book.policy, options=options):
            return None
        return shadow_hint(rule, book.policy)

    def used(self, rule: Any, run_id: str) -> None:
        """Count an automatic decision (blocking)."""
        from ambient.learning.rulestore import update_rules
        from ambient.learning.stats import record_use

        now = self.clock.now()
        try:
            update_rules(self.path, lambda b: b.with_rules(record_use(b.rules, rule.id, run_id, now)))
        except (AmbientError, OSError) as exc:
            log.warning("rules_not_updated", error=str(exc))


class StoreEscalator:
    """Escalations persisted (fsync'd) before any notification; notifications go through the outbox."""

    def __init__(
        self,
        store: EscalationStore,
        outbox: Outbox | None,
        clock: Clock,
        wake_outbox: asyncio.Event | None = None,
        buttons: bool = False,
        results: str = "failures",
    ) -> None:
        self.store = store
        self.outbox = outbox
        self.clock = clock
        self.wake_outbox = wake_outbox
        self.buttons = buttons
        self.results = results
        self.learner: Learner | None = None
        self.digest: Digest | None = None
        self.on_answered: Any = None  # callback(path): an automatic decision was written
        # Whether anybody is told anything: without a URL, information is not queued (a URL added weeks later
        # would receive all of it); escalations are (a new URL receives those still pending, nothing else).
        self.notifying = True

    async def escalate(self, req: EscalationRequest) -> str:
        now = self.clock.now()
        options = offered_options(req.options)
        esc = new_escalation(
            workflow=req.workflow,
            run_id=req.run_id,
            kind=req.kind,  # type: ignore[arg-type]
            question=req.question,
            now=now,
            options=options,
            item=req.item,
            step=req.step,
            agent=req.agent,
            respawn=req.respawn,
            scope=req.scope,
            detail=req.detail,
            timeout=timedelta(seconds=req.deadline_s) if req.deadline_s else None,
            on_timeout=req.on_timeout,  # type: ignore[arg-type]
            remind_before=timedelta(seconds=req.remind_before_s) if req.remind_before_s else None,
            dedupe_key=req.dedupe_key,
        )
        stored = await asyncio.to_thread(self.store.create, esc)
        if stored.id == esc.id:
            log.info("escalation_opened", escalation=esc.id, kind=req.kind, item=req.item)
            if not await self._auto_decide(stored):
                await self.queue(stored)
        return stored.id

    async def _auto_decide(self, esc: Escalation) -> bool:
        """A learned rule the person opted in to decides, recorded and sent as information (never silent)."""
        if self.learner is None:
            return False
        rule = await asyncio.to_thread(self.learner.rule_for, esc)
        if rule is None:
            return False
        from ambient.learning.stats import auto_decision_notice

        try:
            await asyncio.to_thread(self.store.answer, esc.id, rule.option, by=f"rule:{rule.id}", channel="rule")
        except (AmbientError, OSError) as exc:
            log.warning("auto_decision_failed", escalation=esc.id, error=str(exc))
            return False
        await asyncio.to_thread(self.learner.used, rule, esc.run_id)
        log.info("auto_decided", escalation=esc.id, rule=rule.id, option=rule.option)
        await self.inform(
            f"{esc.workflow}: decided by a learned rule",
            auto_decision_notice(rule, run_id=esc.run_id, item=esc.item or esc.step),
        )
        if self.on_answered is not None:
            self.on_answered(self.store.path_for(esc.id))
        return True

    async def cancel_leftovers(self, run_id: str, reason: str) -> None:
        """Close a run's pending escalations as cancelled: no longer listed, notified or answerable."""
        try:
            gone = await asyncio.to_thread(self.store.cancel_run, run_id, reason)
        except (AmbientError, OSError) as exc:  # a broken escalation file: reported by doctor, retried next tick
            log.warning("escalations_not_cancelled", run_id=run_id, error=str(exc))
            return
        for esc in gone:
            log.info("escalation_cancelled", escalation=esc.id, run_id=run_id, item=esc.item or esc.step, reason=reason)

    async def queue(self, esc: Escalation, *, reminder: bool = False) -> None:
        """Queue the escalation's message (or its reminder) in the outbox (sent at once, retried until delivered,
        dropped if the escalation is settled first)."""
        if self.outbox is None:
            return
        what = f"{esc.workflow}: {esc.where}" if esc.where else esc.workflow
        prediction = None
        if self.learner is not None:
            try:
                prediction = await asyncio.to_thread(self.learner.prediction_for, esc)
            except (AmbientError, OSError) as exc:  # a broken rules file never keeps a question from you
                log.warning("prediction_failed", escalation=esc.id, error=str(exc))
        msg = escalation_message(
            escalation_id=esc.id,
            what=what,
            question=esc.question,
            options=[o.key for o in esc.options],
            nonce=esc.nonce,
            telegram_buttons=self.buttons,
            workflow=esc.workflow,
            item=esc.item,
            step=esc.step,
            agent=esc.agent,
            deadline=esc.deadline.isoformat(timespec="minutes") if esc.deadline else None,
            reminder=reminder,
            prediction=prediction,
        )
        await asyncio.to_thread(self.outbox.put, msg, self.clock.now())
        if self.wake_outbox is not None:
            self.wake_outbox.set()

    async def inform(self, title: str, body: str, *, urgent: bool = False) -> None:
        """A "for your information" message: silent, never a decision (batched when a digest is on, unless
        ``urgent``: the daemon's own troubles, which the person must hear of now)."""
        if self.digest is not None and not urgent:
            await asyncio.to_thread(self.digest.add, title, body)
            return
        if self.outbox is None or not self.notifying:
            return
        await asyncio.to_thread(
            self.outbox.put, Message(title=title[:200], body=body[:3500], kind="info"), self.clock.now()
        )
        if self.wake_outbox is not None:
            self.wake_outbox.set()

    async def run_finished(self, state: RunState) -> None:
        """The run's escalations still pending are cancelled (nothing waits on them); its result is information,
        sent per ``notify.results`` (none | failures | all)."""
        await self.cancel_leftovers(state.run_id, ended_because(state))
        if self.results == "none" or (self.results == "failures" and state.outcome == "success"):
            return
        counts = state.counts()
        body = (
            f"Run {state.run_id} finished: {state.outcome}. {counts.get('done', 0)}/{counts['total']} done, "
            f"{state.escalation_count} escalation(s), {state.error_count} error(s)."
        )
        await self.inform(f"{state.workflow}: {state.outcome}", body)


class Digest:
    """Results and automatic decisions gathered into one message every ``hours`` (``notify.digest``).

    Lines wait in ``.ambient/digest.jsonl`` (appended, fsync'd); when a digest is due they become one
    ``digest`` message in the outbox, with the escalation rate of the last weeks, and the file is
    rotated to ``digest.sent.jsonl``. Escalations never wait for a digest.
    """

    name = "digest"

    def __init__(
        self,
        paths: Any,
        outbox: Outbox,
        clock: Clock,
        hours: float,
        *,
        enabled: bool = True,
        wake_outbox: asyncio.Event | None = None,
    ) -> None:
        self.paths = paths
        self.outbox = outbox
        self.clock = clock
        self.hours = hours
        self.wake_outbox = wake_outbox  # a queued digest goes out at once, like any message (it sat in the outbox)
        self.enabled = enabled  # notify.digest, and somebody to send it to (set again at each reload)
        self.file = paths.state / "digest.jsonl"
        self.mark = paths.state / "digest.json"

    def add(self, title: str, body: str) -> None:
        from ambient.storage.journal import append_line

        append_line(self.file, {"at": self.clock.now().isoformat(), "title": title[:200], "body": body[:1000]})

    def _last_sent(self) -> datetime | None:
        try:
            return datetime.fromisoformat(json.loads(self.mark.read_text())["last_sent"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def due(self, now: datetime) -> bool:
        last = self._last_sent()
        if last is None:
            from ambient.storage.fsutil import PRIVATE_FILE, atomic_write

            mark = json.dumps({"last_sent": now.isoformat()}) + "\n"
            atomic_write(self.mark, mark, mode=PRIVATE_FILE)  # the first period starts
            return False
        return now - last >= timedelta(hours=self.hours)

    def send_if_due(self) -> bool:
        """Blocking: compose and queue the digest when its period has passed and something waits (a period without
        a result or an automatic decision sends nothing)."""
        from ambient.learning.stats import summarise, weekly_digest
        from ambient.storage.fsutil import PRIVATE_FILE, atomic_write
        from ambient.storage.journal import read_jsonl

        now = self.clock.now()
        if not self.due(now):
            return False
        lines = read_jsonl(self.file).records if self.file.exists() else []
        body: list[str] = []
        if lines:
            runs = read_jsonl(self.paths.runs_log).records if self.paths.runs_log.exists() else []
            body = [f"- {r.get('title')}: {r.get('body')}" for r in lines[-50:]]
            if len(lines) > 50:
                body.insert(0, f"(the {len(lines) - 50} earlier lines are in .ambient/digest.sent.jsonl)")
            if runs:
                body += ["", weekly_digest(summarise(runs))]
            title = f"ambient digest of the last {_period(self.hours)}: {len(lines)} update(s)"
            self.outbox.put(Message(title=title, body="\n".join(body)[:3800], kind="digest"), now)
        if self.file.exists():
            self.file.replace(self.paths.state / "digest.sent.jsonl")
        atomic_write(self.mark, json.dumps({"last_sent": now.isoformat()}) + "\n", mode=PRIVATE_FILE)
        return bool(body)

    async def evaluate(self, tick: Tick) -> None:
        if tick.timed and self.enabled and await asyncio.to_thread(self.send_if_due) and self.wake_outbox is not None:
            self.wake_outbox.set()


def _period(hours: float) -> str:
    """``24`` → ``24 h``, ``168`` → ``7 days``, ``0.25`` → ``15 min``, ``0.001`` → ``3.6 s``."""
    if hours >= 48 and hours % 24 == 0:
        return f"{hours / 24:g} days"
    if hours >= 1:
        return f"{hours:g} h"
    if hours * 60 >= 1:
        return f"{hours * 60:g} min"
    return f"{hours * 3600:g} s"


# ---------------------------------------------------------------- claims


_ITEM_STATUS = {
    "pending": "open",
    "running": "open",
    "retry_wait": "open",
    "done": "closed",
    "failed": "failed",
    "escalated": "waiting_human",
    "skipped": "closed",
    "aborted": "failed",
}


class ClaimsWriter:
    """Claims mirror runs: one pilote claim per run, one satellite claim per item or step.

    They are views of the run journal (the fsync'd truth); a restart rewrites them from the journal. Each is
    on disk before its name points at it, so that a power cut leaves it old or new, never empty or torn (R-03
    found empty and garbled item claims that ambient then refused to overwrite, as it must a person's broken
    file): the writer thread writes a batch of claims, fsyncs them back to back and renames them
    (:meth:`ClaimStore.write_claims`); the fsyncs wait in that thread, not on the loop.

    for_each item claims are coalesced: a finished (or escalated) item's claim is written at most
    ``FLUSH_DELAY_S`` after the change, a started item's at most ``OPEN_DELAY_S`` after it, unless the item
    finishes first: then only its final claim is written. bench/fanout.py: creating a claim file (a create and a
    rename in a churning folder) is the costliest part of an item, and the writer thread's work stalls the event
    loop through the GIL; an item that ends within a second is written once. The run's ``accepted`` record,
    fsync'd before the agent starts, is what makes an item accepted; its claim is a view that follows. Chain step
    claims are written at once (pre-flight reads them before the agent writes).
    """

    FLUSH_DELAY_S = 0.05
    OPEN_DELAY_S = 1.0

    def __init__(self, store: ClaimStore, clock: Clock, workflow_scope: Mapping[str, str] | None = None) -> None:
        self.store = store
        self.clock = clock
        self._cache: dict[str, dict[str, Any]] = {}  # the last document written, by sess_id
        self._scopes: dict[str, str] = {}  # item claim → its rendered scope
        self._pending: dict[str, tuple[RunState, ItemState, float]] = {}  # sess_id → (run, item, due: loop time)
        self._flush_at: asyncio.TimerHandle | None = None
        # One writer thread, so writes of a claim land in the order they were made; file creation is the cost
        # on slow disks, and it must not stall the event loop. Below the loop's priority: see writer_threads.
        self._writer = background_executor("claims")
        self._inflight: Future[None] | None = None
        # Claims a full disk kept from being written, by sess_id: the writer thread's own (no lock needed);
        # written again at the end of the shortage (retry_unwritten), unless a newer version made it first.
        self._unwritten: dict[str, tuple[Claim, dict[str, Any]]] = {}

    def flush(self, *, wait: bool = False) -> None:
        """Write every pending item claim (a run's end, shutdown with ``wait``)."""
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        pending, self._pending = self._pending, {}
        self._write_items(pending.values())
        if wait and self._inflight is not None:
            self._inflight.result()

    def _flush_due(self) -> None:
        """The coalescing timer: write the claims that are due, wait for the others."""
        self._flush_at = None
        loop = asyncio.get_running_loop()
        horizon = loop.time() + 0.01  # what falls due within 10 ms goes with this batch
        due = {k: v for k, v in self._pending.items() if v[2] <= horizon}
        for k in due:
            del self._pending[k]
        self._write_items(due.values())
        if self._pending:
            self._arm(loop, min(v[2] for v in self._pending.values()))

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._flush_at is not None:
            if self._flush_at.when() <= when:
                return
            self._flush_at.cancel()
        self._flush_at = loop.call_at(when, self._flush_due)

    def _write_items(self, pending: Iterable[tuple[RunState, ItemState, float]]) -> None:
        claims: list[tuple[Claim, dict[str, Any]]] = []
        for state, item, _due in pending:
            try:  # built on the loop (the run state lives there); written in the writer thread
                claim = self._prepare_item(state, item)
            except Exception as exc:  # noqa: BLE001 - one bad claim view must not lose the others (timer callback)
                log.error("claim_view_failed", run_id=state.run_id, item=item.name, error=repr(exc))
                continue
            if claim is not None:
                claims.append((claim, self._cache[claim.sess_id]))  # the validated document rides along
        if claims:
            self._inflight = self._writer.submit(self._write_many, claims)

    def close(self) -> None:
        """Write what is pending and stop the writer thread."""
        self.flush(wait=True)
        self._writer.shutdown(wait=True)

    def _write_many(self, claims: list[tuple[Claim, dict[str, Any]]]) -> None:
        try:
            failed = self.store.write_claims(claims, durable=True)
        except (AmbientError, OSError) as exc:  # the guard or the folder itself: nothing of the batch was written
            log.warning("claim_write_failed", claims=len(claims), error=str(exc))
            failed = [(claim.sess_id, exc) for claim, _doc in claims]
        else:
            for sess_id, error in failed:
                log.warning("claim_write_failed", claim=sess_id, error=str(error))
        self._note_unwritten(claims, failed)

    def _store(self, claim: Claim) -> None:
        try:
            self.store.write_claim(claim, durable=True)
        except (AmbientError, OSError) as exc:  # a claim the person broke or replaced: report, go on
            log.warning("claim_write_failed", claim=claim.sess_id, error=str(exc))
            self._note_unwritten([(claim, claim.to_document())], [(claim.sess_id, exc)])
        else:
            self._unwritten.pop(claim.sess_id, None)

    def _note_unwritten(self, claims: list[tuple[Claim, dict[str, Any]]], failed: Iterable[tuple[str, Any]]) -> None:
        """In the writer thread: remember the claims a full disk (or no descriptor) kept from disk, forget those
        written since."""
        short = {sess_id for sess_id, error in failed if isinstance(error, BaseException) and resource_of(error)}
        for claim, doc in claims:
            if claim.sess_id in short:
                self._unwritten[claim.sess_id] = (claim, doc)
            else:
                self._unwritten.pop(claim.sess_id, None)

    def retry_unwritten(self) -> None:
        """The shortage is over: write the claims it kept from disk (in the writer thread, after what is queued)."""
        self._writer.submit(self._retry)

    def _retry(self) -> None:
        claims, self._unwritten = list(self._unwritten.values()), {}
        if claims:
            log.info("claims_rewritten", count=len(claims))
            self._write_many(claims)

    def _prepare(self, sess_id: str, base: dict[str, Any]) -> Claim | None:
        # Performance (bench/fanout.py): the last document is kept and compared as a dict, and only a changed one
        # is validated; building, dumping and comparing models cost ~100 µs per item on the loop.
        old = self._cache.get(sess_id)
        doc = {**old, **base} if old is not None else base
        if old is not None and doc == old:
            return None
        claim = Claim.model_validate(doc)
        self._cache[sess_id] = doc
        return claim

    def _write(self, sess_id: str, base: dict[str, Any]) -> None:
        claim = self._prepare(sess_id, base)
        if claim is None:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop (tools, tests): write at once, after what is queued
            if self._inflight is not None:
                self._inflight.result()
            self._store(claim)
            return
        # Queued behind the item claims (one writer thread, in order): the loop never waits for the disk here.
        # It did (flush(wait=True)): 1.7 s at the end of a 2,000-item fan-out, measured with cProfile.
        self._inflight = self._writer.submit(self._store, claim)

    def run_changed(self, state: RunState) -> None:
        self.flush()  # the item claims first: a closed run claim lists children that are written
        now = self.clock.now()
        status = "open"
        if state.finished:
            status = "closed" if state.outcome in ("success", "partial") else "failed"
        elif state.escalations and not any(i.status in ("running", "pending", "retry_wait") for i in state.items):
            status = "waiting_human"
        base = new_claim(
            state.run_id, "pilote", f"workflows/{state.workflow}", "ambient", _parse(state.started_at) or now
        ).to_document()
        counts = state.counts()
        base.update(
            status=status,
            workflow=state.workflow,
            story_angle=f"ambient run of {state.workflow}",
            ambient_run={
                "form": state.form,
                "spec_hash": state.spec_hash,
                "total": counts["total"],
                "done": counts.get("done", 0),
                "escalations": state.escalation_count,
            },
        )
        if state.mode:
            base["mode"] = state.mode
        if state.finished:
            base["closed_at"] = _fmt(_parse(state.finished_at) or now)
            base["result"] = {
                "status": {"success": "ok", "partial": "partial"}.get(state.outcome or "", "failed"),
                "children": [item_claim_id(state.run_id, i, state.form) for i in state.items],
            }
        self._write(state.run_id, base)
        if state.finished:  # its claims will not change again: forget what was kept to compare them
            self._cache.pop(state.run_id, None)
            for item in state.items:
                sid = item_claim_id(state.run_id, item, state.form)
                self._cache.pop(sid, None)
                self._scopes.pop(sid, None)

    def item_changed(self, state: RunState, item: ItemState) -> None:
        if state.form != "for_each":
            self._write_item(state, item)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (tools, tests): write at once
            self._pending[item_claim_id(state.run_id, item, state.form)] = (state, item, 0.0)
            self.flush()
            return
        sess = item_claim_id(state.run_id, item, state.form)
        delay = self.OPEN_DELAY_S if item.status in ("pending", "running", "retry_wait") else self.FLUSH_DELAY_S
        due = loop.time() + delay
        before = self._pending.get(sess)
        if before is not None:
            due = min(due, before[2])  # never later than an earlier change was promised
        self._pending[sess] = (state, item, due)
        self._arm(loop, due)

    def _write_item(self, state: RunState, item: ItemState) -> None:
        claim = self._prepare_item(state, item)
        if claim is not None:
            if self._inflight is not None:
                self._inflight.result()
            self._store(claim)

    def _prepare_item(self, state: RunState, item: ItemState) -> Claim | None:
        now = self.clock.now()
        sess = item_claim_id(state.run_id, item, state.form)
        spec_scope = self._scopes.get(sess)
        if spec_scope is None:  # rendered once per item: it depends only on the pinned spec and the item
            spec_scope = self._scopes[sess] = _item_scope(state, item)
        base = new_claim_doc(sess, "satellite", spec_scope, _item_agent(state, item), now)
        if sess in self._cache:
            base.pop("opened_at", None)
        base.update(
            status=_ITEM_STATUS.get(item.status, "open"),
            parent_satellite=state.run_id,
            workflow=state.workflow,
            story_angle=f"{state.workflow}: {item.name}",
            satellite_level="leaf",
            attempt=item.attempt,
        )
        if state.form == "chain":
            base["workflow_step"] = item.name
            step_type = _step_type(state, item)
            if step_type:
                base["satellite_type"] = step_type
        if item.escalation:
            base["escalation"] = item.escalation
        if item.status in ("done", "failed", "skipped", "aborted"):
            said = item.output.get("status") if isinstance(item.output, dict) else None
            done = "partial" if said == "partial" else "ok"  # the agent's own word: a partial result stays partial
            result: dict[str, Any] = {
                "status": done if item.status == "done" else ("partial" if item.status == "skipped" else "failed")
            }
            if isinstance(item.output, dict) and isinstance(item.output.get("tests"), dict):
                result["tests"] = item.output["tests"]
            if item.error:
                result["notes"] = item.error[:500]
            base["result"] = result
            base["closed_at"] = _fmt(now)
        return self._prepare(sess, base)


def _item_scope(state: RunState, item: ItemState) -> str:
    if state.form == "chain":
        for step in state.spec.get("chain", []) if isinstance(state.spec.get("chain"), list) else []:
            if isinstance(step, dict) and str(step.get("step")) == item.name:
                return _step_scope(state, item, str(step.get("scope") or ""))
        return item.name.partition("@")[2] or "-"
    fe = state.spec.get("for_each")
    files = fe.get("scope", {}).get("files") if isinstance(fe, dict) and isinstance(fe.get("scope"), dict) else None
    if isinstance(files, list) and files and isinstance(files[0], str):
        from ambient.workflows.templating import render

        values = {
            "item": item.name,
            "index": item.index + 1,
            "total": len(state.items),
            "workflow": state.workflow,
            "run_id": state.run_id,
        }
        try:
            return render(files[0], values)
        except InputError:
            pass
    return f"{state.workflow}/{item.name}"


def _step_scope(state: RunState, item: ItemState, scope: str) -> str:
    """A step's scope as its SPAWN carries it: rendered as ChainExecutor renders it (pre-flight compares the two)."""
    from ambient.workflows.templating import has_variables, render, step_values

    if not has_variables(scope):
        return scope
    prior = next((it.output for it in reversed(state.items[: item.index]) if it.status == "done"), None)
    values = step_values(
        workflow=state.workflow,
        step=item.name,
        run_id=state.run_id,
        prior=prior,
        branch=str(state.spec.get("branch") or ""),
        pilote=str(state.spec.get("pilote") or ""),
    )
    try:
        return render(scope, values)
    except InputError:
        return scope  # the step fails at its SPAWN, saying why


def _item_agent(state: RunState, item: ItemState) -> str:
    fe = state.spec.get("for_each")
    if isinstance(fe, dict) and fe.get("spawn"):
        return str(fe["spawn"])
    for step in state.spec.get("chain", []) if isinstance(state.spec.get("chain"), list) else []:
        if isinstance(step, dict) and str(step.get("step")) == item.name and step.get("agents"):
            return str(step["agents"][0])
    return "ambient"


def _step_type(state: RunState, item: ItemState) -> str | None:
    for step in state.spec.get("chain", []) if isinstance(state.spec.get("chain"), list) else []:
        if isinstance(step, dict) and str(step.get("step")) == item.name:
            return str(step.get("type")) if step.get("type") else None
    return item.name.partition("@")[0] or None


def _parse(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def _fmt(dt: datetime) -> str:
    return dt.astimezone().strftime("%Y-%m-%dT%H:%M")


# ---------------------------------------------------------------- packets from ambient


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


# ---------------------------------------------------------------- evaluators


class EscalationEvaluator:
    """Answered escalations resume their runs; deadlines and reminders fire from their on-disk timestamps; the
    escalations of a run that ended are cancelled.

    The escalation files are listed when one changed, on a timed tick, or when the earliest deadline or reminder
    seen at the last listing is due; a timer wakes the engine for that instant (``wake``), so a deadline does not
    wait for the next timed tick.
    """

    name = "escalations"

    def __init__(
        self,
        store: EscalationStore,
        manager: RunManager,
        escalator: StoreEscalator,
        clock: Clock,
        wake: Callable[[], None] | None = None,
        respawn: Callable[[Escalation], None] | None = None,
    ) -> None:
        self.store = store
        self.manager = manager
        self.escalator = escalator
        self.clock = clock
        self.wake = wake
        self.respawn = respawn  # an answered ESCALATE of `ambient send`: its agent runs again with the answer
        self.applied: set[str] = set()
        self._next_timer: datetime | None = None
        self._timer: asyncio.TimerHandle | None = None

    async def evaluate(self, tick: Tick) -> None:
        if not tick.touched(self.store.paths.escalations) and not self._timers_due(tick.now):
            return
        escs = await asyncio.to_thread(self.store.list)
        escs += await self._rebuild_lost({e.id for e in escs})
        now = self.clock.now()
        ended: set[str] = set()
        for esc in escs:
            if esc.status == "pending":
                if (
                    esc.respawn is None
                    and esc.run_id not in self.manager.executors
                    and self.manager.settled(esc.run_id)
                ):
                    ended.add(esc.run_id)  # its run ended without it (a crash between the two, an older ambient)
                else:
                    await self._timers(esc, now)
                continue
            if esc.id in self.applied or esc.status not in ("answered", "expired"):
                continue
            await self._apply(esc)
        for run_id in sorted(ended):
            why = await asyncio.to_thread(self.manager.ended_reason, run_id)
            await self.escalator.cancel_leftovers(run_id, why)
        self._arm(next_timer(e for e in escs if e.run_id not in ended))

    async def _rebuild_lost(self, listed: set[str]) -> list[Escalation]:
        """The escalations a run waits on whose file is missing, empty or unreadable, written again from what the
        run's journal kept (issue 24, 5): otherwise the run waits for good on a question nobody can see."""
        rebuilt: list[Escalation] = []
        for ex in list(self.manager.executors.values()):
            state = ex.state
            for esc_id in [e for e in state.escalations if e not in listed and e in state.requests]:
                try:
                    esc = rebuild(esc_id, workflow=state.workflow, run_id=state.run_id, request=state.requests[esc_id])
                    reason = await asyncio.to_thread(self.store.restore, esc)
                except (AmbientError, OSError, ValueError, KeyError, TypeError) as exc:
                    log.error("escalation_not_rebuilt", escalation=esc_id, run_id=state.run_id, error=str(exc))
                    continue
                if reason is None:
                    continue  # written meanwhile: the next listing has it
                log.warning(
                    "escalation_rebuilt",
                    escalation=esc_id,
                    reason=reason,
                    file=self.store.paths.rel(self.store.path_for(esc_id)),
                    journal=self.store.paths.rel(self.store.paths.run_journals / f"{state.run_id}.jsonl"),
                    workflow=state.workflow,
                    run_id=state.run_id,
                    item=esc.item or esc.step,
                )
                await self.escalator.queue(esc)
                rebuilt.append(esc)
        return rebuilt

    async def _apply(self, esc: Escalation) -> None:
        option = esc.decided_option
        action = esc.decided_action
        if action is None or (option is None and action not in ENGINE_ACTIONS):
            self.applied.add(esc.id)
            return
        # A deadline's action may match no option offered (on_timeout: approve on a failure offering retry, skip,
        # abort): the action itself is carried out, as its key.
        key, label = (option.key, option.label) if option is not None else (action, action)
        by = esc.by or "human"
        rule = by.removeprefix("rule:") if by.startswith("rule:") else None
        if esc.respawn is not None:
            self.applied.add(esc.id)
            if self.respawn is not None and action == ANSWER:
                self.respawn(esc)
            return
        ok = self.manager.decide(
            esc.id,
            key,
            action,
            by=by,
            channel=esc.channel or "cli",
            latency_s=esc.latency_s,
            note=esc.note,
            rule=rule,
            answer=label,
        )
        if ok:
            # A line about a run carries its workflow and run id (issue 7), like the executor's own lines.
            log.info(
                "decision_applied",
                escalation=esc.id,
                option=key,
                action=action,
                by=by,
                workflow=esc.workflow,
                run_id=esc.run_id,
                item=esc.item or esc.step,
            )
            self.applied.add(esc.id)
            if self.escalator.learner is not None and rule is None:
                await asyncio.to_thread(self.escalator.learner.observe, esc)
        elif esc.run_id not in self.manager.executors:
            self.applied.add(esc.id)  # its run is finished or unknown: nothing waits on it
        # else: its run has not recorded the escalation yet (a rule answered at once): next tick.

    def _timers_due(self, now: datetime) -> bool:
        return self._next_timer is not None and self._next_timer <= now

    def _arm(self, when: datetime | None) -> None:
        """Remember the next deadline or reminder, and wake the engine then."""
        self._next_timer = when
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if when is not None and self.wake is not None:
            delay = min(max(0.0, (when - self.clock.now()).total_seconds()), 86_400.0)
            self._timer = asyncio.get_running_loop().call_later(delay + 0.01, self.wake)

    async def _timers(self, esc: Escalation, now: datetime) -> None:
        if esc.deadline is not None and esc.deadline <= now:
            try:
                after = await asyncio.to_thread(self.store.apply_timeout, esc.id, now)
                log.info(
                    "escalation_timed_out",
                    escalation=esc.id,
                    on_timeout=esc.on_timeout,
                    workflow=esc.workflow,
                    run_id=esc.run_id,
                    item=esc.item or esc.step,
                )
            except (AlreadyAnsweredError, InputError) as exc:
                log.debug("escalation_timeout_skipped", escalation=esc.id, error=str(exc))
                return
            if after is not None and after.status == "pending":  # on_timeout: escalate: the person is told again
                await self.escalator.queue(after, reminder=True)
        elif esc.remind_at is not None and not esc.reminded and esc.remind_at <= now:
            updated = await asyncio.to_thread(self.store.mark_reminded, esc.id, now)
            log.info(
                "escalation_reminded",
                escalation=esc.id,
                workflow=esc.workflow,
                run_id=esc.run_id,
                item=esc.item or esc.step,
                deadline=esc.deadline.isoformat() if esc.deadline else None,
            )
            await self.escalator.queue(updated, reminder=True)


class InboxEvaluator:
    """Packets handed in by ``ambient send`` (already authorized by it): ORCHESTRATE starts a run,
    ABORT stops one, ADAPT is recorded for the next run; everything else is recorded in the thread."""

    name = "inbox"

    def __init__(self, paths: Any, router: Router, on_packet: Any) -> None:
        self.paths = paths
        self.router = router
        self.on_packet = on_packet

    async def evaluate(self, tick: Tick) -> None:
        if not tick.touched(self.paths.inbox):
            return
        items = await asyncio.to_thread(lambda: list(read_inbox(self.paths)))
        for path, pkt, sealed in items:
            try:
                if isinstance(pkt, Packet):
                    # Re-check under the daemon's matrix: the inbox is a file drop, not a trust anchor. Its ``from``
                    # is believed only under the seal of whoever routed it (router.inbox_key), never for a file
                    # dropped there by hand or by an agent.
                    channel = Channel.internal(pkt.from_) if sealed else Channel("unauthenticated")
                    out = self.router.check(pkt, channel)
                    if not sealed:
                        log.warning("inbox_packet_unsealed", packet=pkt.id, file=path.name, claimed=pkt.from_)
                    if out.ok:
                        await self.on_packet(pkt)
                    else:
                        log.warning("inbox_packet_denied", packet=pkt.id, reason=out.reason)
                else:
                    log.warning("inbox_packet_invalid", file=str(path), error=str(pkt))
            finally:
                await asyncio.to_thread(_archive, path)


def _archive(path: Path) -> None:
    """Move a consumed inbox file to ``inbox/done/`` (kept for the audit, never lost)."""
    done = path.parent / "done"
    done.mkdir(exist_ok=True)
    path.replace(done / path.name)


def dumps(obj: Any) -> str:
    """Compact JSON for logs and files."""
    return json.dumps(obj, separators=(",", ":"), default=str)
