"""The escalation port of the run executors: :class:`StoreEscalator` writes an escalation on disk (fsync'd) before
anything is sent, then queues its message in the outbox; information (results, automatic decisions) goes to the
outbox or the :class:`~.digest.Digest`. :class:`Learner` is the learning loop's hands: it learns from the person's
answers and decides where a learned rule may (opt-in). Blocking file work goes through ``to_thread``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ambient.core.clock import Clock
from ambient.core.errors import AlreadyAnsweredError, AmbientError
from ambient.core.lazylog import get_logger
from ambient.engine.journals import run_glance
from ambient.engine.ports import EscalationRequest
from ambient.engine.runstate import RunState, StoredQuestion, ended_because
from ambient.human.escalation_store import EscalationStore
from ambient.human.escalations import Escalation, EscalationDraft, new_escalation, offered_options
from ambient.human.messages import Message, QuestionCard, escalation_message
from ambient.human.outbox import Outbox
from ambient.human.telegram import PressResult, TelegramUser, decision_text, nonce_matches
from ambient.learning.rules import (
    DEFAULT_AUTO_REPEATS,
    DEFAULT_BACKOFF_S,
    Rule,
    Situation,
    auto_decision_notice,
    auto_repeat_delay,
    lose_standing,
    may_auto_decide,
    observe,
    predict,
    record_use,
    repeat_note,
)
from ambient.learning.rulestore import (
    escalation_prediction,
    escalation_situation,
    handed_back,
    load_rules,
    rules_path,
    update_rules,
)
from ambient.service.digest import Digest
from ambient.storage.paths import BrainPaths

log = get_logger(__name__)


class Learner:
    """The learning loop's hands: learn from the person's answers, decide where a rule may (opt-in)."""

    def __init__(self, paths: BrainPaths, clock: Clock, store: EscalationStore | None = None) -> None:
        self.path = rules_path(paths)
        self.clock = clock
        self.store = store  # the escalations answered so far: is an answer one after a rule's tries?
        self.bound = DEFAULT_AUTO_REPEATS  # learning.auto_repeats
        self.backoff_s = DEFAULT_BACKOFF_S  # learning.backoff_s

    @staticmethod
    def situation(esc: Escalation) -> Situation:
        return escalation_situation(esc)

    def observe(self, esc: Escalation) -> None:
        """Record a human decision as evidence (blocking: call through ``to_thread``)."""
        if esc.decision is None or esc.channel in ("rule", "timeout"):
            return
        if self.store is not None:
            rule_id = handed_back(esc, self.store.list("answered"))
            if rule_id is not None:
                log.info(
                    "answer_not_learned", escalation=esc.id, rule=rule_id, reason="answered after the rule's tries"
                )
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

    def rule_for(self, esc: Escalation) -> Rule | None:
        """The active, opted-in rule that may decide this escalation alone, or None."""
        if not self.path.exists():
            return None
        book, _ = load_rules(self.path)
        rule = predict(book.rules, self.situation(esc))
        options = [o.key for o in esc.options]
        return rule if may_auto_decide(rule, book.policy, options=options) else None

    def prediction_for(self, esc: Escalation) -> str | None:
        """What a learned rule that does not decide alone would choose, for the message (you still decide)."""
        return escalation_prediction(self.path, esc)

    def used(self, rule: Rule, run_id: str) -> None:
        """Count an automatic decision (blocking)."""
        now = self.clock.now()
        try:
            update_rules(self.path, lambda b: b.with_rules(record_use(b.rules, rule.id, run_id, now)))
        except (AmbientError, OSError) as exc:
            log.warning("rules_not_updated", error=str(exc))

    def demote(self, rule: Rule, why: str) -> None:
        """The rule's answer keeps leading back to the same situation: back to shadow (blocking)."""
        now = self.clock.now()
        try:
            update_rules(self.path, lambda b: b.with_rules(lose_standing(b.rules, rule.id, why, now)))
        except (AmbientError, OSError) as exc:
            log.warning("rules_not_updated", error=str(exc))


