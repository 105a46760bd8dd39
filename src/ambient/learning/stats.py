"""The learning loop (ADR-027): statistics over run records, learned rules as data. No I/O.

Replay (recorded runs through the workflow as it is now) is :mod:`ambient.learning.replay`.

Statistics read plain JSON dicts from ``runs.jsonl`` (the fast path) or :class:`RunRecord` models.
Rules learn in shadow, are promoted after N agreements, decide alone only where the person opted
in, and are demoted at the first disagreement; every transition here is a pure function.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ambient.core.errors import InputError
from ambient.engine.budget import UsageTotals, bound_signature
from ambient.engine.records import RunRecord, is_failure

# --------------------------------------------------------------------------------------------
# Error signatures
# --------------------------------------------------------------------------------------------

SIGNATURE_MAX = 160
_NORMALISE_HEAD = 1000
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://\S+")
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?")
# A quote opens only where no word character precedes it, so the apostrophe of "can't" is no quote.
_QUOTED = re.compile(r"(?<!\w)'[^'\n]*'(?!\w)|\"[^\"\n]*\"|`[^`\n]*`")
_PATH = re.compile(r"(?<![\w.~-])(?:[A-Za-z]:)?[\w.~-]*(?:[/\\][\w.~-]*)+")  # starts at a token start: linear
_IP = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?\b")
_UUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
_HEX = re.compile(r"\b(?:0[xX][0-9a-fA-F]+|(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{6,})\b")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_SPACES = re.compile(r"\s+")


def normalise_message(message: str) -> str:
    """The signature of an error or question: URLs, timestamps, quoted values, paths, IP addresses,
    hex ids and numbers replaced by placeholders, whitespace collapsed, at most 160 characters.

    ``"timeout after 30s on 'vps/configs/instance-03.yml'"`` → ``"timeout after <n>s on <q>"``.
    """
    # Only the head counts: it keeps the regexes linear on a pathological message (one huge word).
    text = _URL.sub("<url>", message[:_NORMALISE_HEAD])  # first: URLs carry paths, numbers and sometimes tokens
    text = _TIMESTAMP.sub("<ts>", text)
    text = _QUOTED.sub("<q>", text)
    text = _PATH.sub("<path>", text)
    text = _IP.sub("<ip>", text)
    text = _UUID.sub("<id>", text)
    text = _HEX.sub("<n>", text)  # a hex id and a number alike: an id of only digits must group the same
    text = _NUMBER.sub("<n>", text)
    text = _SPACES.sub(" ", text).strip()
    return text[:SIGNATURE_MAX] if text else "(no message)"


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------

TrendDirection = Literal["falling", "rising", "flat", "unknown"]


def percentile(sorted_values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile of already sorted values (``None`` when empty): p50 of [1,2,3,4] is 2."""
    n = len(sorted_values)
    if n == 0:
        return None
    rank = -(-pct * n // 100)  # ceil without floats drifting
    return sorted_values[min(n, max(1, int(rank))) - 1]


@dataclass(frozen=True)
class CostStats:
    """What AI agents consumed (steps that reported usage). ``unknown_cost`` steps had no price: their tokens are
    counted, their cost is not, and ``cost_usd`` is then a lower bound (never those steps counted as free)."""

    cost_usd: float
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    turns: int
    steps: int
    unknown_cost: int


def cost_of(total: UsageTotals | None) -> CostStats | None:
    """The figures of a total, or None when no step reported usage."""
    if total is None or not total.attempts:
        return None
    return CostStats(
        round(total.cost_usd, 6),
        total.input_tokens,
        total.output_tokens,
        total.cache_read_tokens,
        total.cache_write_tokens,
        total.turns,
        total.attempts,
        total.unknown_cost,
    )


@dataclass(frozen=True)
class WeekStats:
    """Escalations of one ISO week (``2026-W11``): the headline measure of the loop."""

    week: str
    runs: int
    escalations: int
    rate: float  # escalations per run
    decision_p50_s: float | None  # median time the person took to decide
    cost: CostStats | None = None  # what the week's AI agents consumed (runs started that week)


@dataclass(frozen=True)
class Trend:
    """Direction of the weekly escalation rate, from a least-squares line over the weeks."""

    direction: TrendDirection
    slope_per_week: float | None = None
    first_rate: float | None = None
    last_rate: float | None = None


@dataclass(frozen=True)
class WorkflowStats:
    """Runs of one workflow: outcome, duration, escalations, errors and time to decision."""

    workflow: str
    runs: int
    success_rate: float | None
    duration_p50_ms: float | None
    duration_p95_ms: float | None
    escalations: int
    errors: int
    failures: int  # business failures (exit 1, status failed): errors are exit 2+, ERROR, bad output
    escalation_rate: float | None
    decisions: int  # the person's and learned rules' (auto_decisions); a deadline that passed is none
    auto_decisions: int
    timeouts: int  # escalations whose deadline decided (on_timeout)
    decision_p50_s: float | None
    decision_p95_s: float | None
    weeks: list[WeekStats]
    trend: Trend
    cost: CostStats | None = None  # None: no step of its runs reported usage (command agents)


@dataclass(frozen=True)
class AgentStats:
    """Steps carried out by one agent across workflows."""

    agent: str
    steps: int
    success_rate: float | None
    duration_p50_ms: float | None
    duration_p95_ms: float | None
    escalations: int
    errors: int
    failures: int
    cost: CostStats | None = None


@dataclass(frozen=True)
class ErrorSignature:
    """A recurring error: messages that differ only by numbers, ids, paths or quoted values."""

    signature: str
    count: int
    first_seen: datetime
    last_seen: datetime
    workflows: list[str]
    agents: list[str]
    example: str


@dataclass(frozen=True)
class Stats:
    """Everything ``ambient stats`` shows; :meth:`to_json` gives the ``--json`` form."""

    runs: int
    invalid: int  # records that are not valid run records (skipped, counted)
    since: datetime | None
    first_started: datetime | None
    last_started: datetime | None
    workflows: list[WorkflowStats]
    agents: list[AgentStats]
    errors: list[ErrorSignature]
    weeks: list[WeekStats]  # all workflows together
    trend: Trend
    cost: CostStats | None = None  # every run selected together

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (datetimes as ISO 8601)."""
        return jsonable(asdict(self))  # type: ignore[no-any-return]


def jsonable(value: Any) -> Any:
    """A value with datetimes as ISO text and dataclass trees as dicts (for ``--json``)."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


class _WorkflowAcc:
    __slots__ = (
        "auto",
        "durations",
        "errors",
        "escalations",
        "failures",
        "finished",
        "latencies",
        "runs",
        "successes",
        "timeouts",
        "usage",
    )

    def __init__(self) -> None:
        self.usage: UsageTotals | None = None
        self.runs = 0
        self.finished = 0
        self.successes = 0
        self.escalations = 0
        self.errors = 0
        self.failures = 0
        self.auto = 0
        self.timeouts = 0
        self.durations: list[float] = []
        self.latencies: list[float] = []


class _AgentAcc:
    __slots__ = ("durations", "errors", "escalations", "failures", "judged", "steps", "successes", "usage")

    def __init__(self) -> None:
        self.usage: UsageTotals | None = None
        self.failures = 0
        self.steps = 0
        self.judged = 0  # steps with a verdict (success, fail, error)
        self.successes = 0
        self.escalations = 0
        self.errors = 0
        self.durations: list[float] = []


class _WeekAcc:
    __slots__ = ("escalations", "latencies", "runs", "usage")

    def __init__(self) -> None:
        self.usage: UsageTotals | None = None
        self.runs = 0
        self.escalations = 0
        self.latencies: list[float] = []


class _SigAcc:
    __slots__ = ("agents", "count", "example", "first", "last", "workflows")

    def __init__(self, example: str, at: datetime) -> None:
        self.count = 0
        self.example = example
        self.first = at
        self.last = at
        self.workflows: set[str] = set()
        self.agents: set[str] = set()


_VERDICTS = frozenset({"success", "fail", "error"})
_NUMBER_TYPES = frozenset({int, float})
_UTC_SUFFIXES = ("+00:00", "Z")
_fromiso = datetime.fromisoformat
_SIG_CACHE_MAX = 100_000
_DIGITS_TO_ZERO = str.maketrans("123456789", "000000000")


def parse_time(value: Any) -> datetime:
    """An ISO 8601 timestamp as an aware datetime (naive ones are taken as UTC); raises ValueError."""
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, str):
        dt = datetime.fromisoformat(value)
    else:
        raise ValueError(f"expected an ISO 8601 timestamp, got {type(value).__name__}")
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


