"""``ambient web``: serve the web console of this brain and print the URL to open (token included)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ambient.cli._common import EXIT_NO, EXIT_OK, add_command, brain_dir
from ambient.storage.paths import BrainPaths


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient web``."""
    p = add_command(
        sub,
        "web",
        _web,
        "serve the web console (runs live, escalations, workflows, learning) and print its URL",
        description=(
            "Serve the web console of this brain on 127.0.0.1 and print the URL to open; the URL carries a token "
            "(kept 0600 in .ambient/web/token, reused across starts), which the console exchanges for a sign-in "
            "cookie of its own secret path. "
            "A non-loopback --host needs --tls-cert/--tls-key, or --insecure-bind. Stop with Ctrl-C."
        ),
    )
    p.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default 8765; 0 = any free port, printed)")
    p.add_argument("--tls-cert", type=Path, metavar="PEM", help="serve HTTPS with this certificate")
    p.add_argument("--tls-key", type=Path, metavar="PEM", help="the certificate's private key")
    p.add_argument(
        "--insecure-bind",
        action="store_true",
        help="allow a non-loopback --host over plain HTTP (everyone on that network can read and act)",
    )
    p.add_argument(
        "--new-token",
        action="store_true",
        help="replace the token: every console of the brain takes it and refuses the old sign-ins (each browser "
        "opens the new URL); when a console serves the brain already, print its new URL instead of starting one",
    )
    p.add_argument(
        "--url",
        action="store_true",
        help="only print the URL (with its token) of the console, e.g. the one the daemon hosts (web: in ambient.yml)",
    )


def _web(args: argparse.Namespace) -> int:
    from ambient.web.security import load_token
    from ambient.web.server import DEFAULT_HOST, DEFAULT_PORT, Bind, serve, serving_url, serving_urls, token_url

    paths = BrainPaths(brain_dir(args))
    token = load_token(paths, rotate=args.new_token)
    bind = Bind(
        host=args.host or DEFAULT_HOST,
        port=DEFAULT_PORT if args.port is None else args.port,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        insecure_bind=args.insecure_bind,
    )
    if args.url:
        served = serving_url(paths)
        if served is None:
            print(
                "no console serves this brain now: start one with `ambient web`, or set web: in "
                "profil/ambient.yml and run the daemon (docs/console.md)",
                file=sys.stderr,
            )
            return EXIT_NO
        print(token_url(served, token))
        return EXIT_OK
    if args.new_token:
        running = serving_urls(paths)
        if running:
            # The consoles serving the brain read the token file at their next request: they take the new token
            # (and refuse every sign-in of the old one); a second console beside them is not what was asked.
            print(
                "a new token: the console(s) serving this brain take it now, and refuse every sign-in made with the "
                "old one; open the new URL in each browser (no console was started; `ambient web` starts one)",
                flush=True,
            )
            for served in running:
                print(f"ambient console: {token_url(served, token)}", flush=True)
            return EXIT_OK
    warning = bind.check()
    if warning:
        print(warning, flush=True)

    def ready(url: str) -> None:
        print(f"ambient console: {url}", flush=True)

    serve(paths, bind, token=token, on_ready=ready)
    return EXIT_OK
