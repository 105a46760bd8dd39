"""The documentation's own promises: the README's five-minute tour as written, the examples of docs/ that a reader
copies, and links and paths that lead somewhere. (The commands and settings the docs name are checked by
test_cli.py and test_configuration.py, the demo by test_readme_intro.py.)"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from tests.acceptance.harness import DOCS, REPO, Brain, ambient, docs_section

#: Every page a reader may open from the README.
PAGES = (*DOCS, REPO / "ARCHITECTURE.md", REPO / "CHANGELOG.md", REPO / "CONTRIBUTING.md")
#: The README's second command: the whole suite on a fresh clone, with the pinned test dependencies.
TEST_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -q -c constraints.txt -e '.[test,claude,llm,cluster]'"
    " && .venv/bin/python -m pytest -q -n 3"
)

#: The commands of the tour, in the order it gives them (an id stands for the one `ambient escalations` shows).
TOUR = [
    "init ~/brain",
    "validate",
    "run --until-idle",
    "runs",
    "run",
    "status ship",
    "escalations",
    "decide ID approve",
    "runs",
    "stats",
    "thread hello",
]


def _blocks(section: str, lang: str) -> list[str]:
    """The fenced code blocks of ``lang`` in a section, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```", section, re.M | re.S)


def _tour_commands(section: str) -> list[str]:
    """The ``ambient`` commands of the tour's bash blocks, without their comments, ids replaced by ``ID``."""
    commands = []
    for block in _blocks(section, "bash"):
        for line in block.splitlines():
            typed = re.split(r"\s+#", line, maxsplit=1)[0]
            for part in typed.split(" && "):
                if part.startswith("ambient "):
                    commands.append(re.sub(r"\besc-[a-z0-9]+\b", "ID", part.removeprefix("ambient ").strip()))
    return commands


def test_the_five_minute_tour_as_written(tmp_path: Path) -> None:
    """The README's tour, command by command: `ambient init` makes a brain whose example runs alone; a chain dropped
    into the running daemon stops at its `gate: human`, `ambient decide ID approve` finishes it; runs, stats and the
    agent's thread show what happened."""
    tour = docs_section("A five-minute tour")
    assert _tour_commands(tour) == TOUR
    [workflow] = _blocks(tour, "yaml")
    name = re.match(r"# (workflows/\S+\.yml)\n", workflow)
    assert name is not None, workflow

    root = tmp_path / "brain"
    brain = Brain.init(root)  # `ambient init ~/brain && cd ~/brain`: every command below runs in the brain
    assert ambient("validate", cwd=root).rc == 0
    assert ambient("run", "--until-idle", cwd=root).rc == 0
    [hello] = [line for line in ambient("runs", cwd=root).out.splitlines() if " hello " in line]
    assert re.search(r"\bsuccess\s+3/3 items done\s+escalations=0 failed=0 errors=0\b", hello), hello

    with brain.daemon() as daemon:
        brain.write(name[1], workflow)  # dropped while the daemon runs
        [esc] = brain.wait_escalation("the gate of step 2", where=lambda e: e["workflow"] == "ship")
        status = ambient("status", "ship", cwd=root)
        assert status.rc == 0 and "1/2 done" in status.out and "1 waiting on you" in status.out, status
        assert f"ambient decide {esc['id']} <option>" in status.out, status
        listed = ambient("escalations", cwd=root)
        assert esc["id"] in listed.out and "1) approve" in listed.out, listed
        assert ambient("decide", esc["id"], "approve", cwd=root).rc == 0
        brain.wait_finished("ship")
        daemon.signal(signal.SIGINT)  # Ctrl-C
        assert daemon.proc is not None and daemon.proc.wait(timeout=60) == 0

    [ship] = [line for line in ambient("runs", cwd=root).out.splitlines() if " ship " in line]
    assert re.search(r"\bsuccess\s+2/2 steps done\s+escalations=1\b", ship), ship
    stats = ambient("stats", cwd=root)
    assert stats.rc == 0 and re.search(r"^ship\s+1\s+100\.0%", stats.out, re.M), stats
    thread = ambient("thread", "hello", cwd=root)
    assert thread.rc == 0 and "SPAWN" in thread.out and "RETURN" in thread.out, thread


def test_the_claude_agent_example_is_an_agent_a_workflow_may_spawn(brain: Brain) -> None:
    """The Claude agent of "Running AI agents", copied as it is into `agents/`, declares its gate: `ambient validate`
    accepts a workflow that spawns it (an agent without a gate receives nothing)."""
    pytest.importorskip("claude_agent_sdk", reason="the claude extra (pip install 'ambient[claude]') is not installed")
    [agent] = [b for b in _blocks(docs_section("Running AI agents"), "yaml") if b.startswith("---\nname: reviewer\n")]
    brain.write("agents/reviewer.md", agent)
    brain.workflow(
        "review",
        """
        workflow: review
        for_each:
          items: [change-1]
          spawn: reviewer
          scope: {zone: project, files: ["notes/{{item}}.md"]}
        """,
    )
    checked = brain.cli("validate")
    assert checked.rc == 0 and "0 warning(s)" in checked.out, checked


def _slug(title: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return {_slug(title) for title in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_every_relative_link_and_path_leads_somewhere() -> None:
    """Every relative link of the README, docs/, ARCHITECTURE.md and CHANGELOG.md points at a file that exists (and at
    a heading of it, for a link with an anchor), and every path of the repository they quote in backticks exists."""
    broken = []
    for page in PAGES:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            rel, _, anchor = target.partition("#")
            dest = (page.parent / rel).resolve() if rel else page
            if not dest.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and dest.is_file() and anchor not in _anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
        for quoted in re.findall(r"`((?:tests|bench|examples|docs)/[\w./-]+)`", text):
            if not (REPO / quoted).exists():
                broken.append(f"{page.name}: `{quoted}`")
    assert broken == [], "\n".join(broken)


def test_the_readme_stays_a_front_door() -> None:
    """The README opens with the two commands (the demo, then the tests) and stays short; the reference is in docs/."""
    readme = (REPO / "README.md").read_text()
    first = _blocks(readme, "bash")[0].splitlines()
    assert first[0] == "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/ambient demo"
    assert first[1] == TEST_COMMAND, first
    assert len(readme.splitlines()) <= 160, len(readme.splitlines())
    for page in DOCS[1:]:
        assert f"docs/{page.name}" in readme or page.name == "README.md", page.name
