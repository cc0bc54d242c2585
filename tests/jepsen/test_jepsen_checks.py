"""The committed-kept checker (jepsen.checks): nothing a client was told COMMITTED is lost,
clears included (the list-append workload's ``cleared/k`` markers)."""

from __future__ import annotations

from typing import Any

from jepsen.checks import committed_kept
from jepsen.history import Op


def _history(*txns: tuple[str, list[list[Any]], bool]) -> list[Op]:
    """(type, micro-ops, final) per transaction, one after another."""
    ops = []
    for type_, mops, final in txns:
        index = len(ops)
        ops.append(Op("invoke", "txn", mops, 0, index, index))
        ops.append(Op(type_, "txn", mops, 0, index + 1, index + 1, {"final": True} if final else {}))
    return ops


def test_a_committed_append_missing_from_the_final_read_is_lost() -> None:
    result = committed_kept(_history(
        ("ok", [["append", 1, 10]], False), ("ok", [["append", 1, 11]], False),
        ("ok", [["r", 1, [10]]], True),
    ))
    assert not result["valid?"] and result["lost-count"] == 1
    assert committed_kept(_history(("ok", [["append", 1, 10]], False)))["valid?"] is False


def test_a_cleared_keys_elements_are_checked_against_what_the_clear_read() -> None:
    clear = [["r", 1, [10, 11]], ["append", "cleared/1", 99]]
    kept = committed_kept(_history(
        ("ok", [["append", 1, 10]], False), ("ok", [["append", 1, 11]], False),
        ("ok", clear, False), ("ok", [["r", "cleared/1", [99]]], True),
    ))
    assert kept["valid?"] and kept["keys-cleared"] == 1
    # The clear read the key without a committed element: lost before the clear.
    lost = committed_kept(_history(
        ("ok", [["append", 1, 10]], False), ("ok", [["append", 1, 11]], False),
        ("ok", [["r", 1, [10]], ["append", "cleared/1", 99]], False),
        ("ok", [["r", "cleared/1", [99]]], True),
    ))
    assert not lost["valid?"] and lost["lost-count"] == 1
    # A final read that does not show the marker: the key is not accounted for.
    unread = committed_kept(_history(
        ("ok", [["append", 1, 10]], False), ("ok", clear, False),
        ("ok", [["r", "cleared/1", []]], True),
    ))
    assert not unread["valid?"]


def test_a_key_cleared_by_a_clear_of_unknown_outcome_is_not_judged() -> None:
    result = committed_kept(_history(
        ("ok", [["append", 1, 10]], False),
        ("info", [["r", 1, None], ["append", "cleared/1", 99]], False),
        ("ok", [["r", "cleared/1", [99]]], True),
    ))
    assert result["valid?"] and result["keys-cleared-unchecked"] == 1
