"""Channels: per-spawn tokens stored hashed, pooled token files, disown and revoke, the channel of a sender (S-05)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from ambient.core.errors import InputError
from ambient.kernel.channels import Channel, ChannelRegistry, token_digest
from ambient.storage.paths import BrainPaths


@pytest.fixture
def brain(make_brain: Callable[..., Path]) -> Path:
    """A copy of the example brain."""
    return make_brain()


class TestRegistry:
    def test_tokens_are_stored_hashed(self, brain: Path) -> None:
        """Per-spawn tokens authenticate their principal; only their sha256 reaches the disk."""
        paths = BrainPaths(brain)
        reg = ChannelRegistry(paths)
        ch = reg.issue("deploy", spawn="run-1/a/1")
        assert ch.token is not None and ch.principal == "deploy" and ch.token not in repr(ch)
        files = list(paths.channels.iterdir())
        assert [f.name for f in files] == [f"{token_digest(ch.token)}.json"]
        assert oct(files[0].stat().st_mode & 0o777) == "0o600"
        for f in paths.state.rglob("*"):
            if f.is_file():
                assert ch.token not in f.read_text(errors="replace")
        fresh = ChannelRegistry(paths)  # another process (ambient send) reads the digest file
        assert fresh.authenticate(ch.token) == Channel("deploy", ch.token)
        assert fresh.authenticate("x" * 43) is None and fresh.authenticate("../../etc/passwd") is None
        reg.revoke(ch)
        assert ChannelRegistry(paths).authenticate(ch.token) is None
        reg.issue("coder")
        assert reg.revoke_all() == 1

    def test_a_revoked_token_file_is_deleted_and_a_restart_clears_what_is_left(self, brain: Path) -> None:
        """revoke deletes the token's file (the old token is void everywhere at once); revoke_all at start-up removes
        every token file and the files an earlier version kept aside for reuse."""
        paths = BrainPaths(brain)
        reg = ChannelRegistry(paths)
        first = reg.issue("deploy", spawn="run-1/a/1")
        assert first.token is not None
        reg.revoke(first)
        assert ChannelRegistry(paths).authenticate(first.token) is None
        assert list(paths.channels.iterdir()) == []
        second = reg.issue("coder", spawn="run-1/b/1")
        assert second.token is not None
        path = paths.channels / f"{token_digest(second.token)}.json"
        assert json.loads(path.read_text()) == {
            "principal": "coder",
            "spawn": "run-1/b/1",
            "issued_at": None,
            "digest": token_digest(second.token),
        }
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        assert ChannelRegistry(paths).authenticate(second.token) == Channel("coder", second.token)
        (paths.channels / f"{ChannelRegistry.SPARE_PREFIX}123.1").write_text("{}")  # an earlier version's pool
        assert reg.revoke_all() == 1  # second's file; the earlier version's goes too
        assert list(paths.channels.iterdir()) == []

    def test_a_token_file_read_under_another_name_grants_nothing(self, brain: Path) -> None:
        """A token file copied under a revoked token's name must not give that name the other token's principal (the
        record names its own digest)."""
        paths = BrainPaths(brain)
        reg = ChannelRegistry(paths)
        old, new = reg.issue("deploy"), reg.issue("coder")
        assert old.token is not None and new.token is not None
        old_file = paths.channels / f"{token_digest(old.token)}.json"
        old_file.write_bytes((paths.channels / f"{token_digest(new.token)}.json").read_bytes())
        assert ChannelRegistry(paths).authenticate(old.token) is None
        assert ChannelRegistry(paths).authenticate(new.token) == new
        old_file.write_text(json.dumps({"principal": "deploy"}))  # a record without its digest: refused too
        assert ChannelRegistry(paths).authenticate(old.token) is None

    def test_a_disowned_token_is_void_here_at_once_and_everywhere_once_revoked(self, brain: Path) -> None:
        """disown voids a token for this process before its file is deleted (the daemon deletes it off the loop);
        revoke then deletes the file, and other processes stop accepting it too."""
        paths = BrainPaths(brain)
        reg = ChannelRegistry(paths)
        ch = reg.issue("deploy", spawn="run-1/a/1")
        assert ch.token is not None and reg.authenticate(ch.token) == ch
        reg.disown(ch)
        assert reg.authenticate(ch.token) is None  # even though the file is still there
        assert ChannelRegistry(paths).authenticate(ch.token) == ch  # another process: until revoke
        reg.revoke(ch)
        assert ChannelRegistry(paths).authenticate(ch.token) is None and reg.authenticate(ch.token) is None
        assert list(paths.channels.iterdir()) == []

    def test_a_minted_token_is_live_here_at_once_and_elsewhere_once_published(self, brain: Path) -> None:
        """mint: the token works in this process at once; other processes see it once ``publish`` wrote its file
        (the daemon runs it just before the agent starts), which also makes a missing directory."""
        paths = BrainPaths(brain)
        reg = ChannelRegistry(paths)
        ch, publish = reg.mint("deploy", spawn="run-1/a/1")
        assert ch.token is not None and reg.authenticate(ch.token) == ch
        assert ChannelRegistry(paths).authenticate(ch.token) is None and not paths.channels.exists()
        publish()
        assert ChannelRegistry(paths).authenticate(ch.token) == ch
        assert oct(paths.channels.stat().st_mode & 0o777) == "0o700"
        with pytest.raises(InputError):
            reg.mint("../evil")

    def test_while_the_daemon_serves_its_socket_tokens_live_in_memory_only(
        self, brain: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """``files = False`` (the daemon's send socket answers agents): publish writes nothing, the token is live
        in this process, and revoking it touches no file. A token published before the switch keeps its file
        until it is revoked, and a delete that fails still leaves it void here."""
        paths = BrainPaths(brain)
        reg = ChannelRegistry(paths)
        early, publish_early = reg.mint("deploy", spawn="run-1/a/1")
        publish_early()
        reg.files = False
        ch, publish = reg.mint("deploy", spawn="run-1/b/1")
        publish()
        assert ch.token is not None and early.token is not None
        assert reg.authenticate(ch.token) == ch and ChannelRegistry(paths).authenticate(ch.token) is None
        assert len(list(paths.channels.glob("*.json"))) == 1  # only the early one

        def no_file_work(*args: object) -> None:
            raise AssertionError("a token without a file must not be renamed or unlinked")

        monkeypatch.setattr(os, "rename", no_file_work)
        monkeypatch.setattr(os, "unlink", no_file_work)
        reg.disown(ch)
        reg.revoke(ch)
        assert reg.authenticate(ch.token) is None
        monkeypatch.undo()

        def refuse(*args: object) -> None:
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(os, "unlink", refuse)
        reg.disown(early)
        with pytest.raises(PermissionError):
            reg.revoke(early)
        monkeypatch.undo()
        assert ChannelRegistry(paths).authenticate(early.token) == early  # the file stayed...
        assert reg.authenticate(early.token) is None  # ...and this process goes on refusing it

    def test_channel_for_a_presented_token(self, brain: Path) -> None:
        """What `ambient send` runs as (in the command or in the daemon): a dead token is nobody's, and says so."""
        reg = ChannelRegistry(BrainPaths(brain))
        ch = reg.issue("tester")
        assert reg.channel_for(None) == reg.channel_for("") == Channel.human()
        assert reg.channel_for(ch.token) == ch
        assert reg.channel_for("Z" * 43) == Channel("unauthenticated", "Z" * 43)
