"""docs/learning-loop.md: run records, `ambient stats`, learned rules and live threads, as a person meets them.

Run history is made by running workflows with real agent scripts and answering their escalations with
`ambient decide`. Only what a single afternoon cannot produce (runs of past weeks, for `--since` and the weekly
headline) is made by copying real records of this brain with their dates moved back whole weeks.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from tests.acceptance.harness import OK_AGENT, Brain, FakeTelegram, Webhook, docs_text, for_each, wait

# Fails like a flaky network: the numbers change with every run, the situation stays the same.
FLAKY_AGENT = """
    import hashlib, os, sys
    n = int(hashlib.sha256(os.environ["AMBIENT_RUN_ID"].encode()).hexdigest()[:6], 16)
    print(f"connection to 10.0.{n % 250}.{n % 7 + 1} timed out after {n % 90 + 10}s", file=sys.stderr)
    sys.exit(1)
"""

NIGHTLY = """
    workflow: nightly
    for_each:
      items: [db-backup]
      spawn: flaky
      scope: {zone: project, files: ["workspace/nightly/{{item}}.md"]}
"""

# Succeeds, unless the brain holds workspace/<item>.fail: then it fails (exit 1) or breaks (exit 3, an error).
SWITCH_AGENT = """
    import json, os, pathlib, sys
    json.load(sys.stdin)
    brain = pathlib.Path(os.environ["AMBIENT_BRAIN"])
    item = os.environ["AMBIENT_ITEM"]
    flag = brain / "workspace" / f"{item}.fail"
    if flag.exists():
        mode = flag.read_text().strip()
        print(f"{item} could not be written: {mode}", file=sys.stderr)
        sys.exit(3 if mode == "error" else 1)
    print(json.dumps({"status": "ok", "item": item}))
