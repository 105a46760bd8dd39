"""Persistence of learned rules and the opt-in policy: ``.ambient/rules.yml``, written atomically.

Loading never raises on bad content: each problem is reported with its line and the rest loads.
A file with problems is never overwritten (:func:`update_rules` refuses), so a hand edit gone
wrong is not lost; read-modify-write cycles of the daemon and the CLI are serialised by a lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ambient.core.errors import InputError, YamlError
from ambient.core.problems import Problem
from ambient.human.escalations import Escalation
from ambient.learning.rules import Rule, RuleBook, Situation, prediction, situation_of
from ambient.storage.fsutil import PRIVATE_FILE, atomic_write, open_private, private_dir
from ambient.storage.paths import BrainPaths
from ambient.storage.yamlfile import LineMap, dump_yaml, load_file, problems_from_validation

RULES_FILENAME = "rules.yml"
LOCK_FILENAME = "rules.lock"
MAX_RULES_BYTES = 8 * 1024 * 1024  # ~1 KiB per rule: thousands of rules

_HEADER = (
    "# ambient learned rules and the opt-in to let them decide (managed by `ambient rules`).\n"
    "# state: shadow (predicts, you decide) | active (enough agreements) | forgotten.\n"
    "# A rule decides alone only when active AND opted in (accepted, or its workflow / global opt-in).\n"
)


def rules_path(paths: BrainPaths) -> Path:
    """Where the rules of a brain live."""
    return paths.state / RULES_FILENAME


def load_rules(path: Path) -> tuple[RuleBook, list[Problem]]:
    """The rule book in ``path`` and the problems met; a missing file is an empty book.

    A bad policy falls back to the defaults (auto-decide off), a bad rule is skipped; each is
    a problem naming the line. An unreadable file gives an empty book and one problem.
    """
    name = str(path)
    if not path.exists():
        return RuleBook(), []
    try:
        data, lines = load_file(path, max_bytes=MAX_RULES_BYTES)
    except (YamlError, InputError) as exc:
        return RuleBook(), [Problem(file=exc.file or name, line=exc.line, message=exc.message)]
    if data is None:
        return RuleBook(), []
    if not isinstance(data, dict):
        msg = "must be a mapping with promote_after, auto_decide and rules"
        return RuleBook(), [Problem(file=name, line=1, message=msg)]
    problems: list[Problem] = []
    head = {k: v for k, v in data.items() if k != "rules"}
    try:
        book = RuleBook.model_validate(head)
    except ValidationError as exc:
        problems.extend(problems_from_validation(exc, file=name, lines=lines))
        book = RuleBook()
    raw_rules = data.get("rules") or []
    if not isinstance(raw_rules, list):
        problems.append(Problem(file=name, line=lines.line_for(("rules",)), message="rules: expected a list of rules"))
        raw_rules = []
    rules = _load_rules(raw_rules, name, lines, problems)
    return book.with_rules(rules), problems


def _load_rules(raw: list[Any], name: str, lines: LineMap, problems: list[Problem]) -> list[Rule]:
    rules: list[Rule] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        try:
            rule = Rule.model_validate(item)
        except ValidationError as exc:
            for err in exc.errors(include_url=False):
                loc = tuple(p for p in err["loc"] if isinstance(p, str | int))
                where = ".".join(str(p) for p in loc) or "(rule)"
                line = lines.line_for(("rules", i, *loc))
                msg = f"rules[{i}].{where}: {err['msg']}; rule skipped"
                problems.append(Problem(file=name, line=line, message=msg))
            continue
        if rule.id in seen:
            line = lines.line_for(("rules", i, "id"))
            msg = f"rules[{i}]: duplicate id {rule.id!r}; rule skipped"
            problems.append(Problem(file=name, line=line, message=msg))
            continue
        seen.add(rule.id)
        rules.append(rule)
    return rules


def dump_rules(book: RuleBook) -> str:
    """The YAML text of a rule book (the inverse of :func:`load_rules`)."""
    data = book.model_dump(mode="json", by_alias=True, exclude_none=True)
    return _HEADER + dump_yaml(data)


def save_rules(path: Path, book: RuleBook) -> None:
    """Write the rule book atomically and durably (a decision learned is not lost in a crash)."""
    private_dir(path.parent)
    atomic_write(path, dump_rules(book), mode=PRIVATE_FILE)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # A guard file beside rules.yml, never unlinked (unlinking a flocked file splits waiters).
    private_dir(path.parent)
    fd = open_private(path.with_name(LOCK_FILENAME), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def update_rules(path: Path, change: Callable[[RuleBook], RuleBook]) -> RuleBook:
    """Load, apply ``change``, save, under an exclusive lock; returns the saved book.

    Blocking (flock + fsync): call it through ``asyncio.to_thread`` from the event loop.
    Refuses with :class:`InputError` when the file has problems, so a damaged file is never
    overwritten with what could be read of it.
    """
    with _locked(path):
        book, problems = load_rules(path)
        if problems:
            listing = "; ".join(str(p) for p in problems[:5])
            raise InputError(f"has problems, fix them before ambient changes it: {listing}", file=str(path))
        new = change(book)
        if new != book:
            save_rules(path, new)
        return new


def escalation_situation(esc: Escalation) -> Situation:
    """The situation of a stored escalation (an escalation written before its ``detail`` was kept: its question is
    the closest there is)."""
    detail = esc.detail if esc.detail is not None else esc.question
    return situation_of(esc.workflow, esc.agent, esc.kind, detail=detail, step=esc.step or esc.item)


def handed_back(esc: Escalation, answered: Iterable[Escalation]) -> str | None:
    """The learned rule that decided ``esc``'s situation alone on the same item of the same run before it was asked
    (``answered``: escalations answered so far), if any: its tries came back (the bound, or the rule stopped
    meanwhile), and the person's answer says what to do after them, not instead of them. It teaches the rule nothing:
    counted as a disagreement, a retry learned from every other night would need twice the agreements again."""
    where = esc.item or esc.step
    situation = escalation_situation(esc)
    for other in answered:
        if (
            other.id != esc.id
            and other.channel == "rule"
            and other.run_id == esc.run_id
            and (other.item or other.step) == where
            and escalation_situation(other) == situation
        ):
            return (other.by or "rule:?").removeprefix("rule:")
    return None


def escalation_predictions(path: Path, escs: Iterable[Escalation]) -> dict[str, str]:
    """What a learned rule would choose for each pending escalation (:func:`ambient.learning.rules.prediction`), by
    escalation id, from the rules file at ``path`` (read once); those without a prediction are absent."""
    pending = [e for e in escs if e.status == "pending"]
    if not pending or not path.exists():
        return {}
    book, _ = load_rules(path)
    out: dict[str, str] = {}
    for esc in pending:
        line = prediction(book.rules, book.policy, escalation_situation(esc), [o.key for o in esc.options])
        if line is not None:
            out[esc.id] = line
    return out


def escalation_prediction(path: Path, esc: Escalation) -> str | None:
    """What a learned rule would choose for one pending escalation; None without one."""
    return escalation_predictions(path, [esc]).get(esc.id)
