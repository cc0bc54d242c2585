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

import heapq
from collections import deque
from collections.abc import Callable, Mapping
from typing import Final, Protocol

from store.core.epoch import EPOCH_SHIFT, counter_base
from store.core.partition import clock_marks
from store.core.vclock import VectorClock


class CounterSource(Protocol):
    """Where a shard's counter values come from. One worker (the default) counts in its own
    process (``ShardWatermark`` keeps the value itself); the ``W`` worker processes of one shard
    draw from one shared counter (``store.rpc._native.SharedCounter``, a fetch-and-add in shared
    memory; ``LocalCounter`` in the simulator, where the workers share a process)."""

    def draw(self) -> int: ...

    def value(self) -> int: ...

    def raise_to(self, floor: int, /) -> int: ...

    def publish(self, slot: int, claim: int, /) -> int: ...

    def idle(self, slot: int, ceiling: int, /) -> None: ...

    def claim(self, slot: int, /) -> int: ...


# Workers of a shard that publish their claims beside the shared counter (SharedCounter's
# claim slots); a shard of more workers gossips them only.
CLAIM_SLOTS: Final = 6


class LocalCounter:
    """A counter source in one process: what the simulator's workers of a shard share. Its
    claim slots behave as SharedCounter's (native/mr_counter.c): a plain claim only grows,
    an idle marker (``-ceiling - 1``) claims the live value up to ``ceiling``, and ``publish``
    replaces a marker."""

    __slots__ = ("_claims", "_value")

    def __init__(self, start: int = 0) -> None:
        self._value = start
        self._claims = [0] * CLAIM_SLOTS

    def publish(self, slot: int, claim: int, /) -> int:
        if not 0 <= slot < CLAIM_SLOTS or claim < 0:
            raise ValueError(f"LocalCounter.publish({slot}, {claim})")
        seen = self._claims[slot]
        self._claims[slot] = claim if seen < 0 else max(seen, claim)
        return self._claims[slot]

    def idle(self, slot: int, ceiling: int, /) -> None:
        if not 0 <= slot < CLAIM_SLOTS or ceiling < 0:
            raise ValueError(f"LocalCounter.idle({slot}, {ceiling})")
        self._claims[slot] = -ceiling - 1

    def claim(self, slot: int, /) -> int:
        claim = self._claims[slot]
        return min(self._value, -claim - 1) if claim < 0 else claim

    def draw(self) -> int:
        self._value += 1
        return self._value

    def value(self) -> int:
        return self._value

    def raise_to(self, floor: int, /) -> int:
        if floor < 0:
            raise ValueError(f"LocalCounter.raise_to({floor}): counters are >= 0")
        self._value = max(self._value, floor)
        return self._value


class WatermarkBoard(Protocol):
    """Where the workers of one shard publish what they know of every shard's watermark, and
    read what their fellows know (``store.rpc._native.SharedWatermarks``, a shared memory
    file with one slot per worker; ``LocalWatermarks`` in the simulator): what any worker of
    the shard hears, in a reply or in gossip, all its fellows know at their next step."""

    def publish(self, slot: int, epoch: int, entries: Mapping[int, int], /) -> None: ...

    def pull(
        self, slot: int, epoch: int, known: list[int], seen: int, /
    ) -> tuple[int, list[tuple[int, int]]] | None: ...


class LocalWatermarks:
    """A watermark board in one process: what the simulator's workers of a shard share. It
    behaves as SharedWatermarks (native/mr_vwshare.c) does between whole writes: a slot holds
    its writer's last ``publish`` (every shard's entry, 0 for one it does not name) with a
    sequence number; ``pull`` answers None while the number is ``seen`` or the writer is in a
    later epoch than the reader, and otherwise the entries above ``known`` (raising it)."""

    __slots__ = ("_slots", "shards")

    def __init__(self, shards: int, slots: int) -> None:
        self.shards = shards
        self._slots: list[tuple[int, int, list[int]]] = [(0, 0, [0] * shards)] * slots

    def publish(self, slot: int, epoch: int, entries: Mapping[int, int], /) -> None:
        values = [0] * self.shards
        for shard, mark in entries.items():
            if not 0 <= shard < self.shards or mark < 0:
                raise ValueError(f"LocalWatermarks.publish: entry {shard}: {mark}")
            values[shard] = mark
        seq = self._slots[slot][0]
        self._slots[slot] = (seq + 2, epoch, values)

    def pull(
        self, slot: int, epoch: int, known: list[int], seen: int, /
    ) -> tuple[int, list[tuple[int, int]]] | None:
        seq, written, values = self._slots[slot]
        if seq == seen or written > epoch:
            return None
        raised = []
        for shard, mark in enumerate(values):
            if mark > known[shard]:
                known[shard] = mark
                raised.append((shard, mark))
        return seq, raised


