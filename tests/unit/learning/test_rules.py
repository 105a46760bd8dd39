"""Learned rules (ambient.learning.rules): situations, shadow → active → opt-in, demotion, the notices."""

from __future__ import annotations

from datetime import timedelta
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambient.core.errors import InputError, UnknownRuleError
from ambient.learning.rules import (
    AutoDecide,
    Policy,
    Situation,
    accept,
    auto_decision_notice,
    auto_repeat_delay,
    find_rule,
    forget,
    has_words,
    lose_standing,
    may_auto_decide,
    observe,
    predict,
    prediction,
    record_use,
    repeat_note,
    shadow_hint,
    situation_for,
    situation_from_step,
    situation_of,
    standing_note,
)
from tests.unit.learning.test_stats import T0, step

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

    def test_a_rule_never_accepts_a_command_pattern_alone(self) -> None:
        """You answered allow-pattern four times to one tool call: the rule is active and predicts it, opted in
        everywhere and accepted, yet it never decides alone: a command pattern is the person's to accept."""
        sit = situation_of("build", "coder", "permission", detail="Bash: pytest -q tests/d", step="a")
        rules: list[Any] = []
        for i in range(4):
            rules = observe(rules, sit, "allow-pattern", f"run-{i}", T0 + timedelta(hours=i))
        [rule] = accept(rules, rules[0].id)
        assert (rule.state, rule.option, rule.opted_in) == ("active", "allow-pattern", True)
        everywhere = Policy(auto_decide=AutoDecide(global_=True))
        assert not may_auto_decide(rule, everywhere, options=["allow", "allow-always", "deny", "allow-pattern"])
        assert "never alone" in shadow_hint(rule, everywhere)
        assert "only you accept" in (standing_note(rule) or "")

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

    def test_a_rule_predicts_the_latest_answer(self) -> None:
        """docs/learning-loop.md's example: approve, reject, approve leave the rule predicting approve, agreements
        from zero, two disagreements, the last one reject → approve."""
        [rule] = learn(["approve", "reject", "approve"])
        assert (rule.option, rule.state, rule.agreements, rule.disagreements) == ("approve", "shadow", 0, 2)
        assert rule.last_disagreement is not None
        assert (rule.last_disagreement.predicted, rule.last_disagreement.decided) == ("reject", "approve")

    def test_a_situation_answered_both_ways_needs_more_agreements(self) -> None:
        """Each time the person decided otherwise than the rule, N more agreements in a row make it active (at most
        3N): a situation answered retry, skip, retry... by a person who looks at what the agent did not say is not
        promoted by the first short run of equal answers."""
        # retry x3, then skip (1 disagreement), then skip x6: active at 6 agreements, not at 3
        rules = learn(["retry"] * 3 + ["skip"] * 4)
        assert (rules[0].state, rules[0].agreements, rules[0].disagreements) == ("shadow", 3, 1)
        assert not may_auto_decide(accept(rules, rules[0].id)[0], OPTED)
        assert "3/6 agreements" in shadow_hint(rules[0], OPTED)
        rules = learn(["retry"] * 3 + ["skip"] * 7)
        assert (rules[0].state, rules[0].agreements) == ("active", 6)
        assert may_auto_decide(rules[0], OPTED)
        # four disagreements: 3N at most
        rules = learn(["retry", "skip", "retry", "skip", "retry"] + ["retry"] * 9)
        assert (rules[0].disagreements, rules[0].agreements, rules[0].state) == (4, 9, "active")
        assert learn(["retry", "skip", "retry", "skip", "retry"] + ["retry"] * 8)[0].state == "shadow"

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
        """Whatever the answers, a rule may decide alone only if the last K+1 answers were its option, K being N and N
        more for each time the answers changed (at most 3N)."""
        rules = learn(decisions, promote_after=n)
        [rule] = rules
        assert rule.option == decisions[-1]
        allowed = may_auto_decide(rule, Policy(promote_after=n, auto_decide=AutoDecide(global_=True)))
        changes = sum(1 for before, after in pairwise(decisions) if before != after)
        need = n * (1 + min(changes, 2))
        tail = decisions[-(need + 1) :]
        assert allowed == (len(tail) == need + 1 and set(tail) == {rule.option})


class TestSituations:
    def test_situation_from_step_signals(self) -> None:
        """A step's own signal wins; a RETURN uses its result; the text is the error, else the question."""
        s1 = situation_from_step("wf", step("i", result="fail", error="boom 12"))
        assert (s1.signal, s1.signature, s1.agent) == ("FAIL", "boom <n>", "deploy")
        s2 = situation_from_step("wf", step("i", result="fail", signal_in="ESCALATE", question="Deploy 3 now?"))
        assert (s2.signal, s2.signature) == ("ESCALATE", "Deploy <n> now?")
        assert situation_from_step("wf", step("i", result="error", signal_in="ERROR")).signature == "(no message)"


