"""The learned rules a person steers (``ambient rules``, the console's learning page): accept or forget one rule,
opt a workflow (or every workflow) in or out of automatic decisions. Each change is one guarded read-modify-write
of the rules file (:func:`ambient.learning.rulestore.update_rules`); the rules themselves decide nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ambient.core.clock import utcnow
from ambient.learning.rules import (
    AutoDecide,
    RuleBook,
    accept,
    agreements_needed,
    find_rule,
    forget,
    may_auto_decide,
)
from ambient.learning.rulestore import load_rules, rules_path, update_rules

if TYPE_CHECKING:
    from ambient.core.problems import Problem
    from ambient.learning.rules import Rule
    from ambient.storage.paths import BrainPaths


@dataclass(frozen=True)
class RuleOutcome:
    """A rule accepted or forgotten: the rule as it is now, the book, and the line a person reads."""

    rule: Rule
    book: RuleBook
    message: str


@dataclass(frozen=True)
class PolicyOutcome:
    """The opt-in changed: the book as it is now, the policy line and what still decides alone."""

    book: RuleBook
    message: str
    still_deciding: list[str]


def policy_line(book: RuleBook) -> str:
    """Where automatic decisions are on, and after how many agreements a rule becomes active."""
    ad = book.auto_decide
    if ad.global_:
        scope = "on in every workflow"
    elif ad.workflows:
        scope = "on in " + ", ".join(ad.workflows)
    else:
        scope = "off (opt in: ambient rules optin --workflow W | --global, or accept a rule)"
    excl = f"; never in {', '.join(ad.exclude)}" if ad.exclude else ""
    return f"automatic decisions: {scope}{excl}; a rule becomes active after {book.promote_after} agreements"


def read_rules(paths: BrainPaths) -> tuple[RuleBook, list[Problem]]:
    """The rule book and the problems of its file (a broken file reads as an empty book plus its problem)."""
    return load_rules(rules_path(paths))


def decides_alone(rule: Rule, book: RuleBook) -> bool:
    """Whether ``rule`` decides alone now (active and opted in)."""
    return may_auto_decide(rule, book.policy)


def accept_rule(paths: BrainPaths, rule_id: str) -> RuleOutcome:
    """Opt one rule in (id or a unique prefix): it decides alone once active. Raises on an unknown id."""
    now = utcnow()
    book = update_rules(
        rules_path(paths),
        lambda b: b.with_rules(accept(b.rules, rule_id, now=now, promote_after=b.promote_after)),
    )
    rule = find_rule(book.rules, rule_id)
    if may_auto_decide(rule, book.policy):
        text = f"rule {rule.id} accepted: it now decides {rule.option!r} alone (each decision is reported to you)"
    elif rule.situation.workflow in book.auto_decide.exclude:
        text = f"rule {rule.id} accepted, but workflow {rule.situation.workflow} is opted out: it will not decide alone"
    else:
        text = (
            f"rule {rule.id} accepted: it decides alone once active "
            f"({rule.agreements}/{agreements_needed(rule, book.promote_after)} agreements so far, state {rule.state})"
        )
    return RuleOutcome(rule, book, text)


def forget_rule(paths: BrainPaths, rule_id: str) -> RuleOutcome:
    """Stop using one rule (kept as a record; accepting it brings it back). Raises on an unknown id."""
    now = utcnow()
    book = update_rules(rules_path(paths), lambda b: b.with_rules(forget(b.rules, rule_id, now=now)))
    rule = find_rule(book.rules, rule_id)
    text = f"rule {rule.id} forgotten: it no longer predicts or decides (ambient rules accept {rule.id} undoes this)"
    return RuleOutcome(rule, book, text)


def set_opt_in(paths: BrainPaths, on: bool, *, workflow: str | None = None) -> PolicyOutcome:
    """Let active rules decide alone (``on``) or stop them, in ``workflow`` or, when None, every workflow."""

    def change(book: RuleBook) -> RuleBook:
        ad = book.auto_decide
        workflows, exclude, global_ = list(ad.workflows), list(ad.exclude), ad.global_
        if workflow is None:
            global_ = on
            if on:
                exclude = []
            else:
                workflows = []
        elif on:
            workflows = [*(w for w in workflows if w != workflow), workflow]
            exclude = [w for w in exclude if w != workflow]
        else:
            workflows = [w for w in workflows if w != workflow]
            exclude = [*(w for w in exclude if w != workflow), workflow]
        policy = {"global": global_, "workflows": workflows, "exclude": exclude}
        return book.with_policy(AutoDecide.model_validate(policy))

    book = update_rules(rules_path(paths), change)
    still = [r.id for r in book.rules if may_auto_decide(r, book.policy)]
    return PolicyOutcome(book, policy_line(book), still if not on else [])