_SPAN = re.compile(r"(\d{1,6})([hdw])")


def parse_since(text: str, now: datetime) -> datetime:
    """``--since``: a date (``2026-03-01``, midnight UTC), an ISO 8601 time, or a span back from
    ``now`` (``12h``, ``30d``, ``8w``)."""
    t = text.strip()
    m = _SPAN.fullmatch(t)
    if m:
        n, unit = int(m.group(1)), m.group(2)
        return now - {"h": timedelta(hours=n), "d": timedelta(days=n), "w": timedelta(weeks=n)}[unit]
    try:
        return parse_time(t)
    except ValueError:
        msg = f"--since {text!r}: expected a date (2026-03-01), an ISO 8601 time or a span such as 12h, 30d, 8w"
        raise InputError(msg) from None


def iso_week(day: date) -> str:
    """``2026-W11``: the ISO week of a date."""
    year, week, _ = day.isocalendar()
    return f"{year}-W{week:02d}"


def is_int(v: Any) -> bool:
    """A number that is not a bool (JSON counts)."""
    return isinstance(v, int | float) and not isinstance(v, bool)


class StatsBuilder:
    """Accumulates run records one at a time (no list of records is kept); :meth:`result` summarises.

    Records are plain dicts as read from ``runs.jsonl`` or :class:`RunRecord` models. A record
    that is not a valid run record is counted in ``invalid`` and otherwise ignored.
    """

    def __init__(self, *, workflow: str | None = None, agent: str | None = None, since: datetime | None = None) -> None:
        self.workflow = workflow
        self.agent = agent
        self.since = parse_time(since) if since is not None else None  # naive → UTC, comparable
        self.runs = 0
        self.invalid = 0
        self.first: datetime | None = None
        self.last: datetime | None = None
        self._wf: dict[str, _WorkflowAcc] = {}
        self._agents: dict[str, _AgentAcc] = {}
        self._weeks: dict[tuple[str, str], _WeekAcc] = {}
        self._sigs: dict[str, _SigAcc] = {}
        self._week_of: dict[str, str] = {}  # "2026-03-18" → "2026-W12": one isocalendar per day
        self._sig_of: dict[str, str] = {}  # raw message → signature (messages repeat)

    def add_all(self, records: Iterable[Mapping[str, Any] | RunRecord]) -> StatsBuilder:
        """Add every record; returns self."""
        add = self.add
        for rec in records:
            add(rec)
        return self

    def add(self, record: Mapping[str, Any] | RunRecord) -> None:
        """Add one run record (other kinds of lines are ignored)."""
        rec: Mapping[str, Any] = record.to_json_dict() if isinstance(record, RunRecord) else record
        if rec.get("kind", "run") != "run":
            return
        try:
            self._add(rec)
        except (KeyError, TypeError, ValueError, AttributeError):
            self.invalid += 1

    def _add(self, rec: Mapping[str, Any]) -> None:
        # The hot path of `ambient stats` (100,000 lines in well under 2 s): plain dict access,
        # exact type checks. Everything is read and checked first, then accumulated, so a bad
        # record changes nothing.
        workflow = rec["workflow"]
        if type(workflow) is not str:
            raise TypeError("workflow")
        if self.workflow is not None and workflow != self.workflow:
            return
        started_raw = rec["started_at"]
        started = _fromiso(started_raw) if type(started_raw) is str else parse_time(started_raw)
        if self.since is not None and started < self.since:
            return
        completed_raw = rec.get("completed_at")
        if completed_raw is None:
            completed = None
        else:
            completed = _fromiso(completed_raw) if type(completed_raw) is str else parse_time(completed_raw)
        outcome = rec["outcome"]
        escalations = rec.get("escalations", 0)
        errors = rec.get("errors", 0)
        if type(outcome) is not str or type(escalations) is not int or type(errors) is not int:
            raise TypeError("outcome/escalations/errors")
        only = self.agent
        involved = only is None
        steps = []
        for s in rec.get("steps") or ():
            agent = s["agent"]
            result = s["result"]
            duration = s.get("duration_ms", 0)
            error = s.get("error")
            signal_in = s.get("signal_in")
            if type(agent) is not str or type(result) is not str or type(duration) not in _NUMBER_TYPES:
                raise TypeError("step")
            if error is not None and type(error) is not str:
                raise TypeError("step.error")
            usage = s.get("usage")
            steps.append(
                (
                    agent,
                    result,
                    duration,
                    error,
                    signal_in == "ESCALATE" or s.get("escalation") is not None,
                    result == "error" or signal_in == "ERROR",
                    is_failure(s),
                    usage if type(usage) is dict and usage else None,
                )
            )
            if agent == only:
                involved = True
        asked_raw = rec.get("asked")
        asked = None if asked_raw is None else [a["agent"] for a in asked_raw if type(a.get("agent")) is str]
        if not involved and asked is not None and only in asked:
            involved = True  # asked about before it ran (a gate): the escalation is still its
        if not involved:
            return
        latencies = []
        auto = timeouts = 0
        for d in rec.get("decisions") or ():
            if d.get("auto"):
                auto += 1
                continue
            if d.get("channel") == "timeout":  # a deadline that passed: nobody decided, and took no time to
                timeouts += 1
                continue
            lat = d.get("latency_s")
            if lat is not None:
                if type(lat) not in _NUMBER_TYPES:
                    raise TypeError("decision.latency_s")
                latencies.append(float(lat))
        run_error = rec.get("error")
        if started.tzinfo is None:
            started = started.replace(tzinfo=UTC)
        if completed is not None and completed.tzinfo is None:
            completed = completed.replace(tzinfo=UTC)
        when = completed or started

        # -- accumulate (nothing below raises) --
        self.runs += 1
        if self.first is None or started < self.first:
            self.first = started
        if self.last is None or started > self.last:
            self.last = started
        acc = self._wf.get(workflow)
        if acc is None:
            acc = self._wf[workflow] = _WorkflowAcc()
        acc.runs += 1
        if outcome != "running":
            acc.finished += 1
            if outcome == "success":
                acc.successes += 1
        if completed is not None:
            acc.durations.append((completed - started).total_seconds() * 1000.0)
        acc.escalations += escalations
        acc.errors += errors
        acc.auto += auto
        acc.timeouts += timeouts
        if latencies:
            acc.latencies.extend(latencies)

        # ISO week of the UTC start; one isocalendar per distinct UTC day.
        day = started_raw[:10] if type(started_raw) is str and started_raw.endswith(_UTC_SUFFIXES) else None
        week = self._week_of.get(day) if day is not None else None
        if week is None:
            week = iso_week(started.astimezone(UTC).date())
            if day is not None:
                self._week_of[day] = week
        wk = self._weeks.get((workflow, week))
        if wk is None:
            wk = self._weeks[(workflow, week)] = _WeekAcc()
        wk.runs += 1
        wk.escalations += escalations
        if latencies:
            wk.latencies.extend(latencies)

        agents = self._agents
        by_step = asked is None  # older records: an escalation is known only from the step that asked it
        for agent, result, duration, error, escalated, errored, failed, usage in steps:
            if failed:
                acc.failures += 1
            if usage is not None:  # the run's cost: its workflow's and its week's (every agent's steps)
                if acc.usage is None:
                    acc.usage = UsageTotals()
                acc.usage.add(usage)
                if wk.usage is None:
                    wk.usage = UsageTotals()
                wk.usage.add(usage)
            if only is not None and agent != only:
                continue
            ag = agents.get(agent)
            if ag is None:
                ag = agents[agent] = _AgentAcc()
            if usage is not None:
                if ag.usage is None:
                    ag.usage = UsageTotals()
                ag.usage.add(usage)
            ag.steps += 1
            if result in _VERDICTS:
                ag.judged += 1
                if result == "success":
                    ag.successes += 1
            ag.durations.append(duration)
            if escalated and by_step:
                ag.escalations += 1
            if errored:
                ag.errors += 1
            if failed:
                ag.failures += 1
            if error:
                self._signature(error, workflow, agent, when)
        for agent in asked or ():  # each escalation counts for the agent it names (failures and gates included)
            if only is not None and agent != only:
                continue
            ag = agents.get(agent)
            if ag is None:
                ag = agents[agent] = _AgentAcc()
            ag.escalations += 1
        if only is None and type(run_error) is str and run_error:
            self._signature(run_error, workflow, "-", when)

    def _signature(self, message: str, workflow: str, agent: str, at: datetime) -> None:
        # Normalisation only looks at digits as a class, so messages differing only by digits share
        # a cache entry: "timeout after 30s" and "timeout after 60s" are normalised once.
        shape = message.translate(_DIGITS_TO_ZERO)
        sig = self._sig_of.get(shape)
        if sig is None:
            sig = normalise_message(shape)
            if len(self._sig_of) < _SIG_CACHE_MAX:
                self._sig_of[shape] = sig
        acc = self._sigs.get(sig)
        if acc is None:
            acc = self._sigs[sig] = _SigAcc(message[:500], at)
        acc.count += 1
        if at > acc.last:
            acc.last = at
            acc.example = message[:500]
        if at < acc.first:
            acc.first = at
        acc.workflows.add(workflow)
        acc.agents.add(agent)

    def merge(self, other: StatsBuilder) -> StatsBuilder:
        """Fold in a builder that saw other records (a chunk of the file read elsewhere); returns self."""
        self.runs += other.runs
        self.invalid += other.invalid
        for t in (other.first, other.last):
            if t is not None:
                self.first = t if self.first is None or t < self.first else self.first
                self.last = t if self.last is None or t > self.last else self.last
        for name, o in other._wf.items():
            acc = self._wf.setdefault(name, _WorkflowAcc())
            acc.runs += o.runs
            acc.finished += o.finished
            acc.successes += o.successes
            acc.escalations += o.escalations
            acc.errors += o.errors
            acc.failures += o.failures
            acc.auto += o.auto
            acc.timeouts += o.timeouts
            acc.durations.extend(o.durations)
            acc.latencies.extend(o.latencies)
            acc.usage = _merged(acc.usage, o.usage)
        for name, a in other._agents.items():
            ag = self._agents.setdefault(name, _AgentAcc())
            ag.steps += a.steps
            ag.judged += a.judged
            ag.successes += a.successes
            ag.escalations += a.escalations
            ag.errors += a.errors
            ag.failures += a.failures
            ag.durations.extend(a.durations)
            ag.usage = _merged(ag.usage, a.usage)
        for key, w in other._weeks.items():
            wk = self._weeks.setdefault(key, _WeekAcc())
            wk.runs += w.runs
            wk.escalations += w.escalations
            wk.latencies.extend(w.latencies)
            wk.usage = _merged(wk.usage, w.usage)
        for sig, o_sig in other._sigs.items():
            mine = self._sigs.get(sig)
            if mine is None:
                self._sigs[sig] = o_sig
                continue
            mine.count += o_sig.count
            if o_sig.last > mine.last:
                mine.last, mine.example = o_sig.last, o_sig.example
            mine.first = min(mine.first, o_sig.first)
            mine.workflows |= o_sig.workflows
            mine.agents |= o_sig.agents
        return self

    def result(self, *, top_errors: int = 20) -> Stats:
        """The summary of everything added so far."""
        workflows: list[WorkflowStats] = []
        for name in sorted(self._wf):
            acc = self._wf[name]
            acc.durations.sort()
            acc.latencies.sort()
            weeks = _weeks_of({wk: a for (wf, wk), a in self._weeks.items() if wf == name})
            workflows.append(
                WorkflowStats(
                    workflow=name,
                    runs=acc.runs,
                    success_rate=acc.successes / acc.finished if acc.finished else None,
                    duration_p50_ms=percentile(acc.durations, 50),
                    duration_p95_ms=percentile(acc.durations, 95),
                    escalations=acc.escalations,
                    errors=acc.errors,
                    failures=acc.failures,
                    escalation_rate=acc.escalations / acc.runs if acc.runs else None,
                    decisions=len(acc.latencies) + acc.auto,
                    auto_decisions=acc.auto,
                    timeouts=acc.timeouts,
                    decision_p50_s=percentile(acc.latencies, 50),
                    decision_p95_s=percentile(acc.latencies, 95),
                    weeks=weeks,
                    trend=trend_of(weeks),
                    cost=cost_of(acc.usage),
                )
            )
        agents: list[AgentStats] = []
        for name in sorted(self._agents):
            ag = self._agents[name]
            ag.durations.sort()
            agents.append(
                AgentStats(
                    agent=name,
                    steps=ag.steps,
                    success_rate=ag.successes / ag.judged if ag.judged else None,
                    duration_p50_ms=percentile(ag.durations, 50),
                    duration_p95_ms=percentile(ag.durations, 95),
                    escalations=ag.escalations,
                    errors=ag.errors,
                    failures=ag.failures,
                    cost=cost_of(ag.usage),
                )
            )
        merged: dict[str, _WeekAcc] = {}
        for (_, wk), a in self._weeks.items():
            m = merged.get(wk)
            if m is None:
                m = merged[wk] = _WeekAcc()
            m.runs += a.runs
            m.escalations += a.escalations
            m.latencies.extend(a.latencies)
            m.usage = _merged(m.usage, a.usage)
        all_weeks = _weeks_of(merged)
        everything: UsageTotals | None = None
        for acc in self._wf.values():
            everything = _merged(everything, acc.usage)
        sigs = sorted(self._sigs.items(), key=lambda kv: (-kv[1].count, -kv[1].last.timestamp(), kv[0]))
        errors = [
            ErrorSignature(
                signature=sig,
                count=a.count,
                first_seen=a.first,
                last_seen=a.last,
                workflows=sorted(a.workflows),
                agents=sorted(a.agents),
                example=a.example,
            )
            for sig, a in sigs[:top_errors]
        ]
        return Stats(
            runs=self.runs,
            invalid=self.invalid,
            since=self.since,
            first_started=self.first,
            last_started=self.last,
            workflows=workflows,
            agents=agents,
            errors=errors,
            weeks=all_weeks,
            trend=trend_of(all_weeks),
            cost=cost_of(everything),
        )


