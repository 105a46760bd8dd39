"""The project speaks of itself only: no page, comment, docstring, test or bench output points at a numbered work
session, issue or item of how it was built. Each such mention says what it means instead: a date, a commit, a
benchmark's name, or the behaviour itself. CHANGELOG.md is the history and is exempt."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: Where the project speaks: its pages, its code, its tests, its benchmarks and examples.
WHERE = ("README.md", "ARCHITECTURE.md", "CONTRIBUTING.md", "docs", "src", "tests", "bench", "examples")
SKIP_DIRS = {".venv", "__pycache__", ".screenshots", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
#: The grep of CONTRIBUTING.md, as a regex ("session" alone stays: a Claude session is a session).
MENTION = re.compile(r"session [0-9]+|issue [0-9]+|item [0-9]+|issues? #?[0-9]", re.IGNORECASE)


def _files() -> list[Path]:
    found: list[Path] = []
    for name in WHERE:
        top = REPO / name
        if top.is_file():
            found.append(top)
            continue
        for path in sorted(top.rglob("*")):
            if path.is_file() and not SKIP_DIRS.intersection(path.relative_to(REPO).parts):
                found.append(path)
    return found


def mentions(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of each line that names a numbered session, issue or item."""
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if MENTION.search(line)]


def test_the_rule_finds_what_it_forbids() -> None:
    """The check finds each form it is meant to find, and lets "session" alone and item ids pass."""
    n = "13"  # joined here, so that this file holds no mention itself
    bad = [f"since Session {n}", f"(issue {n}: 0.9)", f"bench/README item {n}", f"see issues #{n}", f"Issue {n}.1: x"]
    assert [len(mentions(b)) for b in bad] == [1] * len(bad)
    good = ["a Claude session resumes", "run-1-item-001.yml", "CPU per item: 751 us", "finding 44", "sessions"]
    assert [mentions(g) for g in good] == [[]] * len(good)


def test_no_numbered_session_issue_or_item_anywhere() -> None:
    """Every text file of the project is free of such mentions (file:line of each one found)."""
    found = []
    for path in _files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a binary file (an image, a compiled module): nothing written for a reader
        found += [f"{path.relative_to(REPO)}:{n}: {line}" for n, line in mentions(text)]
    assert found == [], "say what it means (a date, a commit, a benchmark, the behaviour):\n" + "\n".join(found)
