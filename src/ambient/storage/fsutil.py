"""How bytes are written to a brain: atomic writes, capped no-follow reads, containment checks.

Guarantees (RELIABILITY §1.3): a reader sees either the old or the new content of a file, never a
torn one; the content is durable (fsync of file then directory) before the call returns; a failed
fsync is raised, never retried. A temp file's name says who writes it (``.<name>.tmp.<pid>.<start>.<hex>``: the
writer's pid and start time, :func:`writer_mark`); the start-up sweeps (:func:`sweep_stale_tmp`) delete the temp
files of writers that are gone and nothing else, never one a live CLI or agent is still writing.

ambient's private state (``.ambient/``: journals, audit, agent threads, escalations...) follows one rule,
:func:`private_dir`: each of its folders is a real folder (never a symlink, which would let a same-user agent
redirect ambient's writes and reads elsewhere), created 0700, and each file ambient writes there is 0600
(:data:`PRIVATE_FILE`), opened without following a final symlink (:func:`open_private`), so that no other
local user reads agent conversations.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ambient.core.errors import InputError, UnsafePathError, UnsupportedFilesystemError
from ambient.core.lazylog import get_logger
from ambient.core.pathrules import normalize
from ambient.core.process import own_start_time, process_alive
from ambient.storage.paths import STATE_DIRNAME, STATE_FILES

if TYPE_CHECKING:
    from ambient.storage.paths import BrainPaths

log = get_logger(__name__)

TMP_MARK = ".tmp."
PRIVATE_DIR: int = 0o700  # every folder of .ambient/
PRIVATE_FILE: int = 0o600  # every file ambient writes under .ambient/
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

# Filesystems whose locking or rename semantics cannot be trusted (RELIABILITY §1.2 rule 7).
_UNTRUSTED_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse", "9p", "afs", "ceph", "glusterfs")


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_dir(directory: Path) -> None:
    """Make a directory entry (create, rename, unlink) durable."""
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


#: Threads that run the fsyncs of :func:`fsync_many` (made on first use).
FSYNC_MANY_THREADS = 8
_FSYNC_MANY_POOL: list[ThreadPoolExecutor] = []
_FSYNC_MANY_MADE = threading.Lock()


def fsync_many(fds: Sequence[int]) -> None:
    """fsync every descriptor of ``fds``, several at a time; returns once all are done, raising the first failure.

    One after another, each fsync of a small new file waited 2.3-3.2 ms here (ext4, its device cache flushed at
    each); eight at a time, the device serves them together: 0.09-0.3 ms a file. A fan-out's claims writer
    fsync'd its files one by one, ~3 s of waits per 1,000 items, which the next run then found still under way
    (bench/fanout.py). Each descriptor is fsync'd before this returns, whatever failed, so that no caller closes
    one an fsync still uses.
    """
    if len(fds) <= 1:
        for fd in fds:
            os.fsync(fd)
        return
    with _FSYNC_MANY_MADE:
        if not _FSYNC_MANY_POOL:
            _FSYNC_MANY_POOL.append(ThreadPoolExecutor(FSYNC_MANY_THREADS, thread_name_prefix="fsync_many"))
    pool = _FSYNC_MANY_POOL[0]
    first: BaseException | None = None
    for future in [pool.submit(os.fsync, fd) for fd in fds]:
        exc = future.exception()
        if exc is not None and first is None:
            first = exc
    if first is not None:
        raise first


_TMP_SALT = secrets.token_hex(3)  # per process; O_EXCL catches the impossible clash anyway
_TMP_SEQ = itertools.count()


def tmp_name(path: Path) -> Path:
    """A unique temp path beside ``path`` (same directory, so the rename stays on one filesystem)."""
    # A counter, not os.urandom per write: urandom costs ~90 µs here and a fan-out writes thousands of claims.
    return path.with_name(_tmp_leaf(path.name))


_MARK: dict[int, str] = {}


def writer_mark() -> str:
    """Who writes a temp file, as its name carries it: ``<pid>.<start>`` (the start time in hundredths of a second,
    as :func:`~ambient.core.process.process_start_time` reads it), so that a sweep can tell a live writer from a
    dead one whose pid was reused. ``<pid>`` alone where the start time cannot be read."""
    pid = os.getpid()
    mark = _MARK.get(pid)
    if mark is None:  # read once per process (a forked child reads its own)
        start = own_start_time()
        mark = f"{pid}" if start is None else f"{pid}.{round(start * 100)}"
        _MARK.clear()
        _MARK[pid] = mark
    return mark


def _tmp_leaf(name: str) -> str:
    return f".{name}{TMP_MARK}{writer_mark()}.{_TMP_SALT}{next(_TMP_SEQ):x}"


def _tmp_str(path: str) -> str:
    head, sep, name = path.rpartition("/")
    return head + sep + _tmp_leaf(name)


def write_tmp(path: Path, data: bytes, mode: int = 0o644, *, sync: bool = True) -> Path:
    """Write ``data`` to a fresh temp file beside ``path`` (fsync'd unless ``sync=False``); return its path."""
    return Path(_write_tmp(path, data, mode, sync)[0])


def _write_tmp(path: Path, data: bytes, mode: int, sync: bool) -> tuple[str, os.stat_result]:
    staged = stage(path, data, mode=mode)
    try:
        if sync:
            os.fsync(staged.fd)
    except BaseException:
        staged.discard()
        raise
    staged.close()
    return staged.tmp, staged.stat


class Staged(NamedTuple):
    """A temp file written beside its target and still open: fsync it, then :meth:`commit` it into place.

    For writers of many files (claims): write them all, fsync them together (:func:`fsync_many`), then rename
    them, so that each file is on disk before its name points at it without a wait between writes (a power cut
    leaves every file old or new, never empty or torn; RELIABILITY R-03).
    """

    target: Path
    tmp: str
    fd: int
    stat: os.stat_result  # of the temp file, taken before any rename

    def close(self) -> None:
        os.close(self.fd)

    def discard(self) -> None:
        """Close and remove the temp file (the target is untouched)."""
        with contextlib.suppress(OSError):
            os.close(self.fd)
        _unlink_quietly(self.tmp)

    def commit(self) -> None:
        """Rename the (closed) temp file over the target; the temp file is removed if that fails."""
        try:
            os.replace(self.tmp, self.target)
        except BaseException:
            _unlink_quietly(self.tmp)
            raise


def stage(path: Path, data: bytes, *, mode: int = 0o644) -> Staged:
    """Write ``data`` to a fresh temp file beside ``path`` and keep it open (see :class:`Staged`)."""
    tmp = _tmp_str(str(path))  # a string: a fan-out writes a claim per item, and Path objects cost µs
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        write_all(fd, data)
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    return Staged(path, tmp, fd, st)


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # noqa: PTH108 - a string path on the hot path


def atomic_write(path: Path, data: bytes | str, *, mode: int = 0o644, durable: bool = True) -> os.stat_result:
    """Replace ``path`` with ``data`` atomically (temp + fsync + rename + fsync dir); returns the new file's stat.

    Running readers see the old or the new content, never a torn file, whatever ``durable`` says; after a
    power cut only a durable write promises that (without the fsync the new name may point at an empty or
    garbled file). ``durable=False`` is for files nobody needs after a restart.
    Many files at once: :func:`stage` them, fsync them together (:func:`fsync_many`), then commit them.
    The stat is of the file this call wrote (taken before the rename), whatever replaced it since.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp, st = _write_tmp(path, raw, mode, durable)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if durable:
        fsync_dir(path.parent)
    return st


def write_new(path: Path, data: bytes | str, *, mode: int = 0o600) -> None:
    """Create ``path`` holding ``data``; raises FileExistsError if it exists. Not fsync'd, not renamed into place.

    Only for a file no one can look for before this returns (a name derived from a secret that is handed out
    afterwards): the rename of :func:`atomic_write` protects readers that could come earlier, and there are
    none. One directory change instead of two (bench/fanout.py (b): a channel file per command agent).
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        write_all(fd, raw)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)