def _merged(mine: UsageTotals | None, other: UsageTotals | None) -> UsageTotals | None:
    """Two totals added up into a new one (None: neither has any)."""
    if other is None:
        return mine
    out = UsageTotals()
    if mine is not None:
        out.merge(mine)
    out.merge(other)
    return out


def _weeks_of(accs: Mapping[str, _WeekAcc]) -> list[WeekStats]:
    out = []
    for wk in sorted(accs):
        a = accs[wk]
        a.latencies.sort()
        rate = a.escalations / a.runs if a.runs else 0.0
        out.append(WeekStats(wk, a.runs, a.escalations, rate, percentile(a.latencies, 50), cost_of(a.usage)))
    return out


def _week_index(week: str) -> int:
    year, _, num = week.partition("-W")
    return date.fromisocalendar(int(year), int(num), 1).toordinal() // 7


def trend_of(weeks: Sequence[WeekStats]) -> Trend:
    """Least-squares slope of the weekly escalation rate (weeks without runs are absent, not zero).

    Flat when the fitted change over the whole period is under 10 % of the mean rate (or under
    0.01 escalations per run): noise is not a trend.
    """
    if len(weeks) < 2:
        return Trend("unknown", None, weeks[0].rate if weeks else None, weeks[-1].rate if weeks else None)
    xs = [_week_index(w.week) for w in weeks]
    ys = [w.rate for w in weeks]
    n = len(xs)
    mx = sum(xs) / n
    my = sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    change = slope * (xs[-1] - xs[0])
    direction: TrendDirection = "flat"
    if abs(change) >= max(0.01, 0.1 * my):
        direction = "falling" if change < 0 else "rising"
    return Trend(direction, round(slope, 6), ys[0], ys[-1])


