"""The bank invariant (jepsen.checkers.bank), after Jepsen's bank test."""

from __future__ import annotations

from pathlib import Path

from jepsen.checkers.bank import check_bank
from jepsen.history import Op, read_history


def _read(balances: dict[int, int | None], index: int, type_: str = "ok") -> Op:
    return Op(type_, "read", balances, 0, index, index)


def test_conserved_total_is_valid() -> None:
    history = [
        _read({0: 10, 1: 10}, 0),
        Op("ok", "transfer", {"from": 0, "to": 1, "amount": 5}, 1, 1, 1),
        _read({0: 5, 1: 15}, 2),
    ]
    result = check_bank(history)
    assert result["valid"] and result["total"] == 20 and result["read_count"] == 2


def test_wrong_total_and_negative_balances_are_reported() -> None:
    history = [_read({0: 10, 1: 10}, 0), _read({0: 15, 1: 10}, 1), _read({0: 25, 1: -5}, 2)]
    result = check_bank(history)
    assert not result["valid"]
    assert [read["index"] for read in result["bad_reads"]] == [1, 2]
    assert result["bad_reads"][0]["errors"] == ["wrong-total"]
    assert result["bad_reads"][1]["errors"] == ["negative-value"]
    assert result["bad_reads"][1]["negative"] == [1]
    assert result["error_types"] == ["negative-value", "wrong-total"]
    assert check_bank(history[:1] + history[2:], negative_ok=True)["valid"]


def test_given_total_and_accounts() -> None:
    history = [_read({0: 10, 1: 10}, 0), _read({0: 20, 2: 0}, 1), _read({0: 20, 1: None}, 2)]
    result = check_bank(history, total=20, accounts=[0, 1])
    assert [read["errors"] for read in result["bad_reads"]] == [
        ["unexpected-key", "wrong-n"],
        ["nil-balance"],
    ]


def test_only_ok_reads_are_judged() -> None:
    history = [_read({0: 10}, 0), _read({0: 99}, 1, "info"), _read({0: 99}, 2, "fail")]
    assert check_bank(history)["valid"]


def test_jepsen_vectors(vectors: Path) -> None:
    # Verdicts from the vectors' README.md (Jepsen's bank checker).
    assert check_bank(read_history(vectors / "bank.edn"))["valid"]
    tidb = check_bank(read_history(vectors / "bank-tidb.edn"))
    assert not tidb["valid"] and "wrong-total" in tidb["error_types"]
    assert check_bank(read_history(vectors / "bank-neg.edn"), negative_ok=True)["valid"]