def publish_new(path: Path, data: bytes | str, *, mode: int = 0o644) -> None:
    """Create ``path`` whole (temp file, fsync, ``link()``, fsync of the folder); FileExistsError if the name
    exists, even if it appeared a moment ago: of two racing writers the first wins, the other clobbers nothing,
    and no reader ever sees half a file."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = write_tmp(path, raw, mode)
    try:
        os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def move(src: Path, dest: Path, *, durable: bool = False) -> None:
    """Rename ``src`` to ``dest`` (replacing it); ``durable`` fsyncs both folders, so a power cut leaves it moved."""
    os.replace(src, dest)
    if durable:
        fsync_dir(dest.parent)
        if src.parent != dest.parent:
            fsync_dir(src.parent)


def cut_to(path: Path, size: int) -> None:
    """Cut the file at ``path`` (never through a symlink) to ``size`` bytes, fsync'd before it returns: what the
    next appends start from is on disk before they come."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def append_whole(fd: int, data: bytes, size: int) -> None:
    """Write ``data`` at the end of the file open at ``fd`` (``O_APPEND``), whose size was ``size``; if the write
    fails (a full disk) the file is cut back to ``size``, so no fragment is left for the next append to be glued
    onto, and the error is raised."""
    try:
        write_all(fd, data)
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        raise


