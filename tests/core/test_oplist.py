"""Parsing of built-in operation lists (``OpList``): every malformed operation gets a typed,
precise error before anything runs (DESIGN.md §1 "bad input"), and what parses records the
keys read, written and scanned."""

from __future__ import annotations

from typing import Any

import pytest

from store.core.errors import InvalidRequest
from store.core.oplist import OpList
from store.core.settings import DEFAULT_SETTINGS

KEY_MAX = DEFAULT_SETTINGS.key_bytes_max


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        ("get", "operations must be a list"),
        ([{"get": 1}], "each operation is a list"),
        ([{0: "get"}], "each operation is a list"),  # indexable, but not a list
        (["get"], "each operation is a list"),  # a string, not a list
        ([7], "each operation is a list"),
        ([[]], "each operation is a list"),
        ([[["get"], "t/a"]], "each operation is a list"),  # an unhashable name
        ([[3, "t/a"]], "each operation is a list"),
        ([["fetch", "t/a"]], "unknown operation 'fetch'"),
        ([["get"]], "operation 'get' takes 1 arguments"),
        ([["increment", "t/a"]], "operation 'increment' takes 2 arguments"),
        ([["put", "t/a", 1, 2]], "operation 'put' takes 2 arguments"),
        ([["get", 5]], "keys are strings"),
        ([["get", ""]], "empty key"),
        ([["get", "k" * (KEY_MAX + 1)]], "key longer than"),
        ([["get", "é" * (KEY_MAX // 2 + 1)]], "key longer than"),  # short in characters only
        ([["increment", "t/a", "1"]], "increment delta must be an integer"),
        ([["increment", "t/a", 1.5]], "increment delta must be an integer"),
        ([["put", "t/a", object()]], "cannot be stored"),
        ([["scan", "t/", "u/", 10]], "one table"),
        ([["scan", "t/", "t0", 0]], "scan limit"),
    ],
)
def test_malformed_operations_raise_invalid_request(ops: Any, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        OpList(ops, DEFAULT_SETTINGS)


def test_a_list_records_what_it_reads_writes_and_scans() -> None:
    ops = OpList(
        [
            ["get", "t/a"], ["increment", "t/b", 2], ["put", "t/c", 1], ["get", "t/b"],
            ["append", "t/d", "x"], ["delete", "t/e"], ["scan", "t/", "t0", 5],
            ("get", "t/a"),
        ],
        DEFAULT_SETTINGS,
    )
    assert ops.batch.keys == ["t/a", "t/b", "t/d"]  # each key read once
    assert ops.batch.scans == [("t/", "t0", 6)]  # one more for the delete of t/e before it
    assert ops.keys == ["t/a", "t/b", "t/c", "t/d", "t/e"]
    assert ops.written == ["t/b", "t/c", "t/d", "t/e"]
    assert not ops.conditional
    assert OpList([["cas", "t/a", 1, 2]], DEFAULT_SETTINGS).conditional


def test_run_applies_operations_in_order_on_the_values_read() -> None:
    ops = OpList(
        [["increment", "t/n", 2], ["get", "t/n"], ["increment", "t/n", 1], ["get", "t/m"]],
        DEFAULT_SETTINGS,
    )
    writes: dict[str, tuple[Any, bool]] = {}
    assert ops.run([40, None], [], writes, DEFAULT_SETTINGS) == [42, 42, 43, None]
    assert writes == {"t/n": (43, False)}
    with pytest.raises(InvalidRequest, match="holds a str"):
        ops.run(["text", None], [], {}, DEFAULT_SETTINGS)
