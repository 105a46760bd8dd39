"""The learning-loop commands: ``ambient stats``, ``rules``, ``thread`` and ``replay``."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from ambient.cli import main
from ambient.learning.rules import AutoDecide, RuleBook, observe, situation_from_step
from ambient.learning.rulestore import load_rules, rules_path, save_rules
from ambient.live.context import LiveContext
from ambient.storage.paths import BrainPaths

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)  # Monday of 2026-W10
FAIL = {
    "item": "instance-03",
    "agent": "deploy",
    "signal_in": "RETURN",
    "result": "fail",
    "duration_ms": 900,
    "error": "timeout after 30s on 'vps/configs/instance-03.yml'",
    "escalation": "esc-1",
}


def _run(i: int, *, workflow: str = "deploy-batch", fail: bool = False, week: int = 0) -> dict[str, Any]:
    ok = {"item": "instance-01", "agent": "deploy", "signal_in": "RETURN", "result": "success", "duration_ms": 1200}
    steps = [ok, FAIL] if fail else [ok]
    return {
        "kind": "run",
        "run_id": f"run-{i:03d}",
        "workflow": workflow,
        "started_at": (T0 + timedelta(weeks=week, hours=i)).isoformat(),
        "completed_at": (T0 + timedelta(weeks=week, hours=i, seconds=5)).isoformat(),
        "outcome": "partial" if fail else "success",
        "steps": steps,
        "escalations": int(fail),
        "errors": 0,
        "decisions": [{"escalation": "esc-1", "option": "retry", "latency_s": 120.0}] if fail else [],
    }


@pytest.fixture
def brain(tmp_path: Path) -> Path:
    """A brain with three weeks of runs whose escalation rate falls (4/8, 2/8, 1/8)."""
    root = tmp_path / "brain"
    (root / ".ambient").mkdir(parents=True)
    (root / "workflows").mkdir()
    lines = []
    i = 0
    for week, failing in enumerate([4, 2, 1]):
        for k in range(8):
            lines.append(json.dumps(_run(i, fail=k < failing, week=week)))
            i += 1
    lines.append(json.dumps(_run(99, workflow="nightly", week=2)))
    (root / ".ambient" / "runs.jsonl").write_text("\n".join(lines) + "\n")
    return root


class TestStats:
    def test_table_with_weekly_trend(self, brain: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """The report shows workflows, agents, the weekly escalation rate with its trend, and recurring errors."""
        assert main(["stats", "--brain", str(brain)]) == 0
        text = capsys.readouterr().out
        assert "25 runs from 2026-03-02 to 2026-03-20" in text
        assert "deploy-batch" in text and "nightly" in text and "AGENT" in text
        assert "2026-W10" in text and "2026-W12" in text
        row = next(line for line in text.splitlines() if line.startswith("deploy-batch") and "falling" in line)
        assert "0.50" in row and "0.25" in row and "0.12" in row
        assert "timeout after <n>s on <q>" in text
        assert "2m00s" in text  # time to decision

    def test_json(self, brain: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """--json gives the full statistics, weeks and trend included."""
        assert main(["stats", "--brain", str(brain), "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        deploy = next(w for w in data["workflows"] if w["workflow"] == "deploy-batch")
        assert [w["rate"] for w in deploy["weeks"]] == [0.5, 0.25, 0.125]
        assert deploy["trend"]["direction"] == "falling"
        assert data["errors"][0]["count"] == 7
        assert data["skipped"] == {"torn_tail": False, "bad_lines": [], "invalid": 0}

    def test_filters(self, brain: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """--workflow, --agent and --since narrow the runs."""
        assert main(["stats", "--brain", str(brain), "--workflow", "nightly", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["runs"] == 1
        assert main(["stats", "--brain", str(brain), "--since", "2026-03-16", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["runs"] == 9
        assert main(["stats", "--brain", str(brain), "--agent", "nobody"]) == 0
        assert "No runs recorded yet" in capsys.readouterr().out

    def test_torn_line_is_noted(self, brain: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A torn last line and a corrupt line are skipped and mentioned."""
        log = brain / ".ambient" / "runs.jsonl"
        log.write_text(log.read_text() + "oops\n" + '{"kind": "run", "run_')
        assert main(["stats", "--brain", str(brain)]) == 0
        out = capsys.readouterr().out
        assert "25 runs" in out and "a torn last line" in out and "1 corrupt line(s) (line 26)" in out

    def test_empty_brain_and_bad_since(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """No history is a friendly message; a bad --since is a usage error (exit 2)."""
        (tmp_path / "agents").mkdir()  # a brain without history
        assert main(["stats", "--brain", str(tmp_path)]) == 0
        assert "No runs recorded yet" in capsys.readouterr().out
        assert main(["stats", "--brain", str(tmp_path), "--since", "someday"]) == 2
        assert "expected a date" in capsys.readouterr().err


def _learned(brain: Path, agreements: int) -> str:
    """Record a rule learned from 1 + ``agreements`` identical answers; return its id."""
    sit = situation_from_step("deploy-batch", FAIL)
    rules: list[Any] = []
    for i in range(agreements + 1):
        rules = observe(rules, sit, "retry", f"run-{i:03d}", T0)
    save_rules(rules_path(BrainPaths(brain)), RuleBook().with_rules(rules))
    return str(rules[0].id)


class TestRules:
    def test_list_empty(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """Without rules the list says how rules appear and that auto-decisions are off."""
        (tmp_path / "agents").mkdir()  # a brain without rules
        assert main(["rules", "--brain", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert "automatic decisions: off" in out and "No learned rules yet" in out

    def test_list_accept_forget(self, brain: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """The table shows state, agreements and uses; accept opts a rule in; forget stops it; both persist."""
        rid = _learned(brain, 3)
        assert main(["rules", "--brain", str(brain)]) == 0
        out = capsys.readouterr().out
        row = next(line for line in out.splitlines() if line.startswith(rid))
        assert "active" in row and " 3 " in row and "retry" in row and " no " in row
        assert main(["rules", "accept", rid[:8], "--brain", str(brain)]) == 0
        assert "now decides 'retry' alone" in capsys.readouterr().out
        book, _ = load_rules(rules_path(BrainPaths(brain)))
        assert book.rules[0].opted_in
        assert main(["rules", "list", "--json", "--brain", str(brain)]) == 0
        assert json.loads(capsys.readouterr().out)["rules"][0]["decides_alone"] is True
        assert main(["rules", "forget", rid, "--brain", str(brain)]) == 0
        assert "forgotten" in capsys.readouterr().out
        assert load_rules(rules_path(BrainPaths(brain)))[0].rules[0].state == "forgotten"

    def test_accept_shadow_rule_waits_for_agreements(self, brain: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """Accepting a shadow rule says it decides alone only once active."""
        rid = _learned(brain, 1)
        assert main(["rules", "accept", rid, "--brain", str(brain)]) == 0
        assert "once active (1/3 agreements so far, state shadow)" in capsys.readouterr().out

    def test_optin_optout(self, brain: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """optin/optout per workflow or globally change the stored policy; an exclusion wins."""
        _learned(brain, 3)
        path = rules_path(BrainPaths(brain))
        assert main(["rules", "optin", "--workflow", "deploy-batch", "--brain", str(brain)]) == 0
        assert "on in deploy-batch" in capsys.readouterr().out
        assert load_rules(path)[0].auto_decide == AutoDecide(workflows=["deploy-batch"])
        assert main(["rules", "optin", "--global", "--brain", str(brain)]) == 0
        assert main(["rules", "optout", "--workflow", "deploy-batch", "--brain", str(brain)]) == 0
        ad = load_rules(path)[0].auto_decide
        assert ad.global_ and ad.exclude == ["deploy-batch"] and not ad.covers("deploy-batch") and ad.covers("x")
        assert main(["rules", "optout", "--global", "--brain", str(brain)]) == 0
        assert not load_rules(path)[0].auto_decide.global_
        capsys.readouterr()
        assert main(["rules", "optin", "--brain", str(brain)]) == 2  # --workflow or --global is required

    def test_unknown_id_and_damaged_file(self, brain: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """An unknown id is exit 2 with a hint; a damaged rules.yml is reported and never overwritten."""
        _learned(brain, 0)
        assert main(["rules", "accept", "r-nope", "--brain", str(brain)]) == 2
        assert "no rule with id 'r-nope'" in capsys.readouterr().err
        path = rules_path(BrainPaths(brain))
        path.write_text("rules: [\n")
        assert main(["rules", "--brain", str(brain)]) == 0
        assert "warning" in capsys.readouterr().err
        assert main(["rules", "optin", "--global", "--brain", str(brain)]) == 2
        assert "has problems" in capsys.readouterr().err
        assert path.read_text() == "rules: [\n"


class TestThread:
    def _fill(self, brain: Path) -> None:
        live = LiveContext(BrainPaths(brain))
        spawn = {
            "from": "main",
            "to": "qa",
            "signal": "SPAWN",
            "session_id": "s1",
            "payload": {"context": {"objective": "remember IDEA-TOKEN-7F3A"}},
        }
        ask = {
            "from": "architect",
            "to": "qa",
            "signal": "SPAWN",
            "session_id": "s2",
            "payload": {"context": "which token?"},
        }
        answer = {
            "from": "qa",
            "to": "architect",
            "signal": "RETURN",
            "session_id": "s2",
            "payload": {"result": "IDEA-TOKEN-7F3A"},
        }
        for i, p in enumerate([spawn, ask, answer]):
            live.append_packet(p, ts=T0 + timedelta(minutes=i))

    def test_full_thread(self, brain: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """The default view is the whole shared thread."""
        self._fill(brain)
        capsys.readouterr()  # what the setup logged (a state folder narrowed) is not the command's output
        assert main(["thread", "qa", "--brain", str(brain)]) == 0
        out = capsys.readouterr().out
        assert out.startswith("thread qa: 3 turn(s) shown of 3") and "shared by every requester" in out
        assert "main -> qa [s1]" in out and "qa -> architect [s2]: IDEA-TOKEN-7F3A" in out

    def test_pair_view_says_partial(self, brain: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """--requester shows a pair view labelled partial."""
        self._fill(brain)
        capsys.readouterr()  # what the setup logged (a state folder narrowed) is not the command's output
        assert main(["thread", "qa", "--requester", "architect", "--brain", str(brain)]) == 0
        out = capsys.readouterr().out
        assert out.startswith("PARTIAL thread qa: 2 turn(s) shown of 3")
        assert "partial view (requester architect)" in out and "main -> qa" not in out

    def test_correlation_json_and_handoff(self, brain: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """--correlation --json is a partial projection; --handoff prints the bounded summary."""
        self._fill(brain)
        capsys.readouterr()  # what the setup logged (a state folder narrowed) is not the command's output
        assert main(["thread", "qa", "--correlation", "s1", "--json", "--brain", str(brain)]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["partial"] is True and [t["requester"] for t in data["turns"]] == ["main"]
        assert main(["thread", "qa", "--handoff", "--brain", str(brain)]) == 0
        out = capsys.readouterr().out
        assert "## Current objective" in out and "remember IDEA-TOKEN-7F3A" in out

    def test_bad_agent_name(self, brain: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A path as agent name is refused with exit 2."""
        assert main(["thread", "../../etc", "--brain", str(brain)]) == 2
        assert "not usable for a live thread" in capsys.readouterr().err


WORKFLOW = """\
workflow: deploy-batch
description: deploy N instances
for_each:
  items: [instance-01, instance-02, instance-03]
  spawn: deploy
  scope:
    zone: project
    files: ['vps/configs/{{item}}.yml']
  on_return:
    success: → next_item
    fail: → next_item
    error: ERROR + log + ESCALATE pilote
"""


class TestReplay:
    def test_default_routing(self, brain: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """Without a workflow file the ADR-027 defaults apply: every recorded failure would be escalated again."""
        assert main(["replay", "deploy-batch", "--brain", str(brain)]) == 0
        out = capsys.readouterr().out
        assert "ADR-027 defaults" in out and "nothing was executed" in out
        assert "escalations: 7 recorded -> 7 now" in out and "Would be escalated to you (7)" in out

    def test_rule_decides_and_since(self, brain: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """An opted-in active rule would decide the failures; --since narrows the runs."""
        _learned(brain, 3)
        assert main(["rules", "optin", "--workflow", "deploy-batch", "--brain", str(brain)]) == 0
        capsys.readouterr()
        assert main(["replay", "deploy-batch", "--since", "2026-03-09", "--json", "--brain", str(brain)]) == 0
        data = json.loads(capsys.readouterr().out)
        assert (data["runs"], data["decided_by_rule"], data["would_escalate"]) == (16, 3, 0)
        assert {i["change"] for i in data["items"]} == {"rule"}

    def test_current_workflow_file_reroutes(self, brain: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A workflow file that now goes on after a failure reports the failures as routed differently (each run
        compared with the spec it ran with, read from its journal)."""
        then = {"workflow": "deploy-batch", "for_each": {"items": ["instance-01", "instance-03"], "spawn": "deploy"}}
        journals = brain / ".ambient" / "runs"
        journals.mkdir()
        for line in (brain / ".ambient" / "runs.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if rec["workflow"] == "deploy-batch":
                head = {"ev": "started", "run_id": rec["run_id"], "workflow": rec["workflow"], "spec": then}
                (journals / f"{rec['run_id']}.jsonl").write_text(json.dumps(head) + "\n")
        (brain / "workflows" / "deploy-batch.yml").write_text(WORKFLOW)
        assert main(["replay", "deploy-batch", "--brain", str(brain), "--limit", "2"]) == 0
        out = capsys.readouterr().out
        assert "routing from workflows/deploy-batch.yml" in out
        assert "Would be routed differently (7)" in out and "escalate -> next" in out
        assert "5 more (--limit 0 shows all)" in out

    def test_unknown_workflow(self, brain: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A workflow without records says so."""
        assert main(["replay", "nope", "--brain", str(brain)]) == 0
        assert "No recorded runs of this workflow" in capsys.readouterr().out
