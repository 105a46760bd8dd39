"""``ambient notify test``: send a test message to the configured notification URLs and say which worked."""

from __future__ import annotations

import argparse
import os

from ambient.cli._common import EXIT_NO, EXIT_OK, EXIT_USAGE, add_command, brain_dir, fail, out, out_json


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient notify test``."""
    parser = add_command(sub, "notify", None, help="notifications (apprise URLs, Telegram)")
    parser.set_defaults(func=lambda _args: _usage(parser))
    nsub = parser.add_subparsers(dest="notify_command", metavar="SUBCOMMAND")
    test = add_command(
        nsub,
        "test",
        _test,
        help="send a test message to every configured URL and say which worked",
        description=(
            "Send a test message to the notification URLs: $AMBIENT_NOTIFY_URLS if set, else notify.urls in "
            "profil/ambient.yml. {telegram_token} in a URL is read from $CREDENTIALS_DIRECTORY/telegram-token. "
            "Exit 0 if every URL worked, 1 if any failed, 2 if none is configured."
        ),
    )
    test.add_argument(
        "--url",
        action="append",
        metavar="URL",
        help="test this apprise URL instead of the configured ones (repeatable)",
    )
    test.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS", help="per-URL time limit (default 30)")
    test.add_argument("--json", action="store_true", help="print the results as JSON")


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return EXIT_USAGE


def _test(args: argparse.Namespace) -> int:
    # Heavy imports (asyncio, structlog, apprise through the notifier) only when the command runs.
    import asyncio
    import logging
    import socket

    import structlog

    from ambient.notify import AppriseNotifier, DeliveryError, Message, expand_urls, notify_urls_from
    from ambient.paths import BrainPaths
    from ambient.redact import SecretRegistry

    if not structlog.is_configured():
        # The report below says everything; keep the notifier's own events off stdout (--json stays clean).
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    registry = SecretRegistry()
    if args.url:
        urls = expand_urls(args.url, os.environ, registry, source="--url")
    else:
        urls = notify_urls_from(BrainPaths(brain_dir(args)), os.environ, registry)
    if not urls:
        return fail(
            "no notification URL configured; set notify.urls in profil/ambient.yml or $AMBIENT_NOTIFY_URLS, "
            "or pass --url"
        )
    message = Message(
        title="ambient: test notification",
        body=f"Test message from ambient on {socket.gethostname()}. If you can read this, ambient can reach you here.",
        kind="info",
        dedupe_id="notify-test",
    )
    notifier = AppriseNotifier(urls, timeout=args.timeout, registry=registry)
    try:
        report = asyncio.run(notifier.send(message))
    except DeliveryError as exc:
        report = exc.report
    results = report.results
    if args.json:
        out_json({"ok": report.ok, "results": [{"url": r.display, "ok": r.ok, "detail": r.detail} for r in results]})
    else:
        for r in results:
            out(f"{'ok  ' if r.ok else 'FAIL'}  {r.display}" + (f"  ({r.detail})" if r.detail else ""))
        worked = sum(r.ok for r in results)
        out(f"{worked} of {len(results)} notification URL(s) worked")
    return EXIT_OK if report.ok and results else EXIT_NO
