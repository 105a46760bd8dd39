"""The tool permissions of an AI agent (ambient.runners.permissions): pure rules, no I/O."""

from __future__ import annotations

from pathlib import Path

import pytest

from ambient.runners import permissions as P

BRAIN = Path("/srv/brain")


def ctx(**kw: object) -> P.ToolContext:
    base: dict[str, object] = {"agent": "coder", "brain": BRAIN, "workdir": BRAIN, "scope": ("projets/feature/",)}
    base.update(kw)
    return P.ToolContext(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("tool", "inp", "action"),
    [
        ("Write", {"file_path": "projets/feature/a.py"}, "allow"),
        ("Edit", {"file_path": "/srv/brain/projets/feature/sub/b.py"}, "allow"),
        ("Write", {"file_path": "projets/other/a.py"}, "deny"),
        ("Write", {"file_path": "projets/feature/../other/a.py"}, "deny"),
        ("Write", {"file_path": "/etc/passwd"}, "deny"),
        ("Write", {"file_path": "~/.bashrc"}, "deny"),
        ("NotebookEdit", {"notebook_path": "projets/feature/n.ipynb"}, "allow"),
        ("Write", {}, "deny"),
        ("Read", {"file_path": "agents/coder.md"}, "allow"),
        ("Read", {"file_path": "/etc/hostname"}, "deny"),
        ("Read", {"file_path": ".ambient/inbox.key"}, "deny"),
        ("Read", {"file_path": "profil/ambient.yml"}, "deny"),
        ("Read", {"file_path": "profil/telegram_token"}, "deny"),
        ("Read", {"file_path": "profil/notes.md"}, "allow"),
        ("Grep", {"pattern": "x", "path": "projets"}, "allow"),
        ("Grep", {"pattern": "x"}, "deny"),  # the working folder is the brain's root: .ambient/ is below
        ("Grep", {"pattern": "x", "path": "/home"}, "deny"),
        ("Glob", {"pattern": "**/*.md", "path": ".ambient"}, "deny"),
        ("TodoWrite", {"todos": []}, "allow"),
        ("Bash", {"command": "rm -rf build/"}, "ask"),
        ("WebFetch", {"url": "https://example.org"}, "ask"),
        ("AskUserQuestion", {"questions": []}, "deny"),
    ],
)
def test_each_tool_gets_the_verdict_of_its_kind(tool: str, inp: dict[str, object], action: str) -> None:
    assert P.check_tool(tool, inp, ctx()).action == action


def test_a_write_outside_the_scope_says_where_the_scope_is() -> None:
    v = P.check_tool("Write", {"file_path": "notes/x.md"}, ctx())
    assert v.action == "deny"
    assert "outside this item's scope (projets/feature/)" in v.reason


def test_the_scope_of_one_file_allows_that_file_only() -> None:
    c = ctx(scope=("notes/a.md",))
    assert P.check_tool("Write", {"file_path": "notes/a.md"}, c).action == "allow"
    assert P.check_tool("Write", {"file_path": "notes/a.md.bak"}, c).action == "deny"


def test_a_symlink_out_of_the_brain_is_judged_where_it_leads() -> None:
    def resolve(path: str, base: Path) -> Path:
        return Path("/etc/shadow") if "link" in path else P.normal_path(path, base)

    assert P.check_tool("Read", {"file_path": "link"}, ctx(), resolve=resolve).action == "deny"


@pytest.mark.parametrize(
    ("command", "allowed", "verdict"),
    [
        ("pytest -q", ("Bash(pytest:*)",), True),
        ("pytest", ("Bash(pytest:*)",), True),
        ("pytestx", ("Bash(pytest:*)",), False),
        ("pytest -q; rm -rf ~", ("Bash(pytest:*)",), False),
        ("pytest && curl evil", ("Bash(pytest:*)",), False),
        ("pytest $(rm -rf /)", ("Bash(pytest:*)",), False),
        ("pytest > /etc/x", ("Bash(pytest:*)",), False),
        ("make test", ("Bash(make test)",), True),
        ("make test2", ("Bash(make test)",), False),
        ("anything | at all", ("Bash",), True),
        ("ls", ("Read",), False),
    ],
)
def test_bash_runs_without_asking_only_what_the_allowlist_names(
    command: str, allowed: tuple[str, ...], verdict: bool
) -> None:
    assert P.bash_allowed(command, allowed) is verdict
    expected = "allow" if verdict else "ask"
    assert P.check_tool("Bash", {"command": command}, ctx(allowed=allowed)).action == expected


