"""The run executor and manager with fake ports: fan-out, retries, escalations, resume from disk."""

from __future__ import annotations

import asyncio
import os
import random
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambient.engine.events import Ruling
from ambient.engine.foreach import ForEachExecutor
from ambient.engine.manager import RunManager
from ambient.engine.planner import FanOut, ItemTemplate, RetryPolicy
from ambient.engine.ports import Attempt, AttemptResult, EscalationRequest, Ports
from ambient.engine.runs import RunExecutor
from ambient.engine.runstate import ItemState, RunState, fold
from ambient.storage.journal import Journal, read_jsonl
from ambient.storage.paths import BrainPaths
from ambient.workflows.variables import COMPLETE_VARS, ITEM_VARS
from tests.conftest import async_wait_until


def _render(template: str, variables: Mapping[str, Any]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: str(variables[m.group(1)]), template)


class FakeDelegate:
    def __init__(self, fail: set[str] | None = None, errors: dict[str, int] | None = None) -> None:
        self.fail = fail or set()
        self.errors = dict(errors or {})
        self.calls: list[Attempt] = []
        self.gate: asyncio.Event | None = None

    async def attempt(self, a: Attempt) -> AttemptResult:
        self.calls.append(a)
        if self.gate is not None:
            await self.gate.wait()
        if self.errors.get(a.item, 0) > 0:
            self.errors[a.item] -= 1
            return AttemptResult(result="error", error="boom 42")
        if a.item in self.fail:
            return AttemptResult(result="fail", error="deploy refused")
        return AttemptResult(result="success", output={"status": "ok"}, signal_in="RETURN")


class FakeEscalator:
    def __init__(self) -> None:
        self.requests: list[EscalationRequest] = []

    async def escalate(self, req: EscalationRequest) -> str:
        self.requests.append(req)
        return f"esc-{len(self.requests)}"

    async def inform(self, title: str, body: str) -> None:
        return None


class FakeClaims:
    def __init__(self) -> None:
        self.items: dict[str, str] = {}
        self.runs: dict[str, bool] = {}

    def run_changed(self, state: RunState) -> None:
        self.runs[state.run_id] = state.finished

    def item_changed(self, state: RunState, item: ItemState) -> None:
        self.items[item.name] = item.status


class FakeEmitter:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, dict[str, Any]]] = []

    async def emit(self, signal: str, to: str, payload: Mapping[str, Any], run: RunState) -> bool:
        self.sent.append((signal, to, dict(payload)))
        return True


def _manager(root: Path, delegate: FakeDelegate, plan: FanOut | None = None, render=_render, context=None):
    paths = BrainPaths(root)
    esc, claims, emitter = FakeEscalator(), FakeClaims(), FakeEmitter()
    ports = Ports(
        delegate=delegate,
        escalator=esc,
        claims=claims,
        emitter=emitter,
        render_text=render,
        render_path=render,
        rng=random.Random(1),
    )
    template = ItemTemplate(
        agent="deploy",
        files=("vps/{{item}}.yml",),
        zone="project",
        context=context or {},
        complete_to="orchestrator",
        complete_result="{{success_count}}/{{total}} deployed",
    )

    def factory(state: RunState, journal: Journal) -> RunExecutor:
        return ForEachExecutor(state, plan or FanOut(concurrency=3), template, ports, journal, paths)

    return RunManager(paths, factory), esc, claims, emitter


ITEMS = [f"instance-{i:02d}" for i in range(1, 11)]


async def test_fanout_runs_every_item_and_completes(tmp_path: Path) -> None:
    """All items run once, the on_complete RETURN carries the templated result, a run record is written."""
    delegate = FakeDelegate()
    mgr, _, claims, emitter = _manager(tmp_path, delegate)
    run_id = mgr.start(workflow="deploy-batch", form="for_each", spec={}, spec_hash="h", items=ITEMS)
    await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert sorted(a.item for a in delegate.calls) == ITEMS
    assert emitter.sent[-1] == ("RETURN", "orchestrator", {"result": "10/10 deployed"})
    assert all(s == "done" for s in claims.items.values())
    rec = read_jsonl(BrainPaths(tmp_path).runs_log).records
    assert rec[0]["outcome"] == "success" and len(rec[0]["steps"]) == 10
    assert delegate.calls[0].files == ("vps/instance-01.yml",)
    assert delegate.calls[0].key == f"{run_id}/instance-01/1"


