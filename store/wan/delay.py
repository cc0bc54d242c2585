"""The delay line: one direction of one proxied connection, as a pure state machine.

Theory of operation. Each chunk read from the source is stamped with a release time
``max(previous release, arrival + delay + jitter)``. Taking the maximum keeps the byte
order of the connection (a TCP stream must never be reordered) even when jitter or a
lowered delay would put a later chunk first; the sample itself is uniform in
``[-jitter, +jitter]`` around the delay and never below zero. Release times therefore never
decrease, so a FIFO queue is already sorted and one timer for its head serves the whole
direction: any number of chunks are in flight at once and throughput is not capped at one
chunk per delay.

While the line is held (a ``hold`` partition) nothing is due. On release every queued chunk
is re-stamped as if it arrived at the heal instant, so held data reaches the far side one
delay after the heal, still in order.

Time and chance are arguments: ``now_ns`` comes from the caller and jitter from the
``random.Random`` the caller seeds. The asyncio adapter is ``store.wan.proxy``.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

# Stands in the queue for the source's end of stream (TCP FIN), which must arrive after
# every byte sent before it.
EOF = None


@dataclass(slots=True)
class _Item:
    release_at_ns: int
    data: bytes | None


class DelayLine:
    """FIFO of chunks with non-decreasing release times."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._queue: deque[_Item] = deque()
        self._last_release_at_ns = 0
        self.held = False
        self.queued_bytes = 0

    def _stamp(self, now_ns: int, delay_ns: int, jitter_ns: int) -> int:
        wait_ns = delay_ns
        if jitter_ns:
            wait_ns = max(0, delay_ns + round(self._rng.uniform(-jitter_ns, jitter_ns)))
        release_at_ns = max(self._last_release_at_ns, now_ns + wait_ns)
        self._last_release_at_ns = release_at_ns
        return release_at_ns

    def push(self, data: bytes | None, now_ns: int, delay_ns: int, jitter_ns: int) -> None:
        """Queue a chunk (or ``EOF``) that arrived at ``now_ns``."""
        assert delay_ns >= 0 and jitter_ns >= 0
        self._queue.append(_Item(self._stamp(now_ns, delay_ns, jitter_ns), data))
        if data is not None:
            self.queued_bytes += len(data)

    def next_release_at_ns(self) -> int | None:
        """When the head is due; ``None`` if nothing can be released (empty or held)."""
        if self.held or not self._queue:
            return None
        return self._queue[0].release_at_ns

    def is_due(self, now_ns: int) -> bool:
        release_at_ns = self.next_release_at_ns()
        return release_at_ns is not None and release_at_ns <= now_ns

    def pop(self) -> bytes | None:
        """Remove and return the head; call only when ``is_due``."""
        assert not self.held and self._queue
        item = self._queue.popleft()
        if item.data is not None:
            self.queued_bytes -= len(item.data)
        return item.data

    def hold(self) -> None:
        self.held = True

    def release(self, now_ns: int, delay_ns: int, jitter_ns: int) -> None:
        """End a hold: everything queued travels again as if sent at ``now_ns``."""
        self.held = False
        for item in self._queue:
            item.release_at_ns = max(item.release_at_ns, self._stamp(now_ns, delay_ns, jitter_ns))
            self._last_release_at_ns = max(self._last_release_at_ns, item.release_at_ns)

    def clear(self) -> None:
        """Discard everything queued (a ``drop`` partition)."""
        self._queue.clear()
        self.queued_bytes = 0

    def __len__(self) -> int:
        return len(self._queue)
