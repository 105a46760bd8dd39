"""What a confined agent may touch: read the brain and the system, write only its SPAWN's scope and a temp dir.

An agent is code ambient does not trust, running as ambient's own Unix user (issue 25). Under Landlock (see
:mod:`ambient.runners.landlock`, applied by the spawner in the agent's process just before it execs) it gets:

- read and execute: the system (``/usr``, ``/bin``, ``/lib*``, ``/etc``, ``/opt``, ``/proc``, ``/sys``, the
  resolver's files of ``/run``, and the few devices programs read: ``/dev/null``, ``/dev/urandom``...), the
  interpreter running ambient (its prefixes and import path), the agent's own program, and the brain, except what
  is the daemon's or the person's alone: ``.ambient/`` (journals, escalations, the inbox, tokens: so an agent can
  neither answer an escalation nor drop a packet in the person's name), ``profil/ambient.yml`` and the files of
  ``profil/`` that hold secrets (names with token, secret, credential, password; ``*.key``, ``*.pem``);
- write: the SPAWN's scope (a file that does not exist yet: its folder, made if missing), ``claims/`` and
  ``locks/`` (the kernel's mutex and the claims agents write under a token), a private temp dir (``TMPDIR``),
  ``/dev/null``.

The network, from Landlock ABI 4 on: a confined agent binds no TCP port and connects only to the ports its runner
names (``network: [host:port, ...]``; ``network: any`` leaves its TCP alone); none by default for a command agent,
its model API's for a Claude agent. Landlock's rules are by port, not host; UDP (DNS) and Unix sockets are not
covered. Beyond files, a confined agent cannot signal, ptrace or read the memory of the daemon (Landlock's
scoping). ``ambient.runner.confine: false`` runs an agent unconfined.

A Claude agent is held by the same policy (:func:`policy`), applied by its launcher
(:mod:`ambient.runners.claude_launch`) before it execs Claude Code, plus its own session folder under
``.ambient/claude/agents/`` (Claude Code's config and home) that it reads and writes.

:func:`jail` is what the spawner applies to one command agent: that policy, and the Unix user its config names
(``ambient.runner.user``: ambient runs as root then); :func:`landlock_abi` says whether this kernel confines at all.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import pwd
import shutil
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ambient.runners.base import RunRequest
from ambient.runners.config import CommandRunnerConfig, network_ports
from ambient.storage.paths import STATE_DIRNAME

#: The devices a program reads (shells, Python, Node): never ``/dev`` as a whole (disks, ``/dev/mem``, terminals,
#: ``/dev/shm``). ``/dev/stdin`` and ``/dev/fd`` lead to ``/proc/self/fd``, readable with ``/proc``.
DEVICES_READ = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
#: Not /run: systemd keeps services' credentials there (/run/credentials); only its resolver's files (DNS).
SYSTEM_READ = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/etc",
    "/opt",
    "/proc",
    "/sys",
    "/run/systemd/resolve",
    *DEVICES_READ,
)
DEVICES_WRITE = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty")
_SECRET_WORDS = ("token", "secret", "credential", "password")
_SECRET_SUFFIXES = (".key", ".pem")
#: Brain folders every agent may write (claims and locks are written under a fencing token).
SHARED_WRITE = ("claims", "locks")


@dataclass(frozen=True)
class Policy:
    """The paths a confined agent may read (and execute) and write, as the spawner hands them to Landlock."""

    read: tuple[str, ...]
    write: tuple[str, ...]
    #: The TCP ports it may connect to (binding none); None: its TCP is not confined (``network: any``).
    connect: tuple[int, ...] | None = ()

    def as_request(self, abi: int) -> dict[str, Any]:
        """The spawner's ``jail`` entries for Landlock."""
        return {
            "read": [os.fsencode(p) for p in self.read],
            "write": [os.fsencode(p) for p in self.write],
            "abi": abi,
            "connect": None if self.connect is None else list(self.connect),
        }


def secret_name(name: str) -> bool:
    """Whether a file of ``profil/`` holds secrets an agent never reads."""
    low = name.lower()
    return low == "ambient.yml" or any(w in low for w in _SECRET_WORDS) or low.endswith(_SECRET_SUFFIXES)


_BRAIN_READ: dict[str, tuple[tuple[int, int], list[str]]] = {}


def brain_read(brain: Path) -> list[str]:
    """The brain's entries an agent may read: all but ``.ambient/`` and the secrets of ``profil/`` (kept while the
    brain's folder and ``profil/`` are unchanged: a fan-out starts many agents on one brain)."""
    try:
        profil = brain / "profil"
        key = (brain.stat().st_mtime_ns, profil.stat().st_mtime_ns if profil.is_dir() else 0)
    except OSError:
        key = (0, 0)
    hit = _BRAIN_READ.get(str(brain))
    if hit is not None and hit[0] == key:
        return hit[1]
    out = _brain_read(brain)
    _BRAIN_READ[str(brain)] = (key, out)
    return out


def _brain_read(brain: Path) -> list[str]:
    out: list[str] = []
    try:
        entries = sorted(os.scandir(brain), key=lambda e: e.name)
    except OSError:
        return out
    for entry in entries:
        if entry.name == STATE_DIRNAME:
            continue
        if entry.name == "profil" and entry.is_dir(follow_symlinks=False):
            with contextlib.suppress(OSError):
                out += [e.path for e in os.scandir(entry.path) if not secret_name(e.name)]
            continue
        out.append(entry.path)
    return out


