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


def test_a_grant_is_forgotten_by_a_click(brain: Brain, console: Console, open_console: Any) -> None:
    from ambient.runners.claude import SessionStore
    from ambient.storage.paths import BrainPaths

    store = SessionStore(BrainPaths(brain.root).state / "claude")
    for call in ("Bash: pytest -q", "Bash: git status", "Edit: src/app.py"):
        store.grant_always("coder", call)
    store.grant_always("writer", "WebFetch: docs.python.org")
    page = open_console("/matrix")
    grants = page.locator("[data-fragment=grants]")
    grants.get_by_text("Bash: pytest -q").wait_for()
    screenshot(page, "matrix-grants")
    grants.get_by_role("button", name="Forget coder: Bash: pytest -q").click()
    page.locator(".notice").get_by_text("forgot 1 grant(s) of coder").wait_for()
    # The grants part is told of the change a frame later (the console's teller), like every live part.
    grants.get_by_text("Bash: pytest -q").wait_for(state="detached", timeout=LIVE_S)
    assert "Bash: git status" in grants.inner_text()
    page.evaluate("window.sameDocument = true")
    store.grant_always("writer", "Read: notes.md")  # granted by the runner meanwhile: the part updates live
    grants.get_by_text("Read: notes.md").wait_for(timeout=LIVE_S)
    assert page.evaluate("window.sameDocument === true") and page.errors == []


def test_the_claims_page_offers_each_claim_its_gate_actions(brain: Brain, console: Console, open_console: Any) -> None:
    for sid in ("c-open", "c-paused", "c-wait"):
        brain.ok("claim", "open", "--sess-id", sid, "--type", "satellite", "--agent", "w", "--scope", f"work/{sid}/")
    brain.ok("gate", "pause", "c-paused", "lunch")
    brain.ok("gate", "gate", "c-wait", "ship it?")
    brain.ok("lock", "acquire", "work/c-open/a.txt", "c-open", "--ttl", "30")
    page = open_console("/claims")
    page.get_by_text("Gate actions").first.click()
    page.get_by_role("button", name="Resume c-paused").wait_for(state="attached")
    screenshot(page, "claims-steer")
    page.get_by_role("button", name="Release work/c-open/a.txt held by c-open").click()
    page.locator(".notice").get_by_text("released work/c-open/a.txt").wait_for()
    page.get_by_role("button", name="Pause c-wait").click()
    page.locator(".notice").get_by_text("c-wait: waiting_human -> paused").wait_for()
    assert page.errors == []
