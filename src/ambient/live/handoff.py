"""An agent's handoff (spec/001): what a runner gives the agent instead of its thread's transcript. Pure.

:func:`summarise` turns the newest turns of the thread into five stable rubrics, never more than
:data:`HANDOFF_MAX_CHARS` characters of clean UTF-8; :class:`~ambient.live.context.LiveContext` keeps it as the
thread's ``handoff.md``.

A handoff carries only what is still open: ambient's SPAWN of an item is correlated by its key ``run/item/attempt``,
so a request or a blocker of an older attempt of the same item (the person answered, the item ran again) or of a run
that has ended (``settled``: the daemon says which runs are over) is left out: an agent's new session is not handed
the questions of an unrelated, finished run."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from ambient.live.turn import Turn, compact, cut, objective_in, one_line

HANDOFF_MAX_CHARS = 4096  # spec/001 HANDOFF_SUMMARY_MAX_CHARS
RUBRICS = (
    "Current objective",
    "Active requests (per requester)",
    "Recent decisions",
    "Blockers",
    "Last correlated answer",
)


def _ts(t: Turn) -> str:
    return t.ts.strftime("%Y-%m-%d %H:%M")


def _corr(t: Turn) -> str:
    return f" [{one_line(t.correlation_id, 60)}]" if t.correlation_id else ""


def _objective_of(t: Turn) -> str | None:
    p = t.payload
    if isinstance(p, dict):
        for container in (p.get("context"), p):
            if isinstance(container, dict):
                hit = objective_in(container)
                if isinstance(hit, str) and hit.strip():
                    return hit
    return None


def _objective(turns: Sequence[Turn]) -> list[str]:
    for t in reversed(turns):
        obj = _objective_of(t)
        if obj:
            return [f"{one_line(obj, 600)} (set by {one_line(t.requester, 60)} via {t.signal}, {_ts(t)})"]
    for t in reversed(turns):
        if t.signal == "SPAWN" and t.text:
            return [f"{one_line(t.text, 600)} (asked by {one_line(t.requester, 60)}, {_ts(t)})"]
    return ["(none recorded)"]


#: Whether a run is over (finished, aborted): its requests and blockers are no longer open.
Settled = Callable[[str], bool]


def run_key(correlation_id: str | None) -> tuple[str, str, int] | None:
    """``(run, item, attempt)`` of ambient's SPAWN key ``run/item/attempt`` (an item may hold ``/``, a run id never
    does); None for any other correlation id (an agent's own, a packet from outside a run)."""
    if not correlation_id:
        return None
    run, sep, rest = correlation_id.partition("/")
    item, sep2, attempt = rest.rpartition("/")
    if not (run and sep and sep2 and item and attempt.isdigit()):
        return None
    return run, item, int(attempt)


def still_open(turns: Sequence[Turn], settled: Settled | None = None) -> Callable[[str | None], bool]:
    """Whether a correlation id of ``turns`` may still be open: not an older attempt of an item that ran again, not
    a run that has ended (``settled``; None: none known to have ended). One not of a run is kept."""
    latest: dict[tuple[str, str], int] = {}
    for t in turns:
        key = run_key(t.correlation_id)
        if key is not None and key[2] > latest.get(key[:2], 0):
            latest[key[:2]] = key[2]
    ended: dict[str, bool] = {}

    def keep(correlation_id: str | None) -> bool:
        key = run_key(correlation_id)
        if key is None:
            return True
        if key[2] < latest.get(key[:2], 0):
            return False
        if settled is None:
            return True
        if key[0] not in ended:
            ended[key[0]] = settled(key[0])
        return not ended[key[0]]

    return keep


def _open_requests(turns: Sequence[Turn], keep: Callable[[str | None], bool]) -> dict[tuple[str, str | None], Turn]:
    """The requests (SPAWN, HANDOFF) not answered yet, and still open (``keep``)."""
    open_: dict[tuple[str, str | None], Turn] = {}
    for t in turns:
        key = (t.requester, t.correlation_id)
        if t.role == "requester" and t.signal in ("SPAWN", "HANDOFF"):
            open_.pop(key, None)
            open_[key] = t
        elif t.role == "agent" and t.signal in ("RETURN", "ERROR"):
            if key in open_:
                del open_[key]
            elif t.correlation_id is None:
                mine = [k for k in open_ if k[0] == t.requester]
                if mine:
                    del open_[mine[-1]]
    return {k: t for k, t in open_.items() if keep(k[1])}


def _active_requests(open_: dict[tuple[str, str | None], Turn]) -> list[str]:
    by_requester: dict[str, list[Turn]] = {}
    for (req, _), t in open_.items():
        by_requester.setdefault(req, []).append(t)
    order = sorted(by_requester, key=lambda r: by_requester[r][-1].ts, reverse=True)
    lines = []
    for req in order[:12]:
        reqs = by_requester[req]
        last = reqs[-1]
        more = f" ({len(reqs)} open)" if len(reqs) > 1 else ""
        lines.append(f"- {one_line(req, 60)}{more}:{_corr(last)} {one_line(last.text, 300)} ({_ts(last)})")
    if len(order) > 12:
        lines.append(f"- … and {len(order) - 12} more requesters")
    return lines or ["(none)"]


def _decision_text(t: Turn) -> str | None:
    if isinstance(t.payload, dict) and t.payload.get("decision") is not None:
        return compact(t.payload["decision"])
    if t.signal == "DECISION":
        return t.text
    return None


def _decisions(turns: Sequence[Turn]) -> list[str]:
    lines = []
    for t in reversed(turns):
        d = _decision_text(t)
        if d:
            lines.append(f"- {_ts(t)} {one_line(t.requester, 60)}{_corr(t)}: {one_line(d, 300)}")
            if len(lines) == 5:
                break
    return lines or ["(none)"]


def _open_blockers(turns: Sequence[Turn], keep: Callable[[str | None], bool]) -> list[Turn]:
    """The BLOCKED_ON and ESCALATE turns nothing moved on since, still open (``keep``), the newest first."""
    open_: dict[str | None, Turn] = {}
    for t in turns:
        if t.signal in ("BLOCKED_ON", "ESCALATE"):
            open_.pop(t.correlation_id, None)
            open_[t.correlation_id] = t
        else:
            open_.pop(t.correlation_id, None)  # anything later on the same correlation moves it on
    return [t for t in reversed(open_.values()) if keep(t.correlation_id)]


def _blockers(blocked: Sequence[Turn]) -> list[str]:
    lines = [f"- {t.signal} {_ts(t)}{_corr(t)}: {one_line(t.text, 300)}" for t in blocked]
    return lines[:5] or ["(none)"]


def runs_named(turns: Sequence[Turn], settled: Settled | None = None) -> frozenset[str]:
    """The runs whose requests or blockers the handoff of ``turns`` shows: once one of them ends, that handoff is
    out of date (:class:`~ambient.live.context.LiveContext` rebuilds it then)."""
    keep = still_open(turns, settled)
    named: Iterable[str | None] = [c for _, c in _open_requests(turns, keep)]
    named = [*named, *(t.correlation_id for t in _open_blockers(turns, keep))]
    return frozenset(k[0] for c in named if (k := run_key(c)) is not None)


def _last_answer(turns: Sequence[Turn]) -> list[str]:
    for t in reversed(turns):
        if t.role == "agent" and t.signal == "RETURN" and t.correlation_id:
            return [f"{_corr(t).strip()} to {one_line(t.requester, 60)} ({_ts(t)}): {one_line(t.text, 1000)}"]
    return ["(none yet)"]


def _share(sizes: Sequence[int], budget: int) -> list[int]:
    """Water-filling: each rubric gets what it needs up to an equal share of what is left."""
    alloc = [0] * len(sizes)
    left = max(0, budget)
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    for rank, i in enumerate(order):
        share = left // (len(sizes) - rank)
        alloc[i] = min(sizes[i], share)
        left -= alloc[i]
    return alloc


def _fit_lines(lines: Sequence[str], limit: int) -> str:
    out: list[str] = []
    used = 0
    for ln in lines:
        sep = 1 if out else 0
        if used + sep + len(ln) <= limit:
            out.append(ln)
            used += sep + len(ln)
            continue
        room = limit - used - sep
        if room >= 8:
            out.append(cut(ln, room))
        elif not out and limit >= 1:
            out.append("…")
        break
    return "\n".join(out)


def summarise(
    turns: Sequence[Turn],
    *,
    agent: str | None = None,
    max_chars: int = HANDOFF_MAX_CHARS,
    settled: Settled | None = None,
) -> str:
    """The handoff of a thread: the five stable rubrics, never more than ``max_chars`` characters.

    Pure. Each rubric gets a fair share of the room (what one does not need goes to the others)
    and is cut at line ends, or inside a line with an ellipsis; the text is clean UTF-8. Requests and blockers are
    only those still open (:func:`still_open`; ``settled``: which runs have ended).
    """
    if max_chars < 400:
        raise ValueError("max_chars must leave room for the rubrics (at least 400)")
    who = one_line(agent or (turns[-1].target if turns else "agent"), 64)
    as_of = f", up to {_ts(turns[-1])}" if turns else ""
    header = f"# Handoff: {who}\n_Summary of the shared live thread ({len(turns)} turns{as_of}); not the transcript._\n"
    keep = still_open(turns, settled)
    sections = [
        _objective(turns),
        _active_requests(_open_requests(turns, keep)),
        _decisions(turns),
        _blockers(_open_blockers(turns, keep)),
        _last_answer(turns),
    ]
    fixed = len(header) + sum(len(f"\n## {title}\n") for title in RUBRICS) + 1
    sizes = [len("\n".join(lines)) for lines in sections]
    alloc = _share(sizes, max_chars - fixed)
    parts = [header]
    for title, lines, room in zip(RUBRICS, sections, alloc, strict=True):
        parts.append(f"\n## {title}\n{_fit_lines(lines, room)}")
    text = "".join(parts) + "\n"
    return text if len(text) <= max_chars else cut(text, max_chars)  # guard; the shares already fit
