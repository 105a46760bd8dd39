"""The first look at a brain whose query store is not built yet: what a few cheap reads tell, while a builder
fills the store (:mod:`ambient.query.builder`).

Building the store reads every file of the brain: at 20,000 claims that took a minute, all of it parsing claim
files. ``ambient status`` does not wait for it: it counts the claim files (a directory listing), lists the runs
whose journal's last line does not say they finished (their first and last lines only, a few hundred journals at
most: :mod:`ambient.engine.journalglance`), counts the escalation files and reads the newest run records from the
end of ``runs.jsonl``; what needs the files parsed (claims open, items of each run, escalations pending) is said to
be still gathered. No model is imported here: the whole look costs what a status of a built store costs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ambient.claims.names import is_claim_name
from ambient.engine.journalglance import finished_glance, started_head
from ambient.storage.paths import BrainPaths

#: Fewer files than this to read (claims and run journals) and a missing store is built by the reader at once.
FIRST_LOOK_MIN: Final = 1000
#: The most run journals whose first and last lines the first look reads (more: the runs in progress are left to
#: the builder). Each costs ~30 µs cached, but a disk read or two when not: 2,000 took 1.25 s after the caches
#: were dropped.
GLANCE_JOURNALS_MAX: Final = 200
#: The most of ``runs.jsonl``'s end read for its newest records.
_TAIL_BYTES: Final = 1024 * 1024


@dataclass(frozen=True)
class RunHead:
    """A run whose journal does not say it finished, from its ``started`` event alone."""

    run_id: str
    workflow: str | None
    started_at: str | None
    total: int | None  # items of a for_each (chains: None)
    journal: str


@dataclass(frozen=True)
class FirstLook:
    """What the first look found."""

    claim_files: int
    journals: int
    runs: list[RunHead] | None  # None: too many journals to read at a glance (:data:`GLANCE_JOURNALS_MAX`)
    escalation_files: int
    records: list[dict[str, Any]]  # the newest run records, oldest first (as ``views.records``)


def count_names(folder: Path, wanted: Any) -> int:
    """How many entries of ``folder`` have a name ``wanted`` accepts (0 when it is missing): one listing, no stat."""
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    return sum(map(wanted, names))


def is_journal_name(name: str) -> bool:
    """A run journal's file name (the query store's rule for ``.ambient/runs/``)."""
    return name.endswith(".jsonl") and not name.startswith(".")


def is_escalation_name(name: str) -> bool:
    """An escalation file's name (``EscalationStore.scan``'s files)."""
    return name.endswith(".yml") and not name.startswith(".")


def files_to_index(paths: BrainPaths) -> int:
    """Claim files and run journals (what building the store reads most of), counted up to
    :data:`FIRST_LOOK_MIN` at least: the claims are not listed when the journals reach it."""
    journals = count_names(paths.run_journals, is_journal_name)
    return journals if journals >= FIRST_LOOK_MIN else journals + count_names(paths.claims, is_claim_name)


def first_look(paths: BrainPaths, *, last: int = 50) -> FirstLook:
    """The first look at ``paths`` (see the module's docstring); the ``last`` newest run records."""
    heads: list[RunHead] = []
    try:
        with os.scandir(paths.run_journals) as it:
            journals = sorted(e.name for e in it if is_journal_name(e.name))
    except OSError:
        journals = []
    few = len(journals) <= GLANCE_JOURNALS_MAX
    for name in journals if few else []:
        path = paths.run_journals / name
        if finished_glance(path) is not None:
            continue
        head = started_head(path) or {}
        items = head.get("items")
        heads.append(
            RunHead(
                run_id=str(head.get("run_id") or name.removesuffix(".jsonl")),
                workflow=head["workflow"] if isinstance(head.get("workflow"), str) else None,
                started_at=head["at"] if isinstance(head.get("at"), str) else None,
                total=len(items) if isinstance(items, list) else None,
                journal=name,
            )
        )
    return FirstLook(
        claim_files=count_names(paths.claims, is_claim_name),
        journals=len(journals),
        runs=heads if few else None,
        escalation_files=count_names(paths.escalations, is_escalation_name),
        records=last_records(paths.runs_log, last),
    )


def last_records(path: Path, last: int) -> list[dict[str, Any]]:
    """The newest ``last`` run records of ``runs.jsonl`` read from its end, oldest first; a torn last line and lines
    that are not JSON objects are skipped (as the query store does)."""
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            start = max(0, size - _TAIL_BYTES)
            fh.seek(start)
            data = fh.read(size - start)
    except OSError:
        return []
    lines = data[: data.rfind(b"\n") + 1].split(b"\n")[:-1]
    if start > 0:
        lines = lines[1:]  # the first may be cut
    found: list[dict[str, Any]] = []
    for raw in reversed(lines):
        if len(found) >= last:
            break
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if isinstance(rec, dict):
            found.append(rec)
    return found[::-1]
