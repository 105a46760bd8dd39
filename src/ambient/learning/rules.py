"""Learned rules as data (ADR-027): the situation of an escalation, and a rule's life from shadow to active to
deciding alone. No I/O.

A rule learns in shadow, is promoted after N agreements with the person, decides alone only where the person opted
in (per rule, per workflow or globally) and never in a :data:`NEVER_ALONE` situation, and is demoted at the first
disagreement; every transition here is a pure function over a list of rules. The file ``.ambient/rules.yml`` is
:mod:`ambient.learning.rulestore`'s; statistics over run records are :mod:`ambient.learning.stats`'.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ambient.core.errors import UnknownRuleError
from ambient.engine.budget import bound_signature
from ambient.learning.stats import normalise_message
from ambient.runners.patterns import ALLOW_PATTERN_KEY

RuleState = Literal["shadow", "active", "forgotten"]
DEFAULT_PROMOTE_AFTER = 3
EVIDENCE_MAX = 20  # run ids kept per rule (the newest)


class Situation(BaseModel):
    """What an escalation was about; two escalations with the same situation get the same rule."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workflow: str
    agent: str
    signal: str  # ESCALATE, FAIL, ERROR, BLOCKED_ON...
    signature: str  # normalised error or question (see normalise_message)

    @property
    def key(self) -> str:
        """The identity of the situation."""
        return "\x1f".join((self.workflow, self.agent, self.signal, self.signature))

    @property
    def distinct(self) -> bool:
        """Whether the situation carries words of its own (see :func:`has_words`): one without never decides alone."""
        return has_words(self.signature)


#: What ambient says around an agent's failure, not the agent's words: ``agent exited with code <n>`` alone tells one
#: failure from no other.
_AMBIENT_WORDS = re.compile(
    r"^(agent exited with code <n>|agent died from signal \w+|agent reported status failed|\(no message\)|"
    r"\(no call\))\s*:?\s*",
    re.IGNORECASE,
)
_PLACEHOLDER = re.compile(r"<(n|q|ip|id|ts|url|path)>")
_WORD = re.compile(r"[^\W\d_]{2,}")


def has_words(signature: str) -> bool:
    """Whether a normalised signature says something beyond ambient's own wording and placeholders: a situation
    that does not (``agent exited with code <n>``, ``<n>``) is every failure at once, and a rule over it would
    decide a new error like an old one."""
    rest = _PLACEHOLDER.sub(" ", _AMBIENT_WORDS.sub("", signature.strip()))
    return _WORD.search(rest) is not None


def situation_for(workflow: str, agent: str, signal: str, text: str | None) -> Situation:
    """The situation of an escalation raised by ``agent`` in ``workflow``; ``text`` is normalised."""
    return Situation(workflow=workflow, agent=agent, signal=signal.upper(), signature=normalise_message(text or ""))


#: The signal a situation names for each kind of escalation: the agent's own, or what ambient saw.
SIGNAL_OF_KIND: dict[str, str] = {
    "fail": "FAIL",
    "error": "ERROR",
    "blocked": "BLOCKED_ON",
    "question": "ESCALATE",
    "gate": "GATE",
    "circuit_break": "CIRCUIT_BREAK",
    "permission": "PERMISSION",
    "budget": "BUDGET",
    "provider": "PROVIDER",
}


def situation_of(workflow: str, agent: str | None, kind: str, *, detail: str | None, step: str | None) -> Situation:
    """The situation of an escalation, the one rule the daemon's learner and replay both follow.

    Who asked, why (its kind) and the agent's own words (``detail``: its question, or its error), never ambient's
    wording around them, which names the item: a rule learned on one item then serves the others. A gate or a
    circuit breaker has no words of an agent: its step stands for them.

    A tool permission (``permission``) is matched on the exact call it asks about (``detail``: its signature,
    ``Bash: pytest -q``), never normalised: ``rm -rf /`` and ``rm -rf build/`` would share a rule once numbers,
    paths and quoted values were placeholders. The signature is bounded (:func:`ambient.engine.budget.bound_signature`).
    """
    if kind == "permission":
        signature = bound_signature(detail) if detail else "(no call)"
        return Situation(workflow=workflow, agent=agent or "-", signal=SIGNAL_OF_KIND[kind], signature=signature)
    signal = SIGNAL_OF_KIND.get(kind, kind.upper())
    if kind == "gate" and detail:
        # A gate's words are its step's (type and question, ``detail``); the step's name is kept as written: chain
        # steps are often numbered, and a normalised ``2`` would be every step's ``<n>``.
        head = f"step {step}: " if step else ""
        return Situation(
            workflow=workflow, agent=agent or "-", signal=signal, signature=head + normalise_message(detail)
        )
    text = step if kind in ("gate", "circuit_break") else detail
    return situation_for(workflow, agent or "-", signal, text)


