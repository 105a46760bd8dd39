"""What a confined agent may touch: read the brain and the system, write only its SPAWN's scope and a temp dir.

An agent is code ambient does not trust, running as ambient's own Unix user. Under Landlock (see
:mod:`ambient.runners.landlock`, applied by the spawner in the agent's process just before it execs) it gets:

- read and execute: the system (``/usr``, ``/bin``, ``/lib*``, ``/etc``, ``/opt``, ``/proc``, ``/sys``, the
  resolver's files of ``/run``, and the few devices programs read: ``/dev/null``, ``/dev/urandom``...), the
  interpreter running ambient (its prefixes and import path), the agent's own program, and the brain, except what
  is the daemon's or the person's alone: ``.ambient/`` (journals, escalations, the inbox, tokens: so an agent can
  neither answer an escalation nor drop a packet in the person's name), ``profil/ambient.yml`` and the files of
  ``profil/`` that hold secrets (names with token, secret, credential, password; ``*.key``, ``*.pem``);
- write: the SPAWN's scope (a file that does not exist yet: its folder, made if missing; never the brain's own),
  ``claims/`` and ``locks/`` (the kernel's mutex and the claims agents write under a token), a private temp dir
  (``TMPDIR``), ``/dev/null``.

The network, from Landlock ABI 4 on: a confined agent binds no TCP port and connects only to the ports its runner
names (``network: [host:port, ...]``; ``network: any`` leaves its TCP alone); none by default for a command agent,
its model API's for a Claude agent (the model gateway's port). Landlock's rules are by port, not host; UDP (DNS)
and Unix sockets are not covered. Beyond files, a confined agent cannot signal, ptrace or read the memory of the
daemon (Landlock's scoping). ``ambient.runner.confine: false`` runs an agent unconfined.

A Claude agent is held by the same policy (:func:`policy`), applied by its launcher
(:mod:`ambient.runners.claude_launch`) before it execs Claude Code, plus its own session folder under
``.ambient/claude/agents/`` (Claude Code's config and home) that it reads and writes.

:func:`jail` is what the spawner applies to one command agent: that policy, and the Unix user its config names
(``ambient.runner.user``: ambient runs as root then); :func:`landlock_abi` says whether this kernel confines at all.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import os
import pwd
import queue
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ambient.core.lazylog import get_logger
from ambient.runners.base import RunRequest
from ambient.runners.runner_config import CommandRunnerConfig, network_ports
from ambient.storage.paths import STATE_DIRNAME

log = get_logger(__name__)

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
            "read": _encoded(self.read),
            "write": [os.fsencode(p) for p in self.write],
            "abi": abi,
            "connect": None if self.connect is None else list(self.connect),
        }


_ENCODED: dict[tuple[str, ...], list[bytes]] = {}


def _encoded(paths: tuple[str, ...]) -> list[bytes]:
    """``paths`` as bytes, kept: the read paths of one agent are those of the last (~40 ``fsencode`` calls per agent
    otherwise). The list is shared: never changed."""
    kept = _ENCODED.get(paths)
    if kept is None:
        if len(_ENCODED) >= 64:
            _ENCODED.clear()
        kept = _ENCODED[paths] = [os.fsencode(p) for p in paths]
    return kept


def secret_name(name: str) -> bool:
    """Whether a file of ``profil/`` holds secrets an agent never reads."""
    low = name.lower()
    return low == "ambient.yml" or any(w in low for w in _SECRET_WORDS) or low.endswith(_SECRET_SUFFIXES)


_BRAIN_READ: dict[str, tuple[tuple[int, int], list[str]]] = {}


def brain_read(brain: Path) -> list[str]:
    """The brain's entries an agent may read: all but ``.ambient/`` and the secrets of ``profil/`` (kept while the
    brain's folder and ``profil/`` are unchanged: a fan-out starts many agents on one brain)."""
    where = str(brain)
    try:
        key = (os.stat(where).st_mtime_ns, _mtime_of_dir(os.path.join(where, "profil")))  # noqa: PTH116, PTH118
    except OSError:
        key = (0, 0)
    hit = _BRAIN_READ.get(where)
    if hit is not None and hit[0] == key:
        return hit[1]
    out = _brain_read(brain)
    _BRAIN_READ[where] = (key, out)
    return out


