"""structlog only when a line is logged: a set-up waits for structlog's import, whoever imports it, and the last
one asked for is the one that runs."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
from ambient.core.lazylog import get_logger, set_up_on_import
ran = []
set_up_on_import(lambda: ran.append("first"))
set_up_on_import(lambda: ran.append("second"))  # replaces the first before structlog is imported
log = get_logger("probe")
assert "structlog" not in sys.modules and ran == [], ran
import structlog  # imported by someone else than the lazy logger
assert ran == ["second"], ran
assert not any(type(f).__name__ == "_SetUpOnImport" for f in sys.meta_path)  # the finder left
set_up_on_import(lambda: ran.append("now"))  # structlog is here: runs at once
assert ran == ["second", "now"], ran
print("ok")
"""


def test_a_set_up_runs_once_structlog_is_imported_and_at_once_after() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
