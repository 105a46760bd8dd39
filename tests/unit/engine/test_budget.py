"""Cost, budgets, holds and permission signatures: the pure rules (ambient.engine.budget), their fold, records, stats,
settings and replay; the daily meter (ambient.engine.spend)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambient.config.settings import Settings, settings_from
from ambient.engine.budget import (
    PERMISSION_SIGNATURE_MAX,
    Limits,
    UsageTotals,
    amount_in,
    answer_hold,
    breach,
    budget_question,
    day_of,
    hold_options,
    hold_step,
    next_day,
    permission_signature,
    provider_question,
    raised_cap,
    spend_by_agent,
)
from ambient.engine.records import RunRecord
from ambient.engine.runs import run_record
from ambient.engine.runstate import fold
from ambient.engine.spend import SpendMeter
from ambient.learning.replay import fates, replay
from ambient.learning.rules import kind_of_step, situation_from_step, situation_of
from ambient.learning.stats import StatsBuilder

U1 = {"model": "claude-sonnet-4-5", "input_tokens": 100, "output_tokens": 20, "cost_usd": 0.5, "turns": 3}
U_UNKNOWN = {"model": "local-llama", "input_tokens": 1000, "output_tokens": 200, "turns": 1}


# ---------------------------------------------------------------- usage


def total_of(usages: list[dict[str, Any] | None]) -> UsageTotals:
    out = UsageTotals()
    for u in usages:
        out.add(u)
    return out


def test_totals_count_unknown_costs_apart_never_as_zero() -> None:
    t = total_of([U1, U_UNKNOWN, None, {}])
    assert (t.attempts, t.unknown_cost, t.cost_usd, t.input_tokens, t.output_tokens, t.turns) == (
        2,
        1,
        0.5,
        1100,
        220,
        4,
    )
    assert t.models == ["claude-sonnet-4-5", "local-llama"]
    rec = t.to_record()
    assert rec["cost_usd"] == 0.5 and rec["cost_unknown"] == 1 and rec["input_tokens"] == 1100
    assert UsageTotals().to_record() == {}


def test_totals_ignore_what_is_not_a_figure() -> None:
    """A journal is a file anyone can edit: a negative, boolean or text figure counts as absent."""
    t = total_of([{"cost_usd": -3, "input_tokens": True, "output_tokens": "12", "turns": float("nan")}])
    assert (t.attempts, t.unknown_cost, t.cost_usd, t.input_tokens, t.output_tokens, t.turns) == (1, 1, 0, 0, 0, 0)


# ---------------------------------------------------------------- budgets


def test_breach_per_run_first_then_daily_and_raises_move_the_limits() -> None:
    both = Limits(per_run_usd=2.0, daily_usd=10.0)
    assert breach(both, run_spent=1.99, day_spent=9.99, day="2026-03-18") is None
    b = breach(both, run_spent=2.0, day_spent=10.0, day="2026-03-18")  # reached at exactly the budget
    assert b is not None and (b.which, b.limit, b.budget) == ("per_run", 2.0, 2.0)
    assert breach(both, run_spent=2.1, run_raised=2.0, day_spent=1.0, day="d") is None
    d = breach(both, run_spent=2.1, run_raised=2.0, day_spent=10.5, day="2026-03-18")
    assert d is not None and (d.which, d.day, d.limit) == ("daily", "2026-03-18", 10.0)
    assert breach(both, run_spent=0, day_spent=10.5, day_raised=10.0, day="d") is None
    assert breach(Limits(), run_spent=1e9, day_spent=1e9, day="d") is None


def test_questions_say_what_was_spent_against_what() -> None:
    per_run = {"hold": "per_run", "spent": 2.1, "limit": 2.0, "budget": 2.0, "agents": {"writer": 2.0, "rev": 0.1}}
    assert budget_question("deploy-batch", per_run) == (
        "deploy-batch reached its budget: $2.10 spent against per_run_usd $2.00; spent by writer $2.00, rev $0.10; "
        "no new agent of this run starts until you answer"
    )
    raised = {**per_run, "limit": 4.0, "agents": {}}
    assert "against per_run_usd $2.00, $4.00 with what you allowed more; spent by no step with a known cost;" in (
        budget_question("w", raised)
    )
    before = {k: v for k, v in per_run.items() if k != "agents"}  # a hold of a journal written before: no agents
    assert budget_question("w", before) == (
        "w reached its budget: $2.10 spent against per_run_usd $2.00; no new agent of this run starts until you answer"
    )
    daily = {"hold": "daily", "spent": 50.2, "limit": 50.0, "budget": 50.0, "day": "2026-03-18", "agents": {"a": 1}}
    assert (
        "reached the daily budget: $50.20 spent today by all runs (UTC day 2026-03-18) against daily_usd $50.00; "
        "this run's agents spent a $1.00;" in budget_question("w", daily)
    )
    many = {**per_run, "agents": {f"a{i}": 7.0 - i for i in range(7)}}
    assert "a0 $7.00, a1 $6.00, a2 $5.00, a3 $4.00, a4 $3.00 and 2 more;" in budget_question("w", many)
    assert (
        provider_question({"error": "401 invalid x-api-key"})
        == "the model provider cannot be used, so this run waits: 401 invalid x-api-key"
    )


def test_hold_options_and_answers() -> None:
    per_run = {"hold": "per_run", "spent": 2.0, "limit": 2.0, "budget": 2.0, "day": None}
    assert [o[0] for o in hold_options(per_run)] == ["raise", "wait", "abort"]
    assert [o[0] for o in hold_options({**per_run, "waited": True})] == ["raise", "abort"]  # asked again: no wait
    assert [o[0] for o in hold_options({"hold": "provider"})] == ["retry", "abort"]
    assert answer_hold(per_run, "raise").raise_run_usd == 2.0
    daily = {"hold": "daily", "spent": 5.0, "limit": 5.0, "budget": 5.0, "day": "2026-03-18"}
    assert answer_hold(daily, "raise").raise_day == ("2026-03-18", 5.0)
    assert answer_hold(daily, "wait").waited and not answer_hold(daily, "wait").release
    assert answer_hold({"hold": "provider"}, "retry").release
    assert not answer_hold({"hold": "provider"}, "nonsense").release


def test_hold_steps() -> None:
    assert hold_step({"hold": "per_run", "escalation": "esc-1"}, "2026-03-18") == "held"
    assert hold_step({"hold": "per_run", "escalation": None}, "2026-03-18") == "ask"  # a crash before the question
    assert hold_step({"hold": "per_run", "waited": True}, "2026-03-18") == "ask"  # wait: asked again, raise | abort
    daily = {"hold": "daily", "waited": True, "day": "2026-03-18"}
    assert hold_step(daily, "2026-03-18") == "held"
    assert hold_step(daily, "2026-03-19") == "lift"


def test_the_day_is_utc() -> None:
    from datetime import timedelta, timezone

    paris = timezone(timedelta(hours=1))
    assert day_of(datetime(2026, 3, 19, 0, 30, tzinfo=paris)) == "2026-03-18"
    assert next_day(datetime(2026, 3, 18, 23, 59, tzinfo=UTC)) == datetime(2026, 3, 19, tzinfo=UTC)


# ---------------------------------------------------------------- permission signatures


def test_permission_signatures_are_exact_and_bounded() -> None:
    assert permission_signature({"tool": "Bash", "signature": "Bash: pytest -q"}) == "Bash: pytest -q"
    assert permission_signature({"tool": "WebFetch"}) == "WebFetch"
    assert permission_signature(None) is None and permission_signature({}) is None
    head = "Bash: rm -rf " + "x" * 600
    a, b = permission_signature({"signature": head + "a"}), permission_signature({"signature": head + "b"})
    assert a is not None and b is not None and a != b and len(a) <= PERMISSION_SIGNATURE_MAX


@given(st.text(min_size=1, max_size=30), st.text(min_size=1, max_size=30))
def test_two_commands_never_share_a_permission_situation(x: str, y: str) -> None:
    sx = situation_of("w", "coder", "permission", detail=f"Bash: {x}", step="i")
    sy = situation_of("w", "coder", "permission", detail=f"Bash: {y}", step="i")
    assert (sx.key == sy.key) == (x == y)
    assert sx.signal == "PERMISSION"


def test_permission_situation_is_verbatim_where_a_question_is_normalised() -> None:
    safe = situation_of("w", "coder", "permission", detail="Bash: pytest -q", step="i")
    risky = situation_of("w", "coder", "permission", detail="Bash: rm -rf /", step="i")
    assert safe.signature == "Bash: pytest -q" and risky.signature == "Bash: rm -rf /"
    q1 = situation_of("w", "coder", "question", detail="rm -rf /tmp/a", step="i")
    q2 = situation_of("w", "coder", "question", detail="rm -rf /tmp/b", step="i")
    assert q1 == q2  # a question is normalised (paths): what a permission must never be
    p1 = situation_of("w", "coder", "permission", detail="Bash: rm -rf /tmp/a", step="i")
    p2 = situation_of("w", "coder", "permission", detail="Bash: rm -rf /tmp/b", step="i")
    assert p1 != p2


# ---------------------------------------------------------------- the fold and the records

T0 = "2026-03-18T10:00:00.000+00:00"


def _journal(*events: dict[str, Any]) -> list[dict[str, Any]]:
    start = {"ev": "started", "run_id": "r1", "workflow": "w", "form": "for_each", "items": ["a", "b"], "at": T0}
    return [start, *events]


def test_fold_keeps_usage_per_item_and_per_run() -> None:
    state = fold(
        _journal(
            {"ev": "accepted", "item": "a", "attempt": 1},
            {"ev": "finished", "item": "a", "attempt": 1, "result": "error", "agent": "c", "usage": U1, "at": T0},
            {"ev": "accepted", "item": "a", "attempt": 2},
            {"ev": "finished", "item": "a", "attempt": 2, "result": "success", "agent": "c", "usage": U1, "at": T0},
            {"ev": "accepted", "item": "b", "attempt": 1},
            {"ev": "finished", "item": "b", "attempt": 1, "result": "success", "agent": "c", "usage": U_UNKNOWN},
        )
    )
    a = state.item("a")
    assert a.usage is not None and a.usage.cost_usd == 1.0 and a.usage.attempts == 2
    assert state.usage.cost_usd == 1.0 and state.usage.unknown_cost == 1 and state.usage.input_tokens == 1200
    assert [s.get("usage") for s in state.steps] == [U1, U1, U_UNKNOWN]
    state.outcome, state.finished_at = "success", T0
    rec = run_record(state).to_json_dict()
    assert (rec["cost_usd"], rec["cost_unknown"], rec["input_tokens"], rec["turns"]) == (1.0, 1, 1200, 7)
    assert rec["models"] == ["claude-sonnet-4-5", "local-llama"] and rec["steps"][0]["usage"] == U1


def test_old_records_without_cost_still_read() -> None:
    old = {
        "kind": "run",
        "run_id": "r0",
        "workflow": "w",
        "started_at": T0,
        "outcome": "success",
        "steps": [{"item": "a", "agent": "x", "result": "success"}],
    }
    rec = RunRecord.model_validate(old)
    assert rec.cost_usd is None and rec.steps[0].usage is None
    assert "cost_usd" not in rec.to_json_dict()  # a run of command agents gains no field


def test_fold_holds_raise_wait_and_abort() -> None:
    hold = {"ev": "hold", "hold": "per_run", "spent": 2.1, "limit": 2.0, "budget": 2.0, "at": T0}
    asked = {"ev": "escalated", "escalation": "esc-1", "kind": "budget", "hold": "per_run", "at": T0}
    state = fold(_journal(hold, asked))
    assert state.holds["per_run"]["escalation"] == "esc-1" and state.escalations == {"esc-1": ""}
    raised = fold(_journal(hold, asked, {"ev": "decided", "escalation": "esc-1", "option": "raise", "action": "raise"}))
    assert raised.holds == {} and raised.raised_run_usd == pytest.approx(2.1) and not raised.escalations
    waited = fold(_journal(hold, asked, {"ev": "decided", "escalation": "esc-1", "option": "wait", "action": "wait"}))
    assert waited.holds["per_run"]["waited"] and waited.holds["per_run"]["escalation"] is None
    aborted = fold(
        _journal(hold, asked, {"ev": "decided", "escalation": "esc-1", "option": "abort", "action": "abort"})
    )
    assert aborted.holds == {} and aborted.aborted
    daily = {"ev": "hold", "hold": "daily", "spent": 5, "limit": 5, "budget": 5, "day": "2026-03-18"}
    d_asked = {"ev": "escalated", "escalation": "esc-2", "kind": "budget", "hold": "daily"}
    d = fold(_journal(daily, d_asked, {"ev": "decided", "escalation": "esc-2", "option": "raise", "action": "raise"}))
    assert d.raised_day_usd == {"2026-03-18": 5}
    lifted = fold(
        _journal(
            daily,
            d_asked,
            {"ev": "decided", "escalation": "esc-2", "action": "wait"},
            {"ev": "unhold", "hold": "daily"},
        )
    )
    assert lifted.holds == {}


def test_a_held_attempt_is_not_spent() -> None:
    state = fold(
        _journal(
            {"ev": "accepted", "item": "a", "attempt": 1},
            {"ev": "finished", "item": "a", "attempt": 1, "result": "interrupted", "hold": "provider_refused"},
        )
    )
    from ambient.engine.runstate import next_attempt

    a = state.item("a")
    assert a.status == "pending" and a.fails == 0 and next_attempt(a) == 1 and state.steps == []


# ---------------------------------------------------------------- statistics


def _record(run_id: str, workflow: str, started: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "kind": "run",
        "run_id": run_id,
        "workflow": workflow,
        "started_at": started,
        "outcome": "success",
        "steps": steps,
    }


def test_stats_cost_per_workflow_agent_and_week() -> None:
    records = [
        _record(
            "r1",
            "review",
            "2026-03-16T10:00:00+00:00",
            [{"item": "a", "agent": "critic", "result": "success", "usage": U1}],
        ),
        _record(
            "r2",
            "review",
            "2026-03-24T10:00:00+00:00",
            [
                {"item": "a", "agent": "critic", "result": "success", "usage": U1},
                {"item": "b", "agent": "local", "result": "success", "usage": U_UNKNOWN},
            ],
        ),
        _record("r3", "deploy", "2026-03-24T10:00:00+00:00", [{"item": "a", "agent": "deploy", "result": "success"}]),
    ]
    stats = StatsBuilder().add_all(records).result()
    by_wf = {w.workflow: w for w in stats.workflows}
    assert by_wf["deploy"].cost is None  # command agents: no figure at all, not $0
    review = by_wf["review"].cost
    assert review is not None and (review.cost_usd, review.steps, review.unknown_cost) == (1.0, 3, 1)
    by_agent = {a.agent: a.cost for a in stats.agents}
    assert by_agent["critic"] is not None and by_agent["critic"].cost_usd == 1.0
    assert (
        by_agent["local"] is not None and by_agent["local"].unknown_cost == 1 and by_agent["local"].input_tokens == 1000
    )
    weeks = {w.week: w.cost for w in stats.weeks}
    assert weeks["2026-W12"] is not None and weeks["2026-W12"].cost_usd == 0.5
    assert weeks["2026-W13"] is not None and weeks["2026-W13"].unknown_cost == 1
    assert stats.cost is not None and stats.cost.cost_usd == 1.0
    assert stats.to_json()["workflows"][1]["cost"]["cost_usd"] == 1.0
    # chunks summarised apart and merged give the same figures
    left, right = StatsBuilder().add_all(records[:1]), StatsBuilder().add_all(records[1:])
    assert left.merge(right).result() == stats

    from ambient.cli.stats import render

    text = render(stats)
    assert "Cost of AI agents" in text and "$1.00+?" in text and "step(s) of unknown cost" in text


# ---------------------------------------------------------------- replay and learning


def test_replay_names_a_recorded_permission_step_as_the_daemon_did() -> None:
    step = {
        "item": "a",
        "agent": "coder",
        "result": "fail",
        "reply": "escalate",
        "signal_in": "ESCALATE",
        "question": "coder wants to run `rm -rf build/`",
        "permission_signature": "Bash: rm -rf build/",
    }
    assert kind_of_step(step) == "permission"
    sit = situation_from_step("w", step)
    assert (sit.signal, sit.signature) == ("PERMISSION", "Bash: rm -rf build/")
    assert sit == situation_of("w", "coder", "permission", detail="Bash: rm -rf build/", step="a")
    out, _ = fates(None, [step])
    assert out[0].kind == "permission"
    report = replay([_record("r1", "w", T0, [step])], None, [], workflow="w")
    assert report.items[0].kind == "permission" and report.items[0].signature == "Bash: rm -rf build/"


# ---------------------------------------------------------------- settings


def test_budget_settings_validate_and_take_the_environment() -> None:
    assert Settings().budget.per_run_usd is None and Settings().budget.daily_usd is None
    s = settings_from({"budget": {"per_run_usd": 2, "daily_usd": 50.5}}, {})
    assert (s.budget.per_run_usd, s.budget.daily_usd) == (2.0, 50.5)
    env = settings_from(
        {"budget": {"per_run_usd": 2}}, {"AMBIENT_BUDGET_PER_RUN_USD": "none", "AMBIENT_BUDGET_DAILY_USD": "7"}
    )
    assert (env.budget.per_run_usd, env.budget.daily_usd) == (None, 7.0)
    import pytest
    from pydantic import ValidationError

    for bad in ({"per_run_usd": -1}, {"per_run_usd": "lots"}, {"dayly_usd": 3}):
        with pytest.raises(ValidationError):
            settings_from({"budget": bad}, {})


def test_a_bad_budget_is_reported_at_its_line(tmp_path: Path) -> None:
    from ambient.config.brain import load_settings
    from ambient.storage.paths import BrainPaths

    paths = BrainPaths(tmp_path)
    paths.config.parent.mkdir(parents=True)
    paths.config.write_text("concurrency: 2\nbudget:\n  per_run_usd: 2\n  daily_usd: -5\n")
    settings, problems = load_settings(paths, {})
    assert settings is None
    assert [(p.line, "daily_usd" in p.message) for p in problems] == [(4, True)]


# ---------------------------------------------------------------- the daily meter


def test_meter_seeded_from_todays_records_and_rolling_over(tmp_path: Path) -> None:
    now = datetime(2026, 3, 18, 12, 0, tzinfo=UTC)
    log = tmp_path / "runs.jsonl"
    lines = []
    for i in range(100):  # yesterday's runs, far more than the scan looks at in a row
        lines.append(
            _record(
                f"old{i}",
                "w",
                "2026-03-17T09:00:00+00:00",
                [{"item": "a", "agent": "c", "result": "success", "usage": U1, "at": "2026-03-17T09:00:00+00:00"}],
            )
            | {"completed_at": "2026-03-17T09:01:00+00:00", "cost_usd": 0.5}
        )
    # a run started yesterday that finished today: only its steps of today count
    lines.append(
        _record(
            "late",
            "w",
            "2026-03-17T23:50:00+00:00",
            [
                {"item": "a", "agent": "c", "result": "success", "usage": U1, "at": "2026-03-17T23:55:00+00:00"},
                {"item": "b", "agent": "c", "result": "success", "usage": U1, "at": "2026-03-18T00:05:00+00:00"},
            ],
        )
        | {"completed_at": "2026-03-18T00:05:00+00:00", "cost_usd": 1.0}
    )
    lines.append(
        _record("cmd", "w", T0, [{"item": "a", "agent": "x", "result": "success", "at": T0}]) | {"completed_at": T0}
    )
    log.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"torn')
    meter = SpendMeter(lambda: Limits(daily_usd=1.0))
    meter.seed_records(log, now)
    assert meter.spent("2026-03-18") == 0.5
    meter.add(0.25, now)
    meter.add(None, now)
    assert meter.spent("2026-03-18") == 0.75 and meter.spent("2026-03-19") == 0.0
    meter.add(2.0, datetime(2026, 3, 19, 0, 1, tzinfo=UTC))  # a new UTC day starts from zero
    assert meter.spent("2026-03-19") == 2.0 and meter.spent("2026-03-18") == 0.0
    assert meter.limits().daily_usd == 1.0
    empty = SpendMeter()
    assert empty.seed_records(tmp_path / "none.jsonl", now) == 0 and empty.limits() == Limits()


def test_a_long_permission_keeps_the_whole_digest_of_its_call() -> None:
    """The learned rule's situation of a long call ends with the call's full sha256 (the runner's, when given): a
    digest cut to a few hex digits could be matched by a made-up call."""
    import hashlib

    call = "Bash: echo " + "a" * 700
    whole = hashlib.sha256(call.encode()).hexdigest()
    assert permission_signature({"signature": call}) == f"{call[: PERMISSION_SIGNATURE_MAX - 70]}… #{whole}"
    given = permission_signature({"signature": call, "sha256": "f" * 64})
    assert given is not None and given.endswith("#" + "f" * 64)
    assert permission_signature({"signature": call, "sha256": "short"}) == permission_signature({"signature": call})


# A step that overshot: per_run_usd $0.05, one step spent $3.00.
OVER = {"hold": "per_run", "spent": 3.0, "limit": 0.05, "budget": 0.05}


@pytest.mark.parametrize(
    ("hold", "option", "note", "spent_now", "cap"),
    [
        (OVER, "raise", None, None, 3.05),  # what was spent plus one budget, not "another budget" ($0.10)
        (OVER, "raise-x2", None, None, 6.0),  # twice what was spent
        (OVER, "raise", "10", None, 10.0),  # an amount given as the note
        (OVER, "raise", "$7.50", None, 7.5),
        (OVER, "raise", "raise to 12 USD", None, 12.0),
        (OVER, "raise-x2", "$20", None, 20.0),  # the amount given wins over the option's
        (OVER, "raise", "$1", None, 3.05),  # an amount under what was spent would not move the run
        (OVER, "raise", "go on, but carefully", None, 3.05),  # a note that is no amount
        (OVER, "raise", "0", None, 3.05),
        (OVER, "raise", None, 4.0, 4.05),  # agents that were running when it held spent more meanwhile
        ({**OVER, "limit": 1.0}, "raise", None, None, 3.05),  # already raised once: the cap is still spent + budget
        ({"hold": "per_run", "spent": 0.0, "limit": 0.0, "budget": 0.0}, "raise", None, None, 0.01),  # budget 0
        ({"hold": "daily", "spent": 80.0, "limit": 50.0, "budget": 50.0, "day": "d"}, "raise", None, None, 130.0),
    ],
)
def test_raise_always_moves_the_cap_above_what_was_spent(
    hold: dict[str, Any], option: str, note: str | None, spent_now: float | None, cap: float
) -> None:
    assert raised_cap(hold, option, spent=spent_now, note=note) == pytest.approx(cap)
    spent = max(float(hold["spent"]), spent_now or 0.0)
    ans = answer_hold(hold, "raise", option=option, note=note, spent=spent_now)
    assert ans.release
    if hold["hold"] == "per_run":
        limit = float(hold["limit"]) + ans.raise_run_usd  # the fold adds it to the run's cap
        assert limit == pytest.approx(cap) and limit > spent
        assert (
            breach(
                Limits(per_run_usd=hold["budget"]),
                run_spent=spent,
                run_raised=limit - hold["budget"],
                day_spent=0,
                day="d",
            )
            is None
        )
    else:
        assert ans.raise_day is not None and float(hold["limit"]) + ans.raise_day[1] == pytest.approx(cap)


@pytest.mark.parametrize(
    ("note", "amount"),
    [
        ("5", 5.0),
        ("$5", 5.0),
        (" 5.25 usd ", 5.25),
        ("Raise to $9", 9.0),
        ("5$", 5.0),
        ("", None),
        ("five", None),
        ("5 or 6", None),
        ("-5", None),
        ("0", None),
        (None, None),
        (5, None),
    ],
)
def test_an_amount_in_a_note(note: Any, amount: float | None) -> None:
    assert amount_in(note) == amount


def test_raise_options_name_the_cap_they_give() -> None:
    options = {k: label for k, label, _ in hold_options(OVER)}
    assert list(options) == ["raise", "raise-x2", "wait", "abort"]
    assert options["raise"].startswith("Allow this run up to $3.05 (what it spent, $3.00, plus $0.05")
    assert options["raise-x2"] == "Allow this run up to $6.00 (twice what it spent)"
    assert all(a == "raise" for k, _, a in hold_options(OVER) if k.startswith("raise"))
    small = {"hold": "per_run", "spent": 2.0, "limit": 2.0, "budget": 2.0}
    assert "raise-x2" not in [k for k, _, _ in hold_options(small)]  # twice the spend is no more than + a budget


def test_spend_by_agent_largest_first() -> None:
    steps = [
        {"agent": "rev", "usage": {"cost_usd": 0.1}},
        {"agent": "writer", "usage": {"cost_usd": 2.0}},
        {"agent": "rev", "usage": {"cost_usd": 0.2}},
        {"agent": "cmd"},  # a command agent: no usage
        {"agent": "x", "usage": {"input_tokens": 5}},  # a cost unknown
        "junk",
    ]
    assert spend_by_agent(steps) == {"writer": 2.0, "rev": 0.3}
    assert list(spend_by_agent(steps)) == ["writer", "rev"]
