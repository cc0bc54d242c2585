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


class VectorWatermark:
    """What one node knows of every shard's watermark; entries only grow."""

    __slots__ = ("entries", "moves")

    def __init__(self) -> None:
        self.entries: dict[int, int] = {}
        self.moves = 0  # how many times an entry rose: a cheap "has it changed" for observers

    def learn(self, shard: int, watermark: int) -> bool:
        """Raises the entry; True when it moved."""
        if watermark > self.entries.get(shard, 0):
            self.entries[shard] = watermark
            self.moves += 1
            return True
        return False

    def learn_all(self, watermarks: Mapping[int, int]) -> bool:
        moved = False
        for shard, watermark in watermarks.items():
            moved |= self.learn(shard, watermark)
        return moved

    def __getitem__(self, shard: int) -> int:
        return self.entries.get(shard, 0)
