"""``ambient rules``: the learned rules (state, agreements, uses), accept / forget one, and the
opt-in that lets active rules decide alone (per workflow or globally)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ambient.cli._common import EXIT_OK, add_command, brain_dir, fail, out, out_json, say
from ambient.core.terminal import one_line

if TYPE_CHECKING:  # imported in the handlers, so that other commands start fast
    from ambient.learning.rules import Rule, RuleBook
    from ambient.storage.paths import BrainPaths


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


def _paths(args: argparse.Namespace) -> BrainPaths:
    from ambient.storage.paths import BrainPaths

    return BrainPaths(brain_dir(args))


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
    from ambient.actions.rules import decides_alone, policy_line, read_rules

    book, problems = read_rules(_paths(args))
    for p in problems:
        say(f"warning: {p}")
    if getattr(args, "json", False):
        data = book.model_dump(mode="json", by_alias=True)
        for r, rule in zip(data["rules"], book.rules, strict=True):
            r["decides_alone"] = decides_alone(rule, book)
        out_json(data)
        return EXIT_OK
    out(policy_line(book))
    if not book.rules:
        out("No learned rules yet: each escalation you answer becomes a candidate rule (in shadow).")
        return EXIT_OK
    header = ["ID", "STATE", "AGREE", "DISAGREE", "USES", "DECIDES", "WORKFLOW/AGENT", "SIGNAL", "OPTION", "SITUATION"]
    rows = [header] + [_row(r, book) for r in book.rules]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        out("  ".join(c.rjust(widths[i]) if i in (2, 3, 4) else c.ljust(widths[i]) for i, c in enumerate(r)).rstrip())
    out("* = accepted by you. DECIDES = decides alone now (active and opted in).")
    from ambient.learning.rules import standing_note

    for note in filter(None, (standing_note(r) for r in book.rules)):
        out(one_line(note))
    return EXIT_OK


def _accept(args: argparse.Namespace) -> int:
    from ambient.actions.rules import accept_rule

    out(accept_rule(_paths(args), args.id).message)
    return EXIT_OK


def _forget(args: argparse.Namespace) -> int:
    from ambient.actions.rules import forget_rule

    out(forget_rule(_paths(args), args.id).message)
    return EXIT_OK


def _set_optin(args: argparse.Namespace, on: bool) -> int:
    from ambient.actions.rules import read_rules, set_opt_in
    from ambient.cli.status import known_workflow

    def known(name: str) -> bool:  # a rule learned in it, a workflow file or a run of it
        book, _problems = read_rules(_paths(args))
        return any(r.situation.workflow == name for r in book.rules) or known_workflow(brain_dir(args), name)

    if not args.global_ and not known(args.workflow):  # a typo would change nothing
        return fail(
            f"no workflow named {args.workflow!r}: no file in workflows/ and no run of it; "
            "`ambient status` lists the workflows that ran, `ambient validate` the files"
        )
    done = set_opt_in(_paths(args), on, workflow=None if args.global_ else args.workflow)
    out(done.message)
    if done.still_deciding:
        still = done.still_deciding
        out(f"{len(still)} accepted rule(s) still decide alone ({', '.join(still)}): ambient rules forget ID stops one")
    return EXIT_OK


def _optin(args: argparse.Namespace) -> int:
    return _set_optin(args, True)


def _optout(args: argparse.Namespace) -> int:
    return _set_optin(args, False)
