"""The query store on disk (``.ambient/query.sqlite3``): opened, rebuilt when it cannot be trusted, kept current.

:meth:`QueryStore.refresh` brings the tables of :mod:`ambient.query.schema` up to date with the files, reading as
little as it can: a folder whose ``mtime_ns`` did not change is not listed (every write of ambient is an atomic
rename, which changes its folder's mtime); a listed folder's entries are compared with the files read before by
(name, inode), with set operations in C against this object's copy of those rows (read from SQLite only when another
process wrote them since: a token in ``meta``), so a refresh after one write costs the listing and that one file,
not a Python pass or a ``stat`` per file. A claim in use (not closed) and a pending escalation are also looked at by
(inode, size, mtime) at each refresh: an inode alone is reused by ext4 at once (two rewrites between refreshes gave
a claim back its first inode), so a closed claim rewritten twice between two listings may be missed until it changes
again.
``runs.jsonl`` is read from the byte offset read up to; the journal of a run not finished is folded again when its
size or mtime changed (a finished run's never changes). The claims come last, so the keeper can leave them for a
later refresh. Each file is parsed by the module that owns
its format (claims: :func:`ambient.claims.claimfile.read_claim_file`; escalations:
:meth:`ambient.human.escalation_store.EscalationStore.read_file`; journals: :func:`ambient.engine.runstate.fold`),
so no rule is written twice; a file that does not parse becomes a problem row, never an exception.

Derived data, never the source of truth: a store that is missing, torn (SQLite cannot read it), of another
:data:`~ambient.query.schema.FORMAT` or written by other code is rebuilt from the files; one that cannot be written
(a read-only ``.ambient/``) is replaced by one in memory, which only costs the speed. Written without fsync
(``synchronous=OFF``): after a power cut it is at worst rebuilt.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from ambient.core.lazylog import get_logger
from ambient.query.schema import FORMAT, INDEXES, TABLES
from ambient.storage.codestamp import code_stamp
from ambient.storage.fsutil import open_private, private_dir
from ambient.storage.paths import BrainPaths

if TYPE_CHECKING:
    pass

log = get_logger(__name__)

DB_NAME: Final = "query.sqlite3"
#: Held (``flock``) by whoever fills the claims of a store not built yet: one builder at a time, whichever process
#: (the daemon's keeper, the builder ``ambient status`` starts). Not named ``query.sqlite3*``: a person deleting the
#: store with a glob must not delete a lock another process holds.
BUILD_LOCK: Final = "query-build.lock"
#: How long one transaction of a build may read claim files before it commits (readers wait for it at most that).
_BUILD_SLICE_S: Final = 0.2
#: The pause after each: SQLite's busy handler tries again at most every 100 ms, so a reader waiting for the write
#: lock gets it in this gap (without it, the builder's next BEGIN came first every time: a reader waited out its
#: busy timeout and built a store of its own in memory, 48 s).
_BUILD_PAUSE_S: Final = 0.12
#: How far a store is built (:meth:`QueryStore.readiness`).
Readiness = Literal["missing", "claims", "ready"]
#: The modules whose code decides what a row holds: other code, other rows, so the store is rebuilt. By name: a
#: refresh that finds nothing changed imports none of them (:mod:`ambient.storage.codestamp` says why).
_RULES: Final = (
    "ambient.query.store",
    "ambient.query.schema",
    "ambient.query.rows",
    "ambient.claims.claim",
    "ambient.claims.claimfile",
    "ambient.core.problems",
    "ambient.engine.events",
    "ambient.engine.runstate",
    "ambient.human.escalations",
    "ambient.human.escalation_store",
)
#: A folder changed this recently may change again within its mtime's granularity (the kernel's coarse clock,
#: a few ms): its mtime is not trusted, it is listed again at the next refresh (git's "racy" rule).
_RACY_NS: Final = 100_000_000
_BUSY_MS: Final = 5000
#: More claim files than this to read at once (a build, a fan-out): their facts come from the claims census's index
#: when it has them.
_SEED_MIN: Final = 200

_Sig = tuple[int, int, int]
#: The copies of the ``files`` rows (kind → (token, name → inode)) of each store file, shared by the store objects
#: of one process (the daemon's keeper and the console it hosts): one's refresh does not make the other read every
#: row again. Used only inside a write transaction (``BEGIN IMMEDIATE``), which SQLite grants one connection at a
#: time; a store in memory has its own.
_COPIES: dict[str, dict[str, tuple[str, dict[str, int]]]] = {}


def _code() -> str:
    """Which code fills the store (:func:`~ambient.storage.codestamp.code_stamp` of :data:`_RULES`)."""
    return code_stamp(FORMAT, _RULES)


def _parsers() -> Any:
    """:mod:`ambient.query.rows`, imported when a file is to be read (the start-up time of short commands)."""
    from ambient.query import rows

    return rows


class QueryStore:
    """The query store of one brain: one SQLite connection, guarded by a lock (the daemon refreshes it from a
    worker thread). Open it, :meth:`refresh` it, read it with :mod:`ambient.query.views` through :attr:`conn`
    (under :meth:`reading`), :meth:`close` it."""

    def __init__(self, paths: BrainPaths, *, path: Path | None = None) -> None:
        self.paths = paths
        self.path = path or paths.state / DB_NAME
        self.in_memory = False
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self.rebuilt = False  # the last open found no usable store and made a new one
        self._checked: set[str] = set()  # kinds whose copy this refresh found current
        self._touched: set[str] = set()  # kinds whose rows this refresh wrote

    @classmethod
    def fresh(cls, paths: BrainPaths, *, build: bool = True) -> QueryStore:
        """A store of ``paths`` refreshed now, for a reader (the CLI, a page): one that cannot be written (a
        read-only ``.ambient/``, a lock held too long) is replaced by one in memory, built from the files.
        ``build=False``: claims not indexed yet are left to the process building them (:meth:`refresh`), and a
        store locked too long raises ``sqlite3.OperationalError`` (building one in memory reads every file)."""
        store = cls(paths)
        try:
            store.refresh(build=build)
        except (sqlite3.Error, OSError) as exc:
            if not build and isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                store.close()
                raise
            store.close()
            store._conn = store._fallback(exc)
            store.refresh()
        return store

    @staticmethod
    def readiness(paths: BrainPaths) -> Readiness:
        """How far the store of ``paths`` is built, without building anything (a few reads of SQLite):
        ``missing`` (no usable store, or its runs not read yet: the first refresh reads every file), ``claims``
        (all but the claims, which a builder is filling or will fill) or ``ready``."""
        path = paths.state / DB_NAME
        if not path.is_file():
            return "missing"
        try:
            conn = sqlite3.connect(path, timeout=_BUSY_MS / 1000, isolation_level=None)
        except sqlite3.Error:
            return "missing"
        try:
            if conn.execute("PRAGMA user_version").fetchone()[0] != FORMAT:
                return "missing"
            meta = dict(conn.execute("SELECT key, value FROM meta WHERE key IN ('code', 'filled')").fetchall())
            if meta.get("code") != _code() or meta.get("filled") != "1":
                return "missing"
            listed = conn.execute("SELECT 1 FROM dirs WHERE path=?", (str(paths.claims),)).fetchone()
            return "ready" if listed is not None else "claims"
        except sqlite3.Error:
            return "missing"
        finally:
            conn.close()

    def claims_indexed(self) -> bool:
        """Whether every claim file has its row (the claims folder was listed whole); until then a builder is
        filling them and counts of claims are partial."""
        with self._lock:
            return self._claims_listed(self.conn)

    def claim_files_indexed(self) -> int:
        """How many claim files have their row (a build's progress)."""
        with self._lock:
            return int(self.conn.execute("SELECT count(*) FROM files WHERE kind='claim'").fetchone()[0])

    def building(self) -> bool:
        """Whether some process holds the build lock now (is filling this brain's claims)."""
        fd = self._build_lock()
        if fd is None:
            return True
        if fd >= 0:
            os.close(fd)
        return False

    def _build_lock(self) -> int | None:
        """The build lock taken (a descriptor to close to release it; -1 for a store in memory, which needs
        none), or None when another process holds it."""
        if self.in_memory:
            return -1
        try:
            private_dir(self.paths.state)
            fd = open_private(self.paths.state / BUILD_LOCK, os.O_RDWR | os.O_CREAT)
        except OSError:
            return -1  # a read-only .ambient/: the store is in memory anyway
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return fd

    # ---------------------------------------------------------------- opening

    @property
    def conn(self) -> sqlite3.Connection:
        """The connection, opened (and rebuilt if need be) on first use."""
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    @contextlib.contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """The connection, for one reader at a time (a read transaction: one consistent view)."""
        with self._lock:
            conn = self.conn
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    @contextlib.contextmanager
    def writing(self) -> Iterator[sqlite3.Connection]:
        """The connection, in a write transaction (committed at the end, rolled back on an exception)."""
        with self._lock:
            conn = self.conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def close(self) -> None:
        """Close the connection (the next use opens it again)."""
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.close()
                self._conn = None

    def _open(self) -> sqlite3.Connection:
        try:
            private_dir(self.path.parent)
            conn = self._connect(self.path)
            if self._usable(conn):
                return conn
            self.rebuilt = True
            self._create(conn, drop=True)
            return conn
        except sqlite3.DatabaseError as exc:  # torn, not a database: thrown away and made again
            log.warning("query_store_rebuilt", path=str(self.path), reason=str(exc))
            try:
                self._delete()
            except OSError as gone:
                return self._fallback(gone)
        except OSError as exc:
            return self._fallback(exc)
        self.rebuilt = True
        try:
            conn = self._connect(self.path)
            self._create(conn, drop=True)
            return conn
        except (OSError, sqlite3.Error) as exc:
            return self._fallback(exc)

    def _fallback(self, exc: BaseException) -> sqlite3.Connection:
        """A store that cannot be written: one in memory, built from the files each time (only slower)."""
        log.warning("query_store_in_memory", path=str(self.path), reason=str(exc))
        self.in_memory, self.rebuilt = True, True
        conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self._create(conn, drop=False)
        return conn

    def _connect(self, path: Path) -> sqlite3.Connection:
        if not path.exists():
            # 0600 before SQLite creates it: its -wal and -shm files take the database's mode.
            os.close(open_private(path, os.O_RDWR | os.O_CREAT))
        conn = sqlite3.connect(path, timeout=_BUSY_MS / 1000, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout={_BUSY_MS}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=OFF")  # derived data: rebuilt rather than fsync'd
        except sqlite3.Error:
            conn.close()
            raise
        return conn

    def _usable(self, conn: sqlite3.Connection) -> bool:
        """Is this a store of our format, filled by this code? (A torn file raises DatabaseError here.)"""
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version != FORMAT:
            return False
        row = conn.execute("SELECT value FROM meta WHERE key='code'").fetchone()
        return row is not None and row[0] == _code()

    def _create(self, conn: sqlite3.Connection, *, drop: bool) -> None:
        """Empty tables of this format (in one transaction: a reader of another process sees old or new)."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            if drop:
                for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall():
                    conn.execute(f'DROP TABLE IF EXISTS "{name}"')
            for sql in (*TABLES, *INDEXES):
                conn.execute(sql)
            conn.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?)", [("format", str(FORMAT)), ("code", _code())]
            )
            conn.execute(f"PRAGMA user_version={FORMAT}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    @property
    def _copies(self) -> dict[str, tuple[str, dict[str, int]]]:
        """This store file's copy of its ``files`` rows, by kind: (the token it goes with, name → inode)."""
        key = f"memory:{id(self)}" if self.in_memory else str(self.path)
        return _COPIES.setdefault(key, {})

    def _delete(self) -> None:
        self._copies.clear()
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                Path(str(self.path) + suffix).unlink()

    # ---------------------------------------------------------------- refreshing

    def refresh(self, *, claims: bool = True, build: bool = True) -> set[str]:
        """Bring the store up to date with the files; the topics that changed: ``runs`` and ``run:<id>`` (a
        journal), ``records`` (``runs.jsonl``), ``escalations``, ``claims``.

        ``claims=False`` leaves the claims for a later refresh (the daemon's keeper lists ``claims/``, tens of
        thousands of names, less often than the journals); a store just built refreshes them anyway.

        Claims never indexed yet (a store just made: tens of thousands of files to read, a minute) are read in
        short transactions under the build lock (:data:`BUILD_LOCK`), so that readers get turns and a builder
        stopped half way goes on from where it was; when another process holds that lock, or with
        ``build=False``, they are left to it (:meth:`claims_indexed` then says False).

        A store found torn meanwhile is rebuilt and filled again (every topic then changed). Raises only
        :class:`sqlite3.Error` of a store that cannot be written at all (the caller logs it).
        """
        with self._lock:
            try:
                return self._refresh(claims, build)
            except sqlite3.DatabaseError as exc:
                if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                    raise
                log.warning("query_store_rebuilt", path=str(self.path), reason=str(exc))
                self._delete()
                return self._refresh(claims, build)

    def _refresh(self, claims: bool, build: bool) -> set[str]:
        conn = self.conn
        claims = claims or self.rebuilt
        changed: set[str] = set()
        unlisted = False
        with self._transaction(conn):
            self._escalations(conn, changed)
            self._journals(conn, changed)
            self._records(conn, changed)
            if claims:
                unlisted = not self._claims_listed(conn)
                if not unlisted:
                    self._claims(conn, changed)
            # The runs are read: readers may use the store. Written once (a store whose first refresh was stopped
            # is filled by the next), not at every refresh.
            if conn.execute("SELECT 1 FROM meta WHERE key='filled'").fetchone() is None:
                self._set_meta(conn, filled=1)
        if self.rebuilt:
            changed |= {"runs", "records", "escalations", "claims"}
            self.rebuilt = False
        if unlisted and build:
            self._build_claims(conn, changed)
        return changed

    @contextlib.contextmanager
    def _transaction(self, conn: sqlite3.Connection) -> Iterator[None]:
        """One write transaction of a refresh: the ``files`` copies checked again, sealed at its end."""
        conn.execute("BEGIN IMMEDIATE")
        self._checked.clear()
        self._touched.clear()
        try:
            yield
            self._seal_files(conn)
            conn.execute("COMMIT")
        except BaseException:
            self._copies.clear()  # rolled back: the copies may hold what was not committed
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise

    def _claims_listed(self, conn: sqlite3.Connection) -> bool:
        return conn.execute("SELECT 1 FROM dirs WHERE path=?", (str(self.paths.claims),)).fetchone() is not None

    def _build_claims(self, conn: sqlite3.Connection, changed: set[str]) -> None:
        """Index the claims of a store that never listed them whole, under the build lock, in transactions of
        :data:`_BUILD_SLICE_S` of reading each: rows of files read and the ``files`` rows that say so, then (the
        last one) the ordinary refresh of the claims, which lists the folder whole and finds only what is left."""
        fd = self._build_lock()
        if fd is None:
            return  # another process builds them
        try:
            with self._transaction(conn):
                if self._claims_listed(conn):
                    return  # built meanwhile by the process that held the lock before
            try:
                with os.scandir(self.paths.claims) as it:
                    listing = {e.name: e.inode() for e in it if _parsers().is_claim_name(e.name)}
            except FileNotFoundError:
                listing = {}
            with self._transaction(conn):
                todo = sorted(n for n, ino in listing.items() if self._known(conn, "claim").get(n) != ino)
            seed = self._census_index() if len(todo) > _SEED_MIN else None
            while todo:
                with self._transaction(conn):
                    todo = self._claims_slice(conn, todo, seed)
                if todo and not self.in_memory:  # a turn for readers of the file (one in memory has none)
                    time.sleep(_BUILD_PAUSE_S)
            with self._transaction(conn):
                self._claims(conn, changed)
                self._claim_dups(conn, None)
            changed.add("claims")
        finally:
            if fd >= 0:
                os.close(fd)

    def _claims_slice(self, conn: sqlite3.Connection, todo: list[str], seed: Any) -> list[str]:
        """Read claim files from ``todo`` for :data:`_BUILD_SLICE_S` and store their rows; the names left."""
        folder = self.paths.rel(self.paths.claims)
        until = time.monotonic() + _BUILD_SLICE_S
        files: list[tuple[str, int, int, int]] = []
        rows: list[tuple[Any, ...]] = []
        n = 0
        for n, name in enumerate(todo, 1):  # noqa: B007 (n: how many were taken)
            try:
                st = os.lstat(self.paths.claims / name)
            except OSError:
                continue  # gone: the last transaction's listing says so
            if not stat.S_ISREG(st.st_mode):
                continue  # read (and refused) by the last transaction's ordinary refresh
            rows.append(
                self._seeded(name, st, seed) or _parsers().claim_row(self.paths.claims / name, f"{folder}/{name}")
            )
            files.append((name, st.st_ino, st.st_size, st.st_mtime_ns))
            if time.monotonic() > until:
                break
        conn.executemany(f"INSERT OR REPLACE INTO claims VALUES ({', '.join('?' * 14)})", rows)  # noqa: S608
        self._put_files(conn, "claim", files)
        return todo[n:]

    def _listing(self, conn: sqlite3.Connection, folder: Path) -> dict[str, int] | None:
        """The entries of ``folder`` (name → inode, from the directory alone: no stat) when it changed since the
        last listing, else None. A folder that is gone lists as empty."""
        key = str(folder)
        try:
            mtime = folder.stat().st_mtime_ns
        except PermissionError:  # not "gone": a reader that may not see it (a confined agent) must not see "none"
            raise
        except OSError:
            mtime = -1
        row = conn.execute("SELECT mtime_ns FROM dirs WHERE path=?", (key,)).fetchone()
        if row is not None and row[0] == mtime and mtime > 0:
            return None
        found: dict[str, int] = {}
        if mtime != -1:
            try:
                with os.scandir(folder) as it:
                    found = {entry.name: entry.inode() for entry in it}  # d_ino: no syscall per entry
            except PermissionError:  # as above: refused, said so
                raise
            except OSError:
                return None  # not readable now: tried again at the next refresh
        racy = mtime > 0 and time.time_ns() - mtime < _RACY_NS
        conn.execute("INSERT OR REPLACE INTO dirs (path, mtime_ns) VALUES (?, ?)", (key, 0 if racy else mtime))
        return found

    def _changes(
        self,
        conn: sqlite3.Connection,
        kind: str,
        folder: Path,
        listing: Mapping[str, int],
        wanted: Callable[[str], bool],
        *,
        regular_only: bool = True,
    ) -> tuple[list[str], list[str]]:
        """(names gone, names new or of another inode) among the files of ``kind`` whose name ``wanted`` accepts;
        the ``files`` rows follow (with the size and mtime of each file new or changed).

        O(changed) in Python: the listing is compared with the ``files`` rows of ``kind`` as (name, inode) pairs
        by set operations in C, and only the pairs that differ are looked at (``wanted``, ``lstat``). An entry
        that is not a regular file is no file of ``kind`` when ``regular_only``; else (claims: read and refused
        by their reader) its row has inode -1, so that it is read again at every listing."""
        known = self._known(conn, kind)
        gone = sorted(known.keys() - listing.keys())
        fresh: list[str] = []
        rows: list[tuple[str, int, int, int]] = []
        for name, _ in sorted(listing.items() - known.items()):
            if not wanted(name):
                continue
            try:
                st = os.lstat(folder / name)
            except OSError:  # gone since the listing (the folder changed: listed again next time)
                if name in known:
                    gone.append(name)
                continue
            if stat.S_ISREG(st.st_mode):
                rows.append((name, st.st_ino, st.st_size, st.st_mtime_ns))
            elif regular_only:
                if name in known:
                    gone.append(name)
                continue
            else:
                rows.append((name, -1, 0, 0))
            fresh.append(name)
        self._drop_files(conn, kind, gone)
        self._put_files(conn, kind, rows)
        return gone, fresh

    # -- the files rows, and this process's copy of them

    def _known(self, conn: sqlite3.Connection, kind: str) -> dict[str, int]:
        """The ``files`` rows of ``kind`` (name → inode): this process's copy when no other store object wrote them
        since (the ``files_<kind>`` token in ``meta`` is still the one it wrote or read), else read from SQLite (a
        new process, another process's refresh). Tens of thousands of rows are not read at each refresh."""
        if kind in self._checked:
            return self._copies[kind][1]
        row = conn.execute("SELECT value FROM meta WHERE key=?", (f"files_{kind}",)).fetchone()
        token = None if row is None else str(row[0])
        held = self._copies.get(kind)
        if token is None or held is None or held[0] != token:
            known = dict(conn.execute("SELECT name, inode FROM files WHERE kind=?", (kind,)).fetchall())
            self._copies[kind] = (token or "", known)
            if token is None:
                self._touched.add(kind)  # a token is written at the end of this refresh
        self._checked.add(kind)
        return self._copies[kind][1]

    def _put_files(self, conn: sqlite3.Connection, kind: str, rows: list[tuple[str, int, int, int]]) -> None:
        """Record (name, inode, size, mtime_ns) of files of ``kind`` as read, in SQLite and in this copy."""
        if not rows:
            return
        known = self._known(conn, kind)
        conn.executemany(
            "INSERT OR REPLACE INTO files (kind, name, inode, size, mtime_ns) VALUES (?, ?, ?, ?, ?)",
            [(kind, *r) for r in rows],
        )
        known.update((r[0], r[1]) for r in rows)
        self._touched.add(kind)

    def _drop_files(self, conn: sqlite3.Connection, kind: str, names: Iterable[str]) -> None:
        """Forget files of ``kind`` (gone, or to be read again at the next listing)."""
        names = list(names)
        if not names:
            return
        known = self._known(conn, kind)
        conn.executemany("DELETE FROM files WHERE kind=? AND name=?", [(kind, name) for name in names])
        for name in names:
            known.pop(name, None)
        self._touched.add(kind)

    def _seal_files(self, conn: sqlite3.Connection) -> None:
        """A new token for each kind whose rows this refresh wrote (in its transaction): another store object
        (process) then knows its copy is stale."""
        for kind in self._touched:
            token = os.urandom(8).hex()
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (f"files_{kind}", token))
            held = self._copies.get(kind)
            if held is not None:  # else forgotten meanwhile (a torn store deleted): read again next time
                self._copies[kind] = (token, held[1])
        self._touched.clear()

    # -- claims

    def _claims(self, conn: sqlite3.Connection, changed: set[str]) -> None:
        listing = self._listing(conn, self.paths.claims)
        fresh: list[str] = []
        gone: list[str] = []
        if listing is not None:
            gone, fresh = self._changes(
                conn, "claim", self.paths.claims, listing, _parsers().is_claim_name, regular_only=False
            )
        fresh += [n for n in self._edited_in_place(conn) if n not in fresh]
        folder = self.paths.rel(self.paths.claims)
        many = len(gone) + len(fresh) > _SEED_MIN
        sessions = None if many else self._sessions_of(conn, [f"{folder}/{name}" for name in (*gone, *fresh)])
        for name in gone:
            conn.execute("DELETE FROM claims WHERE file=?", (f"{folder}/{name}",))
        seed = self._census_index() if len(fresh) > _SEED_MIN else None
        rows = [self._claim_row(name, folder, seed) for name in fresh]
        conn.executemany(f"INSERT OR REPLACE INTO claims VALUES ({', '.join('?' * 14)})", rows)  # noqa: S608
        if sessions is not None:
            sessions.update(row[1] for row in rows if row[1] is not None)
        if gone or fresh:
            self._claim_dups(conn, sessions)
            changed.add("claims")

    def _claim_row(self, name: str, folder: str, seed: Any) -> tuple[Any, ...]:
        path = self.paths.claims / name
        if seed is not None:
            with contextlib.suppress(OSError):
                row = self._seeded(name, os.lstat(path), seed)
                if row is not None:
                    return tuple(row)
        return tuple(_parsers().claim_row(path, f"{folder}/{name}"))

    def _sessions_of(self, conn: sqlite3.Connection, files: list[str]) -> set[str]:
        """The sess_ids the claims rows of ``files`` hold now (before they are replaced or deleted)."""
        found: set[str] = set()
        for at in range(0, len(files), 500):
            part = files[at : at + 500]
            sql = f"SELECT sess_id FROM claims WHERE sess_id IS NOT NULL AND file IN ({', '.join('?' * len(part))})"  # noqa: S608
            found.update(r[0] for r in conn.execute(sql, part))
        return found

    def _claim_dups(self, conn: sqlite3.Connection, sessions: set[str] | None) -> None:
        """Keep ``claim_dups`` (the files that are not the first of their sess_id) for ``sessions``, whose files
        changed; all of them when None (many changed: one pass is cheaper)."""
        if sessions is None:
            conn.execute("DELETE FROM claim_dups")
            conn.execute(
                "INSERT INTO claim_dups (file, sess_id, first) SELECT c.file, c.sess_id, f.first FROM claims c "
                "JOIN (SELECT sess_id, min(file) AS first FROM claims WHERE sess_id IS NOT NULL GROUP BY sess_id "
                "HAVING count(*) > 1) f ON c.sess_id = f.sess_id WHERE c.file != f.first"
            )
            return
        for sess_id in sorted(sessions):
            conn.execute("DELETE FROM claim_dups WHERE sess_id=?", (sess_id,))
            conn.execute(
                "INSERT INTO claim_dups (file, sess_id, first) SELECT file, sess_id, "
                "(SELECT min(file) FROM claims WHERE sess_id=?1) AS first FROM claims "
                "WHERE sess_id=?1 AND file != first",
                (sess_id,),
            )

    def _edited_in_place(self, conn: sqlite3.Connection) -> list[str]:
        """The claim files in use (not closed) or unusable whose content changed under the same name and inode:
        a person's editor may write in place, which changes no folder. Closed claims are not looked at (tens of
        thousands of stats cost more than the whole status); one edited in place is seen when claims/ changes."""
        folder = self.paths.rel(self.paths.claims) + "/"
        found = []
        rows = conn.execute(
            "SELECT f.name, f.inode, f.size, f.mtime_ns FROM claims c JOIN files f ON f.kind='claim' "
            "AND f.name = substr(c.file, ?) WHERE (c.status IS NULL OR c.status != 'closed') AND f.inode != -1",
            (len(folder) + 1,),
        ).fetchall()
        for name, ino, size, mtime in rows:
            try:
                st = (self.paths.claims / name).lstat()
            except OSError:
                continue  # gone: the folder changed, its listing says so
            sig = (st.st_ino, st.st_size, st.st_mtime_ns)
            if sig != (ino, size, mtime):
                self._put_files(conn, "claim", [(name, *sig)])
                found.append(name)
        return found

    def _census_index(self) -> Callable[[str, str, os.stat_result], Any]:
        """The claims census's verdicts of files it judged before (``.ambient/claims-index.json``), by name and
        ``lstat``: many claim files to read at once (a build) take their facts from there when it has them."""
        from ambient.claims.index import kept_verdicts  # only a build needs it

        return kept_verdicts(self.paths)

    def _seeded(self, name: str, st: os.stat_result, seed: Callable[[str, str, os.stat_result], Any] | None) -> Any:
        """The row of a claim file from the census's verdict (None: none, or a claim in use, read whole anyway for
        its agent and parent). A closed one keeps only its facts (its agent, parent... are NULL)."""
        if seed is None:
            return None
        v = seed(name, f"{self.paths.rel(self.paths.claims)}/{name}", st)
        if v is None:
            return None
        if v.facts is None:
            return (v.rel, *([None] * 11), "[]", _parsers().problems_json(v.problems))
        if v.facts.status != "closed":
            return None
        f = v.facts
        ttl = None if f.ttl is None else str(f.ttl)
        row = (v.rel, f.sess_id, f.status, *([None] * 7), max(f.times) if f.times else None, ttl)
        return (*row, json.dumps(list(f.times)), _parsers().problems_json(v.problems))

    # -- escalations

    def _escalations(self, conn: sqlite3.Connection, changed: set[str]) -> None:
        listing = self._listing(conn, self.paths.escalations)

        def wanted(name: str) -> bool:  # EscalationStore.scan's files (fsutil.iter_files)
            return not name.startswith(".") and name.endswith(".yml")

        gone, fresh = (
            ([], []) if listing is None else self._changes(conn, "escalation", self.paths.escalations, listing, wanted)
        )
        fresh += [n for n in self._pending_rewritten(conn) if n not in fresh and n not in gone]
        if not gone and not fresh:
            return
        r = _parsers()
        store = r.EscalationStore(self.paths)
        folder = self.paths.rel(self.paths.escalations)
        for name in [*gone, *fresh]:
            file = f"{folder}/{name}"
            conn.execute("DELETE FROM problems WHERE kind='escalation' AND file=?", (file,))
            conn.execute("DELETE FROM escalations WHERE id=?", (name.removesuffix(".yml"),))
        for name in fresh:
            found = store.read_file(self.paths.escalations / name)
            if isinstance(found, r.Problem):
                conn.execute(
                    "INSERT INTO problems (kind, file, line, message, severity) VALUES ('escalation', ?, ?, ?, ?)",
                    (f"{folder}/{name}", found.line, found.message, found.severity),
                )
                continue
            conn.execute(f"INSERT OR REPLACE INTO escalations VALUES ({', '.join('?' * 21)})", r.escalation_row(found))  # noqa: S608
        if gone or fresh:
            changed.add("escalations")

    def _pending_rewritten(self, conn: sqlite3.Connection) -> list[str]:
        """The files of pending escalations whose (inode, size, mtime) changed under the same name: answered (by the
        person, a rule, a deadline) and rewritten twice between two refreshes, ext4 may give the file its first
        inode back, which the listing's (name, inode) pairs cannot see (a pending question then stayed pending
        here after the rule had answered it). Pending ones are few: each is looked at, at every refresh."""
        found = []
        rows = conn.execute(
            "SELECT f.name, f.inode, f.size, f.mtime_ns FROM escalations e JOIN files f ON f.kind='escalation' "
            "AND f.name = e.id || '.yml' WHERE e.status = 'pending'"
        ).fetchall()
        for name, ino, size, mtime in rows:
            try:
                st = (self.paths.escalations / name).lstat()
            except OSError:
                continue  # gone: the folder changed, its listing says so
            sig = (st.st_ino, st.st_size, st.st_mtime_ns)
            if sig != (ino, size, mtime):
                self._put_files(conn, "escalation", [(name, *sig)])
                found.append(name)
        return found

    # -- run journals

    def _journals(self, conn: sqlite3.Connection, changed: set[str]) -> None:
        listing = self._listing(conn, self.paths.run_journals)
        names: set[str] = set()
        if listing is not None:

            def wanted(name: str) -> bool:
                return name.endswith(".jsonl") and not name.startswith(".")

            gone, fresh = self._changes(conn, "journal", self.paths.run_journals, listing, wanted)
            for name in gone:
                run_ids = [r[0] for r in conn.execute("SELECT run_id FROM runs WHERE journal=?", (name,))]
                for run_id in run_ids:
                    conn.execute("DELETE FROM items WHERE run_id=?", (run_id,))
                    changed.add(f"run:{run_id}")
                conn.execute("DELETE FROM runs WHERE journal=?", (name,))
                changed.add("runs")
            names.update(fresh)
        # Unfinished runs change by appends (same inode, same folder mtime): each is looked at every time.
        for name, ino, size, mtime in conn.execute(
            "SELECT f.name, f.inode, f.size, f.mtime_ns FROM files f JOIN runs r ON r.journal = f.name "
            "WHERE f.kind='journal' AND r.state != 'finished'"
        ).fetchall():
            if name in names:
                continue
            try:
                st = (self.paths.run_journals / name).lstat()
            except OSError:
                continue
            sig = (st.st_ino, st.st_size, st.st_mtime_ns)
            if sig != (ino, size, mtime):
                self._put_files(conn, "journal", [(name, *sig)])
                names.add(name)
        for name in sorted(names):
            self._fold_journal(conn, name, changed)

    def _fold_journal(self, conn: sqlite3.Connection, name: str, changed: set[str]) -> None:
        r = _parsers()
        path = self.paths.run_journals / name
        rel = self.paths.rel(path)
        try:
            records = list(r.iter_jsonl(path))
        except OSError:
            self._drop_files(conn, "journal", [name])  # read again next time
            return
        old = [r[0] for r in conn.execute("SELECT run_id FROM runs WHERE journal=?", (name,))]
        for run_id in old:
            conn.execute("DELETE FROM items WHERE run_id=?", (run_id,))
        conn.execute("DELETE FROM runs WHERE journal=?", (name,))
        try:
            state = r.fold(records)
        except (ValueError, KeyError, TypeError) as exc:
            problem = str(r.journal_problem(path, rel, exc))
            glance = r.finished_glance(path)
            run_id = name.removesuffix(".jsonl")
            workflow, finished_at = glance if glance is not None else (r.started_workflow(records), None)
            conn.execute(
                "INSERT OR REPLACE INTO runs (run_id, journal, state, workflow, finished_at, problem) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, name, "finished" if glance is not None else "unreadable", workflow, finished_at, problem),
            )
        else:
            run_id = state.run_id
            if conn.execute("SELECT 1 FROM runs WHERE run_id=?", (run_id,)).fetchone() is not None:
                run_id = name.removesuffix(".jsonl")  # two journals claim one run id: the file names them apart
            row, items = r.run_rows(state, records, name, run_id)
            conn.execute(f"INSERT OR REPLACE INTO runs VALUES ({', '.join('?' * 21)})", row)  # noqa: S608
            conn.executemany(f"INSERT OR REPLACE INTO items VALUES ({', '.join('?' * 11)})", items)  # noqa: S608
        changed.update({"runs", f"run:{run_id}", *(f"run:{r}" for r in old)})

    # -- run records

    def _records(self, conn: sqlite3.Connection, changed: set[str]) -> None:
        meta = dict(conn.execute("SELECT key, value FROM meta WHERE key LIKE 'records_%'").fetchall())
        inode, offset = int(meta.get("records_inode", -1)), int(meta.get("records_offset", 0))
        lines, torn = int(meta.get("records_lines", 0)), meta.get("records_torn", "0")
        try:
            fd = os.open(self.paths.runs_log, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if inode != -1 or lines:
                conn.execute("DELETE FROM records")
                self._set_meta(conn, records_inode=-1, records_offset=0, records_lines=0, records_torn=0)
                changed.add("records")
            return
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            if st.st_ino != inode or st.st_size < offset:  # another file, or cut: read from the start
                conn.execute("DELETE FROM records")
                inode, offset, lines = st.st_ino, 0, 0
                changed.add("records")
            if st.st_size == offset and torn == "0":
                self._set_meta(conn, records_inode=inode)
                return
            fh.seek(offset)
            data = fh.read(st.st_size - offset)
        cut = data.rfind(b"\n") + 1
        rows = []
        for raw in data[:cut].split(b"\n")[:-1]:
            lines += 1
            if raw.strip():
                rows.append(_parsers().record_row(lines, raw))
        conn.executemany(f"INSERT OR REPLACE INTO records VALUES ({', '.join('?' * 11)})", rows)  # noqa: S608
        new_torn = "1" if cut < len(data) else "0"
        if rows or new_torn != torn:
            changed.add("records")
        self._set_meta(
            conn, records_inode=inode, records_offset=offset + cut, records_lines=lines, records_torn=new_torn
        )

    def _set_meta(self, conn: sqlite3.Connection, **values: object) -> None:
        conn.executemany(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", [(k, str(v)) for k, v in values.items()]
        )