def _mtime_of_dir(path: str) -> int:
    """A folder's mtime (0: not a folder): one ``stat``."""
    try:
        st = os.stat(path)  # noqa: PTH116 - a string, at every agent's start
    except OSError:
        return 0
    return st.st_mtime_ns if stat.S_ISDIR(st.st_mode) else 0


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
    (made now, so the agent can create the file), but never the brain's own folder: a new file at the top of the
    brain is not granted (Landlock grants a folder whole, and the brain's holds ambient's state)."""
    out: list[str] = []
    root = str(_resolved(brain))
    inside = root.rstrip(os.sep) + os.sep
    for rel in files:
        target, mode, parent_is_dir = resolve_in(root, rel)
        if not target.startswith(inside) or STATE_DIRNAME in target[len(inside) :].split(os.sep):  # noqa: PTH206
            continue  # never outside the brain, never the whole brain, never the daemon's state
        if mode is None:  # a symlink on the way: resolved by realpath, looked at again
            mode = 0 if not os.path.exists(target) else stat.S_IFREG  # noqa: PTH110
            parent_is_dir = os.path.isdir(os.path.dirname(target))  # noqa: PTH112, PTH120
        if not mode:
            target = os.path.dirname(target)  # noqa: PTH120
            if not target.startswith(inside):
                continue  # a new file at the top: its folder is the whole brain, ambient's state with it
            if not parent_is_dir:  # a mkdir of a folder already there would still lock its parent
                try:
                    os.makedirs(target, exist_ok=True)  # noqa: PTH103
                except OSError:
                    continue
        out.append(target)
    return out


def resolve_in(root: str, rel: str) -> tuple[str, int | None, bool]:
    """``os.path.realpath(root/rel)`` for a ``root`` without symlinks, looking up only ``rel``'s own components
    (realpath looks up every component from ``/``: twice the calls at every agent's start, each a GIL hand-off on
    the event loop). Also the file type (``S_IFMT``) of the last component (0: missing) and whether its parent is a
    folder; the type is None when a symlink (or ``..``) was met: the path is then realpath's own answer."""
    parts = rel.split(os.sep)  # noqa: PTH206 - strings: no Path per agent
    if rel.startswith(os.sep) or os.pardir in parts:
        return os.path.realpath(os.path.join(root, rel)), None, False  # noqa: PTH118
    path, mode, parent_mode = root, stat.S_IFDIR, stat.S_IFDIR
    for name in parts:
        if not name or name == os.curdir:
            continue
        parent_mode = mode
        path = os.path.join(path, name)  # noqa: PTH118
        if not stat.S_ISDIR(mode):  # beneath something missing, or a file: missing too (realpath joins the rest)
            mode = 0
            continue
        try:
            st = os.lstat(path)
        except OSError:
            mode = 0
            continue
        if stat.S_ISLNK(st.st_mode):
            return os.path.realpath(os.path.join(root, rel)), None, False  # noqa: PTH118
        mode = stat.S_IFMT(st.st_mode)
    return path, mode, stat.S_ISDIR(parent_mode)


@functools.lru_cache(maxsize=16)
def _resolved(brain: Path) -> Path:
    """The brain's folder, symlinks resolved (asked at every agent's start: once is enough)."""
    return brain.resolve()


