"""The only packet path (DESIGN 2.1): validate → authorize → deliver → record.

Identity comes from the channel a packet arrived on, never from its ``from`` field (S-05): a
:class:`~ambient.kernel.channels.Channel` names the authenticated principal, and a channel carrying a token must
hold a live token of that principal in the :class:`~ambient.kernel.channels.ChannelRegistry`. Authorization is
the access matrix (:mod:`~ambient.kernel.matrix`) over the zones of the packet's scope, its files taken as
written and as resolved (a symlink to a personal file is personal).

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
import json
import os
import secrets
import stat
from collections.abc import Awaitable, Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, NamedTuple

from pydantic import ValidationError

from ambient.core.clock import Clock, SystemClock
from ambient.core.errors import InputError, JournalWriteError, PacketError, UnsafePathError
from ambient.core.lazylog import get_logger
from ambient.core.problems import Problem
from ambient.kernel.channels import Channel, ChannelRegistry
from ambient.kernel.matrix import AccessMatrix, Decision
from ambient.kernel.packet import AMBIENT, BROADCAST, Packet, Signal, decode_packet, make_packet, validation_message
from ambient.kernel.zones import DEFAULT_RULES, ZoneRule, zones_below
from ambient.storage.fsutil import resolve_in_brain
from ambient.storage.journal import Journal, iter_jsonl
from ambient.storage.paths import BrainPaths

log = get_logger(__name__)

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
    cost (bench/fanout.py (a), whose folders do not exist: 6.6 % of the loop's samples on 2026-12-01, py-spy).
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
        disk the lines stay in memory, in order, for the next flush: the audit is not worth a stop."""
        self._write_batch()
        if self.audit is not None:
            with contextlib.suppress(JournalWriteError):
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