@functools.cache
def interpreter_read(brain: Path) -> list[str]:
    """Where the interpreter running ambient lives (``{{python}}`` agents run it, with its packages), but never a
    folder holding the brain (``python -m`` puts its working folder on the import path: the brain itself)."""
    found = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, str(Path(sys.executable).parent)}
    found.update(p for p in sys.path if p.startswith("/"))  # an editable install's source folder, .pth entries
    root = brain.resolve()
    return sorted(p for p in found if p and not root.is_relative_to(Path(p).resolve()))


def scope_write(brain: Path, files: Iterable[str]) -> list[str]:
    """Where the scope lets the agent write: each path of the scope as it is, or, not there yet, its folder
    (made now, so the agent can create the file)."""
    out: list[str] = []
    root = brain.resolve()
    for rel in files:
        target = (root / rel).resolve()
        if not target.is_relative_to(root) or target == root or STATE_DIRNAME in target.relative_to(root).parts:
            continue  # never outside the brain, never the whole brain, never the daemon's state
        if not target.exists():
            target = target.parent
            try:
                target.mkdir(parents=True, exist_ok=True)
            except OSError:
                continue
        out.append(str(target))
    return out


def policy(
    brain: Path,
    files: Sequence[str],
    tmp: Path,
    program: str,
    *,
    connect: tuple[int, ...] | None = (),
    own: Sequence[str] = (),
) -> Policy:
    """The policy of one agent: see the module's docstring. ``own``: folders of its own it also reads and writes
    (a Claude agent's session folder)."""
    read = [*SYSTEM_READ, *interpreter_read(brain), *brain_read(brain), *own]
    if program.startswith("/"):
        read.append(program)
    write = [*scope_write(brain, files), *(str(brain / d) for d in SHARED_WRITE), str(tmp), *own, *DEVICES_WRITE]
    return Policy(tuple(dict.fromkeys(read)), tuple(dict.fromkeys(write)), connect)


# ---------------------------------------------------------------------------------------------------------------
# One agent's jail


@functools.cache
def landlock_abi() -> int:
    """Landlock's ABI on this kernel (0: agents cannot be confined here), asked once."""
    # Imported when first asked: it loads ctypes and the C library, which importing the runners need not pay for.
    from ambient.runners import landlock

    return landlock.abi()


def jail(req: RunRequest, cfg: CommandRunnerConfig, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """What the spawner applies to this agent's process before it execs (empty: nothing): the Unix user of
    ``cfg.user`` (``uid``, ``gid``) and the Landlock paths of :func:`policy` (``read``, ``write``, ``abi``).

    Sets ``env`` to match (HOME, USER and LOGNAME of that user; TMPDIR, the agent's private temp dir, removed at
    the end by :func:`drop_tmp`). OSError when the user cannot be taken."""
    found = {**_user(cfg, env), **(_landlock(req, cfg, argv, env) or {})}
    if "uid" in found and env.get("TMPDIR"):
        os.chown(env["TMPDIR"], found["uid"], found["gid"])  # its private temp dir is its own
    return found


def _user(cfg: CommandRunnerConfig, env: dict[str, str]) -> dict[str, Any]:
    """The uid and gid of ``cfg.user`` (and its HOME and USER in ``env``); nothing when none is asked. OSError
    when it cannot be: no such user, or ambient is not root (only root can start a process as another user)."""
    if cfg.user is None:
        return {}
    try:
        entry = pwd.getpwnam(cfg.user)
    except KeyError:
        raise OSError(errno.EINVAL, f"no Unix user {cfg.user!r} (ambient.runner.user)") from None
    if entry.pw_uid != os.geteuid() and os.geteuid() != 0:
        raise OSError(errno.EPERM, f"cannot run the agent as {cfg.user!r}: ambient is not root")
    env["HOME"], env["USER"], env["LOGNAME"] = entry.pw_dir, entry.pw_name, entry.pw_name
    return {"uid": entry.pw_uid, "gid": entry.pw_gid}


def _landlock(req: RunRequest, cfg: CommandRunnerConfig, argv: list[str], env: dict[str, str]) -> dict[str, Any] | None:
    """The Landlock paths of this agent (None: it runs unconfined: ``confine: false``, or no Landlock here).

    Its private temp dir is made here and named in its environment (TMPDIR); it is removed with the agent's
    process group at the end (:func:`drop_tmp`)."""
    version = landlock_abi()
    if not cfg.confine or version <= 0:
        return None
    tmp = private_tmp(req.agent)
    env["TMPDIR"] = env["TMP"] = env["TEMP"] = str(tmp)
    connect = network_ports(cfg.network)
    return policy(req.brain, scope_files(req), tmp, argv[0], connect=connect).as_request(version)


def scope_files(req: RunRequest) -> list[str]:
    """The files of the SPAWN's scope, as its packet names them."""
    scope = req.packet.get("scope") if isinstance(req.packet, dict) else None
    return [str(f) for f in (scope or {}).get("files") or [] if isinstance(f, str)]


def private_tmp(agent: str) -> Path:
    """A fresh temp dir of one agent (mode 0700), removed at its end by :func:`drop_tmp`."""
    return Path(tempfile.mkdtemp(prefix=f"ambient-{agent[:32]}-"))


def drop_tmp(env: Mapping[str, str]) -> None:
    """The private temp dir a confined agent had (nothing else reads it)."""
    tmp = env.get("TMPDIR", "")
    if tmp and Path(tmp).name.startswith("ambient-") and Path(tmp).parent == Path(tempfile.gettempdir()):
        shutil.rmtree(tmp, ignore_errors=True)
