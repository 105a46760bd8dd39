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
        ("Grep", {"pattern": "x"}, "allow"),
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
    c = ctx(granted=frozenset({"Bash: pytest -q"}))
    assert P.check_tool("Bash", {"command": "pytest -q"}, c).action == "allow"
    assert P.check_tool("Bash", {"command": "pytest -q -x"}, c).action == "ask"


def test_a_grant_never_opens_a_write_outside_the_scope() -> None:
    sig = P.signature("Write", {"file_path": "/etc/passwd"})
    c = ctx(granted=frozenset({sig}))
    assert P.check_tool("Write", {"file_path": "/etc/passwd"}, c).action == "deny"


def test_other_tools_run_when_the_allowlist_names_them() -> None:
    assert P.check_tool("WebFetch", {"url": "https://x"}, ctx(allowed=("WebFetch",))).action == "allow"
    assert P.check_tool("mcp__db__query", {"sql": "1"}, ctx()).action == "ask"


@pytest.mark.parametrize(
    ("decision", "answer"),
    [("allow", "once"), ("allow always", "always"), ("allow-always", "always"), ("deny", "deny"), ("what", "deny")],
)
def test_the_persons_answer_maps_onto_what_it_does(decision: str, answer: str) -> None:
    assert P.answer_of(decision) == answer