def summarise(
    records: Iterable[Mapping[str, Any] | RunRecord],
    *,
    workflow: str | None = None,
    agent: str | None = None,
    since: datetime | None = None,
    top_errors: int = 20,
) -> Stats:
    """Statistics of run records, optionally only one workflow, runs involving one agent, or runs since a date."""
    return StatsBuilder(workflow=workflow, agent=agent, since=since).add_all(records).result(top_errors=top_errors)


def weekly_digest(stats: Stats, *, weeks: int = 4) -> str:
    """A short plain-text summary of the escalation rate by ISO week, for the digest."""
    lines = [f"Escalations per run by week ({stats.runs} runs recorded):"]
    for wf in stats.workflows:
        recent = wf.weeks[-weeks:]
        series = ", ".join(f"{w.week} {w.rate:.2f}" for w in recent) or "no runs"
        ttd = f"; time to decision p50 {wf.decision_p50_s:.0f}s" if wf.decision_p50_s is not None else ""
        lines.append(f"- {wf.workflow}: escalations per run {series} ({wf.trend.direction}){ttd}")
    if stats.errors:
        top = stats.errors[0]
        lines.append(f"Most frequent error ({top.count}x): {top.signature}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Learned rules
# --------------------------------------------------------------------------------------------

RuleState = Literal["shadow", "active", "forgotten"]
DEFAULT_PROMOTE_AFTER = 3
EVIDENCE_MAX = 20  # run ids kept per rule (the newest)


class UnknownRuleError(InputError):
    """No rule has this id (or the prefix matches several)."""


class Situation(BaseModel):
    """What an escalation was about; two escalations with the same situation get the same rule."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workflow: str
    agent: str
    signal: str  # ESCALATE, FAIL, ERROR, BLOCKED_ON...
    signature: str  # normalised error or question (see normalise_message)

    @property
    def key(self) -> str:
        """The identity of the situation."""
        return "\x1f".join((self.workflow, self.agent, self.signal, self.signature))


def situation_for(workflow: str, agent: str, signal: str, text: str | None) -> Situation:
    """The situation of an escalation raised by ``agent`` in ``workflow``; ``text`` is normalised."""
    return Situation(workflow=workflow, agent=agent, signal=signal.upper(), signature=normalise_message(text or ""))


#: The signal a situation names for each kind of escalation: the agent's own, or what ambient saw.
SIGNAL_OF_KIND: dict[str, str] = {
    "fail": "FAIL",
    "error": "ERROR",
    "blocked": "BLOCKED_ON",
    "question": "ESCALATE",
    "gate": "GATE",
    "circuit_break": "CIRCUIT_BREAK",
    "permission": "PERMISSION",
    "budget": "BUDGET",
    "provider": "PROVIDER",
}


def situation_of(workflow: str, agent: str | None, kind: str, *, detail: str | None, step: str | None) -> Situation:
    """The situation of an escalation, the one rule the daemon's learner and replay both follow.

    Who asked, why (its kind) and the agent's own words (``detail``: its question, or its error), never ambient's
    wording around them, which names the item: a rule learned on one item then serves the others. A gate or a
    circuit breaker has no words of an agent: its step stands for them.

    A tool permission (``permission``) is matched on the exact call it asks about (``detail``: its signature,
    ``Bash: pytest -q``), never normalised: ``rm -rf /`` and ``rm -rf build/`` would share a rule once numbers,
    paths and quoted values were placeholders. The signature is bounded (:func:`ambient.engine.budget.bound_signature`).
    """
    if kind == "permission":
        signature = bound_signature(detail) if detail else "(no call)"
        return Situation(workflow=workflow, agent=agent or "-", signal=SIGNAL_OF_KIND[kind], signature=signature)
    text = step if kind in ("gate", "circuit_break") else detail
    return situation_for(workflow, agent or "-", SIGNAL_OF_KIND.get(kind, kind.upper()), text)


def kind_of_step(step: Mapping[str, Any]) -> str:
    """Why a recorded step would reach the person on its own: the agent's signal, else its result (an ESCALATE about
    a tool call: ``permission``)."""
    signal_in = step.get("signal_in")
    if signal_in == "ESCALATE":
        return "permission" if step.get("permission_signature") else "question"
    if signal_in == "BLOCKED_ON":
        return "blocked"
    if signal_in == "ERROR" or step.get("result") == "error":
        return "error"
    return "fail"


def situation_from_step(workflow: str, step: Mapping[str, Any], kind: str | None = None) -> Situation:
    """The situation of a recorded step that escalated as ``kind`` (default: :func:`kind_of_step`); its words are
    the step's ``question`` for a question, its ``permission_signature`` for a tool permission (a question the
    replay names so is one when the step carries a signature), else its ``error``."""
    k = kind or kind_of_step(step)
    if k == "question" and step.get("permission_signature"):
        k = "permission"
    if k == "permission":
        words = step.get("permission_signature")
    else:
        words = step.get("question") if k == "question" else step.get("error")
    return situation_of(
        workflow,
        str(step.get("agent", "")),
        k,
        detail=words if isinstance(words, str) else None,
        step=str(step.get("item", "")),
    )


class Disagreement(BaseModel):
    """The last time the person decided otherwise than the rule predicted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    predicted: str
    decided: str
    at: datetime