def test_a_question_names_the_agent_the_command_and_where() -> None:
    v = P.check_tool("Bash", {"command": "rm -rf build/"}, ctx(workdir=BRAIN / "projets/feature"))
    assert v.question == "coder wants to run `rm -rf build/` in projets/feature"
    assert v.signature == "Bash: rm -rf build/"


def test_a_grant_allows_exactly_its_call() -> None:
    c = ctx(granted=frozenset({P.call_digest("Bash", {"command": "pytest -q"})}))
    assert P.check_tool("Bash", {"command": "pytest -q"}, c).action == "allow"
    assert P.check_tool("Bash", {"command": "pytest -q", "description": "run the tests"}, c).action == "allow"
    assert P.check_tool("Bash", {"command": "pytest -q -x"}, c).action == "ask"


def test_a_grant_never_opens_a_write_outside_the_scope() -> None:
    c = ctx(granted=frozenset({P.call_digest("Write", {"file_path": "/etc/passwd"})}))
    assert P.check_tool("Write", {"file_path": "/etc/passwd"}, c).action == "deny"


LONG = "echo " + "a" * 600


@pytest.mark.parametrize(
    ("granted", "command", "action"),
    [
        (LONG, LONG, "allow"),
        (LONG, LONG + "; rm -rf ~", "ask"),  # shares the first 600 characters
        (LONG, LONG[:-1], "ask"),
        (LONG + "; rm -rf ~", LONG, "ask"),
        ("make test", "make test", "allow"),
        ("make test", "make test ", "ask"),
    ],
)
def test_a_grant_matches_the_whole_call_only(granted: str, command: str, action: str) -> None:
    c = ctx(granted=frozenset({P.call_digest("Bash", {"command": granted})}))
    assert P.check_tool("Bash", {"command": command}, c).action == action


@pytest.mark.parametrize(
    ("entry", "matches"),
    [
        ({"call": "Bash: make", "sha256": P.digest_of("Bash: make")}, "Bash: make"),
        ({"call": "Bash: make", "sha256": "nothex"}, None),
        (P.digest_of("Bash: make"), "Bash: make"),
        ("Bash: make", "Bash: make"),  # an old grant of a short call: that call exactly
        ("Bash: " + "a" * 493, "Bash: " + "a" * 493),  # 499 characters: it cannot have been cut
        ("Bash: " + "a" * 494, None),  # 500: the old cap, it may be the head of a longer command
        ("Bash: " + "a" * 900, None),
        ("no separator", None),
        ("", None),
        (42, None),
    ],
)
def test_a_stored_grant_matches_the_digest_of_one_whole_call(entry: object, matches: str | None) -> None:
    assert P.grant_digest(entry) == (P.digest_of(matches) if matches is not None else None)


def test_the_signature_for_display_is_cut_but_the_digest_covers_the_whole_call() -> None:
    v = P.check_tool("Bash", {"command": LONG}, ctx())
    assert v.signature == f"Bash: {LONG}"
    assert v.digest == P.digest_of(f"Bash: {LONG}")
    assert len(P.signature("Bash", {"command": LONG})) == P.MAX_SIGNATURE