"""


def _runs_lines(brain: Brain) -> list[dict[str, Any]]:
    return [json.loads(line) for line in brain.read(".ambient/runs.jsonl").splitlines() if line.strip()]


def _rules(brain: Brain) -> dict[str, Any]:
    data: dict[str, Any] = brain.ok("rules", "--json").json()
    return data


def _records(brain: Brain, workflow: str) -> list[dict[str, Any]]:
    """The finished runs of ``workflow`` as runs.jsonl holds them (the file, read as a person would)."""
    path = brain.path(".ambient/runs.jsonl")
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("workflow") == workflow:
            out.append(rec)
    return out


def _pending_files(brain: Brain, workflow: str) -> list[dict[str, Any]]:
    """Pending escalations of ``workflow`` as their files in .ambient/escalations/ say."""
    found = []
    for path in brain.path(".ambient/escalations").glob("*.yml"):
        try:
            esc = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(esc, dict) and esc.get("workflow") == workflow and esc.get("status") == "pending":
            found.append(esc)
    return found


def _answered_run(brain: Brain, option: str, *, workflow: str = "nightly", start: bool = True) -> dict[str, Any]:
    """One run that escalates, answered by the person with ``option``; its run record."""
    before = len(_records(brain, workflow))
    if start:
        brain.ok("start", workflow)
    [esc] = wait(lambda: _pending_files(brain, workflow), f"{workflow}'s escalation")
    res = brain.decide(esc["id"], option)
    assert res.rc == 0, res
    rows: list[dict[str, Any]] = wait(lambda: (r := _records(brain, workflow))[before:] and r, "the run's record")
    return rows[-1]


def _auto_run(brain: Brain, *, workflow: str = "nightly") -> dict[str, Any]:
    """One run the person is not asked about: it finishes alone; its run record."""
    before = len(_records(brain, workflow))
    brain.ok("start", workflow)
    rows: list[dict[str, Any]] = wait(lambda: (r := _records(brain, workflow))[before:] and r, "the run's record")
    return rows[-1]


def _learning_brain(brain: Brain, webhook: Webhook | None = None) -> None:
    if webhook is not None:
        brain.config(f"""
            notify:
              urls: ["{webhook.url}"]
              results: none
        """)
    brain.python_agent("flaky", FLAKY_AGENT)
    brain.workflow("nightly", NIGHTLY)


def _promoted(brain: Brain) -> str:
    """Four runs answered `skip` (the first makes the rule, three agree): the rule is active. Its id."""
    _answered_run(brain, "skip", start=False)
    for _ in range(2):
        _answered_run(brain, "skip")
    [rule] = _rules(brain)["rules"]
    assert (rule["state"], rule["agreements"]) == ("shadow", 2), rule  # not before promote_after agreements
    _answered_run(brain, "skip")
    [rule] = _rules(brain)["rules"]
    assert (rule["state"], rule["agreements"], rule["option"]) == ("active", 3, "skip"), rule
    return str(rule["id"])


# ---------------------------------------------------------------- runs.jsonl


def test_every_finished_run_is_appended_in_the_adr027_shape(brain: Brain) -> None:
    """Every finished run is appended to .ambient/runs.jsonl: workflow, started/completed, steps with agent,
    signals, result, duration, escalations, errors, outcome, decisions."""
    brain.python_agent("writer", SWITCH_AGENT)
    brain.write("workspace/bad.fail", "fail\n")
    brain.write("workspace/boom.fail", "error\n")
    brain.workflow(
        "pages",
        """
        workflow: pages
        for_each:
          items: [good, bad, boom]
          spawn: writer
          scope: {zone: project, files: ["workspace/pages/{{item}}.md"]}
    """,
    )
    with brain.daemon():
        escs = brain.wait_escalation("the failed and the broken item", count=2)
        for esc in escs:
            assert brain.decide(esc["id"], "skip", "--note", "known").rc == 0
        brain.wait_finished("pages")
        brain.remove("workspace/bad.fail")
        brain.remove("workspace/boom.fail")
        brain.ok("start", "pages")
        brain.wait_finished("pages", count=2)
    first, second = _runs_lines(brain)
    assert first["workflow"] == second["workflow"] == "pages"
    assert first["run_id"] != second["run_id"]
    for rec in (first, second):
        started = datetime.fromisoformat(rec["started_at"])
        assert started <= datetime.fromisoformat(rec["completed_at"]), rec
        assert isinstance(rec["outcome"], str) and rec["outcome"]
        assert {s["item"] for s in rec["steps"]} == {"good", "bad", "boom"}
        for step in rec["steps"]:
            assert step["agent"] == "writer"
            assert step["signal_out"] == "SPAWN"
            assert step["signal_in"]
            assert isinstance(step["duration_ms"], int | float) and step["duration_ms"] >= 0
    by_item = {s["item"]: s for s in first["steps"]}
    assert by_item["good"]["result"] == "success"
    assert by_item["bad"]["result"] == "fail"
    assert by_item["boom"]["result"] == "error"
    assert "could not be written" in by_item["bad"]["error"]
    assert first["escalations"] == 2
    assert first["errors"] >= 1
    assert len(first["decisions"]) == 2
    for d in first["decisions"]:
        assert (d["option"], d["by"], d["channel"], d["auto"], d["note"]) == ("skip", "human", "cli", False, "known")
        assert d["latency_s"] >= 0
    assert second["outcome"] == "success"
    assert (second["escalations"], second["errors"], second["decisions"]) == (0, 0, [])


def _two_good_runs(brain: Brain) -> None:
    brain.python_agent("writer", SWITCH_AGENT)
    brain.workflow(
        "pages",
        """
        workflow: pages
        for_each:
          items: [a, b]
          spawn: writer
          scope: {zone: project, files: ["workspace/pages/{{item}}.md"]}
    """,
    )
    brain.until_idle()
    brain.ok("start", "pages")
    brain.until_idle()
    assert len(brain.finished("pages")) == 2


def test_a_torn_last_line_is_skipped_never_fatal(brain: Brain) -> None:
    """A torn last line of runs.jsonl (a crash mid-write) is skipped, never fatal: runs and stats still answer."""
    _two_good_runs(brain)
    with brain.path(".ambient/runs.jsonl").open("a") as f:
        f.write('{"kind": "run", "run_id": "sess-torn", "workflow": "pag')
    listing = brain.cli("runs")
    assert listing.rc == 0, listing
    assert len([line for line in listing.out.splitlines() if " pages " in line]) == 2, listing
    assert "torn" in listing.out, listing
    assert "Traceback" not in listing.text
    assert len(brain.finished("pages")) == 2
    stats = brain.cli("stats", "--json")
    assert stats.rc == 0, stats
    assert stats.json()["runs"] == 2
    assert brain.cli("stats").rc == 0
    assert len([line for line in brain.ok("runs", "--last", "1").out.splitlines() if " pages " in line]) == 1


def test_a_run_finished_after_a_torn_line_is_still_recorded(brain: Brain) -> None:
    """Every finished run is appended to runs.jsonl, also the first one after a crash tore the last line."""
    _two_good_runs(brain)
    with brain.path(".ambient/runs.jsonl").open("a") as f:
        f.write('{"kind": "run", "run_id": "sess-torn", "workflow": "pag')
    brain.ok("start", "pages")
    brain.until_idle()
    assert len(brain.finished("pages")) == 3, brain.ok("runs").out
    assert brain.ok("stats", "--json").json()["runs"] == 3


# ---------------------------------------------------------------- ambient stats


def test_stats_per_workflow_and_the_workflow_filter(brain: Brain) -> None:
    """`ambient stats [--workflow W] [--json]`: runs, success rate, durations, escalations per run, decisions."""
    brain.python_agent("writer", SWITCH_AGENT)
    brain.python_agent("flaky", FLAKY_AGENT)
    brain.workflow(
        "pages",
        """
        workflow: pages
        for_each:
          items: [a, b]
          spawn: writer
          scope: {zone: project, files: ["workspace/pages/{{item}}.md"]}
    """,
    )
    brain.workflow("nightly", NIGHTLY)
    with brain.daemon():
        _answered_run(brain, "skip", start=False)
        brain.wait_finished("pages")
        brain.ok("start", "pages")
        brain.wait_finished("pages", count=2)
    data = brain.ok("stats", "--json").json()
    assert data["runs"] == 3
    wf = {w["workflow"]: w for w in data["workflows"]}
    assert set(wf) == {"pages", "nightly"}
    assert (wf["pages"]["runs"], wf["pages"]["success_rate"], wf["pages"]["escalations"]) == (2, 1.0, 0)
    assert wf["pages"]["escalation_rate"] == 0
    assert wf["pages"]["duration_p50_ms"] > 0
    assert wf["pages"]["duration_p95_ms"] >= wf["pages"]["duration_p50_ms"]
    assert (wf["nightly"]["runs"], wf["nightly"]["escalations"], wf["nightly"]["escalation_rate"]) == (1, 1, 1.0)
    assert wf["nightly"]["decisions"] == 1 and wf["nightly"]["auto_decisions"] == 0
    assert wf["nightly"]["decision_p50_s"] is not None
    assert {a["agent"] for a in data["agents"]} == {"writer", "flaky"}
    only = brain.ok("stats", "--workflow", "nightly", "--json").json()
    assert [w["workflow"] for w in only["workflows"]] == ["nightly"]
    assert only["runs"] == 1
    text = brain.ok("stats", "--workflow", "pages").out
    [documented] = [line for line in docs_text().splitlines() if line.startswith("WORKFLOW ") and "ESC/RUN" in line]
    header = next(line for line in text.splitlines() if line.startswith("WORKFLOW ") and "ESC/RUN" in line)
    assert header.split() == documented.split(), (header, documented)
    rows = [line.split() for line in text.splitlines() if line.startswith("pages ")]
    assert rows and rows[0][1] == "2", text
    assert "nightly" not in text


def _shifted(record: dict[str, Any], weeks: int, n: int) -> dict[str, Any]:
    """A copy of a real run record as if it had run ``weeks`` weeks earlier."""
    delta = timedelta(weeks=weeks)

    def move(value: str) -> str:
        return (datetime.fromisoformat(value) - delta).isoformat()

    rec = json.loads(json.dumps(record))
    rec["run_id"] = f"{rec['run_id']}-w{weeks}-{n}"
    rec["started_at"], rec["completed_at"] = move(rec["started_at"]), move(rec["completed_at"])
    for part in rec["steps"] + rec["decisions"]:
        if part.get("at"):
            part["at"] = move(part["at"])
    return rec


def test_runs_and_stats_tell_failures_from_errors_and_timeouts_from_decisions(brain: Brain) -> None:
    """A business failure (exit 1) is counted as FAILED, an error (exit 3) as ERRORS, in `runs` and `stats` alike;
    a deadline that passed (on_timeout) is no decision of yours and takes no time to decide."""
    brain.shell_agent("mixed", 'cat > /dev/null\n[ "$AMBIENT_ITEM" = a ] && exit 1\nexit 3\n')
    brain.workflow(
        "mixed", for_each("mixed", "mixed", ["a", "b"], extra="on_escalate: {timeout: 1s, on_timeout: approve}\n")
    )
    with brain.daemon():
        [record] = brain.wait_finished("mixed")
    assert record["escalations"] == 2, record
    [line] = [row for row in brain.ok("runs").out.splitlines() if " mixed " in row]
    assert "failed=1 errors=1" in line, line
    [wf] = brain.ok("stats", "--json").json()["workflows"]
    assert (wf["failures"], wf["errors"], wf["decisions"], wf["timeouts"]) == (1, 1, 0, 2), wf
    assert wf["decision_p50_s"] is None, wf
    [agent] = brain.ok("stats", "--json").json()["agents"]
    assert (agent["failures"], agent["errors"]) == (1, 1), agent
    assert re.search(r"^mixed\s.*\s1\s+1\s+0\s+0\s", brain.ok("stats").out, re.M), brain.ok("stats").out


def test_stats_since_and_the_weekly_escalation_rate_with_its_trend(brain: Brain) -> None:
    """The headline: escalations per run, per ISO week, with its trend; `--since` keeps only the later runs."""
    brain.python_agent("writer", SWITCH_AGENT)
    brain.workflow(
        "deploy",
        """
        workflow: deploy
        for_each:
          items: [web]
          spawn: writer
          scope: {zone: project, files: ["workspace/deploy/{{item}}.md"]}
    """,
    )
    brain.write("workspace/web.fail", "fail\n")
    with brain.daemon():
        escalated = _answered_run(brain, "skip", workflow="deploy", start=False)
        brain.remove("workspace/web.fail")
        quiet = _auto_run(brain, workflow="deploy")
        _auto_run(brain, workflow="deploy")
    assert (escalated["escalations"], quiet["escalations"]) == (1, 0)
    # This week (real): 1 escalation in 3 runs. Two weeks ago: 1 in 2. Four weeks ago: 2 in 2.
    history = [_shifted(escalated, 4, 1), _shifted(escalated, 4, 2), _shifted(escalated, 2, 1), _shifted(quiet, 2, 2)]
    with brain.path(".ambient/runs.jsonl").open("a") as f:
        f.writelines(json.dumps(rec) + "\n" for rec in history)

    data = brain.ok("stats", "--json").json()
    assert data["runs"] == 7
    [wf] = data["workflows"]
    rates = [(w["runs"], w["escalations"]) for w in wf["weeks"]]
    assert rates == [(2, 2), (2, 1), (3, 1)], wf["weeks"]
    assert all(re.fullmatch(r"\d{4}-W\d{2}", w["week"]) for w in wf["weeks"])
    assert wf["trend"]["direction"] == "falling", wf["trend"]
    assert wf["trend"]["slope_per_week"] < 0
    text = brain.ok("stats").out
    assert "Escalations per run, by ISO week" in text
    [row] = [line for line in text.splitlines() if line.startswith("deploy") and "falling" in line]
    assert "1.00" in row and "0.50" in row and "0.33" in row, text

    recent = brain.ok("stats", "--since", "10d", "--json").json()
    assert recent["runs"] == 3
    assert [(w["runs"], w["escalations"]) for w in recent["workflows"][0]["weeks"]] == [(3, 1)]
    month = brain.ok("stats", "--since", (datetime.now() - timedelta(days=20)).date().isoformat(), "--json").json()
    assert month["runs"] == 5
    assert brain.cli("stats", "--since", "last tuesday").rc == 2
    two = brain.ok("stats", "--weeks", "2").out
    week_header = next(line for line in two.splitlines() if line.startswith("WORKFLOW ") and "TREND" in line)
    assert len(re.findall(r"\d{4}-W\d{2}", week_header)) == 2, week_header


def test_recurring_errors_are_grouped_after_normalising(brain: Brain) -> None:
    """Recurring errors: messages that differ only by numbers, ids, paths or quoted values are one signature."""
    brain.python_agent(
        "sync",
        """
        import os, sys
        n = {"a": 1, "b": 2, "c": 3, "d": 4}[os.environ["AMBIENT_ITEM"]]
        if n == 4:
            print("disk quota exceeded", file=sys.stderr)
        else:
            print(f"upload of '/srv/data/{n}{n}/report-{n * 7}.csv' to 10.0.0.{n} failed after {n * 11}s "
                  f"(request {n}f{n}e9c0{n}d2, job \\"batch {n}\\")", file=sys.stderr)
        sys.exit(1)
    """,
    )
    brain.workflow(
        "sync",
        """
        workflow: sync
        for_each:
          items: [a, b, c, d]
          spawn: sync
          scope: {zone: project, files: ["workspace/sync/{{item}}.md"]}
    """,
    )
    with brain.daemon():
        for esc in brain.wait_escalation("four failed uploads", count=4):
            assert brain.decide(esc["id"], "skip").rc == 0
        brain.wait_finished("sync")
    errors = brain.ok("stats", "--json").json()["errors"]
    counts = sorted((e["count"], e["signature"]) for e in errors)
    assert [c for c, _ in counts] == [1, 3], errors
    grouped = counts[1][1]
    assert "upload of" in grouped and "failed after" in grouped
    assert not re.search(r"\d", grouped.replace("code <n>", "")), grouped
    assert "/srv/data" not in grouped and "batch" not in grouped
    assert "disk quota exceeded" in counts[0][1]
    text = brain.ok("stats").out
    assert "Recurring failures and errors" in text
    assert re.search(r"^\s*3\s.*upload of", text, re.M), text
    top = brain.ok("stats", "--errors", "1").out
    assert "upload of" in top and "disk quota" not in top, top


# ---------------------------------------------------------------- learned rules


def test_an_answer_becomes_a_shadow_rule_and_matching_answers_are_agreements(brain: Brain) -> None:
    """An answer becomes a candidate rule in shadow: it only predicts, you still decide; matching answers agree."""
    _learning_brain(brain)
    with brain.daemon():
        _answered_run(brain, "skip", start=False)
        [rule] = _rules(brain)["rules"]
        assert rule["state"] == "shadow" and rule["option"] == "skip" and rule["agreements"] == 0
        assert rule["decides_alone"] is False
        sit = rule["situation"]
        assert (sit["workflow"], sit["agent"]) == ("nightly", "flaky")
        assert "timed out after" in sit["signature"] and not re.search(r"\d", sit["signature"]), sit
        brain.ok("start", "nightly")
        [esc] = brain.wait_escalation("the second run's escalation")  # shadow: the person is still asked
        assert esc["status"] == "pending"
        assert brain.decide(esc["id"], "skip").rc == 0
        brain.wait_finished("nightly", count=2)
    [rule2] = _rules(brain)["rules"]
    assert rule2["id"] == rule["id"]
    assert (rule2["state"], rule2["agreements"], rule2["uses"]) == ("shadow", 1, 0)
    listing = brain.ok("rules").out
    assert rule["id"] in listing and "shadow" in listing


def test_a_shadow_rules_prediction_is_shown_in_the_next_question(brain: Brain, webhook: Webhook) -> None:
    """Shadow "only predicts": the next escalation's message says what the rule would choose, and you decide."""
    _learning_brain(brain, webhook)
    with brain.daemon():
        first = wait(lambda: [t for t in webhook.texts() if "Decision needed" in t], "the first question")
        assert not any("would choose" in t for t in first), first  # no rule yet
        _answered_run(brain, "skip", start=False)
        [rule] = _rules(brain)["rules"]
        brain.ok("start", "nightly")
        [esc] = brain.wait_escalation("the second run's escalation")
        message = wait(
            lambda: [t for t in webhook.texts() if esc["id"] in t and "Decision needed" in t], "the second question"
        )[0]
        assert f"learned rule {rule['id']} would choose 'skip' (in shadow, 0/3 agreements)" in message, message
        assert brain.escalations()[0]["status"] == "pending"  # a prediction never decides
        assert brain.decide(esc["id"], "skip").rc == 0
        brain.wait_finished("nightly", count=2)


