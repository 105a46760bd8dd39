"""What the console needs at run time is declared, so the README's plain install (``pip install -e .``, no extras)
has it. A new user found every POST of the console failing with a 500: python-multipart, which Starlette's form
parser needs, came only through the ``claude`` extra's MCP dependency, which the test environment installs."""

from __future__ import annotations

import re
from importlib.metadata import requires


def _core_requirements() -> set[str]:
    names = set()
    for req in requires("ambient") or []:
        if "extra ==" in req:
            continue
        match = re.match(r"[A-Za-z0-9_.-]+", req)
        assert match is not None, req
        names.add(match.group(0).lower().replace("_", "-"))
    return names


def test_the_consoles_form_parser_is_a_core_dependency() -> None:
    core = _core_requirements()
    assert {"starlette", "uvicorn", "jinja2", "python-multipart"} <= core, sorted(core)
