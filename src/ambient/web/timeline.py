"""A run's items on a time axis (start → end per item), laid out for an SVG drawn server-side: a person sees at a
glance how many agents ran at once and which items straggled. Pure: spans in, geometry out; the template writes the
``<svg>`` (autoescaped), so no agent text is ever put into markup by hand.

A big run's rows are thinner than a pointer can aim at: past :data:`TITLED_MAX` rows only the notable bars (not
done, or stragglers) keep a ``<rect>`` with a hover title, the others are drawn as one ``<path>`` per state (numbers
only), which keeps a 1,000-item page cheap to render and to draw. Every item's hover text stays in the item grid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

#: The drawing's user units: the SVG scales to its box, this is only its aspect.
WIDTH = 1000
LABEL_W = 170  # the left column of item names (drawn only when rows are tall enough to read)
AXIS_H = 26
MAX_H = 640  # a thousand items fit in this height: rows get thinner, never the page longer
STRAGGLER_FACTOR = 2.0  # an item that took more than twice the median of its finished siblings
TITLED_MAX = 100  # bars drawn as their own <rect> with a hover title; the rest of a bigger run share paths


@dataclass(frozen=True)
class Span:
    """One item's time on the run: ``start``/``end`` in seconds since the epoch (``end`` None: still running)."""

    label: str
    start: float
    end: float | None
    state: str  # the grid's state class (done, failed, running...)
    title: str  # the hover text: attempt, duration, error


@dataclass(frozen=True)
class Bar:
    """One row's bar in user units."""

    x: float
    y: float
    w: float
    h: float
    css: str
    title: str
    label: str
    label_y: float


@dataclass(frozen=True)
class Strip:
    """The bars of one state class drawn as one SVG path (``d``: a rectangle per bar, numbers only)."""

    css: str
    d: str
    count: int


@dataclass(frozen=True)
class Tick:
    """A vertical guide of the time axis and its text (``30s``, ``2m``)."""

    x: float
    text: str


@dataclass(frozen=True)
class Timeline:
    """The laid-out drawing: its size, bars, ticks, and the figures said in words beside it."""

    width: int
    height: int
    plot_x: float
    plot_w: float
    axis_y: float
    bars: list[Bar]  # drawn one by one with their hover title
    strips: list[Strip]  # the other bars, one path per state class
    ticks: list[Tick]
    labels: bool
    font: float
    peak: int  # most items running at once
    stragglers: int
    span_s: float
    hidden: int  # items never started (no bar)

    @property
    def drawn(self) -> int:
        """Bars drawn in all (rects and paths): the items that started."""
        return len(self.bars) + sum(s.count for s in self.strips)


def fmt_seconds(s: float) -> str:
    """``0s``, ``45s``, ``2m``, ``2m30s``, ``1h05m``: a tick's or a duration's text."""
    if s < 60:
        return f"{s:.0f}s" if s >= 10 or s == int(s) else f"{s:.1f}s"
    if s < 3600:
        m, sec = divmod(round(s), 60)
        return f"{m}m" if sec == 0 else f"{m}m{sec:02d}s"
    h, rest = divmod(round(s), 3600)
    return f"{h}h{rest // 60:02d}m"


def nice_step(span: float, target: int = 6) -> float:
    """A round tick interval (1, 2, 5 × 10^k seconds, or whole minutes/hours) giving about ``target`` ticks."""
    if span <= 0:
        return 1.0
    raw = span / target
    for unit in (1.0, 60.0, 3600.0):
        if raw < unit * 60 or unit == 3600.0:
            scaled = raw / unit
            exp = 10 ** math.floor(math.log10(scaled)) if scaled > 0 else 1
            for m in (1, 2, 5, 10):
                if scaled <= m * exp:
                    return max(m * exp * unit, 0.001)
    return raw  # pragma: no cover - the loop always returns