def policy(
    brain: Path,
    files: Sequence[str],
    tmp: Path,
    program: str,
    *,
    connect: tuple[int, ...] | None = (),
    own: Sequence[str] = (),
    writable: Sequence[str] | None = None,
) -> Policy:
    """The policy of one agent: see the module's docstring. ``own``: folders of its own it also reads and writes
    (a Claude agent's session folder); ``writable``: :func:`scope_write` of ``files`` when the caller has it."""
    read = [*SYSTEM_READ, *interpreter_read(brain), *brain_read(brain), *own]
    if program.startswith("/"):
        read.append(program)
    scope = scope_write(brain, files) if writable is None else writable
    write = [*scope, *_shared_write(str(brain)), str(tmp), *own, *DEVICES_WRITE]
    return Policy(tuple(dict.fromkeys(read)), tuple(dict.fromkeys(write)), connect)


@functools.lru_cache(maxsize=16)
def _shared_write(brain: str) -> tuple[str, ...]:
    return tuple(os.path.join(brain, d) for d in SHARED_WRITE)  # noqa: PTH118


# ---------------------------------------------------------------------------------------------------------------
# One agent's jail


@functools.cache
def landlock_abi() -> int:
    """Landlock's ABI on this kernel (0: agents cannot be confined here), asked once."""
    # Imported when first asked: it loads ctypes and the C library, which importing the runners need not pay for.
    from ambient.runners import landlock

    return landlock.abi()


#: Whom a root daemon runs an agent as when its runner names no ``user:`` (made by :func:`ensure_agent_user`).
AGENT_USER = "ambient-agent"
_USERADD = (
    "useradd",
    "--system",
    "--user-group",
    "--no-create-home",
    "--home-dir",
    "/nonexistent",
    "--shell",
    "/usr/sbin/nologin",
    "--comment",
    "ambient's agents",
    AGENT_USER,
)


def default_agent_user(euid: int, configured: str = AGENT_USER) -> str | None:
    """Whom a daemon of user ``euid`` runs an agent as when its runner names no ``user:``: for root, the
    ``agent_user`` setting (:data:`AGENT_USER` unless the person says otherwise; ``root`` keeps uid 0 without any
    capability: an agent never has root's powers), else None: ambient's own user."""
    return configured if euid == 0 else None


def run_as(cfg: CommandRunnerConfig, default: str | None) -> str | None:
    """The Unix user an agent runs as: its runner's ``user:``, else ``default`` (:func:`default_agent_user`)."""
    return cfg.user if cfg.user is not None else default


def ensure_agent_user() -> str | None:
    """Make :data:`AGENT_USER` if it is missing (a system user: no home, no login, its own group); None when it
    is there, else what went wrong (said at each agent's start that needs it)."""
    with contextlib.suppress(KeyError):
        pwd.getpwnam(AGENT_USER)
        return None
    useradd = shutil.which("useradd") or shutil.which("useradd", path="/usr/sbin:/sbin")
    if useradd is None:
        return "useradd is not on this system"
    done = subprocess.run(  # noqa: S603 - a fixed argv
        [useradd, *_USERADD[1:]], capture_output=True, text=True, check=False, timeout=60
    )
    with contextlib.suppress(KeyError):  # made now, or by a daemon of another brain meanwhile
        pwd.getpwnam(AGENT_USER)
        return None
    return f"useradd failed: {(done.stderr or done.stdout).strip()[:300]}"


def jail(
    req: RunRequest, cfg: CommandRunnerConfig, argv: list[str], env: dict[str, str], default_user: str | None = None
) -> dict[str, Any]:
    """What the spawner applies to this agent's process before it execs (empty: nothing): its Unix user (of
    :func:`run_as` with ``default_user``: ``uid``, ``gid``; the brain it must reach, ``reach``) and the Landlock
    paths of :func:`policy` (``read``, ``write``, ``abi``).

    Sets ``env`` to match (HOME, USER and LOGNAME of that user; TMPDIR, the agent's private temp dir, removed at
    the end by :func:`drop_tmp`). An agent of another user than ambient's gets its temp dir as its own; one of the
    daemon's agent user (no ``user:`` of its own) may write its scope too (:func:`share_scope`; a user the
    runner names is given what it needs by the person). OSError when the user cannot be taken."""
    found_scope: list[list[str]] = []

    def writable() -> list[str]:  # asked once, if at all
        if not found_scope:
            found_scope.append(scope_write(req.brain, scope_files(req)))
        return found_scope[0]

    found = {**_user(req, cfg, env, default_user), **(_landlock(req, cfg, argv, env, writable) or {})}
    if "uid" in found and env.get("TMPDIR"):
        os.chown(env["TMPDIR"], found["uid"], found["gid"])  # its private temp dir is its own
    if cfg.user is None and found.get("uid", os.geteuid()) != os.geteuid():  # the agent user of a root daemon
        share_scope(req, found["uid"], found["gid"], writable())
    return found


