"""bench/autonomy.py's core on a simulated week, so that the bench of the learning loop cannot rot: the real daemon
on a fresh brain, real agents, the scripted person answering with ``ambient decide`` and reviewing proposed rules
(accepting those whose option is their answer every time, declining the others).

The week is the month's calendar compressed (bench/autonomy.py, ``Calendar.of``): rules become active and decide
alone from day 4, the upstream is down on day 5 (a learned retry keeps failing: the bound), and a novel failure
appears on days 3, 4, 5 and 7, each from an agent whose other failures rules already answer alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import autonomy  # noqa: E402


# 17 runs of the real daemon, each answered through ``ambient`` commands: about a minute alone, over three at a load
# average of 8 on two cores (the default timeout of 180 s cut it on its last run).
@pytest.mark.timeout(600)
def test_a_simulated_week_of_the_learning_loop_never_decides_wrongly_nor_a_novel_failure(tmp_path: Path) -> None:
    month = autonomy.run_month(tmp_path, 7, seed=7, say=lambda _: None)

    [week] = month.weeks
    assert week.asked > 0 and week.auto > 0, week  # the person was asked, and rules decided alone: not vacuous
    assert month.wrong == [], month.wrong  # every automatic decision is the person's answer
    assert month.inconsistent_auto == 0  # the situation answered both ways never decided alone
    # Each novel failure reached the person the first time, though rules decided the agent's known failures alone.
    assert month.novel_first == {
        "certificate": "person",
        "oom": "person",
        "image-tag": "person",
        "write-denied": "person",
    }
    # On the outage night the learned retry decided the item exactly up to the bound, then the person had it.
    assert month.max_auto_per_item == autonomy.AUTO_REPEATS


def test_the_month_s_novel_failures_appear_mid_month_and_recur_before_week_4() -> None:
    cal = autonomy.Calendar.of(30)
    for name in ("certificate", "oom", "image-tag", "write-denied"):
        first = cal.novel_day(name)
        assert first is not None and 7 <= first <= 20, (name, first)  # days 8 to 21 of the month, never week 4
        plans = [{**autonomy.nightly_plan(day, cal), **autonomy.deploy_plan(day, cal)} for day in range(21)]
        seen = [day for day, plan in enumerate(plans) if any(name in errors for errors in plan.values())]
        assert seen[0] == first and len(seen) >= 4, (name, seen)  # recurs: enough answers to become a rule


def test_the_scripted_person_accepts_only_a_rule_that_is_their_answer_every_time() -> None:
    def rule(signal: str, signature: str, option: str) -> dict[str, object]:
        return {"situation": {"signal": signal, "signature": signature}, "option": option}

    assert autonomy.review(rule("FAIL", "upstream mirror answered HTTP <n> (request id <n>)", "retry")) is None
    assert autonomy.review(rule("GATE", "step 2: (deploy) step <n> (deploy)", "approve")) is None
    assert autonomy.review(rule("PERMISSION", "Bash: echo lint >> work/triage/lint.log", "allow")) is None
    # Four equal answers in a row to the situation answered by judgement: proposed, and declined all the same.
    assert "judgement" in (autonomy.review(rule("FAIL", "disk usage at <n>% on <path>", "retry")) or "")
    assert "'abort'" in (autonomy.review(rule("FAIL", "image tag <n> not found in the registry", "skip")) or "")