class ShardWatermark:
    """Counter and watermark of one shard, as seen by its leader (or by one of its workers).

    Values are drawn in increasing order, so the drawn values not yet known settled form a
    queue in drawing order (``_drawn``) with a set beside it (``_unsettled``): settling is a
    set removal, and the watermark drops settled values from the front of the queue, each
    once, so it advances in O(1) amortised time, however far out of order installs settle.

    With a shared ``counter`` (a shard of several workers) this object tracks one worker's
    draws, and ``watermark`` is that worker's claim: every value at or below it that *this
    worker* drew is settled. Values in between were drawn by the other workers, whose claims
    cover them, so the shard's watermark is the minimum of its workers' claims. A worker with
    nothing unsettled claims the shared counter's current value: what it drew is at or below
    it, and what it draws later is above it (the counter only grows). That is how an idle
    worker never holds its shard back.
    """

    __slots__ = (
        "_counter", "_drawn", "_epoch_end", "_idle_slot", "_last_drawn", "_published",
        "_unsettled", "on_draw",
    )

    def __init__(self, start: int = 0, counter: CounterSource | None = None) -> None:
        self._counter = counter
        # The last value of this worker's epoch: a shared counter may already be in the
        # next one (a fellow worker entered it first), and an idle worker's claim goes on
        # its stream in entries of its own epoch (``watermark``).
        self._epoch_end = counter_base((start >> EPOCH_SHIFT) + 1) - 1
        # The simulator's durability oracle watches every value drawn (None in production).
        self.on_draw: Callable[[int], None] | None = None
        self._last_drawn = start if counter is None else counter.raise_to(start)
        self._unsettled: set[int] = set()
        self._drawn: deque[int] = deque()
        # Claims in the shared counter's slot (``share_claim``): the slot while an idle
        # marker stands there (None: a plain claim, or nothing published), and the largest
        # plain claim published.
        self._idle_slot: int | None = None
        self._published = 0

    @property
    def last_drawn(self) -> int:
        """The last value this worker drew (one worker: the shard's counter)."""
        return self._last_drawn

    def draw(self) -> int:
        shared = self._counter
        if shared is None:
            counter = self._last_drawn = self._last_drawn + 1
        else:
            slot = self._idle_slot
            if slot is not None:
                # Idle no more: a plain claim replaces the marker BEFORE the draw, so that
                # no fellow reads the live value as this worker's claim once it is above a
                # value this worker holds unsettled (native/mr_counter.c, "Idle claims").
                self._idle_slot = None
                self._published = shared.publish(slot, min(shared.value(), self._epoch_end))
            counter = self._last_drawn = shared.draw()
        self._unsettled.add(counter)
        self._drawn.append(counter)
        if self.on_draw is not None:
            self.on_draw(counter)
        return counter

    def raise_floor(self, floor: int) -> None:
        """Values drawn from now on are above ``floor``: another worker of the shard claims
        it (``VectorWatermark.shard_top``). With a shared counter that is so already; a
        worker counting alone (one promoted in another region by a failover) jumps ahead,
        so that once idle it claims as much as its busiest fellow and does not hold its
        shard's watermark back."""
        if self._counter is None:
            self._last_drawn = max(self._last_drawn, floor)
        else:
            self._counter.raise_to(floor)

    def start_epoch(self, epoch: int) -> None:
        """Counters drawn from now on belong to ``epoch`` (docs/recovery.md). Counters of
        earlier epochs still unsettled keep the watermark below them until settled."""
        self._epoch_end = counter_base(epoch + 1) - 1
        if self._counter is None:
            self._last_drawn = max(self._last_drawn, counter_base(epoch))
        else:
            self._counter.raise_to(counter_base(epoch))
            if self._idle_slot is not None:  # idle up to the new epoch's end
                self._counter.idle(self._idle_slot, self._epoch_end)

    def beyond_epoch(self) -> bool:
        """Whether the shared counter is already in a later epoch than this worker's: a
        fellow has entered an epoch this worker has not heard of yet. It must not certify
        until it has: a value it drew now would belong to an epoch it is not in, and its
        stream would end this epoch without it (the value neither durable nor of an epoch
        that ended where it was drawn)."""
        counter = self._counter
        return counter is not None and counter.value() > self._epoch_end

    def detach(self, ceiling: int) -> None:
        """Stops following a shared counter (a retired worker): from now on this worker
        counts alone, from where the shared counter is, but never above ``ceiling`` (the
        base of the epoch in which another leader took its unit over)."""
        shared = self._counter
        if shared is not None:
            if self._idle_slot is not None:
                # A plain claim in the marker's place: the live value is no longer its claim.
                shared.publish(self._idle_slot, min(shared.value(), self._epoch_end))
                self._idle_slot = None
            self._last_drawn = max(self._last_drawn, min(shared.value(), ceiling))
            self._counter = None

    def share_claim(self, slot: int, durable: int | None = None) -> None:
        """Publishes this worker's claim in the shared counter's ``slot``. With replication
        the claim is ``durable``, its stream's chosen stamp, published when it rose. Without
        (``durable`` None), where a claim is durable once made: with nothing unsettled an
        idle marker, once (its fellows then read the live value as its claim, up to its
        epoch's end, however much they draw meanwhile); else its watermark. A worker without
        replication must publish here at the end of each step, and ``draw`` replaces the
        marker before drawing."""
        shared = self._counter
        assert shared is not None
        if durable is not None:
            if durable > self._published:
                self._published = shared.publish(slot, durable)
            return
        if not self._unsettled:
            if self._idle_slot is None:
                shared.idle(slot, self._epoch_end)
                self._idle_slot = slot
            return
        assert self._idle_slot is None, "a value drawn while the idle marker stood"
        mark = self.watermark
        if mark > self._published:
            self._published = shared.publish(slot, mark)

    def settle(self, counter: int) -> None:
        """The transaction that drew ``counter`` aborted or became durable."""
        self._unsettled.discard(counter)

    def is_unsettled(self, counter: int) -> bool:
        return counter in self._unsettled

    @property
    def watermark(self) -> int:
        drawn, unsettled = self._drawn, self._unsettled
        while drawn:
            smallest = drawn[0]
            if smallest in unsettled:
                return smallest - 1
            drawn.popleft()
        if self._counter is None:
            return self._last_drawn
        # Idle: the shared value, but never beyond this worker's epoch (its claim goes on
        # its stream in entries of its epoch).
        return min(self._counter.value(), self._epoch_end)

    def unsettled_count(self) -> int:
        return len(self._unsettled)


