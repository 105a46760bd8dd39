"""Run journals as files: what start-up, ``status`` and ``doctor`` read of them without running anything.

The fold itself is :func:`ambient.engine.runstate.fold`; here is what surrounds it on disk: a finished run known from
its first and last lines (:func:`finished_glance`), a journal that does not fold reported at ``file:line``
(:func:`journal_problem`), and a torn last line cut before new events are appended (:func:`truncate_torn_tail`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ambient.core.errors import HistoryError
from ambient.core.lazylog import get_logger
from ambient.core.problems import Problem
from ambient.engine.journalglance import finished_glance
from ambient.engine.runstate import ended_because, fold
from ambient.storage.fsutil import cut_to
from ambient.storage.journal import read_jsonl
from ambient.storage.paths import BrainPaths

log = get_logger(__name__)

__all__ = ["finished_glance"]  # its home is journalglance (no fold imported), read through here too


def journal_problem(path: Path, source: str, exc: Exception) -> Problem:
    """Why and where a run journal does not fold: ``file:line`` of the record that fails (:class:`HistoryError`
    gives its index among the records; lines that are blank or not JSON are not records)."""
    line = None
    index = exc.index if isinstance(exc, HistoryError) else None
    if index is not None:
        seen = -1
        try:
            with path.open("rb") as fh:
                for lineno, raw in enumerate(fh, 1):
                    if raw.strip() and raw.endswith(b"\n") and isinstance(_json_or_none(raw), dict):
                        seen += 1
                        if seen == index:
                            line = lineno
                            break
        except OSError:
            pass
    why = exc.message if isinstance(exc, HistoryError) else f"{type(exc).__name__}: {exc}"
    return Problem(
        file=source,
        line=line,
        message=f"run journal does not load ({why}); this run is not resumed",
    )


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def journal_problems(paths: BrainPaths) -> list[Problem]:
    """The run journals that do not fold, each a ``file:line`` problem (``ambient doctor``, ``ambient status``)."""
    found: list[Problem] = []
    if not paths.run_journals.is_dir():
        return found
    for path in sorted(paths.run_journals.glob("*.jsonl")):
        if finished_glance(path) is not None:
            continue
        try:
            fold(read_jsonl(path).records)
        except OSError:
            continue
        except (ValueError, KeyError, TypeError) as exc:
            found.append(journal_problem(path, paths.rel(path), exc))
    return found


def truncate_torn_tail(path: Path, source: str) -> None:
    """Cut a torn last line (crash mid-append) so new events start on a line of their own; reported as
    ``file:line`` (``source`` names the file), like every other problem with a file."""
    data = path.read_bytes()
    cut = data.rfind(b"\n") + 1
    if cut < len(data):
        cut_to(path, cut)  # fsync'd: the cut is what the next appends start from, on disk before they come
        line = data.count(b"\n", 0, cut) + 1
        problem = f"{source}:{line}: torn last line (a crash mid-append): {len(data) - cut} byte(s) cut"
        log.warning("journal_torn_tail_cut", path=str(path), line=line, bytes=len(data) - cut, problem=problem)


@dataclass(frozen=True)
class RunGlance:
    """Where a run stands for an answer to one of its questions: ``ended`` (why in ``reason``: nothing will ever
    apply an answer to it again) and the escalations it ``decided`` (an answer is applied once it is there)."""

    ended: bool
    reason: str
    decided: frozenset[str]


def run_glance(paths: BrainPaths, run_id: str) -> RunGlance | None:
    """A run as its journal tells it; None when the journal cannot be read (a person may mend it: not ended)."""
    if not run_id or "/" in run_id or "\x00" in run_id or run_id.startswith("."):
        return None  # not a run's name: never a path out of the journals' folder
    path = paths.run_journal(run_id)
    if not path.exists():
        return RunGlance(True, "its run's journal is gone", frozenset())
    try:
        state = fold(read_jsonl(path).records)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    decided = frozenset(str(d.get("escalation")) for d in state.decisions if d.get("escalation"))
    return RunGlance(state.finished, ended_because(state) if state.finished else "", decided)


@dataclass(frozen=True)
class ModelCall:
    """One model call as its run journal recorded it (a ``call`` event): what the provider billed for it."""

    at: str
    run_id: str
    workflow: str
    item: str
    agent: str
    model: str
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cost_usd: float | None
    partial: bool


def model_calls(
    paths: BrainPaths, *, last: int, workflow: str | None = None, agent: str | None = None
) -> list[ModelCall]:
    """The newest ``last`` model calls of the run journals (newest journals first, then by time), as recorded: the
    cost of every call, where ``ambient stats`` adds them up per agent and model."""
    journals = sorted(paths.run_journals.glob("*.jsonl"), key=lambda p: p.stat().st_mtime, reverse=True)
    found: list[ModelCall] = []
    for path in journals:
        if len(found) >= last:
            break
        name = ""
        for ev in read_jsonl(path).records:
            if ev.get("ev") == "started":
                name = str(ev.get("workflow", ""))
            if ev.get("ev") != "call" or (workflow is not None and name != workflow):
                continue
            if agent is not None and ev.get("agent") != agent:
                continue
            raw = ev.get("usage")
            usage: dict[str, Any] = raw if isinstance(raw, dict) else {}
            cost = usage.get("cost_usd")
            found.append(
                ModelCall(
                    at=str(ev.get("at", "")),
                    run_id=path.stem,
                    workflow=name,
                    item=str(ev.get("item", "")),
                    agent=str(ev.get("agent", "")),
                    model=str(usage.get("model") or "?"),
                    input_tokens=int(usage.get("input_tokens") or 0),
                    output_tokens=int(usage.get("output_tokens") or 0),
                    cache_read_tokens=int(usage.get("cache_read_tokens") or 0),
                    cost_usd=float(cost) if isinstance(cost, int | float) else None,
                    partial=bool(ev.get("partial")),
                )
            )
    return sorted(found, key=lambda c: c.at)[-last:] if last > 0 else []
