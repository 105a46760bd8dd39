"""Statistics over run records (ambient.learning.stats): the summary, the chunked file reader, error signatures."""

from __future__ import annotations

import itertools
import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambient.cli.stats import _chunk_bounds, _summarise_range, summarise_file
from ambient.core.errors import InputError
from ambient.engine.records import DecisionRecord, RunRecord, StepRecord
from ambient.learning.stats import (
    StatsBuilder,
    normalise_message,
    parse_since,
    percentile,
    summarise,
    trend_of,
    weekly_digest,
)

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)  # a Monday (ISO week 2026-W10)


def run(
    run_id: str,
    *,
    workflow: str = "deploy-batch",
    started: datetime = T0,
    seconds: float = 10.0,
    outcome: str = "success",
    steps: list[dict[str, Any]] | None = None,
    escalations: int = 0,
    errors: int = 0,
    decisions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One run record as the engine writes it to runs.jsonl."""
    return {
        "kind": "run",
        "run_id": run_id,
        "workflow": workflow,
        "started_at": started.isoformat(),
        "completed_at": (started + timedelta(seconds=seconds)).isoformat(),
        "outcome": outcome,
        "steps": steps if steps is not None else [step("instance-01")],
        "escalations": escalations,
        "errors": errors,
        "decisions": decisions or [],
    }


def step(item: str, *, agent: str = "deploy", result: str = "success", ms: int = 1000, **extra: Any) -> dict[str, Any]:
    """One step record."""
    return {
        "item": item,
        "agent": agent,
        "signal_out": "SPAWN",
        "signal_in": "RETURN",
        "result": result,
        "duration_ms": ms,
        **extra,
    }


def history(n: int, seed: int = 1) -> list[dict[str, Any]]:
    """A seeded history of ``n`` runs over a few weeks, with failures, errors and decisions."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        started = T0 + timedelta(hours=i * 7)
        steps, esc, errs, decs = [], 0, 0, []
        for k in range(rng.randint(1, 4)):
            result = rng.choice(["success"] * 6 + ["fail", "error"])
            extra: dict[str, Any] = {}
            if result != "success":
                extra["error"] = f"timeout after {rng.randint(1, 90)}s on 'vps/configs/instance-{k:02d}.yml'"
                extra["escalation"] = f"esc-{i}-{k}"
                esc += 1
                errs += result == "error"
                decs.append({"escalation": f"esc-{i}-{k}", "option": "retry", "latency_s": float(rng.randint(5, 500))})
            steps.append(
                step(
                    f"instance-{k:02d}",
                    agent=rng.choice(["deploy", "vps"]),
                    result=result,
                    ms=rng.randint(100, 5000),
                    **extra,
                )
            )
        out.append(
            run(
                f"run-{i:04d}",
                workflow=rng.choice(["deploy-batch", "nightly"]),
                started=started,
                steps=steps,
                escalations=esc,
                errors=errs,
                outcome="success" if not esc else "partial",
                decisions=decs,
            )
        )
    return out


def write_jsonl(path: Path, records: list[dict[str, Any]], tail: str = "") -> Path:
    """Write records as runs.jsonl (plus raw trailing text)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


# --- statistics ------------------------------------------------------------------------------


class TestStats:
    def test_counts_rates_and_durations_per_workflow(self) -> None:
        """Runs, success rate, run duration p50/p95, escalations and errors are summed per workflow."""
        recs = [
            run("r1", seconds=10),
            run("r2", seconds=20, outcome="failed", escalations=1, errors=1),
            run("r3", seconds=30, outcome="partial", escalations=2),
            run("r4", workflow="nightly", seconds=5),
        ]
        stats = summarise(recs)
        assert stats.runs == 4 and stats.invalid == 0
        deploy = next(w for w in stats.workflows if w.workflow == "deploy-batch")
        assert deploy.runs == 3
        assert deploy.success_rate == pytest.approx(1 / 3)
        assert (deploy.duration_p50_ms, deploy.duration_p95_ms) == (20_000.0, 30_000.0)
        assert (deploy.escalations, deploy.errors) == (3, 1)
        assert deploy.escalation_rate == pytest.approx(1.0)
        assert [w.workflow for w in stats.workflows] == ["deploy-batch", "nightly"]

    def test_per_agent_steps_escalations_and_errors(self) -> None:
        """Agents get step counts, verdict success rate, step duration percentiles, escalations and errors."""
        recs = [
            run(
                "r1",
                steps=[
                    step("a", ms=100),
                    step("b", result="fail", ms=300, escalation="e1"),
                    step("c", agent="vps", result="error", ms=200, error="boom"),
                ],
            ),
            run("r2", steps=[step("a", result="skipped", ms=50), step("b", signal_in="ESCALATE", result="fail")]),
        ]
        agents = {a.agent: a for a in summarise(recs).agents}
        deploy, vps = agents["deploy"], agents["vps"]
        assert deploy.steps == 4
        assert deploy.success_rate == pytest.approx(1 / 3)  # skipped has no verdict
        assert deploy.escalations == 2  # an escalation id, or the agent's own ESCALATE
        assert (vps.errors, vps.escalations) == (1, 0)
        assert deploy.duration_p50_ms == 100

    @pytest.mark.parametrize(
        ("values", "pct", "expected"),
        [
            ([], 50, None),
            ([7.0], 95, 7.0),
            ([1.0, 2.0, 3.0, 4.0], 50, 2.0),
            ([1.0, 2.0, 3.0, 4.0], 95, 4.0),
            ([float(i) for i in range(1, 101)], 95, 95.0),
            ([float(i) for i in range(1, 21)], 95, 19.0),
            ([float(i) for i in range(1, 11)], 0, 1.0),
            ([float(i) for i in range(1, 11)], 100, 10.0),
        ],
    )
    def test_percentile_nearest_rank(self, values: list[float], pct: float, expected: float | None) -> None:
        """Percentiles use the nearest-rank method."""
        assert percentile(values, pct) == expected

    def test_invalid_records_are_counted_and_change_nothing(self) -> None:
        """A record with wrong types anywhere (even its last step) is counted as invalid and not summed."""
        bad_step = run("r2", steps=[step("a"), {"item": "b", "agent": 3, "result": "success"}])
        recs = [
            run("r1"),
            bad_step,
            {"kind": "run", "workflow": "x"},
            run("r3") | {"escalations": "many"},
            run("r4") | {"started_at": "yesterday"},
            {"kind": "checkpoint", "whatever": 1},  # another kind of line: ignored, not invalid
        ]
        stats = summarise(recs)
        assert (stats.runs, stats.invalid) == (1, 4)
        assert stats.agents[0].steps == 1

    def test_run_record_models_are_accepted(self) -> None:
        """pydantic RunRecord models summarise like their JSON dicts."""
        model = RunRecord(
            run_id="r1",
            workflow="wf",
            started_at=T0,
            completed_at=T0 + timedelta(seconds=3),
            outcome="success",
            steps=[StepRecord(item="i", agent="a", result="success", duration_ms=5)],
            decisions=[DecisionRecord(escalation="e", option="retry", latency_s=12.0)],
            escalations=1,
        )
        stats = summarise([model])
        assert stats.workflows[0].duration_p50_ms == 3000.0
        assert stats.workflows[0].decision_p50_s == 12.0

    def test_filters_workflow_agent_since(self) -> None:
        """--workflow keeps one workflow, --agent keeps runs and steps of that agent, --since drops older runs."""
        recs = [
            run("r1", started=T0, steps=[step("a", agent="deploy"), step("b", agent="vps")]),
            run("r2", started=T0 + timedelta(days=8), workflow="nightly", steps=[step("a", agent="testing")]),
            run("r3", started=T0 + timedelta(days=9), steps=[step("a", agent="vps")]),
        ]
        assert summarise(recs, workflow="nightly").runs == 1
        by_agent = summarise(recs, agent="vps")
        assert by_agent.runs == 2 and [a.agent for a in by_agent.agents] == ["vps"]
        since = summarise(recs, since=T0 + timedelta(days=1))
        assert since.runs == 2 and since.first_started == T0 + timedelta(days=8)

    def test_time_to_decision_excludes_automatic_decisions(self) -> None:
        """Time to decision comes from the person's latency; rule decisions are counted apart."""
        decisions = [
            {"escalation": "e1", "option": "retry", "latency_s": 30.0},
            {"escalation": "e2", "option": "retry", "latency_s": 90.0},
            {"escalation": "e3", "option": "skip", "latency_s": 600.0},
            {"escalation": "e4", "option": "retry", "latency_s": 0.0, "auto": True, "by": "rule"},
        ]
        wf = summarise([run("r1", escalations=4, decisions=decisions)]).workflows[0]
        assert (wf.decisions, wf.auto_decisions) == (4, 1)
        assert (wf.decision_p50_s, wf.decision_p95_s) == (90.0, 600.0)

    @pytest.mark.parametrize(
        ("record", "reached", "auto"),
        [
            ({"escalations": 1, "auto_decisions": 1}, 1, 1),  # a record that counts what reached the person
            ({"escalations": 2}, 1, 1),  # an older one counted the rule's decision among its escalations
            ({"escalations": 0, "auto_decisions": 1}, 0, 1),
        ],
    )
    def test_the_headline_counts_what_reached_the_person(self, record: dict[str, Any], reached: int, auto: int) -> None:
        """Escalations per run and per week are the person's load; a learned rule's decisions are beside them."""
        decisions = [
            {"escalation": "e1", "option": "skip", "latency_s": 30.0},
            {"escalation": "e2", "option": "skip", "latency_s": 0.0, "auto": True, "by": "rule:r-1"},
        ][2 - reached - auto :]
        rec = run("r1", decisions=decisions) | record
        stats = summarise([rec])
        [wf] = stats.workflows
        assert (wf.escalations, wf.auto_decisions) == (reached, auto)
        [week] = wf.weeks
        assert (week.escalations, week.auto_decisions, week.rate) == (reached, auto, float(reached))

    def test_escalation_rate_per_iso_week_and_falling_trend(self) -> None:
        """Escalations per run are bucketed by ISO week of the start; a falling rate is reported as falling."""
        recs = []
        for week, escalating in enumerate([4, 2, 1]):  # of 4 runs per week
            for k in range(4):
                recs.append(
                    run(f"w{week}-{k}", started=T0 + timedelta(weeks=week, hours=k), escalations=int(k < escalating))
                )
        stats = summarise(recs)
        weeks = stats.workflows[0].weeks
        assert [(w.week, w.runs, w.escalations) for w in weeks] == [
            ("2026-W10", 4, 4),
            ("2026-W11", 4, 2),
            ("2026-W12", 4, 1),
        ]
        assert [w.rate for w in weeks] == [1.0, 0.5, 0.25]
        assert stats.workflows[0].trend.direction == "falling"
        assert stats.trend.slope_per_week == pytest.approx(-0.375)

    def test_trend_flat_rising_unknown(self) -> None:
        """Noise is flat, a growing rate is rising, a single week has no trend."""
        flat = [run(f"r{w}", started=T0 + timedelta(weeks=w), escalations=1) for w in range(3)]
        assert summarise(flat).trend.direction == "flat"
        rising = [run(f"r{w}", started=T0 + timedelta(weeks=w), escalations=w) for w in range(3)]
        assert summarise(rising).trend.direction == "rising"
        assert summarise([run("r1")]).trend.direction == "unknown"
        assert trend_of([]).direction == "unknown"

    def test_weeks_span_year_boundaries(self) -> None:
        """ISO weeks are labelled with the ISO year (2025-12-29 is in 2026-W01)."""
        stats = summarise([run("r1", started=datetime(2025, 12, 29, 12, tzinfo=UTC))])
        assert stats.weeks[0].week == "2026-W01"

    def test_merge_equals_one_pass(self) -> None:
        """Summaries of chunks merged equal the summary of the whole (the parallel reader relies on it)."""
        recs = history(200)
        whole = summarise(recs)
        parts = [StatsBuilder().add_all(recs[i::3]) for i in range(3)]
        merged = parts[0].merge(parts[1]).merge(parts[2]).result()
        assert merged == whole

    def test_weekly_digest_reports_rate_and_trend(self) -> None:
        """The digest names each workflow, its weekly escalation rate and its trend."""
        text = weekly_digest(summarise(history(60)))
        assert "deploy-batch: escalations per run" in text and "2026-W10" in text
        assert "Most frequent error" in text


class TestStatsFile:
    def test_torn_last_line_and_corrupt_lines_are_skipped_and_reported(self, tmp_path: Path) -> None:
        """A crash mid-append (no final newline) and garbage lines do not break the summary; both are reported."""
        recs = history(30)
        path = tmp_path / "runs.jsonl"
        body = "".join(json.dumps(r) + "\n" for r in recs[:10]) + "{not json\n" + "[1, 2]\n" + "\n"
        body += "".join(json.dumps(r) + "\n" for r in recs[10:]) + json.dumps(run("torn"))[:40]
        path.write_text(body)
        stats, res = summarise_file(path, workers=1)
        assert stats.runs == 30
        assert res.torn_tail is True
        assert res.bad_lines == [11, 12]
        assert stats == summarise(recs)

    def test_non_utf8_line_is_a_corrupt_line(self, tmp_path: Path) -> None:
        """A line that is not UTF-8 is one corrupt line; its neighbours still count."""
        path = tmp_path / "runs.jsonl"
        path.write_bytes(json.dumps(run("a")).encode() + b"\n\xff\xfe{}\n" + json.dumps(run("b")).encode() + b"\n")
        stats, res = summarise_file(path, workers=1)
        assert (stats.runs, res.bad_lines) == (2, [2])

    def test_chunked_reading_equals_one_pass(self, tmp_path: Path) -> None:
        """Chunks split at line starts cover every line once; merged results and line numbers match."""
        recs = history(150)
        path = write_jsonl(tmp_path / "runs.jsonl", recs[:70], tail="garbage\n")
        with path.open("a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in recs[70:])
        size = path.stat().st_size
        for n in (2, 3, 7):
            bounds = _chunk_bounds(path, size, n)
            assert bounds[0][0] == 0 and bounds[-1][1] == size
            assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
            parts = [_summarise_range((path, a, b, (None, None, None))) for a, b in bounds]
            assert sum(p[1] for p in parts) == 151
            builder = parts[0][0]
            for p in parts[1:]:
                builder.merge(p[0])
            assert builder.result() == summarise(recs)
        stats, res = summarise_file(path, workers=3)  # forked workers when the process has one thread
        assert stats == summarise(recs) and res.bad_lines == [71]

    def test_missing_file_is_an_empty_summary(self, tmp_path: Path) -> None:
        """No runs.jsonl yet: zero runs, nothing skipped."""
        stats, res = summarise_file(tmp_path / "absent.jsonl")
        assert stats.runs == 0 and not res.torn_tail and res.bad_lines == []


# --- error signatures ---------------------------------------------------------------------------


class TestSignatures:
    @pytest.mark.parametrize(
        ("message", "signature"),
        [
            ("timeout after 30s on 'vps/configs/instance-03.yml'", "timeout after <n>s on <q>"),
            ("connection to 10.0.3.4:22 refused", "connection to <ip> refused"),
            ("can't open /etc/app/x.conf: errno 13", "can't open <path>: errno <n>"),
            ('unknown option "--force" in workflows/a.yml', "unknown option <q> in <path>"),
            ("lock held by sess-a1b2c3d4 since 2026-03-18T10:00:00Z", "lock held by sess-<n> since <ts>"),
            ("lock held by sess-12345678", "lock held by sess-<n>"),
            ("see https://api.example.org/bot123:SECRET/send", "see <url>"),
            ("job 3f2a9c1e-1234-4abc-9def-0123456789ab   failed\n twice", "job <id> failed twice"),
            ("exit status 0x1F", "exit status <n>"),
            ("", "(no message)"),
        ],
    )
    def test_normalise_message(self, message: str, signature: str) -> None:
        """Numbers, hex ids, UUIDs, IPs, paths, URLs, timestamps and quoted values become placeholders."""
        assert normalise_message(message) == signature

    def test_signature_is_bounded(self) -> None:
        """A signature is at most 160 characters."""
        assert len(normalise_message("word " * 1000)) == 160

    @given(st.text(max_size=200))
    def test_digits_do_not_change_the_signature_class(self, message: str) -> None:
        """Replacing digits by other digits never changes a signature (the cache of StatsBuilder relies on it)."""
        zeroed = message.translate(str.maketrans("123456789", "000000000"))
        assert normalise_message(zeroed) == normalise_message(message)

    def test_recurring_errors_grouped_with_counts_and_last_seen(self) -> None:
        """Errors that differ only by variable parts are one signature with a count, last seen and example."""
        recs = [
            run("r1", started=T0, steps=[step("a", result="error", error="timeout after 30s on 'x/1.yml'")]),
            run(
                "r2",
                started=T0 + timedelta(days=1),
                steps=[step("b", agent="vps", result="error", error="timeout after 60s on 'x/2.yml'")],
            ),
            run("r3", started=T0 + timedelta(days=2), steps=[step("c", result="fail", error="disk full")]),
            run(
                "r4",
                started=T0 + timedelta(hours=1),
                steps=[step("d", result="error", error="timeout after 9s on 'y'")],
            ),
        ]
        errors = summarise(recs).errors
        top = errors[0]
        assert top.signature == "timeout after <n>s on <q>"
        assert top.count == 3
        assert top.last_seen == T0 + timedelta(days=1, seconds=10)
        assert top.first_seen == T0 + timedelta(seconds=10)
        assert top.example == "timeout after 60s on 'x/2.yml'"
        assert (top.workflows, top.agents) == (["deploy-batch"], ["deploy", "vps"])
        assert errors[1].signature == "disk full" and errors[1].count == 1

    def test_run_level_error_counts_too(self) -> None:
        """A run's own ``error`` extra (a run that failed outside a step) is a signature of agent '-'."""
        errors = summarise([run("r1") | {"error": "spec hash 1234 changed"}]).errors
        assert errors[0].signature == "spec hash <n> changed" and errors[0].agents == ["-"]


def test_parse_since() -> None:
    """--since takes a date, an ISO time or a span back from now; anything else is an input error."""
    now = datetime(2026, 3, 20, 12, tzinfo=UTC)
    assert parse_since("2026-03-01", now) == datetime(2026, 3, 1, tzinfo=UTC)
    assert parse_since("2026-03-01T10:00:00+02:00", now) == datetime(2026, 3, 1, 8, tzinfo=UTC)
    assert parse_since("30d", now) == now - timedelta(days=30)
    assert parse_since("2w", now) == now - timedelta(weeks=2)
    with pytest.raises(InputError, match="expected a date"):
        parse_since("last tuesday", now)


def _calls(agent: str, model: str, calls: int, cost: float, refused: int = 0, unknown: int = 0) -> dict[str, Any]:
    return {
        "agent": agent,
        "model": model,
        "calls": calls,
        "input_tokens": 100 * calls,
        "output_tokens": 10 * calls,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "cost_usd": cost,
        "cost_unknown": unknown,
        "refused": refused,
    }


def test_model_calls_add_up_per_agent_and_model_across_runs() -> None:
    a = run("r1") | {"calls_by": [_calls("writer", "claude-haiku-4-5", 3, 0.03), _calls("writer", "gpt-5", 1, 0.5)]}
    haiku_refused = _calls("writer", "claude-haiku-4-5", 2, 0.02, refused=4)
    b = run("r2") | {"calls_by": [haiku_refused, _calls("deploy", "x", 1, 0)]}
    stats = StatsBuilder().add_all([a, b]).result()
    by = {(m.agent, m.model): m for m in stats.models}
    haiku = by[("writer", "claude-haiku-4-5")]
    assert (haiku.calls, haiku.input_tokens, haiku.refused) == (5, 500, 4)
    assert haiku.cost_usd == pytest.approx(0.05)
    assert set(by) == {("writer", "claude-haiku-4-5"), ("writer", "gpt-5"), ("deploy", "x")}
    only = StatsBuilder(agent="writer").add_all([a, b]).result()
    assert {m.agent for m in only.models} == {"writer"}
    assert stats.to_json()["models"][0]["agent"] == "deploy"


def test_a_record_with_bad_call_figures_is_invalid_and_changes_nothing() -> None:
    bad = run("r1") | {"calls_by": [_calls("writer", "m", 1, 0.1) | {"calls": "1"}]}
    stats = StatsBuilder().add_all([bad]).result()
    assert stats.invalid == 1 and stats.models == [] and stats.runs == 0


def test_an_agents_escalations_are_what_reached_the_person_not_what_a_rule_decided() -> None:
    """Two questions about db's items: a learned rule answered one alone; db's row counts the one that reached the
    person, as its workflow's row does."""
    asked = [
        {"escalation": "esc-1", "item": "a", "kind": "fail", "agent": "db"},
        {"escalation": "esc-2", "item": "b", "kind": "fail", "agent": "db"},
    ]
    decisions = [
        {"escalation": "esc-1", "option": "skip", "action": "skip", "by": "rule:r-1", "auto": True},
        {"escalation": "esc-2", "option": "skip", "action": "skip", "by": "human", "channel": "cli"},
    ]
    rec = run("r1", steps=[step("a", agent="db"), step("b", agent="db")], escalations=1, decisions=decisions)
    stats = StatsBuilder().add_all([rec | {"asked": asked, "auto_decisions": 1}]).result()
    [db] = [a for a in stats.agents if a.agent == "db"]
    assert db.escalations == 1
    assert sum(w.escalations for w in stats.workflows) == 1