def _auto_decided(brain: Brain, webhook: Webhook, rule_id: str) -> None:
    """The next run is decided by the rule alone: recorded in the run, sent as information, counted as a use."""
    record = _auto_run(brain)
    assert brain.escalations() == []
    [decision] = record["decisions"]
    assert decision["auto"] is True and decision["option"] == "skip", decision
    assert rule_id in decision["by"], decision
    answered = [e for e in brain.escalations(all=True) if e["run_id"] == record["run_id"]]
    assert [(e["status"], e["decision"], e["channel"]) for e in answered] == [("answered", "skip", "rule")], answered
    wait(
        lambda: any("learned rule" in t and rule_id in t for t in webhook.texts()),
        "the automatic decision sent as information",
    )
    [rule] = _rules(brain)["rules"]
    assert rule["uses"] == 1
    assert brain.ok("stats", "--json").json()["workflows"][0]["auto_decisions"] == 1


def test_an_active_rule_decides_alone_where_you_opted_in_a_workflow(brain: Brain, webhook: Webhook) -> None:
    """Active after promote_after (3) agreements; decides alone only once you opt in (`rules optin --workflow W`);
    every automatic decision is recorded in the run and sent to you as information."""
    _learning_brain(brain, webhook)
    with brain.daemon():
        rule_id = _promoted(brain)
        assert _rules(brain)["rules"][0]["decides_alone"] is False
        _answered_run(brain, "skip")  # active but not opted in: the person is still asked
        out = brain.ok("rules", "optin", "--workflow", "nightly").out
        assert "nightly" in out
        assert _rules(brain)["rules"][0]["decides_alone"] is True
        _auto_decided(brain, webhook, rule_id)


