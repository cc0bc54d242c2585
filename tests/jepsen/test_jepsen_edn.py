"""The EDN reader and writer (jepsen.edn): Jepsen's history.edn must round-trip exactly."""

from __future__ import annotations

import math
import subprocess
import sys
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jepsen.edn import EdnError, EdnList, Keyword, Symbol, Tagged, dumps, loads, loads_all


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nil", None),
        ("true", True),
        ("false", False),
        ("42", 42),
        ("-7", -7),
        ("+3", 3),
        ("12345678901234567890N", 12345678901234567890),
        ("1.5", 1.5),
        ("-2e3", -2000.0),
        ("1.25M", Decimal("1.25")),
        ('"a \\"b\\"\\n"', 'a "b"\n'),
        ('"\\u00e9"', "é"),
        ("\\c", "c"),
        ("\\newline", "\n"),
        (":ok", Keyword("ok")),
        (":jepsen.history/op", Keyword("jepsen.history/op")),
        ("foo", Symbol("foo")),
        ("[1 2 [3]]", [1, 2, [3]]),
        ("(1 2)", EdnList((1, 2))),
        ("#{1 2}", frozenset({1, 2})),
        ("{:a 1, :b [nil]}", {Keyword("a"): 1, Keyword("b"): [None]}),
        ("{[1 2] :x}", {(1, 2): Keyword("x")}),
        ("[1 #_ 2 3]", [1, 3]),
        ('#inst "2020-01-01"', Tagged("inst", "2020-01-01")),
        ("[1, 2 ; a comment\n 3]", [1, 2, 3]),
        ("##Inf", math.inf),
    ],
)
def test_read(text: str, expected: object) -> None:
    value = loads(text)
    assert value == expected
    assert type(value) is type(expected)


def test_keyword_is_a_string_but_written_as_keyword() -> None:
    assert Keyword("ok") == "ok"
    assert {Keyword("from"): 1}["from"] == 1
    assert dumps([Keyword("ok"), "ok", Symbol("ok")]) == '[:ok "ok" ok]'


@pytest.mark.parametrize("text", ["[1 2", "{:a}", "(1]", "}", ":", "1x", '"open', "#_"])
def test_malformed_input_is_rejected(text: str) -> None:
    with pytest.raises(EdnError):
        loads_all(text)


def test_deep_nesting_needs_no_recursion() -> None:
    depth = 5000
    value = loads("[" * depth + "]" * depth)
    for _ in range(depth - 1):
        value = value[0]
    assert value == []


edn_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(),
    st.from_regex(r"[a-z][a-z0-9\-]{0,8}", fullmatch=True).map(Keyword),
)
edn_values = st.recursive(
    edn_leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(EdnList),
        st.dictionaries(st.one_of(st.integers(), st.text(max_size=5)), children, max_size=4),
        st.frozensets(st.one_of(st.integers(), st.text(max_size=5)), max_size=4),
    ),
    max_leaves=20,
)


@given(edn_values)
def test_round_trip(value: object) -> None:
    text = dumps(value)
    assert loads(text) == value
    assert dumps(loads(text)) == text


def test_set_output_does_not_depend_on_hash_seed() -> None:
    # Python randomizes str hashing per process; the writer must not show it.
    program = (
        "from jepsen.edn import dumps, Keyword;"
        "print(dumps(frozenset(['a', 'b', 'c', 'dd', Keyword('e'), 'f', 'g'])))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", program],
            env={"PYTHONHASHSEED": str(seed), "PYTHONPATH": "."},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in (1, 2, 3)
    }
    assert len(outputs) == 1
