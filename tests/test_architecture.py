"""The dependency rule: core modules are pure (no I/O imports, no shell modules); nothing imports the daemon or
the CLI except their entry points."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "ambient"
CORE = [
    "errors",
    "problems",
    "packet",
    "matrix",
    "zones",
    "claims",
    "preflight",
    "workflow",
    "templating",
    "planner",
    "runstate",
    "plans",
    "records",
    "learning",
    "settings",
    "redact",
    "yamltext",
    "pathrules",
    "replay",
    "slots",
    "terminal",
    "budget",
]
IO_MODULES = {"os", "io", "asyncio", "subprocess", "time", "socket", "shutil", "fcntl", "signal"}


def _imports(path: Path) -> list[str]:
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return out


@pytest.mark.parametrize("name", CORE)
def test_core_modules_do_no_io(name: str) -> None:
    """A core module imports only the stdlib (no I/O modules), pydantic/yaml and other core modules."""
    core = {f"ambient.{c}" for c in CORE}
    bad = [
        m
        for m in _imports(SRC / f"{name}.py")
        if m.split(".")[0] in IO_MODULES or (m.startswith("ambient.") and m not in core)
    ]
    assert bad == [], f"{name}.py imports {bad}"


def test_nothing_imports_daemon_or_cli() -> None:
    """Only the CLI imports the daemon, and only __main__ imports the CLI."""
    offenders = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        for m in _imports(path):
            if m.startswith("ambient.cli") and not (rel.startswith("cli/") or rel == "__main__.py"):
                offenders.append((rel, m))
            if m == "ambient.service.daemon" and not rel.startswith("cli/"):
                offenders.append((rel, m))
    assert offenders == []
