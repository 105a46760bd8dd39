"""Statistics over run records (ADR-027): outcomes, durations, escalations and their weekly trend, time to
decision, cost, recurring error signatures. No I/O.

Statistics read plain JSON dicts from ``runs.jsonl`` (the fast path) or :class:`RunRecord` models. Learned rules are
:mod:`ambient.learning.rules`; replay (recorded runs through the workflow as it is now) is
:mod:`ambient.learning.replay`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal, NamedTuple

from ambient.core.errors import InputError
from ambient.engine.budget import UsageTotals
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
    """Escalations of one ISO week (``2026-W11``): the headline measure of the loop, what reached the person."""

    week: str
    runs: int
    escalations: int  # that reached the person; a learned rule's automatic decisions are beside (auto_decisions)
    rate: float  # escalations per run
    decision_p50_s: float | None  # median time the person took to decide
    cost: CostStats | None = None  # what the week's AI agents consumed (runs started that week)
    auto_decisions: int = 0  # escalations a learned rule decided alone that week


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
    escalations: int  # that reached the person (a learned rule's automatic decisions: auto_decisions)
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
class ModelStats:
    """The model calls of one agent on one model, as the model gateway metered them (``calls_by`` of the run
    records): how many, their tokens and cost (``cost_unknown``: calls without a price, not in ``cost_usd``), and
    the calls it refused because a budget was reached."""

    agent: str
    model: str
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    cost_unknown: int = 0
    refused: int = 0


_MODEL_COUNTS = ("calls", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "cost_unknown")


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
    models: list[ModelStats] = field(default_factory=list)  # per agent and model: the gateway's metered calls

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
    __slots__ = ("auto", "escalations", "latencies", "runs", "usage")

    def __init__(self) -> None:
        self.usage: UsageTotals | None = None
        self.runs = 0
        self.escalations = 0
        self.auto = 0
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


class _Run(NamedTuple):
    """One run record as :meth:`StatsBuilder._parse` read and checked it: what :meth:`StatsBuilder._accumulate`
    counts."""

    workflow: str
    started_raw: Any
    started: datetime
    completed: datetime | None
    outcome: str
    escalations: int
    errors: int
    steps: list[tuple[Any, ...]]  # agent, result, duration, error, escalated, errored, failed, usage
    calls_by: list[Mapping[str, Any]]
    asked: list[str] | None
    auto: int
    timeouts: int
    latencies: list[float]
    run_error: Any


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
        self._models: dict[tuple[str, str], dict[str, Any]] = {}
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
        # The hot path of `ambient stats` (100,000 lines in well under 2 s). Read and checked whole first
        # (:meth:`_parse`), then accumulated (:meth:`_accumulate`): a bad record changes nothing.
        run = self._parse(rec)
        if run is not None:
            self._accumulate(run)

    def _parse(self, rec: Mapping[str, Any]) -> _Run | None:
        """A record read and checked (raises KeyError, TypeError, ValueError on a bad one); None when the filters
        (workflow, since, agent) leave it out.

        A hand parser: plain dict access and exact type checks over the dicts ``json.loads`` gives. Timed against
        the typed model on bench/stats.py's 100,000 records (``--parsers``, 2026-12-07, load 4-5 on 2 cores):
        ``json.loads`` and this, 0.91 s; ``RunRecord.model_validate_json`` alone 0.89 s, but with what this takes
        read off the model's attributes 1.30 s (+42 %), and through ``to_json_dict`` 2.2 s. The model would also
        change which records count as invalid (it coerces ``"5"`` to 5 and fills defaults); so the hand parser."""
        workflow = rec["workflow"]
        if type(workflow) is not str:
            raise TypeError("workflow")
        if self.workflow is not None and workflow != self.workflow:
            return None
        started_raw = rec["started_at"]
        started = _fromiso(started_raw) if type(started_raw) is str else parse_time(started_raw)
        if self.since is not None and started < self.since:
            return None
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
        calls_by = []
        for row in rec.get("calls_by") or ():  # read and checked before anything is counted
            if type(row.get("agent")) is not str or type(row.get("model")) is not str:
                raise TypeError("calls_by")
            if any(type(row.get(n, 0)) is not int for n in (*_MODEL_COUNTS, "refused")):
                raise TypeError("calls_by counts")
            if type(row.get("cost_usd", 0.0)) not in _NUMBER_TYPES:
                raise TypeError("calls_by cost")
            calls_by.append(row)
        asked_raw = rec.get("asked")
        # What reached the person, per agent: an escalation a learned rule decided alone is counted beside, not here.
        ruled = {d.get("escalation") for d in rec.get("decisions") or () if isinstance(d, Mapping) and d.get("auto")}
        asked = (
            None
            if asked_raw is None
            else [a["agent"] for a in asked_raw if type(a.get("agent")) is str and a.get("escalation") not in ruled]
        )
        if not involved and asked is not None and only in asked:
            involved = True  # asked about before it ran (a gate): the escalation is still its
        if not involved and any(row["agent"] == only for row in calls_by):
            involved = True  # its model calls, of an attempt that left no step (a crash, a refused call)
        if not involved:
            return None
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
        if "auto_decisions" not in rec:  # an older record counted a learned rule's decisions as escalations
            escalations = max(0, escalations - auto)
        run_error = rec.get("error")
        if started.tzinfo is None:
            started = started.replace(tzinfo=UTC)
        if completed is not None and completed.tzinfo is None:
            completed = completed.replace(tzinfo=UTC)
        return _Run(
            workflow, started_raw, started, completed, outcome, escalations, errors, steps, calls_by, asked, auto,
            timeouts, latencies, run_error,
        )  # fmt: skip

    def _accumulate(self, run: _Run) -> None:
        """Count a record :meth:`_parse` read (nothing here raises)."""
        workflow, started_raw, started, completed, outcome, escalations, errors = run[:7]
        steps, calls_by, asked, auto, timeouts, latencies, run_error = run[7:]
        only = self.agent
        when = completed or started
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
        wk.auto += auto
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
        for row in calls_by:
            key = (row["agent"], row["model"])
            if only is not None and key[0] != only:
                continue
            mine = self._models.get(key)
            if mine is None:
                mine = self._models[key] = dict.fromkeys((*_MODEL_COUNTS, "refused"), 0) | {"cost_usd": 0.0}
            for name in (*_MODEL_COUNTS, "refused", "cost_usd"):
                mine[name] += row.get(name, 0)

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
            wk.auto += w.auto
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
            m.auto += a.auto
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
            models=[
                ModelStats(agent, model, **{**figures, "cost_usd": round(figures["cost_usd"], 6)})
                for (agent, model), figures in sorted(self._models.items())
            ],
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
        p50 = percentile(a.latencies, 50)
        out.append(WeekStats(wk, a.runs, a.escalations, rate, p50, cost_of(a.usage), auto_decisions=a.auto))
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
