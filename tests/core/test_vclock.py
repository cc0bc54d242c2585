"""Vector clocks (DESIGN.md §3): sparse, merge, dominance, encoding."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store.core.errors import InvalidRequest
from store.core.vclock import EMPTY, VectorClock

clocks = st.dictionaries(st.integers(0, 600), st.integers(0, 2**40), max_size=12).map(VectorClock)


@pytest.mark.parametrize(
    ("a", "b", "merged", "a_le_b", "b_le_a"),
    [
        ({}, {}, {}, True, True),
        ({0: 1}, {}, {0: 1}, False, True),
        ({0: 1}, {0: 2}, {0: 2}, True, False),
        ({0: 3, 1: 1}, {0: 2, 2: 5}, {0: 3, 1: 1, 2: 5}, False, False),
        ({0: 0, 4: 7}, {4: 7}, {4: 7}, True, True),  # an explicit 0 is the same as absent
    ],
)
def test_merge_and_dominance(a, b, merged, a_le_b, b_le_a) -> None:
    va, vb = VectorClock(a), VectorClock(b)
    assert va.merge(vb) == VectorClock(merged)
    assert (va <= vb) is a_le_b
    assert (vb <= va) is b_le_a


def test_absent_shard_reads_zero_and_clock_is_sparse() -> None:
    clock = VectorClock({3: 9, 5: 0})
    assert clock[3] == 9 and clock[5] == 0 and clock[100] == 0
    assert len(clock) == 1


def test_above_watermark_drops_durable_entries() -> None:
    clock = VectorClock({0: 5, 1: 9, 2: 3})
    assert clock.above({0: 5, 1: 4, 2: 10}) == VectorClock({1: 9})
    assert clock.le_watermark({0: 5, 1: 9, 2: 3})
    assert not clock.le_watermark({0: 5, 1: 8, 2: 3})


@given(clocks, clocks)
def test_merge_is_the_least_upper_bound(a: VectorClock, b: VectorClock) -> None:
    merged = a.merge(b)
    assert a <= merged and b <= merged
    assert merged == b.merge(a)
    for shard, counter in merged.items():
        assert counter == max(a[shard], b[shard])


@given(clocks)
def test_encodings_round_trip(clock: VectorClock) -> None:
    assert VectorClock.decode(clock.encode()) == clock
    assert VectorClock.from_wire(clock.to_wire()) == clock


@pytest.mark.parametrize(
    "data", [b"\x05", b"\x01\x00", b"\x01\x00\x01\x00", b"\xff" * 12, b"\x80"]
)
def test_bad_encodings_raise_a_typed_error(data: bytes) -> None:
    with pytest.raises(InvalidRequest):
        VectorClock.decode(data)


@pytest.mark.parametrize("flat", [[1], [1, -1], ["a", 1], {"0": 1}, [1.5, 2]])
def test_bad_wire_clocks_raise_a_typed_error(flat: object) -> None:
    with pytest.raises(InvalidRequest):
        VectorClock.from_wire(flat)


def test_empty_encoding_is_one_byte() -> None:
    assert EMPTY.encode() == b"\x00"
