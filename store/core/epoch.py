"""Epochs: counters that carry their epoch, and a stream's epochs (DESIGN.md §5).

Counters. Every shard counter carries its epoch in its high bits: in epoch ``e`` a shard
draws ``counter_base(e) + 1``, ``+ 2``, ... So a counter, a watermark and every entry of a
vector clock say which epoch they belong to; every counter of a later epoch is larger than
every counter of an earlier one; and a new leader never needs to know how far its dead
predecessor counted. Epoch 0 counts from 1, as before recovery existed.

A stream's epochs (``StreamEpochs``). A shard's Paxos stream is a sequence of epochs. A
marker (a no-op, or INF) of epoch ``m`` ends every epoch up to ``m`` on that stream;
everything after it that belongs to an epoch ``<= m`` is void (a no-op fills a hole whose
transactions may be what later ones depended on; INF is the end a leader chose). Walking
the chosen entries in slot order, an entry of epoch ``x`` is **valid** iff ``x`` is above
every marker seen so far. The **finalized watermark** of epoch ``e`` is known once a marker
of an epoch ``>= e`` is chosen; it is the largest watermark of the valid batch entries of
epochs ``<= e`` (watermarks only grow along a stream, so it is cumulative). It depends only
on chosen values: every replica that has the chosen prefix computes the same number
(``paxos.finalized_watermark`` is the one-epoch special case).
"""

from __future__ import annotations

from typing import Final

from store.core.paxos import Entry, EntryKind

EPOCH_SHIFT: Final = 40
EPOCH_MAX: Final = (1 << (63 - EPOCH_SHIFT)) - 1


def counter_base(epoch: int) -> int:
    """Counters of ``epoch`` are above this and at or below ``counter_base(epoch + 1)``."""
    assert 0 <= epoch <= EPOCH_MAX
    return epoch << EPOCH_SHIFT


def format_counter(counter: int) -> str:
    """A counter or watermark as people read it, ``epoch:n`` (a base reads ``epoch:0``)."""
    return f"{counter >> EPOCH_SHIFT}:{counter & ((1 << EPOCH_SHIFT) - 1)}"


def epoch_of(counter: int) -> int:
    """The epoch a counter (or watermark) belongs to; a base belongs to the epoch before."""
    return max(0, counter - 1) >> EPOCH_SHIFT


class StreamEpochs:
    """Which chosen entries of one stream are valid, and each ended epoch's finalized
    watermark (see the module doc). Feed it every chosen entry in slot order."""

    __slots__ = ("ended", "finalized", "valid_watermark")

    def __init__(self) -> None:
        self.ended = -1  # every epoch up to this one has ended on the stream
        self.valid_watermark = 0  # the largest watermark of a valid batch so far
        self.finalized: dict[int, int] = {}

    def is_valid(self, entry: Entry) -> bool:
        return entry.epoch > self.ended

    def add(self, entry: Entry) -> bool:
        """Takes the next chosen entry; True if it is valid (a batch to apply)."""
        if entry.epoch <= self.ended:
            return False  # void: its epoch already ended on this stream
        if entry.kind == EntryKind.BATCH:
            self.valid_watermark = max(self.valid_watermark, entry.watermark)
            return True
        for epoch in range(self.ended + 1, entry.epoch + 1):
            self.finalized[epoch] = self.valid_watermark
        self.ended = entry.epoch
        return False

    def copy(self) -> StreamEpochs:
        copied = StreamEpochs()
        copied.ended = self.ended
        copied.valid_watermark = self.valid_watermark
        copied.finalized = dict(self.finalized)
        return copied

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StreamEpochs) and (
            self.ended, self.valid_watermark, self.finalized
        ) == (other.ended, other.valid_watermark, other.finalized)

    __hash__ = None  # type: ignore[assignment]

    def finalized_watermark(self, epoch: int) -> int | None:
        """The finalized watermark of ``epoch``, once it has ended on this stream."""
        return self.finalized.get(epoch)