def _user(req: RunRequest, cfg: CommandRunnerConfig, env: dict[str, str], default: str | None) -> dict[str, Any]:
    """The uid and gid of :func:`run_as` (and its HOME and USER in ``env``); nothing when the agent runs as
    ambient's own user. OSError when it cannot be: no such user, or ambient is not root (only root can start a
    process as another user)."""
    name = run_as(cfg, default)
    if name is None:
        return {}
    try:
        entry = _user_entry(name)
    except KeyError:
        if cfg.user is not None or name != AGENT_USER:
            where = "ambient.runner.user" if cfg.user is not None else "agent_user in profil/ambient.yml"
            raise OSError(errno.EINVAL, f"no Unix user {name!r} ({where})") from None
        problem = ensure_agent_user()  # made at the daemon's start; again here if someone removed it since
        if problem is not None:
            raise OSError(
                errno.EPERM,
                f"ambient runs as root and runs no agent as root, but its user {AGENT_USER!r} is missing and "
                f"cannot be made ({problem}): make it ({' '.join(_USERADD)}), or name a user in the runner (user:)",
            ) from None
        entry = pwd.getpwnam(name)
    if entry.pw_uid != os.geteuid() and os.geteuid() != 0:
        raise OSError(errno.EPERM, f"cannot run the agent as {name!r}: ambient is not root")
    if entry.pw_uid != os.geteuid():  # another user: its own HOME and name (root stays as ambient's environment)
        env["HOME"], env["USER"], env["LOGNAME"] = entry.pw_dir, entry.pw_name, entry.pw_name
    found: dict[str, Any] = {"uid": entry.pw_uid, "gid": entry.pw_gid}
    if entry.pw_uid != 0:
        found["reach"] = os.fsencode(req.brain)
    return found


#: How long a user's entry is taken as read (``getpwnam`` reads the user database: a file, or a service).
_USER_TTL_S = 10.0
_USERS: dict[str, tuple[float, pwd.struct_passwd]] = {}


