"""Whom an agent runs as, and what of its scope is given to that user."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ambient.runners.base import RunRequest
from ambient.runners.confinement import AGENT_USER, default_agent_user, run_as, share_scope
from ambient.runners.runner_config import CommandRunnerConfig, parse_runner_config


def _cfg(**kw: object) -> CommandRunnerConfig:
    cfg = parse_runner_config({"kind": "command", "argv": ["true"], **kw})
    assert isinstance(cfg, CommandRunnerConfig)
    return cfg


def test_a_root_daemon_runs_agents_as_the_agent_user_unless_the_runner_names_one() -> None:
    assert default_agent_user(0) == AGENT_USER
    assert default_agent_user(1000) is None  # ambient's own user: it cannot take another
    assert run_as(_cfg(), default_agent_user(0)) == AGENT_USER
    assert run_as(_cfg(user="root"), default_agent_user(0)) == "root"  # the person's choice (no capability)
    assert run_as(_cfg(user="alice"), None) == "alice"
    assert run_as(_cfg(), None) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another group needs root")
def test_share_scope_gives_the_scope_and_the_shared_folders_to_the_agents_group(tmp_path: Path) -> None:
    """The scope's file (and the folder of one not there yet), claims/ and locks/: the agent's group, group-writable,
    setgid on folders; owners kept, nothing opened to others, the rest of the brain untouched."""
    brain = tmp_path / "brain"
    for d in ("claims", "locks", "notes", "private"):
        (brain / d).mkdir(parents=True)
        (brain / d).chmod(0o755)
    kept = brain / "notes" / "kept.md"
    kept.write_text("x")
    kept.chmod(0o644)
    (brain / "private" / "p.md").write_text("p")
    packet = {"scope": {"files": ["notes/kept.md", "out/new.md", "../outside.md"]}}
    req = RunRequest(packet=packet, agent="a", run_id="r", item="i", attempt=1, key="k", channel_token="t", brain=brain)
    share_scope(req, 12345, 54321)
    for path, want in ((kept, 0o664), (brain / "out", 0o2775), (brain / "claims", 0o2775), (brain / "locks", 0o2775)):
        st = path.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 54321, want), path
    for path in (brain / "notes", brain / "private", brain / "private" / "p.md", brain):
        assert path.stat().st_gid == 0, path
    assert not (tmp_path / "outside.md").exists()