def test_rules_optin_global_lets_active_rules_decide_everywhere(brain: Brain, webhook: Webhook) -> None:
    """`ambient rules optin --global`: active rules decide alone in every workflow."""
    _learning_brain(brain, webhook)
    with brain.daemon():
        rule_id = _promoted(brain)
        brain.ok("rules", "optin", "--global")
        assert _rules(brain)["auto_decide"]["global"] is True
        _auto_decided(brain, webhook, rule_id)


def test_rules_accept_opts_one_rule_in(brain: Brain, webhook: Webhook) -> None:
    """`ambient rules accept ID`: that rule decides alone once active (after its agreements), no workflow opt-in."""
    _learning_brain(brain, webhook)
    with brain.daemon():
        _answered_run(brain, "skip", start=False)
        [rule] = _rules(brain)["rules"]
        said = brain.ok("rules", "accept", rule["id"]).out
        assert rule["id"] in said
        assert _rules(brain)["rules"][0]["decides_alone"] is False  # still in shadow
        for _ in range(3):
            _answered_run(brain, "skip")
        accepted = _rules(brain)
        assert accepted["auto_decide"] == {"global": False, "workflows": [], "exclude": []}
        assert accepted["rules"][0]["decides_alone"] is True
        _auto_decided(brain, webhook, rule["id"])


def test_the_first_disagreement_demotes_the_rule_to_shadow(brain: Brain) -> None:
    """The first disagreement demotes an active rule back to shadow: opted in, it still asks you."""
    _learning_brain(brain)
    with brain.daemon():
        rule_id = _promoted(brain)
        _answered_run(brain, "abort")
        [rule] = _rules(brain)["rules"]
        assert rule["id"] == rule_id
        assert (rule["state"], rule["agreements"], rule["disagreements"]) == ("shadow", 0, 1), rule
        assert rule["decides_alone"] is False
        brain.ok("rules", "optin", "--workflow", "nightly")
        record = _answered_run(brain, "skip")  # the person is asked again
    assert [d["auto"] for d in record["decisions"]] == [False]
    assert all(not d["auto"] for rec in brain.finished("nightly") for d in rec["decisions"])


def test_rules_forget_stops_a_rule(brain: Brain) -> None:
    """`ambient rules forget ID` stops a rule: it no longer decides (nor learns), the person is asked."""
    _learning_brain(brain)
    with brain.daemon():
        rule_id = _promoted(brain)
        brain.ok("rules", "optin", "--global")
        said = brain.ok("rules", "forget", rule_id[:6]).out  # a unique prefix is enough
        assert rule_id in said
        [rule] = _rules(brain)["rules"]
        assert rule["state"] == "forgotten" and rule["decides_alone"] is False
        record = _answered_run(brain, "skip")
    assert [d["auto"] for d in record["decisions"]] == [False]
    [rule] = _rules(brain)["rules"]
    assert (rule["state"], rule["uses"], rule["agreements"]) == ("forgotten", 0, 3)
    assert brain.cli("rules", "forget", "r-nosuchrule").rc == 2


# ---------------------------------------------------------------- live threads and the handoff

ECHO_AGENT = """
    import json, os, pathlib, sys
    packet = json.load(sys.stdin)
    brain = pathlib.Path(os.environ["AMBIENT_BRAIN"])
    out = brain / "workspace" / "handoffs"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{os.environ['AMBIENT_RUN_ID']}.{os.environ['AMBIENT_ITEM']}.md").write_text(
        os.environ.get("AMBIENT_HANDOFF", ""))
    print(json.dumps({"status": "ok", "echo": packet["payload"]["context"].get("brief", "")}))
"""


