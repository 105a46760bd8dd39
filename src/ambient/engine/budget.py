"""Cost as a figure, budgets and run holds: the pure rules. No I/O, no clock: ``now`` is given.

**Usage.** An AI agent's attempt reports its model, tokens, turns and ``cost_usd``
(:class:`ambient.runners.result.Usage` ``.to_record()``); :class:`UsageTotals` adds them up per item, per run, per
workflow, agent or week. An attempt whose ``cost_usd`` is unknown (a model without a price) counts its tokens and is
counted in ``unknown_cost``: a total with unknown steps is a lower bound, shown as such (``$1.20+?``), never as if
those steps were free.

**Budgets** (``budget: {per_run_usd, daily_usd}`` in ``profil/ambient.yml``). Before a run starts an agent, its spend
is compared with ``per_run_usd`` (plus what the person allowed more) and the spend of the day across all runs with
``daily_usd`` (plus what the person allowed this run more today). The day is the **UTC** day: the same day the run
records' timestamps and ``ambient stats`` count in, the day the providers' usage pages bill by, and one that no
time-zone or daylight-saving change of the host moves; a daily hold answered ``wait`` lifts at 00:00 UTC.

**Holds.** A run reaching a budget, or whose model provider refused the key or cannot be reached, *holds*: no new
agent of it starts (those already running finish), and the person gets one escalation for the run and that hold:

=========  =====================================================  ==========================================
hold       question                                               answers
=========  =====================================================  ==========================================
per_run    ``deploy-batch reached its budget: $3.00 spent         raise: up to what was spent plus one
           against per_run_usd $0.05; spent by writer $3.00``     budget, or the amount given as the note;
                                                                  raise-x2: twice what was spent; wait:
                                                                  held until the person raises or aborts
                                                                  (asked again, raise | abort); abort
daily      ``deploy-batch reached the daily budget: $50.20        raise: this run's cap for the day becomes
           spent today by all runs (UTC day 2026-03-18) against   what was spent plus ``daily_usd`` (or the
           daily_usd $50.00; this run's agents spent …``          note's amount); wait: held until the UTC
                                                                  day changes, then it goes on; abort
provider   ``the model provider cannot be used, so this   retry: the run goes on; abort
           run waits: <error>`` (a refused key, an API
           that cannot be reached)
=========  =====================================================  ==========================================

A ``raise`` always moves the run: one step may overshoot a budget by far (a long prompt, a runaway session), and
"another budget's worth" added to a cap already passed would leave the run held and ask the same question again.

The run journal keeps holds as events (``hold``, ``escalated`` with ``hold``, ``decided``, ``unhold``), so a held run
stays held across a restart of the daemon (:mod:`ambient.engine.runstate` folds them with :func:`answer_hold`).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

# ---------------------------------------------------------------- usage

#: The integer figures of a usage record, summed as they are.
TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "turns")
_MODELS_MAX = 20  # distinct models kept per total (a run records the few it used)


def amount_of(value: Any) -> float | None:
    """A finite number that is not negative (a bool is no number); None otherwise: a journal is a file anyone edits."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) and f >= 0 else None


@dataclass
class UsageTotals:
    """What some attempts consumed, added up. ``cost_usd`` counts only the attempts whose cost is known;
    ``unknown_cost`` says how many others there were (their tokens are counted)."""

    cost_usd: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    turns: int = 0
    attempts: int = 0  # attempts that reported usage
    unknown_cost: int = 0  # of them, without a cost_usd
    models: list[str] = field(default_factory=list)

    def add(self, usage: Mapping[str, Any] | None) -> float | None:
        """Add one attempt's usage record (``Usage.to_record()``); returns its cost (None: unknown or no usage)."""
        if not isinstance(usage, Mapping) or not usage:
            return None
        self.attempts += 1
        for name in TOKEN_FIELDS:
            n = amount_of(usage.get(name))
            if n is not None:
                setattr(self, name, getattr(self, name) + int(n))
        model = usage.get("model")
        if isinstance(model, str) and model and model not in self.models and len(self.models) < _MODELS_MAX:
            self.models.append(model[:200])
        cost = amount_of(usage.get("cost_usd"))
        if cost is None:
            self.unknown_cost += 1
            return None
        self.cost_usd += cost
        return cost

    def merge(self, other: UsageTotals) -> None:
        """Add another total to this one."""
        self.cost_usd += other.cost_usd
        for name in TOKEN_FIELDS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.attempts += other.attempts
        self.unknown_cost += other.unknown_cost
        for m in other.models:
            if m not in self.models and len(self.models) < _MODELS_MAX:
                self.models.append(m)

    def to_record(self) -> dict[str, Any]:
        """The run record's figures (``cost_usd`` rounded to a millionth of a dollar; ``cost_unknown`` when some
        attempts had no price); empty when no attempt reported usage."""
        if not self.attempts:
            return {}
        out: dict[str, Any] = {"cost_usd": round(self.cost_usd, 6)}
        for name in TOKEN_FIELDS:
            out[name] = getattr(self, name)
        if self.models:
            out["models"] = list(self.models)
        if self.unknown_cost:
            out["cost_unknown"] = self.unknown_cost
        return out


