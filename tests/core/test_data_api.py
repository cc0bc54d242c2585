"""The data API procedures and operation lists see (issue 15): tuple keys, prefix and
reverse range reads, point and range reads in one round, counts, clear_range; on real shard
leaders, with keys spread over two shards."""

from __future__ import annotations

from typing import Any

import pytest

from store.core.errors import InvalidRequest
from store.core.txn import Procedures, Range, Tx
from store.sim.local import LocalCluster


def _lists(value: Any) -> Any:
    """A result as the client gets it: a procedure's tuples arrive as arrays (lists)."""
    if isinstance(value, list | tuple):
        return [_lists(item) for item in value]
    return value


def _cluster() -> tuple[LocalCluster, Procedures]:
    procedures = Procedures()
    return LocalCluster(shards=2, procedures=procedures), procedures


async def new_orders(tx: Tx, district: int, count: int) -> None:
    for order in range(1, count + 1):
        tx.put(("order", 1, district, order), {"lines": order})


def test_a_prefix_read_from_its_end_finds_the_newest_order() -> None:
    cluster, procedures = _cluster()
    procedures.register("new_orders", new_orders)

    async def newest(tx: Tx, district: int) -> Any:
        return await tx.scan_prefix(("order", 1, district), 1, reverse=True)

    procedures.register("newest", newest)
    cluster.run("new_orders", 3, 12)
    cluster.run("new_orders", 4, 2)
    assert cluster.run("newest", 3) == _lists([(("order", 1, 3, 12), {"lines": 12})])
    assert cluster.run("newest", 4) == _lists([(("order", 1, 4, 2), {"lines": 2})])
    assert cluster.run("newest", 5) == []
    # The keys are on both shards: the reverse read merged the two shards' ends.
    shards = {cluster.partitioner.shard_of(key) for key in cluster.replica(0).store.all_keys()}
    shards |= {cluster.partitioner.shard_of(key) for key in cluster.replica(1).store.all_keys()}
    assert shards == {0, 1}


def test_point_and_range_reads_in_one_round_with_the_transactions_own_writes() -> None:
    cluster, procedures = _cluster()
    procedures.register("new_orders", new_orders)
    cluster.run("new_orders", 1, 5)

    async def delivery(tx: Tx) -> Any:
        tx.put(("order", 1, 1, 6), {"lines": 6})  # read back by the scans below
        tx.delete(("order", 1, 1, 1))
        values, scans = await tx.read_many(
            gets=[("order", 1, 1, 2), ("order", 1, 1, 1), ("stock", 9)],
            scans=[
                Range.prefix(("order", 1, 1), 2),
                Range.prefix(("order", 1, 1), 2, reverse=True),
                Range(("order", 1, 1, 3), ("order", 1, 1, 9), keys_only=True),
            ],
        )
        count = await tx.count(("order", 1, 1), ("order", 1, 2))
        return values, scans, count

    procedures.register("delivery", delivery)
    values, scans, count = cluster.run("delivery")
    assert values == [{"lines": 2}, None, None]
    assert scans[0] == _lists([(("order", 1, 1, 2), {"lines": 2}), (("order", 1, 1, 3), {"lines": 3})])
    assert scans[1] == _lists([(("order", 1, 1, 6), {"lines": 6}), (("order", 1, 1, 5), {"lines": 5})])
    assert scans[2] == _lists([("order", 1, 1, 3), ("order", 1, 1, 4), ("order", 1, 1, 5), ("order", 1, 1, 6)])
    assert count == 5


def test_clear_range_deletes_a_range_and_nothing_beside_it() -> None:
    cluster, procedures = _cluster()
    procedures.register("new_orders", new_orders)
    cluster.run("new_orders", 1, 4)
    cluster.run("new_orders", 2, 3)

    async def clear(tx: Tx, district: int) -> int:
        return await tx.clear_range(("order", 1, district), ("order", 1, district + 1))

    async def count(tx: Tx, district: int) -> int:
        return await tx.count(("order", 1, district), ("order", 1, district + 1))

    procedures.register("clear", clear)
    procedures.register("count", count)
    assert cluster.run("clear", 1) == 4
    assert (cluster.run("count", 1), cluster.run("count", 2)) == (0, 3)
    assert cluster.run("clear", 1) == 0


