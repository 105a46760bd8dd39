"""The person's questions in the run journal: a result that asks is never read as a failure, and a question the
journal asked but never named is asked again at the start, idempotently.

The fold is pure: tables of event histories and what they fold to. Then the executor around it: a journal cut where a
kill leaves it (the result and its ``asking`` on disk, no escalation named) resumes with the question asked again,
the agent not run again.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from ambient.core.errors import HistoryError
from ambient.engine.events import Ruling
from ambient.engine.planner import ChainAction, ChainStep, FanOut
from ambient.engine.runstate import StoredQuestion, fold, reconcile_questions
from ambient.storage.journal import read_jsonl
from ambient.storage.paths import BrainPaths
from tests.conftest import async_wait_until
from tests.unit.engine.test_chain import StepDelegate, _chain, _start
from tests.unit.engine.test_runs import FakeDelegate, _manager

AT = "2026-01-02T03:04:05.678+00:00"
REQUEST = {"kind": "question", "question": "left or right?", "options": [["left", "left", "answer"]], "item": "a"}


def _started(*items: str) -> dict[str, Any]:
    return {"ev": "started", "run_id": "r", "workflow": "w", "form": "for_each", "items": list(items), "at": AT}


def _finished(item: str, result: str = "fail", reply: str = "escalate") -> dict[str, Any]:
    return {"ev": "finished", "item": item, "attempt": 1, "agent": "x", "result": result, "reply": reply, "at": AT}


def _asking(item: str, **extra: Any) -> dict[str, Any]:
    return {"ev": "asking", "item": item, "kind": "question", "request": {**REQUEST, "item": item}, **extra, "at": AT}


ACCEPTED = {"ev": "accepted", "item": "a", "attempt": 1, "key": "r/a/1", "at": AT}
ESCALATED = {"ev": "escalated", "item": "a", "escalation": "esc-1", "kind": "question", "agent": "x", "at": AT}
ASKED = {"ev": "asked", "escalation": "esc-1", "request": REQUEST, "at": AT}
ANSWERED = {"ev": "decided", "item": "a", "escalation": "esc-1", "option": "left", "action": "answer", "at": AT}
ABORT = {"ev": "abort", "by": "human", "reason": "stop", "at": AT}
GATE = {"ev": "gate", "item": "a", "state": "pending", "escalation": "esc-1", "agent": "x", "at": AT}


@pytest.mark.parametrize(
    ("history", "status", "escalation", "asking"),
    [
        # What a kill left with the code before: a result alone reads as a failure (the journals of that code).
        ([ACCEPTED, _finished("a")], "failed", None, False),
        # The result and its question in one write: the item waits on the person, whatever the result said.
        ([ACCEPTED, _finished("a"), _asking("a")], "escalated", None, True),
        ([ACCEPTED, _finished("a", "error", "error"), _asking("a")], "escalated", None, True),
        # Its escalation named: the usual waiting item, nothing left to ask again.
        ([ACCEPTED, _finished("a"), _asking("a"), ASKED, ESCALATED], "escalated", "esc-1", False),
        ([ACCEPTED, _finished("a"), _asking("a", gate=True), ASKED, GATE], "escalated", "esc-1", False),
        # Answered: run again with the answer.
        ([ACCEPTED, _finished("a"), _asking("a"), ASKED, ESCALATED, ANSWERED], "pending", None, False),
        # An abort ends every question, named or not; a new attempt is no longer asking.
        ([ACCEPTED, _finished("a"), _asking("a"), ABORT], "aborted", None, False),
        ([ACCEPTED, _finished("a"), _asking("a"), ACCEPTED], "running", None, False),
    ],
)
def test_a_result_that_asks_folds_to_an_item_waiting_on_the_person(
    history: list[dict[str, Any]], status: str, escalation: str | None, asking: bool
) -> None:
    state = fold([_started("a", "b"), *history])
    item = state.item("a")
    assert (item.status, item.escalation, "a" in state.asking) == (status, escalation, asking)
    assert state.item("b").status == ("aborted" if status == "aborted" else "pending")  # an abort ends them all
    assert not state.finished


def test_an_asking_record_without_a_request_is_a_problem_of_its_line() -> None:
    bad = {"ev": "asking", "item": "a", "kind": "question", "request": "nope", "at": AT}
    with pytest.raises(HistoryError) as err:
        fold([_started("a"), ACCEPTED, _finished("a"), bad])
    assert err.value.index == 3


async def test_a_start_asks_again_the_question_a_kill_left_unnamed_without_running_the_agent(tmp_path: Path) -> None:
    """The journal as a kill leaves it between the result (with its question) and the escalation's file: the start
    asks again (with when the question arose, so the store keeps a file written before the kill), names the
    escalation in the journal, and runs no agent again."""
    paths = BrainPaths(tmp_path)
    paths.run_journals.mkdir(parents=True)
    history = [
        {**_started("a"), "spec": {}, "context": {}},
        ACCEPTED,
        {**_finished("a"), "key": "r/a/1"},
        _asking("a"),
    ]
    paths.run_journal("r").write_text("".join(json.dumps(r) + "\n" for r in history))
    delegate = FakeDelegate()
    mgr, esc, claims, _ = _manager(tmp_path, delegate, plan=FanOut(concurrency=2))
    assert mgr.resume_all() == ["r"]
    await async_wait_until(lambda: mgr.executors["r"].waiting, timeout=5)
    assert delegate.calls == []  # the agent answered already: it is not run again
    assert len(esc.requests) == 1
    req = esc.requests[0]
    assert (req.item, req.kind, req.question, req.since) == ("a", "question", "left or right?", AT)
    state = fold(read_jsonl(paths.run_journal("r")).records)
    assert state.item("a").escalation == "esc-1" and state.asking == {}
    assert claims.items["a"] == "escalated"
    mgr.executors["r"].decide(Ruling("esc-1", "left", "answer", by="human", channel="cli", answer="left"))
    await asyncio.wait_for(mgr.tasks["r"], 5)
    assert [c.context.get("decision") for c in delegate.calls] == ["left"]  # the answer reached the agent, once


def _stored(esc_id: str = "esc-9", item: str | None = "a", status: str = "pending") -> StoredQuestion:
    return StoredQuestion(esc_id, item, "question", status, {**REQUEST, "item": item or ""}, "x")


LEGACY = [ACCEPTED, _finished("a")]  # what a kill left with the code before: the result without its question


@pytest.mark.parametrize(
    ("history", "stored", "verdict"),
    [
        (LEGACY, _stored(), "attach"),  # the question's file is there: the item waits on it again
        (LEGACY, _stored(status="answered"), "attach"),  # answered meanwhile: attached, then applied
        ([ACCEPTED], _stored(), "attach"),  # running at the kill (run again otherwise): it had asked
        (LEGACY, _stored(status="cancelled"), None),
        (LEGACY, _stored(item=None), None),  # a question of the run: asked again by the run itself
        ([ACCEPTED, _finished("a"), _asking("a")], _stored(), None),  # asked again by the run, found by its key
        ([*LEGACY, ASKED, ESCALATED], _stored("esc-1"), None),  # known to the journal
        ([*LEGACY, ASKED, ESCALATED], _stored("esc-9"), "cancel"),  # the item waits on another question
        ([ACCEPTED, _finished("a", "success", "success")], _stored(), "cancel"),  # the item is done
        (LEGACY, _stored(item="zz"), "cancel"),  # no such item
        ([], _stored(), "cancel"),  # the item never ran: not its question
    ],
)
def test_a_question_only_the_store_knows_is_attached_or_cancelled_with_a_reason(
    history: list[dict[str, Any]], stored: StoredQuestion, verdict: str | None
) -> None:
    state = fold([_started("a", "b"), *history])
    for it in state.in_flight():  # as the start leaves an attempt a kill cut short
        it.status, it.result = "pending", "interrupted"
    got = reconcile_questions(state, [stored])
    assert [r.verdict for r in got] == ([verdict] if verdict else [])
    assert all(r.reason for r in got if r.verdict == "cancel")


async def test_a_start_attaches_a_question_the_journal_lost_instead_of_closing_the_run_partial(tmp_path: Path) -> None:
    """A journal an older ambient left after a kill (the agent's result, not its question) and the question's file,
    answered while the daemon was down: the item waits on it again, and the answer reaches the agent."""
    paths = BrainPaths(tmp_path)
    paths.run_journals.mkdir(parents=True)
    history = [{**_started("a", "b"), "spec": {}, "context": {}}, *LEGACY]
    paths.run_journal("r").write_text("".join(json.dumps(r) + "\n" for r in history))
    delegate = FakeDelegate()
    mgr, _, _, _ = _manager(tmp_path, delegate, plan=FanOut(concurrency=2))
    assert mgr.resume_all({"r": [_stored(status="answered"), _stored("esc-8", item="zz")]}) == ["r"]
    assert mgr.leftovers == [("esc-8", "its run has no item zz")]
    await async_wait_until(lambda: mgr.executors["r"].waiting, timeout=5)
    assert mgr.executors["r"].state.item("a").escalation == "esc-9"
    assert mgr.decide(Ruling("esc-9", "left", "answer", by="human", channel="cli", answer="left"))
    await asyncio.wait_for(mgr.tasks["r"], 5)
    assert sorted((c.item, c.context.get("decision")) for c in delegate.calls) == [("a", "left"), ("b", None)]
    assert fold(read_jsonl(paths.run_journal("r")).records).outcome == "success"


async def test_every_cut_of_a_chain_whose_step_asks_resumes_waiting_on_the_person(tmp_path: Path) -> None:
    """A chain step whose exit trigger is ``gate:human``: its result and its question are journaled in one write,
    so a journal cut anywhere after the step's result resumes with the step waiting on the person (asked again if
    its escalation was never named), never past the gate."""
    steps = [
        ChainStep(name="1", type="code", agent="coder", on_done=(ChainAction("gate", message="look first"),)),
        ChainStep(name="2", type="code", agent="coder"),
    ]
    full = tmp_path / "full"
    tested = {"1": [{"status": "ok", "tests": {"failed": 0}}], "2": [{"status": "ok", "tests": {"failed": 0}}]}
    mgr, esc, _ = _chain(full, StepDelegate(tested), steps=steps)
    run_id = _start(mgr, steps)
    assert await async_wait_until(lambda: len(esc.requests) == 1 and mgr.idle, 5)
    records = read_jsonl(BrainPaths(full).run_journal(run_id)).records
    done = next(n for n, r in enumerate(records) if r["ev"] == "finished")
    assert records[done + 1]["ev"] == "asking"  # the same write as the result
    for cut in range(done + 2, len(records) + 1):
        root = tmp_path / f"cut{cut}"
        paths = BrainPaths(root)
        paths.run_journals.mkdir(parents=True)
        paths.run_journal(run_id).write_text("".join(json.dumps(r) + "\n" for r in records[:cut]))
        delegate = StepDelegate()
        mgr2, esc2, _ = _chain(root, delegate, steps=steps)
        mgr2.resume_all()
        assert await async_wait_until(lambda m=mgr2: m.idle, 5)
        state = mgr2.executors[run_id].state
        assert state.items[0].status == "escalated" and state.items[0].escalation, cut
        assert [r.question for r in esc2.requests] in ([], ["look first"]), cut  # asked again only if unnamed
        assert delegate.calls == [], cut  # neither the step run again nor the next one started
        mgr2.tasks[run_id].cancel()


def test_a_permissions_pattern_option_gets_its_own_short_key() -> None:
    """The runner offers "allow `pytest -q tests/*` for coder from now on": the escalation keys it ``allow-pattern``
    and keeps the label whole; the other answers are keyed as any agent's, then skip and abort."""
    from ambient.engine.planner import permission_options
    from ambient.human.escalations import offered_options

    label = "allow `pytest -q tests/*` for coder from now on"
    proposed = ["allow", "allow always", "deny", label]
    offered = offered_options(
        permission_options(proposed, {"signature": "Bash: pytest -q tests/d", "pattern_option": label})
    )
    assert [(k, text) for k, text, _ in offered] == [
        ("allow", "allow"),
        ("allow-always", "allow always"),
        ("deny", "deny"),
        ("allow-pattern", label),
        ("skip", "Skip it and go on"),
        ("abort", "Abort the whole run"),
    ]
    plain = offered_options(permission_options(proposed[:3], {"signature": "Bash: make"}))
    assert [k for k, _, _ in plain] == ["allow", "allow-always", "deny", "skip", "abort"]
    assert [k for k, _, _ in permission_options([], None)] == ["allow", "deny", "skip", "abort"]
