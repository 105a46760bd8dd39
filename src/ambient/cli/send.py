"""``ambient send [FILE|-]``: hand a packet (YAML or JSON) to the brain's router, then to the daemon's inbox.

Validate, authorize, record in the audit log, and deliver by writing ``.ambient/inbox/<id>.json``: done by the
running daemon, over its send socket (:mod:`ambient.kernel.sendsocket`), else in this process.
Identity: the token in ``AMBIENT_CHANNEL_TOKEN`` (handed to agents ambient spawned), else ``human``.
Exit 0 delivered, 1 denied, 2 invalid (or the packet could not be delivered).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ambient.cli._common import EXIT_NO, EXIT_OK, EXIT_USAGE, add_command, brain_dir, fail, out, out_json, say

# The router is imported only when no daemon answers (see ambient.kernel.sendsocket): it costs ~0.2 s of imports.


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``send``."""
    p = add_command(
        sub,
        "send",
        _send,
        help="pass a packet (YAML or JSON) through the brain's router to the daemon (exit 0 delivered, "
        "1 denied, 2 invalid)",
    )
    p.add_argument("file", nargs="?", default="-", metavar="FILE|-", help="packet file, or - for stdin (default)")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")


def _read(source: str, limit: int) -> bytes:
    """The packet's bytes; of an oversized one, the first ``limit + 1`` (enough for the router to refuse it) with the
    size and sha256 of the whole, which the audit records."""
    import hashlib

    fh = sys.stdin.buffer if source == "-" else Path(source).open("rb")  # noqa: SIM115 - closed below
    try:
        head = fh.read(limit + 1)
        if len(head) <= limit:
            return head
        from ambient.kernel.router import CutInput  # here: a packet the daemon answers needs no router (see above)

        digest, size = hashlib.sha256(head), len(head)
        while chunk := fh.read(1024 * 1024):
            digest.update(chunk)
            size += len(chunk)
        return CutInput(head, size, digest.hexdigest())
    finally:
        if fh is not sys.stdin.buffer:
            fh.close()


def _send(args: argparse.Namespace) -> int:
    from ambient.actions.send import send_packet
    from ambient.core.errors import NoAnswer
    from ambient.kernel.sendsocket import MAX_PACKET_BYTES, TOKEN_ENV
    from ambient.storage.paths import BrainPaths

    root = brain_dir(args)
    if not root.is_dir():
        return fail(f"{root} is not a directory; expected a brain (--brain DIR)")
    try:
        raw = _read(args.file, MAX_PACKET_BYTES)
    except OSError as exc:
        return fail(f"{args.file}: cannot be read: {exc.strerror}")
    paths = BrainPaths(root)
    token = os.environ.get(TOKEN_ENV) or None
    try:
        sent = send_packet(paths, raw, token)
    except NoAnswer as exc:
        return fail(f"{exc.strerror}; the packet may have been delivered (see .ambient/audit.jsonl)")
    for problem in sent.problems:
        say(f"{problem}")
    return _report(sent.answer, args.json)


def _report(answer: dict[str, Any], as_json: bool) -> int:
    status = answer.get("status")
    if as_json:
        out_json({key: answer.get(key) for key in ("status", "id", "rule", "reason")})
    elif status == "delivered":
        out(f"delivered {answer.get('id')}: {answer.get('from')} → {answer.get('to')} {answer.get('signal')}")
        if answer.get("signal") == "SPAWN":
            out(f"the daemon runs it as a one-item run: ambient status spawn-{answer.get('to')}")
    else:
        rule = f" (rule {answer['rule']})" if status == "denied" and answer.get("rule") else ""
        say(f"{status}: {answer.get('reason')}{rule}")
    if status == "delivered":
        return EXIT_OK
    if status == "denied":
        return EXIT_NO
    return EXIT_USAGE