def test_a_scan_after_deletes_in_its_range_still_returns_its_limit() -> None:
    """The transaction's own deletes would take the place of keys the store returns: the
    store is asked for one more key per delete, so the limit is still met."""
    cluster, _ = _cluster()
    cluster.ops([["put", ("t", i), i] for i in range(6)])
    assert cluster.ops([["delete", ("t", 0)], ["delete", ("t", 1)], ["scan", ("t", 0), ("t", 9), 2]]) == [
        None, None, _lists([[("t", 2), 2], [("t", 3), 3]]),
    ]
    assert cluster.ops([["delete", ("t", 5)], ["scan", ("t", 0), ("t", 9), -2]]) == [
        None, _lists([[("t", 4), 4], [("t", 3), 3]]),
    ]
    assert cluster.ops([["clear_range", ("t", 0), ("t", 4)], ["scan", ("t", 0), ("t", 9), 1]]) == [
        2, _lists([[("t", 4), 4]]),  # (t, 0) and (t, 1) were deleted before
    ]


def test_operation_lists_take_tuple_keys_and_reverse_scans() -> None:
    cluster, _ = _cluster()
    cluster.ops([["put", ("t", i), i * 10] for i in range(5)])
    lo, hi = ("t", 1), ("t", 4)
    assert cluster.ops([["scan", lo, hi, -2]]) == _lists([[[("t", 3), 30], [("t", 2), 20]]])
    # Over the wire a tuple is an array: lists are taken as tuples.
    assert cluster.ops([["get", ["t", 2]]]) == [20]
    assert cluster.ops([["clear_range", ("t", 0), ("t", 2)], ["scan", ("t", 0), ("t", 9), 9]]) == _lists([
        2, [[("t", 2), 20], [("t", 3), 30], [("t", 4), 40]],
    ])


def test_keys_and_count_answer_a_scan_without_its_values() -> None:
    """``keys`` and ``count`` are scans answered with the keys alone or their number, the
    list's own writes before them included, from either end."""
    cluster, _ = _cluster()
    cluster.ops([["put", ("t", i), "x" * 100] for i in range(6)])
    lo, hi = ("t", 1), ("t", 9)
    assert cluster.ops([["keys", lo, hi, 3], ["keys", lo, hi, -2], ["count", lo, hi, 100]]) == [
        _lists([("t", 1), ("t", 2), ("t", 3)]), _lists([("t", 5), ("t", 4)]), 5,
    ]
    assert cluster.ops([["delete", ("t", 2)], ["put", ("t", 7), 0], ["count", lo, hi, 100],
                        ["keys", lo, hi, -1], ["count", lo, hi, 2]]) == [
        None, None, 5, _lists([("t", 7)]), 2,
    ]
    with pytest.raises(InvalidRequest, match="scan limit"):
        cluster.ops([["count", lo, hi, 0]])


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        ([["scan", ("t", 1), ("u", 1), 5]], "one table"),
        ([["scan", ("t", 1), ("t", 2), 0]], "scan limit"),
        ([["get", ("t", 1.5)]], "strings, integers, bytes or tuples"),
        ([["get", "\x02t"]], "not closed"),  # a string key that poses as a packing
        ([["put", ("t", "x" * 1024), 1]], "key longer than"),
    ],
)
def test_malformed_typed_operations_are_refused(ops: Any, message: str) -> None:
    cluster, _ = _cluster()
    with pytest.raises(InvalidRequest, match=message):
        cluster.ops(ops)


def test_a_clear_range_of_more_keys_than_a_transaction_may_write_is_refused() -> None:
    procedures = Procedures()

    async def clear(tx: Tx, hi: int) -> int:
        return await tx.clear_range(("big", 0), ("big", hi))

    procedures.register("clear", clear)
    cluster = LocalCluster(shards=1, procedures=procedures)
    limit = cluster.replica(0).coordinator.settings.ops_per_txn_max
    for start in range(0, limit + 1, 500):
        cluster.ops([["put", ("big", i), i] for i in range(start, min(start + 500, limit + 1))])
    for attempt in (lambda: cluster.ops([["clear_range", ("big", 0), ("big", limit + 1)]]),
                    lambda: cluster.run("clear", limit + 1)):
        with pytest.raises(InvalidRequest, match=f"more than {limit} keys; clear it in parts"):
            attempt()
    assert cluster.ops([["get", ("big", 0)]]) == [0]
    assert cluster.run("clear", limit) == limit  # exactly the limit: cleared
    assert cluster.ops([["get", ("big", 0)], ["get", ("big", limit)]]) == [None, limit]