def unnamed_file(data: bytes) -> int:
    """A readable fd positioned at 0 holding ``data``, with no name anywhere: a memfd, else an unlinked temp file."""
    try:
        fd = os.memfd_create("ambient-spawn-packet", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        fd, name = tempfile.mkstemp(prefix="ambient-packet-")
        Path(name).unlink()
    try:
        write_all(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def copy_tree(src: Path, dest: Path) -> None:
    """Copy the folder ``src`` into ``dest`` (created if missing; files already there are overwritten)."""
    shutil.copytree(src, dest, dirs_exist_ok=True)


class TmpWriter(NamedTuple):
    """The writer a temp file's name carries: its pid and start time (None: a name without it, written before
    names carried it, or where the start time could not be read)."""

    pid: int
    start: float | None


_STALE_TMP_RE = re.compile(r"^\..+\.(?:tmp|stale)\.(\d+)\.(?:(\d+)\.)?[0-9a-f]+$")


def tmp_writer(name: str) -> TmpWriter | None:
    """The writer named by a temp (``.<name>.tmp.<pid>[.<start>].<hex>``) or set-aside (``.stale.``) file's name;
    None for any other name (a target, a person's file), which no sweep ever touches."""
    m = _STALE_TMP_RE.match(name)
    if m is None:
        return None
    start = m.group(2)
    return TmpWriter(int(m.group(1)), None if start is None else int(start) / 100)


def is_leftover(
    writer: TmpWriter, age_s: float, alive: Callable[[int, float | None], bool], *, min_age_s: float
) -> bool:
    """May a sweep delete this temp file? Only when its writer is gone: the process named by pid and start time
    is not running (a reused pid has another start time). A name without a start time says less: its file goes
    when its pid is not running, or when it is older than ``min_age_s`` (the pid was likely reused)."""
    if writer.start is not None:
        return not alive(writer.pid, writer.start)
    return not alive(writer.pid, None) or age_s >= min_age_s


def sweep_stale_tmp(directory: Path, *, min_age_s: float = 600.0) -> list[Path]:
    """Delete the temp and set-aside files in ``directory`` (not recursive) whose writer is gone (:func:`is_leftover`).

    Only those names are touched, never a target file: a sweep at start-up never pulls a temp file from under a
    live writer (an ``ambient decide`` answering while the daemon starts, another CLI command, an agent).
    """
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return removed
    now = time.time()
    for entry in entries:
        writer = tmp_writer(entry.name)
        if writer is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            continue
        if not is_leftover(writer, now - st.st_mtime, process_alive, min_age_s=min_age_s):
            continue
        with contextlib.suppress(FileNotFoundError):
            Path(entry.path).unlink()
            removed.append(Path(entry.path))
    return removed


def read_capped(path: Path, max_bytes: int) -> bytes:
    """Read a regular file without following a final symlink, refusing files over ``max_bytes``.

    The size is checked with ``fstat`` on the open descriptor, before reading (RELIABILITY S-03).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == 40:  # ELOOP: the final component is a symlink
            raise UnsafePathError("is a symlink; ambient never follows symlinks here", file=str(path)) from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError("is not a regular file", file=str(path))
        if st.st_size > max_bytes:
            raise InputError(f"is {st.st_size} bytes; the limit for this kind of file is {max_bytes}", file=str(path))
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            total += len(chunk)
            if total > max_bytes:  # grew while we read it
                raise InputError(f"is over the limit of {max_bytes} bytes", file=str(path))
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def check_relative(rel: str) -> str:
    """Reject a brain-relative path that could escape before it is ever joined (S-01).

    Returns the path normalised to POSIX form without ``.`` components or a trailing slash
    (the rules are :func:`ambient.core.pathrules.normalize`'s: NUL, backslash, absolute, ``..``, long names).
    """
    return normalize(rel).rstrip("/")


def resolve_in_brain(root: Path, rel: str) -> Path:
    """Join ``rel`` under ``root`` and check that the real path stays inside (symlinks included)."""
    clean = check_relative(rel)
    real_root = root.resolve()
    target = (real_root / clean).resolve() if clean else real_root
    if target != real_root and not target.is_relative_to(real_root):
        raise UnsafePathError(f"path {rel!r} resolves outside the brain root (through a symlink)")
    return target


def iter_files(directory: Path, suffixes: tuple[str, ...]) -> Iterator[Path]:
    """Regular files (not symlinks, not hidden, not temp files) in ``directory`` with these suffixes, sorted."""
    if not directory.is_dir():
        return
    names = sorted(os.listdir(directory))
    for name in names:
        if name.startswith(".") or not name.endswith(suffixes):
            continue
        p = directory / name
        if p.is_symlink() or not p.is_file():
            continue
        yield p


def filesystem_type(path: Path) -> str:
    """The filesystem type of the mount holding ``path`` (from /proc/self/mountinfo), or ``unknown``."""
    try:
        real = str(path.resolve())
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return "unknown"
    best, fstype = -1, "unknown"
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mount = fields[4].replace("\\040", " ")
        if (real == mount or real.startswith(mount.rstrip("/") + "/") or mount == "/") and len(mount) > best:
            best, fstype = len(mount), right.split()[0]
    return fstype


def check_local_filesystem(path: Path) -> None:
    """Refuse NFS/CIFS/FUSE state directories, whose locks and renames cannot be trusted."""
    fstype = filesystem_type(path)
    if fstype.split(".")[0] in _UNTRUSTED_FS or fstype.startswith("fuse"):
        raise UnsupportedFilesystemError(
            f"{path} is on a {fstype} filesystem; ambient keeps locks and claims only on a local filesystem "
            "(ext4, xfs, btrfs, tmpfs...). Move the brain or its state to a local disk."
        )


# ---------------------------------------------------------------- private state (.ambient/)


def _not_a_folder(where: Path, parent_fd: int, name: str) -> UnsafePathError:
    """The error for a state folder that is a symlink or not a folder: the path, what it is, what is expected."""
    try:
        st = os.lstat(name, dir_fd=parent_fd)
    except OSError:
        what = "cannot be opened as a folder"
    else:
        if stat.S_ISLNK(st.st_mode):
            try:
                what = f"is a symlink (to {os.readlink(name, dir_fd=parent_fd)})"
            except OSError:
                what = "is a symlink"
        else:
            what = "is not a folder"
    return UnsafePathError(
        f"{what}; ambient's private state (.ambient/ and its folders) must be real folders, never followed "
        "through a symlink: remove it (ambient creates the folder again, mode 0700)",
        file=str(where),
    )


def private_dir(path: Path) -> Path:
    """Create or check ``path``, a folder of ambient's private state: the one rule for every folder ambient writes.

    From the ``.ambient`` folder on ``path`` (``path`` itself when it has none) down to ``path``, each folder is
    opened with ``O_NOFOLLOW|O_DIRECTORY`` relative to its parent's descriptor: a symlink or a non-folder raises
    :class:`UnsafePathError` naming it (a same-user agent could otherwise send ambient's writes, and the person's
    answers, anywhere); a missing one is created 0700 (its parent fsync'd); one open to other users (an older
    ambient made ``.ambient/`` 0755) is narrowed to 0700, logged. What lies above ``.ambient`` (the brain root,
    which may well be a symlink) is followed as usual. Returns ``path``.
    """
    parts = path.parts
    top = len(parts) - 1
    if STATE_DIRNAME in parts:
        top = len(parts) - 1 - parts[::-1].index(STATE_DIRNAME)
    base = Path(*parts[:top]) if top else Path()
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:  # the folders above the state are the person's: made as mkdir -p would
        base.mkdir(parents=True, exist_ok=True)
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        where = base
        for name in parts[top:]:
            where = where / name
            child = _enter_private(fd, name, where)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)
    return path


def _enter_private(parent_fd: int, name: str, where: Path) -> int:
    """Open (creating it if missing) the private folder ``name`` under ``parent_fd``; its descriptor."""
    try:
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, PRIVATE_DIR, dir_fd=parent_fd)
                os.fsync(parent_fd)  # the new entry survives a power cut
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW on a symlink, or a file in the way
            raise _not_a_folder(where, parent_fd, name) from None
        raise
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o077:
            os.fchmod(fd, PRIVATE_DIR)
            log.info("state_mode_restored", path=str(where), was=f"{mode:04o}", now=f"{PRIVATE_DIR:04o}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_private(path: Path, flags: int) -> int:
    """``os.open`` of a file of ambient's private state: created 0600, a final symlink refused with a clear error.

    ``O_NOFOLLOW`` and ``O_CLOEXEC`` are added to ``flags``. The folder holding ``path`` is
    :func:`private_dir`'s to check.
    """
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, PRIVATE_FILE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(
                "is a symlink; ambient never writes its private state through a symlink: remove it "
                "(ambient creates the file again, mode 0600)",
                file=str(path),
            ) from None
        raise


def check_state(paths: BrainPaths) -> None:
    """At daemon start: every folder of ``.ambient/`` through :func:`private_dir` (created 0700 if missing), and no
    symlink nor other non-file among the files at its top (``audit.jsonl``, ``daemon.lock``...), each refused with
    :class:`UnsafePathError` naming it, before anything is opened."""
    for d in paths.state_dirs:
        private_dir(d)
    with os.scandir(paths.state) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.is_symlink():
                raise UnsafePathError(
                    f"is a symlink (to {Path(entry.path).readlink()}); ambient never follows a symlink in its private "
                    "state .ambient/: remove it (ambient creates what it needs again)",
                    file=entry.path,
                )
            if entry.name in STATE_FILES and not entry.is_file(follow_symlinks=False):
                raise UnsafePathError(
                    "is not a regular file; expected ambient's own file here: remove it", file=entry.path
                )


# ---------------------------------------------------------------- the state's modes and owners, kept


class Restored(NamedTuple):
    """One entry of ``.ambient/`` found open to others (or owned by someone else) and closed again."""

    path: str
    was: str  # its mode before, e.g. "0644"
    now: str  # its mode after: "0600" for a file, "0700" for a folder
    owner: str | None = None  # "uid:gid" it had, when its owner was restored too


def keep_state_modes(
    state: Path,
    owner: tuple[int, int] | None = None,
    *,
    limit: int = 100_000,
    fix: bool = True,
    skip: frozenset[str] = frozenset(),
) -> list[Restored]:
    """Close again what in ``state`` (``.ambient/``) is open to others: folders 0700, files 0600, and, given
    ``owner`` (the daemon runs as root), each entry owned by it. Landlock does not cover metadata: an agent
    able to ``chmod`` (a root one) could open the console's token or the journals to every user.

    A file is looked at by its ``lstat``; one to change, and each folder, is opened with ``O_NOFOLLOW`` relative
    to its folder's descriptor and changed through that descriptor, so a swap for a symlink never makes ambient
    change something outside its state. Symlinks and special files are left alone (:func:`check_state` refuses
    them at start). At most ``limit`` entries; what was restored is returned (and logged as
    ``state_mode_restored``). ``fix=False`` only says what is open (``ambient doctor``). ``skip``: folders
    (relative to ``state``) not walked, whose modes are another program's."""
    done: list[Restored] = []
    try:
        fd = os.open(state, _DIR_FLAGS)
    except OSError:
        return done
    budget = [limit]
    skipped = {state / rel for rel in skip}
    try:
        _keep_entry(fd, state, True, owner, done, fix)
        _keep_folder(fd, state, owner, done, budget, fix, skipped)
    finally:
        os.close(fd)
    for r in done if fix else ():
        owner_was = {"owner_was": r.owner} if r.owner else {}
        log.info("state_mode_restored", path=r.path, was=r.was, now=r.now, **owner_was)
    return done


def _keep_folder(
    fd: int,
    where: Path,
    owner: tuple[int, int] | None,
    done: list[Restored],
    budget: list[int],
    fix: bool,
    skipped: set[Path],
) -> None:
    try:
        with os.scandir(fd) as it:
            entries = [(e.name, e.is_dir(follow_symlinks=False), e.is_file(follow_symlinks=False)) for e in it]
    except OSError:
        return
    for name, is_dir, is_file in entries:
        budget[0] -= 1
        if budget[0] < 0:
            return
        if not (is_dir or is_file) or where / name in skipped:
            continue
        if is_file and _in_order(fd, name, owner):  # the common case: one lstat, nothing opened
            continue
        flags = _DIR_FLAGS if is_dir else os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
        try:
            child = os.open(name, flags, dir_fd=fd)
        except OSError:  # gone meanwhile, or swapped for a symlink (ELOOP): not followed
            continue
        try:
            _keep_entry(child, where / name, is_dir, owner, done, fix)
            if is_dir:
                _keep_folder(child, where / name, owner, done, budget, fix, skipped)
        finally:
            os.close(child)


def _in_order(fd: int, name: str, owner: tuple[int, int] | None) -> bool:
    """Whether the file ``name`` in the folder ``fd`` is closed to others (and owned by ``owner``), by its lstat."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return True  # gone meanwhile
    return not st.st_mode & 0o077 and (owner is None or (st.st_uid, st.st_gid) == owner)


def _keep_entry(
    fd: int, where: Path, is_dir: bool, owner: tuple[int, int] | None, done: list[Restored], fix: bool
) -> None:
    try:
        st = os.fstat(fd)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode) != is_dir or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        return
    mode = stat.S_IMODE(st.st_mode)
    want = PRIVATE_DIR if is_dir else mode & 0o700
    foreign = owner is not None and (st.st_uid, st.st_gid) != owner
    if mode == want and not foreign:
        return
    found = Restored(str(where), f"{mode:04o}", f"{want:04o}", f"{st.st_uid}:{st.st_gid}" if foreign else None)
    if not fix:
        done.append(found)
        return
    with contextlib.suppress(OSError):
        if foreign and owner is not None:
            os.fchown(fd, *owner)
        os.fchmod(fd, want)
        done.append(found)
