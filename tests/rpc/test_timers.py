"""Precise timers (store/rpc/timers.py): deadlines run in order, never early, cancelled
ones never, and closer to their instant than the event loop's own millisecond timers."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable

import pytest

from store.rpc._native import TimerFd
from store.rpc.aio import new_event_loop, timer_delay_s
from store.rpc.timers import PreciseTimers

MS = 1_000_000


def run_until(loop: asyncio.AbstractEventLoop, done: Callable[[], bool], deadline_s: float = 5.0) -> None:
    """Runs the loop until ``done()`` (checked every loop pass), failing after the deadline."""

    async def wait() -> None:
        give_up = time.monotonic() + deadline_s
        while not done():
            assert time.monotonic() < give_up, "the timers did not run in time"
            await asyncio.sleep(0)

    loop.run_until_complete(wait())


@pytest.fixture
def loop() -> asyncio.AbstractEventLoop:
    loop = new_event_loop()
    yield loop
    loop.close()


def test_deadlines_run_in_order_never_early_and_cancelled_ones_never(loop: asyncio.AbstractEventLoop) -> None:
    timers = PreciseTimers(loop)
    ran: list[tuple[str, int, int]] = []
    start = timers.clock_ns()

    def mark(name: str, when: int) -> Callable[[], None]:
        return lambda: ran.append((name, when, timers.clock_ns()))

    # Set out of order; two share an instant (they run in the order set).
    plan = [("c", 6 * MS), ("a", 2 * MS), ("b1", 4 * MS), ("b2", 4 * MS), ("d", 9 * MS)]
    handles = {name: timers.call_at(start + offset, mark(name, start + offset)) for name, offset in plan}
    cancelled = timers.call_at(start + 3 * MS, mark("cancelled", start + 3 * MS))
    cancelled.cancel()
    run_until(loop, lambda: len(ran) == 5)
    assert [name for name, _, _ in ran] == ["a", "b1", "b2", "c", "d"]
    assert all(at >= when for _, when, at in ran), "a deadline ran before its instant"
    assert timers.fired == 5 and timers.late_ns >= 0
    handles["a"].cancel()  # after it ran: nothing happens
    timers.close()
    timers.close()  # again: nothing
    late = timers.call_at(timers.clock_ns(), mark("after close", 0))
    assert late.cancelled  # a deadline set after close never runs


def test_a_past_deadline_runs_on_the_next_wake_up_and_cannot_hold_the_loop(loop: asyncio.AbstractEventLoop) -> None:
    timers = PreciseTimers(loop)
    passes: list[str] = []
    rearms = 0

    def again() -> None:  # sets itself due at once, five times
        nonlocal rearms
        passes.append("timer")
        rearms += 1
        if rearms < 5:
            timers.call_at(timers.clock_ns() - MS, again)
            loop.call_soon(passes.append, "soon")

    timers.call_at(timers.clock_ns() - 10 * MS, again)  # already past
    run_until(loop, lambda: rearms == 5)
    # Each re-set deadline ran on a later wake-up, after the loop's other callbacks.
    assert passes == ["timer", "soon", "timer", "soon", "timer", "soon", "timer", "soon", "timer"]
    timers.close()


def test_a_failing_callback_is_reported_and_the_others_still_run(loop: asyncio.AbstractEventLoop) -> None:
    timers = PreciseTimers(loop)
    reported: list[BaseException] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context["exception"]))
    ran: list[str] = []

    def boom() -> None:
        raise ValueError("boom")

    now = timers.clock_ns()
    timers.call_at(now + MS, boom)
    timers.call_at(now + MS, lambda: ran.append("after"))
    run_until(loop, lambda: ran == ["after"])
    assert len(reported) == 1 and isinstance(reported[0], ValueError)
    timers.close()


def test_deadlines_run_closer_to_their_instant_than_the_loops_millisecond_timers(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """The reason the module exists: uvloop rounds a timer to whole milliseconds (up, in
    ``timer_delay_s``), so a deadline between two milliseconds runs late by the rest of one.
    Thirty deadlines at sub-millisecond offsets, each set on both, one at a time."""
    timers = PreciseTimers(loop)
    precise: list[int] = []
    coarse: list[int] = []
    got: dict[str, int] = {}

    def stamp(which: str) -> Callable[[], None]:
        return lambda: got.__setitem__(which, time.monotonic_ns())

    for i in range(30):
        when = timers.clock_ns() + 2 * MS + (i * 37_000) % MS
        got.clear()
        timers.call_at(when, stamp("precise"))
        loop.call_later(timer_delay_s(when, time.monotonic_ns()), stamp("loop"))
        run_until(loop, lambda: len(got) == 2)
        precise.append(got["precise"] - when)
        coarse.append(got["loop"] - when)
    assert min(precise) >= 0
    assert statistics.median(precise) < statistics.median(coarse)


def test_timerfd_arms_clears_and_refuses_use_after_close() -> None:
    fd = TimerFd()
    assert fd.clear() == 0  # never armed: nothing expired
    fd.arm(1)  # long past: expires at once
    give_up = time.monotonic() + 5
    while (count := fd.clear()) == 0:
        assert time.monotonic() < give_up
    assert count == 1 and fd.clear() == 0
    fd.arm(time.monotonic_ns() + 3600 * 1_000_000_000)
    fd.disarm()
    fd.close()
    fd.close()  # again: nothing
    with pytest.raises(RuntimeError):
        fd.arm(1)
    with pytest.raises(RuntimeError):
        fd.fileno()
