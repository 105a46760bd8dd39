"""One daemon per brain: the ``flock`` on ``.ambient/daemon.lock`` it holds for its lifetime, the ``daemon.json`` it
writes, and how the CLI tells that a daemon runs (a live flock, not a pid file that can go stale) and which."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ambient import __version__
from ambient.core.errors import AlreadyRunningError
from ambient.core.lazylog import get_logger
from ambient.storage.fsutil import PRIVATE_FILE, atomic_write, open_private, private_dir
from ambient.storage.paths import BrainPaths

if TYPE_CHECKING:
    from ambient.config.brain import Brain

log = get_logger(__name__)


class SingleInstance:
    """``flock`` on ``.ambient/daemon.lock`` for the daemon's lifetime; the kernel drops it if we die."""

    def __init__(self, paths: BrainPaths) -> None:
        self.paths = paths
        self.fd: int | None = None
        self.info: dict[str, Any] = {}
        self.unwritten = False  # daemon.json could not be written (a full disk): written again once there is room

    @property
    def info_path(self) -> Path:
        return self.paths.state / "daemon.json"

    def acquire(self, now: datetime) -> None:
        private_dir(self.paths.state)
        fd = open_private(self.paths.daemon_lock, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid = lock_holder(self.paths.daemon_lock) or running_pid(self.paths, alive=True)
            raise AlreadyRunningError(
                f"ambient is already running on {self.paths.root}"
                + (f" (pid {pid})" if pid else "")
                + "; stop it first (systemctl stop ambient, or kill -TERM the pid)"
            ) from None
        self.fd = fd
        self.info = {"pid": os.getpid(), "started_at": now.isoformat(), "version": __version__}
        self._write_info()

    def record_loaded(self, brain: Brain, now: datetime, model_keys: Iterable[str] = ()) -> None:
        """Say in ``daemon.json`` what the daemon runs with: ``profil/ambient.yml`` (its sha256 and values, secrets
        masked; ``ambient doctor`` compares them with the file to tell a daemon that did not reload) and each
        workflow's sha256 (a file that no longer loads keeps its previous version here, which ``ambient start``
        then starts)."""
        found = brain.settings_file
        self.info["settings"] = {
            "applied_at": now.isoformat(),
            "digest": found.digest if found else None,
            "file": found.own if found else None,
        }
        self.info["workflows"] = {name: wf.spec_hash for name, wf in sorted(brain.workflows.items())}
        self.info["model_keys"] = sorted(model_keys)  # names only: `ambient doctor` checks the daemon's, not its own
        self._write_info()

    def _write_info(self) -> None:
        """``daemon.json``: what the CLI reads of the running daemon. A full disk does not keep the daemon from
        starting (a restart loop under systemd): the flock says it runs, the file follows later."""
        try:
            atomic_write(self.info_path, json.dumps(self.info) + "\n", mode=PRIVATE_FILE)
        except OSError as exc:
            from ambient.core.health import resource_of  # pydantic: not on the path of `ambient status`

            if resource_of(exc) is None:
                raise
            self.unwritten = True
            log.warning("daemon_info_not_written", path=str(self.info_path), error=str(exc))
        else:
            self.unwritten = False

    def write_if_unwritten(self) -> None:
        if self.unwritten and self.fd is not None:
            self._write_info()

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def daemon_up(paths: BrainPaths) -> bool:
    """True while a daemon holds the brain (a live flock, not a pid file that can go stale)."""
    if not paths.daemon_lock.exists():
        return False
    fd = os.open(paths.daemon_lock, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def running_pid(paths: BrainPaths, *, alive: bool = False) -> int | None:
    """The pid the running daemon wrote, if readable (and, with ``alive``, only if that process exists)."""
    try:
        data = json.loads((paths.state / "daemon.json").read_text())
        pid = int(data["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if alive:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except OSError:
            pass  # another user's process: it exists
    return pid


def lock_holder(path: Path) -> int | None:
    """The pid holding an exclusive ``flock`` on ``path``, from Linux's ``/proc/locks`` (None elsewhere or unknown).

    A daemon that loses the start race names the winner from this: ``daemon.json`` is written only once the lock is
    taken, so in between it still names the previous daemon, possibly long dead."""
    try:
        st = path.stat()
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 26824 fe:00:2146670 0 EOF" (a waiter's line has "->" in second place)
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[3] == "WRITE" and parts[5] == ident:
            with contextlib.suppress(ValueError):
                pid = int(parts[4])
                if pid > 0:
                    return pid
    return None


def served_workflow(paths: BrainPaths, workflow: str) -> str | None:
    """The sha256 of the version of ``workflow`` the running daemon serves (None: no daemon, or it has none)."""
    if not daemon_up(paths):
        return None
    try:
        served = json.loads((paths.state / "daemon.json").read_text()).get("workflows") or {}
    except (OSError, ValueError, AttributeError):
        return None
    sha = served.get(workflow) if isinstance(served, dict) else None
    return sha if isinstance(sha, str) else None
