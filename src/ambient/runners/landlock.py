"""Landlock, the kernel's unprivileged confinement, for one agent (standard library only: the spawner loads it).

A process restricts itself (and everything it starts) to the filesystem rights a ruleset grants; no root is
needed, only ``no_new_privs``. The spawner calls :func:`confine` in the forked child, just before ``execve``: the
agent starts confined, and neither it nor anything it starts can widen the ruleset. Beyond files, a confined
process cannot ptrace (nor read ``/proc/<pid>/environ`` or ``mem`` of) a process outside its domain, such as the
daemon, and from ABI 6 on cannot signal one either.

Rights handled (denied unless a rule grants them under some path): every filesystem right the running kernel
knows. Granted: read (and execute) under ``read`` paths, everything under ``write`` paths. From ABI 4 on, TCP too
when ``connect`` is given: binding any TCP port is denied, and connecting is allowed only to the listed ports (by
port alone: Landlock knows no hosts). UDP and Unix sockets are not Landlock's (a DNS query still goes out).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
from collections.abc import Iterable
from typing import Any

_SYSCALLS = {  # x86_64 and aarch64 (and every arch since 5.13) share these numbers
    "create_ruleset": 444,
    "add_rule": 445,
    "restrict_self": 446,
}
_ADD_RULE = _SYSCALLS["add_rule"]
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2
_PR_SET_NO_NEW_PRIVS = 38

# Filesystem rights, by the ABI that introduced them.
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

READ = EXECUTE | READ_FILE | READ_DIR
# Network rights (ABI 4).
BIND_TCP = 1 << 0
CONNECT_TCP = 1 << 1
NET_ABI = 4


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


class _NetPortAttr(ctypes.Structure):
    _fields_ = (("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64))


_LIBC: list[ctypes.CDLL] = []


def _libc() -> ctypes.CDLL:
    """The C library, through the running program's own symbols (``find_library`` runs ldconfig: milliseconds,
    paid by every forked child when it was not loaded before the fork)."""
    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]


def _syscall(name: str, *args: object) -> int:
    result: int = _libc().syscall(_SYSCALLS[name], *args)
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"landlock_{name}: {os.strerror(code)}")
    return result


def abi() -> int:
    """The Landlock ABI version of the running kernel; 0 when Landlock is absent or disabled."""
    if platform.system() != "Linux":
        return 0
    try:
        return _syscall("create_ruleset", None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except OSError:
        return 0


def fs_rights(version: int) -> int:
    """Every filesystem right ABI ``version`` knows."""
    return _FS_BY_ABI.get(version, (1 << 16) - 1)


def confine(read: Iterable[bytes], write: Iterable[bytes], version: int, connect: Iterable[int] | None = None) -> None:
    """Restrict this process (and what it execs and forks) to reading ``read`` and writing ``write`` paths, and,
    when ``connect`` is not None and the kernel has ABI 4, to binding no TCP port and connecting to ``connect``
    ports only.

    Paths that do not exist are skipped. Raises OSError when the kernel refuses (the caller must not run the
    agent unconfined then). Call it in the child, after fork, before exec.
    """
    fd = ruleset(read, write, version, connect)
    try:
        restrict(fd)
    finally:
        os.close(fd)


def ruleset(read: Iterable[bytes], write: Iterable[bytes], version: int, connect: Iterable[int] | None = None) -> int:
    """The ruleset of :func:`confine`, built here, not yet applied: its descriptor (close-on-exec; the caller closes
    it). A process forked after applies it with :func:`restrict`, so that the child only has that step to take
    (the spawner builds each agent's ruleset before its fork: bench/README.md). The paths of ``read`` are opened
    once per process and kept (:class:`_Opened`): each use checks that the path still names the same inode."""
    handled = fs_rights(version)
    net = BIND_TCP | CONNECT_TCP if connect is not None and version >= NET_ABI else 0
    attr = _RulesetAttr(handled, net, (SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET) if version >= 6 else 0)
    # Older kernels know only the first fields.
    size = ctypes.sizeof(_RulesetAttr) if version >= 6 else 16 if version >= NET_ABI else 8
    fd = _syscall("create_ruleset", ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    try:
        for path in read:
            _OPENED.allow(fd, path, READ & handled)
        for path in write:
            _allow(fd, path, handled)
        if net:
            for port in sorted(set(connect or ())):
                rule = _NetPortAttr(CONNECT_TCP, port)
                _syscall(
                    "add_rule",
                    ctypes.c_int(fd),
                    ctypes.c_int(_RULE_NET_PORT),
                    ctypes.byref(rule),
                    ctypes.c_uint32(0),
                )
    except BaseException:
        os.close(fd)
        raise
    return fd


def restrict(ruleset_fd: int) -> None:
    """Apply a ruleset of :func:`ruleset` to this process: no_new_privs, then Landlock. OSError when refused."""
    libc = _libc()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(code)}")
    if libc.syscall(_SYSCALLS["restrict_self"], ruleset_fd, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"landlock_restrict_self: {os.strerror(code)}")


_SKIPPED = (errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.ELOOP)
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # the rights a file can take


def _allow(ruleset: int, path: bytes, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in _SKIPPED:
            return
        raise
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _FILE_RIGHTS
        _add_rule(ruleset, fd, rights)
    finally:
        os.close(fd)


def _add_rule(ruleset: int, fd: int, rights: int) -> None:
    rule = _PathBeneathAttr(rights, fd)
    _syscall(
        "add_rule", ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0)
    )


class _Opened:
    """Read paths opened once (``O_PATH``) and kept, with the inode each was, for the rulesets of many agents.

    Every use stats the path again: a path that now names another inode (a folder replaced, a file renamed over)
    is opened afresh, one that is gone is skipped, so each ruleset grants what the paths name when it is built,
    as opening them then would. Kept within a quarter of the descriptor limit (the rest are opened each time)."""

    def __init__(self) -> None:
        self.fds: dict[bytes, tuple[int, int, int, bool]] = {}  # path → (descriptor, device, inode, is a folder)
        self.rules: dict[tuple[int, int], Any] = {}  # (descriptor, rights) → its rule, by reference
        self.limit = -1

    def allow(self, ruleset: int, path: bytes, rights: int) -> None:
        try:
            st = os.stat(path)  # noqa: PTH116 - bytes, stdlib only
        except OSError as exc:
            self.forget(path)
            if exc.errno in _SKIPPED:
                return
            raise
        kept = self.fds.get(path)
        if kept is None or kept[1] != st.st_dev or kept[2] != st.st_ino:
            self.forget(path)
            kept = self.open(path)
            if kept is None:
                _allow(ruleset, path, rights)  # not kept: opened for this ruleset alone
                return
        if not kept[3]:
            rights &= _FILE_RIGHTS
        rule = self.rules.get((kept[0], rights))
        if rule is None:  # made once per descriptor and rights: most of a ruleset's cost was making them
            rule = self.rules[(kept[0], rights)] = ctypes.byref(_PathBeneathAttr(rights, kept[0]))
        if _libc().syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, rule, 0) < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"landlock_add_rule: {os.strerror(code)}")

    def open(self, path: bytes) -> tuple[int, int, int, bool] | None:
        if self.limit < 0:
            import resource

            self.limit = max(0, min(256, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 4))
        if len(self.fds) >= self.limit:
            return None
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return None
        st = os.fstat(fd)
        kept = (fd, st.st_dev, st.st_ino, stat.S_ISDIR(st.st_mode))
        self.fds[path] = kept
        return kept

    def forget(self, path: bytes) -> None:
        kept = self.fds.pop(path, None)
        if kept is not None:
            for key in [k for k in self.rules if k[0] == kept[0]]:
                del self.rules[key]
            os.close(kept[0])


_OPENED = _Opened()
