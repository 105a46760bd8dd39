"""The stop's last resort: a stop still under way at its bound ends the process."""

from __future__ import annotations

import threading

from ambient.service.stopping import GUARD_AT_S, STOP_BOUND_S, WRITE_OUT_S, StopGuard, time_left


def test_the_guard_exits_with_its_code_once_the_bound_is_past_and_not_when_cancelled() -> None:
    exited: list[int] = []
    done = threading.Event()

    def exit_now(code: int) -> None:
        exited.append(code)
        done.set()

    StopGuard(0.01, lambda: 3, exit_now=exit_now).arm()
    assert done.wait(10) and exited == [3]
    cancelled = StopGuard(0.2, lambda: 4, exit_now=exit_now)
    cancelled.arm()
    cancelled.cancel()
    assert cancelled._timer is not None
    cancelled._timer.join(10)
    assert exited == [3]


def test_the_writes_get_part_of_the_bound_and_time_left_never_goes_below_its_floor() -> None:
    assert 0 < WRITE_OUT_S < GUARD_AT_S < STOP_BOUND_S
    assert time_left(10.0, 4.0) == 6.0
    assert time_left(10.0, 12.0) == 0.0
    assert time_left(10.0, 12.0, floor=1.0) == 1.0
