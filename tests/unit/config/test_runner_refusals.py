"""Which `runners:` entries of profil/ambient.yml the daemon does not use (refused_runners), against what the daemon's
own load of the brain keeps (load_brain)."""

from __future__ import annotations

from pathlib import Path

from ambient.config.brain import load_brain, refused_runners
from ambient.core.problems import Problem
from ambient.runners.runner_config import CommandRunnerConfig
from ambient.storage.paths import BrainPaths

CONFIG = """\
runners:
  greeter: {kind: command, argv: "python bin/greeter.py"}
  own: {kind: command, argv: ["/bin/true"]}
  plain: {kind: command, argv: ["/bin/true"]}
  default: {kind: command, argv: ["/bin/false"], timeout_s: -1}
"""


def _brain(root: Path) -> Path:
    for d in ("agents", "profil"):
        (root / d).mkdir(parents=True)
    for name in ("greeter", "plain", "other"):
        (root / "agents" / f"{name}.md").write_text(f"---\nname: {name}\n---\nbody\n")
    (root / "agents" / "own.md").write_text(
        "---\nname: own\nambient:\n  runner: {kind: command, argv: [/bin/echo]}\n---\nbody\n"
    )
    (root / "profil" / "ambient.yml").write_text(CONFIG)
    return root


def test_refused_are_exactly_the_entries_the_daemon_does_not_use(tmp_path: Path) -> None:
    brain = load_brain(BrainPaths(_brain(tmp_path)), {})
    refused = refused_runners(brain.settings, brain.problems, "profil/ambient.yml")
    assert sorted(refused) == ["default", "greeter", "own"], refused
    assert refused["greeter"].severity == "error" and refused["greeter"].line == 2, refused
    assert refused["greeter"].message.startswith("runner of greeter: argv:"), refused
    assert refused["default"].severity == "error" and "timeout_s" in refused["default"].message, refused
    assert refused["own"].severity == "warning" and "its own ambient.runner" in refused["own"].message, refused
    # what the daemon runs: no runner for greeter nor other (the default is refused), own's its file's, plain's
    assert sorted(brain.runners) == ["own", "plain"], brain.runners
    own, plain = brain.runners["own"], brain.runners["plain"]
    assert isinstance(own, CommandRunnerConfig) and own.argv == ["/bin/echo"]
    assert isinstance(plain, CommandRunnerConfig) and plain.argv == ["/bin/true"]


def test_a_problem_of_an_agents_own_runner_refuses_no_entry_of_the_file(tmp_path: Path) -> None:
    brain = load_brain(BrainPaths(_brain(tmp_path)), {})
    elsewhere = Problem(file="agents/plain.md", line=3, message="runner of plain: argv: Field required")
    assert "plain" not in refused_runners(brain.settings, [elsewhere], "profil/ambient.yml")
