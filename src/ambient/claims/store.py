"""The claim store: ``claims/*.yml`` read and written safely, transitions from :mod:`ambient.claims.claim`.

Reads never follow symlinks and cap the size (:mod:`ambient.claims.claimfile`); a malformed claim becomes a
reported Problem (file:line: what is wrong) and is skipped, never rewritten or deleted. Writes are atomic
(temp + fsync + rename + fsync dir) and keep every key and value ambient does not know. Each
read-modify-write runs under a short ``flock`` (``.ambient/claims.guard``); a write carrying a
fencing token older than the claim's ``fence:`` (the last token accepted) is refused, so a
holder whose lock expired and was taken over can no longer write (RELIABILITY §1.2 rule 3).
"""

from __future__ import annotations

import builtins
import os
import stat
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ambient.claims import claim as rules
from ambient.claims.claim import Claim, ClaimFacts, ClaimResult, sess_id_ok
from ambient.claims.claimfile import SUFFIXES, is_claim_name, read_claim_file
from ambient.claims.index import census, read_claims
from ambient.core.clock import Clock, SystemClock
from ambient.core.errors import (
    AmbientError,
    ClaimFileError,
    FencingError,
    InputError,
    StateError,
    TransitionError,
    UnsafePathError,
)
from ambient.core.problems import Problem
from ambient.storage.fsutil import (
    Staged,
    atomic_write,
    check_local_filesystem,
    fsync_dir,
    fsync_many,
    stage,
    sweep_stale_tmp,
)
from ambient.storage.guard import FileGuard
from ambient.storage.paths import BrainPaths
from ambient.storage.yamlfile import dump_yaml

GUARD_NAME = "claims.guard"
KNOWN_MAX = 4096  # files whose last version this store keeps in memory (see _remember)
STAGE_ROUND = 64  # claims written, then fsync'd, then renamed together (open temp files at most)


@dataclass(frozen=True)
class LoadedClaims:
    """Every readable claim by sess_id, the file each came from, and what was wrong or odd."""

    claims: dict[str, Claim] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)


def _check_sess_id(sess_id: str) -> str:
    # The rule of Claim.sess_id, checked directly: a fan-out writes each item claim about once, so a cache of
    # validated ids missed and each write validated a whole Claim (~100 µs of the writer's GIL time).
    if not isinstance(sess_id, str) or not sess_id_ok(sess_id):
        raise InputError(
            f"sess_id {sess_id!r} is not usable as a claim file name (no '/', no leading '.', printable, "
            "at most 200 characters)"
        )
    return sess_id


