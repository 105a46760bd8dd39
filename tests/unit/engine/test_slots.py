"""The daemon-wide cap on agents at once (engine.slots): never over the limit, every slot used, nobody starved."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ambient.engine.slots import AgentSlots


class Run:
    """A client of the slots: how many agents it wants to start, how many run, and whether it was woken."""

    def __init__(self, name: str, want: int) -> None:
        self.name = name
        self.want = want
        self.running = 0
        self.woken = 0

    def wake(self) -> None:
        self.woken += 1

    def ask(self, slots: AgentSlots) -> int:
        got = slots.take(self.name, self.want - self.running, self.wake)
        self.running += got
        return got


def test_one_run_takes_what_is_free_and_queues_for_the_rest() -> None:
    """A run wanting more than the limit gets the limit and waits; a freed slot wakes it."""
    slots = AgentSlots(2)
    a = Run("a", 5)
    assert a.ask(slots) == 2
    slots.give("a")
    a.running -= 1
    assert a.woken == 1
    assert a.ask(slots) == 1


def test_a_freed_slot_goes_to_the_run_that_waited_longest() -> None:
    """The run whose agent just ended does not win its slot back ahead of a run already waiting."""
    slots = AgentSlots(2)
    big, late = Run("big", 10), Run("late", 3)
    assert big.ask(slots) == 2
    assert late.ask(slots) == 0
    slots.give("big")  # one of big's agents ends
    big.running -= 1
    assert late.woken == 1
    assert big.ask(slots) == 0  # big asks first, but the slot is set aside for late
    assert late.ask(slots) == 1


def test_a_run_with_nothing_left_to_start_leaves_the_line() -> None:
    """leave(): a run that has nothing more to start hands what was set aside for it to the next in line."""
    slots = AgentSlots(1)
    a, b = Run("a", 1), Run("b", 1)
    c = Run("c", 1)
    assert a.ask(slots) == 1
    assert b.ask(slots) == 0 and c.ask(slots) == 0
    slots.give("a")  # a is done: the slot is set aside for b...
    assert b.woken == 1
    slots.leave("b")  # ... which ended meanwhile: it goes to c
    assert c.woken == 1 and c.ask(slots) == 1


def test_a_larger_limit_wakes_the_queue_at_once() -> None:
    """resize(): more slots go to waiting runs at once; fewer take effect as agents end."""
    slots = AgentSlots(1)
    a, b = Run("a", 2), Run("b", 2)
    assert a.ask(slots) == 1 and b.ask(slots) == 0
    slots.resize(4)
    assert b.woken >= 1
    assert b.ask(slots) + a.ask(slots) == 3
    slots.resize(1)
    assert slots.take("a", 1, lambda: None) == 0


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(st.sampled_from(["take", "give", "forget", "resize"]), st.integers(0, 3), st.integers(1, 6)),
        max_size=80,
    ),
    st.integers(1, 5),
)
def test_never_over_the_limit_and_no_slot_idle_while_a_run_waits(ops: list[tuple[str, int, int]], limit: int) -> None:
    """Whatever the order of takes, gives, forgets and resizes: at most ``limit`` run, and a free slot never sits
    unused while a run waits for one (it is either taken or set aside for a waiter)."""
    slots = AgentSlots(limit)
    runs = [Run(f"r{i}", 0) for i in range(4)]
    for op, who, n in ops:
        run = runs[who]
        if op == "take":
            run.want = run.running + n
            run.ask(slots)
        elif op == "give" and run.running:
            run.running -= 1
            slots.give(run.name)
        elif op == "forget":
            slots.leave(run.name)
            run.want = run.running
        elif op == "resize":
            limit = n
            slots.resize(n)
        assert sum(r.running for r in runs) == slots.running
        assert slots.running + sum(slots._reserved.values()) <= max(limit, slots.running)
        lacking = [w for w, (_, short) in slots._waiting.items() if slots._reserved.get(w, 0) < short]
        if lacking:
            assert slots.free <= 0
