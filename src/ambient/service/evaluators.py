"""The evaluators of the daemon's tick (:class:`~ambient.engine.tick.TriggerEngine`): each looks at one concern
when something under it changed, or on a timed tick, and hands the work to the services it was built with.

Workflows (reload the brain, start runs), escalations (decisions, timeouts, reminders), the inbox (packets from
``ambient send``), stale claims, and ``--until-idle``. The digest (:mod:`~.digest`) and the heap trim
(:mod:`~.heap`) are evaluators too, next to what they drive. Blocking file work goes through ``to_thread``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from ambient.claims.claim import ClaimFacts
from ambient.claims.statusline import surely_not_open
from ambient.claims.store import ClaimStore
from ambient.core.clock import Clock
from ambient.core.errors import AlreadyAnsweredError, AmbientError, InputError
from ambient.core.lazylog import get_logger
from ambient.engine.events import Ruling
from ambient.engine.journals import RunGlance, run_glance
from ambient.engine.manager import RunManager
from ambient.engine.planner import ANSWER
from ambient.engine.tick import Tick
from ambient.human.escalation_store import EscalationStore
from ambient.human.escalations import ENGINE_ACTIONS, Escalation, next_timer, rebuild, reminder_due, timeout_due
from ambient.human.outbox import Outbox
from ambient.kernel.channels import Channel
from ambient.kernel.inbox import read_inbox
from ambient.kernel.packet import Packet
from ambient.kernel.router import Router
from ambient.service.adapters import BrainRef
from ambient.service.escalator import StoreEscalator
from ambient.service.notifications import NotifyService
from ambient.service.starts import RunStarts
from ambient.service.troubles import Troubles
from ambient.storage.fsutil import PRIVATE_FILE, TMP_MARK, atomic_write, move, private_dir
from ambient.storage.paths import BrainPaths
from ambient.storage.yamltext import MAX_CLAIM_BYTES
from ambient.workflows.triggers import start_due

log = get_logger(__name__)


class Reload(Protocol):
    """The daemon's reload (:meth:`~ambient.service.daemon.Daemon.reload`): the brain read again and handed to every
    part; ``sighup``: asked for by SIGHUP (systemd is told), ``only_workflows``: nothing but ``workflows/`` changed."""

    def __call__(self, *, only_workflows: bool = False, sighup: bool = False) -> Awaitable[None]: ...


class SeenWorkflows:
    """The workflows started before (``.ambient/workflows.json``): a workflow seen once is not "new" again, and a
    schedule counts from its last start. Its own object, made before both of its writers (the workflows evaluator
    and :class:`~ambient.service.starts.RunStarts`), so neither needs the other."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = self._load()

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
            return {str(k): dict(v) for k, v in data.items()} if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def save(self) -> None:
        atomic_write(self.path, json.dumps(self.entries, indent=1, sort_keys=True) + "\n", mode=PRIVATE_FILE)

    def mark_started(self, name: str, spec_hash: str, now: datetime) -> None:
        entry = self.entries.setdefault(name, {"first_hash": spec_hash, "runs": 0})
        entry["last_started"] = now.isoformat()
        entry["runs"] = int(entry.get("runs", 0)) + 1
        self.save()


@dataclass(frozen=True)
class WorkflowParts:
    """What the workflows evaluator uses: the brain and its reload, the runs and how they start, the guard of the
    daemon's writes (a full disk holds a start up, it does not fail it), the engine's wake-up."""

    paths: BrainPaths
    ref: BrainRef
    manager: RunManager
    starts: RunStarts
    troubles: Troubles
    seen: SeenWorkflows
    wake: Callable[[], None]
    reload: Reload


@dataclass(frozen=True)
class IdleParts:
    """What ``--until-idle`` reads to tell that nothing can move without the person, and how it stops the daemon
    (``ready``: set once the daemon is up; ``stop``: the daemon's stop)."""

    paths: BrainPaths
    manager: RunManager
    troubles: Troubles
    notify: NotifyService
    outbox: Outbox
    clock: Clock
    wake: Callable[[], None]
    ready: asyncio.Event
    stop: asyncio.Event


