"""Partitioners: which shard owns a key (DESIGN.md §2).

Keys are strings (tuple keys are packed into strings: ``store.core.keys``). A string key's
table is the part before its first ``/`` (``"stock/0001/42"`` is in table ``stock``); a
tuple key's is its first element. The default partitioner hashes the whole key with CRC-32 — never
Python's ``hash``, which is randomized per process and would make placement, and the
simulator's histories, differ between runs.
"""

from __future__ import annotations

import bisect
import functools
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from store.core.keys import (
    PACKED_BELOW,
    PREFIX_END,
    element_end,
    first_element_end,
    int_element,
    pack,
)

# Keys whose shard a PrefixPartitioner remembers.
HOMES_CACHED: Final = 1 << 17


def table_of(key: str) -> str:
    """A string key's table is the part before its first ``/``; a tuple key's (a packing,
    ``store.core.keys``) is its first element, packed."""
    if key < PACKED_BELOW:
        return key[: first_element_end(key)] if key else ""
    slash = key.find("/")
    return key[:slash] if slash >= 0 else ""


def table_end(table: str) -> str:
    """The least key above every key of ``table`` ('0' follows '/'; for a tuple table,
    0xFF is above every element's type code)."""
    if table < PACKED_BELOW and table:
        return table + PREFIX_END
    return table + "0"


def in_one_table(lo: str, hi: str) -> bool:
    """Whether the range ``[lo, hi)`` lies in one table (what a scan may cover)."""
    if lo < PACKED_BELOW:
        return bool(lo) and hi <= table_end(table_of(lo))
    return "/" in lo and hi <= table_end(table_of(lo))