def fmt_usd(amount: float) -> str:
    """``$2.10``; amounts under a dollar keep four figures (``$0.0103``: a small budget's ``$0.01 of $0.01`` would
    hide that it was passed), and smaller ones two significant figures (``$0.000021``, never ``$0.00``)."""
    if amount and abs(amount) < 0.001:
        return "$" + f"{amount:.{_decimals(amount)}f}".rstrip("0")
    if amount and abs(amount) < 1:
        text = f"{amount:.4f}"
        while text.endswith("0") and len(text.split(".")[1]) > 2:
            text = text[:-1]
        return f"${text}"
    return f"${amount:,.2f}"


def _decimals(amount: float) -> int:
    """The decimals that show two significant figures of a small amount (``0.000021``: 6)."""
    return min(12, max(4, 1 - math.floor(math.log10(abs(amount)))))


# ---------------------------------------------------------------- the day


def day_of(at: datetime) -> str:
    """The UTC day of a time, ``2026-03-18`` (a naive time is taken as UTC)."""
    aware = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    return aware.astimezone(UTC).date().isoformat()


def next_day(at: datetime) -> datetime:
    """The start of the UTC day after ``at``'s."""
    aware = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    start = aware.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return start + timedelta(days=1)


# ---------------------------------------------------------------- budgets

HoldKind = Literal["per_run", "daily", "provider"]
BUDGET_HOLDS: tuple[HoldKind, ...] = ("per_run", "daily")
#: The hold a runner's result asks for (``AttemptResult.hold``) → the run's hold.
HOLD_OF_RESULT: dict[str, HoldKind] = {"provider_refused": "provider", "provider_unreachable": "provider"}
#: A result whose model call the gateway refused for a budget: the attempt does not count, and the run holds on the
#: budget it reached (the rules above, asked before the next start).
OVER_BUDGET = "over_budget"
#: The escalation kind of each hold.
ESCALATION_KIND: dict[str, str] = {"per_run": "budget", "daily": "budget", "provider": "provider"}


@dataclass(frozen=True)
class Limits:
    """The budgets of the settings (None: no such budget)."""

    per_run_usd: float | None = None
    daily_usd: float | None = None


@dataclass(frozen=True)
class Breach:
    """A budget a run has reached: which, what was spent against which limit, and the budget's own amount."""

    which: HoldKind
    spent: float
    limit: float  # the budget plus what the person allowed more
    budget: float  # per_run_usd or daily_usd as set: what ``raise`` adds
    day: str | None = None  # daily: the UTC day

    def record(self) -> dict[str, Any]:
        """The fields of the ``hold`` event."""
        out: dict[str, Any] = {
            "hold": self.which,
            "spent": round(self.spent, 6),
            "limit": round(self.limit, 6),
            "budget": self.budget,
        }
        if self.day is not None:
            out["day"] = self.day
        return out


def breach(
    limits: Limits,
    *,
    run_spent: float,
    run_raised: float = 0.0,
    day_spent: float,
    day_raised: float = 0.0,
    day: str,
) -> Breach | None:
    """The budget a run has reached before it starts another agent, or None; the run's own budget first.

    ``run_raised``: what the person allowed the run more (``raise`` answers); ``day_spent``: today's spend of every
    run; ``day_raised``: what the person allowed this run more today. Reached means spent ≥ limit: a run at exactly
    its budget starts nothing more.
    """
    if limits.per_run_usd is not None:
        limit = limits.per_run_usd + run_raised
        if run_spent >= limit:
            return Breach("per_run", run_spent, limit, limits.per_run_usd)
    if limits.daily_usd is not None:
        limit = limits.daily_usd + day_raised
        if day_spent >= limit:
            return Breach("daily", day_spent, limit, limits.daily_usd, day)
    return None


def spend_by_agent(steps: Any) -> dict[str, float]:
    """What each agent of a run spent (its recorded steps whose cost is known), the largest first: the budget question
    names them, so the person sees which agent spent it."""
    totals: dict[str, float] = {}
    for step in steps or ():
        if not isinstance(step, Mapping) or not isinstance(step.get("usage"), Mapping):
            continue
        cost = amount_of(step["usage"].get("cost_usd"))
        if cost is None:
            continue
        agent = str(step.get("agent") or "?")[:100]
        totals[agent] = totals.get(agent, 0.0) + cost
    return {a: round(c, 6) for a, c in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))}