class Rule(BaseModel):
    """A learned rule: in this situation, the person chooses ``option``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    situation: Situation
    option: str
    state: RuleState = "shadow"
    agreements: int = Field(default=0, ge=0)
    disagreements: int = Field(default=0, ge=0)
    uses: int = Field(default=0, ge=0)
    evidence: list[str] = Field(default_factory=list)  # run ids, newest last
    opted_in: bool = False  # `ambient rules accept ID`
    created_at: datetime
    updated_at: datetime
    last_disagreement: Disagreement | None = None


class AutoDecide(BaseModel):
    """Where rules may decide alone: everywhere (``global``) or in listed workflows, never in ``exclude``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    global_: bool = Field(default=False, alias="global")
    workflows: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)

    def covers(self, workflow: str) -> bool:
        """Whether the person opted in for this workflow (the exclusion wins)."""
        if workflow in self.exclude:
            return False
        return self.global_ or workflow in self.workflows


class Policy(BaseModel):
    """The person's opt-in and the promotion threshold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    promote_after: int = Field(default=DEFAULT_PROMOTE_AFTER, ge=1)
    auto_decide: AutoDecide = Field(default_factory=AutoDecide)


class RuleBook(BaseModel):
    """The content of ``.ambient/rules.yml``: the policy and the rules."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    promote_after: int = Field(default=DEFAULT_PROMOTE_AFTER, ge=1)
    auto_decide: AutoDecide = Field(default_factory=AutoDecide)
    rules: list[Rule] = Field(default_factory=list)

    @property
    def policy(self) -> Policy:
        """The policy part, for :func:`may_auto_decide`."""
        return Policy(promote_after=self.promote_after, auto_decide=self.auto_decide)

    def with_rules(self, rules: Sequence[Rule]) -> RuleBook:
        """The same book with other rules."""
        return RuleBook.model_validate({**self._head(), "rules": [r.model_dump() for r in rules]})

    def with_policy(self, auto_decide: AutoDecide) -> RuleBook:
        """The same book with another opt-in."""
        head = self._head() | {"auto_decide": auto_decide.model_dump(by_alias=True)}
        return RuleBook.model_validate({**head, "rules": [r.model_dump() for r in self.rules]})

    def _head(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "promote_after": self.promote_after,
            "auto_decide": self.auto_decide.model_dump(by_alias=True),
        }