async def test_items_and_completion_render_with_the_names_validation_allows(tmp_path: Path) -> None:
    """One home for template variables (ambient.workflows.variables): an item's files and context are rendered with
    the names `ambient validate` allows there, and ``attempt`` (the runner's argv may name it too); on_complete with
    those allowed in on_complete."""
    seen: dict[str, set[frozenset[str]]] = {}

    def recording(template: str, variables: Mapping[str, Any]) -> str:
        seen.setdefault(template, set()).add(frozenset(variables))
        return _render(template, variables)

    delegate = FakeDelegate()
    mgr, *_ = _manager(tmp_path, delegate, render=recording, context={"where": "{{index}}/{{total}}"})
    run_id = mgr.start(workflow="deploy-batch", form="for_each", spec={}, spec_hash="h", items=ITEMS[:2])
    await asyncio.wait_for(mgr.tasks[run_id], 5)
    item_names = {ITEM_VARS | {"attempt"}}
    assert seen == {
        "vps/{{item}}.yml": item_names,
        "{{index}}/{{total}}": item_names,
        "{{success_count}}/{{total}} deployed": {COMPLETE_VARS},
    }
    assert all(set(a.vars) == ITEM_VARS | {"attempt"} for a in delegate.calls)


async def test_failed_item_escalates_and_retry_decision_completes(tmp_path: Path) -> None:
    """A failing item waits on an escalation; 'retry' runs it again and the run completes."""
    delegate = FakeDelegate(fail={"instance-07"})
    mgr, esc, _, emitter = _manager(tmp_path, delegate)
    run_id = mgr.start(workflow="deploy-batch", form="for_each", spec={}, spec_hash="h", items=ITEMS)
    assert await async_wait_until(lambda: mgr.idle and bool(esc.requests), 5)
    req = esc.requests[0]
    assert req.item == "instance-07" and [o[0] for o in req.options] == ["retry", "skip", "abort"]
    delegate.fail.clear()
    assert mgr.decide(Ruling("esc-1", "retry", "retry", by="human", channel="cli", latency_s=1.5))
    await asyncio.wait_for(mgr.tasks[run_id], 5)
    state = fold(read_jsonl(BrainPaths(tmp_path).run_journal(run_id)).records)
    assert state.outcome == "success" and state.escalation_count == 1
    assert [a.item for a in delegate.calls].count("instance-07") == 2
    rec = read_jsonl(BrainPaths(tmp_path).runs_log).records[0]
    assert rec["escalations"] == 1 and rec["decisions"][0]["option"] == "retry"
    assert emitter.sent[-1][2]["result"] == "10/10 deployed"


async def test_skip_and_abort_decisions(tmp_path: Path) -> None:
    """'skip' finishes the run as partial; 'abort' stops it as aborted."""
    for option, outcome in (("skip", "partial"), ("abort", "aborted")):
        root = tmp_path / option
        mgr, esc, _, _ = _manager(root, FakeDelegate(fail={"instance-02"}))
        run_id = mgr.start(workflow="w", form="for_each", spec={}, spec_hash=None, items=ITEMS[:3])
        assert await async_wait_until(lambda m=mgr, e=esc: m.idle and bool(e.requests), 5)
        mgr.decide(Ruling("esc-1", option, option, by="human", channel="cli"))
        state = await asyncio.wait_for(mgr.tasks[run_id], 5)
        assert state.outcome == outcome


async def test_errors_are_retried_with_backoff_before_escalating(tmp_path: Path) -> None:
    """An error is retried per the policy; only the last failure escalates."""
    plan = FanOut(concurrency=2, retry=RetryPolicy(attempts=3, base_s=0.001, cap_s=0.002))
    delegate = FakeDelegate(errors={"instance-01": 2})
    mgr, esc, _, _ = _manager(tmp_path, delegate, plan)
    run_id = mgr.start(workflow="w", form="for_each", spec={}, spec_hash=None, items=ITEMS[:2])
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "success" and not esc.requests
    assert [a.item for a in delegate.calls].count("instance-01") == 3


