"""R-03's recorder: every change the daemon makes to the files of its brain, in order, for a crash model.

Loaded into the daemon under test by ``sitecustomize`` (beside this file) when ``AMBIENT_TEST_POWERLOSS_LOG``
names a log file; ``AMBIENT_TEST_POWERLOSS_ROOT`` is the brain root. The ``os`` functions ambient writes with
(``open``, ``write``, ``pwrite``, ``ftruncate``, ``fsync``, ``fdatasync``, ``rename``, ``replace``, ``link``,
``unlink``, ``mkdir``, ``rmdir``, ``close``) are wrapped; pathlib calls them too. Each change is one JSON line,
written after the change succeeded, with a sequence number. An fsync is logged when it returns, with ``upto``:
the last sequence number logged when it started, so only changes that were surely before it count as covered.

The log is appended with the real ``os.write`` on its own descriptor: a ``kill -9`` leaves at most a torn last
line, which the model ignores (that change is then simply not durable). Stdlib only: this runs inside the
daemon, before ambient is imported.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from typing import Any

LOG_ENV = "AMBIENT_TEST_POWERLOSS_LOG"
ROOT_ENV = "AMBIENT_TEST_POWERLOSS_ROOT"


class _Recorder:
    def __init__(self, log_path: str, root: str) -> None:
        self.root = os.path.abspath(root)
        self.prefix = self.root + os.sep
        self.real: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.seq = 0
        self.fds: dict[int, str] = {}  # descriptors opened on a path of the brain → that path (relative)
        self.log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)

    def rel(self, path: Any, dir_fd: int | None = None) -> str | None:
        if dir_fd is not None or isinstance(path, int):
            return None  # ambient never uses dir_fd: such a call is not a brain file
        p = os.fsdecode(os.fspath(path))
        full = os.path.abspath(p)
        if full == self.root:
            return "."
        return full[len(self.prefix) :] if full.startswith(self.prefix) else None

    def log(self, rec: dict[str, Any]) -> int:
        with self.lock:
            self.seq += 1
            rec["seq"] = self.seq
            line = (json.dumps(rec, separators=(",", ":")) + "\n").encode()
            view = memoryview(line)
            while view:
                view = view[self.real["write"](self.log_fd, view) :]
            return self.seq

    def last_seq(self) -> int:
        with self.lock:
            return self.seq

    def ident(self, fd: int) -> tuple[int, int, int, int] | None:
        """(dev, ino, size, mode) of a descriptor we track, or None (not a brain file, or reused since)."""
        if fd not in self.fds:
            return None
        try:
            st = self.real["fstat"](fd)
        except OSError:
            return None
        return st.st_dev, st.st_ino, st.st_size, st.st_mode


def install(log_path: str, root: str) -> None:
    """Wrap the ``os`` functions that change files; idempotent per process."""
    if getattr(os, "_powerloss_installed", False):
        return
    rec = _Recorder(log_path, root)
    names = (
        "open",
        "close",
        "write",
        "pwrite",
        "ftruncate",
        "fsync",
        "fdatasync",
        "rename",
        "replace",
        "link",
        "unlink",
        "remove",
        "mkdir",
        "rmdir",
        "fstat",
        "lseek",
        "lstat",
    )
    real = rec.real
    for n in names:
        real[n] = getattr(os, n)

    def w_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        rel = rec.rel(path, dir_fd)
        existed = True
        if rel is not None and flags & os.O_CREAT:
            try:
                real["lstat"](path)
            except OSError:
                existed = False
        fd: int = real["open"](path, flags, mode, dir_fd=dir_fd)
        if rel is None:
            rec.fds.pop(fd, None)
            return fd
        rec.fds[fd] = rel
        # The model knows every inode that existed when the daemon started (the harness listed them) and learns
        # the others here, when they are created; plain opens need no record.
        st = real["fstat"](fd)
        if stat.S_ISREG(st.st_mode) and not existed:
            rec.log({"op": "create", "path": rel, "dev": st.st_dev, "ino": st.st_ino})
        elif stat.S_ISREG(st.st_mode) and flags & os.O_TRUNC:
            rec.log({"op": "truncate", "dev": st.st_dev, "ino": st.st_ino, "size": 0})
        return fd

    def w_close(fd: int) -> None:
        rec.fds.pop(fd, None)
        real["close"](fd)

    def _data(fd: int, data: Any, offset: int | None) -> int:
        ident = rec.ident(fd)
        if ident is None or not stat.S_ISREG(ident[3]):
            return real["write"](fd, data) if offset is None else real["pwrite"](fd, data, offset)  # type: ignore[no-any-return]
        if offset is None:
            at = ident[2] if _flags(fd) & os.O_APPEND else real["lseek"](fd, 0, os.SEEK_CUR)
            n = real["write"](fd, data)
        else:
            at = offset
            n = real["pwrite"](fd, data, offset)
        rec.log({"op": "write", "dev": ident[0], "ino": ident[1], "off": at, "data": bytes(data[:n]).hex()})
        return n  # type: ignore[no-any-return]

    def w_write(fd: int, data: Any) -> int:
        return _data(fd, data, None)

    def w_pwrite(fd: int, data: Any, offset: int) -> int:
        return _data(fd, data, offset)

    def w_ftruncate(fd: int, length: int) -> None:
        real["ftruncate"](fd, length)
        ident = rec.ident(fd)
        if ident is not None:
            rec.log({"op": "truncate", "dev": ident[0], "ino": ident[1], "size": length})

    def _sync(name: str, fd: int) -> None:
        upto = rec.last_seq()
        real[name](fd)
        ident = rec.ident(fd)
        if ident is not None:
            rec.log({"op": "fsync", "dev": ident[0], "ino": ident[1], "upto": upto})

    def w_fsync(fd: Any) -> None:
        _sync("fsync", fd if isinstance(fd, int) else fd.fileno())

    def w_fdatasync(fd: Any) -> None:
        _sync("fdatasync", fd if isinstance(fd, int) else fd.fileno())

    def _two(name: str, op: str) -> Any:
        def wrapper(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            real[name](src, dst, *args, **kwargs)
            a, b = rec.rel(src, kwargs.get("src_dir_fd")), rec.rel(dst, kwargs.get("dst_dir_fd"))
            if a is not None and b is not None:
                rec.log({"op": op, "src": a, "dst": b})

        return wrapper

    def _one(name: str, op: str) -> Any:
        def wrapper(path: Any, *args: Any, **kwargs: Any) -> None:
            real[name](path, *args, **kwargs)
            rel = rec.rel(path, kwargs.get("dir_fd"))
            if rel is not None:
                rec.log({"op": op, "path": rel})

        return wrapper

    os.open = w_open  # type: ignore[assignment]
    os.close = w_close
    os.write = w_write
    os.pwrite = w_pwrite
    os.ftruncate = w_ftruncate
    os.fsync = w_fsync
    os.fdatasync = w_fdatasync
    os.rename = _two("rename", "rename")
    os.replace = _two("replace", "rename")
    os.link = _two("link", "link")
    os.unlink = _one("unlink", "unlink")
    os.remove = _one("remove", "unlink")
    os.mkdir = _one("mkdir", "mkdir")
    os.rmdir = _one("rmdir", "rmdir")
    os._powerloss_installed = True  # type: ignore[attr-defined]


def _flags(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_GETFL)
