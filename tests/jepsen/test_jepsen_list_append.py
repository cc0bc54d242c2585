"""The Elle-style list-append checker (jepsen.checkers.list_append).

Each anomaly class gets a hand-built history, citing Adya's definitions (Adya, "Weak
Consistency", MIT 1999, section 4) as Elle uses them (Kingsbury and Alvaro, VLDB 2020,
sections 3-4). `HistoryBuilder` writes ops in call order, so "invoke 1, invoke 2, complete 1,
complete 2" makes two transactions overlap in real time; `txn` is one that overlaps nothing.
"""

from __future__ import annotations

import json
import random

import pytest

from jepsen.checkers.list_append import InvalidHistory, check_list_append
from jepsen.testing import HistoryBuilder, random_serializable_history

A = "append"
R = "r"


def _check(builder: HistoryBuilder, **options: object) -> dict:
    result = check_list_append(builder.ops, **options)  # type: ignore[arg-type]
    json.dumps(result)  # explanations must be plain data
    return result


def _types(builder: HistoryBuilder, **options: object) -> list[str]:
    return _check(builder, **options)["anomaly_types"]


def _concurrently(builder: HistoryBuilder, *txns: tuple) -> HistoryBuilder:
    """Invoke every transaction, then complete them all: no real-time order among them."""
    for process, *mops in txns:
        builder.invoke(process, *mops)
    for process, *_ in txns:
        builder.complete(process)
    return builder


# -- Valid histories ---------------------------------------------------------------------


def test_serial_history_is_valid() -> None:
    h = HistoryBuilder()
    h.txn(0, (A, "x", 1), (R, "x", [1]))
    h.txn(1, (R, "x", [1]), (A, "x", 2), (A, "y", 1))
    h.txn(0, (R, "x", [1, 2]), (R, "y", [1]))
    result = _check(h)
    assert result["valid"] and result["anomaly_types"] == [] and result["not"] == []


def test_concurrent_history_is_valid() -> None:
    # T1 and T2 overlap, so either order is fine; the reads after fix it as T2, T1.
    h = HistoryBuilder()
    _concurrently(h, (0, (A, "x", 1)), (1, (A, "x", 2), (R, "y", [])))
    h.txn(2, (R, "x", [2, 1]))
    assert _check(h)["valid"]


def test_indeterminate_transactions_are_maybe_committed() -> None:
    # An :info append may take effect any time after its invocation, or never.
    h = HistoryBuilder()
    h.invoke(0, (A, "x", 1))
    h.txn(1, (R, "x", []))  # before T0 took effect
    h.txn(1, (R, "x", [1]))  # after
    h.complete(0, "info")
    h.invoke(2, (A, "y", 1)).complete(2, "info")  # never seen: perhaps never happened
    h.txn(3, (R, "y", []))
    assert _check(h)["valid"]


def test_failed_transactions_do_not_count() -> None:
    h = HistoryBuilder()
    h.txn(0, (A, "x", 1), type_="fail")
    h.txn(1, (R, "x", []))
    h.txn(1, (A, "x", 2))
    h.txn(1, (R, "x", [2]))
    assert _check(h)["valid"]


def test_random_strictly_serializable_histories_are_valid() -> None:
    for seed in range(30):
        history = random_serializable_history(random.Random(seed), 150, keys=5)
        result = check_list_append(history)
        assert result["valid"], (seed, result["anomalies"])


def test_large_serializable_history_checks_without_anomalies() -> None:
    # 10k transactions, 20k ops: the cycle search must stay linear-ish (no wall-clock bound;
    # pytest's timeout catches a quadratic blow-up).
    history = random_serializable_history(random.Random(7), 10_000, processes=16, keys=200)
    assert len(history) == 20_000
    result = check_list_append(history)
    assert result["valid"] and result["anomaly_types"] == []
    assert result["ok_count"] > 9_000 and result["edge_count"] > 10_000


# -- Anomalies without cycles --------------------------------------------------------------


def test_g1a_aborted_read() -> None:
    # Adya G1a: T2 reads a version written by the aborted T1.
    h = HistoryBuilder()
    h.txn(0, (A, "x", 1), type_="fail")
    h.txn(1, (R, "x", [1]))
    result = _check(h)
    assert result["anomaly_types"] == ["G1a"]
    assert result["not"] == ["read-committed"]
    case = result["anomalies"]["G1a"][0]
    assert case["element"] == 1 and case["writer"]["type"] == "fail"


