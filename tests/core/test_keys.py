"""Typed keys (store.core.keys, issue 15): tuples packed into strings whose order is the
tuples' order, refused when malformed, and placed in tables by their first element."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.core import keys as keys_module
from store.core.errors import InvalidRequest
from store.core.keys import check_packed, from_stored, pack, prefix_range, to_stored, unpack
from store.core.partition import in_one_table, table_end, table_of

INT64 = st.integers(min_value=-(1 << 64) + 1, max_value=(1 << 64) - 1)
ELEMENTS = st.recursive(
    st.one_of(st.text(max_size=6), INT64, st.binary(max_size=6)),
    lambda inner: st.lists(inner, max_size=3).map(tuple),
    max_leaves=6,
)
KEYS = st.lists(ELEMENTS, min_size=1, max_size=4).map(tuple)

# The order the packing promises: element by element, types ranked bytes < strings <
# tuples < integers, a tuple before any longer one it is a prefix of.
_RANK = {bytes: 0, str: 1, tuple: 2, int: 3}


def _order(value: Any) -> Any:
    kind = type(value)
    if kind is tuple:
        return (_RANK[tuple], [_order(item) for item in value])
    if kind is str:
        return (_RANK[str], value.encode())
    return (_RANK[kind], value)


@given(KEYS, KEYS)
def test_packing_preserves_the_order_of_tuples(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    left, right = [_order(x) for x in a], [_order(x) for x in b]
    assert (pack(a) < pack(b)) == (left < right)
    assert (pack(a) == pack(b)) == (a == b)


@given(KEYS)
def test_a_packing_unpacks_to_its_tuple_and_is_a_packed_key(key: tuple[Any, ...]) -> None:
    packed = pack(key)
    assert unpack(packed) == key
    assert from_stored(packed) == key
    assert packed < " "  # never a plain string key
    assert max(packed) <= "\xff"


@given(KEYS, KEYS)
def test_a_prefix_range_holds_exactly_the_tuples_that_extend_the_prefix(
    prefix: tuple[Any, ...], key: tuple[Any, ...],
) -> None:
    lo, hi = prefix_range(prefix)
    extends = key[: len(prefix)] == prefix
    assert (lo <= pack(key) < hi) == extends
    longer = prefix + key
    assert lo <= pack(longer) < hi


@given(KEYS)
def test_a_tuple_keys_table_is_its_first_element(key: tuple[Any, ...]) -> None:
    packed = pack(key)
    table = table_of(packed)
    assert table == pack(key[:1])
    assert table <= packed < table_end(table)
    lo, hi = prefix_range(key[:1])
    assert in_one_table(lo, hi)


def test_string_keys_keep_their_tables() -> None:
    assert to_stored("stock/1/2") == "stock/1/2"
    assert from_stored("stock/1/2") == "stock/1/2"
    assert table_of("stock/1/2") == "stock"
    assert in_one_table("stock/", "stock0")
    assert not in_one_table("stock/", "stock1")
    assert not in_one_table("stock", "stock/9")


@pytest.mark.parametrize(
    ("key", "error"),
    [
        ((), "empty tuple"),
        ((1.5,), "strings, integers, bytes or tuples"),
        (("a", None), "strings, integers, bytes or tuples"),
        ((1 << 64,), "fit in 8 bytes"),
        ((-(1 << 64),), "fit in 8 bytes"),
        ([1, 2], "strings or tuples"),
    ],
)
def test_keys_that_cannot_be_packed_are_refused(key: Any, error: str) -> None:
    with pytest.raises(InvalidRequest, match=error):
        to_stored(key)


@pytest.mark.parametrize(
    "packed",
    [
        "\x02abc",  # a string not closed
        "\x15",  # an integer cut short
        "\x16\x00\x05",  # an integer not in its shortest form
        "\x05\x15\x01",  # a nested tuple not closed
        "\x03",  # no such type code
        "\x02\xc3\x00",  # a string that is not UTF-8
        "\x02a\u0100\x00",  # a character above 0xFF
        "\x00",  # nothing but an end
    ],
)
def test_malformed_packings_are_refused(packed: str) -> None:
    with pytest.raises(InvalidRequest):
        unpack(packed)


def _general(packed: str) -> tuple[Any, ...] | None:
    """The general parse (no fast path), or None where it refuses."""
    try:
        items, _ = keys_module._unpack_items(packed, 0, nested=False, depth=0)
    except InvalidRequest:
        return None
    return tuple(items) if items else None


def _roundtrips(packed: str) -> bool:
    """The definition check_packed implements without building the tuple."""
    general = _general(packed)
    return general is not None and pack(general) == packed


def _unpacked(packed: str) -> tuple[Any, ...] | None:
    try:
        return unpack(packed)
    except InvalidRequest:
        return None


def _accepted(packed: str) -> bool:
    try:
        check_packed(packed)
    except InvalidRequest:
        return False
    return True


# Strings shaped like packings: elements of a type code (or none), a body and perhaps an
# end, from the characters packings are made of and a few they never hold.
CHUNKS = st.tuples(
    st.sampled_from(["\x01", "\x02", "\x05", "\x0b", "\x0c", "\x13", "\x14", "\x15", "\x16",
                     "\x1c", "\x1d", "\x00", ""]),
    st.text(alphabet="\x00\xff\xc3\xa9\x80a\u0100", max_size=3),
    st.sampled_from(["", "\x00", "\x00\xff"]),
).map("".join)
PIECES = st.lists(CHUNKS, max_size=4).map("".join)


@settings(max_examples=500)
@given(st.one_of(PIECES, KEYS.map(pack)))
def test_a_packed_keys_check_accepts_exactly_the_packings(packed: str) -> None:
    """check_packed (one pass, nothing built) and unpack (with its fast path for flat
    tuples) agree with the general parse."""
    assert _accepted(packed) == _roundtrips(packed)
    assert _unpacked(packed) == _general(packed)


@pytest.mark.parametrize(
    "packed",
    ["\x02abc", "\x15", "\x16\x00\x05", "\x05\x15\x01", "\x03", "\x02\xc3\x00", "\x02a\u0100\x00",
     "\x00", "\x13\xff", "", "\x01\u0100\x00", "\x15\u0100", "\x05\x02\xc3\x00\x00"],
)
def test_a_packed_keys_check_refuses_malformed_packings(packed: str) -> None:
    with pytest.raises(InvalidRequest):
        check_packed(packed)
