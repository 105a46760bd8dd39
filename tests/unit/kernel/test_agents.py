"""Loading agents/*.md frontmatter: gates, runners, extras; a bad file is a Problem, the others still load."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from ambient.kernel.agents import (
    GATE_KEY_OF_RULE,
    RUNNER_KEY,
    agent_gates,
    load_agents,
    lookalike,
    read_agents,
    why_absent,
)
from ambient.kernel.matrix import AccessMatrix, decide
from ambient.kernel.packet import Signal
from ambient.storage.paths import BrainPaths
from ambient.storage.yamlfile import MAX_AGENT_BYTES

GOOD = """---
name: {name}
type: agent
context_tier: hot
brain:
  version: 1
  ipc:
    receives_from: [orchestrator, human]
    sends_to:      [orchestrator]
    zone_access:   [project]
    signals:       [SPAWN, RETURN]
ambient:
  runner:
    kind: command
    argv: [echo]
---
# {name}
"""


@pytest.fixture
def brain(make_brain: Callable[..., Path]) -> Path:
    """An empty brain with one good agent."""
    root = make_brain(example=False)
    (root / "agents" / "good.md").write_text(GOOD.format(name="good"))
    return root


def write(root: Path, name: str, text: str | bytes) -> Path:
    """Write an agent file."""
    path = root / "agents" / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def load(root: Path) -> tuple[dict[str, object], list[str]]:
    """Agents by name and problems as text."""
    agents, problems = load_agents(BrainPaths(root))
    return dict(agents), [str(p) for p in problems]


class TestCorpus:
    def test_all_56_agents_load(self, corpus: Path) -> None:
        """The 56 real agents load without an error; only the 'reference' zone is warned about."""
        agents, problems = load_agents(BrainPaths(corpus))
        assert len(agents) == 56
        assert [p for p in problems if p.severity == "error"] == []
        assert {p.file for p in problems} == {"agents/coach.md", "agents/coach-boot.md", "agents/metabolism-scribe.md"}
        assert all("'reference'" in p.message and p.line == 19 for p in problems)
        assert all(spec.ipc is not None for spec in agents.values())

    def test_corpus_gates_read_as_written(self, corpus: Path) -> None:
        """A few gates checked by hand against their frontmatter."""
        agents, _ = load_agents(BrainPaths(corpus))
        orch = agents["orchestrator"].ipc
        assert orch is not None and orch.receives_from == {"human", "*"} and orch.sends_to == {"*"}
        assert orch.source == "agents/orchestrator.md:16"
        coach = agents["coach"].ipc
        assert coach is not None and coach.zone_access == {"personal", "reference"}
        assert coach.signals == {Signal.ESCALATE, Signal.CHECKPOINT}
        integrator = agents["integrator"].ipc
        assert integrator is not None and integrator.signals == {Signal.RETURN, Signal.HANDOFF, Signal.ERROR}
        assert agents["helloWorld"].name == "helloWorld"
        assert agents["api-designer"].extras["domain"][0] == "api"

    def test_corpus_matrix(self, corpus: Path) -> None:
        """The corpus gates build a matrix whose decisions follow them."""
        agents, _ = load_agents(BrainPaths(corpus))
        m = AccessMatrix.build(agent_gates(agents))
        assert decide(m, "orchestrator", "i18n", "SPAWN", "project").allowed
        assert not decide(m, "i18n", "orchestrator", "ESCALATE").allowed


class TestLoading:
    def test_good_agent(self, brain: Path) -> None:
        """Name, gate (with its source line), raw runner and extras are read."""
        agents, problems = load_agents(BrainPaths(brain))
        assert problems == []
        spec = agents["good"]
        assert spec.line == 2 and spec.ipc_line == 7 and spec.runner_line == 13
        assert spec.ipc is not None and spec.ipc.source == "agents/good.md:7"
        assert spec.runner == {"kind": "command", "argv": ["echo"]}
        assert spec.extras["context_tier"] == "hot" and spec.extras["brain"]["version"] == 1

    def test_example_brain_is_clean(self, make_brain: Callable[..., Path]) -> None:
        """The bundled example brain loads without a problem."""
        agents, problems = load_agents(BrainPaths(make_brain()))
        assert problems == []
        assert {"deploy", "coder", "tester", "scribe", "vps"} <= set(agents)
        assert all(a.runner is not None and a.runner["kind"] == "command" for a in agents.values())

    def test_malformed_yaml_is_a_problem_others_load(self, brain: Path) -> None:
        """A YAML error becomes file:line; the good agent still loads."""
        write(brain, "bad.md", "---\nname: bad\nbrain:\n  ipc: [unclosed\n---\n")
        agents, problems = load(brain)
        assert "good" in agents and "bad" not in agents
        assert len(problems) == 1 and problems[0].startswith("agents/bad.md:5:")

    def test_a_file_that_does_not_load_is_told_from_a_missing_agent(self, brain: Path) -> None:
        """A file that does not load is kept by its name with the error that stopped it: an agent named by a
        workflow is said to not load (and why), not to be missing; a name no file has is missing."""
        write(brain, "bad.md", "---\nname: bad\nbrain:\n  ipc: [unclosed\n---\n")
        found = read_agents(BrainPaths(brain))
        assert set(found.agents) == {"good"} and set(found.unloaded) == {"bad"}
        assert found.unloaded["bad"] == found.problems[0]
        assert why_absent("bad", found.unloaded) == f"does not load: {found.unloaded['bad']}"
        assert why_absent("bad", found.unloaded).startswith("does not load: agents/bad.md:5: ")
        assert why_absent("nobody", found.unloaded) == "does not exist in agents/"

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("# just markdown\n", "agents/x.md:1: has no YAML frontmatter"),
            ("---\nname: x\n", "agents/x.md:1: frontmatter is not closed"),
            ("---\n- a\n- b\n---\n", "frontmatter must be a YAML mapping, got list"),
            ("---\n---\n", "frontmatter must be a YAML mapping, got empty"),
            ("---\nname: [x]\n---\n", "agents/x.md:2: name must be an agent name"),
            ("---\nname: x\nname: y\n---\n", "agents/x.md:3: duplicate key 'name'"),
            ("---\na: &a [1]\nb: *a\n---\n", "aliases"),
            ("---\nx: !!python/object:os.system {}\n---\n", "agents/x.md:2:"),
            ("---\nname: x\nbrain: 3\n---\n", "agents/x.md:3: brain must be a mapping"),
            ("---\nname: x\nambient: {runner: [echo]}\n---\n", "agents/x.md:3: ambient.runner must be a mapping"),
        ],
    )
    def test_bad_files(self, brain: Path, text: str, expected: str) -> None:
        """Each kind of bad frontmatter is a clear problem naming file and line."""
        write(brain, "x.md", text)
        agents, problems = load(brain)
        assert "good" in agents
        assert any(expected in p for p in problems), problems

    def test_non_utf8(self, brain: Path) -> None:
        """Non-UTF-8 bytes are refused with the line of the first bad byte."""
        write(brain, "x.md", b"---\nname: x\nnote: \xff\xfe\n---\n")
        _, problems = load(brain)
        assert problems == ["agents/x.md:3: is not valid UTF-8; brain files must be UTF-8 text"]

    def test_oversized_file(self, brain: Path) -> None:
        """A file over the agent cap is refused before it is read."""
        write(brain, "big.md", "---\nname: big\n---\n" + "x" * (MAX_AGENT_BYTES + 1))
        _, problems = load(brain)
        assert len(problems) == 1 and "limit for this kind of file" in problems[0]

    def test_gate_issues_are_located(self, brain: Path) -> None:
        """Gate items are checked one by one; each issue has its own line; the agent keeps what is valid."""
        write(
            brain,
            "x.md",
            "---\nname: x\nbrain:\n  ipc:\n    receives_from: human\n    sends_to: [orchestrator, 42]\n"
            "    zone_access: [project, reference]\n    signals: [RETURN, INFO]\n---\n",
        )
        agents, problems = load_agents(BrainPaths(brain))
        gate = agents["x"].ipc
        assert gate is not None and gate.receives_from == {"human"} and gate.sends_to == {"orchestrator"}
        assert gate.signals == {Signal.RETURN}
        lines = {p.line: p for p in problems}
        assert lines[6].severity == "error" and "sends_to[1]" in lines[6].message
        assert lines[7].severity == "warning" and "'reference'" in lines[7].message
        assert lines[8].severity == "warning" and "'INFO'" in lines[8].message

    def test_malformed_gate_allows_nothing(self, brain: Path) -> None:
        """A kernel agent whose brain.ipc is broken gets an empty gate, not its (wider) kernel default."""
        write(brain, "debug.md", "---\nname: debug\nbrain:\n  ipc: [SPAWN]\n---\n")
        agents, problems = load_agents(BrainPaths(brain))
        assert any(p.severity == "error" and p.line == 4 for p in problems)
        m = AccessMatrix.build(agent_gates(agents))
        assert not decide(m, "orchestrator", "debug", "SPAWN", "project").allowed

    def test_agent_without_gate(self, brain: Path) -> None:
        """An agent without brain.ipc loads with ipc None (kernel default, or nothing)."""
        write(brain, "plain.md", "---\nname: plain\n---\n")
        agents, problems = load_agents(BrainPaths(brain))
        assert problems == [] and agents["plain"].ipc is None

    def test_reserved_and_duplicate_names(self, brain: Path) -> None:
        """Kernel principal names and duplicates are refused; a name differing from the file is warned."""
        write(brain, "human.md", "---\nname: human\n---\n")
        write(brain, "zz.md", GOOD.format(name="good"))
        write(brain, "alias.md", "---\nname: other\n---\n")
        agents, problems = load(brain)
        assert "human" not in agents and "other" in agents
        assert any("agents/human.md:2: 'human' is a kernel principal" in p for p in problems)
        assert any("agents/zz.md:2: agent 'good' is already defined in agents/good.md" in p for p in problems)
        assert any("warning: name 'other' differs from the file name 'alias'" in p for p in problems)

    def test_skipped_files(self, brain: Path, tmp_path: Path) -> None:
        """Templates (_*.md), hidden files, other suffixes and symlinks are not agents."""
        write(brain, "_template.md", "---\nname: tpl\n---\n")
        write(brain, ".hidden.md", "---\nname: hidden\n---\n")
        write(brain, "notes.txt", "hello")
        outside = tmp_path / "outside.md"
        outside.write_text(GOOD.format(name="outside"))
        os.symlink(outside, brain / "agents" / "outside.md")
        agents, problems = load(brain)
        assert set(agents) == {"good"} and problems == []

    def test_missing_agents_dir(self, tmp_path: Path) -> None:
        """A brain without agents/ has no agents and no problem."""
        assert load_agents(BrainPaths(tmp_path)) == ({}, [])


class TestLookalike:
    """A key ambient reads that the file lacks, beside a key that looks like it: the typo at its line."""

    @pytest.mark.parametrize(
        ("written", "meant", "key", "line"),
        [
            ("ambient:", "ambient:", ("ambient", "runner"), None),
            ("ambiant:", "ambient:", ("ambient", "runner"), 12),
            ("  runer:", "  runner:", ("ambient", "runner"), 13),
            ("    signal:", "    signals:", ("brain", "ipc", "signals"), 11),
            ("    send_to:", "    sends_to:", ("brain", "ipc", "sends_to"), 9),
            ("brian:", "brain:", ("brain", "ipc", "zone_access"), 5),
        ],
    )
    def test_the_misspelt_key_on_the_way_is_named_at_its_line(
        self, brain: Path, written: str, meant: str, key: tuple[str, ...], line: int | None
    ) -> None:
        write(brain, "typo.md", GOOD.format(name="typo").replace(meant, written, 1))
        spec = read_agents(BrainPaths(brain)).agents["typo"]
        found = lookalike(spec, key)
        if line is None:
            assert found is None
        else:
            assert found is not None
            typo, missing = written.strip().rstrip(":"), meant.strip().rstrip(":")
            assert str(found) == f"agents/typo.md:{line}: {typo!r} looks like {missing!r}"

    def test_a_missing_key_without_a_look_alike_is_no_typo(self, brain: Path) -> None:
        """No `ambient:` at all (a Claude Code subagent), or a key far from the missing one: nothing to name."""
        write(brain, "plain.md", GOOD.format(name="plain").split("ambient:\n")[0] + "tools: Read\n---\n")
        spec = read_agents(BrainPaths(brain)).agents["plain"]
        assert lookalike(spec, RUNNER_KEY) is None

    def test_no_agent_of_the_corpus_has_a_look_alike(self, corpus: Path) -> None:
        """Real frontmatters, full of other tools' keys: none is taken for a typo of a key ambient reads."""
        agents, _ = load_agents(BrainPaths(corpus))
        keys = [RUNNER_KEY, *(key for _, key in GATE_KEY_OF_RULE.values())]
        assert [(name, key) for name, spec in agents.items() for key in keys if lookalike(spec, key)] == []
