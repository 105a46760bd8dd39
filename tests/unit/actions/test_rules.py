"""``ambient.actions.rules``: accept, forget and the opt-in as data, with the words ``ambient rules`` prints."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ambient.actions.rules import accept_rule, decides_alone, forget_rule, policy_line, read_rules, set_opt_in
from ambient.cli import main
from ambient.core.errors import UnknownRuleError
from ambient.learning.rules import RuleBook, observe, situation_from_step
from ambient.learning.rulestore import rules_path, save_rules
from ambient.storage.paths import BrainPaths

T0 = datetime(2026, 3, 16, 20, 36, tzinfo=UTC)
FAIL = {"item": "instance-03", "agent": "deploy", "result": "fail", "error": "exit code 1", "signal_in": "RETURN"}


@pytest.fixture
def paths(tmp_path: Path) -> BrainPaths:
    (tmp_path / "agents").mkdir()
    return BrainPaths(tmp_path)


def _learned(paths: BrainPaths, agreements: int) -> str:
    sit = situation_from_step("deploy-batch", FAIL)
    rules: list[Any] = []
    for i in range(agreements + 1):
        rules = observe(rules, sit, "retry", f"run-{i:03d}", T0)
    save_rules(rules_path(paths), RuleBook().with_rules(rules))
    return str(rules[0].id)


def test_accept_then_forget(paths: BrainPaths) -> None:
    """An active rule accepted decides alone; forgotten it no longer does; both persist."""
    rid = _learned(paths, 3)
    done = accept_rule(paths, rid[:8])
    assert done.rule.id == rid and decides_alone(done.rule, done.book)
    assert done.message == f"rule {rid} accepted: it now decides 'retry' alone (each decision is reported to you)"
    assert read_rules(paths)[0].rules[0].opted_in
    gone = forget_rule(paths, rid)
    assert gone.rule.state == "forgotten" and "forgotten" in gone.message
    assert not decides_alone(gone.rule, gone.book)


def test_shadow_rule_waits(paths: BrainPaths) -> None:
    """Accepting a shadow rule says it waits for agreements."""
    rid = _learned(paths, 1)
    assert "once active (1/3 agreements so far, state shadow)" in accept_rule(paths, rid).message


def test_opt_in_and_out(paths: BrainPaths) -> None:
    """Per workflow and globally; opting out globally says which accepted rules still decide alone."""
    rid = _learned(paths, 3)
    assert "on in deploy-batch" in set_opt_in(paths, True, workflow="deploy-batch").message
    accept_rule(paths, rid)
    out = set_opt_in(paths, False)
    assert out.still_deciding == [rid] and "off" in out.message
    book, _ = read_rules(paths)
    assert policy_line(book) == out.message


def test_unknown_rule_is_refused(paths: BrainPaths) -> None:
    """An unknown id raises (the CLI's exit 2), and nothing is written."""
    _learned(paths, 0)
    before = rules_path(paths).read_bytes()
    with pytest.raises(UnknownRuleError):
        accept_rule(paths, "r-nope")
    assert rules_path(paths).read_bytes() == before


def test_cli_says_the_same(paths: BrainPaths, capsys: pytest.CaptureFixture[str]) -> None:
    """``ambient rules accept`` prints the action's message."""
    rid = _learned(paths, 3)
    assert main(["rules", "accept", rid, "--brain", str(paths.root)]) == 0
    printed = capsys.readouterr().out.strip()
    forget_rule(paths, rid)
    assert printed == accept_rule(paths, rid).message