def test_g1b_intermediate_read() -> None:
    # Adya G1b: T2 reads x as T1 left it between T1's two appends.
    h = HistoryBuilder()
    _concurrently(h, (0, (A, "x", 1), (A, "x", 2)), (1, (R, "x", [1])))
    result = _check(h)
    assert result["anomaly_types"] == ["G1b"]
    assert result["anomalies"]["G1b"][0]["element"] == 1


def test_internal_inconsistency() -> None:
    # A transaction must see its own appends (Cerone et al.'s INT axiom).
    h = HistoryBuilder()
    h.txn(0, (A, "x", 1), (R, "x", []))
    h.txn(1, (A, "z", 5), (R, "z", [5]), (R, "z", [5, 6]))
    h.txn(2, (R, "w", [7]), (A, "w", 7))
    result = _check(h)
    assert result["anomaly_types"] == ["internal"]
    assert result["anomaly_counts"]["internal"] == 3
    first, second, third = result["anomalies"]["internal"]
    assert first["expected"] == ["...", 1]
    assert second["expected"] == [5]
    assert third["future"] == [7]
    assert result["not"] == ["read-atomic"]


def test_duplicate_elements() -> None:
    h = HistoryBuilder()
    h.txn(0, (A, "x", 1))
    h.txn(0, (A, "x", 2))
    h.txn(1, (R, "x", [1, 2, 1]))
    result = _check(h)
    assert result["anomaly_types"] == ["duplicate-elements"]
    assert result["anomalies"]["duplicate-elements"][0]["duplicates"] == {1: 2}
    assert result["not"] == ["read-uncommitted"]


def test_incompatible_order() -> None:
    # No single order of appends to x explains both reads.
    h = HistoryBuilder()
    _concurrently(h, (0, (A, "x", 1)), (1, (A, "x", 2)), (2, (R, "x", [1])), (3, (R, "x", [2])))
    result = _check(h)
    assert result["anomaly_types"] == ["incompatible-order"]
    assert result["anomalies"]["incompatible-order"][0]["values"] == [[1], [2]]


def test_lost_update() -> None:
    # Both read x empty and both appended: one of the two updates was made blind to the
    # other. With both committed this is always also a cycle of two anti-dependencies
    # (each read precedes the other's append), which Elle too classes as G2-item.
    h = HistoryBuilder()
    _concurrently(h, (0, (R, "x", []), (A, "x", 1)), (1, (R, "x", []), (A, "x", 2)))
    result = _check(h)
    assert result["anomaly_types"] == ["G2-item", "lost-update"]
    case = result["anomalies"]["lost-update"][0]
    assert case["key"] == "x" and case["value"] == [] and len(case["txns"]) == 2


# -- Dependency cycles ---------------------------------------------------------------------


def test_g0_write_cycle() -> None:
    # Adya G0: T1 and T2 each overwrite the other (x: 1 then 2; y: 2 then 1).
    h = HistoryBuilder()
    _concurrently(h, (0, (A, "x", 1), (A, "y", 1)), (1, (A, "x", 2), (A, "y", 2)))
    h.txn(2, (R, "x", [1, 2]), (R, "y", [2, 1]))
    result = _check(h)
    assert result["anomaly_types"] == ["G0"]
    assert result["not"] == ["read-uncommitted"]
    cycle = result["anomalies"]["G0"][0]
    assert [step["type"] for step in cycle["steps"]] == ["ww", "ww"]
    assert len(cycle["cycle"]) == 2


def test_g1c_circular_information_flow() -> None:
    # Adya G1c: T1 reads T2's append and T2 reads T1's.
    h = HistoryBuilder()
    _concurrently(h, (0, (A, "x", 1), (R, "y", [1])), (1, (A, "y", 1), (R, "x", [1])))
    result = _check(h)
    assert result["anomaly_types"] == ["G1c"]
    assert sorted(step["type"] for step in result["anomalies"]["G1c"][0]["steps"]) == [
        "wr",
        "wr",
    ]