class ClockWaits:
    """What waits until a vector clock is at or below the vector watermark: a coordinator's
    certified transactions waiting to be told COMMITTED, and a participant's hidden writes
    (speculation off) waiting to be revealed. One index serves both.

    A waiter is filed under the first shard whose watermark its clock is above, in a heap
    by the counter it needs there, so a moving watermark only looks at what it can release;
    a waiter released there is filed again under its next blocking shard, or called. A
    waiter cancelled meanwhile is not removed: its callback finds it has nothing to do.
    """

    __slots__ = ("_entries", "_heaps", "_next")

    def __init__(self, entries: Mapping[int, int]) -> None:
        self._entries = entries  # the vector watermark's live entries
        self._heaps: dict[int, list[tuple[int, int, VectorClock, Callable[[], None]]]] = {}
        self._next = 0

    def wait(self, vc: VectorClock, then: Callable[[], None]) -> bool:
        """Files ``then`` to be called once ``vc`` is under the watermark; False (nothing
        filed) if it is already."""
        entries = self._entries
        for shard, counter in vc.items():
            if counter > entries.get(shard, 0):
                self._next += 1
                heap = self._heaps.get(shard)
                if heap is None:
                    heap = self._heaps[shard] = []
                heapq.heappush(heap, (counter, self._next, vc, then))
                return True
        return False

    def release(self, shard: int | None = None) -> None:
        """Calls every waiter now under the watermark. ``shard``: only that shard's entry
        moved (None: any may have)."""
        heaps = self._heaps
        if not heaps:
            return
        entries = self._entries
        for blocked in list(heaps) if shard is None else (shard,):
            heap = heaps.get(blocked)
            if heap is None:
                continue
            mark = entries.get(blocked, 0)
            while heap and heap[0][0] <= mark:
                _, _, vc, then = heapq.heappop(heap)
                if not self.wait(vc, then):
                    then()
            if not heap:
                heaps.pop(blocked, None)

    def __len__(self) -> int:
        return sum(len(heap) for heap in self._heaps.values())


def watermark_epoch(watermark: int) -> int:
    """The epoch a shard watermark is in: ``counter_base(e)`` and above, below the next."""
    return watermark >> EPOCH_SHIFT


