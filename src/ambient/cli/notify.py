"""``ambient notify test``: send a test message to the configured notification URLs and say which worked."""

from __future__ import annotations

import argparse
import os

from ambient.cli._common import EXIT_NO, EXIT_OK, EXIT_USAGE, add_command, brain_dir, fail, out, out_json, quiet_logs


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient notify test``."""
    parser = add_command(sub, "notify", None, help="notifications (apprise URLs, Telegram)")
    parser.set_defaults(func=lambda _args: _usage(parser))
    nsub = parser.add_subparsers(dest="notify_command", metavar="SUBCOMMAND")
    test = add_command(
        nsub,
        "test",
        _test,
        help="send a test message through every configured channel and say which worked",
        description=(
            "Send a test message through every channel the daemon notifies: the URLs ($AMBIENT_NOTIFY_URLS if set, "
            "else notify.urls in profil/ambient.yml) and, with telegram.answers on, the Telegram answers bot. "
            "{telegram_token} in a URL and the bot's token are read from $CREDENTIALS_DIRECTORY/telegram-token "
            "(or telegram.token_file). With a daemon running, it also says how each of the daemon's channels is "
            "(up, or off and why: a token refused, unreadable...): the daemon reads its secrets at start and at "
            "each reload, not when this command runs. Exit 0 if every channel worked, 1 if any failed or one of "
            "the daemon's is off, 2 if none is configured."
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

    from ambient.config.brain import load_settings
    from ambient.core.errors import DeliveryError
    from ambient.core.redact import SecretRegistry
    from ambient.human.channelstate import ChannelsReport, describe
    from ambient.human.messages import Message
    from ambient.human.notify import AppriseNotifier, Notifier, expand_urls
    from ambient.service.instance import daemon_up
    from ambient.service.notifications import build_notifiers, running_channels
    from ambient.storage.paths import BrainPaths

    quiet_logs(logging.ERROR)  # the report below says everything: the notifier's own lines would repeat it
    registry = SecretRegistry()
    notifier: Notifier | None
    broken: list[str] = []
    paths = BrainPaths(brain_dir(args))
    running = False
    daemon: ChannelsReport | None = None
    if args.url:
        urls = expand_urls(args.url, os.environ, registry, source="--url")
        notifier = AppriseNotifier(urls, timeout=args.timeout, registry=registry)
    else:
        # The running daemon's own channels: it read its secrets at its start or last reload, not now.
        running = daemon_up(paths)
        daemon = running_channels(paths) if running else None
        settings, problems = load_settings(paths, os.environ)
        if settings is None:
            return fail("; ".join(str(p) for p in problems))
        # The channels the daemon sends through, built by the same code: the URLs and the Telegram answers bot.
        built = build_notifiers(settings, os.environ, registry, timeout=args.timeout)
        broken = built.problems  # a channel that cannot be built fails here; the others are still tried
        notifier = built.notifier()
        if notifier is None and broken:
            for problem in broken:
                out(f"FAIL  {problem}")
            if not running:
                out("no daemon runs: the configuration alone was tested")
            return EXIT_NO
    if notifier is None:
        return fail(
            "no notification URL configured; set notify.urls in profil/ambient.yml or $AMBIENT_NOTIFY_URLS "
            "(or telegram.answers with a chat_id), or pass --url"
        )
    message = Message(
        title="ambient: test notification",
        body=f"Test message from ambient on {socket.gethostname()}. If you can read this, ambient can reach you here.",
        kind="info",
        dedupe_id="notify-test",
    )
    try:
        report = asyncio.run(notifier.send(message))
    except DeliveryError as exc:
        report = exc.report
    results = [(r.display, r.ok, r.detail) for r in report.results] + [(p, False, "") for p in broken]
    channels = list(daemon.channels) if daemon is not None else []
    daemon_off = any(c.state == "off" for c in channels)
    ok = report.ok and not broken and not daemon_off
    if args.json:
        out_json(
            {
                "ok": ok,
                "results": [{"url": url, "ok": ok, "detail": detail} for url, ok, detail in results],
                "daemon": {"up": running, "channels": [c.model_dump(mode="json") for c in channels]},
            }
        )
    else:
        for url, worked, detail in results:
            out(f"{'ok  ' if worked else 'FAIL'}  {url}" + (f"  ({detail})" if detail else ""))
        worked_count = sum(worked for _, worked, _ in results)
        out(f"{worked_count} of {len(results)} notification channel(s) worked")
        if channels:
            out("the running daemon's channels (as it read its secrets at its start or last reload):")
            for c in channels:
                out(f"{'FAIL' if c.state == 'off' else 'ok  ' if c.state == 'up' else '... '}  daemon: {describe(c)}")
            if daemon_off:
                out("fix what is off, then reload the daemon: `systemctl reload ambient` or `kill -HUP <pid>`")
        elif running and not args.url:
            out("the running daemon did not say how its channels are (an older version?)")
        elif not args.url:
            out("no daemon runs: the configuration alone was tested")
    return EXIT_OK if ok and results else EXIT_NO