def test_thread_shows_the_agents_live_thread_and_partial_views(brain: Brain) -> None:
    """`ambient thread AGENT [--requester R] [--correlation C]`: every delivered packet is a turn; filtered views
    say they are partial."""
    brain.python_agent("echo", ECHO_AGENT)
    brain.workflow(
        "notes",
        """
        workflow: notes
        for_each:
          items: [alpha, beta]
          spawn: echo
          scope: {zone: project, files: ["workspace/notes/{{item}}.md"]}
          context: {brief: "note about {{item}}"}
    """,
    )
    brain.until_idle()
    [record] = brain.finished("notes")
    run_id = record["run_id"]
    full = brain.ok("thread", "echo", "--json").json()
    assert full["partial"] is False
    turns = full["turns"]
    assert len(turns) == 4, turns
    for t in turns:
        assert {"requester", "target", "correlation_id", "role", "source"} <= set(t), t
    spawns = [t for t in turns if t["signal"] == "SPAWN"]
    assert {t["requester"] for t in spawns} == {"ambient"}
    assert {t["correlation_id"] for t in turns} == {f"{run_id}/alpha/1", f"{run_id}/beta/1"}
    text = brain.ok("thread", "echo").out
    assert "PARTIAL" not in text and "note about alpha" in text and "note about beta" in text

    one = brain.ok("thread", "echo", "--correlation", f"{run_id}/alpha/1", "--json").json()
    assert one["partial"] is True
    assert {t["correlation_id"] for t in one["turns"]} == {f"{run_id}/alpha/1"}
    assert len(one["turns"]) == 2
    one_text = brain.ok("thread", "echo", "--correlation", f"{run_id}/alpha/1").out
    assert one_text.startswith("PARTIAL") and "note about beta" not in one_text
    by_ambient = brain.ok("thread", "echo", "--requester", "ambient", "--json").json()
    assert by_ambient["partial"] is True and len(by_ambient["turns"]) == 4
    nobody = brain.ok("thread", "echo", "--requester", "human", "--json").json()
    assert nobody["partial"] is True and nobody["turns"] == []
    newest = brain.ok("thread", "echo", "--limit", "1").out  # the header counts what it shows
    assert "1 turn(s) shown of 4" in newest and "(... 3 earlier turn(s)" in newest, newest
    assert brain.cli("thread", "echo", "--limit", "-1").rc == 2


def test_a_business_failure_is_a_failed_return_in_the_thread_with_its_reason(brain: Brain) -> None:
    """Exit 1 (a business failure) with nothing on stdout is a RETURN that says failed and why, never an empty one."""
    brain.shell_agent("deny", 'cat > /dev/null\necho "quota exceeded for $AMBIENT_ITEM" >&2\nexit 1\n')
    brain.workflow("quota", for_each("quota", "deny", ["eu-1"]))
    brain.until_idle()
    [turn] = [t for t in brain.ok("thread", "deny", "--json").json()["turns"] if t["signal"] == "RETURN"]
    result = turn["payload"]["result"]
    assert result["status"] == "failed" and "quota exceeded for eu-1" in result["error"], turn
    assert "failed" in brain.ok("thread", "deny").out


BLOCKED_AGENT = """
    import json, os, pathlib, sys
    json.load(sys.stdin)
    brain = pathlib.Path(os.environ["AMBIENT_BRAIN"])
    out = brain / "workspace" / "handoffs"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{os.environ['AMBIENT_RUN_ID']}.{os.environ['AMBIENT_ITEM']}.md").write_text(
        os.environ.get("AMBIENT_HANDOFF", ""))
    print(json.dumps({"signal": "BLOCKED_ON",
                      "context": {"missing": os.environ["AMBIENT_ITEM"] + " needs the vendor key " + "k" * 3000}}))
"""


def test_agents_get_a_bounded_handoff_never_the_transcript(brain: Brain) -> None:
    """Agents get handoff.md in AMBIENT_HANDOFF: at most 4096 characters with stable rubrics, not the transcript."""
    brain.python_agent("vendor", BLOCKED_AGENT)
    items = [f"shop-{n}" for n in range(1, 9)]
    brain.workflow(
        "vendors",
        f"""
        workflow: vendors
        for_each:
          items: [{", ".join(items)}]
          spawn: vendor
          scope: {{zone: project, files: ["workspace/vendors/{{{{item}}}}.md"]}}
          context: {{brief: "{{{{item}}}} {"b" * 3000}"}}
    """,
    )
    with brain.daemon():
        first_run = brain.wait_escalation("the first run's blocked items", count=8)[0]["run_id"]
        brain.ok("start", "vendors")
        brain.wait_escalation("both runs' blocked items", count=16)
    assert len(brain.read(".ambient/live/vendor/log.jsonl")) > 40_000  # the transcript
    handoffs = {p.name: p.read_text() for p in brain.path("workspace/handoffs").glob("*.md")}
    assert len(handoffs) == 16
    for text in handoffs.values():
        assert 0 < len(text) <= 4096, len(text)
    richest = max((t for name, t in handoffs.items() if not name.startswith(first_run)), key=len)
    for rubric in ("Current objective", "Active requests", "Recent decisions", "Blockers", "Last correlated answer"):
        assert rubric in richest, richest
    assert "needs the vendor key" in richest
    kept = brain.read(".ambient/live/vendor/handoff.md")  # written when the agent first needed it
    assert 0 < len(kept) <= 4096
    shown = brain.ok("thread", "vendor", "--handoff").out
    assert 0 < len(shown) <= 4096 and "Blockers" in shown


def test_a_handoff_packet_reaches_the_agents_next_handoff(brain: Brain) -> None:
    """handoff.md is rewritten after HANDOFF packets: an agent's HANDOFF decision is in its next AMBIENT_HANDOFF."""
    gate = {
        "receives_from": ["orchestrator", "human", "ambient", "scribe2"],
        "sends_to": ["orchestrator", "human", "ambient", "scribe2"],
        "zone_access": ["project"],
        "signals": ["RETURN", "ERROR", "ESCALATE", "BLOCKED_ON", "HANDOFF"],
    }
    brain.python_agent(
        "scribe2",
        """
        import json, os, pathlib, subprocess, sys
        json.load(sys.stdin)
        brain = pathlib.Path(os.environ["AMBIENT_BRAIN"])
        out = brain / "workspace" / "handoffs"
        out.mkdir(parents=True, exist_ok=True)
        (out / os.environ["AMBIENT_RUN_ID"]).write_text(os.environ.get("AMBIENT_HANDOFF", ""))
        pkt = {"from": "scribe2", "to": "scribe2", "signal": "HANDOFF", "session_id": os.environ["AMBIENT_RUN_ID"],
               "payload": {"context": {"objective": "tidy the glossary"}, "decision": "use British spelling"}}
        sent = subprocess.run([sys.executable, "-m", "ambient", "send", "-"], input=json.dumps(pkt), text=True,
                              capture_output=True)
        (out / (os.environ["AMBIENT_RUN_ID"] + ".sent")).write_text(str(sent.returncode) + sent.stdout + sent.stderr)
        print(json.dumps({"status": "ok"}))
    """,
        gate=gate,
    )
    brain.workflow(
        "glossary",
        """
        workflow: glossary
        for_each:
          items: [terms]
          spawn: scribe2
          scope: {zone: project, files: ["workspace/glossary/{{item}}.md"]}
    """,
    )
    with brain.daemon():
        first = brain.wait_finished("glossary")[0]["run_id"]
        sent = brain.read(f"workspace/handoffs/{first}.sent")
        assert sent.startswith("0"), sent
        brain.ok("start", "glossary")
        second = brain.wait_finished("glossary", count=2)[-1]["run_id"]
    assert "HANDOFF" in brain.ok("thread", "scribe2").out
    assert "use British spelling" in brain.read(f"workspace/handoffs/{second}")