class Partitioner:
    """Maps keys to shards. Subclasses may place ranges (for scans) on one shard."""

    # Whether some table is on every shard (``PrefixPartitioner``): the coordinator then
    # asks ``is_replicated`` of each key it reads or writes.
    replicated = False
    # Worker processes per shard (``WorkerPartitioner``): one here, where a shard index is
    # also its vector-clock entry.
    workers = 1

    def __init__(self, shard_count: int) -> None:
        assert shard_count >= 1
        self.shard_count = shard_count

    def clock_of(self, shard: int) -> int:
        """The vector-clock entry of what ``shard_of`` returned (``WorkerPartitioner``: the
        shard of a worker)."""
        return shard

    def is_replicated(self, key: str) -> bool:
        return False

    def shard_of(self, key: str) -> int:
        return zlib.crc32(key.encode()) % self.shard_count

    def owns_all(self, keys: Sequence[str], shard: int) -> bool:
        """Whether every key is on ``shard`` (one call for a transaction's keys)."""
        if type(self).shard_of is not Partitioner.shard_of:  # a subclass places keys its way
            shard_of = self.shard_of
            return all(shard_of(key) == shard for key in keys)
        count, crc32 = self.shard_count, zlib.crc32
        for key in keys:  # noqa: SIM110 (a loop, not a generator: this is the hot path)
            if crc32(key.encode()) % count != shard:
                return False
        return True

    def shards_of_range(self, lo: str, hi: str) -> Sequence[int]:
        """Shards that may hold keys in [lo, hi). Hashing scatters ranges: every shard."""
        return range(self.shard_count)

    def worker_of(self, key: str, workers: int) -> int:
        """Which of its shard's ``workers`` processes holds ``key``: the placement rule one
        level down (docs/design.md, "Workers"). Hashed keys use the hash's bits above the
        shard's (``crc // S``), so that the keys of one shard spread over its workers
        whatever S and W are."""
        return (zlib.crc32(key.encode()) // self.shard_count) % workers

    def workers_of_range(self, lo: str, hi: str, workers: int) -> Sequence[int]:
        """Which of a shard's ``workers`` may hold keys in [lo, hi) (``shards_of_range`` one
        level down). Hashing scatters ranges: every worker."""
        return range(workers)


class PrefixPartitioner(Partitioner):
    """Places a key by an integer field: ``table/<n>/...`` (string keys, the path's field
    ``field``) or ``(table, n, ...)`` (tuple keys, element ``field``) goes to shard n mod S,
    or with ``splits`` (ascending) to the number of splits at or below n (range placement:
    ``splits=[10, 20]`` puts 0-9 on shard 0, 10-19 on 1, the rest on 2).

    ``tables`` sets the field (and splits) per table; ``field`` is the rule of every other
    table (None: hash them). Keys with no such integer field fall back to hashing. Ranges
    whose keys share everything up to the field are served by one shard.

    A *replicated* table (``replicated_tables``) is on every shard: the coordinator reads
    it on its own shard and writes it on all of them (``is_replicated``); ``shard_of``
    hashes its keys, for routing only.
    """

    def __init__(
        self, shard_count: int, field: int | None = 1, replicated_tables: Sequence[str] = (),
        tables: Mapping[str, tuple[int, Sequence[int]]] | None = None,
    ) -> None:
        super().__init__(shard_count)
        self.field = field
        self.replicated_tables = frozenset(replicated_tables)
        # Each table under both names: a string key's ("stock") and a tuple key's (packed).
        self._replicated = frozenset(_both_names(self.replicated_tables))
        self._rules: dict[str, tuple[int, tuple[int, ...]]] = {}
        for table, (table_field, splits) in (tables or {}).items():
            assert table_field >= 1 and list(splits) == sorted(splits)
            for name in _both_names([table]):
                self._rules[name] = (table_field, tuple(splits))
        self._default = (field, ()) if field is not None else None
        self.tables = dict(tables or {})
        self.replicated = bool(self.replicated_tables)
        # Placement asks for the same keys again and again (each is read, locked, written
        # and installed): a key's home is remembered, for the most recent keys.
        self._home = functools.lru_cache(maxsize=HOMES_CACHED)(self._home_of)

    def _home_of(self, key: str) -> int:
        """The key's shard; -1 for a replicated table's key (on every shard)."""
        if table_of(key) in self._replicated:
            return -1
        placed = self._placed(key)
        return placed if placed is not None else super().shard_of(key)

    def is_replicated(self, key: str) -> bool:
        return self._home(key) < 0

    def owns_all(self, keys: Sequence[str], shard: int) -> bool:
        """Whether every key is on ``shard``; a replicated table's keys are on every shard
        (its writes are not: the coordinator sends those to all shards)."""
        home = self._home
        for key in keys:
            at = home(key)
            if at != shard and at >= 0:
                return False
        return True

    def _rule(self, key: str) -> tuple[int, tuple[int, ...]] | None:
        return self._rules.get(table_of(key), self._default)

    def _field(self, key: str, field: int) -> tuple[int, object] | None:
        """The key's integer at ``field`` (a tuple key's element, a string key's path part)
        and its head, everything up to and with that field (what a range must share to be
        on one shard); None if it has no integer there. The end of a prefix's range (a
        packing and 0xFF) and a key's successor (a packing and 0x00) place as it does."""
        if key < PACKED_BELOW:
            at = 0
            for _ in range(field):
                at = element_end(key, at)
                if at < 0:
                    return None
            found = int_element(key, at)
            if found is None:
                return None
            return found[0], key[: found[1]]
        parts = key.split("/", field + 1)
        if len(parts) <= field or not parts[field].isdigit():
            return None
        value = int(parts[field])
        return value, (*parts[:field], value)

    def _placed(self, key: str) -> int | None:
        found = self._placed_field(key)
        if found is None:
            return None
        value, splits = found
        if splits:
            return min(bisect.bisect_right(splits, value), self.shard_count - 1)
        return value % self.shard_count

    def _placed_field(self, key: str) -> tuple[int, tuple[int, ...]] | None:
        """The integer that places ``key`` and its table's splits; None if hashed."""
        if key < PACKED_BELOW:  # a tuple key: its table (the first element), then the rule
            at = element_end(key, 0)
            if at < 0:
                return None
            rule = self._rules.get(key[:at], self._default)
            if rule is None:
                return None
            field, splits = rule
            for _ in range(field - 1):
                at = element_end(key, at)
                if at < 0:
                    return None
            found: tuple[int, object] | None = int_element(key, at)
        else:
            rule = self._rule(key)
            if rule is None:
                return None
            field, splits = rule
            found = self._field(key, field)
        if found is None:
            return None
        return found[0], splits

    def shard_of(self, key: str) -> int:
        at = self._home(key)
        return at if at >= 0 else super().shard_of(key)  # a replicated key: routing only

    def shards_of_range(self, lo: str, hi: str) -> Sequence[int]:
        if self._placed_range(lo, hi):
            placed = self._placed(lo)
            assert placed is not None
            return (placed,)
        return range(self.shard_count)

    def workers_of_range(self, lo: str, hi: str, workers: int) -> Sequence[int]:
        """One worker when the range's keys share their placed field (``worker_of`` follows
        it), else every worker."""
        if self._placed_range(lo, hi):
            return (self.worker_of(lo, workers),)
        return range(workers)

    def _placed_range(self, lo: str, hi: str) -> bool:
        """Whether every key in [lo, hi) has one placed field (so one home)."""
        rule = self._rule(lo)
        if rule is None or table_of(lo) in self._replicated:
            return False
        field = rule[0]
        lo_field, hi_field = self._field(lo, field), self._field(hi, field)
        return lo_field is not None and hi_field is not None and lo_field[1] == hi_field[1]

    def worker_of(self, key: str, workers: int) -> int:
        """A placed key's worker follows its field, so everything of one warehouse stays on
        one worker: with splits, the field mod W; by modulo, the field's quotient by S mod W
        (the field mod W would leave some workers of a shard without keys whenever S and W
        share a factor: with S = W = 2, shard 0 holds even fields only).
        Hashed keys, and a replicated table's (on every worker; this is routing only), use
        the hash."""
        found = None if table_of(key) in self._replicated else self._placed_field(key)
        if found is None:
            return super().worker_of(key, workers)
        value, splits = found
        return value % workers if splits else (value // self.shard_count) % workers


class WorkerPartitioner(Partitioner):
    """A cluster whose shards run ``workers`` processes each (docs/design.md, "Workers").

    It maps keys to **units**, one per worker of every shard: unit ``shard * W + worker``,
    with the worker from ``base.worker_of``. Everything that routes, locks, certifies and
    replicates works on units as it works on shards without workers (a unit has its own
    leader, store, RPC endpoint, Paxos stream and followers), so this partitioner stands in
    for ``base`` everywhere. Only vector clocks and watermarks see the shard: a unit's
    counter values go to clock entry ``clock_of(unit)`` (its shard), so a clock keeps one
    entry per shard however many workers there are.
    """

    def __init__(self, base: Partitioner, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        assert base.workers == 1, "workers of workers"
        super().__init__(base.shard_count * workers)
        self.base = base
        self.shards = base.shard_count
        self.workers = workers
        self.replicated = base.replicated
        # The plain hash rule (not a subclass's placement): computed inline.
        self._hashed = type(base) is Partitioner

    def clock_of(self, shard: int) -> int:
        return shard // self.workers

    def is_replicated(self, key: str) -> bool:
        return self.base.is_replicated(key)

    def shard_of(self, key: str) -> int:
        base, workers = self.base, self.workers
        if self._hashed:  # Partitioner's rule and worker_of's, from one CRC
            crc, shards = zlib.crc32(key.encode()), self.shards
            return crc % shards * workers + crc // shards % workers
        return base.shard_of(key) * workers + base.worker_of(key, workers)

    def owns_all(self, keys: Sequence[str], shard: int) -> bool:
        if self._hashed:  # shard_of's rule inline (a call per key on the hot path costs)
            shards, workers, crc32 = self.shards, self.workers, zlib.crc32
            base_shard, worker = divmod(shard, workers)
            for key in keys:
                crc = crc32(key.encode())
                if crc % shards != base_shard or crc // shards % workers != worker:
                    return False
            return True
        shard_of = self.shard_of
        for key in keys:  # noqa: SIM110 (a loop, not a generator: this is the hot path)
            if shard_of(key) != shard:
                return False
        return True

    def shards_of_range(self, lo: str, hi: str) -> Sequence[int]:
        base, workers = self.base, self.workers
        return [
            s * workers + w for s in base.shards_of_range(lo, hi)
            for w in base.workers_of_range(lo, hi, workers)
        ]

    def worker_of(self, key: str, workers: int) -> int:
        raise AssertionError("a WorkerPartitioner's units have no workers of their own")


def _both_names(tables: Iterable[str]) -> list[str]:
    return [name for table in tables for name in (table, pack((table,)))]


def clock_marks(marks: Mapping[int, int], workers: int) -> dict[int, int]:
    """Watermarks by vector-clock entry (shard) from ``marks`` by unit (``shard * workers +
    worker``: what each shard leader process reports, with workers one worker's claim). A
    shard's is the least of its units' (the shard's watermark); a shard with a unit missing
    from ``marks`` is left out: its watermark is not known."""
    by_clock: dict[int, int] = {}
    count: dict[int, int] = {}
    for unit, mark in marks.items():
        clock = unit // workers
        by_clock[clock] = min(by_clock.get(clock, mark), mark)
        count[clock] = count.get(clock, 0) + 1
    return {clock: mark for clock, mark in by_clock.items() if count[clock] == workers}