def _decided_by(store: EscalationStore, esc: Escalation, rule: Rule) -> int:
    """How many escalations of the same run and item (or step) the rule already decided, that one situation again."""
    where = esc.item or esc.step
    return sum(
        1
        for e in store.list("answered")
        if e.run_id == esc.run_id and (e.item or e.step) == where and e.by == f"rule:{rule.id}" and e.id != esc.id
    )


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
        *,
        learner: Learner | None = None,
        on_answered: Callable[[Path], None] | None = None,
    ) -> None:
        self.store = store
        self.outbox = outbox
        self.clock = clock
        self.wake_outbox = wake_outbox
        self.buttons = buttons
        self.results = results
        self.learner = learner
        self.digest: Digest | None = None
        # A decision written here, not by ``ambient decide`` (a learned rule's, a Telegram press): the engine looks
        # at its file at once.
        self.on_answered = on_answered
        # Whether anybody is told anything: without a URL, information is not queued (a URL added weeks later
        # would receive all of it); escalations are (a new URL receives those still pending, nothing else).
        self.notifying = True

    async def escalate(self, req: EscalationRequest) -> str:
        now = self.clock.now()
        options = offered_options(req.options)
        esc = new_escalation(
            EscalationDraft(
                workflow=req.workflow,
                run_id=req.run_id,
                kind=req.kind,  # type: ignore[arg-type]
                question=req.question,
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
            ),
            now=now,
        )
        since = datetime.fromisoformat(req.since) if req.since else None
        stored = await asyncio.to_thread(self.store.create, esc, since=since, settled=req.settled)
        if stored.id == esc.id:
            log.info("escalation_opened", escalation=esc.id, kind=req.kind, item=req.item)
            if not await self._auto_decide(stored):
                await self.queue(stored)
        elif since is not None:
            # Asked again after a crash: the question's file was there already, maybe answered meanwhile.
            log.info("escalation_reattached", escalation=stored.id, status=stored.status, item=req.item or req.step)
            if stored.status != "pending" and self.on_answered is not None:
                self.on_answered(self.store.path_for(stored.id))  # its answer is applied once the run records it
        return stored.id

    async def _auto_decide(self, esc: Escalation) -> bool:
        """A learned rule the person opted in to decides, recorded and sent as information (never silent)."""
        if self.learner is None:
            return False
        rule = await asyncio.to_thread(self.learner.rule_for, esc)
        if rule is None:
            return False
        # Its answer led back here before: bounded and backed off, then the person gets the item and what it did.
        previous = await asyncio.to_thread(_decided_by, self.store, esc, rule)
        delay = auto_repeat_delay(previous, bound=self.learner.bound, backoff_s=self.learner.backoff_s)
        if delay is None:
            # Its message says so: the demoted rule's prediction carries what it did (learning.rules.shadow_hint).
            await asyncio.to_thread(self.learner.demote, rule, repeat_note(rule, previous))
            log.warning("auto_decision_bounded", escalation=esc.id, rule=rule.id, times=previous)
            return False
        if delay:
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:  # stopped while backing off: the question is the person's, never lost
                await self.queue(esc)
                raise
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

    async def answer_press(self, esc_id: str, index: int, nonce: str, user: TelegramUser) -> PressResult:
        """A Telegram button press: the same answer as ``ambient decide``, then the run resumes at once."""
        try:
            esc = await asyncio.to_thread(self.store.get, esc_id)
        except AmbientError:
            return PressResult("invalid", "Unknown escalation.")
        if not nonce_matches(esc.nonce, nonce):
            return PressResult("invalid", "This button is not valid any more.")
        if esc.status == "pending" and esc.respawn is None:
            glance = await asyncio.to_thread(run_glance, self.store.paths, esc.run_id)
            if glance is not None and glance.ended:  # nothing would apply it: said, never "decided"
                option = esc.options[index].key if 0 <= index < len(esc.options) else str(index + 1)
                reason = f"not applied: {glance.reason} before the answer ({option} by {user.name} via telegram)"
                with contextlib.suppress(AlreadyAnsweredError):
                    await asyncio.to_thread(self.store.cancel, esc_id, reason)
                log.warning("answer_not_applied", escalation=esc_id, run_id=esc.run_id, reason=glance.reason)
                return PressResult("already_decided", f"Not applied: {glance.reason}. The question is closed.")
        try:
            done = await asyncio.to_thread(self.store.answer, esc_id, str(index + 1), by=user.name, channel="telegram")
        except AlreadyAnsweredError as exc:
            prev = exc.escalation
            if prev.status == "cancelled":
                return PressResult("already_decided", f"No longer needed: {prev.note or 'cancelled'}")
            when = prev.answered_at or prev.timed_out_at or self.clock.now()
            line = decision_text(prev.decision or "", prev.by or "?", when)  # as the deciding press showed it
            return PressResult("already_decided", f"Already decided: {prev.decision} by {prev.by}", line)
        if self.on_answered is not None:
            self.on_answered(self.store.paths.escalations / f"{esc_id}.yml")
        return PressResult("decided", decision_text(done.decision or "", user, self.clock.now()))

    async def cancel_leftovers(self, run_id: str, reason: str) -> None:
        """Close a run's pending escalations as cancelled: no longer listed, notified or answerable."""
        try:
            gone = await asyncio.to_thread(self.store.cancel_run, run_id, reason)
        except (AmbientError, OSError) as exc:  # a broken escalation file: reported by doctor, retried next tick
            log.warning("escalations_not_cancelled", run_id=run_id, error=str(exc))
            return
        for esc in gone:
            log.info("escalation_cancelled", escalation=esc.id, run_id=run_id, item=esc.item or esc.step, reason=reason)

    async def catch_up(self, key: str, target: str, others: frozenset[str]) -> int:
        """A channel came up (the Telegram bot after a fixed token, at start or at a reload): queue for it alone
        the pending escalations it never got, with their buttons. Its delivery reference on an escalation (recorded
        at each delivery) says it got one, so a second reload sends nothing twice. Returns how many were queued."""
        if self.outbox is None:
            return 0
        pending = await asyncio.to_thread(self.store.list, "pending")
        queued = 0
        for esc in pending:
            if target in esc.notify.refs:
                continue
            await self.queue(esc, skip=others, hasten=True)
            queued += 1
        return queued

    async def queue(
        self, esc: Escalation, *, reminder: bool = False, skip: frozenset[str] = frozenset(), hasten: bool = False
    ) -> None:
        """Queue the escalation's message (or its reminder) in the outbox (sent at once, retried until delivered,
        dropped if the escalation is settled first); not to the targets in ``skip``; ``hasten``: if it is queued
        already, it is tried again now."""
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
            QuestionCard(
                escalation_id=esc.id,
                what=what,
                question=esc.question,
                options=[o.key for o in esc.options],
                nonce=esc.nonce,
                workflow=esc.workflow,
                item=esc.item,
                step=esc.step,
                agent=esc.agent,
                deadline=esc.deadline.isoformat(timespec="minutes") if esc.deadline else None,
                prediction=prediction,
            ),
            telegram_buttons=self.buttons,
            reminder=reminder,
        )
        await asyncio.to_thread(self.outbox.put, msg, self.clock.now(), skip=skip, hasten=hasten)
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


def stored_questions(store: EscalationStore) -> dict[str, list[StoredQuestion]]:
    """The escalation files of runs, by run id, as the start-up reconciliation reads them (blocking: call through
    ``to_thread``): pending or answered, each with the request its run's journal would have kept."""
    out: dict[str, list[StoredQuestion]] = {}
    for esc in store.list():
        if esc.respawn is not None or esc.status == "cancelled":
            continue
        request: dict[str, Any] = {
            "kind": esc.kind,
            "question": esc.question,
            "options": [[o.key, o.label, o.action] for o in esc.options],
        }
        for key in ("item", "step", "agent", "scope"):
            value = getattr(esc, key)
            if value is not None:
                request[key] = value
        request["dedupe_key"] = esc.dedupe_key
        if esc.detail and esc.detail != esc.question:
            request["detail"] = esc.detail
        question = StoredQuestion(esc.id, esc.item or esc.step, esc.kind, esc.status, request, esc.agent)
        out.setdefault(esc.run_id, []).append(question)
    return out
