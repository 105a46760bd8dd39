"""Steering in a real browser: a breaker tripped while the overview is open appears there without a reload, and a
click on its "Reset" button clears it (the CLI then says it is closed)."""

from __future__ import annotations

from typing import Any

from tests.acceptance.harness import Brain
from tests.web.conftest import Console, screenshot

LIVE_S = 30_000  # ms: what a live update may take at worst on a loaded CI machine


def test_a_tripped_breaker_appears_live_and_is_reset_by_a_click(
    brain: Brain, console: Console, open_console: Any
) -> None:
    page = open_console("/")
    card = page.locator("[data-fragment=breakers]")
    card.get_by_text("No breaker tripped.").wait_for()
    page.evaluate("window.sameDocument = true")
    for _ in range(3):
        brain.cli("preflight", "fail", "work/deploy/")
    card.get_by_role("button", name="Reset the breaker of work/deploy/").wait_for(timeout=LIVE_S)
    assert page.evaluate("window.sameDocument === true")  # swapped in place, not reloaded
    assert "3 consecutive failure(s)" in card.inner_text()
    screenshot(page, "overview-breaker")
    card.get_by_role("button", name="Reset the breaker of work/deploy/").click()
    page.locator(".notice").get_by_text("work/deploy/: breaker reset").wait_for()
    card.get_by_text("No breaker tripped.").wait_for()
    assert page.errors == []
    assert "closed" in brain.cli("preflight", "status", "work/deploy/").out
