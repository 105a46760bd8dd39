"""The project's habits hold together: the README's test command is what CI runs and what CONTRIBUTING.md shows,
every dependency has its pin in constraints.txt, and the pre-commit hooks run CI's checks (pre-commit itself is not
needed: the files are read as text and YAML)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def _first_bash_block(text: str) -> list[str]:
    block = re.search(r"```bash\n(.*?)```", text, re.DOTALL)
    assert block, "no ```bash block"
    return block.group(1).splitlines()


def _ci_lines() -> list[str]:
    return [line.strip() for line in (REPO / ".ci/run").read_text().splitlines()]


def _name(requirement: str) -> str:
    """The normalised project name of a requirement (``Foo_Bar[x]>=1`` → ``foo-bar``, PEP 503)."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def test_ci_runs_the_readmes_test_command_and_contributing_shows_both_commands() -> None:
    """A fresh clone tests the way CI does: `.ci/run` runs the README's second command as it is written."""
    readme = _first_bash_block((REPO / "README.md").read_text())
    assert "-c constraints.txt" in readme[1], readme[1]
    assert readme[1] in _ci_lines(), "the README's test command is not a line of .ci/run"
    assert _first_bash_block((REPO / "CONTRIBUTING.md").read_text())[:2] == readme[:2]


def test_constraints_pin_every_dependency_of_the_project_and_its_extras() -> None:
    """Each dependency (the project's and every extra's) has exactly one ``==`` pin; ambient itself has none."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in project["dependencies"]}
    for extra in project["optional-dependencies"].values():
        wanted |= {_name(r) for r in extra}
    lines = [ln for ln in (REPO / "constraints.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==[^\s=]+", ln) for ln in lines), [ln for ln in lines if "==" not in ln]
    pinned = [_name(ln) for ln in lines]
    assert len(pinned) == len(set(pinned)), "a package pinned twice"
    assert "ambient" not in pinned
    assert sorted(wanted - set(pinned)) == [], "refresh constraints.txt (CONTRIBUTING.md, Pinned test dependencies)"


def test_the_pre_commit_hooks_run_what_ci_checks() -> None:
    """The hooks' commands are the checks `.ci/run` runs after the tests, with the same venv's tools."""
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    hooks = [hook for repo in config["repos"] for hook in repo["hooks"]]
    assert all(repo["repo"] == "local" for repo in config["repos"])
    checks = [line for line in _ci_lines() if line.startswith(".venv/bin/") and "pytest" not in line]
    assert sorted(hook["entry"] for hook in hooks) == sorted(checks), checks
    assert all(hook["language"] == "system" and hook["pass_filenames"] is False for hook in hooks)


def test_contributing_names_every_marker_lane() -> None:
    """Every marker of pyproject.toml has its lane in CONTRIBUTING.md, with the command that runs it."""
    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    page = (REPO / "CONTRIBUTING.md").read_text()
    missing = [m.split(":")[0] for m in markers if f"-m {m.split(':')[0]}" not in page]
    assert missing == [], missing
    assert '-m "not slow"' in page
