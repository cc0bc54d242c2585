"""Clock and timers on an event loop, kept to the microsecond, not the millisecond.

Theory of operation. The event loop's own timers are uvloop's (libuv's), kept in whole
milliseconds against a clock read at the start of a loop iteration: a deadline fires up to a
millisecond late (``store.rpc.aio.timer_delay_s``). Some of a replica's deadlines sit on a
transaction's path: a replication batch that a waiting client hurried closes on a 5 ms grid
(``StreamLeader.hurry``), and each millisecond it closes late is a millisecond more before
that client hears COMMITTED. The wan-proxy (``store.wan.proxy``) releases each chunk of a
delayed connection at its instant: on the loop's timers a chunk was up to half a
millisecond late, or woke the loop early and spun it (a timer under half a millisecond
fires at once) until due. ``PreciseTimers`` keeps its deadlines in a heap and one Linux
timerfd (``store.rpc._native.TimerFd``, CLOCK_MONOTONIC, the clock of
``time.monotonic_ns``) armed at the earliest; the loop watches the fd (``add_reader``) and,
when it is readable, runs every deadline that is due, in deadline order (ties in the order
they were set). A cancelled deadline stays in the heap until it reaches the top and is
dropped then: cancelling is O(1), and the fd is re-armed only for a deadline earlier than
the one it holds.

``late_ns`` and ``fired`` sum how late the deadlines ran (the instant the callback started
minus the deadline): the server's status and metrics report them (``lateness``), so a run can show what
the loop's wake-ups cost (measured on geo3 at 50 ms: a hurried batch closed 0.43 ms after
its deadline on uvloop's timers on average).
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable

from store.rpc._native import TimerFd


class PreciseTimer:
    """What ``PreciseTimers.call_at`` returns: ``cancel()`` keeps the callback from running."""

    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class PreciseTimers:
    """The host's clock and timers on an asyncio event loop (monotonic time, nanoseconds);
    the module doc says how."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._fd = TimerFd()
        self._heap: list[tuple[int, int, PreciseTimer]] = []
        self._seq = 0  # ties in deadline run in the order set
        self._armed_at: int | None = None  # the instant the fd holds (None: disarmed)
        self._closed = False
        self.fired = 0
        self.late_ns = 0
        loop.add_reader(self._fd.fileno(), self._on_readable)

    def clock_ns(self) -> int:
        return time.monotonic_ns()

    def lateness(self) -> dict[str, int]:
        """How late the deadlines ran so far, summed (``late_ns``) over ``fired`` of them, as
        the server's status and metrics give it: {"count", "sum_ns"}."""
        return {"count": self.fired, "sum_ns": self.late_ns}

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> PreciseTimer:
        timer = PreciseTimer(callback)
        if self._closed:
            timer.cancelled = True  # never runs (``close``)
            return timer
        self._seq += 1
        heapq.heappush(self._heap, (when_ns, self._seq, timer))
        if self._armed_at is None or when_ns < self._armed_at:
            self._armed_at = when_ns
            self._fd.arm(when_ns)
        return timer

    def close(self) -> None:
        """Stops watching the fd and closes it; deadlines not yet run never run, nor do any
        set later. Again: nothing."""
        if self._closed:
            return
        self._closed = True
        self._heap.clear()
        self._armed_at = None
        self.loop.remove_reader(self._fd.fileno())
        self._fd.close()

    def _on_readable(self) -> None:
        self._fd.clear()
        self._armed_at = None
        heap = self._heap
        now = time.monotonic_ns()
        due: list[tuple[int, PreciseTimer]] = []
        while heap and (heap[0][0] <= now or heap[0][2].cancelled):
            when, _, timer = heapq.heappop(heap)
            if not timer.cancelled:
                due.append((when, timer))
        if heap:  # before the callbacks: what they set is compared with this
            self._armed_at = heap[0][0]
            self._fd.arm(self._armed_at)
        # Deadlines set by these callbacks run on a later wake-up, however soon they are
        # due, as the loop's own call_later(0) would: a callback that sets one due at once
        # cannot keep this pass from ending.
        for when, timer in due:
            if timer.cancelled:  # by an earlier callback of this pass
                continue
            timer.cancelled = True  # ran: a later cancel() is a no-op
            self.fired += 1
            self.late_ns += time.monotonic_ns() - when
            try:
                timer.callback()
            except Exception as exc:  # as the loop treats a failing timer callback
                self.loop.call_exception_handler(
                    {"message": "exception in a timer callback", "exception": exc}
                )
