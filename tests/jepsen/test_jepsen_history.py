"""Histories in Jepsen's history.edn format (jepsen.history)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jepsen.edn import Keyword, loads
from jepsen.history import Op, format_op, read_history, write_history


def test_format_op_uses_jepsen_key_order_and_keywords() -> None:
    op = Op("ok", "txn", [["append", 1, 2], ["r", 1, [2]]], 3, 1000, 7)
    assert format_op(op) == (
        "{:type :ok, :f :txn, :value [[:append 1 2] [:r 1 [2]]], :process 3, :time 1000, :index 7}"
    )


def test_bank_ops_are_written_with_keyword_transfer_keys() -> None:
    transfer = Op("invoke", "transfer", {"from": 1, "to": 2, "amount": 5}, 0, 5, 0)
    assert ":value {:from 1, :to 2, :amount 5}" in format_op(transfer)
    read = Op("ok", "read", {0: 10, 1: 20}, 0, 6, 1)
    assert ":value {0 10, 1 20}" in format_op(read)


def test_write_then_read_gives_equal_ops(tmp_path: Path) -> None:
    ops = [
        Op("invoke", "txn", [["append", 1, 2], ["r", 1, None]], 0, 10, 0),
        Op("invoke", "read", None, 1, 11, 1),
        Op("ok", "txn", [["append", 1, 2], ["r", 1, [2]]], 0, 20, 2),
        Op("info", "read", None, 1, 30, 3, {Keyword("error"): Keyword("timeout")}),
        Op("info", "kill", "all", "nemesis", 31, 4),
    ]
    path = tmp_path / "history.edn"
    write_history(path, ops)
    lines = path.read_text().splitlines()
    assert len(lines) == len(ops)
    assert all(isinstance(loads(line), dict) for line in lines)
    again = read_history(path)
    assert again == ops
    assert isinstance(again[0].value[0][0], Keyword)
    assert again[3].extra == {"error": "timeout"}


def test_read_accepts_missing_f_time_and_index() -> None:
    ops = read_history(
        "{:type :invoke, :process 2, :value [[:r 4 nil]]}\n{:type :ok :process 2 :value [[:r 4 []]]}"
    )
    assert [op.index for op in ops] == [0, 1]
    assert ops[1].f is None and ops[1].time is None
    assert ops[1].value == [["r", 4, []]]


def test_every_vector_reads_and_round_trips(vectors: Path, tmp_path: Path) -> None:
    for path in sorted(vectors.glob("*.edn")):
        ops = read_history(path)
        assert ops, path
        copy = tmp_path / path.name
        write_history(copy, ops)
        assert read_history(copy) == ops, path


def test_read_accepts_op_records() -> None:
    ops = read_history("#jepsen.history.Op{:index 0, :time 5, :type :invoke, :process 0, :f :read}")
    assert ops == [Op("invoke", "read", None, 0, 5, 0)]


def test_unknown_type_is_rejected() -> None:
    with pytest.raises(ValueError, match="type"):
        read_history("{:type :maybe, :process 0}")
