"""The versioned store of one shard leader (DESIGN.md §3).

Theory of operation:

* Data lives in tables of ordered keys (a ``SortedSet`` of keys per table, for scans, and
  one dict from key to chain for point access). Each key has a version chain, oldest first. A version holds a value or a tombstone, the vector clock and epoch of
  the transaction that wrote it, and a state: certified (visible, possibly speculative) or
  rolled back (invisible, kept until garbage collection).
* Every version has a store-unique id (``vid``); a read records ``(key, vid)``, with vid 0
  for "no visible version". Validation compares the recorded vid with the current one.
* Locks are per key and owned by one transaction id. A lock may be taken on a key that does
  not exist yet (an insert), so lock ownership is kept apart from the chains, in a dict plus
  a set of locked keys per table: scans check "no key in my range is locked by someone
  else" to catch phantoms.
* Garbage collection drops versions nobody can read: everything older than the newest
  version that is at or below the durable watermark (older ones can neither be read nor
  become visible again by rollback).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from sortedcontainers import SortedSet

from store.core.partition import table_of
from store.core.vclock import VectorClock

CERTIFIED: Final = 1
ROLLED_BACK: Final = 2
# Installed but not yet visible: with speculation off, a version stays hidden (and its key
# locked) until its transaction is committed (Mako's "OCC+OR" baseline).
HIDDEN: Final = 3


# A garbage-collection pass stops after this many keys in a row with nothing to collect.
GC_MISSES_MAX: Final = 32


class Version:
    """One version of a key. ``stamp``: the merged clocks of the transactions that validated
    a read of this version (read-write dependencies, see ``store.core.participant``); only
    the newest version's matters, so the stamp lives and dies with the version."""

    __slots__ = ("deleted", "epoch", "stamp", "state", "txn_id", "value", "vc", "vid")

    def __init__(
        self,
        vid: int,
        value: Any,
        deleted: bool,
        vc: VectorClock,
        epoch: int,
        txn_id: int,
        state: int = CERTIFIED,
    ) -> None:
        self.vid = vid
        self.value = value
        self.deleted = deleted
        self.vc = vc
        self.epoch = epoch
        self.txn_id = txn_id
        self.state = state
        self.stamp: VectorClock | None = None

    def __repr__(self) -> str:
        shown = "<deleted>" if self.deleted else repr(self.value)
        return f"Version(vid={self.vid}, {shown}, {self.vc}, state={self.state})"