async def test_resume_after_crash_reruns_only_in_flight_items(tmp_path: Path) -> None:
    """A history cut mid-run resumes: done items are not run again, in-flight ones run once more."""
    paths = BrainPaths(tmp_path)
    paths.run_journals.mkdir(parents=True)
    run_id = "sess-20261130-1200-w-abcd"
    events: list[dict[str, Any]] = [
        {"ev": "started", "run_id": run_id, "workflow": "w", "form": "for_each", "spec": {}, "items": ITEMS[:4]},
        {"ev": "accepted", "item": "instance-01", "attempt": 1},
        {"ev": "accepted", "item": "instance-02", "attempt": 1},
        {"ev": "finished", "item": "instance-01", "attempt": 1, "result": "success"},
    ]
    import json

    raw = "".join(json.dumps(e) + "\n" for e in events) + '{"ev": "finished", "item": "inst'  # torn tail
    paths.run_journal(run_id).write_text(raw)
    delegate = FakeDelegate()
    mgr, _, _, _ = _manager(tmp_path, delegate)
    assert mgr.resume_all() == [run_id]
    state = await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert state.outcome == "success"
    ran = sorted((a.item, a.attempt) for a in delegate.calls)
    # The interrupted attempt runs again under its own number (its idempotency key is kept).
    assert ran == [("instance-02", 1), ("instance-03", 1), ("instance-04", 1)]


@pytest.mark.slow
async def test_shutdown_records_interrupted_items(tmp_path: Path) -> None:
    """Cancelling a run records running items as interrupted; they run again on resume."""
    delegate = FakeDelegate()
    delegate.gate = asyncio.Event()
    mgr, _, _, _ = _manager(tmp_path, delegate)
    run_id = mgr.start(workflow="w", form="for_each", spec={}, spec_hash=None, items=ITEMS[:5])
    assert await async_wait_until(lambda: len(delegate.calls) == 3, 5)
    await mgr.shutdown(grace=1)
    state = fold(read_jsonl(BrainPaths(tmp_path).run_journal(run_id)).records)
    assert not state.finished and sum(1 for i in state.items if i.result == "interrupted") == 3
    delegate2 = FakeDelegate()
    mgr2, _, _, _ = _manager(tmp_path, delegate2)
    mgr2.resume_all()
    state2 = await asyncio.wait_for(mgr2.tasks[run_id], 5)
    assert state2.outcome == "success" and len(delegate2.calls) == 5


async def test_a_stop_while_the_end_of_a_run_is_committed_still_writes_its_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM between a run's ``finished_run`` record and its fsync: runs.jsonl gets the summary at once."""
    mgr, _, claims, _ = _manager(tmp_path, FakeDelegate())
    reached, never = asyncio.Event(), asyncio.Event()
    commit = Journal.commit

    async def held_at_the_end(self: Journal) -> None:
        if any(ex.state.finished for ex in mgr.executors.values()):
            reached.set()
            await never.wait()  # the stop comes here
        await commit(self)

    monkeypatch.setattr(Journal, "commit", held_at_the_end)
    run_id = mgr.start(workflow="w", form="for_each", spec={}, spec_hash=None, items=ITEMS[:3])
    await asyncio.wait_for(reached.wait(), 5)
    assert not BrainPaths(tmp_path).runs_log.exists()
    await mgr.shutdown(grace=1)
    (rec,) = read_jsonl(BrainPaths(tmp_path).runs_log).records
    assert rec["run_id"] == run_id and rec["outcome"] == "success"
    assert claims.runs[run_id] is True  # the run's claim is closed too
    state = fold(read_jsonl(BrainPaths(tmp_path).run_journal(run_id)).records)
    assert state.finished  # and the journal that the summary follows was synced first