def _user_entry(name: str) -> pwd.struct_passwd:
    """``pwd.getpwnam(name)``, kept for :data:`_USER_TTL_S` (asked at every agent's start of a root daemon)."""
    now = time.monotonic()
    kept = _USERS.get(name)
    if kept is not None and now - kept[0] < _USER_TTL_S:
        return kept[1]
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        # The lookup reads /etc/passwd: with no descriptor left it finds nobody. Said as what ran out (OSError
        # EMFILE, the daemon's trouble), not as a user that does not exist (the agent's).
        os.close(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        raise
    _USERS[name] = (now, entry)
    return entry


def scope_files(req: RunRequest) -> list[str]:
    """The files of the SPAWN's scope, as the packet names them (relative to the brain)."""
    scope = req.packet.get("scope") if isinstance(req.packet, dict) else None
    return [str(f) for f in (scope or {}).get("files") or [] if isinstance(f, str)]


def share_scope(req: RunRequest, uid: int, gid: int, writable: Sequence[str] | None = None) -> None:
    """Let an agent of the daemon's agent user (``uid``, of group ``gid``) write what its scope lets it write: each
    path of :func:`scope_write` and the shared folders (``claims/``, ``locks/``) are given to its group, with the
    group's write bit (and, for a folder, setgid: what is made inside stays the group's). Owners are kept, nothing
    is opened to other users, and a path already the agent's own is left as it is. Done once per path: later
    agents find it so. Each path is opened with ``O_NOFOLLOW`` and changed through its descriptor: one swapped
    for a symlink meanwhile (by an earlier agent, which may write that folder) changes nothing outside."""
    root = str(_resolved(req.brain))
    scope = scope_write(req.brain, scope_files(req)) if writable is None else writable
    now = time.monotonic()
    for path in [*scope, *(os.path.join(root, d) for d in SHARED_WRITE)]:  # noqa: PTH118
        done = _SHARED.get((path, uid, gid))
        if done is not None and now - done < _SHARED_TTL_S:
            continue  # found so a moment ago: in a fan-out, every agent's claims/, locks/ and often scope folder
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if _shared(st, uid, gid):  # one lstat, where opening, reading and closing took three calls
            if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                _remember_shared(path, uid, gid, now)
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError:  # gone, or a symlink (ELOOP): not followed
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid == uid or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                continue
            mode = stat.S_IMODE(st.st_mode) | (0o2070 if stat.S_ISDIR(st.st_mode) else 0o060)
            if st.st_gid != gid:
                os.fchown(fd, -1, gid)
            if mode != stat.S_IMODE(st.st_mode) or st.st_gid != gid:  # a chown may have cleared setgid
                os.fchmod(fd, mode)
            _remember_shared(path, uid, gid, now)
        except OSError:
            continue
        finally:
            os.close(fd)


#: How long a path found given to an agent user's group is taken as still given (``share_scope``): a person who
#: takes it back by hand meanwhile sees the next agents refused their writes for that long at most.
_SHARED_TTL_S = 5.0
_SHARED: dict[tuple[str, int, int], float] = {}


def _shared(st: os.stat_result, uid: int, gid: int) -> bool:
    """Whether :func:`share_scope` has nothing to change on a path of this ``lstat``: the agent's own, not a folder
    or file (a symlink is never followed), or its group's already with the bits it would set."""
    if st.st_uid == uid or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        return True
    want = 0o2070 if stat.S_ISDIR(st.st_mode) else 0o060
    return st.st_gid == gid and stat.S_IMODE(st.st_mode) & want == want


def _remember_shared(path: str, uid: int, gid: int, now: float) -> None:
    if len(_SHARED) >= 4096:  # many items with a file scope each: forget the oldest half
        for key in sorted(_SHARED, key=_SHARED.__getitem__)[:2048]:
            del _SHARED[key]
    _SHARED[(path, uid, gid)] = now


def _landlock(
    req: RunRequest,
    cfg: CommandRunnerConfig,
    argv: list[str],
    env: dict[str, str],
    writable: Callable[[], list[str]] | None = None,
) -> dict[str, Any] | None:
    """The Landlock paths of this agent (None: it runs unconfined: ``confine: false``, or no Landlock here).

    Its private temp dir is made here and named in its environment (TMPDIR); it is removed with the agent's
    process group at the end (:func:`drop_tmp`)."""
    version = landlock_abi()
    if not cfg.confine or version <= 0:
        return None
    tmp = private_tmp(req.agent)
    env["TMPDIR"] = env["TMP"] = env["TEMP"] = str(tmp)
    connect = network_ports(cfg.network)
    scope = None if writable is None else writable()
    return policy(req.brain, scope_files(req), tmp, argv[0], connect=connect, writable=scope).as_request(version)


def private_tmp(agent: str) -> Path:
    """A fresh temp dir of one agent (mode 0700), removed at its end by :func:`drop_tmp`: one made ahead when
    there is one (see :class:`TempDirs`), else made now."""
    return TEMP_DIRS.take(agent)


def drop_tmp(env: Mapping[str, str]) -> None:
    """The private temp dir a confined agent had (nothing else reads it): removed behind, off the caller's thread."""
    tmp = env.get("TMPDIR", "")
    folder, name = os.path.split(tmp)
    if name.startswith("ambient-") and folder == tempfile.gettempdir():
        TEMP_DIRS.drop(tmp)


class TempDirs:
    """Agents' private temp dirs, made ahead and removed behind by one thread, so that the event loop never waits
    for the filesystem at an agent's start or end.

    Making and removing a directory can wait on the disk: on the ext4 (mounted with ``discard``) of the machine the
    benchmarks run on, ``mkdir`` took 0.2 ms and ``rmdir`` 2-4 ms of wall time (under 0.1 ms of CPU), and both ran
    on the loop at every confined agent (bench/README.md). A few fresh dirs per agent name are kept ready (none is
    ever used twice); one is checked when taken (still a private dir of ours: else it is dropped and one is made
    now). Those left at exit are removed then, with the removals still queued.

    The thread is seldom woken by the caller: waking a thread on a busy machine can take the core from the waker,
    which holds the GIL meanwhile (one ``put`` per agent was ~10 % of a fan-out's event loop, bench/README.md).
    Jobs wait in a list; once it has worked, the thread dozes :data:`DOZE_S` and looks again by itself, and is
    woken only from a deep sleep (nothing to do at its last look) or when fewer than half the spare dirs of a name
    are left.
    """

    #: How long the thread dozes between looks at its jobs while there is work (a fan-out).
    DOZE_S = 0.05

    def __init__(self, spare: int = 32) -> None:
        self.spare = spare
        self._lock = threading.Lock()
        self._ready: dict[str, list[str]] = {}
        self._wanted: dict[str, int] = {}  # ready plus queued to be made, per agent name
        self._pending: list[tuple[str, Any]] = []
        self._asleep = True  # waiting for a token, no timeout
        self._dozing = False  # waiting for a token or DOZE_S
        self._jobs: queue.SimpleQueue[bool | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        os.register_at_fork(after_in_child=self._forget)

    def take(self, agent: str) -> Path:
        """A fresh private temp dir for an agent named ``agent``."""
        prefix = f"ambient-{agent[:32]}-{self._pid}-"
        with self._lock:
            ready = self._ready.get(prefix)
            path = ready.pop() if ready else None
            low = len(ready or ()) < self.spare // 2
            wanted = self._wanted.get(prefix, 0) - (path is not None)
            refill = max(0, self.spare - wanted)
            self._wanted[prefix] = wanted + refill
        for _ in range(refill):
            self._queue("make", prefix, urgent=low)
        if path is not None and _fresh(path):
            return Path(path)
        if path is not None:
            self._queue("drop", path)
        return Path(tempfile.mkdtemp(prefix=prefix))

    def drop(self, path: str) -> None:
        """Remove ``path`` (a temp dir an agent had) behind."""
        self._queue("drop", path)

    def sweep_left_behind(self) -> None:
        """Remove, behind, the empty temp dirs that daemons no longer running left (see :func:`left_behind`): a
        daemon killed -9 cannot remove the dirs it made ahead. Called at a daemon's or a worker's start."""
        self._queue("sweep", tempfile.gettempdir(), urgent=True)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every job queued so far is done (tests); False on timeout."""
        done = threading.Event()
        self._queue("wait", done, urgent=True)
        return done.wait(timeout)

    def close(self) -> None:
        """Finish the queued removals and remove the dirs kept ready (at exit)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)
            thread.join(10.0)
        with self._lock:
            ready, self._ready, self._wanted = self._ready, {}, {}
        for paths in ready.values():
            for path in paths:
                shutil.rmtree(path, ignore_errors=True)

    def _forget(self) -> None:
        """In a forked child: the thread is the parent's, and so are the dirs made ahead."""
        self._lock = threading.Lock()
        self._thread, self._ready, self._wanted = None, {}, {}
        self._pending, self._asleep, self._dozing = [], True, False
        self._jobs = queue.SimpleQueue()
        self._pid = os.getpid()

    def _queue(self, what: str, arg: Any, *, urgent: bool = False) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._work, name="ambient-tmpdirs", daemon=True)
                    self._thread.start()
                    atexit.register(self.close)
        with self._lock:
            self._pending.append((what, arg))
            wake = self._asleep or (urgent and self._dozing)
            if wake:
                self._asleep = self._dozing = False
        if wake:
            self._jobs.put(True)

    def _work(self) -> None:
        timeout: float | None = None
        while True:
            try:
                token = self._jobs.get(timeout=timeout)
            except queue.Empty:
                token = True
            worked = False
            while True:
                with self._lock:
                    self._asleep = self._dozing = False
                    batch, self._pending = self._pending, []
                    if not batch:  # doze after work (a fan-out goes on), sleep after a look that found none
                        self._dozing, self._asleep = worked, not worked
                        timeout = self.DOZE_S if worked else None
                        break
                worked = True
                for what, arg in batch:
                    self._do(what, arg)
            if token is None:  # close(): the jobs queued before it are done
                return

    def _do(self, what: str, arg: Any) -> None:
        if what == "wait":
            arg.set()
        elif what == "sweep":
            removed = left_behind(arg)
            if removed:
                log.info("temp_dirs_swept", count=removed, folder=arg)
        elif what == "drop":
            try:
                os.rmdir(arg)  # noqa: PTH106 - most are empty: one call
            except OSError:
                shutil.rmtree(arg, ignore_errors=True)
        else:
            try:
                made = tempfile.mkdtemp(prefix=arg)
            except OSError:
                made = None
            with self._lock:
                if made is not None:
                    self._ready.setdefault(arg, []).append(made)
                else:
                    self._wanted[arg] = self._wanted.get(arg, 1) - 1


