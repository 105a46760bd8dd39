"""An answer is never dropped: a question asked again after a crash keeps the escalation a file already holds
(answered or not), and an answer whose run ended before it was applied is said to the person, logged and marked,
once; one the run applied stays silent."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from ambient.core.clock import SystemClock
from ambient.engine.manager import RunManager
from ambient.engine.ports import EscalationRequest
from ambient.engine.runs import RunExecutor
from ambient.engine.tick import Tick
from ambient.human.escalation_store import EscalationStore
from ambient.human.escalations import find_asked
from ambient.human.telegram import TelegramUser
from ambient.service.escalator import StoreEscalator
from ambient.service.evaluators import EscalationEvaluator
from ambient.storage.paths import BrainPaths
from tests.unit.human.test_escalations import T0, _fail


def _request(**kw: Any) -> EscalationRequest:
    return EscalationRequest(
        run_id="run-1",
        workflow="deploy-batch",
        item="instance-03",
        agent="deploy",
        kind="fail",
        question="instance-03 failed",
        options=[("retry", "Run it again", "retry"), ("skip", "Skip it", "skip")],
        dedupe_key="run-1/instance-03/fail",
        **kw,
    )


@pytest.mark.parametrize(
    ("status", "age_s", "settled", "kept"),
    [
        ("answered", 1, (), True),  # answered while the daemon was down: this very question, kept
        ("pending", 1, (), True),
        ("expired", 1, (), True),
        ("cancelled", 1, (), False),  # withdrawn: a new question
        ("answered", -1, (), False),  # made before the question arose: an earlier question of the item
        ("answered", 1, ("ID",), False),  # one the run already decided
    ],
)
def test_find_asked_keeps_only_this_question(status: str, age_s: float, settled: tuple[str, ...], kept: bool) -> None:
    esc = _fail(now=T0 + timedelta(seconds=age_s), dedupe_key="k").model_copy(update={"status": status})
    found = find_asked([esc], "k", T0, [esc.id if s == "ID" else s for s in settled])
    assert (found is not None) == kept


async def test_a_question_asked_again_keeps_the_answered_file_and_wakes_the_engine(tmp_path: Path) -> None:
    paths = BrainPaths(tmp_path)
    store = EscalationStore(paths)
    escalator = StoreEscalator(store, None, SystemClock())
    woken: list[Path] = []
    escalator.on_answered = woken.append
    since = SystemClock().now().isoformat(timespec="milliseconds")
    first = await escalator.escalate(_request())
    store.answer(first, "skip", by="ana", channel="cli")
    again = await escalator.escalate(_request(since=since))
    assert again == first and len(store.list()) == 1  # the person is not asked twice
    assert woken == [store.path_for(first)]  # its answer is applied as soon as the run names it
    fresh = await escalator.escalate(_request())  # without ``since``: the usual dedupe, pending only
    assert fresh != first


class _Told(StoreEscalator):
    def __init__(self, store: EscalationStore) -> None:
        super().__init__(store, None, SystemClock())
        self.told: list[tuple[str, str]] = []

    async def inform(self, title: str, body: str, *, urgent: bool = False) -> None:
        self.told.append((title, body))


def _journal(paths: BrainPaths, run_id: str, *records: dict[str, Any]) -> None:
    paths.run_journals.mkdir(parents=True, exist_ok=True)
    started = {"ev": "started", "run_id": run_id, "workflow": "deploy-batch", "form": "for_each", "items": ["a"]}
    lines = [started, *records, {"ev": "finished_run", "outcome": "partial", "at": "2026-01-01T00:00:00+00:00"}]
    paths.run_journal(run_id).write_text("".join(json.dumps(r) + "\n" for r in lines))


def _no_executor(state: Any, journal: Any) -> RunExecutor:
    raise AssertionError("no run is started here")


async def test_an_answer_its_run_ended_before_applying_is_said_logged_and_marked_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = BrainPaths(tmp_path)
    store = EscalationStore(paths)
    lost = store.create(_fail())  # run-1 ended without it
    applied = store.create(_fail("instance-04").model_copy(update={"run_id": "run-2"}))
    for esc in (lost, applied):
        store.answer(esc.id, "retry", by="ana", channel="cli")
    _journal(paths, "run-1")
    _journal(paths, "run-2", {"ev": "decided", "item": "a", "escalation": applied.id, "option": "retry"})
    escalator = _Told(store)
    evaluator = EscalationEvaluator(store, RunManager(paths, _no_executor), escalator, SystemClock())
    await evaluator.evaluate(Tick(1, SystemClock().now()))
    assert len(escalator.told) == 1
    title, body = escalator.told[0]
    assert "not applied" in title and lost.id in body and "partial" in body
    assert store.get(lost.id).unapplied is not None and "partial" in str(store.get(lost.id).unapplied)
    assert store.get(applied.id).unapplied is None
    assert "answer_not_applied" in capsys.readouterr().out
    again = EscalationEvaluator(store, RunManager(paths, _no_executor), escalator, SystemClock())  # a restart
    await again.evaluate(Tick(1, SystemClock().now()))
    assert len(escalator.told) == 1  # said once


async def test_a_telegram_press_for_a_run_that_ended_is_told_it_was_not_applied(tmp_path: Path) -> None:
    paths = BrainPaths(tmp_path)
    store = EscalationStore(paths)
    esc = store.create(_fail())
    _journal(paths, "run-1")  # the run ended (partial) before the press
    escalator = StoreEscalator(store, None, SystemClock())
    pressed = await escalator.answer_press(esc.id, 0, esc.nonce, TelegramUser(1, "ana"))
    assert pressed.status == "already_decided" and "Not applied" in pressed.text and "partial" in pressed.text
    after = store.get(esc.id)
    assert after.status == "cancelled" and after.decision is None and "retry by ana via telegram" in str(after.note)


async def test_a_telegram_press_for_a_running_run_decides(tmp_path: Path) -> None:
    paths = BrainPaths(tmp_path)
    store = EscalationStore(paths)
    esc = store.create(_fail())
    paths.run_journals.mkdir(parents=True)
    started = {"ev": "started", "run_id": "run-1", "workflow": "deploy-batch", "form": "for_each", "items": ["a"]}
    paths.run_journal("run-1").write_text(json.dumps(started) + "\n")
    escalator = StoreEscalator(store, None, SystemClock())
    pressed = await escalator.answer_press(esc.id, 0, esc.nonce, TelegramUser(1, "ana"))
    assert pressed.status == "decided" and store.get(esc.id).decision == "retry"
