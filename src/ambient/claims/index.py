"""What ``claims/`` holds, kept by file: each claim's facts, or its problems, reused while the file is unchanged.

Why: ``ambient status`` parsed every claim file to count the open ones (2-3 ms each with the safe YAML loader), and
a brain keeps every claim it ever had: one fan-out of 1,000 items made status take 3-5 s, a month of them minutes.
:func:`census` reads only the files that changed since it last looked; what it found is kept in
``.ambient/claims-index.json``: each file's signature (inode, size, mtime and ctime in ns) with the
:class:`~.claim.ClaimFacts` read from it and its warnings, or the problems that made it unusable. The index
also names the code that judged them (ambient's version, and the size and mtime of the modules that read and
validate claims): other code, other rules, so the index is discarded.

Who reads it: the claim store (the daemon's stale-claims scan, ``ambient claim list``, ``doctor``, ``validate``), and
the query store (:mod:`ambient.query`) only when it rebuilds (:func:`verdicts`: the facts of files judged before).
``ambient status`` and the console read the query store, which keeps its own rows per file: one index per reader.

The census reads files through the store (:class:`ClaimReader`, which :class:`ambient.claims.store.ClaimStore`
is): the store remembers what it read, and the store's own stale-claims scan takes its candidates from here, so
this module sits below the store and never imports it.

The index is derived data, never a source of truth: nothing decides on it alone (marking claims stale takes its
candidates from it and reads each again under the claims guard), a missing, torn or foreign index is rebuilt, and
one that cannot be written (a read-only ``.ambient/``) only costs the speed. It is written atomically without
fsync: after a power cut it is at worst rebuilt.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from ambient.claims import claim as _claim
from ambient.claims import claimfile as _claimfile
from ambient.claims.claim import Claim, ClaimFacts
from ambient.claims.claimfile import is_claim_name
from ambient.core import problems as _problems
from ambient.core.errors import AmbientError, ClaimFileError, InputError
from ambient.core.problems import Problem
from ambient.storage import yamlfile as _yamlfile
from ambient.storage import yamltext as _yamltext
from ambient.storage.codestamp import code_stamp
from ambient.storage.fsutil import PRIVATE_FILE, atomic_write
from ambient.storage.paths import BrainPaths

INDEX_NAME: Final = "claims-index.json"
#: Bumped when what is kept changes (see also :func:`_code`).
_FORMAT: Final = 1
#: The modules whose code decides what a claim file yields (see :func:`_code`).
_RULES: Final = tuple(m.__name__ for m in (_claim, _claimfile, _problems, _yamlfile, _yamltext))
_MAX_INDEX_BYTES: Final = 256 * 1024 * 1024

_Sig = tuple[int, int, int, int]


class ClaimReader(Protocol):
    """What the census needs of the claim store: where claims are, and its reader of one file."""

    @property
    def paths(self) -> BrainPaths: ...

    @property
    def dir(self) -> Path: ...

    def read(self, path: Path) -> tuple[Claim, list[Problem]]: ...


@dataclass
class ClaimCensus:
    """The readable claims' facts by sess_id, the file of each, and every problem (as ``ClaimStore.load``)."""

    facts: dict[str, ClaimFacts] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    parsed: int = 0  # files read this time (the others came from the index)

    def count(self, *statuses: str) -> int:
        """How many readable claims have one of ``statuses``."""
        return sum(1 for f in self.facts.values() if f.status in statuses)


@dataclass(frozen=True)
class FileVerdict:
    """What one claim file yields: its facts and warnings, or (``facts`` None) the problems that make it unusable.
    ``sig`` is (inode, size, mtime_ns, ctime_ns) of the file judged."""

    name: str
    rel: str
    sig: _Sig
    facts: ClaimFacts | None
    problems: list[Problem]


def verdicts(store: ClaimReader, *, save: bool = True) -> tuple[list[FileVerdict], int]:
    """Every claim file's verdict, by file name, parsing only files not in the index as they are now; and how many
    were parsed. The census's reading, for a reader that keeps its own per-file rows (the query store's rebuild).

    Symlinks and other non-regular files are never indexed (read, and refused, each time). ``save=False`` for
    commands that promise to write nothing (``doctor``, ``validate``): they use the index, and leave it as it was.
    """
    paths = store.paths
    index_path = paths.state / INDEX_NAME
    old = _load_index(index_path)
    new: dict[str, list[Any]] = {}
    found: list[FileVerdict] = []
    parsed = 0
    try:
        entries = sorted((e for e in os.scandir(store.dir) if is_claim_name(e.name)), key=lambda e: e.name)
    except FileNotFoundError:
        entries = []
    folder = paths.rel(store.dir)
    for entry in entries:
        rel = f"{folder}/{entry.name}"  # a string: tens of thousands of files, and Path operations cost µs
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed since the listing
        sig: _Sig = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        kept = old.get(entry.name)
        record = kept if kept is not None and tuple(kept[0]) == sig else None
        if record is None:
            record = _read(store, entry.name, sig, rel)
            parsed += 1
        if stat.S_ISREG(st.st_mode):
            new[entry.name] = record
        found.append(_verdict(entry.name, rel, sig, record))
    if save and new != old:
        _save_index(index_path, new)
    return found, parsed


