"""Shard and vector watermarks (DESIGN.md §4).

A shard's watermark is the largest counter value ``c`` such that every transaction that
drew a counter value ``<= c`` from that shard is either aborted or durable (its entry
accepted by a majority of the shard's replicas). That definition is what this tracker
implements directly: it keeps the set of counter values drawn and not yet settled, and the
watermark is one below the smallest of them (or the last value drawn when none is
pending). With many transactions in flight per worker installs settle out of counter order;
holding the watermark below the smallest unsettled value is what keeps it right.

Who settles a value: an abort settles it at once; an install settles it when the
replication layer reports the value durable. In a cluster without replication (one region)
an install is durable when it is applied.
"""

from __future__ import annotations

from collections.abc import Mapping

from sortedcontainers import SortedSet

from store.core.epoch import EPOCH_SHIFT, counter_base


class ShardWatermark:
    """Counter and watermark of one shard, as seen by its leader."""

    __slots__ = ("_last_drawn", "_unsettled")

    def __init__(self, start: int = 0) -> None:
        self._last_drawn = start
        self._unsettled: SortedSet = SortedSet()

    @property
    def last_drawn(self) -> int:
        return self._last_drawn

    def draw(self) -> int:
        self._last_drawn += 1
        self._unsettled.add(self._last_drawn)
        return self._last_drawn

    def start_epoch(self, epoch: int) -> None:
        """Counters drawn from now on belong to ``epoch`` (docs/recovery.md). Counters of
        earlier epochs still unsettled keep the watermark below them until settled."""
        self._last_drawn = max(self._last_drawn, counter_base(epoch))

    def settle(self, counter: int) -> None:
        """The transaction that drew ``counter`` aborted or became durable."""
        self._unsettled.discard(counter)

    def is_unsettled(self, counter: int) -> bool:
        return counter in self._unsettled

    @property
    def watermark(self) -> int:
        if self._unsettled:
            smallest: int = self._unsettled[0]
            return smallest - 1
        return self._last_drawn

    def unsettled_count(self) -> int:
        return len(self._unsettled)


def watermark_epoch(watermark: int) -> int:
    """The epoch a shard watermark is in: ``counter_base(e)`` and above, below the next."""
    return watermark >> EPOCH_SHIFT


class VectorWatermark:
    """What one node knows of every shard's watermark; entries only grow.

    A watermark of a later epoch than the node's own is held back (``pending``) until the
    node itself enters that epoch: a node still in epoch ``e`` must never count a counter
    of ``e`` durable because of what a shard that has moved on reports (docs/recovery.md).
    """

    __slots__ = ("entries", "epoch", "moves", "pending")

    def __init__(self) -> None:
        self.entries: dict[int, int] = {}
        self.moves = 0  # how many times an entry rose: a cheap "has it changed" for observers
        self.epoch = 0
        self.pending: dict[int, int] = {}

    def learn(self, shard: int, watermark: int) -> bool:
        """Raises the entry; True when it moved."""
        if watermark >> EPOCH_SHIFT > self.epoch:
            if watermark > self.pending.get(shard, 0):
                self.pending[shard] = watermark
            return False
        if watermark > self.entries.get(shard, 0):
            self.entries[shard] = watermark
            self.moves += 1
            return True
        return False

    def enter_epoch(self, epoch: int) -> bool:
        """The node is now in ``epoch``: what was held back for it counts."""
        assert epoch >= self.epoch
        self.epoch = epoch
        pending, self.pending = self.pending, {}
        moved = False
        for shard, watermark in pending.items():
            moved |= self.learn(shard, watermark)
        return moved

    def learn_all(self, watermarks: Mapping[int, int]) -> bool:
        moved = False
        for shard, watermark in watermarks.items():
            moved |= self.learn(shard, watermark)
        return moved

    def __getitem__(self, shard: int) -> int:
        return self.entries.get(shard, 0)