class TestWhatDecidesAlone:
    """A rule decides alone only over a situation with words of its own, a bounded number of times per item."""

    @pytest.mark.parametrize(
        ("signature", "words"),
        [
            ("agent exited with code <n>", False),
            ("agent exited with code <n>: connection to <ip> timed out after <n>s", True),
            ("agent exited with code <n>: disk quota exceeded while writing the cache index", True),
            ("agent died from signal SIGKILL", False),
            ("agent reported status failed", False),
            ("(no message)", False),
            ("(no call)", False),
            ("<n>", False),
            ("<q> <path> <n>", False),
            ("step <n>: (deploy) step <n> (deploy) closed without tests: accept it?", True),
            ("Bash: rm -rf build/", True),
            ("agent timed out after <n>s", True),
        ],
    )
    def test_a_situation_has_words_of_its_own(self, signature: str, words: bool) -> None:
        """ambient's own wording and placeholders are no words of the situation."""
        assert has_words(signature) is words
        assert Situation(workflow="w", agent="a", signal="FAIL", signature=signature).distinct is words

    @pytest.mark.parametrize(
        ("detail", "decides"),
        [
            ("agent exited with code 1", False),
            ("agent exited with code 1: connection to 10.0.3.4 timed out after 31s", True),
            ("", False),
            (None, False),
        ],
    )
    def test_a_rule_without_words_never_decides_alone(self, detail: str | None, decides: bool) -> None:
        """Active and opted in, a rule over a wordless situation still predicts, and never decides alone."""
        sit = situation_of("nightly", "stated", "fail", detail=detail, step="db")
        rules: list[Any] = []
        for i in range(4):
            rules = observe(rules, sit, "skip", f"run-{i}", T0 + timedelta(hours=i))
        [rule] = rules
        everywhere = Policy(auto_decide=AutoDecide(global_=True))
        assert rule.state == "active" and predict(rules, sit) == rule
        assert may_auto_decide(rule, everywhere) is decides
        assert (standing_note(rule) is None) is decides
        if not decides:
            assert "no distinguishing words" in shadow_hint(rule, everywhere)

    @pytest.mark.parametrize(
        ("step", "detail", "signature"),
        [
            ("2", "step 2 (deploy) closed without tests: accept it?", "step 2: step <n> (deploy) closed without"),
            ("review", "(review) deployed: continue?", "step review: (review) deployed: continue?"),
            (None, "swarm mode: the chain is done. Accept the final result?", "swarm mode: the chain is done"),
            ("2", None, "<n>"),  # an escalation written before a gate had its words: the step alone, as before
        ],
    )
    def test_a_gate_names_its_step_its_type_and_the_question(
        self, step: str | None, detail: str | None, signature: str
    ) -> None:
        """A gate's situation keeps its step's name as written and its type and question, normalised."""
        sit = situation_of("ship", "worker", "gate", detail=detail, step=step)
        assert sit.signal == "GATE" and sit.signature.startswith(signature), sit

    @pytest.mark.parametrize(
        ("previous", "delay"),
        [(0, 0.0), (1, 5.0), (2, 10.0), (3, None), (7, None)],
    )
    def test_automatic_decisions_on_one_item_are_bounded_and_backed_off(
        self, previous: int, delay: float | None
    ) -> None:
        """The first at once, then backoff_s doubled each time, none after the bound: the person gets the item."""
        assert auto_repeat_delay(previous, bound=3, backoff_s=5.0) == delay

    @pytest.mark.parametrize(
        ("option", "signal", "note"),
        [
            ("retry", "FAIL", "retried 3×, still failing"),
            ("continue", "ESCALATE", "chose 'continue' 3×, and it came back"),
        ],
    )
    def test_a_rule_that_keeps_leading_back_loses_its_standing(self, option: str, signal: str, note: str) -> None:
        """Back to shadow, its agreements reset and its opt-in withdrawn, what it did kept until the person's
        agreements make it active again."""
        sit = Situation(workflow="nightly", agent="stated", signal=signal, signature="disk quota exceeded")
        rules: list[Any] = []
        for i in range(4):
            rules = observe(rules, sit, option, f"run-{i}", T0 + timedelta(hours=i))
        rules = accept(rules, rules[0].id)
        assert repeat_note(rules[0], 3) == note
        [rule] = lose_standing(rules, rules[0].id, note, T0 + timedelta(days=1))
        assert (rule.state, rule.agreements, rule.opted_in, rule.lost_standing) == ("shadow", 0, False, note)
        assert not may_auto_decide(rule, Policy(auto_decide=AutoDecide(global_=True)))
        assert f"it {note}: back in shadow" in shadow_hint(rule, Policy())
        assert note in (standing_note(rule) or "")
        for i in range(3):
            [rule] = observe([rule], sit, option, f"again-{i}", T0 + timedelta(days=2, hours=i))
        assert (rule.state, rule.lost_standing) == ("active", None)

    @pytest.mark.parametrize(
        ("options", "policy", "shown"),
        [
            (["retry", "skip", "abort"], Policy(), "learned rule"),
            (["approve", "reject"], Policy(), None),  # its option is not offered
            (["retry", "skip", "abort"], OPTED, None),  # it decides alone: nothing to show
        ],
    )
    def test_the_prediction_shown_where_the_person_decides(
        self, options: list[str], policy: Policy, shown: str | None
    ) -> None:
        """One line, the same in the message, `ambient escalations` and the console."""
        rules = learn(["skip"] * 4)
        line = prediction(rules, policy, SIT, options)
        assert (line is None) if shown is None else (line is not None and line.startswith(shown)), line
