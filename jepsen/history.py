"""Operations and histories in Jepsen's ``history.edn`` format.

A history is a list of operations in the order they happened. Each client process invokes an
operation (``:type :invoke``) and later completes it with exactly one of

- ``:ok``: it happened;
- ``:fail``: it definitely did not happen (for a transaction: it aborted);
- ``:info``: we do not know (a timeout, a crash); it may have happened at any time after
  its invocation, or never. A process whose operation ended ``:info`` never invokes again.

On disk a history is one operation map per line, keys in this order::

    {:type :ok, :f :txn, :value [[:append 1 2] [:r 1 [2]]], :process 0, :time 12345, :index 7}

How a producer (the simulator, the real-process harness) writes operations in Python:

- ``Op(type, f, value, process, time, index)``: ``type`` is one of ``"invoke" "ok" "fail"
  "info"``; ``f`` names the operation (``"txn"``, ``"transfer"``, ``"read"``); ``process`` is an
  int (or ``"nemesis"``); ``time`` is nanoseconds since the test began (or ``None``); ``index``
  is the operation's position in the history (``None`` means: fill it in from the position).
  Plain ``str`` is fine for ``type``, ``f`` and process names: they are written as keywords.
- List-append transactions (``f="txn"``): ``value`` is a list of micro-operations, each a
  3-element list: ``["append", key, element]`` or ``["r", key, None-or-list]``. The invocation
  reads ``None``; the completion carries the list it read. A micro-op's first element is
  written as a keyword (``[:append 1 2]``, ``[:r 1 [2]]``). Keys and elements are ints or
  strings.
- Bank: ``Op("invoke", "transfer", {"from": 1, "to": 2, "amount": 5}, ...)`` (those three
  keys are written as keywords), and ``Op("ok", "read", {0: 100, 1: 0}, ...)``: account id to
  balance. A read's invocation has ``value=None``.
- Any other keys of an operation map (``:error``, ``:node``...) are kept in ``Op.extra`` and
  written after the fixed ones, in their order.

Reading accepts operations without ``:f`` or ``:time`` (Elle's test histories omit them),
without ``:index`` (each then takes its position in the file), and operations written as
records (``#jepsen.history.Op{...}``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jepsen.edn import EdnError, Keyword, Tagged, dumps, iter_forms

__all__ = [
    "FAIL",
    "INFO",
    "INVOKE",
    "OK",
    "Op",
    "format_op",
    "parse_history",
    "read_history",
    "write_history",
]

INVOKE = Keyword("invoke")
OK = Keyword("ok")
FAIL = Keyword("fail")
INFO = Keyword("info")
_TYPES = {"invoke": INVOKE, "ok": OK, "fail": FAIL, "info": INFO}
_FIXED_KEYS = ("type", "f", "value", "process", "time", "index")
_MICRO_OP_FUNCTIONS = frozenset({"append", "r", "w"})
_TRANSFER_KEYS = frozenset({"from", "to", "amount"})


@dataclass(slots=True)
class Op:
    """One line of a history. See the module docstring for the shapes of ``value``."""

    type: str
    f: str | None = None
    value: Any = None
    process: int | str | None = None
    time: int | None = None
    index: int | None = None
    extra: dict[Any, Any] = field(default_factory=dict)

    @property
    def is_invoke(self) -> bool:
        return self.type == "invoke"

    @property
    def is_ok(self) -> bool:
        return self.type == "ok"

    @property
    def is_fail(self) -> bool:
        return self.type == "fail"

    @property
    def is_info(self) -> bool:
        return self.type == "info"


def _keyword(name: Any) -> Any:
    """A plain string becomes a keyword; anything else (None, int, Keyword) is kept."""
    if isinstance(name, str) and not isinstance(name, Keyword):
        return Keyword(name)
    return name


def _edn_value(f: Any, value: Any) -> Any:
    """Give `value` the EDN shape Jepsen uses: keyword micro-op names and transfer keys."""
    if (
        isinstance(value, list | tuple)
        and value
        and all(
            isinstance(mop, list | tuple)
            and len(mop) == 3
            and isinstance(mop[0], str)
            and mop[0] in _MICRO_OP_FUNCTIONS
            for mop in value
        )
    ):
        return [
            [_keyword(mop[0]), mop[1], list(mop[2]) if isinstance(mop[2], tuple) else mop[2]]
            for mop in value
        ]
    if isinstance(value, tuple):
        return list(value)
    if f == "transfer" and isinstance(value, dict):
        return {(_keyword(k) if k in _TRANSFER_KEYS else k): v for k, v in value.items()}
    return value


def format_op(op: Op) -> str:
    """One operation as an EDN map on one line (no newline), keys in Jepsen's order."""
    fields = {
        Keyword("type"): _keyword(op.type),
        Keyword("f"): _keyword(op.f),
        Keyword("value"): _edn_value(op.f, op.value),
        Keyword("process"): _keyword(op.process),
        Keyword("time"): op.time,
        Keyword("index"): op.index,
    }
    for key, item in op.extra.items():
        fields[_keyword(key)] = item
    return dumps(fields)


def op_from_map(form: Any, position: int) -> Op:
    """Build an Op from one EDN operation map; `position` is its place in the history."""
    if isinstance(form, Tagged) and isinstance(form.value, dict):
        form = form.value  # a record such as #jepsen.history.Op{...}
    if not isinstance(form, dict):
        raise EdnError(f"operation {position} is not a map: {dumps(form)[:80]}")
    type_ = form.get("type")
    if type_ not in _TYPES:
        raise EdnError(f"operation {position} has :type {type_!r}")
    index = form.get("index")
    extra = {k: v for k, v in form.items() if k not in _FIXED_KEYS}
    return Op(
        type=_TYPES[type_],
        f=form.get("f"),
        value=form.get("value"),
        process=form.get("process"),
        time=form.get("time"),
        index=position if index is None else index,
        extra=extra,
    )


def parse_history(text: str) -> list[Op]:
    """Read a history from EDN text: maps one after another, or one vector of maps."""
    forms = list(iter_forms(text))
    if len(forms) == 1 and isinstance(forms[0], list):
        forms = forms[0]
    return [op_from_map(form, position) for position, form in enumerate(forms)]


def read_history(path_or_text: str | os.PathLike[str]) -> list[Op]:
    """Read a history from a file path, or from EDN text if the argument looks like EDN."""
    if isinstance(path_or_text, str) and path_or_text.lstrip()[:1] in ("{", "[", "#", ";", ""):
        return parse_history(path_or_text)
    return parse_history(Path(path_or_text).read_text(encoding="utf-8"))


def write_history(path: str | os.PathLike[str], ops: Iterable[Op]) -> None:
    """Write `ops` as ``history.edn``; an op without an index gets its position."""
    lines = []
    for position, op in enumerate(ops):
        if op.index is None:
            indexed = Op(op.type, op.f, op.value, op.process, op.time, position, op.extra)
            lines.append(format_op(indexed))
        else:
            lines.append(format_op(op))
    text = "\n".join(lines) + ("\n" if lines else "")
    Path(path).write_text(text, encoding="utf-8", newline="\n")
