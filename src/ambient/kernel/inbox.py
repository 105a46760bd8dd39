"""The inbox: how ``ambient send`` hands packets to the daemon (``.ambient/inbox/``), sealed by whoever routed them.

A packet the router allowed is written as ``<id>.<seal>.json``, the seal an HMAC of the file's bytes under the
brain's :func:`inbox_key`; the daemon reads the inbox back (:func:`read_inbox`), validates every packet again and
believes a packet's ``from`` only under a seal that holds.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Final

from ambient.core.errors import InputError, PacketError
from ambient.kernel.packet import MAX_PACKET_BYTES, Packet, parse_packet
from ambient.storage.fsutil import atomic_write, iter_files, private_dir, publish_new, read_capped
from ambient.storage.paths import BrainPaths

INBOX_KEY: Final = "inbox.key"
_SEAL_HEX: Final = 32


def inbox_key(paths: BrainPaths) -> bytes:
    """The brain's inbox key (``.ambient/inbox.key``, 32 random bytes, 0600), made on first use.

    Who routed a packet (the daemon, or ``ambient send`` as the person when no daemon runs) seals it with this
    key; the daemon acts only on sealed packets. A confined agent cannot read ``.ambient/``, so a packet it
    drops in the inbox, whatever ``from`` it names, is never believed."""
    path = paths.state / INBOX_KEY
    try:
        key = path.read_bytes()
    except FileNotFoundError:
        key = b""
    if len(key) == 32:
        return key
    private_dir(paths.state)
    with contextlib.suppress(FileExistsError):  # the first of two racing writers wins, nobody reads half a key
        publish_new(path, secrets.token_bytes(32), mode=0o600)
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


def inbox_handler(paths: BrainPaths) -> Callable[[Packet], Awaitable[None]]:
    """A router handler (:data:`~ambient.kernel.router.Handler`) that delivers by writing to the inbox (the default
    handler of ``ambient send``)."""

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