@pytest.mark.parametrize("concurrency", [1, 4])
async def test_concurrency_is_respected(tmp_path: Path, concurrency: int) -> None:
    """Never more agents at once than the concurrency, and the concurrency is used (10 items, all start at once)."""
    peak = 0
    live = 0

    class Counting(FakeDelegate):
        async def attempt(self, a: Attempt) -> AttemptResult:
            nonlocal peak, live
            live += 1
            peak = max(peak, live)
            await asyncio.sleep(0)
            live -= 1
            return await super().attempt(a)

    mgr, _, _, _ = _manager(tmp_path, Counting(), FanOut(concurrency=concurrency))
    run_id = mgr.start(workflow="w", form="for_each", spec={}, spec_hash=None, items=ITEMS)
    await asyncio.wait_for(mgr.tasks[run_id], 5)
    assert peak == concurrency


async def test_runs_share_the_daemon_wide_cap_and_a_later_run_is_not_starved(tmp_path: Path) -> None:
    """Two runs of concurrency 4 under a cap of 2: never more than 2 agents at once, and a short run started after a
    long one gets slots while the long one still has items to start."""
    peak = live = 0
    ended: list[str] = []

    class Counting(FakeDelegate):
        async def attempt(self, a: Attempt) -> AttemptResult:
            nonlocal peak, live
            live += 1
            peak = max(peak, live)
            await asyncio.sleep(0.005)
            live -= 1
            ended.append(a.workflow)
            return await super().attempt(a)

    mgr, _, _, _ = _manager(tmp_path, Counting(), FanOut(concurrency=4))
    mgr.slots.resize(2)
    long = mgr.start(workflow="long", form="for_each", spec={}, spec_hash=None, items=ITEMS)
    short = mgr.start(workflow="short", form="for_each", spec={}, spec_hash=None, items=ITEMS[:2])
    await asyncio.wait_for(asyncio.gather(mgr.tasks[long], mgr.tasks[short]), 10)
    assert peak == 2
    assert ended.index("short") < 4 and len(ended) == 12
    assert ended[-1] == "long"
    assert mgr.slots.running == 0 and mgr.slots.free == 2


async def test_an_item_retried_at_once_never_overlaps_its_previous_attempt(tmp_path: Path) -> None:
    """A slot frees when the agent is done, while its fsync may still be in flight; a zero-delay retry of that
    item starts only once its previous attempt's task has ended (recorded its claim), and the cap holds."""
    order: dict[str, list[str]] = {}
    live: set[str] = set()
    peak = 0

    class Tracking(FakeDelegate):
        async def attempt(self, a: Attempt) -> AttemptResult:
            nonlocal peak
            order.setdefault(a.item, []).append("start")
            live.add(a.item)
            peak = max(peak, len(live))
            await asyncio.sleep(0)
            live.discard(a.item)
            return await super().attempt(a)

    delegate = Tracking(errors={name: 2 for name in ITEMS})  # two errors each, then success
    plan = FanOut(concurrency=4, retry=RetryPolicy(attempts=3, base_s=0.0, cap_s=0.0, jitter=False))
    mgr, _, claims, _ = _manager(tmp_path, delegate, plan)
    seen = claims.item_changed

    def item_changed(state: RunState, item: ItemState) -> None:
        if item.status in ("retry_wait", "done"):  # the end of an attempt's task (after its commit)
            order.setdefault(item.name, []).append("end")
        seen(state, item)

    claims.item_changed = item_changed  # type: ignore[method-assign]
    run_id = mgr.start(workflow="w", form="for_each", spec={}, spec_hash=None, items=ITEMS)
    state = await asyncio.wait_for(mgr.tasks[run_id], 10)
    assert state.outcome == "success" and 1 <= peak <= 4
    assert all(seq == ["start", "end"] * 3 for seq in order.values()), order
    assert sorted(a.key for a in delegate.calls) == sorted(f"{run_id}/{n}/{k}" for n in ITEMS for k in (1, 2, 3))


_STATUSES = ["pending", "running", "retry_wait", "done", "failed", "escalated", "skipped", "aborted"]