def kind_of_step(step: Mapping[str, Any]) -> str:
    """Why a recorded step would reach the person on its own: the agent's signal, else its result (an ESCALATE about
    a tool call: ``permission``)."""
    signal_in = step.get("signal_in")
    if signal_in == "ESCALATE":
        return "permission" if step.get("permission_signature") else "question"
    if signal_in == "BLOCKED_ON":
        return "blocked"
    if signal_in == "ERROR" or step.get("result") == "error":
        return "error"
    return "fail"


def situation_from_step(workflow: str, step: Mapping[str, Any], kind: str | None = None) -> Situation:
    """The situation of a recorded step that escalated as ``kind`` (default: :func:`kind_of_step`); its words are
    the step's ``question`` for a question, its ``permission_signature`` for a tool permission (a question the
    replay names so is one when the step carries a signature), else its ``error``."""
    k = kind or kind_of_step(step)
    if k == "question" and step.get("permission_signature"):
        k = "permission"
    if k == "permission":
        words = step.get("permission_signature")
    else:
        words = step.get("question") if k == "question" else step.get("error")
    return situation_of(
        workflow,
        str(step.get("agent", "")),
        k,
        detail=words if isinstance(words, str) else None,
        step=str(step.get("item", "")),
    )


class Disagreement(BaseModel):
    """The last time the person decided otherwise than the rule predicted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    predicted: str
    decided: str
    at: datetime


class Rule(BaseModel):
    """A learned rule: in this situation, the person chooses ``option``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    situation: Situation
    option: str
    state: RuleState = "shadow"
    agreements: int = Field(default=0, ge=0)
    disagreements: int = Field(default=0, ge=0)
    uses: int = Field(default=0, ge=0)
    evidence: list[str] = Field(default_factory=list)  # run ids, newest last
    opted_in: bool = False  # `ambient rules accept ID`
    created_at: datetime
    updated_at: datetime
    last_disagreement: Disagreement | None = None
    # Why it lost its standing (its automatic answer kept leading back to the same situation); cleared when the
    # person's agreements make it active again.
    lost_standing: str | None = None


class AutoDecide(BaseModel):
    """Where rules may decide alone: everywhere (``global``) or in listed workflows, never in ``exclude``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    global_: bool = Field(default=False, alias="global")
    workflows: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)

    def covers(self, workflow: str) -> bool:
        """Whether the person opted in for this workflow (the exclusion wins)."""
        if workflow in self.exclude:
            return False
        return self.global_ or workflow in self.workflows


class Policy(BaseModel):
    """The person's opt-in and the promotion threshold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    promote_after: int = Field(default=DEFAULT_PROMOTE_AFTER, ge=1)
    auto_decide: AutoDecide = Field(default_factory=AutoDecide)


