"""``ambient rules``: the learned rules (state, agreements, uses), accept / forget one, and the
opt-in that lets active rules decide alone (per workflow or globally)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ambient.cli._common import EXIT_OK, add_command, brain_dir, out, out_json, say

if TYPE_CHECKING:  # imported in the handlers, so that other commands start fast
    from ambient.learning.rules import Rule, RuleBook


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient rules`` and its subcommands."""
    p = add_command(sub, "rules", _list, "learned rules: list, accept, forget, opt in or out of automatic decisions")
    p.add_argument("--json", action="store_true", help="print the rules as JSON")
    rsub = p.add_subparsers(dest="rules_command", metavar="SUBCOMMAND")
    lp = add_command(rsub, "list", _list, "list the rules with their state, agreements and uses (the default)")
    lp.add_argument("--json", action="store_true", help="print the rules as JSON")
    ap = add_command(rsub, "accept", _accept, "opt one rule in: it decides alone once active")
    ap.add_argument("id", metavar="ID", help="rule id (or a unique prefix)")
    fp = add_command(rsub, "forget", _forget, "stop using one rule (kept as a record; accept brings it back)")
    fp.add_argument("id", metavar="ID", help="rule id (or a unique prefix)")
    for name, func, text in (
        ("optin", _optin, "let active rules decide alone in a workflow or everywhere"),
        ("optout", _optout, "stop active rules from deciding alone in a workflow or everywhere"),
    ):
        op = add_command(rsub, name, func, text)
        group = op.add_mutually_exclusive_group(required=True)
        group.add_argument("--workflow", metavar="W", help="this workflow only")
        group.add_argument("--global", dest="global_", action="store_true", help="every workflow")


def _policy_line(book: RuleBook) -> str:
    ad = book.auto_decide
    if ad.global_:
        scope = "on in every workflow"
    elif ad.workflows:
        scope = "on in " + ", ".join(ad.workflows)
    else:
        scope = "off (opt in: ambient rules optin --workflow W | --global, or accept a rule)"
    excl = f"; never in {', '.join(ad.exclude)}" if ad.exclude else ""
    return f"automatic decisions: {scope}{excl}; a rule becomes active after {book.promote_after} agreements"


def _path(args: argparse.Namespace) -> Path:
    from ambient.learning.rulestore import rules_path
    from ambient.storage.paths import BrainPaths

    return rules_path(BrainPaths(brain_dir(args)))


def _row(rule: Rule, book: RuleBook) -> list[str]:
    from ambient.learning.rules import may_auto_decide

    s = rule.situation
    decides = "yes" if may_auto_decide(rule, book.policy) else "no"
    return [
        rule.id,
        rule.state + ("*" if rule.opted_in else ""),
        str(rule.agreements),
        str(rule.disagreements),
        str(rule.uses),
        decides,
        f"{s.workflow}/{s.agent}",
        s.signal,
        rule.option,
        s.signature[:60],
    ]


def _list(args: argparse.Namespace) -> int:
    from ambient.learning.rules import find_rule, may_auto_decide
    from ambient.learning.rulestore import load_rules

    book, problems = load_rules(_path(args))
    for p in problems:
        say(f"warning: {p}")
    if getattr(args, "json", False):
        data = book.model_dump(mode="json", by_alias=True)
        for r in data["rules"]:
            r["decides_alone"] = may_auto_decide(find_rule(book.rules, r["id"]), book.policy)
        out_json(data)
        return EXIT_OK
    out(_policy_line(book))
    if not book.rules:
        out("No learned rules yet: each escalation you answer becomes a candidate rule (in shadow).")
        return EXIT_OK
    header = ["ID", "STATE", "AGREE", "DISAGREE", "USES", "DECIDES", "WORKFLOW/AGENT", "SIGNAL", "OPTION", "SITUATION"]
    rows = [header] + [_row(r, book) for r in book.rules]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        out("  ".join(c.rjust(widths[i]) if i in (2, 3, 4) else c.ljust(widths[i]) for i, c in enumerate(r)).rstrip())
    out("* = accepted by you. DECIDES = decides alone now (active and opted in).")
    return EXIT_OK


def _accept(args: argparse.Namespace) -> int:
    from ambient.core.clock import utcnow
    from ambient.learning.rules import accept, find_rule, may_auto_decide
    from ambient.learning.rulestore import update_rules

    path = _path(args)
    now = utcnow()

    def change(book: RuleBook) -> RuleBook:
        return book.with_rules(accept(book.rules, args.id, now=now, promote_after=book.promote_after))

    book = update_rules(path, change)
    rule = find_rule(book.rules, args.id)
    if may_auto_decide(rule, book.policy):
        out(f"rule {rule.id} accepted: it now decides {rule.option!r} alone (each decision is reported to you)")
    elif rule.situation.workflow in book.auto_decide.exclude:
        out(f"rule {rule.id} accepted, but workflow {rule.situation.workflow} is opted out: it will not decide alone")
    else:
        out(
            f"rule {rule.id} accepted: it decides alone once active "
            f"({rule.agreements}/{book.promote_after} agreements so far, state {rule.state})"
        )
    return EXIT_OK


def _forget(args: argparse.Namespace) -> int:
    from ambient.core.clock import utcnow
    from ambient.learning.rules import find_rule, forget
    from ambient.learning.rulestore import update_rules

    path = _path(args)
    now = utcnow()
    book = update_rules(path, lambda b: b.with_rules(forget(b.rules, args.id, now=now)))
    rule = find_rule(book.rules, args.id)
    out(f"rule {rule.id} forgotten: it no longer predicts or decides (ambient rules accept {rule.id} undoes this)")
    return EXIT_OK


def _set_optin(args: argparse.Namespace, on: bool) -> int:
    from ambient.learning.rules import AutoDecide, may_auto_decide
    from ambient.learning.rulestore import update_rules

    path = _path(args)

    def change(book: RuleBook) -> RuleBook:
        ad = book.auto_decide
        workflows, exclude, global_ = list(ad.workflows), list(ad.exclude), ad.global_
        if args.global_:
            global_ = on
            if on:
                exclude = []
            else:
                workflows = []
        elif on:
            workflows = [*(w for w in workflows if w != args.workflow), args.workflow]
            exclude = [w for w in exclude if w != args.workflow]
        else:
            workflows = [w for w in workflows if w != args.workflow]
            exclude = [*(w for w in exclude if w != args.workflow), args.workflow]
        policy = {"global": global_, "workflows": workflows, "exclude": exclude}
        return book.with_policy(AutoDecide.model_validate(policy))

    book = update_rules(path, change)
    out(_policy_line(book))
    still = [r.id for r in book.rules if may_auto_decide(r, book.policy)]
    if not on and still:
        out(f"{len(still)} accepted rule(s) still decide alone ({', '.join(still)}): ambient rules forget ID stops one")
    return EXIT_OK


def _optin(args: argparse.Namespace) -> int:
    return _set_optin(args, True)


def _optout(args: argparse.Namespace) -> int:
    return _set_optin(args, False)