ASKER_AGENT = """
    import json, os, pathlib, subprocess, sys
    context = json.load(sys.stdin)["payload"]["context"]
    brain = pathlib.Path(os.environ["AMBIENT_BRAIN"])
    out = brain / "workspace" / "handoffs"
    out.mkdir(parents=True, exist_ok=True)
    name = f"{os.environ['AMBIENT_RUN_ID']}.{os.environ['AMBIENT_ITEM']}.{os.environ['AMBIENT_ATTEMPT']}.md"
    (out / name).write_text(os.environ.get("AMBIENT_HANDOFF", ""))
    item = os.environ["AMBIENT_ITEM"]
    if item == "wrap-up":  # hands off to its next session: its handoff.md is rewritten
        pkt = {"from": "asker", "to": "asker", "signal": "HANDOFF", "session_id": os.environ["AMBIENT_RUN_ID"],
               "payload": {"context": {"objective": "write in one tone"}}}
        sent = subprocess.run([sys.executable, "-m", "ambient", "send", "-"], input=json.dumps(pkt), text=True,
                              capture_output=True)
        assert sent.returncode == 0
    if item.startswith("ask") and "decision" not in context:
        print(json.dumps({"signal": "ESCALATE", "question": f"Tone of {item}?", "options": ["formal", "casual"]}))
    else:
        print(json.dumps({"status": "ok"}))
"""


def test_a_new_runs_handoff_holds_no_request_of_a_finished_run(brain: Brain) -> None:
    """A run whose agent asked twice finishes (one question answered, the other item skipped); the agent hands off
    (its handoff is rewritten); its next run is handed only what is still open: nothing of the finished run."""
    gate = {
        "receives_from": ["human", "ambient", "asker"],
        "sends_to": ["human", "ambient", "asker"],
        "zone_access": ["project"],
        "signals": ["RETURN", "ERROR", "ESCALATE", "BLOCKED_ON", "HANDOFF"],
    }
    brain.python_agent("asker", ASKER_AGENT, gate=gate)
    brain.workflow("tone", for_each("tone", "asker", ["ask-a", "ask-b"]))
    brain.workflow("wrap", "status: draft\n" + for_each("wrap", "asker", ["wrap-up"]))  # run on purpose only
    brain.workflow("later", "status: draft\n" + for_each("later", "asker", ["plain"]))
    with brain.daemon():
        asked = brain.wait_escalation("both questions", count=2)
        first = asked[0]["run_id"]
        by_item = {e["item"]: e for e in asked}
        assert set(by_item) == {"ask-a", "ask-b"}, by_item
        assert brain.decide(by_item["ask-a"]["id"], "formal").rc == 0
        assert brain.decide(by_item["ask-b"]["id"], "skip").rc == 0
        [record] = brain.wait_finished("tone")
        assert record["run_id"] == first
        brain.ok("start", "wrap")
        [wrapped] = brain.wait_finished("wrap")
        assert wrapped["outcome"] == "success", wrapped
        wait(lambda: "write in one tone" in brain.read(".ambient/live/asker/handoff.md"), "the handoff rewritten")
        brain.ok("start", "later")
        [later] = brain.wait_finished("later")
    [text] = [p.read_text() for p in brain.path("workspace/handoffs").glob(f"{later['run_id']}.*.md")]
    assert "Active requests" in text and "Blockers" in text, text
    assert "write in one tone" in text, text  # the rewritten handoff, not one from before the run
    assert first not in text and "formal | casual" not in text, text  # neither its requests nor its questions


# ---------------- `ambient replay` over an unchanged workflow says what its runs met

# Crashes on its first attempt of each item (the retry policy runs it again), succeeds after.
CRASH_ONCE_AGENT = """
    import json, os, sys
    json.load(sys.stdin)
    if os.environ["AMBIENT_ATTEMPT"] == "1":
        sys.exit(3)
    print(json.dumps({"status": "ok"}))
"""

# A code step without tests (the person confirms it), then a deploy behind a human gate.


def _counts(text: str) -> tuple[int, int]:
    found = re.search(r"escalations: (\d+) recorded -> (\d+) now", text)
    assert found, text
    return int(found.group(1)), int(found.group(2))


def test_replay_of_an_unchanged_for_each_counts_retries_as_retries(brain: Brain) -> None:
    """A run whose errors were retried by its `retry:` policy escalated nothing; replay says 0 -> 0."""
    brain.python_agent("flaky", CRASH_ONCE_AGENT)
    brain.workflow(
        "sync",
        """
        workflow: sync
        for_each:
          items: [a, b, c]
          spawn: flaky
        retry: {attempts: 3, backoff: 10ms, max_backoff: 20ms, on: [error]}
    """,
    )
    brain.until_idle()
    [record] = brain.finished("sync")
    assert record["outcome"] == "success" and record["escalations"] == 0
    res = brain.ok("replay", "sync")
    assert _counts(res.out) == (0, 0), res
    assert "0 step(s) routed differently" in res.out


def test_replay_of_an_unchanged_chain_counts_its_gates_and_close_tiers(brain: Brain) -> None:
    """A chain's human gate and a code step closed without tests reach the person; replay counts both."""
    brain.python_agent("worker", OK_AGENT)
    brain.workflow(
        "ship",
        """
        name: ship
        chain:
          - {step: 1, type: code, scope: projets/app/, agents: [worker]}
          - {step: 2, type: deploy, scope: infrastructure/app/, agents: [worker], gate: human}
    """,
    )
    brain.until_idle()
    for _ in range(2):  # the close tier of step 1, then the gate of step 2
        [esc] = brain.escalations()
        assert brain.decide(esc["id"], "approve").rc == 0
        brain.until_idle()
    [record] = brain.finished("ship")
    assert record["outcome"] == "success" and record["escalations"] == 2
    assert _counts(brain.ok("replay", "ship").out) == (2, 2)
    data = json.loads(brain.ok("replay", "ship", "--json").out)
    assert (data["would_escalate"], data["routed_differently"]) == (2, 0)