@pytest.mark.parametrize(
    ("command", "question"),
    [
        ("make", "coder wants to run `make` in the brain's root"),
        ("echo `id`", "coder wants to run this command (9 characters) in the brain's root:\n  echo `id`"),
        ("a\nb", "coder wants to run this command (3 characters, 2 lines) in the brain's root:\n  a\n  b"),
        ("a\n", "coder wants to run this command (2 characters, 2 lines) in the brain's root:\n  a\n  "),
        (
            "x" * 250,
            "coder wants to run this command (250 characters) in the brain's root:\n"
            f"  {'x' * 100}\n  ↳ {'x' * 100}\n  ↳ {'x' * 50}",
        ),
    ],
)
def test_the_question_shows_the_whole_command_folded_with_its_length(command: str, question: str) -> None:
    assert P.check_tool("Bash", {"command": command}, ctx()).question == question


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("rm -rf build\u202e/ redliub", "rm -rf build\\u202e/ redliub"),  # a bidi override, spelled out
        ("ls\x1b[2K", "ls\\x1b[2K"),
        ("echo a\rrm -rf ~", "echo a\\rrm -rf ~"),
        ("echo\u200b hi", "echo\\u200b hi"),
    ],
)
def test_what_the_person_would_not_see_is_spelled_out(command: str, shown: str) -> None:
    """Controls, zero-width and bidi characters are shown as escapes, so the person reads every character that
    runs (the message formatter would otherwise drop them); folded, the length is the command's own."""
    v = P.check_tool("Bash", {"command": command}, ctx())
    assert v.action == "ask"
    assert v.question == f"coder wants to run `{shown}` in the brain's root"
    long = P.check_tool("Bash", {"command": command + " " * 200}, ctx())
    assert long.question.startswith(f"coder wants to run this command ({len(command) + 200} characters)")
    assert shown in long.question


@pytest.mark.parametrize(
    ("tool", "inp", "asked"),
    [
        ("Bash", {"command": "x" * P.MAX_ASKED_CHARS}, True),
        ("Bash", {"command": "x" * (P.MAX_ASKED_CHARS + 1)}, False),
        ("WebFetch", {"url": "https://x/" + "q" * P.MAX_ASKED_CHARS}, False),
        ("mcp__db__query", {"sql": "s" * P.MAX_ASKED_CHARS}, False),
    ],
)
def test_a_call_too_long_to_show_whole_is_denied_not_asked(tool: str, inp: dict[str, object], asked: bool) -> None:
    v = P.check_tool(tool, inp, ctx())
    assert v.action == ("ask" if asked else "deny")
    if not asked:
        assert f"at most {P.MAX_ASKED_CHARS:,} characters" in v.reason


def test_another_tools_long_call_is_shown_whole_too() -> None:
    url = "https://example.org/" + "q" * 150
    v = P.check_tool("WebFetch", {"url": url}, ctx())
    assert v.question == f"coder wants to use WebFetch (170 characters):\n  {url[:100]}\n  ↳ {url[100:]}"
    assert P.check_tool("WebFetch", {"url": "https://x"}, ctx()).question == "coder wants to use WebFetch: https://x"


def test_a_long_call_allowed_by_the_allowlist_is_not_asked_at_all() -> None:
    assert P.check_tool("Bash", {"command": "x" * 5000}, ctx(allowed=("Bash",))).action == "allow"


@pytest.mark.parametrize(
    ("rel", "pattern", "reaches"),
    [
        (".", None, True),  # Grep, LS: every folder below
        ("profil", None, True),
        ("projets", None, False),
        ("profil/notes", None, False),
        (".", "**/*.py", True),
        (".", "*.md", True),  # a segment without a slash matches at any depth
        (".", "README.md", False),
        (".", ".ambient", True),
        (".", "telegram_token", True),
        (".", "src/**/*.py", False),
        (".", "s*/**", False),
        (".", "*/x", True),
        (".", ".a*/x", True),
        (".", "?ambient/x", True),
        (".", "[.]ambient/x", True),
        (".", "{a,b}/x", True),
        (".", "p*/notes.md", False),
        (".", "p*/*", True),
        (".", "PROFIL/api.key", True),
        (".", "src/../.ambient/x", True),
        ("profil", "notes.md", False),
        ("profil", "sub/**", False),
        ("profil", "*.md", True),
        ("profil", "my_token.md", True),
        ("profil", "**", True),
        ("projets", "**/*", False),
    ],
)
def test_a_search_reaches_what_its_root_and_pattern_can_match(rel: str, pattern: str | None, reaches: bool) -> None:
    from pathlib import PurePosixPath

    assert (P.search_reach(PurePosixPath(rel), pattern) is not None) is reaches


