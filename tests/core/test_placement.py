"""Placement by key prefix (issue 15): which shard holds a key, set per table in the cluster
file's ``[placement]``; replicated tables; ranges served by one shard when they can be."""

from __future__ import annotations

import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store.config import ConfigError, from_dict
from store.core.keys import pack, prefix_range
from store.core.partition import Partitioner, PrefixPartitioner, WorkerPartitioner, clock_marks
from store.node.up import format_placement

FOUR = [{"leader": f"h:{i + 1}"} for i in range(4)]


def _config(placement: dict[str, Any], partitioner: str = "hash") -> Any:
    return from_dict({"shards": FOUR, "cluster": {"partitioner": partitioner}, "placement": placement})


def test_a_table_placed_by_its_field_puts_string_and_tuple_keys_alike() -> None:
    partitioner = _config({"tables": {"stock": {"field": 1}}}).partitioner()
    for w in range(8):
        assert partitioner.shard_of(pack(("stock", w, 17))) == w % 4
        assert partitioner.shard_of(f"stock/{w}/17") == w % 4
    # Other tables are hashed (partitioner = "hash"), as without [placement].
    assert partitioner.shard_of("orders/5/1") == Partitioner(4).shard_of("orders/5/1")
    # A prefix that fixes the field is read on one shard; one that does not, on all.
    lo, hi = prefix_range(("stock", 6))
    assert list(partitioner.shards_of_range(lo, hi)) == [2]
    lo, hi = prefix_range(("stock",))
    assert list(partitioner.shards_of_range(lo, hi)) == [0, 1, 2, 3]
    assert list(partitioner.shards_of_range(pack(("stock", 6, 1)), pack(("stock", 6, 9)))) == [2]
    # A key's successor (a packing and 0x00: where the next page of a scan starts) too.
    assert list(partitioner.shards_of_range(pack(("stock", 6, 1)) + "\x00", hi)) == [0, 1, 2, 3]
    lo, hi = prefix_range(("stock", 6))
    assert list(partitioner.shards_of_range(pack(("stock", 6, 1)) + "\x00", hi)) == [2]


def test_range_placement_by_splits() -> None:
    partitioner = _config({"tables": {"orders": {"field": 2, "splits": [10, 20, 30]}}}).partitioner()
    where = [partitioner.shard_of(pack(("orders", "x", n))) for n in (-5, 0, 9, 10, 19, 20, 29, 30, 999)]
    assert where == [0, 0, 0, 1, 1, 2, 2, 3, 3]
    # A key without an integer at the field is hashed.
    assert partitioner.shard_of(pack(("orders", "x", "y"))) == Partitioner(4).shard_of(pack(("orders", "x", "y")))


def test_replicated_tables_are_on_every_shard() -> None:
    partitioner = _config({"replicated": ["item"]}, partitioner="prefix").partitioner()
    assert isinstance(partitioner, PrefixPartitioner)
    assert partitioner.replicated
    assert partitioner.is_replicated(pack(("item", 5))) and partitioner.is_replicated("item/5")
    assert not partitioner.is_replicated(pack(("stock", 5)))
    # A transaction of warehouse 1's keys and ITEM reads stays on warehouse 1's shard.
    assert partitioner.owns_all([pack(("stock", 1, 5)), pack(("item", 5))], 1)
    assert not partitioner.owns_all([pack(("stock", 1, 5)), pack(("stock", 2, 5))], 1)


ELEMENTS = st.one_of(
    st.integers(min_value=-(1 << 64) + 1, max_value=(1 << 64) - 1), st.text(max_size=4),
    st.binary(max_size=3), st.tuples(st.integers(min_value=0, max_value=300)),
)
TUPLES = st.tuples(
    st.sampled_from(["stock", "orders", "item", "other"]), st.lists(ELEMENTS, max_size=3),
).map(lambda parts: (parts[0], *parts[1]))


@given(TUPLES)
def test_a_tuple_keys_shard_follows_its_tables_rule(key: tuple[Any, ...]) -> None:
    """The shard, computed from the tuple itself: the rule's field an integer, else a hash;
    a prefix's range end and a key's successor place as the key does."""
    partitioner = _config(
        {"replicated": ["item"], "tables": {"orders": {"field": 2, "splits": [10, 20, 30]}}},
        partitioner="prefix",
    ).partitioner()
    field, splits = {"orders": (2, [10, 20, 30])}.get(key[0], (1, []))
    packed = pack(key)
    hashed = zlib.crc32(packed.encode()) % 4
    if key[0] == "item":
        expected = hashed  # replicated: hashed for routing only
    elif len(key) > field and type(key[field]) is int:
        value = key[field]
        expected = min(sum(1 for split in splits if split <= value), 3) if splits else value % 4
    else:
        expected = hashed
    assert partitioner.shard_of(packed) == expected
    assert partitioner.is_replicated(packed) == (key[0] == "item")
    assert partitioner.owns_all([packed], expected) and (
        key[0] == "item" or not partitioner.owns_all([packed], (expected + 1) % 4)
    )
    if len(key) > field and type(key[field]) is int and key[0] != "item":
        lo, hi = prefix_range(key[: field + 1])
        assert list(partitioner.shards_of_range(lo, hi)) == [expected]
        assert list(partitioner.shards_of_range(packed + "\x00", hi)) == [expected]


def test_status_shows_the_placement() -> None:
    config = _config({"replicated": ["item"], "tables": {"orders": {"field": 2, "splits": [10]}}}, "prefix")
    assert format_placement(config) == (
        "placement: replicated on every shard: item; orders: field 2 in ranges split at [10]; "
        "other tables: field 1 mod shards"
    )
    assert format_placement(from_dict({"shards": FOUR})) == "placement: other tables: hash"