_AGENTS_SHOWN = 5


def _agents_text(agents: Any) -> str:
    """``summary $3.00, reviewer $0.01`` (the five that spent most, then how many more)."""
    if not isinstance(agents, Mapping) or not agents:
        return "no step with a known cost"
    named = [(str(a), amount_of(c) or 0.0) for a, c in agents.items()][: _AGENTS_SHOWN + 1]
    shown = ", ".join(f"{a} {fmt_usd(c)}" for a, c in named[:_AGENTS_SHOWN])
    more = len(agents) - _AGENTS_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def budget_question(workflow: str, hold: Mapping[str, Any]) -> str:
    """What the person is asked when a run reaches a budget (``hold``: the ``hold`` event's fields): what was spent,
    by which agents, against which budget (and what was allowed more)."""
    spent, limit = amount_of(hold.get("spent")) or 0.0, amount_of(hold.get("limit")) or 0.0
    budget = amount_of(hold.get("budget")) or 0.0
    held = "no new agent of this run starts until you answer"
    raised = f", {fmt_usd(limit)} with what you allowed more" if limit > budget + 1e-9 else ""
    # a hold written before holds named their agents has none: nothing is said rather than something wrong
    agents = hold.get("agents")
    if hold.get("hold") == "daily":
        day = hold.get("day")
        by = f"; this run's agents spent {_agents_text(agents)}" if agents is not None else ""
        return (
            f"{workflow} reached the daily budget: {fmt_usd(spent)} spent today by all runs (UTC day {day}) against "
            f"daily_usd {fmt_usd(budget)}{raised}{by}; {held}"
        )
    by = f"; spent by {_agents_text(agents)}" if agents is not None else ""
    return (
        f"{workflow} reached its budget: {fmt_usd(spent)} spent against per_run_usd {fmt_usd(budget)}{raised}{by}; "
        f"{held}"
    )


def provider_question(hold: Mapping[str, Any]) -> str:
    """What the person is asked when the model provider refused the key or cannot be reached (the error says which)."""
    error = str(hold.get("error") or "no detail").strip()
    return f"the model provider cannot be used, so this run waits: {error}"[:2000]


#: The words a learned rule matches for a hold (never the amounts, which change every time).
HOLD_DETAIL: dict[str, str] = {
    "per_run": "per-run budget reached",
    "daily": "daily budget reached",
    "provider": "the model provider cannot be used",
}


#: The option that raises a per-run cap to twice what the run spent (``raise`` itself: spent plus one budget).
RAISE_DOUBLE = "raise-x2"
#: A note that is an amount: ``5``, ``$5``, ``5.50 USD``, ``raise to $5`` (the cap the person gives with ``raise``).
_AMOUNT_RE = re.compile(r"^\s*(?:raise\s+(?:to\s+)?)?\$?\s*(\d+(?:\.\d+)?)\s*(?:usd|\$)?\s*$", re.IGNORECASE)


def amount_in(note: Any) -> float | None:
    """The amount in USD a note given with ``raise`` names (``5``, ``$5``, ``5.50 USD``, ``raise to $5``), or None
    when the note is no amount (a note is free text: only one that is wholly an amount counts)."""
    if not isinstance(note, str):
        return None
    m = _AMOUNT_RE.match(note)
    if m is None:
        return None
    value = float(m.group(1))
    return value if math.isfinite(value) and value > 0 else None


def raised_cap(hold: Mapping[str, Any], option: str, *, spent: float | None = None, note: Any = None) -> float:
    """The new cap a ``raise`` gives a budget hold: above what was spent, always, so the run goes on.

    ``spent``: what the run has spent now (per-run; default the hold's figure); the note's amount when it is above
    that; ``raise-x2``: twice what was spent; else what was spent plus one budget."""
    spent_now = max(amount_of(hold.get("spent")) or 0.0, amount_of(spent) or 0.0)
    budget = amount_of(hold.get("budget")) or 0.0
    given = amount_in(note)
    if given is not None and given > spent_now:
        return given
    if option == RAISE_DOUBLE and 2 * spent_now > spent_now + budget:
        return 2 * spent_now
    if budget > 0:
        return spent_now + budget
    # a budget of 0 (nothing may be spent): one cent past what was spent, so the answer still moves the run
    return spent_now + 0.01