class WorkflowEvaluator:
    """Reloads the brain when its files change, and starts runs: a new workflow file starts one run;
    ``schedule: every`` starts the next when due. Seen workflows are remembered in ``.ambient/workflows.json``."""

    name = "workflows"

    #: Reload debounce (R-08: 50 rapid saves must not cause 50 reloads). A change after this long without
    #: changes reloads at once (a dropped workflow starts promptly); changes closer together than this are
    #: coalesced into one trailing reload once the files have been quiet this long...
    RELOAD_QUIET_S = 0.1
    #: ... or after this long of constant churn, so that a file rewritten forever still gets loaded.
    RELOAD_MAX_WAIT_S = 2.0

    def __init__(self, parts: WorkflowParts) -> None:
        self.parts = parts
        self.reload_requested = False  # SIGHUP: the next tick reloads everything (request_reload)
        self._dirs = (parts.paths.workflows, parts.paths.agents, parts.paths.profil)
        self._fp = self._fingerprint()
        self._last_change = float("-inf")
        self._pending_since: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    def _fingerprint(self) -> frozenset[tuple[str, int, int, int]]:
        """A cheap listing (name, mtime, size, inode) of the files a reload reads."""
        out: set[tuple[str, int, int, int]] = set()
        for d in self._dirs:
            with contextlib.suppress(OSError), os.scandir(d) as entries:
                for e in entries:
                    if e.name.startswith(".") or TMP_MARK in e.name:
                        continue
                    with contextlib.suppress(OSError):
                        st = e.stat(follow_symlinks=False)
                        out.add((e.path, st.st_mtime_ns, st.st_size, st.st_ino))
        return frozenset(out)

    async def _reload_due(self, tick: Tick) -> bool:
        """Whether this tick reloads the brain (see RELOAD_QUIET_S); schedules the trailing reload."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if tick.timed:
            # File events are hints (RELIABILITY §2.3): a timed tick compares the listing, which is also how
            # ``--no-watch`` picks up new and edited files (it never reloaded before: e2e test).
            fp = await asyncio.to_thread(self._fingerprint)
            changed, self._fp = fp != self._fp, fp
        else:
            changed = any(tick.touched(p) for p in self._dirs)
            if changed:
                # On the loop: a listing of three small folders (~0.1 ms for 100 workflows) is cheaper than a
                # thread's round trip, which under load took milliseconds of a dropped workflow's way to its first
                # SPAWN (bench/fanout.py (d)).
                self._fp = self._fingerprint()
        if changed:
            isolated = self._pending_since is None and now - self._last_change >= self.RELOAD_QUIET_S
            self._last_change = now
            if isolated:
                return True
            if self._pending_since is None:
                self._pending_since = now
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_later(self.RELOAD_QUIET_S + 0.01, self.parts.wake)
            return False
        return self._pending_since is not None and (
            now - self._last_change >= self.RELOAD_QUIET_S or now - self._pending_since >= self.RELOAD_MAX_WAIT_S
        )

    def request_reload(self) -> None:
        """SIGHUP: the next tick reloads everything (the caller wakes the engine)."""
        self.reload_requested = True

    async def evaluate(self, tick: Tick) -> None:
        d = self.parts
        due = await self._reload_due(tick)
        if self.reload_requested or due:
            sighup, self.reload_requested = self.reload_requested, False  # a SIGHUP during the reload: another one
            self._pending_since = None
            only_wf = not tick.timed and all(
                p.parent == d.paths.workflows for p in tick.changes if any(p.is_relative_to(x) for x in self._dirs)
            )
            await d.reload(only_workflows=only_wf, sighup=sighup)
            # Changes seen while the reload ran belong to the same burst: coalesce them (not "isolated").
            self._last_change = max(self._last_change, asyncio.get_running_loop().time())
        for name, wf in sorted(d.ref.brain.workflows.items()):
            entry = d.seen.entries.get(name)
            running = wf.spec.schedule is not None and d.starts.has_active_run(name)  # only a schedule asks
            why = start_due(wf.spec, entry, tick.now, running=running)
            if why is None:
                continue
            start = partial(d.starts.start_run, wf, trigger=why)
            if entry is None:
                # Crash order: the run's ``started`` is fsync'd before workflows.json says "seen", so a kill
                # in between cannot lose the run (saving first did: the workflow never ran). A journal already on
                # disk for it means a kill came right after the start: that run is resumed, not started twice.
                # A start the disk had no room for is not "seen": it is tried again once there is room.
                if name not in d.manager.journaled and not d.troubles.tried(start):
                    continue
                d.seen.entries[name] = {"first_hash": wf.spec_hash, "last_started": tick.now.isoformat(), "runs": 1}
                await d.troubles.save_or_wait(d.seen.save)
                continue
            if not d.troubles.tried(start):
                continue
            entry["last_started"] = tick.now.isoformat()
            entry["runs"] = int(entry.get("runs", 0)) + 1
            await d.troubles.save_or_wait(d.seen.save)


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
        self._ended: dict[str, RunGlance] = {}  # ended runs' journals as read this tick (see _not_applied)
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
        self._ended.clear()  # each answer is looked at once (applied): the journals read are not kept past the tick
        self._arm(next_timer(e for e in escs if e.run_id not in ended))

    async def _rebuild_lost(self, listed: set[str]) -> list[Escalation]:
        """The escalations a run waits on whose file is missing, empty or unreadable, written again from what the
        run's journal kept: otherwise the run waits for good on a question nobody can see."""
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
            Ruling(
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
        )
        if ok:
            # A line about a run carries its workflow and run id, like the executor's own lines.
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
            await self._not_applied(esc)
        # else: its run has not recorded the escalation yet (a rule answered at once, a question asked again after
        # a crash): next tick.

    async def _not_applied(self, esc: Escalation) -> None:
        """An answer whose run is not running here: applied before (its journal decided it), or never, because the
        run ended first (an answer given as it ended, or while the daemon was down): then the person is told,
        it is logged, and the escalation says so (``unapplied``), once. Never dropped in silence."""
        if esc.unapplied:
            self.applied.add(esc.id)
            return
        glance = self._ended.get(esc.run_id)
        if glance is None:
            glance = await asyncio.to_thread(run_glance, self.store.paths, esc.run_id)
            if glance is not None and glance.ended:
                self._ended[esc.run_id] = glance  # an ended run's journal never changes: read once a tick
        if glance is None or not glance.ended:
            return  # a journal that cannot be read (doctor reports it), or a run not resumed yet: looked at again
        self.applied.add(esc.id)
        if esc.id in glance.decided:
            return
        reason = f"its run ended before the answer could be applied: {glance.reason}"
        log.warning(
            "answer_not_applied",
            escalation=esc.id,
            decision=esc.decision,
            by=esc.by,
            workflow=esc.workflow,
            run_id=esc.run_id,
            item=esc.item or esc.step,
            reason=glance.reason,
        )
        try:
            await asyncio.to_thread(self.store.mark_unapplied, esc.id, reason)
        except (AmbientError, OSError) as exc:
            log.warning("escalation_not_marked", escalation=esc.id, error=str(exc))
        await self.escalator.inform(
            f"{esc.workflow}: your answer was not applied",
            f"{esc.id} ({esc.where}): {esc.decision} by {esc.by} was not applied: {reason}.",
            urgent=True,
        )

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
        if timeout_due(esc, now):
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
        elif reminder_due(esc, now):
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

    def __init__(self, paths: BrainPaths, router: Router, on_packet: Callable[[Packet], Awaitable[None]]) -> None:
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
                    # is believed only under the seal of whoever routed it (inbox.inbox_key), never for a file
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
    done = private_dir(path.parent / "done")  # ambient's state: 0700 like every folder of .ambient/
    move(path, done / path.name)


