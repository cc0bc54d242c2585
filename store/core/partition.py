"""Partitioners: which shard owns a key (DESIGN.md §2).

Keys are strings (tuple keys are packed into strings: ``store.core.keys``). A string key's
table is the part before its first ``/`` (``"stock/0001/42"`` is in table ``stock``); a
tuple key's is its first element. The default partitioner hashes the whole key with CRC-32 — never
Python's ``hash``, which is randomized per process and would make placement, and the
simulator's histories, differ between runs.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from store.core.keys import PACKED_BELOW, PREFIX_END, first_element_end


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

    def __init__(self, shard_count: int) -> None:
        assert shard_count >= 1
        self.shard_count = shard_count

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


class PrefixPartitioner(Partitioner):
    """Places a key by an integer field of its path: ``table/<n>/...`` goes to n mod S.

    Keys with no such field (or fewer path parts) fall back to hashing. A custom partitioner
    of this kind maps e.g. a TPC-C warehouse to a shard; ranges that share the field are
    served by one shard.
    """

    def __init__(self, shard_count: int, field: int = 1, replicated_tables: Sequence[str] = ()) -> None:
        super().__init__(shard_count)
        self.field = field
        self.replicated_tables = frozenset(replicated_tables)

    def _placed(self, key: str) -> int | None:
        parts = key.split("/")
        if len(parts) > self.field and parts[self.field].isdigit():
            return int(parts[self.field]) % self.shard_count
        return None

    def shard_of(self, key: str) -> int:
        placed = self._placed(key)
        return placed if placed is not None else super().shard_of(key)

    def shards_of_range(self, lo: str, hi: str) -> Sequence[int]:
        lo_shard, hi_shard = self._placed(lo), self._placed(hi)
        if lo_shard is not None and lo_shard == hi_shard:
            lo_parts, hi_parts = lo.split("/"), hi.split("/")
            if lo_parts[: self.field + 1] == hi_parts[: self.field + 1]:
                return (lo_shard,)
        return range(self.shard_count)