def kept_verdicts(paths: BrainPaths) -> Callable[[str, str, os.stat_result], FileVerdict | None]:
    """The index's verdict of one claim file as it is now (``lstat``), or None when the index has none for it: for
    a reader that reads the files it needs one by one (the query store's build, in short transactions) and must
    not parse them all at once as :func:`verdicts` does."""
    old = _load_index(paths.state / INDEX_NAME)

    def kept(name: str, rel: str, st: os.stat_result) -> FileVerdict | None:
        record = old.get(name)
        sig: _Sig = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if record is None or tuple(record[0]) != sig:
            return None
        return _verdict(name, rel, sig, record)

    return kept


def census(store: ClaimReader, *, save: bool = True) -> ClaimCensus:
    """Every claim file's facts or problems, parsing only files not in the index as they are now.

    Same verdicts as :meth:`ClaimStore.load` (the first file of a sess_id wins, the others are problems), from the
    same reader (see :func:`verdicts`).
    """
    found, parsed = verdicts(store, save=save)
    out = ClaimCensus(parsed=parsed)
    for verdict in found:
        _add(out, verdict)
    return out


def read_claims(store: ClaimReader, seen: ClaimCensus, sess_ids: Iterable[str]) -> dict[str, tuple[Path, Claim]]:
    """The whole claims of ``sess_ids`` (file, claim), read now from the files the census found them in.

    For commands that need a few claims in full (the open ones, the stale ones): the census picks them from its
    facts, then only their files are parsed. One that changed since into something unreadable, or into another
    sess_id, is left out.
    """
    out: dict[str, tuple[Path, Claim]] = {}
    for sid in sess_ids:
        path = store.paths.root / seen.files[sid]
        try:
            claim, _ = store.read(path)
        except (AmbientError, OSError):
            continue
        if claim.sess_id == sid:
            out[sid] = (path, claim)
    return out


def _read(store: ClaimReader, name: str, sig: _Sig, rel: str) -> list[Any]:
    """``[sig, facts, warnings]`` of a readable claim, ``[sig, None, problems]`` of an unusable one (JSON-ready)."""
    try:
        claim, warnings = store.read(store.dir / name)
    except ClaimFileError as exc:
        return [list(sig), None, [_problem_row(p) for p in exc.problems]]
    except InputError as exc:  # always about this file (unreadable, too big, not a mapping, ...)
        return [list(sig), None, [[exc.line, exc.message, "error"]]]
    facts = ClaimFacts.of(claim)
    return [
        list(sig),
        [facts.sess_id, facts.fence, facts.status, facts.ttl, list(facts.times)],
        [_problem_row(p) for p in warnings],
    ]


def _problem_row(p: Problem) -> list[Any]:
    return [p.line, p.message, p.severity]


def _verdict(name: str, rel: str, sig: _Sig, record: list[Any]) -> FileVerdict:
    _, facts, problems = record
    rows = [Problem(file=rel, line=line, message=message, severity=severity) for line, message, severity in problems]
    if facts is None:
        return FileVerdict(name, rel, sig, None, rows)
    sess_id, fence, status, ttl, times = facts
    return FileVerdict(name, rel, sig, ClaimFacts(sess_id, fence, status, ttl, tuple(times)), rows)


def _add(out: ClaimCensus, verdict: FileVerdict) -> None:
    facts, rel = verdict.facts, verdict.rel
    if facts is None:
        out.problems.extend(verdict.problems)
        return
    if facts.sess_id in out.facts:
        first = out.files[facts.sess_id]
        out.problems.append(
            Problem(
                file=rel, line=1, message=f"sess_id {facts.sess_id!r} is already used by {first}; this file is ignored"
            )
        )
        return
    out.facts[facts.sess_id] = facts
    out.files[facts.sess_id] = rel
    out.problems.extend(verdict.problems)


def _code() -> str:
    """Which code judged the claims (:func:`~ambient.storage.codestamp.code_stamp` of :data:`_RULES`): an upgrade
    or an edit of the rules changes it."""
    return code_stamp(_FORMAT, _RULES)


def _load_index(path: Path) -> dict[str, list[Any]]:
    """The index's entries by file name; empty when there is none or it is not one this code wrote."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(_MAX_INDEX_BYTES + 1)
        data = json.loads(raw)
    except (OSError, ValueError):
        return {}
    if (
        len(raw) > _MAX_INDEX_BYTES
        or not isinstance(data, dict)
        or data.get("format") != _FORMAT
        or data.get("code") != _code()
        or not isinstance(data.get("files"), dict)
    ):
        return {}
    return {k: v for k, v in data["files"].items() if _well_formed(v)}


def _well_formed(record: Any) -> bool:
    """A record as :func:`_read` writes it (anything else is read again from its file)."""
    if not (isinstance(record, list) and len(record) == 3 and isinstance(record[2], list)):
        return False
    sig, facts, problems = record
    if not (isinstance(sig, list) and len(sig) == 4 and all(isinstance(n, int) for n in sig)):
        return False
    if facts is not None and not (
        isinstance(facts, list)
        and len(facts) == 5
        and isinstance(facts[0], str)
        and isinstance(facts[2], str)
        and isinstance(facts[4], list)
    ):
        return False
    return all(isinstance(p, list) and len(p) == 3 and isinstance(p[1], str) for p in problems)


def _save_index(path: Path, files: dict[str, list[Any]]) -> None:
    text = json.dumps({"format": _FORMAT, "code": _code(), "files": files}, separators=(",", ":"))
    # Derived data, not fsync'd: rebuilt if a power cut loses it. A read-only .ambient/: the next census parses
    # again, nothing else is lost.
    with contextlib.suppress(OSError):
        atomic_write(path, text, durable=False, mode=PRIVATE_FILE)