def test_replay_says_what_a_changed_workflow_would_do(brain: Brain) -> None:
    """Removing the gate: replay reports one escalation fewer for the same recorded run."""
    brain.python_agent("worker", OK_AGENT)
    gated = """
        name: ship
        chain:
          - {step: 1, type: brain-write, scope: projets/app/README.md, agents: [worker]}
          - {step: 2, type: deploy, scope: infrastructure/app/, agents: [worker], gate: human}
    """
    brain.workflow("ship", gated)
    brain.until_idle()
    [esc] = brain.escalations()
    assert brain.decide(esc["id"], "approve").rc == 0
    brain.until_idle()
    assert _counts(brain.ok("replay", "ship").out) == (1, 1)
    brain.workflow("ship", gated.replace(", gate: human", ""))
    assert _counts(brain.ok("replay", "ship").out) == (1, 0)


ASKING_AGENT = """
    import json, os, sys
    packet = json.load(sys.stdin)
    decision = packet["payload"].get("context", {}).get("decision")
    if decision is None:
        print(json.dumps({"signal": "ESCALATE", "options": ["blue", "green"],
                          "question": "Which colour for " + os.environ["AMBIENT_ITEM"] + "?"}))
    else:
        print(json.dumps({"status": "ok"}))
"""


def test_replay_lists_each_question_with_its_words_and_why_it_reaches_you(brain: Brain) -> None:
    """An agent's question is listed as its question, with its words; a failure as failed, with the agent's."""
    brain.python_agent("painter", ASKING_AGENT)
    brain.shell_agent("deny", 'cat > /dev/null\necho "quota exceeded" >&2\nexit 1\n')
    brain.workflow("paint", for_each("paint", "painter", ["door-7"]))
    brain.workflow("quota", for_each("quota", "deny", ["eu-1"]))
    brain.until_idle()
    for esc in brain.escalations():
        assert brain.decide(esc["id"], "green" if esc["workflow"] == "paint" else "skip").rc == 0
    brain.until_idle()
    paint = brain.ok("replay", "paint").out
    assert re.search(r"door-7 \(painter, its question\): Which colour for door-<n>\?", paint), paint
    quota = brain.ok("replay", "quota").out
    assert re.search(r"eu-1 \(deny, failed\): agent exited with code <n>: quota exceeded", quota), quota
    [item] = json.loads(brain.ok("replay", "paint", "--json").out)["items"]
    assert (item["kind"], item["change"]) == ("question", "escalate"), item


def test_replay_lists_a_gate_that_stopped_a_run_before_its_step(brain: Brain) -> None:
    """A human gate rejected before its step ran counts, and is listed, like every escalation replay counts."""
    brain.python_agent("worker", OK_AGENT)
    brain.workflow(
        "ship",
        """
        name: ship
        chain:
          - {step: 1, type: brain-write, scope: projets/app/README.md, agents: [worker]}
          - {step: 2, type: deploy, scope: infrastructure/app/, agents: [worker], gate: human}
    """,
    )
    brain.until_idle()
    [esc] = brain.escalations()
    assert brain.decide(esc["id"], "reject").rc == 0
    brain.until_idle()
    out = brain.ok("replay", "ship").out
    assert _counts(out) == (1, 1), out
    assert "Would be escalated to you (1)" in out, out
    # the rule your answer made is the one the live gate would meet (one rule of situations): it suggests reject
    assert re.search(r" 2 \(worker, human gate\); rule r-\w+ suggests 'reject'$", out, re.M), out


def test_stats_counts_each_escalation_for_the_agent_it_names(brain: Brain) -> None:
    """An escalation counts for its workflow and for the agent named in it (a failure, a gate)."""
    brain.python_agent("failer", "import sys\nsys.exit(1)\n")
    brain.python_agent("worker", OK_AGENT)
    brain.workflow("fails", "workflow: fails\nfor_each: {items: [a], spawn: failer}\n")
    brain.workflow(
        "gated",
        """
        name: gated
        chain:
          - {step: 1, type: deploy, scope: infrastructure/x/, agents: [worker], gate: human}
    """,
    )
    brain.until_idle()
    for esc in brain.escalations():
        assert brain.decide(esc["id"], "abort" if esc["workflow"] == "fails" else "reject").rc == 0
    brain.until_idle()
    data = json.loads(brain.ok("stats", "--json").out)
    agents = {a["agent"]: a for a in data["agents"]}
    assert agents["failer"]["escalations"] == 1, agents
    assert agents["worker"]["escalations"] == 1, agents  # asked about before it ran: the gate was rejected
    workflows = {w["workflow"]: w for w in data["workflows"]}
    assert workflows["fails"]["escalations"] == 1 and workflows["gated"]["escalations"] == 1
    only = json.loads(brain.ok("stats", "--agent", "worker", "--json").out)
    assert [a["agent"] for a in only["agents"]] == ["worker"] and only["agents"][0]["escalations"] == 1


# ---------------------------------------------------------------- a rule decides alone only when it is right

# Item `db` fails every night with its own words on stdout (nothing on stderr); any other item succeeds unless the
# brain holds workspace/<item>.fail, whose text is then its error.
STATED_AGENT = """
    import json, os, pathlib, sys
    json.load(sys.stdin)
    item = os.environ["AMBIENT_ITEM"]
    flag = pathlib.Path(os.environ["AMBIENT_BRAIN"]) / "workspace" / f"{item}.fail"
    if item == "db":
        n = int(os.environ["AMBIENT_RUN_ID"].encode().hex()[-6:], 16)
        error = f"connection to 10.0.{n % 250}.{n % 7 + 1} timed out after {n % 90 + 10}s"
    elif flag.exists():
        error = flag.read_text().strip()
    else:
        print(json.dumps({"status": "ok", "item": item}))
        sys.exit(0)
    print(json.dumps({"status": "failed", "error": error}))
    sys.exit(1)
"""


def _stated_brain(brain: Brain, webhook: Webhook | None = None, items: str = "[db, cache]", extra: str = "") -> None:
    if webhook is not None:
        brain.config(f"""
            notify:
              urls: ["{webhook.url}"]
              results: none
            {extra}
        """)
    elif extra:
        brain.config(extra)
    brain.python_agent("stated", STATED_AGENT)
    brain.workflow(
        "nightly",
        f"""
        workflow: nightly
        for_each:
          items: {items}
          spawn: stated
          scope: {{zone: project, files: ["workspace/nightly/{{{{item}}}}.md"]}}
    """,
    )


