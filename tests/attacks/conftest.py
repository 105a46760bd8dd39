"""Fixtures of the attacks."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A folder for a brain that an agent's unprivileged user can reach (pytest's temp folders are root's, 0700),
    as a person's brain served by a root daemon must be (docs/agents-and-runners.md, "Security")."""
    folder = Path(tempfile.mkdtemp(prefix="ambient-reachable-"))
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
