"""Sparse per-shard vector clocks (DESIGN.md §3, §4).

A vector clock maps shard number to the value of that shard's counter. A shard that is
absent means 0, so a clock only carries the shards a transaction really depends on. Clocks
are immutable once built: versions in the store share them.

The invariant everything relies on (Mako §4.2): if T1 read-depends on T2, directly or
transitively, then ``vc(T1) >= vc(T2)`` entry by entry. The certification core asserts it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from store.core.errors import InvalidRequest


class VectorClock:
    """An immutable sparse vector clock: shard -> counter, absent shards are 0."""

    __slots__ = ("entries",)

    # shard -> counter, no zeros. Read-only: a clock is shared by every version and message
    # that carries it. Public so the hot path can test a clock for emptiness without a call.
    entries: dict[int, int]

    def __init__(self, entries: Mapping[int, int] | None = None) -> None:
        cleaned: dict[int, int] = {}
        if entries:
            for shard, counter in entries.items():
                if counter:
                    cleaned[shard] = counter
        self.entries = cleaned

    @classmethod
    def _of(cls, entries: dict[int, int]) -> VectorClock:
        """Wraps a dict the caller gives up (no zeros in it); no copy. (Not
        ``cls.__new__``: the compiled build, docs/performance.md, has no such call.)"""
        clock = VectorClock()
        clock.entries = entries
        return clock

    def __getitem__(self, shard: int) -> int:
        return self.entries.get(shard, 0)

    def items(self) -> Iterable[tuple[int, int]]:
        return self.entries.items()

    def shards(self) -> Iterable[int]:
        return self.entries.keys()

    def __len__(self) -> int:
        return len(self.entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VectorClock) and self.entries == other.entries

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.entries.items())))

    def __repr__(self) -> str:
        inner = ", ".join(f"{s}:{c}" for s, c in sorted(self.entries.items()))
        return f"VC({inner})"

    def merge(self, other: VectorClock) -> VectorClock:
        """Element-wise maximum."""
        if not other.entries:
            return self
        if not self.entries:
            return other
        merged = dict(self.entries)
        for shard, counter in other.entries.items():
            if counter > merged.get(shard, 0):
                merged[shard] = counter
        return VectorClock._of(merged)

    def with_entry(self, shard: int, counter: int) -> VectorClock:
        """This clock with ``shard`` raised to at least ``counter``."""
        if counter <= self.entries.get(shard, 0):
            return self
        merged = dict(self.entries)
        merged[shard] = counter
        return VectorClock._of(merged)

    def __le__(self, other: VectorClock) -> bool:
        """Dominance: every entry of self is at or below other's."""
        theirs = other.entries
        for shard, counter in self.entries.items():  # noqa: SIM110 (a loop, not all(): the hot path)
            if counter > theirs.get(shard, 0):
                return False
        return True

    def __ge__(self, other: VectorClock) -> bool:
        return other.__le__(self)

    def le_watermark(self, watermark: Mapping[int, int]) -> bool:
        """True when every entry is at or below the (vector) watermark: durable."""
        for shard, counter in self.entries.items():  # noqa: SIM110 (a loop, not all(): the hot path)
            if counter > watermark.get(shard, 0):
                return False
        return True

    def above(self, watermark: Mapping[int, int]) -> VectorClock:
        """Sparse form: drop entries at or below a known watermark (DESIGN.md §4).

        An entry at or below the watermark is already durable, so it carries no information
        for the durability decision; dropping it keeps metadata proportional to the real
        dependency footprint instead of the number of shards.
        """
        kept = {s: c for s, c in self.entries.items() if c > watermark.get(s, 0)}
        if len(kept) == len(self.entries):
            return self
        return VectorClock._of(kept)

    def to_wire(self) -> list[int]:
        """Flat [shard, counter, shard, counter, ...] sorted by shard (msgpack-friendly)."""
        flat: list[int] = []
        for shard, counter in sorted(self.entries.items()):
            flat.append(shard)
            flat.append(counter)
        return flat

    @classmethod
    def from_wire(cls, flat: object) -> VectorClock:
        if not isinstance(flat, list) or len(flat) % 2:
            raise InvalidRequest("vector clock must be a flat list of shard, counter pairs")
        entries: dict[int, int] = {}
        for i in range(0, len(flat), 2):
            shard, counter = flat[i], flat[i + 1]
            if type(shard) is not int or type(counter) is not int or shard < 0 or counter < 0:
                raise InvalidRequest("vector clock entries must be non-negative integers")
            if counter:
                entries[shard] = counter
        return cls._of(entries)

    def encode(self) -> bytes:
        """Compact binary encoding: LEB128 varints, count then (shard delta, counter) pairs."""
        out = bytearray()
        _put_varint(out, len(self.entries))
        previous = 0
        for shard, counter in sorted(self.entries.items()):
            _put_varint(out, shard - previous)
            _put_varint(out, counter)
            previous = shard
        return bytes(out)

    @classmethod
    def decode(cls, data: bytes) -> VectorClock:
        count, pos = _get_varint(data, 0)
        if count > len(data):
            raise InvalidRequest("vector clock encoding claims more entries than bytes")
        entries: dict[int, int] = {}
        shard = 0
        for _ in range(count):
            delta, pos = _get_varint(data, pos)
            counter, pos = _get_varint(data, pos)
            shard += delta
            if counter:
                entries[shard] = counter
        if pos != len(data):
            raise InvalidRequest("trailing bytes after vector clock")
        return cls._of(entries)


EMPTY: Final = VectorClock()


def _put_varint(out: bytearray, value: int) -> None:
    assert value >= 0
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _get_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(data):
            raise InvalidRequest("truncated varint in vector clock")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise InvalidRequest("varint too long in vector clock")