@settings(max_examples=300, deadline=None)
@given(
    statuses=st.lists(st.sampled_from(_STATUSES), max_size=40),
    waits=st.lists(st.sampled_from([None, "2026-11-30T11:00:00+00:00", "2026-11-30T13:00:00+00:00"]), max_size=40),
    concurrency=st.integers(min_value=1, max_value=8),
    running=st.integers(min_value=0, max_value=8),
    cursor=st.integers(min_value=0, max_value=40),
)
def test_ready_items_from_a_cursor_is_the_full_scan(
    statuses: list[str], waits: list[str | None], concurrency: int, running: int, cursor: int
) -> None:
    """The executor's shortcut (cursor from first_open, aborted from its counts) picks what a full scan picks."""
    from ambient.engine.planner import first_open, ready_items

    items = [
        ItemState(
            name=f"i{k}",
            index=k,
            status=s,  # type: ignore[arg-type]
            not_before=waits[k] if k < len(waits) else None,
        )
        for k, s in enumerate(statuses)
    ]
    state = RunState(run_id="r", workflow="w", form="for_each", spec_hash=None, spec={}, items=items)
    plan = FanOut(concurrency=concurrency)
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    full = ready_items(state, plan, now, running)
    # A cursor is only valid when nothing before it is open: first_open never skips an open item.
    start = first_open(state, 0)
    assert all(it.status not in ("pending", "retry_wait") for it in items[:start])
    assert first_open(state, min(cursor, start)) == start
    fast = ready_items(state, plan, now, running, start=start, aborted="aborted" in statuses)
    assert [it.name for it in fast] == [it.name for it in full]


@pytest.mark.parametrize(
    ("offset_s", "status", "current"),
    [
        (5.0, "closed", True),  # written after the end and says so
        (5.0, "open", False),  # written after the end by a claims writer behind its queue: still the open claim
        (-5.0, "closed", False),  # well before: behind, whatever it says
        (0.0, "closed", True),  # within a clock tick: the claim says closed, so it was written after the end
        (-0.004, "closed", True),
        (-0.004, "open", False),  # within a tick and still open: written before the end
        (0.004, "open", False),
    ],
)
def test_a_finished_runs_views_are_current_by_time_or_within_a_tick_by_content(
    tmp_path: Path, offset_s: float, status: str, current: bool
) -> None:
    """A run claim stamped before ``finished_at`` (beyond a kernel tick: file times come from a coarse clock) is
    behind; any other is judged by what it says: a fresh CI clone found a current run taken as behind and caught
    up, and a claims writer that a stop left behind wrote a run's open claim after the run had ended."""
    manager, *_ = _manager(tmp_path, FakeDelegate())
    (tmp_path / "claims").mkdir()
    state = RunState(
        run_id="sess-20261201-0140-other-312c",
        workflow="other",
        form="for_each",
        spec_hash=None,
        spec={},
        items=[],
        finished_at="2026-12-01T01:40:03.527+00:00",
        outcome="success",
    )
    claim = tmp_path / "claims" / f"{state.run_id}.yml"
    claim.write_text(f"sess_id: {state.run_id}\nstatus: {status}\n")
    at = datetime.fromisoformat(state.finished_at or "").timestamp() + offset_s
    os.utime(claim, (at, at))
    assert manager._views_current(state) is current