class RuleBook(BaseModel):
    """The content of ``.ambient/rules.yml``: the policy and the rules."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    promote_after: int = Field(default=DEFAULT_PROMOTE_AFTER, ge=1)
    auto_decide: AutoDecide = Field(default_factory=AutoDecide)
    rules: list[Rule] = Field(default_factory=list)

    @property
    def policy(self) -> Policy:
        """The policy part, for :func:`may_auto_decide`."""
        return Policy(promote_after=self.promote_after, auto_decide=self.auto_decide)

    def with_rules(self, rules: Sequence[Rule]) -> RuleBook:
        """The same book with other rules."""
        return RuleBook.model_validate({**self._head(), "rules": [r.model_dump() for r in rules]})

    def with_policy(self, auto_decide: AutoDecide) -> RuleBook:
        """The same book with another opt-in."""
        head = self._head() | {"auto_decide": auto_decide.model_dump(by_alias=True)}
        return RuleBook.model_validate({**head, "rules": [r.model_dump() for r in self.rules]})

    def _head(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "promote_after": self.promote_after,
            "auto_decide": self.auto_decide.model_dump(by_alias=True),
        }


def _evolve(rule: Rule, **changes: Any) -> Rule:
    # model_copy(update=) does not validate; transitions rebuild the model.
    return Rule.model_validate({**rule.model_dump(), **changes})


def make_rule_id(situation: Situation, taken: Iterable[str] = ()) -> str:
    """A short stable id for the rule of a situation (``r-`` + 10 hex digits), unique among ``taken``."""
    base = "r-" + hashlib.sha256(situation.key.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    used = set(taken)
    candidate, n = base, 1
    while candidate in used:
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def _push(evidence: Sequence[str], run_id: str) -> list[str]:
    out = [e for e in evidence if e != run_id]
    out.append(run_id)
    return out[-EVIDENCE_MAX:]


def _index(rules: Sequence[Rule], situation: Situation) -> int | None:
    key = situation.key
    for i, r in enumerate(rules):
        if r.situation.key == key:
            return i
    return None


#: How many times over a rule's disagreements multiply the agreements it needs, at most: ``promote_after`` x (1 + 2).
MAX_DOUBT = 2


def agreements_needed(rule: Rule, promote_after: int) -> int:
    """The agreements in a row a rule needs to be active: ``promote_after``, and as many more for each time the
    person decided otherwise than it predicted (at most 3x). A situation the person answers both ways (they look at
    something the agent did not say) would otherwise be promoted by its first short run of equal answers, and then
    decide alone the times the person would have chosen the other way."""
    return promote_after * (1 + min(rule.disagreements, MAX_DOUBT))


def observe(
    rules: Sequence[Rule],
    situation: Situation,
    decision: str,
    run_id: str,
    now: datetime,
    *,
    promote_after: int = DEFAULT_PROMOTE_AFTER,
) -> list[Rule]:
    """Learn from the person's answer to an escalation; returns the new list of rules.

    - no rule for the situation: a new candidate in ``shadow`` predicting ``decision``;
    - the rule predicted ``decision``: one more agreement; ``shadow`` becomes ``active`` at
      :func:`agreements_needed` (``promote_after``, more after disagreements);
    - it predicted something else: demoted to ``shadow``, agreements reset, the disagreement
      recorded, and the rule now predicts the person's latest choice; a per-rule opt-in is
      withdrawn (the person accepted another decision);
    - a ``forgotten`` rule stays forgotten and learns nothing until it is accepted again.
    """
    out = list(rules)
    i = _index(out, situation)
    if i is None:
        out.append(
            Rule(
                id=make_rule_id(situation, (r.id for r in out)),
                situation=situation,
                option=decision,
                evidence=[run_id],
                created_at=now,
                updated_at=now,
            )
        )
        return out
    rule = out[i]
    if rule.state == "forgotten":
        return out
    if rule.option == decision:
        agreements = rule.agreements + 1
        state = "active" if agreements >= agreements_needed(rule, promote_after) else rule.state
        evidence = _push(rule.evidence, run_id)
        lost = None if state == "active" else rule.lost_standing
        out[i] = _evolve(
            rule, agreements=agreements, state=state, evidence=evidence, updated_at=now, lost_standing=lost
        )
    else:
        out[i] = _evolve(
            rule,
            option=decision,
            state="shadow",
            agreements=0,
            disagreements=rule.disagreements + 1,
            opted_in=False,
            evidence=[run_id],
            updated_at=now,
            last_disagreement=Disagreement(run_id=run_id, predicted=rule.option, decided=decision, at=now),
        )
    return out


def predict(rules: Sequence[Rule], situation: Situation) -> Rule | None:
    """The rule (shadow or active) that predicts this situation, if any; forgotten rules never predict."""
    i = _index(rules, situation)
    if i is None or rules[i].state == "forgotten":
        return None
    return rules[i]


#: Situations a rule learns (and predicts in the question) but never answers alone: spending more money and a
#: refused model key are the person's whatever they answered before (an auto-``raise`` would undo the budget).
NEVER_ALONE = frozenset({"BUDGET", "PROVIDER"})
#: Options a rule may predict but never choose alone: a command pattern for an agent from now on is a broader grant
#: than any answer the person gave before, and theirs to accept (runners/patterns: propose, never assume).
NEVER_ALONE_OPTIONS = frozenset({ALLOW_PATTERN_KEY})


def may_auto_decide(rule: Rule | None, policy: Policy, *, options: Sequence[str] | None = None) -> bool:
    """Whether ``rule`` may decide without the person: active, the agreements it needs (:func:`agreements_needed`),
    opted in (per rule, per workflow or globally, a workflow exclusion always wins), and its option
    among the escalation's ``options`` when they are given; never a budget or a refused key (NEVER_ALONE), never a
    situation without words of its own (:func:`has_words`), never a command pattern (NEVER_ALONE_OPTIONS)."""
    if rule is None or rule.state != "active" or rule.agreements < agreements_needed(rule, policy.promote_after):
        return False
    if rule.option in NEVER_ALONE_OPTIONS:
        return False
    if rule.situation.signal in NEVER_ALONE or not rule.situation.distinct:
        return False
    workflow = rule.situation.workflow
    if workflow in policy.auto_decide.exclude:
        return False
    if not (rule.opted_in or policy.auto_decide.covers(workflow)):
        return False
    return options is None or rule.option in options


def record_use(rules: Sequence[Rule], rule_id: str, run_id: str, now: datetime) -> list[Rule]:
    """Count one automatic decision by the rule (its run joins the evidence)."""
    out = list(rules)
    i = _find(out, rule_id)
    out[i] = _evolve(out[i], uses=out[i].uses + 1, evidence=_push(out[i].evidence, run_id), updated_at=now)
    return out


def find_rule(rules: Sequence[Rule], rule_id: str) -> Rule:
    """The rule with this id or unique id prefix; :class:`UnknownRuleError` otherwise."""
    return rules[_find(rules, rule_id)]


def _find(rules: Sequence[Rule], rule_id: str) -> int:
    exact = [i for i, r in enumerate(rules) if r.id == rule_id]
    if exact:
        return exact[0]
    matches = [i for i, r in enumerate(rules) if rule_id and r.id.startswith(rule_id)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        msg = f"rule id {rule_id!r} is ambiguous ({len(matches)} rules start with it); give more of it"
        raise UnknownRuleError(msg)
    raise UnknownRuleError(f"no rule with id {rule_id!r}; `ambient rules` lists them")


def accept(
    rules: Sequence[Rule], rule_id: str, *, now: datetime | None = None, promote_after: int = DEFAULT_PROMOTE_AFTER
) -> list[Rule]:
    """The person opts this rule in. It still decides alone only once active (N agreements);
    a forgotten rule comes back, active if it already had the agreements, else in shadow."""
    out = list(rules)
    i = _find(out, rule_id)
    rule = out[i]
    state = rule.state
    if state == "forgotten":
        state = "active" if rule.agreements >= agreements_needed(rule, promote_after) else "shadow"
    out[i] = _evolve(rule, opted_in=True, state=state, updated_at=now or rule.updated_at)
    return out


def forget(rules: Sequence[Rule], rule_id: str, *, now: datetime | None = None) -> list[Rule]:
    """The rule stops predicting and learning (kept as a record; :func:`accept` brings it back)."""
    out = list(rules)
    i = _find(out, rule_id)
    out[i] = _evolve(out[i], state="forgotten", opted_in=False, updated_at=now or out[i].updated_at)
    return out


def auto_decision_notice(rule: Rule, *, run_id: str, item: str | None = None) -> str:
    """The information sent when a rule decided alone (an automatic decision is never silent)."""
    s = rule.situation
    where = f"{s.workflow}/{s.agent}" + (f" ({item})" if item else "")
    return (
        f"ambient decided {rule.option!r} for {where} in run {run_id} by learned rule {rule.id} "
        f"({s.signal}: {s.signature}); you chose the same {rule.agreements} times in a row. "
        f"To stop it: ambient rules forget {rule.id}"
    )


def shadow_hint(rule: Rule, policy: Policy) -> str:
    """One line for an escalation message: what the rule would choose and why it does not decide."""
    needed = agreements_needed(rule, policy.promote_after)
    if rule.situation.signal in NEVER_ALONE:
        why = f"never alone: a {rule.situation.signal.lower()} question is always yours"
    elif rule.lost_standing:
        why = f"it {rule.lost_standing}: back in shadow, {min(rule.agreements, needed)}/{needed} agreements"
    elif not rule.situation.distinct and rule.situation.signal not in NEVER_ALONE:
        why = f"never alone: no distinguishing words, {rule.agreements} agreements"
    elif rule.option in NEVER_ALONE_OPTIONS:
        why = "never alone: a command pattern is yours to accept"
    elif may_auto_decide(rule, policy):
        why = "opted in"
    elif rule.state == "active":
        why = f"active, not opted in: ambient rules accept {rule.id}"
    else:
        why = f"in shadow, {rule.agreements}/{needed} agreements"
    return f"learned rule {rule.id} would choose {rule.option!r} ({why})"


#: Automatic decisions on one item of one run before it goes to the person (``learning.auto_repeats``).
DEFAULT_AUTO_REPEATS = 3
#: The wait before the second automatic decision on an item, doubled at each next one (``learning.backoff_s``).
DEFAULT_BACKOFF_S = 5.0


def auto_repeat_delay(previous: int, *, bound: int, backoff_s: float) -> float | None:
    """How long to wait before a rule decides the same situation of the same item again, after ``previous``
    automatic decisions on it: none the first time, then ``backoff_s`` doubled each time; None once ``bound``
    decisions were taken (the item goes to the person: the rule's answer keeps leading back)."""
    if previous >= bound:
        return None
    return 0.0 if previous == 0 else backoff_s * 2 ** (previous - 1)


def repeat_note(rule: Rule, times: int) -> str:
    """What the rule did, for the person who gets the item back: ``retried 3×, still failing``."""
    did = "retried" if rule.option == "retry" else f"chose {rule.option!r}"
    again = "still failing" if rule.situation.signal in ("FAIL", "ERROR") else "and it came back"
    return f"{did} {times}×, {again}"


def lose_standing(rules: Sequence[Rule], rule_id: str, why: str, now: datetime) -> list[Rule]:
    """A rule whose automatic answer keeps leading back to the same situation goes back to shadow: its agreements
    reset, its per-rule opt-in withdrawn, ``why`` kept (``ambient rules`` shows it) until the person's answers make it
    active again."""
    out = list(rules)
    i = _find(out, rule_id)
    out[i] = _evolve(out[i], state="shadow", agreements=0, opted_in=False, lost_standing=why, updated_at=now)
    return out


def prediction(rules: Sequence[Rule], policy: Policy, situation: Situation, options: Sequence[str]) -> str | None:
    """What a learned rule that does not decide alone would choose, one line shown wherever the person decides
    (the message, ``ambient escalations``, the console, Telegram); None when no rule predicts one of ``options``, or
    when the rule decides alone (then there is nothing to decide)."""
    rule = predict(rules, situation)
    if rule is None or rule.option not in options or may_auto_decide(rule, policy, options=options):
        return None
    return shadow_hint(rule, policy)


def standing_note(rule: Rule) -> str | None:
    """Why a rule cannot decide alone whatever the opt-in, for ``ambient rules``: it lost its standing, or its
    situation has no words of its own; None otherwise."""
    if rule.state == "forgotten":
        return None
    if rule.situation.signal in NEVER_ALONE:
        return f"{rule.id}: never decides alone: a {rule.situation.signal.lower()} question is always yours"
    if rule.lost_standing:
        return f"{rule.id}: it {rule.lost_standing}: back in shadow until you agree with it again"
    if not rule.situation.distinct and rule.situation.signal not in NEVER_ALONE:
        return (
            f"{rule.id}: never decides alone: no distinguishing words in its situation "
            f"({rule.situation.signature!r}; the agent stated no error)"
        )
    if rule.option in NEVER_ALONE_OPTIONS:
        return f"{rule.id}: never decides alone: {rule.option} grants a command pattern, which only you accept"
    return None
