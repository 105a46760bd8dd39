"""Who is speaking (S-05): the channel a packet arrived on names its principal, never the packet's ``from`` field.

A :class:`Channel` built by ambient's own code (a runner reading the pipe of the process it spawned) is trusted as
built; a channel carrying a token is checked against the :class:`ChannelRegistry`, which hands each spawned agent a
fresh token (``AMBIENT_CHANNEL_TOKEN`` in its environment) and keeps only the token's sha256 on disk, so an
out-of-process ``ambient send`` can be authenticated. The local CLI user without a token is ``human``. The router
(:mod:`~ambient.kernel.router`) refuses a token that is not live for its principal.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
from collections.abc import Callable
from datetime import datetime
from typing import Final, NamedTuple

from ambient.core.errors import InputError
from ambient.kernel.matrix import HUMAN
from ambient.kernel.packet import NAME_PATTERN
from ambient.storage.fsutil import private_dir, read_capped, write_new
from ambient.storage.paths import BrainPaths

TOKEN_ENV: Final = "AMBIENT_CHANNEL_TOKEN"  # noqa: S105 - the variable name, not a secret
_TOKEN_RE: Final = re.compile(r"^[A-Za-z0-9_-]{16,128}$")
_NAME_RE: Final = re.compile(NAME_PATTERN)


class Channel(NamedTuple):
    """Where a packet came from: the authenticated principal, and the token it presented (if any)."""

    principal: str
    token: str | None = None

    def __repr__(self) -> str:
        return f"Channel(principal={self.principal!r}{', token=<hidden>' if self.token else ''})"

    @classmethod
    def human(cls) -> Channel:
        """The local person at the CLI (no token)."""
        return cls(HUMAN)

    @classmethod
    def internal(cls, principal: str) -> Channel:
        """A channel ambient's own code vouches for (the daemon itself, a runner's pipe)."""
        return cls(principal)


def token_digest(token: str) -> str:
    """The sha256 hex of a channel token: the only form a token is ever stored in."""
    return hashlib.sha256(token.encode()).hexdigest()


class ChannelRegistry:
    """Per-spawn channel tokens. Only ``sha256(token) → principal`` is kept, in memory and, for other processes,
    one file per token under ``.ambient/channels/`` (mode 0600), so a token never reaches the disk or a log.

    The files are for ``ambient send`` routing a packet in its own process. While the daemon serves its send
    socket, an agent's ``ambient send`` hands the packet to the daemon, whose router checks the token in memory;
    the daemon then sets :attr:`files` to False and no file is written (decision of 2026-12-01: a file written and
    renamed aside per command agent cost a fan-out 8 % of its agents/s, bench/fanout.py (b), bench/README.md,
    finding 42). So a token is honoured by its daemon for as long as that daemon runs; an orphan left by a daemon
    that died, whose ``ambient send`` finds no socket, is refused as ``unauthenticated`` (its item runs again
    anyway). Without a socket (a brain path too long for ``AF_UNIX``, a bind that failed) tokens have files, as
    before: each created when its agent starts and deleted when it ends (no pool of files rewritten for the next
    token: with the socket no file is written, and no benchmark runs a daemon without it; bench/README.md, "Spare
    files").
    """

    MAX_FILE = 4096
    #: Files an earlier version kept aside to rewrite for the next token; removed at start-up.
    SPARE_PREFIX = ".spare."

    def __init__(self, paths: BrainPaths) -> None:
        self.dir = paths.channels
        self._known: dict[str, str] = {}
        self._revoked: set[str] = set()  # disowned, file not deleted yet (see disown)
        #: Write a file for each token published from now on (see the class docs); the daemon clears it while its
        #: send socket is served.
        self.files = True
        self._published: set[str] = set()  # digests whose file was written (revoke deletes only those)

    def issue(self, principal: str, *, spawn: str | None = None, now: datetime | None = None) -> Channel:
        """A fresh channel for ``principal``; hand ``channel.token`` to the spawned process (``TOKEN_ENV``).

        ``spawn`` (e.g. the run/item/attempt key) and ``now`` are kept beside the hash for inspection.
        """
        channel, publish = self.mint(principal, spawn=spawn, now=now)
        publish()
        return channel

    def mint(
        self, principal: str, *, spawn: str | None = None, now: datetime | None = None
    ) -> tuple[Channel, Callable[[], None]]:
        """Like :meth:`issue`, but the file other processes check the token against is written by ``publish()``.

        The token is live in this process at once; run ``publish`` (blocking, a few syscalls) just before the agent
        starts (the command runner's ``before_start``): a thread hop awaited per command agent just for this file
        cost a fan-out ~7 % of its throughput (bench/fanout.py (b)).
        """
        if not _NAME_RE.match(principal):
            raise InputError(f"{principal!r} is not a principal name")
        token = secrets.token_urlsafe(32)
        digest = token_digest(token)
        # The digest inside the file binds its content to its name: a file copied or renamed under another token's
        # name grants nothing.
        record = {
            "principal": principal,
            "spawn": spawn,
            "issued_at": now.isoformat() if now else None,
            "digest": digest,
        }
        self._known[digest] = principal

        def publish() -> None:
            # Not fsync'd: a token outlives nothing (the daemon revokes every token at start), it only has to be
            # readable by the agent's own `ambient send` while the agent runs. Written in place: no one can look
            # for this name before the token is handed to the agent, after this returns.
            if not self.files:  # the daemon's socket answers the agent's `ambient send`
                return
            self._published.add(digest)
            path, text = self.dir / f"{digest}.json", json.dumps(record)
            try:
                write_new(path, text, mode=0o600)
            except FileNotFoundError:  # first token, or the directory was removed
                private_dir(self.dir)
                write_new(path, text, mode=0o600)

        return Channel(principal, token), publish

    def principal_for(self, token: str) -> str | None:
        """The principal a token was issued to, or None (unknown, revoked or malformed)."""
        if not isinstance(token, str) or not _TOKEN_RE.match(token):
            return None
        digest = token_digest(token)
        known = self._known.get(digest)
        if known is not None:
            return known
        if digest in self._revoked:
            return None
        try:
            data = json.loads(read_capped(self.dir / f"{digest}.json", self.MAX_FILE))
        except (OSError, InputError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("digest") != digest:
            return None
        principal = data.get("principal")
        if not isinstance(principal, str) or not _NAME_RE.match(principal):
            return None
        self._known[digest] = principal
        return principal

    def authenticate(self, token: str) -> Channel | None:
        """The channel of a presented token, or None when it is not a live token."""
        principal = self.principal_for(token)
        return None if principal is None else Channel(principal, token)

    def revoke(self, channel: Channel | str) -> None:
        """Forget a token (at the end of its spawn)."""
        token = channel.token if isinstance(channel, Channel) else channel
        if not token:
            return
        digest = token_digest(token)
        self._known.pop(digest, None)
        if digest not in self._published:  # never written: nothing to take away
            self._revoked.discard(digest)
            return
        self._published.discard(digest)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{self.dir}/{digest}.json")  # noqa: PTH108 - str paths, as in the rest of the hot path
        self._revoked.discard(digest)  # not after a failure: the file stays, and this process must go on refusing it

    def disown(self, channel: Channel | str) -> None:
        """Void a token in this process at once, whatever becomes of its file; :meth:`revoke` then deletes it.

        The router of this process refuses it from now on; another process (an agent's ``ambient send``) reads the
        file until ``revoke`` has deleted it (the daemon does both when the agent has exited). A file that could not
        be deleted is left to the next start-up's :meth:`revoke_all`, and this process never accepts it again.
        """
        token = channel.token if isinstance(channel, Channel) else channel
        if token:
            digest = token_digest(token)
            self._revoked.add(digest)
            self._known.pop(digest, None)

    def revoke_all(self) -> int:
        """Forget every token (daemon start-up: no spawn of a previous run is alive). Returns the count."""
        self._known.clear()
        self._revoked.clear()
        self._published.clear()
        count = 0
        if self.dir.is_dir():
            for path in self.dir.glob("*.json"):
                path.unlink(missing_ok=True)
                count += 1
            for path in self.dir.glob(f"{self.SPARE_PREFIX}*"):
                path.unlink(missing_ok=True)
        return count

    def channel_for(self, token: str | None) -> Channel:
        """The channel of a sender presenting ``token``: none is the person (``human``); one that is not live
        is a channel nobody vouches for (``unauthenticated``), which the router refuses and records."""
        if not token:
            return Channel.human()
        return self.authenticate(token) or Channel("unauthenticated", token)