def test_a_rule_learned_on_one_error_never_decides_a_new_error_alone(brain: Brain) -> None:
    """The agent's own stated error (its JSON's `error`) is the situation: a rule learned on `db`'s timeouts decides
    them alone, and `cache`'s new error reaches the person."""
    _stated_brain(brain)
    with brain.daemon():
        rule_id = _promoted(brain)
        [rule] = _rules(brain)["rules"]
        assert "timed out after" in rule["situation"]["signature"], rule
        brain.ok("rules", "optin", "--workflow", "nightly")
        auto = _auto_run(brain)
        assert [(d["option"], d["auto"]) for d in auto["decisions"]] == [("skip", True)], auto
        brain.write("workspace/cache.fail", "disk quota exceeded while writing the cache index\n")
        brain.ok("start", "nightly")
        [esc] = brain.wait_escalation("cache's new error, for the person")
        assert esc["item"] == "cache" and "disk quota exceeded" in esc["question"], esc
        assert brain.decide(esc["id"], "abort").rc == 0
    [rule] = [r for r in _rules(brain)["rules"] if r["id"] == rule_id]
    assert rule["uses"] == 2  # db's timeout in both runs, never cache's quota


def test_a_failure_without_words_never_becomes_a_rule_that_decides_alone(brain: Brain) -> None:
    """An agent that says nothing about its failure (exit 1, no output): the rule may predict, never decide alone."""
    brain.python_agent("mute", "import sys\nsys.exit(1)\n")
    brain.workflow("nightly", for_each("nightly", "mute", ["db"]))
    with brain.daemon():
        _promoted(brain)
        brain.ok("rules", "optin", "--global")
        [rule] = _rules(brain)["rules"]
        assert rule["state"] == "active" and rule["decides_alone"] is False, rule
        assert "no distinguishing words" in brain.ok("rules").out
        _answered_run(brain, "skip")  # the person is still asked


def test_a_learned_retry_is_bounded_then_handed_to_the_person(brain: Brain, webhook: Webhook) -> None:
    """A rule that learned `retry` for a failure that always happens retries the item at most `learning.auto_repeats`
    times (backed off), then the person gets the item with what the rule did, and the rule is back in shadow."""
    _stated_brain(brain, webhook, items="[db]", extra="learning: {auto_repeats: 2, backoff_s: 0.05}")
    with brain.daemon() as daemon:
        seen: set[str] = set()

        def next_question() -> dict[str, Any]:
            def fresh() -> list[dict[str, Any]]:
                return [e for e in _pending_files(brain, "nightly") if e["id"] not in seen]

            [esc] = wait(fresh, "the next question")
            seen.add(esc["id"])
            return esc

        for _ in range(4):  # the first makes the rule, three agree: active
            assert brain.decide(next_question()["id"], "retry").rc == 0
        brain.ok("rules", "optin", "--global")
        assert brain.decide(next_question()["id"], "retry").rc == 0  # asked before the opt-in
        rule_id = _rules(brain)["rules"][0]["id"]
        # The rule retried, boundedly, and handed the item over: the question says what it did.
        said = f"learned rule {rule_id} would choose 'retry' (it retried 2×, still failing: back in shadow"
        message = wait(lambda: [t for t in webhook.texts() if said in t and "Decision needed" in t], "the question")[0]
        [handed] = [e for e in brain.escalations() if e["id"] in message]
        assert handed["status"] == "pending" and handed["item"] == "db", handed
        all_escs = [e for e in brain.escalations(all=True) if e["run_id"] == handed["run_id"]]
        by_rule = [e for e in all_escs if e["channel"] == "rule"]
        assert len(by_rule) == 2, by_rule
        [rule] = _rules(brain)["rules"]
        assert rule["state"] == "shadow" and rule["decides_alone"] is False, rule
        assert "retried 2×" in brain.ok("rules").out
        assert brain.decide(handed["id"], "abort").rc == 0
        brain.wait_finished("nightly")
        daemon.wait_log("answer_not_learned", escalation=handed["id"], rule=rule_id)
        # The answer after the rule's tries is about giving up on this item, not instead of a retry: the rule keeps
        # its option and counts no disagreement (one would ask the person twice as many agreements).
        [rule] = _rules(brain)["rules"]
        assert (rule["option"], rule["disagreements"], rule["agreements"]) == ("retry", 0, 0), rule


def test_the_prediction_is_shown_where_the_person_decides(brain: Brain, telegram: FakeTelegram, tmp_path: Path) -> None:
    """`ambient escalations`, its --json and the Telegram message say what a learned rule would choose."""
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "telegram-token").write_text(telegram.token + "\n")
    brain.env["CREDENTIALS_DIRECTORY"] = str(creds)
    _stated_brain(
        brain, extra=f'telegram: {{answers: true, chat_id: "4242", api_base: "{telegram.api_base}", poll_timeout_s: 1}}'
    )
    with brain.daemon():
        _answered_run(brain, "skip", start=False)
        [rule] = _rules(brain)["rules"]
        brain.ok("start", "nightly")
        [esc] = brain.wait_escalation("the second question")
        line = f"learned rule {rule['id']} would choose 'skip' (in shadow, 0/3 agreements)"
        assert line in brain.ok("escalations").out
        [listed] = brain.escalations()
        assert listed["prediction"] == line, listed
        wait(lambda: [t for t in telegram.sent_texts() if f"Ref: {esc['id']}" in t and line in t], "the Telegram one")
        assert brain.decide(esc["id"], "skip").rc == 0
        brain.wait_finished("nightly", count=2)
    assert "prediction" not in brain.escalations(all=True)[0]  # a settled question has nothing to predict


def test_the_headline_counts_what_reached_the_person(brain: Brain, webhook: Webhook) -> None:
    """Run records and `ambient stats` count escalations that reached the person, automatic decisions beside them."""
    _stated_brain(brain, webhook, items="[db]")
    with brain.daemon():
        _promoted(brain)
        brain.ok("rules", "optin", "--global")
        record = _auto_run(brain)
    assert (record["escalations"], record["auto_decisions"]) == (0, 1), record
    [wf] = brain.ok("stats", "--json").json()["workflows"]
    assert (wf["runs"], wf["escalations"], wf["auto_decisions"]) == (5, 4, 1), wf


def test_a_gate_rule_names_the_step_its_type_and_the_question(brain: Brain) -> None:
    """A rule learned from a `gate: human` answer names its step, the step's type and the question."""
    brain.python_agent("worker", OK_AGENT)
    brain.workflow(
        "ship",
        """
        name: ship
        chain:
          - {step: 1, type: brain-write, scope: projets/app/README.md, agents: [worker]}
          - {step: 2, type: deploy, scope: infrastructure/app/, agents: [worker], gate: human}
    """,
    )
    with brain.daemon():
        [esc] = brain.wait_escalation("the gate")
        assert brain.decide(esc["id"], "approve").rc == 0
        brain.wait_finished("ship")
    [rule] = _rules(brain)["rules"]
    signature = rule["situation"]["signature"]
    assert "step 2" in signature and "deploy" in signature, rule
