"""The participant side of certification at one shard leader (DESIGN.md §3).

Theory of operation. A coordinator drives each transaction through, at most, three rounds
with every participant shard:

1. **lock** the shard's part of the write set, all or nothing, without waiting: a key
   locked by another transaction fails the round. On success the shard draws the next value
   of its counter (the lock and clock rounds merged: the value is drawn while the locks are
   held, so no later reader of these writes can get a smaller clock).
2. **validate** the shard's part of the read set once every shard holds its locks: each
   version read must still be the newest, and no key read (or in a scanned range) may be
   locked by another transaction. Validation is stateless: it holds at any moment while
   the locks of the transaction are held, so a retransmitted request may be re-evaluated.
3. **install** the writes as new versions tagged with the transaction's vector clock and
   the epoch, release the locks and hand the counter to the durability layer; or **abort**:
   release the locks and settle the counter as aborted.

Dependencies beyond reads. A transaction's vector clock must dominate the clock of every
transaction it depends on in any way — not only those it read from (write-read), but also
those whose versions it overwrites (write-write) and those that read what it overwrites
(read-write anti-dependencies) — so that the set of transactions at or below any vector
watermark is closed under every dependency: a follower's snapshot at that watermark is then
a consistent cut (DESIGN.md §4), and recovery rolls back everything that depended on a lost
transaction (§5). Write-write: the lock round returns the clocks of the versions the writes
will overwrite. Read-write: a successful validation stamps the transaction's clock on the
version it read (``Version.stamp``; on the key itself while it has no version, and on the
tables it scanned); a later lock on those keys returns the stamps. A reader that validates
after a writer locked the key fails instead (the key is locked), so either the stamp is
there when the writer locks, or the reader aborts. Only the newest version's stamp
matters: a writer that overwrites it dominates the stamp, and every later writer of the key
dominates that writer.

Every request is idempotent: a retransmitted lock gets the same counter, a retransmitted
install is acknowledged, and a lock that arrives after its abort (reordering) is refused,
because finished transactions are remembered (a bounded number of them).

A transaction whose reads and writes are all on this shard is certified in one step
(``certify_solo``): the same checks, done atomically, with no remote round at all.

Epochs (docs/recovery.md). Every request names its transaction's epoch; a participant in
another epoch refuses it. When the participant enters a new epoch (``begin_epoch``) it
aborts, on its own, every older transaction still holding locks here, and leaves their
counters unsettled in the old epoch (recovery then rolls those transactions back wherever
they installed). Until an ended epoch's FVW is known, a version of that epoch whose clock
is not at or below the vector watermark frozen when it ended is *in doubt*: a transaction
that read one fails validation, one that would overwrite one fails its lock.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from itertools import islice
from typing import Any, Final, Literal

from store.core.oplist import OpList
from store.core.partition import table_of
from store.core.settings import Settings
from store.core.storage import CERTIFIED, HIDDEN, Version, VersionedStore
from store.core.vclock import EMPTY, VectorClock
from store.core.watermark import ClockWaits, ShardWatermark
from store.protocol.messages import (
    PREPARE_CONFLICT,
    PREPARE_OK,
    ReadItem,
    RecordedScan,
    ScanRange,
    Write,
)

LOCKED: Final = 1
INSTALLED: Final = 2
ABORTED: Final = 3

# ``run_local``'s snapshot when the newest versions are read (any list that writes).
NO_SNAPSHOT: Final = -1

# The durability layer is told of every install: (txn_id, counter, writes, vc). It settles
# the counter in the shard watermark once the writes are durable.
OnInstalled = Callable[[int, int, list[Write], VectorClock], None]


def _same(clock: VectorClock) -> VectorClock:
    return clock


def _raise_into(clock: dict[int, int], entries: Mapping[int, int]) -> None:
    """Raises ``clock`` (a clock being built, entry-wise) to ``entries``."""
    for shard, counter in entries.items():
        if counter > clock.get(shard, 0):
            clock[shard] = counter


class _Held:
    __slots__ = ("counter", "deps", "epoch", "keys", "prepared", "voted")

    def __init__(self, keys: list[str], counter: int, deps: VectorClock, epoch: int) -> None:
        self.keys = keys
        self.counter = counter
        self.deps = deps
        self.epoch = epoch
        self.voted = False  # validated here: the coordinator may have decided to commit
        # A transaction prepared here (``prepare``): what it read, for a retransmission.
        self.prepared: list[ReadItem] | None = None


# Participant.prepare's answers (the wire's PrepareReply.status values).
PREPARED: Final = PREPARE_OK
REFUSED: Final = PREPARE_CONFLICT


def covered_range(lo: str, hi: str, limit: int, seen: list[tuple[str, int]]) -> tuple[str, str, bool]:
    """The keys a scan's result speaks for, as ``(start, end, end included)``: all of
    ``[lo, hi)``, unless its limit cut it short; then up to its last key, or for a reverse
    scan (a negative limit) down to it. A lock inside that range means a writer may change
    what the scan saw; beyond it, nothing the scan returned depends on."""
    if len(seen) < abs(limit):
        return lo, hi, False
    last = seen[-1][0]
    if limit < 0:
        return last, hi, False
    return lo, last, True


class Participant:
    def __init__(
        self,
        shard: int,
        store: VersionedStore,
        watermark: ShardWatermark,
        settings: Settings,
        on_installed: OnInstalled,
        breaks: frozenset[str] = frozenset(),
        vector_watermark: Mapping[int, int] | None = None,
        waits: ClockWaits | None = None,
    ) -> None:
        self.shard = shard  # the vector-clock entry of its counter values
        # A worker of a shard of several (docs/design.md, "Workers") draws above what the
        # keys it writes depend on on its shard's entry: the counter it draws from may be
        # its own (a worker promoted alone by a failover), behind the one its fellows
        # draw from, and a write must stay above what it overwrites on its shard's entry
        # (the replay's Thomas write rule compares that entry).
        self.floor_on_deps = False
        # Snapshot reads (``run_local``'s snapshot): whether this shard takes them for the
        # read-only lists it runs alone (not a worker of a shard of several, whose own
        # watermark is not its shard's: the replica turns them off). Versions in doubt, a
        # takeover and speculation off keep every list off the short path anyway.
        self.snapshots = settings.snapshot_reads and settings.speculation
        self.store = store
        self.watermark = watermark
        self.settings = settings
        self._on_installed = on_installed
        self._held: dict[int, _Held] = {}
        # (expires at, txn id) of held locks not yet known to have voted (lazy: checked on pop).
        self._expiries: list[tuple[int, int]] = []
        self.expired = 0  # transactions aborted here because their locks expired
        self._finished: OrderedDict[int, tuple[int, int]] = OrderedDict()
        # Clocks of recent solo certifications, so a retransmitted solo request is answered
        # with the first outcome.
        self._solo_vcs: OrderedDict[int, tuple[VectorClock, VectorClock]] = OrderedDict()
        # Read-write dependency stamps of keys with no version (a read found nothing) and of
        # scanned tables; stamps of versions live on them (``Version.stamp``). Entries at or
        # below the vector watermark carry nothing and are dropped by garbage collection.
        self._absent_stamps: dict[str, VectorClock] = {}
        self._scan_stamps: dict[str, VectorClock] = {}
        # What every writer here must dominate because stamps were lost: a leader that took
        # a stream over rebuilt its store by replay, which carries no stamps of the readers
        # its predecessor validated (``readers_unknown``).
        self._stamp_floor: VectorClock = EMPTY
        # Speculation off: installed transactions whose versions stay hidden and whose locks
        # stay held until they commit. txn_id -> (vc, keys); a heap per blocking shard.
        self._speculation = settings.speculation
        self._vector_watermark: Mapping[int, int] = (
            vector_watermark if vector_watermark is not None else {}
        )
        self._hidden: dict[int, tuple[VectorClock, list[str], int]] = {}
        self._waits = waits if waits is not None else ClockWaits(self._vector_watermark)
        # Epochs (docs/recovery.md): the current one, and per ended epoch whose FVW is not
        # known yet, the vector watermark frozen when it ended.
        self.epoch = 0
        self._doubt: dict[int, dict[int, int]] = {}
        # False while a new leader is still taking its stream over: what a majority had
        # accepted from the old leader is not all replayed here yet, so nothing is
        # certified against this store (lock, validate and solo certification refuse).
        self.certifying = True
        # Switches that turn one safety step off; only the simulator's --break uses them, to
        # show that the checkers catch what each step prevents.
        self._skip_validation = "validation" in breaks
        self._skip_locking = "locking" in breaks

    # ---- reads ---------------------------------------------------------------------------

    def read(self, keys: Iterable[str], sparse: bool = False) -> list[ReadItem]:
        """The newest version of each key. ``sparse`` (an answer to another shard): each
        version's clock without the entries this shard knows durable (``_sparse``)."""
        items: list[ReadItem] = []
        store = self.store
        for key in keys:
            version = store.latest(key)
            if version is None:
                items.append((key, 0, None, False, EMPTY, 0))
            else:
                value = None if version.deleted else version.value
                vc = self._sparse(version.vc) if sparse else version.vc
                items.append((key, version.vid, value, version.deleted, vc, version.txn_id))
        return items

    def scan(self, lo: str, hi: str, limit: int, sparse: bool = False) -> list[ReadItem]:
        clock = self._sparse if sparse else _same
        return [
            (key, v.vid, v.value, False, clock(v.vc), v.txn_id)
            for key, v in self.store.scan(lo, hi, limit)
        ]

    def scan_many(self, scans: Iterable[ScanRange], sparse: bool = False) -> list[list[ReadItem]]:
        return [self.scan(lo, hi, limit, sparse) for lo, hi, limit in scans]

    # ---- certification -------------------------------------------------------------------

    def lock(
        self, txn_id: int, keys: list[str], epoch: int | None = None, now_ns: int | None = None
    ) -> tuple[bool, int, VectorClock]:
        """Locks ``keys`` for ``txn_id`` and draws a counter; (ok, counter, dependencies).
        With ``now_ns``, the locks expire ``lock_timeout_ns`` later unless the transaction
        has voted by then (``expire``)."""
        held = self._held.get(txn_id)
        if held is not None:
            return True, held.counter, held.deps
        finished = self._finished.get(txn_id)
        if finished is not None:
            state, counter = finished
            return state == INSTALLED, counter, EMPTY
        epoch = self.epoch if epoch is None else epoch
        if (
            epoch != self.epoch
            or not self.certifying
            or self.watermark.beyond_epoch()
            or (self._doubt and self._any_in_doubt(keys))
        ):
            return False, 0, EMPTY
        if not self._skip_locking and not self.store.try_lock_all(keys, txn_id):
            return False, 0, EMPTY
        deps = self.dependencies(keys)
        if self.floor_on_deps:
            self.watermark.raise_floor(deps[self.shard])
        counter = self.watermark.draw()
        # Entries this shard knows durable carry nothing (DESIGN.md §4), and the versions
        # overwritten keep the clocks they were certified with, durable entries and all.
        deps = self._sparse(deps)
        self._held[txn_id] = _Held(keys, counter, deps, epoch)
        if now_ns is not None and self.settings.lock_timeout_ns > 0:
            heapq.heappush(self._expiries, (now_ns + self.settings.lock_timeout_ns, txn_id))
        return True, counter, deps

    def prepare(
        self, txn_id: int, reads: list[str], locks: list[str], base: VectorClock, epoch: int
    ) -> tuple[int, int, list[ReadItem], VectorClock]:
        """The first round of the coordinator's prepared path for an operation list: locks
        ``locks`` and draws a counter (if any), reads ``reads``, checks that no key it only
        reads is locked by another transaction, and votes yes, all in one step. Returns
        (PREPARED or REFUSED, counter, items read, dependencies of the locks). An item of a
        key also locked here goes without its clock: that clock is in the dependencies.

        Why one step is enough on two shards (the pair path). The coordinator locked its
        own shard's writes before it sent this, so every lock of the transaction is held
        now: the reads made here are validated at a moment when all its locks are held (the
        rule of module doc, step 2), and the coordinator validates its own reads after this
        reply. ``base`` is the coordinator's whole part of the clock, so the clock is known
        here too, and the keys only read are stamped with it at once; a writer that locks
        them later sees the stamp. On three shards or more neither holds (another shard may
        not have locked yet, and its counter is not in ``base``, which is then empty): keys
        read here under this transaction's own locks need nothing more, and the coordinator
        validates the keys only read here in a second round, stamping the whole clock
        (``Coordinator._validate_only_read``). A transaction that locked nothing here holds
        nothing after this call: there is nothing to install or abort here, and a
        retransmission simply reads again.

        Once prepared the transaction has voted: its locks do not expire; only an install,
        an abort or the end of its epoch releases them."""
        held = self._held.get(txn_id)
        if held is not None:
            assert held.prepared is not None, "a transaction both locked and prepared"
            return PREPARED, held.counter, held.prepared, held.deps
        finished = self._finished.get(txn_id)
        if finished is not None:
            # Decided already (the coordinator has moved on and ignores this answer), or
            # aborted here: a late retransmission must not lock again.
            return (PREPARED if finished[0] == INSTALLED else REFUSED), finished[1], [], EMPTY
        if (
            epoch != self.epoch
            or not self.certifying
            or self.watermark.beyond_epoch()
            or (self._doubt and (self._any_in_doubt(reads) or self._any_in_doubt(locks)))
        ):
            return REFUSED, 0, [], EMPTY
        store = self.store
        if locks and not self._skip_locking and not store.try_lock_all(locks, txn_id):
            return REFUSED, 0, [], EMPTY
        locked = set(locks)
        only_read = [key for key in reads if key not in locked]
        if (
            only_read
            and not (self._skip_validation or self._skip_locking)
            and store.locked_by_other(only_read, txn_id)
        ):
            if locks and not self._skip_locking:
                store.unlock_all(locks, txn_id)
            return REFUSED, 0, [], EMPTY
        items = self.read(reads, sparse=True)
        counter = 0
        deps = EMPTY
        if locks:
            deps = self.dependencies(locks)
            if self.floor_on_deps:
                self.watermark.raise_floor(deps[self.shard])
            counter = self.watermark.draw()
            deps = self._sparse(deps)  # as ``lock`` does
        if only_read:
            full = base.merge(deps)
            for item in items:
                if item[1]:
                    full = full.merge(item[4])
            if counter:
                full = full.with_entry(self.shard, counter)
            vc = self._sparse(full)
            if vc.entries:
                self.stamp_reads(((key, 0) for key in only_read), (), vc)
        if locks and len(only_read) < len(items):
            # A key read and locked here: its version's clock is in ``deps`` already (the
            # version it overwrites), so the item goes without it (fewer bytes on the wire).
            items = [
                (key, vid, value, deleted, EMPTY, writer) if key in locked
                else (key, vid, value, deleted, vc_read, writer)
                for key, vid, value, deleted, vc_read, writer in items
            ]
        if locks:
            held = _Held(locks, counter, deps, epoch)
            held.voted = True
            held.prepared = items
            self._held[txn_id] = held
        return PREPARED, counter, items, deps

    def expire(self, now_ns: int) -> list[int]:
        """Aborts, on its own, every transaction whose locks have expired before it voted
        (see ``Settings.lock_timeout_ns``); returns their ids. Safe: a transaction that has
        not voted here cannot have been decided, and its validation will now fail."""
        expired = []
        while self._expiries and self._expiries[0][0] <= now_ns:
            _, txn_id = heapq.heappop(self._expiries)
            held = self._held.get(txn_id)
            if held is not None and not held.voted:
                self.abort(txn_id)
                expired.append(txn_id)
        self.expired += len(expired)
        return expired

    def next_expiry(self) -> int | None:
        """When the oldest lock that can still expire does. Entries of transactions that
        have voted or ended since are dropped here: left on the heap, each would wake the
        replica once for nothing (one wake-up per lock under load)."""
        expiries, held = self._expiries, self._held
        while expiries:
            txn_id = expiries[0][1]
            entry = held.get(txn_id)
            if entry is not None and not entry.voted:
                return expiries[0][0]
            heapq.heappop(expiries)
        return None

    def dependencies(self, keys: Iterable[str]) -> VectorClock:
        """Clocks a writer of ``keys`` must dominate: the versions it overwrites and the
        validated readers of those keys (and scanners of their tables)."""
        deps = self._stamp_floor
        store = self.store
        absent, scan_stamps = self._absent_stamps, self._scan_stamps
        for key in keys:
            version = store.latest(key)
            if version is not None:
                deps = deps.merge(version.vc)
                stamp = version.stamp
            else:
                stamp = absent.get(key)
            if stamp is not None:
                deps = deps.merge(stamp)
            if scan_stamps:
                table_stamp = scan_stamps.get(table_of(key))
                if table_stamp is not None:
                    deps = deps.merge(table_stamp)
        return deps

    def stamp_reads(
        self, reads: Iterable[tuple[str, int]], scans: Iterable[RecordedScan], vc: VectorClock
    ) -> None:
        """Stamps ``vc`` on what a transaction validated: the versions it read (still the
        newest: validation has just checked), the keys it found absent, the tables it
        scanned."""
        if not vc:
            return
        store = self.store
        for key, _ in reads:
            version = store.latest(key)
            if version is not None:
                stamp = version.stamp
                version.stamp = vc if stamp is None else stamp.merge(vc)
            else:
                stamp = self._absent_stamps.get(key)
                self._absent_stamps[key] = vc if stamp is None else stamp.merge(vc)
        for lo, _, _, _ in scans:
            table = table_of(lo)
            stamp = self._scan_stamps.get(table)
            self._scan_stamps[table] = vc if stamp is None else stamp.merge(vc)

    def readers_unknown(self, floor: VectorClock) -> None:
        """The readers validated here before are not known (a new leader's store is its
        replay, which carries no stamps): every writer must dominate ``floor`` instead, the
        clock above every transaction of the ended epochs that can survive (docs/recovery.md,
        rule 9), until the vector watermark passes it."""
        self._stamp_floor = self._stamp_floor.merge(floor)

    def collect_stamps(self, watermark: Mapping[int, int], keys_max: int) -> None:
        """Drops stamps that carry nothing above the watermark; visits at most keys_max
        absent keys (a version's stamp goes with the version)."""
        if self._stamp_floor:
            self._stamp_floor = self._stamp_floor.above(watermark)
        stamps = self._absent_stamps
        # The keys of the pass taken at once: the first key of a dict whose first keys were
        # deleted is found by a scan over their slots (quadratic, key after key).
        for key in list(islice(stamps, keys_max)):
            stamp = stamps.pop(key).above(watermark)
            if stamp:
                stamps[key] = stamp  # to the back of the queue
        for table, stamp in list(self._scan_stamps.items()):
            kept = stamp.above(watermark)
            if kept:
                self._scan_stamps[table] = kept
            else:
                del self._scan_stamps[table]

    def stamp_count(self) -> int:
        """Stamps kept apart from versions (keys read while absent)."""
        return len(self._absent_stamps)

    def validate(
        self,
        txn_id: int,
        reads: Iterable[tuple[str, int]],
        scans: Iterable[RecordedScan],
        vc: VectorClock | None = None,
        epoch: int | None = None,
    ) -> bool:
        """The participant's vote: checks the reads; on success stamps ``vc`` on them
        (read-write dependencies) and records that the transaction voted yes here, after
        which its locks no longer expire."""
        if (epoch is not None and epoch != self.epoch) or not self.certifying:
            return False
        finished = self._finished.get(txn_id)
        if finished is not None and finished[0] == ABORTED:
            return False  # aborted here (its locks expired, or an abort came first)
        reads = list(reads)
        scans = list(scans)
        if not self._check_reads(txn_id, reads, scans):
            return False
        if vc is not None:
            self.stamp_reads(reads, scans, vc)
        held = self._held.get(txn_id)
        if held is not None:
            held.voted = True
        return True

    def _check_reads(
        self, txn_id: int, reads: list[tuple[str, int]], scans: list[RecordedScan]
    ) -> bool:
        if self._skip_validation:
            return True
        store = self.store
        check_locks = not self._skip_locking
        if self._doubt and (
            self._any_in_doubt(key for key, _ in reads)
            or self._any_in_doubt(key for scan in scans for key, _ in scan[3])
        ):
            return False
        for key, vid in reads:
            version = store.latest(key)
            if (version.vid if version is not None else 0) != vid:
                return False
            if check_locks:
                owner = store.lock_owner(key)
                if owner is not None and owner != txn_id:
                    return False
        for lo, hi, limit, seen in scans:
            if store.scan_vids(lo, hi, limit) != seen:
                return False
            if check_locks:
                start, end, inclusive = covered_range(lo, hi, limit, seen)
                if store.range_locked_by_other(start, end, txn_id, inclusive_hi=inclusive):
                    return False
        return True

    def install(self, txn_id: int, writes: list[Write], vc: VectorClock, epoch: int) -> None:
        held = self._held.pop(txn_id, None)
        if held is None:
            # A retransmission of an install already done (or of one whose lock this shard
            # never granted, which the coordinator never sends), or an install of an ended
            # epoch for a transaction this participant aborted on its own (begin_epoch):
            # recovery rolls that transaction back wherever it installed.
            finished = self._finished.get(txn_id)
            assert finished is None or finished[0] == INSTALLED or epoch < self.epoch, (
                "install after abort"
            )
            return
        assert vc[self.shard] >= held.counter, "install clock below the counter drawn"
        self._assert_dominates_overwritten(writes, vc)
        self._apply(txn_id, writes, vc, epoch)
        if self._speculation:
            if not self._skip_locking:
                self.store.unlock_all(held.keys, txn_id)
        else:
            self._hide_until_committed(txn_id, vc, held.keys, epoch)
        self._finish(txn_id, INSTALLED, held.counter)
        self._on_installed(txn_id, held.counter, writes, vc)

    def abort(self, txn_id: int) -> None:
        held = self._held.pop(txn_id, None)
        if held is None:
            if txn_id not in self._finished:
                self._finish(txn_id, ABORTED, 0)  # refuse a lock that arrives late
            return
        if not self._skip_locking:
            self.store.unlock_all(held.keys, txn_id)
        self.watermark.settle(held.counter)
        self._finish(txn_id, ABORTED, held.counter)

    def certify_solo(
        self,
        txn_id: int,
        reads: Iterable[tuple[str, int]],
        scans: Iterable[RecordedScan],
        writes: list[Write],
        read_vc: VectorClock,
        epoch: int,
    ) -> tuple[VectorClock, VectorClock] | None:
        """Certifies a transaction that only touches this shard.

        Returns (vc, full): its sparse clock and the clock before durable entries were
        dropped; None on abort."""
        finished = self._finished.get(txn_id)
        if finished is not None:  # a retransmitted solo request
            return None if finished[0] == ABORTED else self._solo_vcs.get(txn_id)
        reads = list(reads)
        scans = list(scans)
        keys = [key for key, _, _ in writes]
        if (
            epoch != self.epoch
            or not self.certifying
            or self.watermark.beyond_epoch()
            or (self._doubt and self._any_in_doubt(keys))
            or not self._check_reads(txn_id, reads, scans)
        ):
            self._finish(txn_id, ABORTED, 0)
            return None
        if not writes:
            self.stamp_reads(reads, scans, read_vc)
            return self._sparse(read_vc), read_vc
        if not self._skip_locking and any(
            (owner := self.store.lock_owner(key)) is not None and owner != txn_id for key in keys
        ):
            self._finish(txn_id, ABORTED, 0)
            return None
        deps = self.dependencies(keys)
        if self.floor_on_deps:
            self.watermark.raise_floor(deps[self.shard])
        counter = self.watermark.draw()
        full = read_vc.merge(deps).with_entry(self.shard, counter)
        vc = self._sparse(full)
        self.stamp_reads(reads, scans, vc)
        self._assert_dominates_overwritten(writes, vc)
        if not self._speculation and not self._skip_locking:
            self.store.try_lock_all(keys, txn_id)
        self._apply(txn_id, writes, vc, epoch)
        if not self._speculation:
            self._hide_until_committed(txn_id, vc, keys, epoch)
        self._finish(txn_id, INSTALLED, counter)
        self._solo_vcs[txn_id] = (vc, full)
        if len(self._solo_vcs) > self.settings.finished_txns_remembered_max:
            self._solo_vcs.popitem(last=False)
        self._on_installed(txn_id, counter, writes, vc)
        return vc, full

    def run_local(
        self, txn_id: int, ops: OpList, epoch: int, record_reads: bool,
        snapshot: int = NO_SNAPSHOT,
    ) -> tuple[Any, VectorClock, VectorClock, list[str], list[tuple[str, int]]] | Literal[False] | None:
        """Reads, runs and certifies, in one step, an operation list whose keys are all on
        this shard (no scans): ``certify_solo`` with the reads made in the same step, so
        they are the newest versions by construction and only locks can fail them.

        Returns (result, vc, full, keys written, reads as (key, writer) if
        ``record_reads``); False on a conflict (a key locked by another transaction); None
        when this participant cannot certify alone now (another epoch, a takeover not
        finished, versions in doubt, speculation off): the general path decides then.
        Raises InvalidRequest (nothing changed) if an operation does not fit the data.

        ``snapshot`` (a list that writes nothing: this shard's durable watermark, or
        ``NO_SNAPSHOT``): the reads are of the newest versions whose writers' counters here
        are within it (``VersionedStore.latest_within``). Every counter at or below it is
        installed, so no lock stands in their way, and nothing is stamped (a transaction
        that writes nothing is in no cut and no rollback; ``Coordinator``, "snapshot
        reads")."""
        if (
            epoch != self.epoch or not self.certifying or self._doubt or not self._speculation
            or self.watermark.beyond_epoch()
        ):
            return None
        store = self.store
        read_keys = ops.batch.keys
        check_reads = not (self._skip_validation or self._skip_locking)
        versions: list[Version | None] | None
        if snapshot != NO_SNAPSHOT:
            shard = self.shard
            versions = [store.latest_within(key, shard, snapshot) for key in read_keys]
        else:
            versions = store.latest_unlocked(read_keys, txn_id if check_reads else None)
        if versions is None:
            return False
        values: list[Any] = []
        # The clock is built in one dict (no intermediate clocks): the versions read, then
        # what the writes must dominate, then the counter.
        clock: dict[int, int] = {}
        read: dict[str, Version | None] = {}
        for key, version in zip(read_keys, versions, strict=True):
            read[key] = version
            if version is None:
                values.append(None)
                continue
            values.append(None if version.deleted else version.value)
            if version.vc.entries:
                _raise_into(clock, version.vc.entries)
        buffered: dict[str, tuple[Any, bool]] = {}
        result = ops.run(values, [], buffered, self.settings)
        reads: list[tuple[str, int]] = []
        if record_reads:
            for key, version in read.items():
                reads.append((key, version.txn_id if version is not None else 0))
        if not buffered:
            read_vc = VectorClock._of(clock) if clock else EMPTY
            vc = self._sparse(read_vc)
            if vc.entries and snapshot == NO_SNAPSHOT:
                self._stamp_versions(read, vc)
            return result, vc, read_vc, [], reads
        assert snapshot == NO_SNAPSHOT, "a snapshot read for a list that writes"
        written = list(buffered)
        if not self._skip_locking and store.locked_by_other(written, txn_id):
            return False
        # The clocks the writes must dominate (``dependencies``), from the versions just
        # read where the list read the key it writes (their clocks are in already).
        if self._stamp_floor.entries:
            _raise_into(clock, self._stamp_floor.entries)
        absent, scan_stamps = self._absent_stamps, self._scan_stamps
        overwritten: list[Version] = []
        writes: list[Write] = []
        for key, (value, deleted) in buffered.items():
            writes.append((key, value, deleted))
            if key in read:
                previous = read[key]
            else:
                previous = store.latest(key)
                if previous is not None and previous.vc.entries:
                    _raise_into(clock, previous.vc.entries)
            if previous is not None:
                overwritten.append(previous)
                stamp = previous.stamp
            else:
                stamp = absent[key] if key in absent else None  # noqa: SIM401 (no call)
            if stamp is not None:
                _raise_into(clock, stamp.entries)
            if scan_stamps:
                table_stamp = scan_stamps.get(table_of(key))
                if table_stamp is not None:
                    _raise_into(clock, table_stamp.entries)
        if self.floor_on_deps:
            self.watermark.raise_floor(clock.get(self.shard, 0))
        counter = self.watermark.draw()
        if counter > clock.get(self.shard, 0):
            clock[self.shard] = counter
        full = VectorClock._of(clock)
        vc = self._sparse(full)
        # A version this list overwrites needs no stamp: the new version's clock dominates.
        stamped = {key: v for key, v in read.items() if key not in buffered} if vc.entries else None
        if stamped:
            self._stamp_versions(stamped, vc)
        if not (self._skip_locking or self._skip_validation):
            watermark = self._vector_watermark
            ours = vc.entries
            for previous in overwritten:  # DESIGN.md §3's invariant, write-write part
                for shard, mark in previous.vc.entries.items():
                    assert mark <= ours.get(shard, 0) or mark <= watermark.get(shard, 0), (
                        f"clock {vc} of a write below the overwritten {previous.vc}"
                    )
        store.install_many(writes, vc, epoch, txn_id, CERTIFIED)
        self._on_installed(txn_id, counter, writes, vc)
        return result, vc, full, written, reads

    def _stamp_versions(self, read: dict[str, Version | None], vc: VectorClock) -> None:
        """``stamp_reads`` for reads just made: ``read`` maps each key to its newest
        version (None: none)."""
        for key, version in read.items():
            if version is not None:
                stamp = version.stamp
                version.stamp = vc if stamp is None else stamp.merge(vc)
            else:
                stamp = self._absent_stamps.get(key)
                self._absent_stamps[key] = vc if stamp is None else stamp.merge(vc)

    # ---- helpers -------------------------------------------------------------------------

    def _sparse(self, clock: VectorClock) -> VectorClock:
        if not self.settings.sparse_clocks:
            return clock
        return clock.above(self._vector_watermark)

    def _assert_dominates_overwritten(self, writes: list[Write], vc: VectorClock) -> None:
        """DESIGN.md §3's invariant, write-write part: a new version's clock dominates the
        one it overwrites, up to entries already durable (dropped from sparse clocks)."""
        if self._skip_locking or self._skip_validation:
            return
        watermark = self._vector_watermark
        for key, _, _ in writes:
            previous = self.store.latest(key)
            if previous is None:
                continue
            for shard, counter in previous.vc.items():
                assert counter <= vc[shard] or counter <= watermark.get(shard, 0), (
                    f"clock {vc} of a write to {key!r} below the overwritten {previous.vc}"
                )

    def _apply(self, txn_id: int, writes: list[Write], vc: VectorClock, epoch: int) -> None:
        state = CERTIFIED if self._speculation else HIDDEN
        self.store.install_many(writes, vc, epoch, txn_id, state)

    # ---- speculation off -----------------------------------------------------------------

    def _hide_until_committed(
        self, txn_id: int, vc: VectorClock, keys: list[str], epoch: int
    ) -> None:
        self._hidden[txn_id] = (vc, keys, epoch)
        # Its own counter is not settled yet, so its clock cannot be under the watermark.
        waiting = self._waits.wait(vc, lambda: self._reveal(txn_id))
        assert waiting, f"a hidden install's clock {vc} is already durable"

    def _reveal(self, txn_id: int) -> None:
        """Reveals (and unlocks) a hidden transaction now at or below the vector watermark."""
        entry = self._hidden.get(txn_id)
        if entry is None or entry[2] != self.epoch:
            return  # rolled back, or of an ended epoch: its FVW reveals it (end_doubt)
        del self._hidden[txn_id]
        for key in entry[1]:
            self.store.reveal(key, txn_id)
        if not self._skip_locking:
            self.store.unlock_all(entry[1], txn_id)

    def hidden_count(self) -> int:
        return len(self._hidden)

    # ---- epochs (docs/recovery.md) -------------------------------------------------------

    def begin_epoch(self, epoch: int, frozen: Mapping[int, int]) -> list[int]:
        """Enters ``epoch``: aborts every older transaction still holding locks here (its
        counter is returned, left unsettled: the caller settles it once the old epoch has
        ended on the stream) and puts versions of the ended epochs in doubt against
        ``frozen``, the vector watermark they ended with."""
        assert epoch > self.epoch
        abandoned = []
        for txn_id, held in list(self._held.items()):
            if held.epoch < epoch:
                del self._held[txn_id]
                if not self._skip_locking:
                    self.store.unlock_all(held.keys, txn_id)
                self._finish(txn_id, ABORTED, held.counter)
                abandoned.append(held.counter)
        for ended in range(self.epoch, epoch):
            self._doubt[ended] = dict(frozen)
        self.epoch = epoch
        return abandoned

    def end_doubt(self, epoch: int, fvw: Mapping[int, int]) -> list[tuple[int, list[str]]]:
        """The FVW of ``epoch`` is known (and its versions above it rolled back by the
        caller): nothing of it is in doubt any more. Hidden transactions of that epoch
        (speculation off) are revealed if at or below it; the others are returned, still
        locked, for the caller to roll back and unlock (``release_hidden``)."""
        self._doubt.pop(epoch, None)
        rolled: list[tuple[int, list[str]]] = []
        for txn_id, (vc, keys, txn_epoch) in list(self._hidden.items()):
            if txn_epoch != epoch:
                continue
            if vc.le_watermark(fvw):
                del self._hidden[txn_id]
                for key in keys:
                    self.store.reveal(key, txn_id)
                if not self._skip_locking:
                    self.store.unlock_all(keys, txn_id)
            else:
                rolled.append((txn_id, keys))
        return rolled

    def release_hidden(self, txn_id: int) -> None:
        """Unlocks a hidden transaction that recovery rolled back."""
        entry = self._hidden.pop(txn_id, None)
        if entry is not None and not self._skip_locking:
            self.store.unlock_all(entry[1], txn_id)

    def in_doubt(self) -> bool:
        return bool(self._doubt)

    def frozen(self, epoch: int) -> dict[int, int] | None:
        """The vector watermark ``epoch`` ended with here, while its FVW is not applied."""
        return self._doubt.get(epoch)

    def committed_watermark(self, vw: Mapping[int, int]) -> Mapping[int, int]:
        """What may count as committed now: ``vw``, or while an ended epoch's FVW is
        unknown, the vector watermark that epoch ended with (a later epoch's watermark says
        nothing of the ended epoch's transactions)."""
        if not self._doubt:
            return vw
        return self._doubt[min(self._doubt)]

    def remember_installed(self, txn_id: int, vc: VectorClock) -> None:
        """A transaction installed here by a leader before this one (replayed from the
        stream after a takeover): a retransmitted solo request for it is answered with its
        clock, and an install for it is known done."""
        if txn_id in self._finished:
            return
        self._finish(txn_id, INSTALLED, vc[self.shard])
        self._solo_vcs[txn_id] = (vc, vc)
        if len(self._solo_vcs) > self.settings.finished_txns_remembered_max:
            self._solo_vcs.popitem(last=False)

    def _any_in_doubt(self, keys: Iterable[str]) -> bool:
        store = self.store
        doubt = self._doubt
        for key in keys:
            version = store.latest(key)
            if version is None:
                continue
            frozen = doubt.get(version.epoch)
            if frozen is not None and not version.vc.le_watermark(frozen):
                return True
        return False

    def _finish(self, txn_id: int, state: int, counter: int) -> None:
        self._finished[txn_id] = (state, counter)
        if len(self._finished) > self.settings.finished_txns_remembered_max:
            self._finished.popitem(last=False)

    def aborted_counters(self) -> set[int]:
        """Counters drawn by transactions that aborted here (among those remembered)."""
        return {counter for state, counter in self._finished.values() if state == ABORTED and counter}

    def held_count(self) -> int:
        return len(self._held)

    def holds(self, txn_id: int) -> bool:
        return txn_id in self._held

