"""The run page and the other pages in a real browser: a running for_each's grid fills without a reload (the daemon
as a real process, an agent that takes a little time), a chain's human gate approved by a click moves the run on,
and every page is screenshotted on a desktop and on a 390 px phone (no horizontal scroll)."""

from __future__ import annotations

from typing import Any

from tests.acceptance.harness import Brain, for_each
from tests.web.conftest import Console, screenshot

LIVE_S = 30_000  # ms: what a live update may take at worst on a loaded CI machine
SLOW_AGENT = """
    import json, os, sys, time
    json.load(sys.stdin)
    time.sleep(0.5 + 0.1 * (sum(map(ord, os.environ.get("AMBIENT_ITEM", ""))) % 5))
    print(json.dumps({"signal": "RETURN", "result": {"status": "ok"}}))
"""
GATE_CHAIN = """
workflow: ship
chain:
  - {step: 1, type: brain-write, scope: work/, agents: [slow]}
  - {step: 2, type: deploy, scope: work/, agents: [slow], gate: human}
"""


def _mark(page: Any) -> None:
    page.evaluate("window.sameDocument = true")


def _same(page: Any) -> bool:
    return bool(page.evaluate("window.sameDocument === true"))


def _run_id(brain: Brain, workflow: str) -> str:
    from tests.acceptance.harness import wait

    def found() -> str | None:
        runs = brain.path(".ambient/runs")
        for path in sorted(runs.glob("*.jsonl")) if runs.is_dir() else []:
            if f'"workflow":"{workflow}"' in path.read_text().split("\n", 1)[0]:
                return path.stem
        return None

    run_id: str = wait(found, f"a run of {workflow}")
    return run_id


def test_a_running_for_each_grid_fills_without_reloading(brain: Brain, console: Console, open_console: Any) -> None:
    brain.python_agent("slow", SLOW_AGENT)
    items = [f"host-{n}" for n in range(8)]
    with brain.daemon():
        brain.workflow("fleet", for_each("fleet", "slow", items, extra="  concurrency: 3\n"))
        run_id = _run_id(brain, "fleet")
        page = open_console(f"/runs/{run_id}")
        page.locator(".run-grid .cell").first.wait_for()
        _mark(page)
        assert page.locator(".run-grid .cell").count() == 8
        page.locator(".run-grid .cell.st-running").first.wait_for(timeout=LIVE_S)
        screenshot(page, "run-filling")
        page.locator(".run-grid .cell.st-done").nth(7).wait_for(timeout=LIVE_S)  # all eight, seen live
        assert _same(page)
        page.locator("svg.timeline rect.tl-done").nth(7).wait_for(timeout=LIVE_S)
        assert "at most 3 at once" in page.locator("[data-fragment=timeline]").inner_text()
        page.locator("[data-fragment=progress] .badge", has_text="success").wait_for(timeout=LIVE_S)
        screenshot(page, "run-finished")
        phone = open_console(f"/runs/{run_id}", width=390, height=844)
        assert phone.evaluate("document.documentElement.scrollWidth <= 390")
        screenshot(phone, "run-phone")
        assert not page.errors
    [record] = brain.finished("fleet")
    assert record["outcome"] == "success"


def test_a_chain_gate_approved_by_a_click_moves_the_run_on(brain: Brain, console: Console, open_console: Any) -> None:
    brain.python_agent("slow", SLOW_AGENT)
    with brain.daemon():
        brain.workflow("ship", GATE_CHAIN)
        run_id = _run_id(brain, "ship")
        page = open_console(f"/runs/{run_id}")
        form = page.locator("form.gate-form")
        form.wait_for(timeout=LIVE_S)  # step 2 waits at its human gate, shown live
        screenshot(page, "run-chain-gate")
        form.locator("input[name=message]").fill("looks good")
        form.get_by_role("button", name="Approve").click()
        page.locator(".notice-ok").wait_for(timeout=LIVE_S)
        assert "approve" in page.locator(".notice-ok").inner_text()
        _mark(page)
        # the run went on: step 2 ran and the run finished, seen without a reload
        page.locator("[data-fragment=progress] .badge", has_text="success").wait_for(timeout=LIVE_S)
        assert _same(page)
        screenshot(page, "run-chain-done")
        claims = open_console("/claims")
        screenshot(claims, "claims")
    [record] = brain.finished("ship")
    assert record["outcome"] == "success"
    [answered] = brain.escalations(all=True)
    assert (answered["decision"], answered["channel"], answered["note"]) == ("approve", "web", "looks good")


def test_every_page_reads_well_on_a_desktop_and_a_phone(brain: Brain, console: Console, open_console: Any) -> None:
    """Screenshots of each page (artifacts to look at); on a 390 px phone nothing scrolls sideways."""
    _history(brain)
    brain.python_agent("slow", SLOW_AGENT)
    brain.workflow("fleet", "status: draft\n" + for_each("fleet", "slow", ["a", "b"]))
    brain.workflow("broken", "workflow: broken\nfor_each: {items: [a], spawn: nobody}\n")
    pages = (
        ("/workflows", "workflows"),
        ("/learning", "learning"),
        ("/matrix", "matrix"),
        ("/matrix?from=slow&to=human&signal=ESCALATE", "matrix-explain"),
        ("/claims", "claims-empty"),
    )
    for path, name in pages:
        page = open_console(path)
        page.locator("h1").wait_for()
        screenshot(page, name)
        phone = open_console(path, width=390, height=844)
        phone.locator("h1").wait_for()
        assert phone.evaluate("document.documentElement.scrollWidth <= 390"), path
        screenshot(phone, f"{name}-phone")
        assert not page.errors and not phone.errors


def _history(brain: Brain) -> None:
    """Eight weeks of run records (escalations falling as rules learn) and two learned rules."""
    import json
    from datetime import UTC, datetime, timedelta

    from ambient.learning.rules import RuleBook, observe, situation_from_step
    from ambient.learning.rulestore import rules_path, save_rules
    from ambient.storage.paths import BrainPaths

    start = datetime(2026, 1, 5, 9, tzinfo=UTC)
    lines = []
    for week in range(8):
        for n, workflow in enumerate(("fleet", "ship", "fleet")):
            at = start + timedelta(weeks=week, hours=n)
            escalations = max(0, 3 - week // 2 - n % 2)
            error = "timeout after 30s on 'eu-3'" if (week + n) % 3 == 0 else None
            step = {"item": "a", "agent": "slow", "signal_out": "SPAWN", "result": "error" if error else "success",
                    "duration_ms": 900 + 100 * n, "attempt": 1, "error": error, "at": at.isoformat()}  # fmt: skip
            record = {"run_id": f"sess-{week}-{n}", "workflow": workflow, "outcome": "failed" if error else "success",
                      "started_at": at.isoformat(), "completed_at": (at + timedelta(minutes=3)).isoformat(),
                      "duration_ms": 180000, "steps": [step], "escalations": escalations,
                      "errors": 1 if error else 0, "decisions": []}  # fmt: skip
            lines.append(record)
    brain.write(".ambient/runs.jsonl", "".join(json.dumps(r) + "\n" for r in lines))
    fail = {"item": "a", "agent": "slow", "result": "fail", "error": "exit code 1", "signal_in": "RETURN"}
    rules: list[Any] = []
    for i in range(4):
        rules = observe(rules, situation_from_step("fleet", fail), "retry", f"run-{i}", start)
    rules = observe(rules, situation_from_step("ship", {**fail, "error": "disk full"}), "abort", "run-9", start)
    save_rules(rules_path(BrainPaths(brain.root)), RuleBook().with_rules(rules))
