"""The learning loop: statistics over run records, learned rules, replay, and the rule store."""

from __future__ import annotations

import itertools
import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambient.cli.stats import _chunk_bounds, _summarise_range, summarise_file
from ambient.core.errors import InputError
from ambient.engine.records import DecisionRecord, RunRecord, StepRecord
from ambient.learning.replay import replay
from ambient.learning.rulestore import load_rules, save_rules, update_rules
from ambient.learning.stats import (
    AutoDecide,
    Policy,
    RuleBook,
    StatsBuilder,
    UnknownRuleError,
    accept,
    auto_decision_notice,
    find_rule,
    forget,
    may_auto_decide,
    normalise_message,
    observe,
    parse_since,
    percentile,
    predict,
    record_use,
    shadow_hint,
    situation_for,
    situation_from_step,
    situation_of,
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


# --- learned rules -------------------------------------------------------------------------------

SIT = situation_for("deploy-batch", "deploy", "FAIL", "timeout after 30s on 'vps/configs/instance-03.yml'")
OPTED = Policy(auto_decide=AutoDecide(workflows=["deploy-batch"]))


def learn(decisions: list[str], *, promote_after: int = 3) -> list[Any]:
    """Rules after the person answered the same situation with these options in turn."""
    rules: list[Any] = []
    for i, option in enumerate(decisions):
        rules = observe(rules, SIT, option, f"run-{i}", T0 + timedelta(hours=i), promote_after=promote_after)
    return rules


class TestRules:
    def test_first_answer_creates_a_shadow_candidate(self) -> None:
        """A first decision becomes a candidate rule in shadow with its evidence."""
        [rule] = learn(["retry"])
        assert (rule.state, rule.option, rule.agreements, rule.evidence) == ("shadow", "retry", 0, ["run-0"])
        assert rule.id.startswith("r-") and predict([rule], SIT) == rule
        assert not may_auto_decide(rule, Policy(auto_decide=AutoDecide(global_=True)))

    def test_similar_situations_share_the_rule(self) -> None:
        """Situations whose messages differ only by numbers or paths are the same situation."""
        other = situation_for("deploy-batch", "deploy", "fail", "timeout after 45s on 'vps/configs/instance-07.yml'")
        assert other == SIT
        assert predict(learn(["retry"]), other) is not None

    def test_agreements_promote_to_active_after_n(self) -> None:
        """Each matching answer is an agreement; the rule becomes active at promote_after agreements."""
        assert learn(["retry"] * 3)[0].state == "shadow"  # 2 agreements
        [rule] = learn(["retry"] * 4)
        assert (rule.state, rule.agreements) == ("active", 3)
        assert learn(["retry"] * 2, promote_after=1)[0].state == "active"

    def test_auto_decision_only_with_opt_in(self) -> None:
        """An active rule decides alone only where the person opted in: workflow, global, or the rule itself."""
        [rule] = learn(["retry"] * 4)
        assert not may_auto_decide(rule, Policy())
        assert may_auto_decide(rule, OPTED)
        assert may_auto_decide(rule, Policy(auto_decide=AutoDecide(global_=True)))
        assert not may_auto_decide(rule, Policy(auto_decide=AutoDecide(workflows=["other"])))
        [accepted] = accept([rule], rule.id)
        assert may_auto_decide(accepted, Policy())

    @pytest.mark.parametrize("kind", ["budget", "provider"])
    def test_a_budget_or_a_refused_key_is_never_answered_alone(self, kind: str) -> None:
        """A rule learns them and predicts the answer, but raising a budget or retrying a key stays the person's."""
        sit = situation_of("deploy-batch", "deploy", kind, detail="per-run budget reached", step=None)
        rules: list[Any] = []
        for i in range(4):
            rules = observe(rules, sit, "raise", f"run-{i}", T0 + timedelta(hours=i))
        [rule] = rules
        assert rule.state == "active" and predict(rules, sit) == rule
        assert not may_auto_decide(rule, Policy(auto_decide=AutoDecide(global_=True)))
        assert not may_auto_decide(accept(rules, rule.id)[0], Policy())

    def test_exclusion_wins_over_every_opt_in(self) -> None:
        """A workflow opted out is never decided alone, even with global opt-in or an accepted rule."""
        [rule] = accept(learn(["retry"] * 4), learn(["retry"])[0].id)
        policy = Policy(auto_decide=AutoDecide(global_=True, exclude=["deploy-batch"]))
        assert not may_auto_decide(rule, policy)

    def test_threshold_and_options_are_checked_at_decision_time(self) -> None:
        """A higher promote_after than the rule's agreements, or an option not offered, blocks the decision."""
        [rule] = learn(["retry"] * 4)
        assert not may_auto_decide(rule, Policy(promote_after=5, auto_decide=AutoDecide(global_=True)))
        assert not may_auto_decide(rule, OPTED, options=["skip", "abort"])
        assert may_auto_decide(rule, OPTED, options=["retry", "skip"])
        assert not may_auto_decide(None, OPTED)

    def test_accept_alone_never_skips_the_agreements(self) -> None:
        """Accepting a shadow rule opts it in; it still waits for N agreements before deciding."""
        rules = accept(learn(["retry"]), learn(["retry"])[0].id)
        assert rules[0].opted_in and rules[0].state == "shadow"
        assert not may_auto_decide(rules[0], Policy())
        for i in range(3):
            rules = observe(rules, SIT, "retry", f"later-{i}", T0)
        assert may_auto_decide(rules[0], Policy())

    def test_first_disagreement_demotes_and_is_recorded(self) -> None:
        """A different answer demotes an active rule to shadow, resets agreements and withdraws its opt-in."""
        rules = learn(["retry"] * 5)
        rules = accept(rules, rules[0].id)
        rules = observe(rules, SIT, "skip", "run-x", T0 + timedelta(days=1))
        [rule] = rules
        assert (rule.state, rule.agreements, rule.disagreements, rule.option) == ("shadow", 0, 1, "skip")
        assert rule.opted_in is False
        assert rule.last_disagreement is not None
        assert (rule.last_disagreement.predicted, rule.last_disagreement.decided) == ("retry", "skip")
        assert rule.last_disagreement.run_id == "run-x" and rule.evidence == ["run-x"]
        assert not may_auto_decide(rule, OPTED)

    def test_forget_and_accept_back(self) -> None:
        """A forgotten rule neither predicts nor learns; accepting it brings it back with its agreements."""
        rules = learn(["retry"] * 4)
        rid = rules[0].id
        rules = forget(rules, rid)
        assert predict(rules, SIT) is None and not may_auto_decide(rules[0], OPTED)
        assert observe(rules, SIT, "skip", "r", T0) == rules
        rules = accept(rules, rid)
        assert rules[0].state == "active" and may_auto_decide(rules[0], Policy())
        shadow = accept(forget(learn(["retry"]), rid), rid)
        assert shadow[0].state == "shadow"

    def test_record_use_and_notice(self) -> None:
        """An automatic decision counts a use, joins the evidence, and its notice says how to stop it."""
        rules = learn(["retry"] * 4)
        rules = record_use(rules, rules[0].id, "run-auto", T0)
        assert rules[0].uses == 1 and rules[0].evidence[-1] == "run-auto"
        text = auto_decision_notice(rules[0], run_id="run-auto", item="instance-03")
        assert "'retry'" in text and rules[0].id in text and f"ambient rules forget {rules[0].id}" in text
        assert "instance-03" in text
        assert "would choose 'retry'" in shadow_hint(rules[0], Policy())

    def test_evidence_is_bounded(self) -> None:
        """Only the newest 20 run ids are kept as evidence."""
        rule = learn(["retry"] * 30)[0]
        assert len(rule.evidence) == 20 and rule.evidence[-1] == "run-29"

    def test_find_rule_by_prefix(self) -> None:
        """Ids can be given by a unique prefix; unknown or ambiguous ids are clear input errors."""
        rules = learn(["retry"])
        rules = observe(rules, situation_for("wf", "a", "ERROR", "other"), "skip", "r9", T0)
        assert rules[0].id[:8] != rules[1].id[:8]
        assert find_rule(rules, rules[1].id[:8]) == rules[1]
        with pytest.raises(UnknownRuleError, match="no rule with id"):
            find_rule(rules, "r-zzzz")
        with pytest.raises(UnknownRuleError, match="ambiguous"):
            find_rule(rules, "r-")
        assert isinstance(UnknownRuleError("x"), InputError)

    def test_rules_are_independent_per_situation(self) -> None:
        """A decision in one situation never touches another situation's rule."""
        other = situation_for("deploy-batch", "vps", "FAIL", "timeout after 3s on 'x'")
        rules = learn(["retry"] * 4)
        rules = observe(rules, other, "abort", "r", T0)
        assert rules[0].state == "active" and rules[1].option == "abort" and len(rules) == 2

    @settings(max_examples=200)
    @given(st.lists(st.sampled_from(["retry", "skip", "abort"]), min_size=1, max_size=30), st.integers(1, 5))
    def test_auto_decision_only_after_n_consecutive_agreements(self, decisions: list[str], n: int) -> None:
        """Whatever the answers, a rule may decide alone only if the last N+1 answers were its option."""
        rules = learn(decisions, promote_after=n)
        [rule] = rules
        assert rule.option == decisions[-1]
        allowed = may_auto_decide(rule, Policy(promote_after=n, auto_decide=AutoDecide(global_=True)))
        tail = decisions[-(n + 1) :]
        assert allowed == (len(tail) == n + 1 and set(tail) == {rule.option})


class TestSituations:
    def test_situation_from_step_signals(self) -> None:
        """A step's own signal wins; a RETURN uses its result; the text is the error, else the question."""
        s1 = situation_from_step("wf", step("i", result="fail", error="boom 12"))
        assert (s1.signal, s1.signature, s1.agent) == ("FAIL", "boom <n>", "deploy")
        s2 = situation_from_step("wf", step("i", result="fail", signal_in="ESCALATE", question="Deploy 3 now?"))
        assert (s2.signal, s2.signature) == ("ESCALATE", "Deploy <n> now?")
        assert situation_from_step("wf", step("i", result="error", signal_in="ERROR")).signature == "(no message)"


# --- replay -----------------------------------------------------------------------------------------


class TestReplay:
    """ambient.learning.replay over hand-written records (the property test is in test_replay.py)."""

    def _records(self) -> list[dict[str, Any]]:
        return [
            run(
                "r1",
                steps=[step("i1"), step("i2", result="fail", error="timeout after 30s on 'a.yml'")],
                escalations=1,
            ),
            run(
                "r2",
                started=T0 + timedelta(days=3),
                steps=[step("i1", result="error", error="disk full"), step("i2")],
                escalations=1,
            ),
            run("r3", workflow="other", steps=[step("i1", result="fail")]),
        ]

    def test_default_routing_lists_escalations(self) -> None:
        """Under the ADR-027 defaults every fail/error is escalated again; nothing is rerouted."""
        report = replay(self._records(), None, [], workflow="deploy-batch")
        assert (report.runs, report.steps, report.recorded_escalations) == (2, 4, 2)
        assert (report.would_escalate, report.decided_by_rule, report.routed_differently) == (2, 0, 0)
        assert report.unchanged == 2
        assert {i.item for i in report.items} == {"i2", "i1"}

    def test_opted_in_active_rule_decides(self) -> None:
        """A step whose situation has an active, opted-in rule would be decided by it; a shadow rule only suggests."""
        sit = situation_from_step("deploy-batch", self._records()[0]["steps"][1])
        rules: list[Any] = []
        for i in range(4):
            rules = observe(rules, sit, "retry", f"h{i}", T0)
        shadow = observe([], situation_from_step("deploy-batch", self._records()[1]["steps"][0]), "skip", "h", T0)
        report = replay(self._records(), None, [*rules, *shadow], workflow="deploy-batch", policy=OPTED)
        assert (report.would_escalate, report.decided_by_rule) == (1, 1)
        by_change = {i.change: i for i in report.items}
        assert by_change["rule"].rule_id == rules[0].id and by_change["rule"].option == "retry"
        assert by_change["escalate"].rule_id == shadow[0].id and by_change["escalate"].option == "skip"

    def test_since_and_invalid_records(self) -> None:
        """--since drops older runs; broken records are counted, not fatal."""
        recs = [*self._records(), {"kind": "run", "workflow": "deploy-batch", "started_at": 5}]
        report = replay(recs, None, [], workflow="deploy-batch", since=T0 + timedelta(days=1))
        assert (report.runs, report.invalid) == (1, 1)
        assert report.to_json()["items"][0]["run_id"] == "r2"


def test_parse_since() -> None:
    """--since takes a date, an ISO time or a span back from now; anything else is an input error."""
    now = datetime(2026, 3, 20, 12, tzinfo=UTC)
    assert parse_since("2026-03-01", now) == datetime(2026, 3, 1, tzinfo=UTC)
    assert parse_since("2026-03-01T10:00:00+02:00", now) == datetime(2026, 3, 1, 8, tzinfo=UTC)
    assert parse_since("30d", now) == now - timedelta(days=30)
    assert parse_since("2w", now) == now - timedelta(weeks=2)
    with pytest.raises(InputError, match="expected a date"):
        parse_since("last tuesday", now)


# --- the rule store ---------------------------------------------------------------------------------


class TestRuleStore:
    def test_round_trip(self, tmp_path: Path) -> None:
        """Saved rules and policy load back equal, with no problems."""
        book = RuleBook(auto_decide=AutoDecide(workflows=["deploy-batch"]), promote_after=4).with_rules(
            learn(["retry"] * 5)
        )
        path = tmp_path / ".ambient" / "rules.yml"
        save_rules(path, book)
        assert load_rules(path) == (book, [])
        assert "global: false" in path.read_text()

    def test_missing_file_is_an_empty_book(self, tmp_path: Path) -> None:
        """No rules.yml: the defaults (auto-decide off, promote after 3)."""
        book, problems = load_rules(tmp_path / "rules.yml")
        assert book == RuleBook() and problems == [] and book.policy.promote_after == 3

    def test_bad_rule_is_skipped_with_its_line(self, tmp_path: Path) -> None:
        """One invalid rule is reported with file:line and skipped; the others load."""
        good = learn(["retry"])[0]
        path = tmp_path / "rules.yml"
        save_rules(path, RuleBook().with_rules([good]))
        text = path.read_text() + "- id: r-broken\n  option: retry\n  state: sideways\n"
        path.write_text(text)
        book, problems = load_rules(path)
        assert book.rules == [good]
        assert problems and all(str(p).startswith(f"{path}:") for p in problems)
        assert any("state" in p.message for p in problems)
        line = text.splitlines().index("  state: sideways") + 1
        assert any(p.line == line for p in problems)

    def test_damaged_file_is_never_overwritten(self, tmp_path: Path) -> None:
        """update_rules refuses while the file has problems, and leaves it byte for byte."""
        path = tmp_path / "rules.yml"
        path.write_text("promote_after: [\n")
        before = path.read_bytes()
        book, problems = load_rules(path)
        assert book == RuleBook() and problems[0].line is not None
        with pytest.raises(InputError, match="has problems"):
            update_rules(path, lambda b: b)
        assert path.read_bytes() == before

    def test_duplicate_ids_and_unknown_keys(self, tmp_path: Path) -> None:
        """A duplicate rule id and an unknown top-level key are problems."""
        rule = learn(["retry"])[0]
        path = tmp_path / "rules.yml"
        save_rules(path, RuleBook().with_rules([rule]))
        data = path.read_text().replace("rules:\n", "colour: blue\nrules:\n")
        dup = data[data.index("- id:") :]
        path.write_text(data + dup)
        book, problems = load_rules(path)
        assert [r.id for r in book.rules] == [rule.id]
        messages = " ".join(p.message for p in problems)
        assert "duplicate id" in messages and "colour" in messages

    def test_update_applies_and_saves(self, tmp_path: Path) -> None:
        """update_rules loads, changes and saves under its lock."""
        path = tmp_path / ".ambient" / "rules.yml"
        update_rules(path, lambda b: b.with_rules(learn(["retry"])))
        book = update_rules(path, lambda b: b.with_rules(accept(b.rules, b.rules[0].id)))
        assert load_rules(path)[0] == book and book.rules[0].opted_in
        assert (path.parent / "rules.lock").exists()
