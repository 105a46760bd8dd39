"""What a short command imports (its start-up time, bench/query.py): ``ambient status`` on a brain whose facts are
kept imports neither the brain's loader nor structlog, asyncio or pydantic; structlog, when something imports it,
is set up to log on stderr before any line is logged. In fresh interpreters: this one has imported them all."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import ambient

SRC = Path(ambient.__file__).resolve().parent.parent
EXAMPLE = SRC.parent / "examples" / "brain"
HEAVY = ("structlog", "asyncio", "pydantic", "yaml", "ambient.config.brain")


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMBIENT_")}
    env["PYTHONPATH"] = str(SRC)
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


STATUS = """
import sys
from ambient.cli import main
code = main(["--brain", sys.argv[1], "status"])
print("HEAVY", sorted(m for m in sys.argv[2:] if m in sys.modules), code, file=sys.stderr)
"""


def test_status_imports_no_loader_nor_logging_once_its_facts_are_kept(tmp_path: Path) -> None:
    root = tmp_path / "brain"
    for sub in ("agents", "profil", "workflows"):
        shutil.copytree(EXAMPLE / sub, root / sub)
    for sub in ("claims", "locks", ".ambient/runs", ".ambient/escalations"):  # as the daemon leaves them
        (root / sub).mkdir(parents=True, mode=0o700)
    old = 1_700_000_000 * 10**9  # written long ago: what changed just now is read again (racy mtimes)
    for top, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            os.utime(Path(top) / name, ns=(old, old), follow_symlinks=False)
    first = _python(STATUS, str(root), *HEAVY)
    assert "HEAVY" in first.stderr and first.stderr.rstrip().endswith(" 0"), first.stderr
    assert "ambient.config.brain" in first.stderr  # the first status loads the brain and keeps its facts
    second = _python(STATUS, str(root), *HEAVY)
    assert "HEAVY [] 0" in second.stderr, second.stderr
    assert second.stdout == first.stdout


QUIET = """
import sys
from ambient.cli._common import quiet_logs
quiet_logs()
assert "structlog" not in sys.modules
from ambient.core.lazylog import get_logger
log = get_logger("probe")
log.info("not shown")
log.warning("shown on stderr", n=1)
import structlog
structlog.get_logger("other").warning("also on stderr")
"""


def test_quiet_logs_sets_structlog_up_when_it_is_first_imported() -> None:
    done = _python(QUIET)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert "shown on stderr" in done.stderr and "also on stderr" in done.stderr
    assert "not shown" not in done.stderr