class StaleClaimsEvaluator:
    """Open claims past their TTL become ``stale`` (timed ticks only; only changed claim files are read)."""

    name = "stale_claims"
    FULL_SCAN_S = 600.0
    CTIME_SLACK_NS = 2_000_000_000  # ctimes come from a coarse clock; a file written during a look counts as new

    #: The most often a look runs (the daemon makes it ``tick_seconds`` when that is shorter). Each run's end asks
    #: for a timed tick, and a look stats every file of claims/, which only grows: a daemon of many short runs
    #: looked at every claim it ever wrote once per run (a 1,000-item fan-out after 24 others: ~25,000 stats, its
    #: thread 4x the CPU of the third run's; bench/fanout.py). TTLs count in hours, and the regular tick came only
    #: every ``tick_seconds`` anyway.
    EVERY_S = 10.0

    def __init__(self, store: ClaimStore, hours: float, clock: Clock, every_s: float = 0.0) -> None:
        self.store = store
        self.hours = hours
        self.clock = clock
        self.every_s = every_s  # the least time between two looks (see EVERY_S)
        self._looked_at: float | None = None  # clock.monotonic() at the last look
        # Idle cost (bench/idle.py): parsing 1,000 claims on every timed tick cost ~1 s of CPU per tick. A timed
        # tick stats the files and parses only those that changed; mark_stale runs only when some claim is due.
        # Only open claims are remembered (their file's inode, size and mtime and when they go stale): a file
        # changed since the last look has a newer ctime (any write, rename or link sets it), so closed claims
        # need no memory at all. R-12's soak writes 9 claim files per run: remembering every file grew the
        # daemon ~3 KB a run. Every FULL_SCAN_S, and when the clock went back, every file is looked at again.
        self._open: dict[str, tuple[tuple[int, int, int], datetime]] = {}
        self._last_look_ns = 0  # wall clock at the start of the last look (ctimes are wall clock)
        self._last_full_ns = 0
        self._wall_ns: Callable[[], int] = time.time_ns

    async def evaluate(self, tick: Tick) -> None:
        if not tick.timed:
            return
        mono = self.clock.monotonic()
        if self._looked_at is not None and mono - self._looked_at < self.every_s:
            return
        self._looked_at = mono
        now = self.clock.now()
        if not await asyncio.to_thread(self._any_due, now):
            return
        changed = await asyncio.to_thread(self.store.mark_stale, now=now, default_ttl=timedelta(hours=self.hours))
        if changed:
            log.info("claims_stale", count=len(changed))

    def _any_due(self, now: datetime) -> bool:
        """Whether an open claim may be past its TTL; reads only the claim files changed since the last look."""
        tz = now.astimezone().tzinfo
        assert tz is not None
        default = timedelta(hours=self.hours)
        look_ns = self._wall_ns()
        full = look_ns < self._last_look_ns or look_ns - self._last_full_ns > self.FULL_SCAN_S * 1e9
        since = 0 if full else self._last_look_ns - self.CTIME_SLACK_NS
        seen: dict[str, tuple[tuple[int, int, int], datetime]] = {}
        try:
            entries = os.scandir(self.store.dir)
        except FileNotFoundError:
            entries = None
        with entries if entries is not None else contextlib.nullcontext(()) as it:
            due = self._look(it, now, tz, default, since, seen)
        self._open = seen
        self._last_look_ns = look_ns
        if full:
            self._last_full_ns = look_ns
        return due

    def _look(
        self,
        entries: Iterable[os.DirEntry[str]],
        now: datetime,
        tz: tzinfo,
        default: timedelta,
        since: float,
        seen: dict[str, tuple[tuple[int, int, int], datetime]],
    ) -> bool:
        # One entry at a time, not a list of them: claims/ only grows (9 files a run in R-12's soak), and a list
        # of every entry with its stat held ~0.9 KB a file at once each tick (3.7 MB at 4,000 files). Peaks like
        # that, freed again, leave the allocator's arenas a little larger each time.
        due = False
        for e in entries:
            if e.name.startswith(".") or not e.name.endswith((".yml", ".yaml")):
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            sig = (st.st_ino, st.st_size, st.st_mtime_ns)
            hit = self._open.get(e.name)
            if hit is not None and hit[0] == sig:
                seen[e.name] = hit
                due = due or now > hit[1]
                continue
            if hit is None and st.st_ctime_ns < since:
                continue  # not open when last looked at, and unchanged since
            # A claim ambient wrote itself (every item of a fan-out) is known without parsing it again: parsing
            # 2,000 item claims after a run took ~3 s of CPU (bench/fanout.py, py-spy).
            facts = self.store.known_facts(Path(e.path), sig)
            if facts is None and stat.S_ISREG(st.st_mode) and _not_open(e.path):
                continue  # closed (or another status) by its one top-level status line: no parse needed
            if facts is None:
                try:
                    facts = ClaimFacts.of(self.store.read(Path(e.path))[0])
                except (AmbientError, OSError):
                    continue  # unreadable: mark_stale skips it too (ambient doctor reports it)
            at = facts.stale_at(tz, default)
            if at is not None:
                seen[e.name] = (sig, at)
                due = due or now > at
        return due