def peak_concurrency(spans: Sequence[Span], now: float) -> int:
    """The most spans open at one instant (an end at the same instant as a start closes first)."""
    edges: list[tuple[float, int]] = []
    for s in spans:
        edges.append((s.start, 1))
        edges.append((s.end if s.end is not None else now, -1))
    edges.sort(key=lambda e: (e[0], e[1]))
    peak = cur = 0
    for _, d in edges:
        cur += d
        peak = max(peak, cur)
    return peak


def stragglers(spans: Sequence[Span], now: float) -> set[int]:
    """Indexes of spans longer than :data:`STRAGGLER_FACTOR` × the median finished duration (at least 3 finished)."""
    done = [s.end - s.start for s in spans if s.end is not None]
    if len(done) < 3:
        return set()
    limit = STRAGGLER_FACTOR * max(median(done), 0.001)
    return {i for i, s in enumerate(spans) if ((s.end if s.end is not None else now) - s.start) > limit}


def _titled(rows: Sequence[Span], slow: set[int], now: float) -> set[int] | None:
    """The rows drawn with a hover title: all (None) up to :data:`TITLED_MAX` rows, else the notable ones first (not
    done, or stragglers), then the longest, up to :data:`TITLED_MAX`."""
    if len(rows) <= TITLED_MAX:
        return None

    def rank(i: int) -> tuple[bool, float]:
        s = rows[i]
        notable = s.state != "done" or i in slow
        return (not notable, -((s.end if s.end is not None else now) - s.start))

    return set(sorted(range(len(rows)), key=rank)[:TITLED_MAX])


def layout(spans: Sequence[Span], *, now: float, never_started: int = 0) -> Timeline:
    """Lay out ``spans`` (in row order) on one time axis from the first start to the last end (or ``now``)."""
    rows = list(spans)
    n = len(rows)
    row_h = 18.0 if n <= 30 else max(MAX_H / max(n, 1), 0.6)
    labels = row_h >= 12
    plot_x = float(LABEL_W if labels else 8)
    plot_w = WIDTH - plot_x - 12
    height = math.ceil(AXIS_H + n * row_h + 6) if n else AXIS_H + 30
    t0 = min((s.start for s in rows), default=now)
    t1 = max((s.end if s.end is not None else now for s in rows), default=now)
    span = max(t1 - t0, 0.001)
    scale = plot_w / span
    slow = stragglers(rows, now)
    titled = _titled(rows, slow, now)
    font = 13.0
    bars: list[Bar] = []
    paths: dict[str, list[str]] = {}
    gap = 0.15 * row_h if row_h >= 3 else 0.0
    h = round(row_h - gap, 2)
    for i, s in enumerate(rows):
        end = s.end if s.end is not None else now
        x = round(plot_x + (s.start - t0) * scale, 2)
        w = round(max((end - s.start) * scale, 1.5), 2)
        y = round(AXIS_H + i * row_h + gap / 2, 2)
        css = f"tl-{s.state}" + (" tl-straggler" if i in slow else "")
        if titled is None or i in titled:
            bars.append(Bar(x, y, w, h, css, s.title, s.label, round(y + h / 2 + font * 0.35, 2)))
        else:
            paths.setdefault(css, []).append(f"M{x} {y}h{w}v{h}h{-w}z")
    strips = [Strip(css, "".join(parts), len(parts)) for css, parts in sorted(paths.items())]
    step = nice_step(span)
    ticks = []
    k = 0
    while k * step <= span + 1e-9 and k < 50:
        ticks.append(Tick(round(plot_x + k * step * scale, 2), fmt_seconds(k * step)))
        k += 1
    return Timeline(
        width=WIDTH,
        height=height,
        plot_x=plot_x,
        plot_w=plot_w,
        axis_y=AXIS_H - 8,
        bars=bars,
        strips=strips,
        ticks=ticks,
        labels=labels,
        font=font,
        peak=peak_concurrency(rows, now) if rows else 0,
        stragglers=len(slow),
        span_s=span if rows else 0.0,
        hidden=never_started,
    )
