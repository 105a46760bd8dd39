"""``ambient lock acquire|release|check|list|cleanup``: the file-lock mutex (spec/002 BSI-v3-7) for scripts.

Exit codes of the source's ``file-lock.sh``: 0 ok; 1 held by another holder (acquire, check);
2 release refused (wrong holder or not held) or any error. Locks taken here are bound to their
session (HOLDER), not to this short-lived process: only release or the TTL frees them.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ambient.cli._common import EXIT_NO, EXIT_OK, EXIT_USAGE, add_command, brain_dir, fail, out, out_json, say
from ambient.storage.paths import BrainPaths

if TYPE_CHECKING:  # imported in the handlers only: this command runs around every write of a script
    from ambient.claims.locks import LockManager
    from ambient.claims.lockstate import LockStatus


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ambient lock ...``."""
    p = add_command(
        sub,
        "lock",
        None,
        help="file-lock mutex: acquire, release, check, list, cleanup",
        description="Lock files of the brain (locks/<encoded path>.lock). Exit codes: 0 ok, 1 held by another "
        "holder, 2 release refused or error.",
    )
    actions = p.add_subparsers(dest="lock_action", metavar="ACTION", required=True)

    a = add_command(actions, "acquire", _cmd_acquire, help="take the lock of FILE for HOLDER (exit 1 if held)")
    a.add_argument("file", metavar="FILE", help="path relative to the brain root (a folder ends with /)")
    a.add_argument("holder", metavar="HOLDER", help="the holder, usually the session id (sess_id)")
    a.add_argument("--ttl", type=float, default=60.0, metavar="MIN", help="minutes before it expires (default 60)")
    a.add_argument("--wait", type=float, default=0.0, metavar="SECONDS", help="wait up to SECONDS if it is held")
    a.add_argument("--json", action="store_true", help="print the grant as JSON")

    r = add_command(actions, "release", _cmd_release, help="release the lock of FILE held by HOLDER (exit 2 if not)")
    r.add_argument("file", metavar="FILE")
    r.add_argument("holder", metavar="HOLDER")
    r.add_argument("--token", type=int, default=None, help="release only if the lock still carries this token")

    c = add_command(actions, "check", _cmd_check, help="who holds FILE (exit 0 free, 1 held)")
    c.add_argument("file", metavar="FILE")
    c.add_argument("--json", action="store_true", help="print the lock as JSON")

    ls = add_command(actions, "list", _cmd_list, help="every lock, with its state")
    ls.add_argument("--json", action="store_true", help="print JSON")

    add_command(actions, "cleanup", _cmd_cleanup, help="remove expired, dead-holder and stale unreadable locks")


def _manager(args: argparse.Namespace) -> LockManager:
    from ambient.claims.locks import LockManager

    return LockManager(BrainPaths(brain_dir(args)))


def _relative(root: Path, file: str) -> str:
    """Accept an absolute path inside the brain too (scripts often pass "$PWD/...")."""
    if file.startswith("/"):
        try:
            rel = str(Path(file).relative_to(root))
        except ValueError:
            return file  # refused later with a clear message
        return rel + ("/" if file.endswith("/") else "")
    return file


def _status_json(status: LockStatus) -> dict[str, object]:
    return {
        "file": status.file,
        "state": status.state,
        "lock": str(status.path),
        "problem": status.problem,
        **({"info": status.info.as_dict()} if status.info is not None else {}),
    }


def _cmd_acquire(args: argparse.Namespace) -> int:
    from ambient.core.errors import LockBusyError
    from ambient.storage.fsutil import resolve_in_brain

    if not args.ttl > 0:
        return fail(f"--ttl must be a positive number of minutes, got {args.ttl}")
    if args.wait < 0:
        return fail(f"--wait must be 0 (no wait) or more seconds, got {args.wait}")
    rel = _relative(brain_dir(args), args.file)
    if not rel.startswith("/"):  # an absolute path outside the brain is refused by the lock manager, with its words
        resolve_in_brain(brain_dir(args), rel)  # a symlink out of the brain: refused as preflight refuses it
    manager = _manager(args)
    try:
        grant = manager.acquire(rel, args.holder, ttl_s=args.ttl * 60, wait=args.wait, pid_bound=False)
    except LockBusyError as exc:
        say(f"{exc}")
        return EXIT_NO
    finally:
        manager.close()
    if grant.took_over is not None:
        prev = grant.took_over.info.holder if grant.took_over.info else "an unreadable lock"
        state = grant.took_over.state
        say(f"warning: took over the {state} lock of {prev} on {grant.file}")
    if args.json:
        out_json(
            {
                "file": grant.file,
                "holder": grant.holder,
                "token": grant.token,
                "expires_at": grant.expires_at.isoformat(timespec="seconds"),
                "refreshed": grant.refreshed,
            }
        )
    else:
        verb = "refreshed" if grant.refreshed else "locked"
        out(f"{verb} {grant.file} for {grant.holder} until {grant.expires_at:%Y-%m-%dT%H:%M:%S} (token {grant.token})")
    return EXIT_OK


def _cmd_release(args: argparse.Namespace) -> int:
    from ambient.actions.locks import release_lock
    from ambient.core.errors import LockNotHeldError

    root = brain_dir(args)
    try:
        release_lock(BrainPaths(root), _relative(root, args.file), args.holder, token=args.token)
    except LockNotHeldError as exc:
        return fail(str(exc), EXIT_USAGE)
    out(f"released {args.file}")  # as the person typed it (an absolute path stays absolute)
    return EXIT_OK


def _cmd_check(args: argparse.Namespace) -> int:
    manager = _manager(args)
    try:
        status = manager.check(_relative(brain_dir(args), args.file))
    finally:
        manager.close()
    if args.json:
        out_json(_status_json(status))
    else:
        out(status.describe())
    return EXIT_NO if status.blocking else EXIT_OK


def _cmd_list(args: argparse.Namespace) -> int:
    manager = _manager(args)
    try:
        statuses = manager.list()
    finally:
        manager.close()
    if args.json:
        out_json([_status_json(s) for s in statuses])
        return EXIT_OK
    if not statuses:
        out("No locks.")
    for status in statuses:
        out(status.describe())
        if status.problem and status.info is None:
            say(f"warning: {status.problem}")
    return EXIT_OK


def _cmd_cleanup(args: argparse.Namespace) -> int:
    manager = _manager(args)
    try:
        removed = manager.cleanup()
    finally:
        manager.close()
    for status in removed:
        out(f"removed {status.describe()}")
    out(f"{len(removed)} lock(s) removed")
    return EXIT_OK
