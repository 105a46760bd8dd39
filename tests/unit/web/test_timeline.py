"""The run timeline's layout: one bar per started item on a shared time axis, peak concurrency, stragglers."""

from __future__ import annotations

from ambient.web.timeline import TITLED_MAX, Span, fmt_seconds, layout, nice_step, peak_concurrency, stragglers


def _span(label: str, start: float, end: float | None, state: str = "done") -> Span:
    return Span(label, start, end, state, f"{label}: {state}")


def test_bars_follow_time_and_order() -> None:
    """Each item is a row; its bar starts and ends where its times fall on the shared axis."""
    tl = layout([_span("a", 100, 110), _span("b", 105, 120), _span("c", 110, 112)], now=200)
    a, b, c = tl.bars
    assert a.y < b.y < c.y
    assert a.x == tl.plot_x  # the first start is the axis' origin
    assert round(b.x + b.w, 1) == round(tl.plot_x + tl.plot_w, 1)  # the last end is the axis' end
    assert a.x < b.x < c.x
    assert abs((a.w / b.w) - (10 / 15)) < 0.01
    assert tl.labels and [b.label for b in tl.bars] == ["a", "b", "c"]
    assert tl.span_s == 20


def test_running_item_extends_to_now_and_keeps_its_state_class() -> None:
    """A running item (no end) reaches ``now``; its class says running."""
    tl = layout([_span("a", 0, 10), _span("b", 5, None, "running")], now=20)
    assert tl.bars[1].css == "tl-running"
    assert round(tl.bars[1].x + tl.bars[1].w, 1) == round(tl.plot_x + tl.plot_w, 1)


def test_peak_concurrency_counts_overlaps_only() -> None:
    """Back-to-back items are not concurrent; overlapping ones are."""
    assert peak_concurrency([_span("a", 0, 10), _span("b", 10, 20)], now=30) == 1
    assert peak_concurrency([_span("a", 0, 10), _span("b", 5, 20), _span("c", 6, 7)], now=30) == 3
    assert peak_concurrency([], now=0) == 0


def test_stragglers_are_over_twice_the_median() -> None:
    """An item far slower than its siblings is marked; with fewer than three finished, none is."""
    spans = [_span(str(i), 0, 10) for i in range(5)] + [_span("slow", 0, 50)]
    assert stragglers(spans, now=60) == {5}
    tl = layout(spans, now=60)
    assert "tl-straggler" in tl.bars[5].css and tl.stragglers == 1
    assert stragglers([_span("a", 0, 1), _span("b", 0, 100)], now=100) == set()


def test_a_thousand_items_stay_within_the_height_cap_without_labels() -> None:
    """Rows get thinner, never the drawing taller; names go to the hover title."""
    spans = [_span(f"item-{i}", i * 0.1, i * 0.1 + 5) for i in range(1000)]
    tl = layout(spans, now=200)
    assert tl.drawn == 1000
    assert tl.height <= 700
    assert not tl.labels
    assert tl.bars[0].title == "item-0: done"


def test_empty_run_has_no_bars() -> None:
    """Nothing started: no bar, no ticks beyond the origin, a count of those not started."""
    tl = layout([], now=10, never_started=4)
    assert tl.bars == [] and tl.hidden == 4 and tl.peak == 0


def test_ticks_are_round_numbers() -> None:
    """Tick intervals are 1/2/5 × 10^k seconds or whole minutes, and read as a person writes them."""
    assert nice_step(60) == 10
    assert nice_step(7) == 2
    assert nice_step(3600) == 600
    assert fmt_seconds(0) == "0s" and fmt_seconds(90) == "1m30s" and fmt_seconds(120) == "2m"
    assert fmt_seconds(3900) == "1h05m" and fmt_seconds(2.5) == "2.5s"
    tl = layout([_span("a", 0, 60)], now=60)
    assert [t.text for t in tl.ticks] == ["0s", "10s", "20s", "30s", "40s", "50s", "1m"]


def test_past_the_cap_notable_bars_keep_their_title_and_the_rest_share_a_path_per_state() -> None:
    """Rows thinner than a pointer: failed, running and straggling items keep a titled rect, the done ones are drawn
    as one path per state with a rectangle each, at the same place a rect would be."""
    spans = [_span(f"i{i}", i, i + 5) for i in range(TITLED_MAX + 50)]
    spans[3] = _span("bad", 3, 6, "failed")
    spans[7] = _span("slow", 7, 100)
    spans[-1] = _span("busy", 149, None, "running")
    tl = layout(spans, now=160)
    assert tl.drawn == len(spans) and len(tl.bars) == TITLED_MAX
    titled = {b.label for b in tl.bars}
    assert {"bad", "slow", "busy"} <= titled
    [strip] = tl.strips
    assert strip.css == "tl-done" and strip.count == len(spans) - TITLED_MAX
    assert strip.d.count("M") == strip.count and strip.d.endswith("z")
    small = layout(spans[:TITLED_MAX], now=160)
    assert small.strips == [] and len(small.bars) == TITLED_MAX