def maker_pid(name: str) -> int | None:
    """The pid of the process that made the temp dir named ``name`` (``ambient-<agent>-<pid>-<random>``, as
    :meth:`TempDirs.take` names them), or None for any other name. The agent's name may hold dashes; mkdtemp's
    random part holds none."""
    if not name.startswith("ambient-"):
        return None
    parts = name[len("ambient-") :].rsplit("-", 2)
    if len(parts) != 3 or not parts[0] or not parts[1].isdigit() or not parts[2]:
        return None
    return int(parts[1])


def left_behind(folder: str) -> int:
    """Remove the empty private temp dirs in ``folder`` whose maker no longer runs; how many went.

    Only a dir of ours as made (a real dir, our user's, mode 0700, no folder inside) whose maker's pid is gone; and
    only if empty (``rmdir``): a dir still holding an agent's files is left as it is (that agent may outlive its
    daemon). A dir of a living process, another user's, or named otherwise is never touched."""
    removed = 0
    alive: dict[int, bool] = {}
    try:
        entries = os.scandir(folder)
    except OSError:
        return 0
    with entries:
        for entry in entries:
            pid = maker_pid(entry.name)
            if pid is None or pid == os.getpid():
                continue
            if pid not in alive:
                alive[pid] = _running(pid)
            if alive[pid] or not _fresh(entry.path):
                continue
            with contextlib.suppress(OSError):
                os.rmdir(entry.path)  # noqa: PTH106 - fails on a dir that is not empty: what we want
                removed += 1
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's: running
    return True


def _fresh(path: str) -> bool:
    """Whether a dir made ahead is still as made: a real dir (no symlink), ours, mode 0700, with no folder inside.
    (Not read for files: reading a fresh folder cost the loop ~0.3 ms under load, and only a process of ambient's own
    user, unconfined, could put one there: it can write into a running agent's temp dir just as well.)"""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid == os.geteuid()
        and stat.S_IMODE(st.st_mode) == 0o700
        and st.st_nlink == 2  # "." and its entry in the parent: no folder inside
    )


TEMP_DIRS = TempDirs()
