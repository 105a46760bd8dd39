"""Who a process is: its start time, read in the frame /proc gives (boot time in whole seconds + ticks)."""

from __future__ import annotations

import os

import pytest

from ambient.core.process import own_start_time, process_alive, same_start


@pytest.mark.parametrize(
    ("recorded", "now", "same"),
    [
        (1000.00, 1000.00, True),
        (1000.00, 1000.04, True),  # a clock tick
        (1000.00, 1001.00, True),  # btime read a second apart: a clock slewed across a second's edge
        (1000.02, 998.99, True),
        (1000.00, 1000.30, False),  # another process on the same pid
        (1000.00, 1003.00, False),
        (1000.00, 1000.50, False),
    ],
)
def test_a_start_time_read_with_another_btime_is_the_same_process(recorded: float, now: float, same: bool) -> None:
    assert same_start(recorded, now) is same


def test_this_process_is_alive_with_its_start_time_off_by_a_btime_step() -> None:
    started = own_start_time()
    assert started is not None
    assert process_alive(os.getpid(), started)
    assert process_alive(os.getpid(), started - 1)  # what a reader whose btime moved a second computes
    assert not process_alive(os.getpid(), started - 0.4)
