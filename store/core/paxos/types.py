"""Values shared by the roles of a Paxos stream: ballots, entries, settings, ``StreamReady``.

An entry is what one slot of a stream holds (DESIGN.md §4): a batch of certified
transaction records, or one of three markers. A heartbeat
is a batch with no records; it exists so an idle stream's chosen prefix, and with it the
followers' view of the stream, keeps moving. A no-op fills a hole found by a new leader; an
INF marker ends an epoch on the stream (DESIGN.md §5). Entries are immutable once built.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from store.core.settings import DEFAULT_STREAM_SETTINGS as _DEFAULT_STREAM_SETTINGS
from store.core.settings import StreamSettings as _StreamSettings
from store.core.vclock import EMPTY, VectorClock

MS: Final = 1_000_000  # nanoseconds per millisecond


class Ballot(NamedTuple):
    """A proposal number: ordered by round, then by the proposer's address (unique per node).

    ``Ballot(0, "")`` is below every real ballot; acceptors start promised to it.
    """

    round: int
    leader: str


ZERO_BALLOT: Final = Ballot(0, "")


class EntryKind(enum.IntEnum):
    BATCH = 0  # certified transaction records; a heartbeat is a BATCH with none
    NOOP = 1  # a hole filled by a new leader: the old leader's stream is void from here
    INF = 2  # the end of an epoch on this stream


class Entry:
    """One slot's value.

    ``records`` are opaque msgpack-able values (the replica's certified transactions, each
    with its own vector clock) and ``counters[i]`` is the shard counter that ``records[i]``
    drew; ``counter_max`` is the max of ``counters`` (0 when empty). An entry carries no
    clock of its own: the batch's max clock (DESIGN.md's "plus the batch's max vector clock")
    is the merge of its records' clocks, which every receiver has, and nothing needs it
    (followers replay record by record); it cost a third to a half of the stream's clock
    bytes. ``watermark`` is the stream watermark the leader's replica promised when the
    entry was closed: every counter at or below it that this stream will ever carry is in
    this entry or an earlier one (see ``StreamLeader.advance_watermark``). ``vw`` is the
    leader replica's vector watermark when the entry was closed: followers learn the other
    shards' watermarks from it, in stream order (``StreamLeader.advance_vector_watermark``).
    ``epoch`` is the epoch the leader was in when it closed the entry (DESIGN.md §5): a
    marker ends that epoch on the stream, entries of a later epoch begin the next one.
    """

    __slots__ = ("counter_max", "counters", "epoch", "kind", "records", "vw", "watermark")

    def __init__(
        self,
        kind: EntryKind,
        records: Sequence[Any] = (),
        counters: Sequence[int] = (),
        watermark: int = 0,
        vw: VectorClock = EMPTY,
        epoch: int = 0,
    ) -> None:
        assert len(records) == len(counters), "one counter per record"
        assert kind == EntryKind.BATCH or not records, "markers carry no records"
        self.kind = kind
        self.records: tuple[Any, ...] = tuple(records)
        self.counters: tuple[int, ...] = tuple(counters)
        self.counter_max = max(self.counters, default=0)
        self.watermark = watermark
        self.vw = vw
        self.epoch = epoch

    @property
    def is_heartbeat(self) -> bool:
        return self.kind == EntryKind.BATCH and not self.records

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Entry)
            and self.kind == other.kind
            and self.records == other.records
            and self.counters == other.counters
            and self.watermark == other.watermark
            and self.vw == other.vw
            and self.epoch == other.epoch
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        if self.kind != EntryKind.BATCH:
            return f"Entry({self.kind.name}, epoch={self.epoch})"
        return (
            f"Entry(records={len(self.records)}, counter_max={self.counter_max}, "
            f"watermark={self.watermark}, epoch={self.epoch})"
        )


NOOP: Final = Entry(EntryKind.NOOP)
INF: Final = Entry(EntryKind.INF)


# The stream's settings are a plain value (store.core.settings), so that a cluster file's
# [stream] section is checked without loading Paxos; re-exported here for the stream.
StreamSettings = _StreamSettings
DEFAULT_STREAM_SETTINGS: Final = _DEFAULT_STREAM_SETTINGS


@dataclass(slots=True)
class StreamReady:
    """What a stream role wants done, handed back by ``ready()`` (the etcd-raft pattern).

    * ``persist``: what the acceptor's state gained (a Prepare records a promise, an Accept
      an accepted value): written and synced to stable storage BEFORE any of ``messages``
      is sent (a Promise or Accepted must never leave before the state it reports is
      durable). A replica without a disk drops them (acceptors in memory).
    * ``messages``: ``(destination address, message)`` to send, in this order; the protocol
      tolerates loss, duplication and reordering of every message.
    * ``chosen``: ``(slot, entry)`` pairs newly known chosen, in increasing slot order with
      no gap, each slot exactly once over the life of the object (the leader reports what it
      saw chosen; a learner what it delivers). The replica applies them in this order.
    * ``wake_at``: the time (ns) at which ``tick`` must next be called, or None.
    """

    messages: list[tuple[str, Any]] = field(default_factory=list)
    chosen: list[tuple[int, Entry]] = field(default_factory=list)
    wake_at: int | None = None
    persist: list[Any] = field(default_factory=list)  # Prepare / Accept records (above)


@dataclass(frozen=True, slots=True)
class Finalized:
    """The stream watermark over a chosen prefix, and whether the epoch has ended in it.

    ``watermark``: the largest ``Entry.watermark`` in the prefix before the first no-op or
    INF marker (0 if none). ``end_slot``: the slot of that first no-op or INF, or None when
    the prefix holds neither, in which case the watermark may still grow.
    """

    watermark: int
    end_slot: int | None

    @property
    def final(self) -> bool:
        return self.end_slot is not None


def finalized_watermark(chosen: Iterable[tuple[int, Entry]], first_slot: int = 0) -> Finalized:
    """The finalized watermark of a stream's epoch (DESIGN.md §5 step 4), deterministically.

    ``chosen`` is the chosen prefix of the epoch as ``(slot, entry)`` in slot order from
    ``first_slot`` with no gap (what a leader or learner reported). Everything after the
    first no-op is void, because a lost slot may hold transactions that later ones depend
    on; an INF marker closes the epoch the same way. The result depends only on the chosen
    values, so any replica recomputes the same number.
    """
    watermark = 0
    expected = first_slot
    for slot, entry in chosen:
        assert slot == expected, f"chosen prefix has a gap at slot {expected}"
        expected += 1
        if entry.kind != EntryKind.BATCH:
            return Finalized(watermark, slot)
        watermark = max(watermark, entry.watermark)
    return Finalized(watermark, None)
