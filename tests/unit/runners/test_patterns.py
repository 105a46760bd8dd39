"""Command patterns (runners/patterns): derived from the commands a person allowed, matched on the whole command."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambient.runners.patterns import MAX_PATTERN_CHARS, derive, matches, offer, parse, shape, words

DERIVED: list[tuple[list[str], str | None]] = [
    (["pytest -q tests/a", "pytest -q tests/b"], "pytest -q tests/*"),
    (["pytest -q tests/a", "pytest -q tests/b", "pytest -q tests/c"], "pytest -q tests/*"),
    (["pytest tests/test_a.py", "pytest tests/test_bc.py"], "pytest tests/test_*.py"),
    (["touch work/out/a.ran", "touch work/out/b.ran"], "touch work/out/*.ran"),
    (["git log -n 5 src/a", "git log -n 7 src/b"], "git log -n * src/*"),
    (["cp a.txt x/a", "cp b.txt x/a"], "cp *.txt x/a"),
    (["head -n 5 ab", "head -n 5 abc"], "head -n 5 a*"),  # the `*` stands for at least one character of each
    (["pytest -q tests/a", "pytest -q tests/a"], None),  # nothing differs: the exact grant is enough
    (["pytest -q tests/a"], None),
    (["pytest -q tests/a", "pytest -x tests/b"], None),  # another option: another shape
    (["pytest -q tests/a", "pytest -q tests/a tests/b"], None),  # more words: another shape
    (["pytest -q tests/a", "make -q tests/b"], None),  # another program
    (["make a", "make b"], None),  # the program alone would be kept
    (["rm -rf a", "rm -rf b"], None),  # the program and an option alone
    (["pytest -q tests/a", "pytest -q tests/b; rm -rf ~"], None),  # not a plain command
    (["cat tests/a", "cat tests/../../etc/passwd"], None),  # `..` is never generalised
    (["echo 'a'", "echo 'b'"], None),  # quotes
    (["cat /a.txt", "cat b.txt"], None),  # an absolute path and a relative one
    (["cat /var/a.txt", "cat /var/b.txt"], "cat /var/*.txt"),
    (["ls src/*.py", "ls lib/*.py"], None),  # a glob of the shell's
]


@pytest.mark.parametrize(("commands", "pattern"), DERIVED)
def test_derive(commands: list[str], pattern: str | None) -> None:
    assert derive(commands) == pattern


MATCHED: list[tuple[str, str, bool]] = [
    ("pytest -q tests/*", "pytest -q tests/d", True),
    ("pytest -q tests/*", "pytest  -q\ttests/d", True),  # blanks between words do not matter to the shell
    ("pytest -q tests/*", "pytest -q tests/", False),  # `*` stands for at least one character
    ("pytest -q tests/*", "pytest -q tests/d tests/e", False),  # no prefix match: as many words
    ("pytest -q tests/*", "pytest -q tests/d; cat profil/x", False),
    ("pytest -q tests/*", "pytest -q tests/d;cat", False),
    ("pytest -q tests/*", "pytest -q tests/d&&rm", False),
    ("pytest -q tests/*", "pytest -q tests/$(id)", False),
    ("pytest -q tests/*", "pytest -q tests/`id`", False),
    ("pytest -q tests/*", "pytest -q tests/d>out", False),
    ("pytest -q tests/*", "pytest -q tests/d|sh", False),
    ("pytest -q tests/*", "pytest -q tests/d\nrm -rf ~", False),
    ("pytest -q tests/*", "pytest -q 'tests/d'", False),
    ("pytest -q tests/*", "pytest -q tests/../profil", False),
    ("pytest -q tests/*", "pytest -x tests/d", False),
    ("pytest -q tests/*", "pytest -q other/d", False),
    ("touch work/out/*.ran", "touch work/out/e.ran", True),
    ("touch work/out/*.ran", "touch work/out/e.ran.sh", False),
    ("cat *.txt", "cat --help.txt", False),  # a wildcard never stands for an option
    ("cat *.txt", "cat notes.txt", True),
    ("make *", "make all", False),  # not a valid pattern: the program alone
    ("*", "rm -rf /", False),
    ("rm -rf *", "rm -rf x", False),  # not a valid pattern: the program and its options alone
    ("cat *.txt", "cat /etc/notes.txt", False),  # an absolute path only after a `/` of the pattern's own
    ("cat /var/*.txt", "cat /var/notes.txt", True),
    ("pytest -q", "pytest -q", False),  # no wildcard: not a pattern
]


@pytest.mark.parametrize(("pattern", "command", "expected"), MATCHED)
def test_matches(pattern: str, command: str, expected: bool) -> None:
    assert matches(pattern, command) is expected


def test_words_and_shape_of_plain_commands_only() -> None:
    assert words("pytest -q tests/a") == ("pytest", "-q", "tests/a")
    assert words("  ") is None
    assert words("pytest ~/x") is None
    assert words("pytest a\\ b") is None
    assert shape("pytest -q tests/a") == (3, "pytest", ((1, "-q"),))
    assert shape("pytest -q tests/a") == shape("pytest -q tests/zz")
    assert shape("pytest -q tests/a") != shape("pytest -x tests/a")


def test_parse_refuses_patterns_too_broad_or_malformed() -> None:
    assert parse("pytest -q tests/*") == ("pytest", "-q", "tests/*")
    for bad in ("* -q", "make *", "make * *", "pytest -q tests/**", "pytest -*", "pytest ../*", "pytest a;*"):
        assert parse(bad) is None, bad
    assert parse("pytest " + "a" * MAX_PATTERN_CHARS + "*") is None


OFFERS: list[tuple[str, list[str], int, str | None]] = [
    ("pytest -q tests/d", ["pytest -q tests/a", "pytest -q tests/b", "pytest -q tests/c"], 3, "pytest -q tests/*"),
    ("pytest -q tests/d", ["pytest -q tests/a", "pytest -q tests/b"], 3, None),  # two allowed: not yet
    ("pytest -q tests/d", ["pytest -q tests/a"] * 3, 3, None),  # the same command thrice is one
    ("pytest -q tests/a", ["pytest -q tests/a", "pytest -q tests/b", "pytest -q tests/c"], 3, None),  # itself
    ("pytest -q tests/d", ["pytest -q tests/a", "pytest -q tests/b", "pytest -q tests/c"], 0, None),  # off
    # the narrowest pattern that still stands for three: other/x is left out rather than widening to `*`
    (
        "pytest -q tests/d",
        ["pytest -q tests/a", "pytest -q other/x", "pytest -q tests/b", "pytest -q tests/c"],
        3,
        "pytest -q tests/*",
    ),
    (
        "pytest -q tests/d",
        ["pytest -q tests/a", "pytest -q other/x", "pytest -q tests/b"],
        3,
        None,  # `pytest -q *` would keep nothing of what it acts on
    ),
    ("pytest -q tests/d; id", ["pytest -q tests/a", "pytest -q tests/b", "pytest -q tests/c"], 3, None),
    ("pytest -x tests/d", ["pytest -q tests/a", "pytest -q tests/b", "pytest -q tests/c"], 3, None),
    ("pytest -q tests/" + "d" * 400, ["pytest -q tests/a", "pytest -q tests/b", "pytest -q tests/c"], 3, None),
]


@pytest.mark.parametrize(("command", "allowed", "need", "expected"), OFFERS)
def test_offer(command: str, allowed: list[str], need: int, expected: str | None) -> None:
    assert offer(command, allowed, need) == expected


# ---------------------------------------------------------------- properties

_SAFE_CHARS = "abcxyz019_-./:=,+@%"
_word = st.text(alphabet=_SAFE_CHARS, min_size=1, max_size=8).filter(lambda w: not w.startswith("-"))
_META = [";", "&", "|", "$", "`", ">", "<", "(", ")", "\n", "'", '"', "\\", "*", "~", " ; ", "&&", "$(id)"]


@st.composite
def _commands(draw: st.DrawFn) -> list[str]:
    """Two to five commands of one shape: one program, options kept, operands drawn freely."""
    program = draw(st.sampled_from(["pytest", "touch", "git", "ls"]))
    layout = draw(st.lists(st.sampled_from(["-q", "-n", "ARG"]), min_size=1, max_size=4))
    count = draw(st.integers(min_value=2, max_value=5))
    out = []
    for _ in range(count):
        out.append(" ".join([program, *(draw(_word) if slot == "ARG" else slot for slot in layout)]))
    return out


@given(_commands())
def test_a_derived_pattern_matches_every_command_it_was_derived_from(commands: list[str]) -> None:
    pattern = derive(commands)
    if pattern is not None:
        assert parse(pattern) is not None
        for command in commands:
            assert matches(pattern, command), (pattern, command)


@given(_commands(), st.sampled_from(_META), st.integers(min_value=0, max_value=200), st.text(max_size=6))
def test_a_pattern_never_matches_a_command_with_a_metacharacter(
    commands: list[str], meta: str, where: int, more: str
) -> None:
    pattern = derive(commands)
    if pattern is None:
        return
    base = commands[0]
    at = where % (len(base) + 1)
    replaced = base[:at] + meta + base[at + 1 :]  # one character of a matching command turned into shell syntax
    for hostile in (base[:at] + meta + more + base[at:], replaced, base + meta + more, meta + base):
        assert not matches(pattern, hostile), (pattern, hostile)


@given(_commands(), st.text(alphabet=_SAFE_CHARS + " ", min_size=1, max_size=10))
def test_a_pattern_never_matches_a_longer_command(commands: list[str], tail: str) -> None:
    pattern = derive(commands)
    if pattern is None or not tail.strip():
        return
    assert not matches(pattern, commands[0] + " " + tail)


@given(_commands(), st.integers(min_value=1, max_value=4))
def test_an_offer_stands_for_the_command_asked_and_enough_commands_allowed(commands: list[str], need: int) -> None:
    *allowed, asked = commands
    found = offer(asked, allowed, need)
    if found is not None:
        assert matches(found, asked)
        assert sum(matches(found, a) for a in set(allowed) if a != asked) >= need