def test_g_single_read_skew() -> None:
    # Adya G-single: T2 sees T1's append to y but not its append to x.
    h = HistoryBuilder()
    _concurrently(h, (0, (A, "x", 1), (A, "y", 1)), (1, (R, "x", []), (R, "y", [1])))
    result = _check(h)
    assert result["anomaly_types"] == ["G-single"]
    assert result["not"] == ["consistent-view", "repeatable-read"]
    steps = result["anomalies"]["G-single"][0]["steps"]
    assert sorted(step["type"] for step in steps) == ["rw", "wr"]


def test_g2_item_write_skew() -> None:
    # Adya G2-item: each reads the key the other appends to; two anti-dependencies.
    h = HistoryBuilder()
    _concurrently(h, (0, (R, "x", []), (A, "y", 1)), (1, (R, "y", []), (A, "x", 1)))
    result = _check(h)
    assert result["anomaly_types"] == ["G2-item"]
    assert result["not"] == ["repeatable-read"]
    assert not check_list_append(h.ops, consistency_models=["serializable"])["valid"]
    # Write skew is the one anomaly snapshot isolation allows.
    assert check_list_append(h.ops, consistency_models=["snapshot-isolation"])["valid"]


# -- Real-time variants: serializable, but not strictly ------------------------------------


def test_g0_realtime() -> None:
    # T1 finished before T2 began, yet x shows T2's append first.
    h = HistoryBuilder()
    h.txn(0, (A, "x", 1))
    h.txn(1, (A, "x", 2))
    h.txn(2, (R, "x", [2, 1]))
    result = _check(h)
    assert result["anomaly_types"] == ["G0-realtime"]
    assert check_list_append(h.ops, consistency_models=["serializable"])["valid"]


def test_g1c_realtime() -> None:
    # T1 completed having read what T2 appended only after T1 completed.
    h = HistoryBuilder()
    h.txn(0, (R, "x", [1]))
    h.txn(1, (A, "x", 1))
    result = _check(h)
    assert result["anomaly_types"] == ["G1c-realtime"]
    assert result["not"] == ["strong-read-committed"]


def test_g_single_realtime_stale_read() -> None:
    h = HistoryBuilder()
    h.txn(0, (A, "x", 1))
    h.txn(1, (R, "x", []))
    result = _check(h)
    assert result["anomaly_types"] == ["G-single-realtime"]
    steps = result["anomalies"]["G-single-realtime"][0]["steps"]
    assert sorted(step["type"] for step in steps) == ["realtime", "rw"]
    assert check_list_append(h.ops, consistency_models=["serializable"])["valid"]
    assert not result["valid"]


def test_g2_item_realtime() -> None:
    # T1 -rw-> T2 -rw-> T3 -realtime-> T1, with T2 overlapping both.
    h = HistoryBuilder()
    h.invoke(1, (A, "x", 1), (R, "y", []))
    h.txn(2, (A, "y", 1))
    h.txn(0, (R, "x", []))
    h.complete(1)
    result = _check(h)
    assert result["anomaly_types"] == ["G2-item-realtime"]
    assert result["not"] == ["strict-serializable"]


def test_process_order_variant() -> None:
    h = HistoryBuilder()
    h.txn(0, (A, "x", 1))
    h.txn(0, (R, "x", []))
    result = _check(h, realtime=False, process=True)
    assert result["anomaly_types"] == ["G-single-process"]


def test_indeterminate_transaction_precedes_nothing_in_its_process() -> None:
    # The :info append may take effect after the process's next transaction read x.
    h = HistoryBuilder()
    h.invoke(0, (A, "x", 1)).complete(0, "info")
    h.txn(0, (R, "x", []))
    assert _check(h, realtime=False, process=True)["valid"]
    assert _check(h)["valid"]


# -- Rules of the workload -----------------------------------------------------------------


def test_reused_element_is_rejected() -> None:
    h = HistoryBuilder()
    h.txn(0, (A, "x", 1))
    h.txn(1, (A, "x", 1))
    with pytest.raises(InvalidHistory, match="unique"):
        check_list_append(h.ops)


def test_unknown_micro_op_is_rejected() -> None:
    h = HistoryBuilder()
    h.txn(0, ("w", "x", 1))
    with pytest.raises(InvalidHistory):
        check_list_append(h.ops)
