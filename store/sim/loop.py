"""Virtual time and the event queue.

Everything that happens in a simulation is an event at a virtual time in nanoseconds,
ordered by (time, sequence number): two events at the same instant run in the order they
were scheduled, so a seed replays exactly. The one ``random.Random`` of the run lives here.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from typing import Any


class Timer:
    """A cancellable timer event."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def _fire(timer: Timer, callback: Callable[[], None]) -> None:
    if not timer.cancelled:
        callback()


class Simulator:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now_ns = 0
        self._queue: list[tuple[int, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0
        self.events_run = 0

    def at(self, when_ns: int, action: Callable[..., Any], *args: Any) -> None:
        """Runs ``action(*args)`` at virtual time ``when_ns`` (never in the past)."""
        when_ns = max(when_ns, self.now_ns)
        self._seq += 1
        heapq.heappush(self._queue, (when_ns, self._seq, action, args))

    def after(self, delay_ns: int, action: Callable[..., Any], *args: Any) -> None:
        self.at(self.now_ns + delay_ns, action, *args)

    # The timer interface of hosts (``store.node.host.Timers``), on virtual time.

    def clock_ns(self) -> int:
        return self.now_ns

    def call_at(self, when_ns: int, callback: Callable[[], None]) -> Timer:
        timer = Timer()
        self.at(when_ns, _fire, timer, callback)
        return timer

    def run_until(self, end_ns: int, events_max: int = 50_000_000) -> None:
        queue = self._queue
        while queue and queue[0][0] <= end_ns:
            when, _, action, args = heapq.heappop(queue)
            self.now_ns = when
            action(*args)
            self.events_run += 1
            assert self.events_run < events_max, "simulation ran away (event limit)"
        self.now_ns = max(self.now_ns, end_ns)

    def pending_events(self) -> int:
        return len(self._queue)
