"""The only packet path (DESIGN 2.1): validate → authorize → deliver → record.

Identity comes from the channel a packet arrived on, never from its ``from`` field (S-05): a
:class:`Channel` names the authenticated principal. Channels built by ambient's own code (a runner
reading the pipe of the process it spawned) are trusted as built; a channel carrying a token is
checked against the :class:`ChannelRegistry`, which hands each spawned agent a fresh token
(``AMBIENT_CHANNEL_TOKEN`` in its environment) and keeps only the token's sha256 on disk, so an
out-of-process ``ambient send`` can be authenticated. The local CLI user without a token is ``human``.

Every decision is recorded in ``.ambient/audit.jsonl`` (buffered :class:`~ambient.storage.journal.Journal`):
a rejected or undeliverable packet is one line with its rule and reason, its size and sha256, never
its content (S-04), and is answered to the sender as an ERROR packet from ``ambient`` when the sender
has a handler. Allowed and delivered packets are grouped, up to :data:`AUDIT_BATCH` per line
(``{"status": "batch", "fields": [...], "packets": [[...], ...]}``), written when the group is full,
before any rejection line (the file stays in order) and at :meth:`Router.flush`/``commit``/``close``;
:func:`read_audit` yields one record per packet whatever the shape. Grouping is what keeps the
record step cheaper than validation (bench/router.py). Nothing raises into the
caller's loop: a bad packet, a denial and a failing handler are all :class:`Outcome` values.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, NamedTuple

import structlog
from pydantic import ValidationError

from ambient.core.clock import Clock, SystemClock
from ambient.core.errors import InputError, PacketError, UnsafePathError
from ambient.core.problems import Problem
from ambient.kernel.matrix import AMBIENT, HUMAN, AccessMatrix, Decision
from ambient.kernel.packet import (
    BROADCAST,
    MAX_PACKET_BYTES,
    NAME_PATTERN,
    Packet,
    Signal,
    decode_packet,
    make_packet,
    parse_packet,
    validation_message,
)
from ambient.kernel.zones import DEFAULT_RULES, ZoneRule, zones_below
from ambient.storage.fsutil import (
    atomic_write,
    iter_files,
    private_dir,
    read_capped,
    resolve_in_brain,
    write_all,
    write_new,
    write_tmp,
)
from ambient.storage.journal import Journal, Unwritten, iter_jsonl
from ambient.storage.paths import BrainPaths

log = structlog.get_logger(__name__)

TOKEN_ENV: Final = "AMBIENT_CHANNEL_TOKEN"  # noqa: S105 - the variable name, not a secret
_TOKEN_RE: Final = re.compile(r"^[A-Za-z0-9_-]{16,128}$")
_NAME_RE: Final = re.compile(NAME_PATTERN)

AUDIT_BATCH: Final = 64
SYMLINK_CHECK_TTL: Final = 1.0  # seconds a path found free of symlinks is not checked again
AUDIT_FIELDS: Final = ("ts", "status", "id", "channel", "from", "to", "signal", "rule", "size")

Status = Literal["delivered", "allowed", "denied", "invalid", "undeliverable"]
Handler = Callable[[Packet], Awaitable[None]]
Raw = bytes | str | Mapping[str, Any] | Packet


class Outcome(NamedTuple):
    """What became of one packet (a NamedTuple: immutable and cheap on the hot path).

    ``delivered``: passed both checks and handed to a handler; ``allowed``: passed both checks
    (:meth:`Router.check`, no delivery); ``denied``: valid but refused (identity, matrix, routing);
    ``invalid``: failed validation; ``undeliverable``: allowed but no handler took it.
    """

    status: Status
    packet: Packet | None
    reason: str = ""
    decision: Decision | None = None

    @property
    def ok(self) -> bool:
        """Passed validation and authorization."""
        return self.status in ("delivered", "allowed")


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
    the daemon then sets :attr:`files` to False and no file is written (decision, session 12: a file written and
    renamed aside per command agent cost a fan-out 8 % of its agents/s, bench/fanout.py (b), bench/README
    item 42). So a token is honoured by its daemon for as long as that daemon runs; an orphan left by a daemon
    that died, whose ``ambient send`` finds no socket, is refused as ``unauthenticated`` (its item runs again
    anyway). Without a socket (a brain path too long for ``AF_UNIX``, a bind that failed) tokens have files, as
    before.
    """

    MAX_FILE = 4096
    SPARES_MAX = 64
    SPARE_PREFIX = ".spare."

    def __init__(self, paths: BrainPaths) -> None:
        self.dir = paths.channels
        self._known: dict[str, str] = {}
        self._revoked: set[str] = set()  # disowned, file not deleted yet (see disown)
        # Files of revoked tokens, renamed aside to be rewritten for the next token instead of deleted: a command
        # agent's token file was a create and a delete, and on ext4 without a journal each inode freed slows the
        # next creates for a minute (the allocator skips recently deleted inodes one by one: 14 % of the event
        # loop's samples in bench/fanout.py (b), perf). The lock keeps the pool whole if a caller revokes from a thread.
        self._spares: list[str] = []
        self._spares_lock = threading.Lock()
        self._spare_count = 0
        #: Write a file for each token published from now on (see the class docs); the daemon clears it while its
        #: send socket is served.
        self.files = True
        self._published: set[str] = set()  # digests whose file was written (revoke renames only those)

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
        # The digest inside the file binds its content to its name: a pooled file is rewritten for the next token
        # (see _reuse_spare), and a reader that opened it under a revoked token's name must not take the next
        # token's principal for its own.
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
            if self._reuse_spare(str(path), text.encode()):
                return
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
        path = f"{self.dir}/{digest}.json"
        spare = self._spare_name()
        try:
            if spare is None:
                os.unlink(path)  # noqa: PTH108 - str paths, as in the rest of the hot path
            else:
                os.rename(path, spare)  # noqa: PTH104 - the token's name goes at once, as an unlink would
                with self._spares_lock:
                    self._spares.append(spare)
        except FileNotFoundError:
            pass
        self._revoked.discard(digest)  # not after a failure: the file stays, and this process must go on refusing it

    def _spare_name(self) -> str | None:
        """A new private name for a revoked token's file, or None when the pool is full (the file is deleted)."""
        with self._spares_lock:
            if len(self._spares) >= self.SPARES_MAX:
                return None
            self._spare_count += 1
            return f"{self.dir}/{self.SPARE_PREFIX}{os.getpid()}.{self._spare_count}"

    def _reuse_spare(self, path: str, data: bytes) -> bool:
        """Write ``data`` into a pooled file and rename it to ``path``; False when there is none to use."""
        while True:
            with self._spares_lock:
                if not self._spares:
                    return False
                spare = self._spares.pop()
            try:
                fd = os.open(spare, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:  # swept or replaced meanwhile: forget it, try the next
                continue
            try:
                # Overwritten, then cut to size: O_TRUNC freed the file's block and the write allocated one again
                # (~220 µs a token on this machine's ext4, 14 % of the loop in bench/fanout.py (b); this: ~5 µs).
                write_all(fd, data)  # from offset 0: a fresh descriptor
                os.ftruncate(fd, len(data))
            except OSError:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(spare)  # noqa: PTH108
                return False
            os.close(fd)
            try:
                os.rename(spare, path)  # noqa: PTH104
            except OSError:
                continue
            return True

    def disown(self, channel: Channel | str) -> None:
        """Void a token in this process at once, whatever becomes of its file; :meth:`revoke` then renames it aside.

        The router of this process refuses it from now on; another process (an agent's ``ambient send``) reads the
        file until ``revoke`` has renamed it (the daemon does both when the agent has exited). A file that could not
        be renamed is left to the next start-up's :meth:`revoke_all`, and this process never accepts it again.
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
        with self._spares_lock:
            self._spares.clear()
        count = 0
        if self.dir.is_dir():
            for path in self.dir.glob("*.json"):
                path.unlink(missing_ok=True)
                count += 1
            for path in self.dir.glob(f"{self.SPARE_PREFIX}*"):  # a previous life's pool
                path.unlink(missing_ok=True)
        return count

    def channel_for(self, token: str | None) -> Channel:
        """The channel of a sender presenting ``token``: none is the person (``human``); one that is not live
        is a channel nobody vouches for (``unauthenticated``), which the router refuses and records."""
        if not token:
            return Channel.human()
        return self.authenticate(token) or Channel("unauthenticated", token)


def _symlink_free(
    root: str, rel: str, plain: dict[str, float] | None = None, now: float = 0.0, absent: dict[str, float] | None = None
) -> bool:
    """No existing component of ``root/rel`` is a symlink (components past the first missing one cannot be).

    ``plain``: folders (``"a/b/"``) seen free of symlinks, with the monotonic time until which that verdict holds;
    those are not looked at again, and the folders found on the way are added (until ``now`` +
    :data:`SYMLINK_CHECK_TTL`). A fan-out gives every item a new path under the same folders, which were
    looked at again for each item: now one ``lstat`` per path. ``absent``: folders found missing, kept the same
    way (nothing below them exists, so the walk ends there). A missing component is found by ``os.access``,
    which answers without raising: the ``FileNotFoundError`` of every new item's path was most of this check's
    cost (bench/fanout.py (a), whose folders do not exist: 6.6 % of the loop's samples in session 9, py-spy).
    Either verdict held for its TTL leaves the same window as the zone check itself (see ``_file_zones``).
    """
    path = root
    prefix = ""
    parts = [part for part in rel.split("/") if part]
    last = len(parts) - 1
    for i, part in enumerate(parts):
        path = f"{path}/{part}"
        prefix = f"{prefix}{part}/"
        if i < last:
            if plain is not None and plain.get(prefix, 0.0) > now:
                continue
            if absent is not None and absent.get(prefix, 0.0) > now:
                return True
        # A dangling symlink exists for access(F_OK) without following: it goes on to the lstat below.
        if not os.access(path, os.F_OK, follow_symlinks=False):
            if i < last and absent is not None:
                absent[prefix] = now + SYMLINK_CHECK_TTL
            return True
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):  # removed meanwhile
            return True
        if stat.S_ISLNK(st.st_mode):
            return False
        if i < last and plain is not None and stat.S_ISDIR(st.st_mode):
            plain[prefix] = now + SYMLINK_CHECK_TTL
    return True


class CutInput(bytes):
    """The first bytes of an input too large to read whole (one over the packet bound is enough to refuse it),
    knowing the size and sha256 of the whole: what the audit records of an oversized packet."""

    whole_size: int
    whole_sha256: str

    def __new__(cls, head: bytes, whole_size: int, whole_sha256: str) -> CutInput:
        obj = super().__new__(cls, head)
        obj.whole_size = whole_size
        obj.whole_sha256 = whole_sha256
        return obj


def _fingerprint(raw: Raw) -> tuple[int | None, str | None]:
    """Size and sha256 of a raw packet: all that is ever recorded of a rejected one."""
    if isinstance(raw, CutInput):
        return raw.whole_size, raw.whole_sha256
    try:
        if isinstance(raw, Packet):
            data = raw.to_json().encode()
        elif isinstance(raw, str):
            data = raw.encode("utf-8", "surrogatepass")
        elif isinstance(raw, bytes | bytearray | memoryview):
            data = bytes(raw)
        else:
            data = json.dumps(raw, default=repr).encode("utf-8", "surrogatepass")
    except (ValueError, TypeError, RecursionError):
        return None, None
    return len(data), hashlib.sha256(data).hexdigest()


class Router:
    """Validate → authorize → deliver → record. One per daemon (or per ``ambient send``)."""

    def __init__(
        self,
        matrix: AccessMatrix,
        *,
        zone_rules: tuple[ZoneRule, ...] = DEFAULT_RULES,
        audit: Journal | None = None,
        brain_root: Path | None = None,
        registry: ChannelRegistry | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.matrix = matrix
        self.zone_rules = zone_rules
        self.audit = audit
        self.brain_root = brain_root
        self.registry = registry
        self.clock: Clock = clock or SystemClock()
        self._handlers: dict[str, Handler] = {}
        self._default: Handler | None = None
        self._root_real: str | None = None
        self._zone_cache: dict[str, frozenset[str]] = {}
        # path (or folder, "a/b/") → monotonic time until which it is known symlink-free
        self._plain_until: dict[str, float] = {}
        self._absent_until: dict[str, float] = {}  # folders found missing (see _symlink_free)
        self._one_zone: dict[str, frozenset[str]] = {}
        self._id_prefix = secrets.token_hex(6)
        self._count = 0
        self._batch: list[list[Any]] = []

    @classmethod
    def for_brain(
        cls, paths: BrainPaths, *, clock: Clock | None = None, buffered: bool = True
    ) -> tuple[Router, list[Problem]]:
        """A router over the brain's effective matrix, its audit log and its channel registry."""
        from ambient.kernel.routing_table import build_matrix

        bm = build_matrix(paths)
        router = cls(
            bm.matrix,
            zone_rules=bm.zone_rules,
            audit=Journal(paths.audit, buffered=buffered),
            brain_root=paths.root,
            registry=ChannelRegistry(paths),
            clock=clock,
        )
        return router, bm.problems

    # --- configuration ---------------------------------------------------------------------

    def register(self, principal: str, handler: Handler) -> None:
        """Deliver packets addressed to ``principal`` to ``handler`` (replaces any previous one)."""
        self._handlers[principal] = handler

    def unregister(self, principal: str) -> None:
        """Stop delivering to ``principal``'s handler."""
        self._handlers.pop(principal, None)

    def set_default(self, handler: Handler | None) -> None:
        """The handler for principals without their own (e.g. the inbox writer of ``ambient send``)."""
        self._default = handler

    def update(self, matrix: AccessMatrix, zone_rules: tuple[ZoneRule, ...] | None = None) -> None:
        """Swap in a reloaded matrix (and zone rules); packets in flight finish under the old one."""
        self.matrix = matrix
        if zone_rules is not None:
            self.zone_rules = zone_rules
            self._zone_cache = {}

    # --- the path --------------------------------------------------------------------------

    def check(self, raw: Raw, principal: str | Channel) -> Outcome:
        """Validate, authenticate and authorize one packet, and record the decision; no delivery."""
        channel = principal if isinstance(principal, Channel) else Channel(principal)
        outcome = self._admit(raw, channel)
        self._record(outcome, raw, channel)
        return outcome

    async def send(self, raw: Raw, channel: Channel, *, deliver: Handler | None = None) -> Outcome:
        """The full path: validate → authorize → deliver → record. Never raises (but lets cancellation through).

        ``deliver`` replaces the registered handlers for this packet (the daemon delivers what ``ambient send``
        hands it to the inbox, as the command does in its own process).
        """
        outcome = self._admit(raw, channel)
        if outcome.status == "allowed" and outcome.packet is not None:
            outcome = await self._deliver(outcome, deliver)
        replied = False
        if outcome.status in ("denied", "invalid"):
            replied = await self._reply(outcome, raw, channel)
        self._record(outcome, raw, channel, replied=replied)
        return outcome

    def _admit(self, raw: Raw, channel: Channel) -> Outcome:
        try:
            return self._admit_unsafe(raw, channel)
        except Exception as exc:  # noqa: BLE001 - a bug here must not take the caller's loop down
            log.error("router_internal_error", error=type(exc).__name__)
            return Outcome("invalid", None, f"packet could not be processed ({type(exc).__name__})")

    def _admit_unsafe(self, raw: Raw, channel: Channel) -> Outcome:
        # Identity first for tokens: an unverifiable channel is refused before anything is parsed.
        if channel.token is not None:
            owner = self.registry.principal_for(channel.token) if self.registry is not None else None
            if owner != channel.principal:
                return Outcome("denied", None, "channel token is not a live token of its principal", _IDENTITY_TOKEN)
        if isinstance(raw, Packet):
            pkt = raw  # built by ambient's own code through make_packet: already validated, keeps its id
        else:
            # parse_packet, inlined: this is the hot path (see bench/router.py)
            try:
                data = decode_packet(raw)
                data["ts"] = self.clock.now()  # ambient sets id and ts (whatever the sender wrote)
                data["id"] = self.next_id()
                pkt = _VALIDATE(data)
            except ValidationError as exc:
                return Outcome("invalid", None, validation_message(exc))
            except InputError as exc:
                return Outcome("invalid", None, exc.message)
            except RecursionError:
                return Outcome("invalid", None, "packet is nested too deeply to be parsed")
        if pkt.from_ != channel.principal:
            return Outcome(
                "denied",
                pkt,
                f"from: {pkt.from_} does not match the channel's principal {channel.principal}; "
                "identity comes from the channel (S-05)",
                _IDENTITY,
            )
        zone = pkt.scope.zone
        if pkt.scope.files:
            try:
                touched = self._file_zones(pkt.scope.files)
            except UnsafePathError as exc:
                return Outcome("denied", pkt, exc.message, _UNSAFE_PATH)
            if zone is not None:
                touched.add(zone)
            zones = frozenset(touched)
        elif zone is None:
            zones = _NO_ZONES
        else:
            zones = self._one_zone.get(zone) or self._one_zone.setdefault(zone, frozenset((zone,)))
        decision = self.matrix.decision(pkt.from_, pkt.to, pkt.signal, zones)
        if not decision.allowed:
            return Outcome("denied", pkt, decision.reasons[-1] if decision.reasons else decision.rule, decision)
        return Outcome("allowed", pkt, "", decision)

    def next_id(self) -> str:
        """A fresh packet id: a random per-router prefix and a counter (cheaper than urandom per packet)."""
        self._count += 1
        return f"pkt_{self._id_prefix}{self._count:08x}"

    def _file_zones(self, files: list[str]) -> set[str]:
        """Zones of the scope files as written and as resolved (a symlink to a personal file is personal).

        Paths are already normalised by validation (no '..', not absolute). A path with no symlink on
        the way costs one lstat per existing component not checked lately (folders are remembered on their
        own), and that verdict is reused for :data:`SYMLINK_CHECK_TTL` seconds; a symlink sends the path
        through the full ``resolve_in_brain`` check every time. This decides the packet's zones; it cannot
        make a later use of the path safe (a symlink may be swapped in after any check), which is why files
        are opened with O_NOFOLLOW where they are used (S-02).
        """
        zones: set[str] = set()
        if self.brain_root is None:
            for rel in files:
                zones |= self._zones_below(rel)
            return zones
        root = self._real_root()
        now = self.clock.monotonic()
        for i, rel in enumerate(files):
            zones |= self._zones_below(rel)
            if self._plain_until.get(rel, 0.0) > now:
                continue
            if len(self._plain_until) >= 4096:
                self._plain_until.clear()
            if len(self._absent_until) >= 4096:
                self._absent_until.clear()
            if _symlink_free(root, rel, self._plain_until, now, self._absent_until):
                self._plain_until[rel] = now + SYMLINK_CHECK_TTL
                continue
            try:
                real = resolve_in_brain(Path(root), rel)
            except UnsafePathError:
                raise UnsafePathError(f"scope.files[{i}] resolves outside the brain root (symlink)") from None
            if str(real) != root:
                zones |= self._zones_below(str(real.relative_to(root)) + ("/" if rel.endswith("/") else ""))
        return zones

    def _real_root(self) -> str:
        if self._root_real is None:
            assert self.brain_root is not None
            self._root_real = str(self.brain_root.resolve())
        return self._root_real

    def _zones_below(self, rel: str) -> frozenset[str]:
        """Zones of a path under the current rules, memoised (a pure function of path and rules)."""
        hit = self._zone_cache.get(rel)
        if hit is None:
            hit = zones_below(rel, self.zone_rules)
            if len(self._zone_cache) >= 4096:
                self._zone_cache.clear()
            self._zone_cache[rel] = hit
        return hit

    async def _deliver(self, outcome: Outcome, deliver: Handler | None = None) -> Outcome:
        pkt = outcome.packet
        assert pkt is not None
        targets: list[Handler] = []
        if deliver is not None:
            targets = [deliver]
        elif pkt.to == BROADCAST:
            targets = [self._handlers[n] for n in self.matrix.broadcast_recipients(pkt.from_) if n in self._handlers]
        elif pkt.to in self._handlers:
            targets = [self._handlers[pkt.to]]
        if not targets and self._default is not None:
            targets = [self._default]
        if not targets:
            return Outcome("undeliverable", pkt, f"no handler for {pkt.to}", outcome.decision)
        for handler in targets:
            try:
                await handler(pkt)
            except Exception as exc:  # noqa: BLE001 - a handler's failure is an outcome, not a crash
                log.warning("packet_handler_failed", packet=pkt.id, to=pkt.to, error=type(exc).__name__)
                return Outcome(
                    "undeliverable", pkt, f"handler for {pkt.to} failed ({type(exc).__name__})", outcome.decision
                )
        return Outcome("delivered", pkt, "", outcome.decision)

    async def _reply(self, outcome: Outcome, raw: Raw, channel: Channel) -> bool:
        """Answer a rejection to the sender's handler as an ERROR from ambient (not an edge of the matrix:
        the sender talked to the router, and the answer goes back on the same channel)."""
        handler = self._handlers.get(channel.principal)
        if handler is None:
            return False
        size, digest = _fingerprint(raw)
        rejected: dict[str, Any] = {"size": size, "sha256": digest}
        if outcome.packet is not None:
            rejected["id"] = outcome.packet.id
        try:
            reply = make_packet(
                AMBIENT,
                channel.principal,
                Signal.ERROR,
                now=self.clock.now(),
                context={
                    "error": outcome.status,
                    "rule": outcome.decision.rule if outcome.decision else "packet",
                    "reason": outcome.reason[:2000],
                    "rejected": rejected,
                },
                correlation_id=outcome.packet.correlation_id if outcome.packet else None,
            )
            await handler(reply)
        except PacketError:
            return False  # the sender's name cannot be addressed (e.g. broadcast); nothing to answer
        except Exception as exc:  # noqa: BLE001 - the reply is best effort; the denial is recorded anyway
            log.warning("packet_reply_failed", to=channel.principal, error=type(exc).__name__)
            return False
        return True

    # --- the record ------------------------------------------------------------------------

    def _record(self, outcome: Outcome, raw: Raw, channel: Channel, *, replied: bool = False) -> None:
        if self.audit is None:
            if outcome.status not in ("allowed", "delivered"):
                self._rejection_record(outcome, raw, channel, replied)  # still logged
            return
        status, pkt, _, decision = outcome
        if pkt is not None and (status == "allowed" or status == "delivered"):
            # The hot path: names, ids and signals are validated identifiers; the content is never recorded.
            self._batch.append(
                [
                    pkt.ts.timestamp(),
                    status,
                    pkt.id,
                    channel.principal,
                    pkt.from_,
                    pkt.to,
                    pkt.signal,
                    decision.rule if decision is not None else "allow",
                    len(raw) if type(raw) is bytes else None,
                ]
            )
            if len(self._batch) >= AUDIT_BATCH:
                self._write_batch()
            return
        rec = self._rejection_record(outcome, raw, channel, replied)
        self._write_batch()
        self._write(rec)

    def _write_batch(self) -> None:
        if not self._batch:
            return
        batch, self._batch = self._batch, []
        first = datetime.fromtimestamp(batch[0][0], UTC).isoformat()
        self._write({"ts": first, "status": "batch", "fields": AUDIT_FIELDS, "packets": batch})

    def _write(self, rec: dict[str, Any]) -> None:
        if self.audit is None:
            return
        try:
            self.audit.write(rec)
        except OSError as exc:  # a full disk must not stop the packet path; the log says why
            log.error("audit_write_failed", error=exc.strerror)

    def _rejection_record(self, outcome: Outcome, raw: Raw, channel: Channel, replied: bool) -> dict[str, Any]:
        """A refused or undelivered packet: metadata, the reason, and the raw packet's size and sha256 only."""
        status, pkt, reason, decision = outcome
        rec: dict[str, Any] = {
            "ts": (pkt.ts if pkt is not None else self.clock.now()).isoformat(),
            "status": status,
            "channel": channel.principal,
        }
        if pkt is not None:
            rec.update({"id": pkt.id, "from": pkt.from_, "to": pkt.to, "signal": pkt.signal})
        if decision is not None and status != "invalid":
            rec["rule"] = decision.rule
        rec["reason"] = reason
        if status == "undeliverable":
            return rec
        size, digest = _fingerprint(raw)
        rec["size"] = size
        rec["sha256"] = digest
        if replied:
            rec["replied"] = True
        log.info(
            "packet_rejected", status=status, rule=rec.get("rule"), channel=channel.principal, size=size, sha256=digest
        )
        return rec

    def flush(self) -> None:
        """Write the pending group and the buffered audit lines to the file (no fsync); call it each tick. On a full
        disk the lines stay in memory, in order, for the next flush (issue 24, 3): the audit is not worth a stop."""
        self._write_batch()
        if self.audit is not None:
            with contextlib.suppress(Unwritten):
                self.audit.flush()

    async def commit(self) -> None:
        """Make every audit record so far durable (group-committed fsync)."""
        self._write_batch()
        if self.audit is not None:
            await self.audit.commit()

    def close(self) -> None:
        """Flush, fsync and close the audit log."""
        self._write_batch()
        if self.audit is not None:
            self.audit.close()


_NO_ZONES: Final[frozenset[str]] = frozenset()
# Packet.model_validate minus its Python wrapper (same validator, same errors): the hot path's biggest cost.
_VALIDATE: Final[Callable[[dict[str, Any]], Packet]] = Packet.__pydantic_validator__.validate_python
_IDENTITY: Final = Decision(False, ("from does not match the channel's principal (S-05)",), "identity")
_IDENTITY_TOKEN: Final = Decision(False, ("the channel token is not live for this principal",), "identity.token")
_UNSAFE_PATH: Final = Decision(False, ("a scope file resolves outside the brain root",), "zone.unsafe-path")


# --- the inbox: how `ambient send` hands packets to the daemon -----------------------------------


INBOX_KEY: Final = "inbox.key"
_SEAL_HEX: Final = 32


def inbox_key(paths: BrainPaths) -> bytes:
    """The brain's inbox key (``.ambient/inbox.key``, 32 random bytes, 0600), made on first use.

    Who routed a packet (the daemon, or ``ambient send`` as the person when no daemon runs) seals it with this
    key; the daemon acts only on sealed packets. A confined agent cannot read ``.ambient/``, so a packet it
    drops in the inbox, whatever ``from`` it names, is never believed (issue 25, 1)."""
    path = paths.state / INBOX_KEY
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        key = b""
    if len(key) == 32:
        return key
    private_dir(paths.state)
    tmp = write_tmp(path, secrets.token_bytes(32), 0o600)  # whole and fsync'd, then published by link(): the
    try:  # first of two racing writers wins, and nobody ever reads half a key
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink()
    return path.read_bytes()


def _seal(key: bytes, data: bytes) -> str:
    return hmac.new(key, data, hashlib.sha256).hexdigest()[:_SEAL_HEX]


def write_inbox(paths: BrainPaths, packet: Packet) -> Path:
    """Write an authorized packet atomically as ``.ambient/inbox/<id>.<seal>.json`` for the daemon (the seal: an
    HMAC of the file's bytes under :func:`inbox_key`)."""
    private_dir(paths.inbox)
    data = packet.to_json().encode()
    target = paths.inbox / f"{packet.id}.{_seal(inbox_key(paths), data)}.json"
    atomic_write(target, data, mode=0o600)
    return target


def inbox_handler(paths: BrainPaths) -> Handler:
    """A handler that delivers by writing to the inbox (the default handler of ``ambient send``)."""

    async def deliver(packet: Packet) -> None:
        write_inbox(paths, packet)

    return deliver


def read_inbox(paths: BrainPaths) -> Iterator[tuple[Path, Packet | PacketError, bool]]:
    """Inbox packets in name order, each validated again (the inbox is a file drop, not a trust anchor), with
    whether its seal holds (see :func:`inbox_key`): an unsealed packet's ``from`` is believed by nobody."""
    key: bytes | None = None
    for path in iter_files(paths.inbox, (".json",)):
        try:
            raw = read_capped(path, MAX_PACKET_BYTES)
            key = key if key is not None else inbox_key(paths)
            stem = path.name.removesuffix(".json")
            _, _, seal = stem.rpartition(".")
            sealed = len(seal) == _SEAL_HEX and hmac.compare_digest(seal, _seal(key, raw))
            yield path, parse_packet(raw), sealed
        except InputError as exc:
            yield path, PacketError(exc.message, file=paths.rel(path)), False
        except OSError as exc:
            yield path, PacketError(f"cannot be read: {exc.strerror}", file=paths.rel(path)), False


def read_audit(path: Path) -> Iterator[dict[str, Any]]:
    """Every packet decision of an audit log, one dict per packet (groups expanded, ``ts`` as ISO 8601)."""
    for rec in iter_jsonl(path):
        if rec.get("status") != "batch":
            yield rec
            continue
        fields = rec.get("fields") or AUDIT_FIELDS
        for row in rec.get("packets") or []:
            entry = dict(zip(fields, row, strict=False))
            if isinstance(entry.get("ts"), int | float):
                entry["ts"] = datetime.fromtimestamp(entry["ts"], UTC).isoformat()
            if entry.get("size") is None:
                entry.pop("size", None)
            yield entry