class VectorWatermark:
    """What one node knows of every shard's watermark; entries only grow.

    A watermark of a later epoch than the node's own is held back (``pending``) until the
    node itself enters that epoch: a node still in epoch ``e`` must never count a counter
    of ``e`` durable because of what a shard that has moved on reports (docs/recovery.md).

    With ``workers`` > 1 (``store.core.partition.WorkerPartitioner``) what nodes report is
    per **unit** (one worker of one shard): its claim, every value at or below it that the
    unit drew is settled (``ShardWatermark``). ``claims`` keeps the largest claim heard of
    each unit, and a shard's entry is the minimum over its units' claims: every value at or
    below it that any of its workers drew is settled, which is the shard watermark's
    definition. ``learn`` and ``learn_all`` take unit claims; ``learn_clocks`` takes whole
    shards' watermarks (a clock's entries), each of which vouches for every unit of its shard,
    and so raises their claims too. With one worker a unit is its shard and both are one.
    """

    __slots__ = ("claims", "entries", "epoch", "moves", "pending", "tops", "workers")

    def __init__(self, workers: int = 1) -> None:
        assert workers >= 1
        self.workers = workers
        self.entries: dict[int, int] = {}
        # Per unit (workers > 1): the largest claim heard. One worker: the entries themselves.
        self.claims: dict[int, int] = self.entries if workers == 1 else {}
        # Per shard (workers > 1): the largest claim of any of its units (``shard_top``).
        self.tops: dict[int, int] = {}
        self.moves = 0  # how many times an entry or claim rose: "has it changed" for observers
        self.epoch = 0
        self.pending: dict[int, int] = {}  # by unit

    def learn(self, unit: int, watermark: int) -> bool:
        """Raises a unit's claim (one worker: the shard's entry); True when an entry moved."""
        if watermark >> EPOCH_SHIFT > self.epoch:
            if watermark > self.pending.get(unit, 0):
                self.pending[unit] = watermark
            return False
        claims = self.claims
        old = claims.get(unit, 0)
        if watermark <= old:
            return False
        claims[unit] = watermark
        self.moves += 1
        workers = self.workers
        if workers == 1:
            return True
        shard = unit // workers
        if watermark > self.tops.get(shard, 0):
            self.tops[shard] = watermark
        entry = self.entries.get(shard, 0)
        if old > entry:
            return False  # another unit's claim is the least, and it has not moved
        first = shard * workers
        low = watermark
        for fellow in range(first, first + workers):  # a loop: this is the hot path
            claim = claims.get(fellow, 0)
            if claim < low:  # noqa: PLR1730 (a compare, not a call to min: the hot path)
                low = claim
        if low > entry:
            self.entries[shard] = low
            return True
        return False

    def learn_clocks(self, watermarks: Mapping[int, int]) -> bool:
        """Raises whole shards' entries (keyed by shard, as a vector clock is)."""
        workers = self.workers
        if workers == 1:
            return self.learn_all(watermarks)
        moved = False
        for shard, watermark in watermarks.items():
            for w in range(workers):
                moved |= self.learn(shard * workers + w, watermark)
        return moved

    def learn_entries(self, entries: Mapping[int, int], epoch: int) -> bool:
        """Raises shards' entries as a peer in ``epoch`` knows them (gossip). With workers,
        only once this node is in ``epoch`` or later: an entry is the least of its units'
        claims, and a claim of a later epoch than the node's is held back (``pending``),
        but an entry hides which claims it rests on. One whose value is of an earlier epoch
        can rest on a later epoch's claim: a worker's first claim after a failover vouches
        for the rollback of what it drew above the ended epoch's FVW, which a node still in
        that epoch must not take as durable (tests/sim/test_workers.py). An epoch behind,
        the node takes the next gossip instead. One worker: entries are claims, each held
        back by its own epoch."""
        if self.workers > 1 and epoch > self.epoch:
            return False
        return self.learn_clocks(entries)

    def enter_epoch(self, epoch: int) -> bool:
        """The node is now in ``epoch``: what was held back for it counts."""
        assert epoch >= self.epoch
        self.epoch = epoch
        pending, self.pending = self.pending, {}
        moved = False
        for unit, watermark in pending.items():
            moved |= self.learn(unit, watermark)
        return moved

    def learn_all(self, watermarks: Mapping[int, int]) -> bool:
        """Raises units' claims (a peer's ``claims``, as gossip carries them)."""
        moved = False
        for unit, watermark in watermarks.items():
            moved |= self.learn(unit, watermark)
        return moved

    def shard_top(self, shard: int) -> int:
        """The largest claim heard of any unit of ``shard`` (0: none). A worker raises its
        counter's floor to it: claims of a fellow counting alone (one a failover promoted
        elsewhere) can pass the shared counter. Its own claim is among them, but is never
        above what it drew, so the floor it sets is the fellows' top or a no-op."""
        return self.tops.get(shard, 0)

    def __getitem__(self, shard: int) -> int:
        return self.entries.get(shard, 0)


def clock_watermark(marks: Mapping[int, int], workers: int) -> dict[int, int]:
    """Units' watermarks (a finalized vector watermark of the configuration manager, which
    counts units as shards) as a shard's: the minimum over its units, each of which must be
    known."""
    shards = clock_marks(marks, workers)
    assert all(unit // workers in shards for unit in marks), f"a shard's units missing: {marks}"
    return shards