class ClaimStore:
    """Claims of one brain. Methods are synchronous and short; call them through ``asyncio.to_thread``
    from a coroutine if the directory may be large.

    Args:
        paths: the brain layout.
        clock: where ``now`` comes from when a caller does not pass one (naive claim times are
            read as local time, so ``now`` is converted to the local zone).
        check_filesystem: refuse NFS/CIFS/FUSE (RELIABILITY §1.2 rule 7).
    """

    def __init__(self, paths: BrainPaths, *, clock: Clock | None = None, check_filesystem: bool = True) -> None:
        if not paths.root.is_dir():
            raise InputError(f"{paths.root} is not a directory; expected a brain (see --brain)")
        self.paths = paths
        self.dir = paths.claims
        self._dir_s = str(self.dir)
        self.clock = clock or SystemClock()
        if self.dir.is_symlink():
            raise UnsafePathError("is a symlink; ambient never follows symlinks for claims/", file=str(self.dir))
        if check_filesystem:
            check_local_filesystem(self.dir if self.dir.exists() else paths.root)
        self._guard = FileGuard(paths.state / GUARD_NAME)
        self._files: dict[str, str] = {}  # sess_id → its file (strings: a Path and its parts are ~0.5 KB)
        # Files this store read or wrote, by (ino, size, mtime_ns), with their fence: write_claim's fast path.
        # What this store last wrote or read, by file: (inode, size, mtime_ns) and the claim. A file whose
        # signature still matches need not be parsed again (the fence check, the stale-claims scan).
        self._known: dict[str, tuple[tuple[int, int, int], ClaimFacts]] = {}
        self._known_lock = threading.Lock()
        # The fence of each fenced claim this store wrote (never evicted: fences come only with tokens, rare). A
        # write without a token is made under it; what it read does not count (a stale view must not learn the
        # newer holder's fence from a scan and then pass it).
        self._fences: dict[str, int] = {}

    # -- reading

    def now(self) -> datetime:
        """The clock's now in the local zone (how naive claim times are meant)."""
        return self.clock.now().astimezone()

    def _rel(self, path: Path) -> str:
        return self.paths.rel(path)

    def read(self, path: Path) -> tuple[Claim, list[Problem]]:
        """Read one claim file (no symlink, size-capped); returns the claim and its warnings.

        Raises :class:`ClaimFileError` (or InputError) with file and line when it cannot be used.
        """
        claim, warnings, sig = read_claim_file(path, self._rel(path))
        self._remember(path, sig, claim, written=False)
        return claim, warnings

    def _remember(self, path: Path, sig: tuple[int, int, int], claim: Claim, *, written: bool = True) -> None:
        """Keep what this store last wrote or read of ``path``, for the newest ``KNOWN_MAX`` files.

        Bounded: R-12's soak found the daemon growing ~47 KB per run of 8 items (5 MB a minute under load) from
        these entries, one per claim ever written. An old claim that falls out is parsed again if it is ever
        looked at (the stale-claims scan keeps its own per-file verdict). Only the claim's
        :class:`~ambient.claims.claim.ClaimFacts` are kept, not the model, under string paths: ~0.7 KB a file instead
        of ~2.9 KB (test_claimstore). ``written``: this store wrote the file, which is then where
        ``claim.sess_id`` lives.
        """
        facts = ClaimFacts.of(claim)
        with self._known_lock:  # the writer thread and the loop both remember; readers only get()
            known, files = self._known, self._files
            key = str(path)
            known.pop(key, None)  # to the end: the most recent stay longest
            known[key] = (sig, facts)
            if written:
                files[claim.sess_id] = key
            if len(known) > KNOWN_MAX:
                self._known = dict(list(known.items())[len(known) // 2 :])
            if len(files) > KNOWN_MAX:
                self._files = dict(list(files.items())[len(files) // 2 :])

    def known_facts(self, path: Path, sig: tuple[int, int, int]) -> ClaimFacts | None:
        """What this store knows of ``path`` if it last wrote or read that very version (inode, size, mtime_ns)."""
        known = self._known.get(str(path))
        return known[1] if known is not None and known[0] == sig else None

    def is_own_write(self, path: str | Path) -> bool:
        """Is the file at ``path`` exactly what this store last wrote or read (its own change, not a person's)?"""
        known = self._known.get(str(path))
        if known is None:
            return False
        try:
            st = os.lstat(path)
        except OSError:
            return False
        return known[0] == (st.st_ino, st.st_size, st.st_mtime_ns)

    def load(self) -> LoadedClaims:
        """Every claim in ``claims/``; a bad file becomes a Problem and is skipped (never touched)."""
        out = LoadedClaims()
        try:
            names = sorted(os.listdir(self.dir))
        except FileNotFoundError:
            return out
        for name in names:
            if not is_claim_name(name):
                continue
            path = self.dir / name
            try:
                claim, warnings = self.read(path)
            except ClaimFileError as exc:
                out.problems.extend(exc.problems)
                continue
            except InputError as exc:
                out.problems.append(Problem(file=exc.file or self._rel(path), line=exc.line, message=exc.message))
                continue
            if claim.sess_id in out.claims:
                first = self._rel(out.files[claim.sess_id])
                out.problems.append(
                    Problem(
                        file=self._rel(path),
                        line=1,
                        message=f"sess_id {claim.sess_id!r} is already used by {first}; this file is ignored",
                    )
                )
                continue
            out.claims[claim.sess_id] = claim
            out.files[claim.sess_id] = path
            out.problems.extend(warnings)
        self._files = {sid: str(path) for sid, path in out.files.items()}
        return out

    def list(self, *, status: str | Iterable[str] | None = None) -> builtins.list[Claim]:
        """Readable claims sorted by sess_id, optionally only those with the given status(es)."""
        wanted = {status} if isinstance(status, str) else set(status) if status is not None else None
        loaded = self.load()
        return [c for sid, c in sorted(loaded.claims.items()) if wanted is None or c.status in wanted]

    def path_for(self, sess_id: str) -> Path:
        """The file of ``sess_id``: the one it was loaded from, else ``claims/<sess_id>.yml``."""
        _check_sess_id(sess_id)
        known = self._files.get(sess_id)
        if known is not None:
            return Path(known)
        for suffix in SUFFIXES:
            candidate = self.dir / f"{sess_id}{suffix}"
            if os.path.lexists(candidate):
                return candidate
        return self.dir / f"{sess_id}.yml"

    def _locate(self, sess_id: str) -> tuple[Path, os.stat_result | None]:
        """:meth:`path_for` and that file's ``lstat`` (None: no file), one ``lstat`` per name tried."""
        _check_sess_id(sess_id)
        known = self._files.get(sess_id)
        if known is not None:
            try:
                return Path(known), os.lstat(known)
            except FileNotFoundError:
                return Path(known), None
        for suffix in SUFFIXES:  # strings first: a fan-out locates a new claim per item, and Paths cost µs
            name = f"{self._dir_s}/{sess_id}{suffix}"
            try:
                st = os.lstat(name)
            except FileNotFoundError:
                continue
            return Path(name), st
        return Path(f"{self._dir_s}/{sess_id}.yml"), None

    def get(self, sess_id: str) -> Claim:
        """The claim ``sess_id`` read fresh from disk; InputError if there is none or it is unreadable."""
        return self.find(sess_id)[1]

    def locate(self, sess_id: str) -> Path:
        """The file holding ``sess_id``; InputError if there is none or it is unreadable."""
        return self.find(sess_id)[0]

    def find(self, sess_id: str) -> tuple[Path, Claim]:
        """(file, claim) of ``sess_id``, read fresh: its usual file first, else a scan of claims/.

        The usual file is checked to hold that very sess_id; an unreadable one raises with its problems.
        """
        path = self.path_for(sess_id)
        if os.path.lexists(path):
            claim, _ = self.read(path)
            if claim.sess_id == sess_id:
                return path, claim
        loaded = self.load()
        if sess_id in loaded.files:
            return loaded.files[sess_id], loaded.claims[sess_id]
        raise InputError(f"no claim {sess_id!r} in {self._rel(self.dir)}/; `ambient claim list` shows the known claims")

    # -- writing

    def _write(self, path: Path, claim: Claim, *, durable: bool = True, doc: Mapping[str, Any] | None = None) -> None:
        st = atomic_write(path, dump_yaml(dict(doc) if doc is not None else claim.to_document()), durable=durable)
        # Our file's stat, taken before the rename: one that replaced it since is not mistaken for ours.
        self._remember(path, (st.st_ino, st.st_size, st.st_mtime_ns), claim)
        self._wrote_fence(claim)

    def _wrote_fence(self, claim: Claim) -> None:
        if claim.fence is not None:
            self._fences[claim.sess_id] = max(claim.fence, self._fences.get(claim.sess_id, claim.fence))

    def _fenced(self, claim: Claim, current_fence: int | None, token: int | None, path: Path) -> Claim:
        """The claim to write with ``fence`` = the highest token accepted; FencingError for an older token.

        A write without a token is made under the fence its claim carries (the one its writer last saw): a
        blind write from a stale view (the daemon woken past its lease) must not pass a file a newer holder has
        fenced since. A transition re-reads the file first, so it carries the current fence.
        """
        if token is not None:
            self._refuse_unissued(token, claim.sess_id, path)
        made_under = token
        if made_under is None:
            mine = (f for f in (claim.fence, self._fences.get(claim.sess_id)) if f is not None)
            made_under = max(mine, default=None)
        if current_fence is not None and (made_under is None or made_under < current_fence):
            raise FencingError(
                f"{self._rel(path)}: write refused: fencing token {made_under} is older than {current_fence}, the "
                f"last accepted for claim {claim.sess_id}; this holder's lock expired and was taken over"
            )
        best = max((t for t in (current_fence, claim.fence, token) if t is not None), default=None)
        if best is None or best == claim.fence:
            return claim
        return Claim.model_validate({**claim.to_document(), rules.FENCE: best})

    def _refuse_unissued(self, token: int, sess_id: str, path: Path) -> None:
        """A token no lock was ever granted: above the lock manager's counter (``.ambient/locks.guard``) and the
        wall clock's microseconds, which every token is made from. Accepted, it raised the claim's fence beyond any
        real holder's, and locked the claim against them with a false "expired and taken over"."""
        from ambient.claims.locks import GUARD_NAME

        try:
            with open(self.paths.state / GUARD_NAME, "rb") as guard:  # noqa: PTH123 - one small read
                raw = guard.read(32)
            issued = int(raw.split()[0]) if raw.strip() else 0
        except (OSError, ValueError):
            issued = 0
        ceiling = max(issued, int(self.now().timestamp() * 1_000_000)) + 60_000_000  # a minute of clock skew
        if token > ceiling:
            raise FencingError(
                f"{self._rel(path)}: write refused: fencing token {token} was never granted (tokens come from "
                f"`ambient lock acquire`; none is above {max(issued, 0)} yet); claim {sess_id} is unchanged"
            )

    def open(self, claim: Claim, *, token: int | None = None) -> Claim:
        """Create ``claims/<sess_id>.yml``; StateError if a claim with that id exists already."""
        sid = claim.sess_id
        with self._guard.hold():
            path = self.dir / f"{sid}.yml"
            known = self._files.get(sid)
            for existing in (path, self.dir / f"{sid}.yaml", Path(known) if known is not None else None):
                if existing is not None and os.path.lexists(existing):
                    raise StateError(f"claim {sid} exists already ({self._rel(existing)}); pick another sess_id")
            self.dir.mkdir(parents=True, exist_ok=True)
            out = self._fenced(claim, None, token, path)
            self._write(path, out)
            return out

    def update(
        self,
        sess_id: str,
        changes: Mapping[str, Any],
        *,
        remove: Iterable[str] = (),
        token: int | None = None,
        durable: bool = True,
    ) -> Claim:
        """Set (and remove) keys of a claim, re-read fresh under the guard. Status moves go through
        :meth:`transition`; ``sess_id`` never changes."""
        forbidden = {"status", "sess_id"} & (set(changes) | set(remove))
        if forbidden:
            raise InputError(
                f"update cannot change {', '.join(sorted(forbidden))}; use transition()/close() for the status"
            )
        with self._guard.hold():
            path, current = self.find(sess_id)
            doc = current.to_document()
            for key in remove:
                doc.pop(key, None)
            doc.update(changes)
            try:
                new = Claim.model_validate(doc)
            except ValidationError as exc:
                raise InputError(f"update of claim {sess_id} is invalid: {exc.errors()[0]['msg']}") from None
            out = self._fenced(new, current.fence, token, path)
            self._write(path, out, durable=durable)
            return out

    def transition(
        self,
        sess_id: str,
        action: str,
        message: str | None = None,
        *,
        now: datetime | None = None,
        result: ClaimResult | Mapping[str, Any] | None = None,
        token: int | None = None,
    ) -> dict[str, Claim]:
        """Apply gate/approve/reject/pause/resume/abort/close with cascades; write and return what changed.

        Parents are written before children for pause and abort (a paused parent already blocks
        its children in pre-flight), children before the parent for resume; a crash in between
        leaves a state the same command finishes.
        """
        when = (now or self.now()).astimezone()
        with self._guard.hold():
            loaded = self.load()
            if sess_id not in loaded.claims:
                self._raise_unknown(sess_id, loaded)
            changed = rules.apply(loaded.claims, sess_id, action, message, when, result=result)
            target = changed[sess_id]
            changed[sess_id] = self._fenced(target, loaded.claims[sess_id].fence, token, loaded.files[sess_id])
            order = [sid for sid in changed if sid != sess_id]
            order = [*order, sess_id] if action == "resume" else [sess_id, *order]
            for sid in order:
                self._write(loaded.files[sid], changed[sid])
            return changed

    def _raise_unknown(self, sess_id: str, loaded: LoadedClaims) -> None:
        for problem in loaded.problems:
            if problem.severity == "error" and Path(problem.file).stem == sess_id:
                raise InputError(f"claim {sess_id} cannot be read: {problem}; fix the file by hand")
        raise TransitionError(f"no claim {sess_id!r}; `ambient claim list` shows the known claims")

    def close(
        self,
        sess_id: str,
        result: ClaimResult | Mapping[str, Any],
        *,
        message: str | None = None,
        now: datetime | None = None,
        token: int | None = None,
    ) -> Claim:
        """Close with a result (tier rules of spec/002 apply); returns the closed claim."""
        return self.transition(sess_id, "close", message, now=now, result=result, token=token)[sess_id]

    def mark_stale(self, *, now: datetime | None = None, default_ttl: timedelta | None = None) -> dict[str, Claim]:
        """Turn open claims past their TTL into ``stale`` (written); returns them.

        The candidates come from the claims census (:mod:`ambient.claims.index`: only files changed since it last
        looked are parsed), and each is read again under the guard before the rule decides: it loaded and parsed
        every claim of the brain under the guard (a minute at 20,000 claims, while no claim could be written).
        """
        when = (now or self.now()).astimezone()
        tz = when.tzinfo
        assert tz is not None
        changed: dict[str, Claim] = {}
        with self._guard.hold():
            seen = census(self)
            due = [sid for sid, f in seen.facts.items() if (at := f.stale_at(tz, default_ttl)) and when > at]
            for sid, (path, claim) in read_claims(self, seen, due).items():
                stale = rules.mark_stale({sid: claim}, when, default_ttl).get(sid)
                if stale is not None:
                    self._write(path, stale)
                    changed[sid] = stale
            return changed

    def write_claim(self, claim: Claim, *, durable: bool = True, token: int | None = None) -> Path:
        """Write a whole claim (the engine's bulk path): no re-read when the file is the one this store
        last wrote or read; ``fence`` never goes down; a malformed or symlinked file is never overwritten.

        ``durable=False`` skips the fsyncs: a power cut may then leave the file empty or garbled, which a
        restart reports and never overwrites (only for tests and tools that rebuild the file anyway).
        """
        with self._guard.hold():
            return self._write_claim_locked(claim, durable=durable, token=token)

    def write_claims(
        self, claims: Iterable[Claim | tuple[Claim, Mapping[str, Any]]], *, durable: bool = True
    ) -> builtins.list[tuple[str, Exception]]:
        """:meth:`write_claim` for many claims under one hold of the guard; returns the ones that failed, why.

        A claim may come with the document it was validated from (written as is, unless fencing changes the
        claim), which spares rebuilding it from the model. Durable writes go in rounds of up to
        ``STAGE_ROUND`` files: all written, then fsync'd together (:func:`fsync_many`), then renamed into place,
        then one fsync of claims/ at the end. Each file is on disk before its name points at it (a power cut leaves
        every claim old or new, never empty or torn: R-03), without a wait between one write and the next.
        Performance (bench/fanout.py): the claims writer thread took the guard and created the folder for
        every item of a fan-out, and rebuilt each document.
        """
        failed: builtins.list[tuple[str, Exception]] = []
        entries = [entry if isinstance(entry, tuple) else (entry, None) for entry in claims]
        with self._guard.hold():
            self.dir.mkdir(parents=True, exist_ok=True)
            wrote = False
            for start in range(0, len(entries), STAGE_ROUND):
                wrote |= self._write_round(entries[start : start + STAGE_ROUND], durable, failed)
            if durable and wrote:
                fsync_dir(self.dir)
        return failed

    def _write_round(
        self,
        entries: Sequence[tuple[Claim, Mapping[str, Any] | None]],
        durable: bool,
        failed: builtins.list[tuple[str, Exception]],
    ) -> bool:
        staged: builtins.list[tuple[Claim, Staged]] = []
        try:
            for claim, doc in entries:
                try:
                    path, out = self._target_locked(claim, token=None, made_dir=True)
                    data = dump_yaml(dict(doc) if doc is not None and out is claim else out.to_document())
                    staged.append((out, stage(path, data.encode("utf-8"))))
                except (AmbientError, OSError) as exc:  # a claim the person broke or replaced: the others go on
                    failed.append((claim.sess_id, exc))
            if durable:
                fsync_many([st.fd for _, st in staged])
        except BaseException as exc:  # an fsync failed (or worse): nothing of this round is put in place
            for claim, st in staged:
                st.discard()
                if isinstance(exc, OSError):
                    failed.append((claim.sess_id, exc))
            if not isinstance(exc, OSError):
                raise
            return False
        wrote = False
        for claim, st in staged:
            st.close()
            try:
                st.commit()
            except OSError as exc:
                failed.append((claim.sess_id, exc))
                continue
            # Our file's stat, taken before the rename: one that replaced it since is not mistaken for ours.
            self._remember(st.target, (st.stat.st_ino, st.stat.st_size, st.stat.st_mtime_ns), claim)
            self._wrote_fence(claim)
            wrote = True
        return wrote

    def _target_locked(self, claim: Claim, *, token: int | None, made_dir: bool = False) -> tuple[Path, Claim]:
        """Where ``claim`` goes and what to write there (fenced); refuses a file it must not overwrite."""
        path, st = self._locate(claim.sess_id)
        current_fence: int | None = None
        if st is not None:
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            known = self._known.get(str(path))
            if known is not None and known[0] == key and stat.S_ISREG(st.st_mode):
                current_fence = known[1].fence
            else:
                current, _ = self.read(path)  # raises for a symlink or a malformed file: never overwritten
                if current.sess_id != claim.sess_id:
                    raise StateError(
                        f"{self._rel(path)} holds claim {current.sess_id}, not {claim.sess_id}; not overwritten"
                    )
                current_fence = current.fence
        elif not made_dir:
            self.dir.mkdir(parents=True, exist_ok=True)
        return path, self._fenced(claim, current_fence, token, path)

    def _write_claim_locked(
        self,
        claim: Claim,
        *,
        durable: bool,
        token: int | None,
        made_dir: bool = False,
        doc: Mapping[str, Any] | None = None,
    ) -> Path:
        path, out = self._target_locked(claim, token=token, made_dir=made_dir)
        self._write(path, out, durable=durable, doc=doc if out is claim else None)
        return path

    def sweep(self) -> builtins.list[Path]:
        """Delete temp files left in claims/ by writers that died (only those; call at start-up)."""
        return sweep_stale_tmp(self.dir)
