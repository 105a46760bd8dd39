"""bench/autonomy.py's core on a simulated week, so that the bench of the learning loop cannot rot: the real daemon
on a fresh brain, real agents, the scripted person answering with ``ambient decide`` and accepting proposed rules.

The week is the month's calendar compressed (bench/autonomy.py, ``Calendar.of``): rules become active and decide
alone from day 4, the upstream is down on day 5 (a learned retry keeps failing: the bound), and a novel failure
appears on days 3, 4, 5 and 7, each from an agent whose other failures rules already answer alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import autonomy  # noqa: E402


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
