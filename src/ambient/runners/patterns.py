"""Command patterns: the broader grant a person may accept once they allowed commands of one shape. Pure.

An exact grant (``allow always``) matches one whole command. When the person allowed an agent several commands that
differ only in their arguments (``pytest -q tests/a``, ``pytest -q tests/b``, ``pytest -q tests/c``), the next
question about a command of that shape also offers a *pattern*, ``pytest -q tests/*``, derived here
(:func:`offer`, :func:`derive`); the person alone accepts it. The rules keep it narrow:

- only a **plain** command takes part (:func:`words`): one simple command whose words are made of letters, digits
  and ``_ - . / : = , + @ %`` only, split on spaces and tabs. A quote, ``;``, ``&``, ``|``, ``$``, a backtick,
  ``<``, ``>``, parentheses, a newline, a backslash, a glob character or ``~`` makes a command no pattern's, matched
  by none and learned from by none;
- a pattern is judged on the **whole** command, word by word (:func:`matches`): as many words, the program and every
  literal word equal, each wildcard word ``prefix*suffix`` standing for one word that starts and ends so, with at
  least one character in between. A ``*`` never spans a space, so nothing can be appended; it never stands for an
  option (a word starting with ``-``), nor for a word holding ``..``, nor for an absolute path unless the pattern's
  word starts with ``/``;
- commands share a **shape** (:func:`shape`) when they have as many words, the same program and the same options at
  the same places: only operands are generalised, each by the longest prefix and suffix its values share;
- a pattern keeps the program and something of what it acts on: ``make *`` or ``rm -rf *`` (the program and its
  options alone) is never offered.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

WILDCARD = "*"
#: The key of the option offering a pattern with a question. Only the person gives it, never a learned rule
#: (``learning.rules.NEVER_ALONE_OPTIONS``) nor a deadline.
ALLOW_PATTERN_KEY = "allow-pattern"
#: How many commands of one shape the person allows an agent before a pattern is offered (``learning.pattern_after``).
DEFAULT_PATTERN_AFTER = 3
#: Longest pattern offered: it is shown whole in the option's label (at most 512 characters) and the question.
MAX_PATTERN_CHARS = 400
_SAFE = re.compile(r"[A-Za-z0-9_\-./:=,+@%]+")
_WILD_WORD = re.compile(r"(?P<prefix>[A-Za-z0-9_\-./:=,+@%]*)\*(?P<suffix>[A-Za-z0-9_\-./:=,+@%]*)")
_BLANKS = re.compile(r"[ \t]+")

Shape = tuple[int, str, tuple[tuple[int, str], ...]]


def words(command: str) -> tuple[str, ...] | None:
    """The words of a plain command (see the module docstring), or None when it is not one."""
    text = command.strip(" \t")
    if not text:
        return None
    found = tuple(_BLANKS.split(text))
    if not all(_SAFE.fullmatch(w) for w in found):
        return None
    return found


def shape(command: str) -> Shape | None:
    """What commands of one shape share: their number of words, their program, their options and where they stand;
    None for a command that is not plain."""
    found = words(command)
    if found is None:
        return None
    return len(found), found[0], tuple((i, w) for i, w in enumerate(found) if i and w.startswith("-"))


def parse(pattern: str) -> tuple[str, ...] | None:
    """The words of a valid pattern, or None: a literal program, literal words and ``prefix*suffix`` words (one
    ``*`` each, never an option), at least one wildcard, and an operand that is not a bare ``*`` (``rm -rf *`` keeps
    nothing of what it acts on)."""
    found = tuple(_BLANKS.split(pattern.strip(" \t"))) if pattern.strip(" \t") else ()
    if len(found) < 2 or not _SAFE.fullmatch(found[0]) or len(pattern) > MAX_PATTERN_CHARS:
        return None
    wild = 0
    for word in found[1:]:
        if _SAFE.fullmatch(word):
            continue
        m = _WILD_WORD.fullmatch(word)
        if m is None or word.startswith("-") or ".." in m.group("prefix") or ".." in m.group("suffix"):
            return None
        wild += 1
    if wild == 0 or all(w == WILDCARD for w in found[1:] if not w.startswith("-")):
        return None
    return found


def _word_matches(pattern_word: str, word: str) -> bool:
    if WILDCARD not in pattern_word:
        return pattern_word == word
    prefix, suffix = pattern_word.split(WILDCARD, 1)
    return (
        not word.startswith("-")
        and (prefix.startswith("/") or not word.startswith("/"))
        and ".." not in word
        and len(word) > len(prefix) + len(suffix)
        and word.startswith(prefix)
        and word.endswith(suffix)
    )


def matches(pattern: str, command: str) -> bool:
    """Whether ``command`` as a whole is one that ``pattern`` stands for (never a prefix of it, never a command
    that is not plain)."""
    pw, cw = parse(pattern), words(command)
    if pw is None or cw is None or len(pw) != len(cw):
        return False
    return all(_word_matches(p, c) for p, c in zip(pw, cw, strict=True))


def _common_prefix(values: Sequence[str]) -> str:
    """The longest text every value starts with (character by character, not path by path)."""
    first, last = min(values), max(values)
    n = 0
    while n < len(first) and first[n] == last[n]:
        n += 1
    return first[:n]


def _generalised(values: Sequence[str]) -> str | None:
    """One word standing for every value: the longest prefix and suffix they share around a ``*`` (which stands for
    at least one character of each), or None when a value is an option or holds ``..``, or when they are not all
    relative or all absolute paths (a ``*`` stands for an absolute path only after a ``/`` of its own)."""
    if any(v.startswith("-") or ".." in v for v in values):
        return None
    shortest = min(len(v) for v in values)
    prefix = _common_prefix(values)[: shortest - 1]
    if any(v.startswith("/") for v in values) and not prefix.startswith("/"):
        return None
    rest = shortest - len(prefix) - 1
    suffix = _common_prefix([v[::-1] for v in values])[:rest][::-1] if rest > 0 else ""
    return f"{prefix}{WILDCARD}{suffix}"


def derive(commands: Iterable[str]) -> str | None:
    """The narrowest pattern that stands for every one of ``commands`` (plain, of one shape, at least two that
    differ): each word they share kept, each other generalised (:func:`_generalised`); None when there is none, or
    when it would keep nothing of the arguments (:func:`parse`)."""
    found = [words(c) for c in commands]
    plain = [w for w in found if w is not None]
    if len(plain) != len(found) or len(set(plain)) < 2:
        return None
    shapes = {shape(" ".join(w)) for w in plain}
    if len(shapes) != 1:
        return None
    out: list[str] = []
    for column in zip(*plain, strict=True):
        values = sorted(set(column))
        if len(values) == 1:
            out.append(values[0])
            continue
        word = _generalised(values)
        if word is None:
            return None
        out.append(word)
    pattern = " ".join(out)
    return pattern if parse(pattern) is not None else None


def _literal_chars(pattern: str) -> int:
    return len(pattern) - pattern.count(WILDCARD)


def offer(command: str, allowed: Iterable[str], need: int) -> str | None:
    """The pattern to offer with the question about ``command``, or None: the narrowest one that stands for
    ``command`` and for at least ``need`` other commands of its shape the person allowed (``allowed``, in any
    order); none when ``need`` is 0 (offers are off), when the person allowed fewer, or when ``command`` is longer
    than :data:`MAX_PATTERN_CHARS` (its question, with the offer, must still fit one message whole)."""
    own = shape(command)
    if need <= 0 or own is None or len(command) > MAX_PATTERN_CHARS:
        return None
    alike = [a for a in dict.fromkeys(allowed) if a.strip(" \t") != command.strip(" \t") and shape(a) == own]
    if len(alike) < need:
        return None
    best: str | None = None
    for other in alike:
        broad = derive([command, other])
        if broad is None:
            continue
        covered = [a for a in alike if matches(broad, a)]
        if len(covered) < need:
            continue
        narrow = derive([command, *covered]) or broad
        key = (_literal_chars(narrow), -narrow.count(WILDCARD), narrow)
        if best is None or key > (_literal_chars(best), -best.count(WILDCARD), best):
            best = narrow
    return best
