"""``ambient send [FILE|-]``: hand a packet (YAML or JSON) to the brain's router, then to the daemon's inbox.

Validate, authorize, record in the audit log, and deliver by writing ``.ambient/inbox/<id>.json``: done by the
running daemon, over its send socket (:mod:`ambient.sendsocket`), else in this process.
Identity: the token in ``AMBIENT_CHANNEL_TOKEN`` (handed to agents ambient spawned), else ``human``.
Exit 0 delivered, 1 denied, 2 invalid (or the packet could not be delivered).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ambient.cli._common import EXIT_NO, EXIT_OK, EXIT_USAGE, add_command, brain_dir, fail, out, out_json, say

if TYPE_CHECKING:
    from ambient.paths import BrainPaths

# The router is imported only when no daemon answers (see ambient.sendsocket): it costs ~0.2 s of imports.


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
    # One byte over the limit is enough for the router to refuse (and record) an oversized packet.
    if source == "-":
        return sys.stdin.buffer.read(limit + 1)
    with Path(source).open("rb") as fh:
        return fh.read(limit + 1)


def _send(args: argparse.Namespace) -> int:
    from ambient.paths import BrainPaths
    from ambient.sendsocket import MAX_PACKET_BYTES, TOKEN_ENV, NoAnswer, ask_daemon

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
        answer = ask_daemon(paths.state, raw, token)
    except NoAnswer as exc:
        return fail(f"{exc.strerror}; the packet may have been delivered (see .ambient/audit.jsonl)")
    if answer is None:  # no daemon listening: route it here
        answer = _route_here(paths, raw, token)
    return _report(answer, args.json)


def _route_here(paths: BrainPaths, raw: bytes, token: str | None) -> dict[str, Any]:
    """Route in this process, as the daemon would: the same router, audit record and inbox delivery."""
    import asyncio

    from ambient.router import Router, inbox_handler
    from ambient.sendsocket import summary

    _quiet_logs()
    router, problems = Router.for_brain(paths, buffered=True)
    try:
        for problem in problems:
            if problem.severity == "error":
                say(f"{problem}")
        router.set_default(inbox_handler(paths))
        assert router.registry is not None
        outcome = asyncio.run(router.send(raw, router.registry.channel_for(token)))
    finally:
        router.close()
    return summary(outcome)


def _quiet_logs() -> None:
    """Unless logging is set up already, keep the router's info lines out of stdout (the answer goes there)."""
    import logging

    import structlog

    if not structlog.is_configured():
        structlog.configure(
            wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
            logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        )


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