class VersionedStore:
    """Tables of ordered keys with version chains and key locks. Pure, single-threaded."""

    def __init__(self) -> None:
        self._chains: dict[str, list[Version]] = {}
        self._tables: dict[str, SortedSet] = {}
        self._locks: dict[str, int] = {}
        # The locked keys of each table, for a scan's check of its range: a plain set (a
        # lock and an unlock are a hash-set add and discard, on every written key of every
        # transaction); the check visits the table's locked keys, at most the keys the
        # transactions in flight write.
        self._locked_by_table: dict[str, set[str]] = {}
        self._next_vid = 1
        # Keys that may hold versions nobody can read, oldest first (a dict: a FIFO without
        # duplicates whose order does not depend on string hashing).
        self._dirty: dict[str, None] = {}
        self.skipped_writes = 0  # replayed writes that lost to a newer version (Thomas)

    # ---- reading -------------------------------------------------------------------------

    def _chain(self, key: str) -> list[Version] | None:
        return self._chains.get(key)

    def latest(self, key: str) -> Version | None:
        """The newest certified version (a tombstone counts), or None."""
        chain = self._chains.get(key)
        if not chain:
            return None
        version = chain[-1]
        if version.state == CERTIFIED:
            return version
        for version in reversed(chain):
            if version.state == CERTIFIED:
                return version
        return None

    def latest_at_or_below(self, key: str, watermark: Mapping[int, int]) -> Version | None:
        """The newest certified version whose clock is at or below ``watermark`` (snapshot)."""
        chain = self._chain(key)
        if not chain:
            return None
        for version in reversed(chain):
            if version.state == CERTIFIED and version.vc.le_watermark(watermark):
                return version
        return None

    def latest_within(self, key: str, clock: int, bound: int) -> Version | None:
        """The newest certified version whose writer's clock holds at most ``bound`` at entry
        ``clock`` (a missing entry counts 0): a read-only transaction's snapshot
        (``Coordinator``, "snapshot reads"). A key's versions overwrite one another, so
        their clocks rise along the chain and the first one found from the newest is it."""
        chain = self._chains.get(key)
        if not chain:
            return None
        for version in reversed(chain):
            if version.state == CERTIFIED and version.vc.entries.get(clock, 0) <= bound:
                return version
        return None

    def latest_unlocked(
        self, keys: list[str], owner: int | None
    ) -> list[Version | None] | None:
        """The newest certified version of each key (None: no version), or None if another
        transaction than ``owner`` holds a lock on one of the keys (``owner`` None: locks
        are not looked at)."""
        chains, locks = self._chains, self._locks
        found: list[Version | None] = []
        for key in keys:
            if owner is not None and key in locks and locks[key] != owner:
                return None
            chain = chains[key] if key in chains else None  # noqa: SIM401 (no call: hot path)
            if chain and chain[-1].state == CERTIFIED:
                found.append(chain[-1])
            else:
                found.append(self.latest(key))
        return found

    def locked_by_other(self, keys: list[str], owner: int) -> bool:
        locks = self._locks
        for key in keys:  # noqa: SIM110 (a loop, not a generator: this is the hot path)
            if key in locks and locks[key] != owner:
                return True
        return False

    def scan(self, lo: str, hi: str, limit: int) -> list[tuple[str, Version]]:
        """Visible (non-deleted) latest versions of keys in [lo, hi), the first ``limit`` in
        key order; a negative ``limit``: the last ``-limit``, highest first."""
        table = self._tables.get(table_of(lo))
        if table is None or limit == 0:
            return []
        reverse = limit < 0
        limit = abs(limit)
        found: list[tuple[str, Version]] = []
        for key in table.irange(lo, hi, inclusive=(True, False), reverse=reverse):
            version = self.latest(key)
            if version is not None and not version.deleted:
                found.append((key, version))
                if len(found) >= limit:
                    break
        return found

    def keys_in_range(self, lo: str, hi: str) -> list[str]:
        table = self._tables.get(table_of(lo))
        if table is None:
            return []
        return list(table.irange(lo, hi, inclusive=(True, False)))

    def scan_vids(self, lo: str, hi: str, limit: int) -> list[tuple[str, int]]:
        return [(key, version.vid) for key, version in self.scan(lo, hi, limit)]

    def key_count(self) -> int:
        return len(self._chains)

    def all_keys(self) -> list[str]:
        return [key for name in sorted(self._tables) for key in self._tables[name]]

    def chain(self, key: str) -> list[Version]:
        return list(self._chain(key) or ())

    def versions(self, key: str) -> Sequence[Version]:
        """The key's versions, oldest first, without a copy (read it before changing the
        store again)."""
        return self._chains.get(key) or ()

    @property
    def next_vid(self) -> int:
        """The id the next installed version gets: every version there is has a smaller one."""
        return self._next_vid

    # ---- locks ---------------------------------------------------------------------------

    def lock_owner(self, key: str) -> int | None:
        return self._locks.get(key)

    def try_lock_all(self, keys: list[str], owner: int) -> bool:
        """Locks every key or none (no waiting: a conflict fails at once)."""
        locks = self._locks
        for key in keys:
            holder = locks.get(key)
            if holder is not None and holder != owner:
                return False
        for key in keys:
            if key not in locks:
                locks[key] = owner
                table = table_of(key)
                locked = self._locked_by_table.get(table)
                if locked is None:
                    locked = self._locked_by_table[table] = set()
                locked.add(key)
        return True

    def unlock_all(self, keys: list[str], owner: int) -> None:
        locks = self._locks
        for key in keys:
            holder = locks.get(key)
            if holder is None:
                continue
            assert holder == owner, f"lock on {key!r} held by {holder}, released by {owner}"
            del locks[key]
            self._locked_by_table[table_of(key)].discard(key)

    def range_locked_by_other(self, lo: str, hi: str, owner: int, inclusive_hi: bool) -> bool:
        locked = self._locked_by_table.get(table_of(lo))
        if not locked:
            return False
        locks = self._locks
        if inclusive_hi:
            return any(lo <= key <= hi and locks[key] != owner for key in locked)
        return any(lo <= key < hi and locks[key] != owner for key in locked)

    def locked_count(self) -> int:
        return len(self._locks)

    # ---- writing -------------------------------------------------------------------------

    def install(
        self,
        key: str,
        value: Any,
        deleted: bool,
        vc: VectorClock,
        epoch: int,
        txn_id: int,
        state: int = CERTIFIED,
    ) -> Version:
        version = Version(self._next_vid, value, deleted, vc, epoch, txn_id, state)
        self._next_vid += 1
        chain = self._chains.get(key)
        if chain is None:
            self._chains[key] = [version]
            table_name = table_of(key)
            table = self._tables.get(table_name)
            if table is None:
                table = self._tables[table_name] = SortedSet()
            table.add(key)
            if deleted:
                self._dirty[key] = None
        else:
            chain.append(version)
            self._dirty[key] = None  # a first version has nothing older to collect
        return version

    def install_many(
        self, writes: Sequence[tuple[str, Any, bool]], vc: VectorClock, epoch: int,
        txn_id: int, state: int = CERTIFIED,
    ) -> None:
        """``install`` of every (key, value, deleted) of one transaction."""
        chains, dirty = self._chains, self._dirty
        for key, value, deleted in writes:
            if key in chains:
                chains[key].append(Version(self._next_vid, value, deleted, vc, epoch, txn_id, state))
                self._next_vid += 1
                dirty[key] = None
            else:
                self.install(key, value, deleted, vc, epoch, txn_id, state)

    def replay(
        self, record: Any, shard: int, epoch: int
    ) -> tuple[int, VectorClock, list[str]] | None:
        """Applies a replicated record ``[txn_id, [[key, value, deleted], ...], vc]`` with
        Thomas's write rule: a write older (on ``shard``'s counter) than the key's newest
        version loses, so a record replayed twice changes nothing. Returns (txn_id, vc, keys
        written), or None if every write lost."""
        txn_id, writes, vc_wire = record
        vc = VectorClock.from_wire(vc_wire)
        counter = vc[shard]
        written = []
        for key, value, deleted in writes:
            latest = self.latest(key)
            if latest is not None and latest.vc[shard] >= counter:
                self.skipped_writes += 1
                continue
            self.install(key, value, deleted, vc, epoch, txn_id)
            written.append(key)
        return (txn_id, vc, written) if written else None

    def reveal(self, key: str, txn_id: int) -> None:
        """Makes the hidden version ``txn_id`` wrote to ``key`` visible (it committed)."""
        for version in self._chains.get(key, ()):
            if version.txn_id == txn_id and version.state == HIDDEN:
                version.state = CERTIFIED

    def roll_back(self, key: str, txn_id: int) -> bool:
        """Marks the version ``txn_id`` wrote to ``key`` rolled back. True if one was."""
        for version in self._chain(key) or ():
            if version.txn_id == txn_id and version.state in (CERTIFIED, HIDDEN):
                version.state = ROLLED_BACK
                self._dirty[key] = None
                return True
        return False

    def collect_garbage(self, watermark: Mapping[int, int], keys_max: int = 1 << 62) -> int:
        """Drops versions nobody can read; returns how many went.

        Visits at most ``keys_max`` of the keys that may hold garbage, oldest first, so that
        one pass never stalls the server; keys that still need work go to the back.
        """
        dropped = 0
        dirty = self._dirty
        chains, locks = self._chains, self._locks
        still_dirty: list[str] = []
        visited: list[str] = []
        misses = 0
        # The keys are read in order without removing any until the pass ends: taking the
        # first key and deleting it, key after key, costs a scan of every slot deleted before
        # it (a dict keeps its deleted slots until it is resized), quadratic in a pass.
        for key in dirty:
            if len(visited) == keys_max:
                break
            visited.append(key)
            chain = chains.get(key)
            if not chain:
                continue
            newest = chain[-1]
            keep_from: int | None
            if len(chain) == 2 and newest.state == CERTIFIED and chain[0].state == CERTIFIED:
                # The usual case, without a search: one version over the one it
                # replaced, which goes once the newer one is durable.
                keep_from, kept = (1, [newest]) if newest.vc.le_watermark(watermark) else (None, chain)
            else:
                keep_from = None
                for index in range(len(chain) - 1, -1, -1):
                    version = chain[index]
                    if version.state == CERTIFIED and version.vc.le_watermark(watermark):
                        keep_from = index
                        break
                if keep_from is None:  # no durable version: only rolled-back ones can go
                    kept = [v for v in chain if v.state != ROLLED_BACK]
                else:
                    kept = [chain[keep_from]] + [
                        v for v in chain[keep_from + 1 :] if v.state != ROLLED_BACK
                    ]
            if key not in locks and (
                not kept or (keep_from is not None and len(kept) == 1 and kept[0].deleted)
            ):
                # Nothing left that anyone can read: the key is gone for good. A durable
                # tombstone with nothing above it, or versions that were all rolled back (an
                # insert undone by recovery: kept, it stayed dirty for ever).
                dropped += len(chain)
                del chains[key]
                self._tables[table_of(key)].discard(key)
                misses = 0
                continue
            if not kept:
                kept = chain  # locked: its holder may still install; visited again
            if len(kept) == len(chain):
                # Nothing to drop yet: its newest versions are not durable. Keys are dirtied
                # in certification order, so the ones behind a run of such keys most likely
                # have nothing either: the pass ends there instead of visiting every key
                # written in the last round trip again (at 50 ms between regions each key
                # was visited about three times before it could be collected). A key that
                # stays so goes to the back each time, so it cannot hold the others up.
                still_dirty.append(key)
                misses += 1
                if misses == GC_MISSES_MAX:
                    break
                continue
            misses = 0
            dropped += len(chain) - len(kept)
            chain[:] = kept
            if len(kept) > 1 or kept[0].deleted:
                # Older versions to drop later, or a tombstone not yet durable or locked (the
                # key goes once it is durable and free).
                still_dirty.append(key)
        for key in visited:
            del dirty[key]
        for key in still_dirty:
            dirty[key] = None
        return dropped

    def garbage_candidates(self) -> int:
        return len(self._dirty)
