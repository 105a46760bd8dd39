"""The learning chart's layout: a bar per ISO week with runs, the fitted trend line, axis marks."""

from __future__ import annotations

from ambient.learning.stats import Trend, WeekStats, trend_of
from ambient.web.chart import MAX_WEEKS, layout, nice_max, trend_words, week_index, week_label


def _week(week: str, rate: float, runs: int = 4) -> WeekStats:
    return WeekStats(week, runs, round(rate * runs), rate, None)


def test_bars_by_calendar_week_with_gaps() -> None:
    """A week without runs keeps its slot, empty (no runs is not a zero rate)."""
    weeks = [_week("2026-W10", 1.0), _week("2026-W12", 0.5)]
    c = layout(weeks, trend_of(weeks))
    assert [b.week for b in c.bars] == ["2026-W10", "2026-W12"]
    slot = (c.plot_r - c.plot_x) / 3
    assert abs((c.bars[1].x - c.bars[0].x) - 2 * slot) < 0.01
    assert c.bars[0].h == 2 * c.bars[1].h  # heights are proportional to the rate
    assert "0.50 escalations per run (2 in 4 run(s))" in c.bars[1].title


def test_trend_line_falls_with_a_falling_rate() -> None:
    """The trend is stats' own (falling here), drawn downwards through the mean."""
    weeks = [_week("2026-W01", 2.0), _week("2026-W02", 1.5), _week("2026-W03", 1.0), _week("2026-W04", 0.5)]
    trend = trend_of(weeks)
    c = layout(weeks, trend)
    assert trend.direction == "falling" and c.trend_css == "trend-falling"
    assert c.trend_line is not None
    x0, y0, x1, y1 = c.trend_line
    assert x0 < x1 and y0 < y1  # SVG y grows downwards: the line goes down
    assert abs(y0 - c.bars[0].y) < 0.5 and abs(y1 - c.bars[-1].y) < 0.5  # exact fit
    assert c.trend_text == "falling (-0.500/week)"


def test_one_week_has_no_trend_line() -> None:
    """With one week there is no trend: said in words, no line."""
    weeks = [_week("2026-W05", 1.0)]
    c = layout(weeks, trend_of(weeks))
    assert c.trend_line is None and c.trend_text == "n/a (one week)"
    assert layout([], Trend("unknown")).bars == []


def test_only_the_newest_weeks_are_drawn() -> None:
    """A long history shows its last half year."""
    weeks = [_week(week_label(week_index("2025-W01") + i), 1.0) for i in range(60)]
    c = layout(weeks, trend_of(weeks))
    assert len(c.bars) == MAX_WEEKS and c.bars[-1].week == weeks[-1].week
    assert len(c.x_marks) <= 9


def test_weeks_cross_the_year() -> None:
    """ISO weeks count on across a year's end (2026 has 53 weeks)."""
    assert week_index("2027-W01") - week_index("2026-W53") == 1
    assert week_label(week_index("2026-W53")) == "2026-W53"


def test_axis_top_is_round() -> None:
    """The axis top rounds up to 1, 2, 2.5 or 5 × 10^k."""
    assert nice_max(0.03) == 0.1 and nice_max(1.3) == 2 and nice_max(2.2) == 2.5 and nice_max(7) == 10
    assert trend_words(Trend("flat", 0.0)) == "flat (+0.000/week)"
