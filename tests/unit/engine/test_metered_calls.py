"""The model gateway's ``call`` events in the fold and in today's spend: a call counts once, when it is recorded,
whatever becomes of its attempt (a crash cut it short, a ``finished`` carries the attempt's metered total)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ambient.engine.runs import run_record
from ambient.engine.runstate import fold
from ambient.engine.spend import SpendMeter
from ambient.storage.journal import read_jsonl

JOURNAL = Path(__file__).parents[2] / "fixtures" / "run-journals" / "gateway-calls.jsonl"


def test_every_call_counts_once_for_its_item_its_run_and_its_day() -> None:
    state = fold(read_jsonl(JOURNAL).records)
    # msg_1 (its attempt cut by a crash), msg_2 and msg_3: the metered finished records add nothing again
    assert state.usage.cost_usd == pytest.approx(0.0015 + 0.0026 + 0.0015)
    assert state.usage.input_tokens == 4000 and state.usage.output_tokens == 300
    a, b = state.items
    assert a.usage is not None and a.usage.cost_usd == pytest.approx(0.0041)
    assert b.usage is not None and b.usage.cost_usd == pytest.approx(0.0015)
    assert state.spent_by_day == pytest.approx({"2026-12-07": 0.0015, "2026-12-08": 0.0041})
    # the step names its attempt's metered total; an attempt refused for the budget goes back to pending, no step
    [step] = state.steps
    assert step["usage"]["cost_usd"] == 0.0026 and step["usage"]["metered"] is True
    assert b.status == "pending" and b.result == "interrupted"


def test_a_resumed_run_and_a_finished_one_give_today_its_calls() -> None:
    state = fold(read_jsonl(JOURNAL).records)
    meter = SpendMeter()
    meter.seed_state(state, datetime(2026, 12, 8, 12, tzinfo=UTC))
    assert meter.spent("2026-12-08") == pytest.approx(0.0041)
    record = run_record(state).to_json_dict()
    assert record["spent_by_day"] == pytest.approx({"2026-12-07": 0.0015, "2026-12-08": 0.0041})
    assert record["cost_usd"] == pytest.approx(0.0056)


def test_records_seed_today_from_what_each_run_spent_that_day(tmp_path: Path) -> None:
    state = fold(read_jsonl(JOURNAL).records)
    state.outcome, state.finished_at = "success", "2026-12-08T00:00:04.000+00:00"
    log = tmp_path / "runs.jsonl"
    log.write_text(json.dumps(run_record(state).to_json_dict()) + "\n")
    meter = SpendMeter()
    meter.seed_records(log, datetime(2026, 12, 8, 12, tzinfo=UTC))
    assert meter.spent("2026-12-08") == pytest.approx(0.0041)  # msg_1 was spent the day before


def test_the_record_says_each_agents_calls_by_model_and_the_calls_refused() -> None:
    state = fold(read_jsonl(JOURNAL).records)
    [row] = run_record(state).to_json_dict()["calls_by"]
    assert row["agent"] == "worker" and row["model"] == "claude-haiku-4-5"
    assert (row["calls"], row["input_tokens"], row["output_tokens"], row["refused"]) == (3, 4000, 300, 2)
    assert row["cost_usd"] == pytest.approx(0.0056) and row["cost_unknown"] == 0