def _evolve(rule: Rule, **changes: Any) -> Rule:
    # model_copy(update=) does not validate; transitions rebuild the model.
    return Rule.model_validate({**rule.model_dump(), **changes})


def make_rule_id(situation: Situation, taken: Iterable[str] = ()) -> str:
    """A short stable id for the rule of a situation (``r-`` + 10 hex digits), unique among ``taken``."""
    base = "r-" + hashlib.sha256(situation.key.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    used = set(taken)
    candidate, n = base, 1
    while candidate in used:
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def _push(evidence: Sequence[str], run_id: str) -> list[str]:
    out = [e for e in evidence if e != run_id]
    out.append(run_id)
    return out[-EVIDENCE_MAX:]


def _index(rules: Sequence[Rule], situation: Situation) -> int | None:
    key = situation.key
    for i, r in enumerate(rules):
        if r.situation.key == key:
            return i
    return None


def observe(
    rules: Sequence[Rule],
    situation: Situation,
    decision: str,
    run_id: str,
    now: datetime,
    *,
    promote_after: int = DEFAULT_PROMOTE_AFTER,
) -> list[Rule]:
    """Learn from the person's answer to an escalation; returns the new list of rules.

    - no rule for the situation: a new candidate in ``shadow`` predicting ``decision``;
    - the rule predicted ``decision``: one more agreement; ``shadow`` becomes ``active`` at
      ``promote_after`` agreements;
    - it predicted something else: demoted to ``shadow``, agreements reset, the disagreement
      recorded, and the rule now predicts the person's latest choice; a per-rule opt-in is
      withdrawn (the person accepted another decision);
    - a ``forgotten`` rule stays forgotten and learns nothing until it is accepted again.
    """
    out = list(rules)
    i = _index(out, situation)
    if i is None:
        out.append(
            Rule(
                id=make_rule_id(situation, (r.id for r in out)),
                situation=situation,
                option=decision,
                evidence=[run_id],
                created_at=now,
                updated_at=now,
            )
        )
        return out
    rule = out[i]
    if rule.state == "forgotten":
        return out
    if rule.option == decision:
        agreements = rule.agreements + 1
        state = "active" if agreements >= promote_after else rule.state
        evidence = _push(rule.evidence, run_id)
        out[i] = _evolve(rule, agreements=agreements, state=state, evidence=evidence, updated_at=now)
    else:
        out[i] = _evolve(
            rule,
            option=decision,
            state="shadow",
            agreements=0,
            disagreements=rule.disagreements + 1,
            opted_in=False,
            evidence=[run_id],
            updated_at=now,
            last_disagreement=Disagreement(run_id=run_id, predicted=rule.option, decided=decision, at=now),
        )
    return out


def predict(rules: Sequence[Rule], situation: Situation) -> Rule | None:
    """The rule (shadow or active) that predicts this situation, if any; forgotten rules never predict."""
    i = _index(rules, situation)
    if i is None or rules[i].state == "forgotten":
        return None
    return rules[i]


#: Situations a rule learns (and predicts in the question) but never answers alone: spending more money and a
#: refused model key are the person's whatever they answered before (an auto-``raise`` would undo the budget).
NEVER_ALONE = frozenset({"BUDGET", "PROVIDER"})


def may_auto_decide(rule: Rule | None, policy: Policy, *, options: Sequence[str] | None = None) -> bool:
    """Whether ``rule`` may decide without the person: active, at least ``promote_after`` agreements,
    opted in (per rule, per workflow or globally, a workflow exclusion always wins), and its option
    among the escalation's ``options`` when they are given; never a budget or a refused key (NEVER_ALONE)."""
    if rule is None or rule.state != "active" or rule.agreements < policy.promote_after:
        return False
    if rule.situation.signal in NEVER_ALONE:
        return False
    workflow = rule.situation.workflow
    if workflow in policy.auto_decide.exclude:
        return False
    if not (rule.opted_in or policy.auto_decide.covers(workflow)):
        return False
    return options is None or rule.option in options


def record_use(rules: Sequence[Rule], rule_id: str, run_id: str, now: datetime) -> list[Rule]:
    """Count one automatic decision by the rule (its run joins the evidence)."""
    out = list(rules)
    i = _find(out, rule_id)
    out[i] = _evolve(out[i], uses=out[i].uses + 1, evidence=_push(out[i].evidence, run_id), updated_at=now)
    return out


def find_rule(rules: Sequence[Rule], rule_id: str) -> Rule:
    """The rule with this id or unique id prefix; :class:`UnknownRuleError` otherwise."""
    return rules[_find(rules, rule_id)]


def _find(rules: Sequence[Rule], rule_id: str) -> int:
    exact = [i for i, r in enumerate(rules) if r.id == rule_id]
    if exact:
        return exact[0]
    matches = [i for i, r in enumerate(rules) if rule_id and r.id.startswith(rule_id)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        msg = f"rule id {rule_id!r} is ambiguous ({len(matches)} rules start with it); give more of it"
        raise UnknownRuleError(msg)
    raise UnknownRuleError(f"no rule with id {rule_id!r}; `ambient rules` lists them")


def accept(
    rules: Sequence[Rule], rule_id: str, *, now: datetime | None = None, promote_after: int = DEFAULT_PROMOTE_AFTER
) -> list[Rule]:
    """The person opts this rule in. It still decides alone only once active (N agreements);
    a forgotten rule comes back, active if it already had the agreements, else in shadow."""
    out = list(rules)
    i = _find(out, rule_id)
    rule = out[i]
    state = rule.state
    if state == "forgotten":
        state = "active" if rule.agreements >= promote_after else "shadow"
    out[i] = _evolve(rule, opted_in=True, state=state, updated_at=now or rule.updated_at)
    return out


def forget(rules: Sequence[Rule], rule_id: str, *, now: datetime | None = None) -> list[Rule]:
    """The rule stops predicting and learning (kept as a record; :func:`accept` brings it back)."""
    out = list(rules)
    i = _find(out, rule_id)
    out[i] = _evolve(out[i], state="forgotten", opted_in=False, updated_at=now or out[i].updated_at)
    return out


def auto_decision_notice(rule: Rule, *, run_id: str, item: str | None = None) -> str:
    """The information sent when a rule decided alone (an automatic decision is never silent)."""
    s = rule.situation
    where = f"{s.workflow}/{s.agent}" + (f" ({item})" if item else "")
    return (
        f"ambient decided {rule.option!r} for {where} in run {run_id} by learned rule {rule.id} "
        f"({s.signal}: {s.signature}); you chose the same {rule.agreements} times in a row. "
        f"To stop it: ambient rules forget {rule.id}"
    )


def shadow_hint(rule: Rule, policy: Policy) -> str:
    """One line for an escalation message: what the rule would choose and why it does not decide."""
    if may_auto_decide(rule, policy):
        why = "opted in"
    elif rule.state == "active":
        why = f"active, not opted in: ambient rules accept {rule.id}"
    else:
        why = f"in shadow, {rule.agreements}/{policy.promote_after} agreements"
    return f"learned rule {rule.id} would choose {rule.option!r} ({why})"