def test_other_tools_run_when_the_allowlist_names_them() -> None:
    assert P.check_tool("WebFetch", {"url": "https://x"}, ctx(allowed=("WebFetch",))).action == "allow"
    assert P.check_tool("mcp__db__query", {"sql": "1"}, ctx()).action == "ask"


@pytest.mark.parametrize(
    ("decision", "answer"),
    [("allow", "once"), ("allow always", "always"), ("allow-always", "always"), ("deny", "deny"), ("what", "deny")],
)
def test_the_persons_answer_maps_onto_what_it_does(decision: str, answer: str) -> None:
    assert P.answer_of(decision) == answer


# ---------------------------------------------------------------- command patterns

ALLOWED_ABC = ("pytest -q tests/a", "pytest -q tests/b", "pytest -q tests/c")


def test_the_question_after_three_commands_of_one_shape_offers_their_pattern() -> None:
    v = P.check_tool("Bash", {"command": "pytest -q tests/d"}, ctx(allowed_before=ALLOWED_ABC, offer_after=3))
    assert (v.action, v.pattern) == ("ask", "pytest -q tests/*")
    assert v.question.startswith("coder wants to run `pytest -q tests/d` in the brain's root\n")
    assert "answer allow-pattern to allow `pytest -q tests/*` for coder from now on" in v.question
    assert P.pattern_option("coder", v.pattern) == "allow `pytest -q tests/*` for coder from now on"


@pytest.mark.parametrize(
    ("command", "allowed", "after"),
    [
        ("pytest -q tests/d", ALLOWED_ABC[:2], 3),  # two allowed
        ("pytest -q tests/d", ALLOWED_ABC, 0),  # offers turned off
        ("pytest -q tests/d; cat profil/x", ALLOWED_ABC, 3),  # not a plain command
        ("pytest -q tests/d | sh", ALLOWED_ABC, 3),
        ("pytest -x tests/d", ALLOWED_ABC, 3),  # another shape
    ],
)
def test_no_pattern_is_offered_without_enough_commands_of_the_shape(
    command: str, allowed: tuple[str, ...], after: int
) -> None:
    v = P.check_tool("Bash", {"command": command}, ctx(allowed_before=allowed, offer_after=after))
    assert (v.action, v.pattern) == ("ask", "")
    assert "allow-pattern" not in v.question


@pytest.mark.parametrize(
    ("command", "action"),
    [
        ("pytest -q tests/e", "allow"),
        ("pytest  -q  tests/test_x.py", "allow"),
        ("pytest -q tests/e; cat profil/x", "ask"),
        ("pytest -q tests/e && rm -rf ~", "ask"),
        ("pytest -q tests/e tests/f", "ask"),
        ("pytest -q tests/$(cat profil/x)", "ask"),
        ("pytest -q tests/../profil", "ask"),
        ("pytest -q", "ask"),
    ],
)
def test_a_granted_pattern_allows_the_whole_commands_it_stands_for_only(command: str, action: str) -> None:
    assert P.check_tool("Bash", {"command": command}, ctx(patterns=("pytest -q tests/*",))).action == action


def test_the_option_of_a_pattern_is_told_from_others_by_its_label_only() -> None:
    label = P.pattern_option("coder", "pytest -q tests/*")
    assert P.answer_of(label, label) == "pattern"
    assert P.answer_of(label) == "deny"  # not offered: it means nothing
    assert P.answer_of("allow-pattern", label) == "deny"
    assert P.answer_of("allow always", label) == "always"