async def test_start_up_glances_at_finished_runs_instead_of_folding_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """resume_all walks every run journal ever written: a finished run whose views are written is known from its
    first and last lines (workflow, finished_at) and not read whole; a run whose views are behind, or whose last
    line is torn, is still read, folded and caught up."""
    import ambient.engine.journals as journals_mod
    import ambient.engine.manager as manager_mod

    mgr, *_ = _manager(tmp_path, FakeDelegate())
    ids = {}
    for wf in ("deploy-batch", "docs-refresh", "w"):
        ids[wf] = mgr.start(
            workflow=wf, form="for_each", spec={"note": 'a "quoted" \\ value'}, spec_hash=None, items=ITEMS[:2]
        )
        await asyncio.wait_for(mgr.tasks[ids[wf]], 5)
    paths = BrainPaths(tmp_path)
    paths.claims.mkdir(exist_ok=True)
    for wf, run_id in ids.items():
        state = fold(read_jsonl(paths.run_journal(run_id)).records)
        claim = paths.claims / f"{run_id}.yml"
        claim.write_text(f"sess_id: {run_id}\nstatus: closed\n")
        at = datetime.fromisoformat(state.finished_at or "").timestamp() + (-5 if wf == "w" else 5)  # w: behind
        os.utime(claim, (at, at))
    with paths.run_journal(ids["docs-refresh"]).open("a") as fh:
        fh.write('{"ev": "note", "te')  # a torn last line: the glance cannot tell, the journal is read
    folded: list[str] = []
    real = manager_mod.read_jsonl
    monkeypatch.setattr(manager_mod, "read_jsonl", lambda p: (folded.append(p.stem), real(p))[1])
    mgr2, *_ = _manager(tmp_path, FakeDelegate())
    assert mgr2.resume_all() == []
    journals = [name for name in folded if name.startswith("sess-")]  # runs.jsonl is read too, by the catch-up
    assert sorted(journals) == sorted([ids["w"], ids["docs-refresh"]])
    assert mgr2.journaled == {"deploy-batch", "docs-refresh", "w"}
    assert paths.run_journal(ids["docs-refresh"]).read_bytes().endswith(b"\n")  # the torn line was cut
    assert journals_mod.finished_glance(paths.run_journal(ids["deploy-batch"])) is not None
    assert journals_mod.finished_glance(paths.run_journal(ids["deploy-batch"]))[0] == "deploy-batch"  # type: ignore[index]


async def test_status_folds_only_the_runs_in_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ambient status`` folded every run journal ever written to find the runs in progress: the query store folds
    each journal once, then a finished run's never again (a torn last line does not change that)."""
    import ambient.query.rows as rows_mod
    from ambient.cli.status import collect

    mgr, *_ = _manager(tmp_path, FakeDelegate())
    ids = []
    for wf in ("deploy-batch", "docs-refresh", "w"):
        ids.append(mgr.start(workflow=wf, form="for_each", spec={}, spec_hash=None, items=ITEMS[:2]))
        await asyncio.wait_for(mgr.tasks[ids[-1]], 5)
    paths = BrainPaths(tmp_path)
    with paths.run_journal(ids[1]).open("a") as fh:
        fh.write('{"ev": "note", "te')  # torn: the run is still finished
    read: list[str] = []
    real = rows_mod.iter_jsonl
    monkeypatch.setattr(rows_mod, "iter_jsonl", lambda p: (read.append(p.name), real(p))[1])
    data = collect(tmp_path)
    assert data["runs"] == []  # nothing in progress
    assert sorted(read) == sorted(f"{i}.jsonl" for i in ids)  # each folded once, into the store
    read.clear()
    assert collect(tmp_path)["runs"] == []
    assert read == []  # finished runs are never folded again
    assert {r["run_id"] for r in data["recent"]} == set(ids)  # from runs.jsonl's end


def test_a_closed_run_claim_too_big_to_parse_is_current(tmp_path: Path) -> None:
    """The run claim of a 10,000-item fan-out lists every child (~430 KB, over the size a claim is parsed at): its
    status line says it ended, so no start catches the run up again (each did, rewriting every item claim)."""
    from ambient.storage.yamlfile import MAX_CLAIM_BYTES

    manager, *_ = _manager(tmp_path, FakeDelegate())
    (tmp_path / "claims").mkdir()
    state = RunState(
        run_id="sess-20261201-0140-big-312c",
        workflow="big",
        form="for_each",
        spec_hash=None,
        spec={},
        items=[],
        finished_at="2026-12-01T01:40:03.527+00:00",
        outcome="success",
    )
    claim = tmp_path / "claims" / f"{state.run_id}.yml"
    children = "".join(f"  - {state.run_id}-item-{n:05d}\n" for n in range(MAX_CLAIM_BYTES // 20))
    claim.write_text(f"sess_id: {state.run_id}\nstatus: closed\nresult:\n children:\n{children}")
    assert claim.stat().st_size > MAX_CLAIM_BYTES
    at = datetime.fromisoformat(state.finished_at or "").timestamp() + 5
    os.utime(claim, (at, at))
    assert manager._views_current(state) is True