@pytest.mark.parametrize(
    ("placement", "complaint"),
    [
        ({"replicate": ["item"]}, "unknown key 'replicate'"),
        ({"replicated": "item"}, "list of table names"),
        ({"tables": {"stock": {"field": 0}}}, "index of 1 or more"),
        ({"tables": {"stock": {"field": "1"}}}, "index of 1 or more"),
        ({"tables": {"stock": {"splits": [3, 2]}}}, "ascending distinct"),
        ({"tables": {"stock": {"splits": [1, 2, 3, 4]}}}, "more ranges than the 4 shards"),
        ({"tables": {"stock": {"by": "hash"}}}, "unknown key 'by'"),
        ({"tables": {"item": {}}, "replicated": ["item"]}, "replicated on every shard"),
        ({"tables": []}, "must be a table"),
    ],
)
def test_bad_placement_is_refused_with_the_reason(placement: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint):
        _config(placement)


@pytest.mark.parametrize(("shards", "workers"), [(1, 2), (2, 2), (3, 2), (4, 2), (2, 4)])
def test_a_shards_keys_spread_over_its_workers_one_warehouse_on_one(shards: int, workers: int) -> None:
    """Workers (issue 16): the placement rule one level down. Every worker of every shard
    gets a fair share, by field or by hash, and the keys of one warehouse share a worker."""
    by_field = PrefixPartitioner(shards, field=1)
    hashed = Partitioner(shards)
    for partitioner, keys in (
        (by_field, [pack(("stock", w, item)) for w in range(64) for item in range(4)]),
        (by_field, [f"stock/{w}/{item}" for w in range(64) for item in range(4)]),
        (hashed, [f"k{i}" for i in range(4000)]),
    ):
        load: dict[tuple[int, int], int] = {}
        for key in keys:
            place = (partitioner.shard_of(key), partitioner.worker_of(key, workers))
            assert 0 <= place[1] < workers
            load[place] = load.get(place, 0) + 1
        assert len(load) == shards * workers  # no worker of any shard left without keys
        fair = len(keys) / (shards * workers)
        assert all(0.8 * fair <= n <= 1.2 * fair for n in load.values()), load
    for w in range(64):
        assert len({by_field.worker_of(pack(("stock", w, item)), workers) for item in range(9)}) == 1
        assert by_field.worker_of(f"stock/{w}/1", workers) == by_field.worker_of(pack(("stock", w, 1)), workers)
    assert {Partitioner(shards).worker_of(f"k{i}", 1) for i in range(100)} == {0}


def test_a_range_is_read_on_the_one_worker_that_holds_it() -> None:
    """A snapshot read covers one unit: a range within one warehouse (TPC-C's scans) must
    map to its worker alone, and a range across warehouses to every unit it may touch, also
    with one shard (where every range is on shard 0, but not on one worker)."""
    for shards, workers in ((1, 2), (2, 2), (3, 4)):
        units = WorkerPartitioner(PrefixPartitioner(shards, field=1, replicated_tables=["item"]), workers)
        for w in range(1, 20):
            lo, hi = prefix_range(("order_line", w))
            assert list(units.shards_of_range(lo, hi)) == [units.shard_of(pack(("order_line", w, 3, 1)))]
        lo, hi = pack(("order_line", 1)), pack(("order_line", 3))
        touched = sorted(units.shards_of_range(lo, hi))
        assert len(touched) == (workers if shards == 1 else shards * workers)
        lo, hi = prefix_range(("item",))
        assert len(units.shards_of_range(lo, hi)) == shards * workers  # replicated: anywhere


def test_range_placed_keys_spread_over_workers_by_their_field() -> None:
    split = PrefixPartitioner(2, field=None, tables={"stock": (1, [10])})
    assert [split.worker_of(pack(("stock", w, 1)), 2) for w in range(8, 13)] == [0, 1, 0, 1, 0]


@pytest.mark.parametrize("base", [Partitioner(3), PrefixPartitioner(3, field=1)])
def test_a_worker_partitioner_puts_each_key_on_its_shards_worker(base: Partitioner) -> None:
    units = WorkerPartitioner(base, 2)
    assert units.shard_count == 6 and units.shards == 3
    keys = [f"t/{n}/x" for n in range(200)] + [f"k{n}" for n in range(200)]
    for key in keys:
        unit = units.shard_of(key)
        assert unit == base.shard_of(key) * 2 + base.worker_of(key, 2)
        assert units.clock_of(unit) == base.shard_of(key)  # its counter is its shard's
        assert units.owns_all([key], unit) and not units.owns_all([key], unit ^ 1)
    by_unit: dict[int, list[str]] = {}
    for key in keys:
        by_unit.setdefault(units.shard_of(key), []).append(key)
    for unit, owned in by_unit.items():
        stranger = by_unit[(unit + 1) % units.shard_count][0]
        assert units.owns_all(owned, unit) and not units.owns_all([*owned[:3], stranger], unit)
    one_warehouse = sorted(units.shards_of_range("t/1/", "t/1/~"))
    if isinstance(base, PrefixPartitioner):  # one warehouse's range: its worker alone
        assert one_warehouse == [units.shard_of("t/1/x")]
    else:
        assert one_warehouse == [0, 1, 2, 3, 4, 5]
    assert list(units.shards_of_range("a", "b")) == [0, 1, 2, 3, 4, 5]
    # Leaders' reported watermarks by unit, as a shard's: the least of its workers'; a shard
    # with a worker unheard of is not known.
    assert clock_marks({0: 9, 1: 4, 2: 7, 3: 8, 4: 5}, units.workers) == {0: 4, 1: 7}
    assert clock_marks({0: 9, 2: 7}, base.workers) == {0: 9, 2: 7}
    with pytest.raises(ValueError):
        WorkerPartitioner(base, 0)
