"""The runs of the daemon: started, resumed from their journals after a restart, decided, stopped.

:class:`RunManager` owns one asyncio task per run, each driven by an executor the factory builds from the run's
folded state (:mod:`ambient.engine.foreach`, :mod:`ambient.engine.chain`). On start it folds every unfinished
journal and goes on: done items are not run again, items that were running are run again (at most once per crash,
after the agents a crash orphaned are stopped), pending escalations stay pending; a finished run whose views a crash
cut short gets them written.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import stat
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from ambient.claims.claim import TERMINAL
from ambient.core.clock import Clock, SystemClock
from ambient.core.errors import JournalWriteError
from ambient.core.health import resource_of
from ambient.core.lazylog import get_logger
from ambient.core.process import process_start_time
from ambient.engine import events
from ambient.engine.events import EscalationRecord, Ruling
from ambient.engine.journals import finished_glance, journal_problem, truncate_torn_tail
from ambient.engine.planner import next_wakeup
from ambient.engine.runs import RunExecutor, iso, new_run_id, run_record
from ambient.engine.runstate import RunState, StoredQuestion, apply_event, ended_because, fold, reconcile_questions
from ambient.engine.slots import AgentSlots
from ambient.runners import orphans
from ambient.runners.base import RunRequest
from ambient.storage.journal import Journal, append_line, read_jsonl
from ambient.storage.paths import BrainPaths
from ambient.storage.yamlfile import MAX_CLAIM_BYTES

log = get_logger(__name__)

#: Agents at once, all runs together, until the settings say otherwise (``concurrency:``, its default).
DEFAULT_SLOTS = 4

ExecutorFactory = Callable[[RunState, Journal], RunExecutor]


class RunManager:
    """Owns the run tasks: start, resume from disk, route decisions, drain on shutdown."""

    def __init__(self, paths: BrainPaths, factory: ExecutorFactory, clock: Clock | None = None) -> None:
        self.paths = paths
        self.factory = factory
        self.clock = clock or SystemClock()
        self.executors: dict[str, RunExecutor] = {}
        self.tasks: dict[str, asyncio.Task[RunState]] = {}
        self.on_finished: list[Callable[[RunState], Awaitable[None] | None]] = []
        self.on_park: list[Callable[[], None]] = []  # a run went idle (waits on the person)
        self.slots = AgentSlots(DEFAULT_SLOTS)  # the daemon-wide cap; resized from the settings
        self._agent_ended = asyncio.Event()  # set by the executors when an agent's work ends (shutdown's drain)
        # Workflows that have a run journal on disk (filled by resume_all and start): a workflow file seen for
        # the first time is not started again when its run was already started before a crash.
        self.journaled: set[str] = set()
        #: Escalations the last resume_all found that no run can wait on (id, why): the caller cancels them.
        self.leftovers: list[tuple[str, str]] = []

    def start(
        self,
        *,
        workflow: str,
        form: str,
        spec: Mapping[str, Any],
        spec_hash: str | None,
        items: Sequence[str],
        mode: str | None = None,
        trigger: str = "file",
        context: Mapping[str, Any] | None = None,
        run_id: str | None = None,
    ) -> str:
        """Start a run: its ``started`` event (with the pinned spec) is on disk before anything runs. ``run_id``: one
        the caller derived from what it acts on, so that acting twice (after a restart) finds the run it started."""
        now = self.clock.now()
        run_id = run_id or new_run_id(workflow, now)
        journal = Journal(self.paths.run_journal(run_id))
        record = events.started(
            iso(now),
            run_id=run_id,
            workflow=workflow,
            form=form,
            spec_hash=spec_hash,
            spec=dict(spec),
            items=list(items),
            mode=mode,
            trigger=trigger,
            context=dict(context or {}),
        )
        journal.write(record)
        try:
            journal.sync()
        except OSError:
            # No room for the run (a full disk): no journal is left behind, so the next try starts it afresh.
            path = journal.path
            with contextlib.suppress(OSError):
                journal.close()
            with contextlib.suppress(OSError):
                if path.stat().st_size == 0:
                    path.unlink()
            raise
        state = fold([record])
        self.journaled.add(workflow)
        self._launch(state, journal)
        log.info("run_started", run_id=run_id, workflow=workflow, items=len(items), trigger=trigger)
        return run_id

    def _launch(self, state: RunState, journal: Journal) -> None:
        ex = self.factory(state, journal)
        ex.slots = self.slots
        ex.on_agent_end = self._agent_ended.set
        ex.ports.claims.run_changed(state)
        self.executors[state.run_id] = ex
        ex.on_park = self._parked
        task = asyncio.create_task(ex.run(), name=f"run:{state.run_id}")
        self.tasks[state.run_id] = task
        run_id = state.run_id
        task.add_done_callback(lambda t: self._done(run_id, t))

    def _parked(self) -> None:
        for cb in self.on_park:
            cb()

    def _done(self, run_id: str, task: asyncio.Task[RunState]) -> None:
        self.tasks.pop(run_id, None)
        self._agent_ended.set()  # a stop draining the runs looks again
        ex = self.executors.get(run_id)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("run_crashed", run_id=run_id, error=repr(exc))
            return
        if ex is not None and ex.state.finished:
            self.executors.pop(run_id, None)
            ex.journal.close()
            for cb in self.on_finished:
                r = cb(ex.state)
                if asyncio.iscoroutine(r):
                    asyncio.ensure_future(r)  # noqa: RUF006 - callbacks are short; errors are logged by them

    def resume_all(self, stored: Mapping[str, Sequence[StoredQuestion]] | None = None) -> list[str]:
        """Fold every unfinished run journal and continue it (the reconciliation pass).

        ``stored``: the escalation files by run id. A question a run's journal never recorded is attached to its item
        before the run goes on (:func:`reconcile_questions`), or put in :attr:`leftovers` for the caller to cancel."""
        self.leftovers = []
        resumed: list[str] = []
        directory = self.paths.run_journals
        if not directory.is_dir():
            return resumed
        behind: list[tuple[RunState, Path]] = []
        unfinished: list[tuple[RunState, Path]] = []
        unreadable: list[str] = []
        for path in sorted(directory.glob("*.jsonl")):
            run_id = path.stem
            if run_id in self.executors:
                continue
            glance = finished_glance(path)
            if glance is not None and self._views_current_at(run_id, glance[1]):
                self.journaled.add(glance[0])  # finished, its views written: nothing to fold
                continue
            res = read_jsonl(path)
            if res.torn_tail:
                truncate_torn_tail(path, self.paths.rel(path))
            try:
                state = fold(res.records)
            except (ValueError, KeyError, TypeError) as exc:
                # A problem of this run only (an edited journal): reported at file:line, not resumed, its workflow
                # not started again as if never seen; its agents, if any still run, are found by their environment.
                problem = journal_problem(path, self.paths.rel(path), exc)
                log.error(
                    "run_history_unreadable", run_id=run_id, file=problem.file, line=problem.line, error=problem.message
                )
                first = res.records[0] if res.records else {}
                if isinstance(first.get("workflow"), str):
                    self.journaled.add(first["workflow"])
                unreadable.append(run_id)
                continue
            self.journaled.add(state.workflow)
            if state.finished:
                if not self._views_current(state):
                    behind.append((state, path))
                continue
            unfinished.append((state, path))
        _stop_orphans(self.paths.root, [state for state, _ in unfinished], unreadable)
        for state, path in unfinished:
            run_id = state.run_id
            in_flight = [it.name for it in state.in_flight()]
            journal = Journal(path)
            by_name = {it.name: it for it in state.items}
            for name in in_flight:
                # Running at the crash: the agent may or may not have finished; run it again (at least once).
                ev = events.interrupted(
                    iso(self.clock.now()), item=name, attempt=by_name[name].attempt, reason="restart"
                )
                journal.write(ev)
                apply_event(state, by_name, ev)
            for r in reconcile_questions(state, (stored or {}).get(run_id, ())):
                q = r.question
                if r.verdict == "cancel":
                    self.leftovers.append((q.id, r.reason))
                    continue
                asked = events.asked(iso(self.clock.now()), escalation=q.id, request=cast(EscalationRecord, q.request))
                esc = events.escalated(
                    iso(self.clock.now()), item=str(q.item), escalation=q.id, kind=q.kind, agent=q.agent
                )
                for record in (asked, esc):
                    journal.write(record)
                    apply_event(state, by_name, record)
                log.warning("question_reattached", run_id=run_id, item=q.item, escalation=q.id, status=q.status)
            try:
                journal.sync()
            except JournalWriteError as exc:
                # A full disk: the records wait in memory, ahead of the ``accepted`` of any new attempt, which
                # is committed before its agent starts (RunExecutor.durably waits for space).
                log.warning("waiting_for_resources", resource=resource_of(exc), error=str(exc), run_id=run_id)
            self._launch(state, journal)
            # Item claims are views written after the journal (for_each ones coalesced): a kill can leave them
            # behind it, so every item already touched is written again from the journal (no ghost "open" claim).
            ex = self.executors[run_id]
            for it in state.items:
                if it.attempt or it.status != "pending":
                    ex.ports.claims.item_changed(state, it)
            resumed.append(run_id)
            log.info(
                "run_resumed",
                run_id=run_id,
                workflow=state.workflow,
                in_flight=in_flight,
                done=state.success_count,
                total=len(state.counted()),
            )
        if behind:
            self._catch_up(behind)
        return resumed

    def _views_current(self, state: RunState) -> bool:
        """Whether a finished run's views were written after it finished: its run claim (written last, after its
        item claims and its summary) is newer than its ``finished_run`` record.

        The kernel stamps files from a coarse clock (a tick, up to 10 ms, behind the one ``finished_at`` comes
        from): a claim written within a tick of the end may look older than it is. There the claim itself
        decides (closed or failed: written after the end), read only for those few runs.
        """
        return self._views_current_at(state.run_id, state.finished_at)

    def _views_current_at(self, run_id: str, finished_at: str | None) -> bool:
        path = self.paths.claims / f"{run_id}.yml"
        try:
            st = os.lstat(path)
        except OSError:
            return False
        try:
            finished = datetime.fromisoformat(finished_at).timestamp() if finished_at else None
        except ValueError:
            return True  # an unreadable time cannot say it is behind
        if finished is None:
            return True
        if st.st_mtime_ns / 1e9 - finished < -_COARSE_CLOCK_S:
            return False
        # Newer than the end is not enough: a claims writer behind its queue (a stop leaves its backlog to the
        # journals, service/stopping.py) wrote the run's "open" claim after the run had ended. The claim says.
        return _claim_closed(path)

    def _catch_up(self, behind: list[tuple[RunState, Path]]) -> None:
        """Finish what a crash cut after a run's ``finished_run``: its summary and its claims.

        Found by R-03 (tests/chaos/test_powerloss.py): a cut after the record was fsync'd but before the closed run
        claim was on disk left that claim ``open`` for good, since a finished run was never looked at again;
        a cut before the summary was appended would have left the run out of runs.jsonl. Each step is
        idempotent: the summary is appended only if runs.jsonl lacks it.
        """
        summarized = {r.get("run_id") for r in read_jsonl(self.paths.runs_log).records}
        for state, path in behind:
            if state.run_id not in summarized:
                try:
                    append_line(self.paths.runs_log, run_record(state).to_json_dict(), durable=True)
                except OSError as exc:  # a full disk: the next start catches up (the journal says it finished)
                    if resource_of(exc) is None:
                        raise
                    log.warning("waiting_for_resources", resource=resource_of(exc), error=str(exc))
                    continue
            journal = Journal(path)
            try:
                views = self.factory(state, journal).ports.claims
                for it in state.items:
                    if it.attempt or it.status != "pending":
                        views.item_changed(state, it)
                views.run_changed(state)  # the item claims first, then the run claim
            except Exception as exc:  # noqa: BLE001 - views of one old run must not keep the daemon from starting
                log.error("run_views_catch_up_failed", run_id=state.run_id, error=repr(exc))
                continue
            finally:
                journal.close()
            log.info(
                "run_views_caught_up",
                run_id=state.run_id,
                workflow=state.workflow,
                summary_appended=state.run_id not in summarized,
            )

    def record_spawn(self, run_id: str, item: str, attempt: int, pid: int, started: float | None = None) -> None:
        """A command agent started: its pid and start time go to the run's journal (flushed, not fsync'd:
        a daemon crash keeps the page cache, and a power cut takes the agent with it).

        ``started``: the start time the runner read already (off the loop); read here when not given.
        """
        ex = self.executors.get(run_id)
        if ex is None or not ex.has_item(item):
            return
        if started is None:
            # /proc/<pid>/stat directly (what psutil's create_time reads, to 10 ms): importing psutil here, on the
            # loop at the first spawn, stalled it ~130 ms and showed as a late watchdog ping (R-09 test).
            try:
                started = process_start_time(pid)  # None when the agent is already gone: the pid alone is recorded
            except Exception:  # noqa: BLE001 - an unreadable /proc entry must not fail the spawn
                started = None
        ex.event(events.spawned, item=item, attempt=attempt, pid=pid, started=started)
        ex.journal.flush()

    def spawned(self, req: RunRequest, pid: int, started: float | None) -> None:
        """The command runner's spawn hook: :meth:`record_spawn` for the attempt ``req`` carries."""
        self.record_spawn(req.run_id, req.item, req.attempt, pid, started)

    def not_running(self, run_id: str) -> bool:
        """Whether a run has no executor here (it ended, or never ran here): the live context shows only the requests
        of runs still running (a dict lookup, cheap off the loop)."""
        return run_id not in self.executors

    def ended_reason(self, run_id: str) -> str:
        """Why a settled run waits on nobody (:func:`ended_because`, from its journal): what the escalations it left
        behind say once cancelled (blocking: call through ``to_thread``)."""
        try:
            state = fold(read_jsonl(self.paths.run_journal(run_id)).records)
        except (OSError, ValueError, KeyError):
            return "its run is no longer running"
        return ended_because(state) if state.finished else "its run is no longer running"

    def settled(self, run_id: str) -> bool:
        """Whether nothing will ever resume a run: it is not running here, and its journal is finished or gone.

        A journal that cannot be read is not settled: the person may mend it (``ambient doctor`` reports it).
        """
        if run_id in self.executors:
            return False
        path = self.paths.run_journal(run_id)
        if not path.exists():
            return True
        if finished_glance(path) is not None:
            return True
        try:
            return fold(read_jsonl(path).records).finished
        except (OSError, ValueError, KeyError):
            return False

    def find_escalation(self, escalation: str) -> RunExecutor | None:
        """The executor waiting on an escalation."""
        for ex in self.executors.values():
            if escalation in ex.state.escalations:
                return ex
        return None

    def decide(self, d: Ruling) -> bool:
        """Route a decision to the run that waits on it."""
        ex = self.find_escalation(d.escalation)
        return ex is not None and ex.decide(d)

    @property
    def idle(self) -> bool:
        """No agent runs and no run can move without the person (or a timer)."""
        return all(ex.waiting and next_wakeup(ex.state) is None for ex in self.executors.values())

    def active_runs(self) -> list[RunState]:
        return [ex.state for ex in self.executors.values()]

    async def shutdown(self, grace: float) -> None:
        """Stop every run: no new agent starts, the running ones get ``grace`` seconds (``shutdown_grace_s``) to
        finish their work, and those still running then are interrupted: their runners send the process group
        SIGTERM, then SIGKILL after the agent's ``kill_grace_s``; a restart runs those items again."""
        for ex in self.executors.values():
            ex.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while any(ex.busy for ex in self.executors.values()) and loop.time() < deadline:
            self._agent_ended.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._agent_ended.wait(), deadline - loop.time())
        tasks = list(self.tasks.values())
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=grace + 5)
        for ex in self.executors.values():
            with contextlib.suppress(OSError):
                ex.journal.close()