def hold_options(hold: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(key, label, action) offered for a hold. A per-run hold answered ``wait`` is asked again without ``wait``.
    ``raise`` allows what was spent plus one budget (an amount given as the answer's note allows up to it);
    a per-run hold whose spend is over one budget also offers ``raise-x2``: up to twice what was spent."""
    kind = hold.get("hold")
    if kind == "provider":
        return [
            ("retry", "Fixed (the key, the address, the network): run the item again and go on", "retry"),
            ("abort", "Abort the run", "abort"),
        ]
    spent = amount_of(hold.get("spent")) or 0.0
    budget = amount_of(hold.get("budget")) or 0.0
    cap = fmt_usd(raised_cap(hold, "raise"))
    plus = f"what it spent, {fmt_usd(spent)}, plus {fmt_usd(budget)}; or give an amount in USD as the note"
    if kind == "per_run":
        raise_label = f"Allow this run up to {cap} ({plus})"
    else:
        raise_label = f"Allow this run up to {cap} spent by all runs today ({plus})"
    wait_label = "Keep it held until you raise or abort" if kind == "per_run" else "Keep it held until tomorrow (UTC)"
    options = [("raise", raise_label, "raise")]
    if kind == "per_run" and 2 * spent > spent + budget:
        options.append((RAISE_DOUBLE, f"Allow this run up to {fmt_usd(2 * spent)} (twice what it spent)", "raise"))
    if not hold.get("waited"):
        options.append(("wait", wait_label, "wait"))
    options.append(("abort", "Abort the run", "abort"))
    return options


HoldStep = Literal["ask", "held", "lift"]


def hold_step(hold: Mapping[str, Any], today: str) -> HoldStep:
    """What a hold asks of the executor now: ``ask`` the person (no pending escalation: just held, after a crash
    between the hold and its question, or a per-run hold answered ``wait``), stay ``held``, or ``lift`` (a daily hold
    answered ``wait`` once the UTC day changed)."""
    if hold.get("escalation"):
        return "held"
    if hold.get("waited") and hold.get("hold") == "daily":
        return "held" if hold.get("day") == today else "lift"
    return "ask"


@dataclass(frozen=True)
class HoldAnswer:
    """What an answer to a hold's escalation does to the run (an ``abort`` aborts it, as every abort does)."""

    release: bool  # the hold is gone: the run goes on
    waited: bool = False  # the hold stays, answered wait
    raise_run_usd: float = 0.0  # the run may spend this much more
    raise_day: tuple[str, float] | None = None  # the run's cap for that UTC day is lifted by this much


def answer_hold(
    hold: Mapping[str, Any], action: str, *, option: str = "", note: Any = None, spent: float | None = None
) -> HoldAnswer:
    """What the person's answer (its action, the option chosen and its note) does to a hold. A ``raise`` moves the
    cap above what was spent (:func:`raised_cap`; ``spent``: the run's spend when answered): it always lets the run
    go on, however far one step overshot."""
    kind = hold.get("hold")
    limit = amount_of(hold.get("limit")) or 0.0
    if action == "raise" and kind == "per_run":
        return HoldAnswer(
            release=True, raise_run_usd=max(0.0, raised_cap(hold, option, spent=spent, note=note) - limit)
        )
    if action == "raise" and kind == "daily":
        more = max(0.0, raised_cap(hold, option, note=note) - limit)
        return HoldAnswer(release=True, raise_day=(str(hold.get("day")), more))
    if action == "wait" and kind in BUDGET_HOLDS:
        return HoldAnswer(release=False, waited=True)
    if action in ("retry", "continue", "approve"):
        return HoldAnswer(release=True)
    # abort (handled by the abort cascade), or an action that means nothing here: the run stays held, asked again.
    return HoldAnswer(release=False)


# ---------------------------------------------------------------- permissions

#: A permission's signature is a learned rule's situation as it is: bounded, never cut into sharing a rule.
PERMISSION_SIGNATURE_MAX = 400


def permission_signature(permission: Mapping[str, Any] | None) -> str | None:
    """The exact tool call a permission escalation is about (``Bash: rm -rf build/``), bounded: a longer one keeps its
    head and the sha256 of the whole call, so two commands never share a learned rule because they start alike."""
    if not isinstance(permission, Mapping):
        return None
    sig = permission.get("signature")
    if not isinstance(sig, str) or not sig:
        tool = permission.get("tool")
        if not isinstance(tool, str) or not tool:
            return None
        sig = tool
    digest = permission.get("sha256")
    return bound_signature(sig, digest if isinstance(digest, str) and _HEX64.match(digest) else None)


_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def bound_signature(text: str, digest: str | None = None) -> str:
    """``text`` if it is at most :data:`PERMISSION_SIGNATURE_MAX` characters, else its head and the whole sha256 of
    the call (``digest``, by default that of ``text``): a digest cut short could be matched by a made-up call."""
    if len(text) <= PERMISSION_SIGNATURE_MAX:
        return text
    digest = digest or hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{text[: PERMISSION_SIGNATURE_MAX - 70]}… #{digest}"
