"""``ambient preflight check SESS_ID FILE`` and ``ambient preflight fail|reset|status TARGET``.

``check`` exits with the source's codes: 0 go, 1 scope, 2 locked, 3 circuit breaker, 4 claim
not open (or a parent paused/failed), 5 zone, 6 wrong theme branch (the lowest when several fail).
The breaker commands take a sess_id (its claim's scope) or a scope; ``fail`` and ``status`` exit
3 when the breaker is tripped.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from ambient.cli._common import EXIT_OK, add_command, brain_dir, out, out_json
from ambient.storage.paths import BrainPaths

_TRIPPED_EXIT = 3


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient preflight ...``."""
    p = add_command(sub, "preflight", None, help="pre-flight checks before a write, and the circuit breaker")
    actions = p.add_subparsers(dest="preflight_action", metavar="ACTION", required=True)

    c = add_command(
        actions,
        "check",
        _cmd_check,
        help="may SESS_ID write FILE? (exit 0 go, 1-6 the failed check)",
        description="Exit codes: 0 go, 1 scope, 2 locked, 3 circuit breaker, 4 claim not open or parent "
        "paused/failed, 5 zone, 6 theme branch.",
    )
    c.add_argument("sess_id", metavar="SESS_ID")
    c.add_argument("file", metavar="FILE", help="path relative to the brain root")
    c.add_argument(
        "--threshold", type=int, metavar="N", help="fails that trip a breaker (default: breaker_threshold, 3)"
    )
    c.add_argument("--json", action="store_true", help="print the problems as JSON")

    for name, helptext in (
        ("fail", "record one failure on the scope of TARGET (exit 3 once tripped)"),
        ("reset", "clear the breaker of TARGET (a person, after inspecting)"),
        ("status", "the breaker of TARGET (exit 3 if tripped)"),
    ):
        b = add_command(actions, name, _cmd_breaker, help=helptext)
        b.add_argument("target", metavar="TARGET", help="a sess_id (its claim's scope) or a scope")
        b.add_argument(
            "--threshold", type=int, metavar="N", help="fails that trip a breaker (default: breaker_threshold, 3)"
        )


def _cmd_check(args: argparse.Namespace) -> int:
    from ambient.claims.preflight import exit_code
    from ambient.claims.snapshot import run_preflight

    root = brain_dir(args)
    file = args.file
    if file.startswith("/"):
        with contextlib.suppress(ValueError):  # outside the brain: the scope check says so
            file = str(Path(file).relative_to(root))
    paths = BrainPaths(root)
    problems = run_preflight(paths, args.sess_id, file, threshold=_threshold(args, paths))
    if args.json:
        out_json([p.model_dump() for p in problems])
    elif not problems:
        out(f"ok: {args.sess_id} may write {args.file}")
    else:
        for problem in problems:
            out(str(problem))
    return exit_code(problems)


def _threshold(args: argparse.Namespace, paths: BrainPaths) -> int:
    """``--threshold``, else ``breaker_threshold`` of profil/ambient.yml: the daemon's breaker and this one agree."""
    if args.threshold is not None:
        return int(args.threshold)
    from ambient.actions.breakers import breaker_threshold

    return breaker_threshold(paths)


def _cmd_breaker(args: argparse.Namespace) -> int:
    from ambient.actions.breakers import scope_of
    from ambient.claims.breakers import Breaker

    paths = BrainPaths(brain_dir(args))
    scope = scope_of(paths, args.target)
    threshold = _threshold(args, paths)
    breaker = Breaker(paths, threshold=threshold)
    if args.preflight_action == "fail":
        fails = breaker.fail(scope)
        tripped = breaker.tripped(scope)
        out(f"{scope}: {fails} consecutive failure(s){' — TRIPPED' if tripped else ''}")
        return _TRIPPED_EXIT if tripped else EXIT_OK
    if args.preflight_action == "reset":
        from ambient.actions.breakers import reset_breaker

        for line in reset_breaker(paths, args.target, threshold=threshold).lines:
            out(line)
        return EXIT_OK
    state = breaker.status(scope)
    tripped = state.is_tripped(threshold)
    since = f" since {state.tripped_at}" if state.tripped_at else ""
    out(f"{scope}: {state.fails} consecutive failure(s), {'TRIPPED' + since if tripped else 'closed'}")
    return _TRIPPED_EXIT if tripped else EXIT_OK