def _stop_orphans(brain: Path, states: Sequence[RunState], unreadable: Sequence[str] = ()) -> None:
    """Agents a crash of the daemon left running (kill -9 outside systemd) are stopped before their items run
    again, so the same item never runs twice at once: those the journal names (pid *and* start time: a recycled
    pid is somebody else's process) and those whose pid never reached it, found by their environment. The agents
    of a run whose journal does not fold (``unreadable`` run ids) are found by their environment alone."""
    if not states and not unreadable:
        return
    found = [
        o
        for state in states
        for it in state.in_flight()
        if (o := orphans.by_journal(state.run_id, it.name, it.pid, it.pid_started)) is not None
    ]
    found += orphans.by_environment(brain, [*(state.run_id for state in states), *unreadable])
    orphans.stop(found)


_COARSE_CLOCK_S = 0.02  # file times lag the clock by up to a kernel tick; twice the longest (HZ=100)


_TERMINAL_LINE = re.compile(rb"^status: *[\"']?(?:%s)[\"']? *$" % b"|".join(sorted(t.encode() for t in TERMINAL)), re.M)


def _claim_closed(path: Path) -> bool:
    """Whether the claim file at ``path`` says closed or failed (unreadable, or any other status: no).

    Read at every start for every finished run: a look for its top-level ``status:`` line in the head of the
    file, not a YAML parse (a claim that says it otherwise is written again, which is harmless). The head only:
    the run claim of a 10,000-item fan-out lists every child (430 KB, over the size a claim is parsed at), and
    refusing it made every start catch that run up again."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        head = os.read(fd, MAX_CLAIM_BYTES)
    except OSError:
        return False
    finally:
        os.close(fd)
    return _TERMINAL_LINE.search(head) is not None
