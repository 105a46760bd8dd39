"""The rule store (ambient.learning.rulestore): ``.ambient/rules.yml`` round trip, problems with their line, a damaged
file never overwritten."""

from __future__ import annotations

from pathlib import Path

import pytest

from ambient.core.errors import InputError
from ambient.human.escalations import Escalation, EscalationDraft, new_escalation
from ambient.learning.rules import AutoDecide, RuleBook, accept
from ambient.learning.rulestore import handed_back, load_rules, save_rules, update_rules
from tests.unit.learning.test_rules import learn
from tests.unit.learning.test_stats import T0


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


def _failed(run_id: str, item: str, error: str, **answer: str) -> Escalation:
    esc = new_escalation(
        EscalationDraft(
            workflow="nightly",
            run_id=run_id,
            kind="fail",
            question=f"db failed on {item}",
            item=item,
            agent="db",
            detail=f"agent exited with code 1: {error}",
        ),
        now=T0,
    )
    return esc.model_copy(update={"status": "answered", **answer}) if answer else esc


def test_an_answer_after_a_rules_tries_on_the_same_item_is_handed_back() -> None:
    """Only a rule's decision on the same situation of the same item of the same run makes the person's answer one
    given after its tries (its numbers may differ: the situation is normalised)."""
    asked = _failed("run-1", "db", "connection to 10.0.0.1 timed out after 30s")
    by_rule = _failed("run-1", "db", "connection to 10.0.0.9 timed out after 31s", channel="rule", by="rule:r-1")
    assert handed_back(asked, [by_rule]) == "r-1"
    assert handed_back(asked, [by_rule.model_copy(update={"channel": "cli", "by": "human"})]) is None
    assert (
        handed_back(asked, [_failed("run-2", "db", "connection to 10.0.0.1 timed out after 30s", channel="rule")])
        is None
    )
    assert (
        handed_back(asked, [_failed("run-1", "web", "connection to 10.0.0.1 timed out after 30s", channel="rule")])
        is None
    )
    assert handed_back(asked, [_failed("run-1", "db", "disk quota exceeded", channel="rule", by="rule:r-2")]) is None
    assert handed_back(asked, [asked.model_copy(update={"channel": "rule"})]) is None  # itself