def _not_open(path: str) -> bool:
    """Whether a claim file surely is not open, from its text (:func:`~ambient.claims.statusline.surely_not_open`),
    read without following a link or waiting on a FIFO.

    The full look every FULL_SCAN_S parsed every claim file the store had not written itself (2-3 ms each with the
    safe loader): a brain keeps every claim, so a long-running daemon spent minutes of CPU on each full look
    (R-12's soak writes 9 claim files a run). Anything unusual (no such line, two of them, flow style, unreadable)
    answers False and the file is parsed as before.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        data = os.read(fd, MAX_CLAIM_BYTES + 1)
    except OSError:
        return False
    finally:
        os.close(fd)
    return surely_not_open(data)


class IdleEvaluator:
    """``--until-idle``: stop once no agent runs and every run waits on the person (or is done)."""

    name = "idle"

    def __init__(self, parts: IdleParts, *, until_idle: bool) -> None:
        self.parts = parts
        self.until_idle = until_idle

    async def evaluate(self, tick: Tick) -> None:
        d = self.parts
        if not (self.until_idle and d.ready.is_set() and d.manager.idle) or any(d.paths.inbox.glob("*.json")):
            return
        if "disk" in d.troubles.health.conditions:
            return  # work held up by a full disk is not done: it goes on once there is room
        if d.notify.active:
            # Notifications are part of the work: wait for those due soon (a first try, a quick retry).
            soon = d.clock.now() + timedelta(seconds=2)
            entries = await asyncio.to_thread(d.outbox.entries)
            if any(e.next_at <= soon for e in entries):
                asyncio.get_running_loop().call_later(0.2, d.wake)
                return
        log.info("idle", runs=len(d.manager.executors))
        d.stop.set()
