"""Consistency conditions 1-12 (TPC-C clause 3.3.2): true after the load and after a mixed
run on two shards; one corrupted value turns exactly the conditions that depend on it false."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from bench.tpcc import consistency, schema
from bench.tpcc.driver import Driver, DriverConfig
from bench.tpcc.local import SimulatedTarget
from bench.tpcc.schema import Key, Layout
from tests.tpcc.conftest import TINY, Tiny

ALL = set(consistency.CONDITIONS)


def failed(rows: dict[Key, Any]) -> set[int]:
    report = consistency.check(rows, TINY)
    return {number for number, holds in report.conditions.items() if not holds}


def test_all_conditions_hold_after_the_load() -> None:
    tiny = Tiny([1, 2, 3], 2)
    report = consistency.check(tiny.rows(), TINY)
    assert report.conditions == dict.fromkeys(ALL, True), report.summary()


def test_all_conditions_hold_after_a_mixed_concurrent_run_on_two_shards() -> None:
    """Eight terminals interleaved on the simulated cluster: conflicts, remote orders and
    payments across the shards, rollbacks, deliveries."""
    tiny = Tiny([1, 2, 3, 4], 2)
    target = SimulatedTarget(tiny.cluster)
    config = DriverConfig([1, 2, 3, 4], Layout(2), TINY, terminals=8, seed=3, transactions_per_terminal=60)
    stats = asyncio.run(Driver(target, config).run())
    report = stats.report()
    assert report["transactions"] == 8 * 60
    assert report["per_type"]["delivery"]["completed"] > 0
    assert report["cross_shard_fraction"] > 0
    assert report["abort_rate"] > 0  # the terminals did interleave and conflict
    assert not report["errors"]
    # The transactional snapshot and the replicas' stores agree, and both are consistent.
    snapshot = asyncio.run(consistency.snapshot(target.run, [1, 2, 3, 4], Layout(2)))
    rows = tiny.rows()
    assert snapshot == {key: value for key, value in rows.items() if key[0] != "item"}
    verdict = consistency.check(snapshot, TINY)
    assert verdict.all_true, verdict.summary()
    assert len(verdict.conditions) == 12


def first_key(rows: dict[Key, Any], table: str, where: Callable[[Any], bool] = lambda _: True) -> Key:
    return next(key for key in sorted(rows) if key[0] == table and where(rows[key]))


def add(rows: dict[Key, Any], table: str, field: str, delta: int) -> None:
    key = first_key(rows, table)
    rows[key] = {**rows[key], field: rows[key][field] + delta}


def delete(rows: dict[Key, Any], table: str, where: Callable[[Any], bool] = lambda _: True) -> None:
    del rows[first_key(rows, table, where)]


def set_field(rows: dict[Key, Any], table: str, field: str, value: Any, where: Callable[[Any], bool]) -> None:
    key = first_key(rows, table, where)
    rows[key] = {**rows[key], field: value}


def delete_middle_new_order(rows: dict[Key, Any]) -> None:
    prefix = schema.new_orders_prefix(1, 1)
    keys = sorted(k for k in rows if k[:3] == prefix)
    del rows[keys[len(keys) // 2]]


@pytest.mark.parametrize(
    ("corrupt", "expected"),
    [
        # W_YTD takes part in condition 1 (against D_YTD) and 8 (against HISTORY).
        (lambda rows: add(rows, "warehouse_ytd", "w_ytd", 1), {1, 8}),
        (lambda rows: add(rows, "district_ytd", "d_ytd", 1), {1, 9}),
        (lambda rows: add(rows, "district", "d_next_o_id", 1), {2}),
        # A hole in NEW-ORDER: 3, and its order now looks delivered without a carrier (5, 11).
        (delete_middle_new_order, {3, 5, 11}),
        (lambda rows: add(rows, "order", "o_ol_cnt", 1), {4, 6}),
        (lambda rows: delete(rows, "order_line"), {4, 6}),
        (
            lambda rows: set_field(rows, "order", "o_carrier_id", None, lambda o: o["o_carrier_id"]),
            {5, 7},
        ),
        (
            lambda rows: set_field(
                rows, "order_line", "ol_delivery_d", None, lambda line: line["ol_delivery_d"]
            ),
            {7},
        ),
        (lambda rows: add(rows, "history", "h_amount", 1), {8, 9, 10}),
        (lambda rows: add(rows, "customer", "c_balance", 1), {10, 12}),
        (lambda rows: add(rows, "customer", "c_ytd_payment", 1), {12}),
        # A delivered line's amount counts in the customer's balance (10 and 12).
        (lambda rows: add(rows, "order_line", "ol_amount", 1), {10, 12}),
    ],
)
def test_a_corrupted_value_turns_its_conditions_false(
    corrupt: Callable[[dict[str, Any]], None], expected: set[int]
) -> None:
    rows = Tiny([1, 2], 2).rows()
    assert failed(rows) == set()
    corrupt(rows)
    assert failed(rows) == expected


def test_a_failure_is_explained() -> None:
    rows = Tiny([1], 1).rows()
    rows[schema.warehouse_ytd_key(1)]["w_ytd"] += 5
    report = consistency.check(rows, TINY)
    assert report.conditions[1] is False
    assert "warehouse 1: W_YTD" in report.failures[1][0]
    assert "FAILED conditions 1, 8" in report.summary()


def test_loading_through_transactions_and_a_paged_snapshot_give_back_the_same_rows() -> None:
    """The path a real cluster uses: tpcc_load batches in (ITEM's certified on every
    shard), tpcc_scan pages out (each page starting at ``schema.key_after`` the last key)."""
    from bench.tpcc import loader, procedures
    from bench.tpcc.local import replica_rows
    from store.core.keys import unpack
    from store.core.txn import Procedures
    from store.sim.local import LocalCluster

    registry = Procedures()
    procedures.register(registry)
    cluster = LocalCluster(2, registry, schema.partitioner(2))
    target = SimulatedTarget(cluster)
    initial = loader.initial_rows([1, 2], Layout(2), TINY, seed=5)
    written = asyncio.run(loader.load_through_transactions(target.run, initial, concurrency=4))
    expected = initial.all()
    assert written == len(expected)
    assert replica_rows(cluster) == expected
    # Each warehouse's rows are on its own shard, and ITEM is on both.
    for shard in range(2):
        held = {unpack(key) for key in cluster.replica(shard).store.all_keys()}
        assert held == initial.by_shard[shard].keys() | initial.items.keys()
    assert all(key[1] % 2 == shard for shard, rows in enumerate(initial.by_shard) for key in rows)
    snapshot = asyncio.run(consistency.snapshot(target.run, [1, 2], Layout(2), page_rows=97))
    assert snapshot == {key: value for key, value in expected.items() if key[0] != "item"}
    assert consistency.check(snapshot, TINY).all_true
