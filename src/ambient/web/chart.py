"""The learning page's chart: escalations per run per ISO week as bars, with the fitted trend as a line, laid out
for an SVG drawn server-side. Pure: the weeks and the trend come from :mod:`ambient.learning.stats` (the numbers
``ambient stats`` prints), this module only places them; the template writes the ``<svg>``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date

from ambient.learning.stats import Trend, WeekStats

WIDTH = 600
HEIGHT = 220
PAD_L = 48
PAD_R = 12
PAD_T = 14
PAD_B = 36
MAX_WEEKS = 26  # half a year: older weeks are in `ambient stats --json`


@dataclass(frozen=True)
class WeekBar:
    """One week's bar (absent weeks have none: no runs is not a zero rate)."""

    x: float
    y: float
    w: float
    h: float
    week: str
    title: str


@dataclass(frozen=True)
class AxisMark:
    """A label on an axis at a position (x for weeks, y for rates)."""

    pos: float
    text: str


@dataclass(frozen=True)
class Chart:
    """The laid-out chart: bars, the trend line's ends (None: under two weeks), axis marks, trend in words."""

    width: int
    height: int
    bars: list[WeekBar]
    trend_line: tuple[float, float, float, float] | None
    x_marks: list[AxisMark]
    y_marks: list[AxisMark]
    base_y: float
    plot_x: float
    plot_r: float
    trend_css: str
    trend_text: str


def week_index(week: str) -> int:
    """Weeks since an epoch for an ISO week ``2026-W11`` (consecutive across years)."""
    year, _, num = week.partition("-W")
    return date.fromisocalendar(int(year), int(num), 1).toordinal() // 7


def week_label(index: int) -> str:
    """The ISO week of :func:`week_index`'s number."""
    year, num, _ = date.fromordinal(index * 7 + 1).isocalendar()
    return f"{year}-W{num:02d}"


def trend_words(trend: Trend) -> str:
    """``falling (-0.120/week)``, ``flat``, ``n/a (one week)``: as ``ambient stats`` says it."""
    if trend.direction == "unknown" or trend.slope_per_week is None:
        return "n/a (one week)"
    return f"{trend.direction} ({trend.slope_per_week:+.3f}/week)"


def nice_max(value: float) -> float:
    """The axis top: ``value`` rounded up to 1, 2, 2.5 or 5 × 10^k (at least 0.1)."""
    if value <= 0.1:
        return 0.1
    exp = 10.0 ** math.floor(math.log10(value))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if value <= m * exp + 1e-12:
            return m * exp
    return 10 * exp  # pragma: no cover


def layout(weeks: Sequence[WeekStats], trend: Trend) -> Chart:
    """Place the newest :data:`MAX_WEEKS` weeks (a slot per calendar week, weeks without runs left empty)."""
    shown = list(weeks)
    if shown:
        last = week_index(shown[-1].week)
        shown = [w for w in shown if week_index(w.week) > last - MAX_WEEKS]
    plot_x, plot_r = float(PAD_L), float(WIDTH - PAD_R)
    base_y = float(HEIGHT - PAD_B)
    plot_h = base_y - PAD_T
    if not shown:
        return Chart(WIDTH, HEIGHT, [], None, [], [], base_y, plot_x, plot_r, "trend-unknown", trend_words(trend))
    first = week_index(shown[0].week)
    slots = week_index(shown[-1].week) - first + 1
    slot_w = (plot_r - plot_x) / slots
    top = nice_max(max(w.rate for w in shown) * 1.1)

    def y_of(rate: float) -> float:
        return base_y - max(0.0, min(rate, top)) / top * plot_h

    bars = []
    for w in shown:
        i = week_index(w.week) - first
        x = plot_x + i * slot_w + slot_w * 0.15
        y = y_of(w.rate)
        title = f"{w.week}: {w.rate:.2f} escalations per run ({w.escalations} in {w.runs} run(s)) reached you"
        title += f"; {w.auto_decisions} decided alone by learned rules" if w.auto_decisions else ""
        bars.append(WeekBar(round(x, 2), round(y, 2), round(slot_w * 0.7, 2), round(base_y - y, 2), w.week, title))
    line = None
    if trend.slope_per_week is not None and len(shown) >= 2:
        # The least-squares line passes through the mean point; the slope is stats' own.
        xs = [week_index(w.week) - first for w in shown]
        mx = sum(xs) / len(xs)
        my = sum(w.rate for w in shown) / len(shown)
        x0, x1 = 0, slots - 1
        r0 = my + trend.slope_per_week * (x0 - mx)
        r1 = my + trend.slope_per_week * (x1 - mx)
        cx = plot_x + slot_w / 2
        line = (round(cx, 2), round(y_of(r0), 2), round(cx + x1 * slot_w, 2), round(y_of(r1), 2))
    every = max(1, math.ceil(slots / 8))
    x_marks = [
        AxisMark(round(plot_x + i * slot_w + slot_w / 2, 2), week_label(first + i).split("-")[1])
        for i in range(0, slots, every)
    ]
    y_marks = [AxisMark(round(y_of(v), 2), f"{v:g}") for v in (0.0, top / 2, top)]
    return Chart(
        WIDTH,
        HEIGHT,
        bars,
        line,
        x_marks,
        y_marks,
        base_y,
        plot_x,
        plot_r,
        f"trend-{trend.direction}",
        trend_words(trend),
    )
