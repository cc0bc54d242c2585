"""Built-in operation lists (``OpList``) and the checks of keys, ranges and values that the
``tx`` API (``store.core.txn``) shares with them.

Kept apart from ``store.core.txn`` because this module is compiled (docs/performance.md) and
that one is not: ``Tx``'s methods take whatever a procedure passes and check it themselves
(InvalidRequest), where a compiled method would refuse an argument its annotation does not
allow with a TypeError first. Every function here that takes outside input types it
``object`` for the same reason.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Generator
from typing import Any, Final

from store.core.errors import InvalidRequest
from store.core.keys import (
    PACKED_BELOW,
    PREFIX_END,
    check_packed,
    from_stored,
    prefix_range,
    to_stored,
    tuple_of,
)
from store.core.partition import in_one_table
from store.core.settings import Settings
from store.core.values import check_datetime, check_decimal

# The procedure name a Submit uses for a list of built-in operations.
OPS_PROCEDURE: Final = ""


class ReadBatch:
    """What a procedure waits for: point reads and range scans, fulfilled together.

    The coordinator answers with ``(values, scans)``: ``values[i]`` is the value of
    ``keys[i]`` (None when absent) and ``scans[j]`` the ``[(key, value), ...]`` of scan j.
    """

    __slots__ = ("keys", "scans")

    def __init__(self, keys: list[str], scans: list[tuple[str, str, int]]) -> None:
        self.keys = keys
        self.scans = scans

    def __await__(self) -> Generator[ReadBatch, Any, Any]:
        return (yield self)


def check_key(key: object, settings: Settings) -> str:
    """The stored form of a key (``store.core.keys``): a string as it is, a tuple packed (a
    list, as a tuple arrives over the wire, is a tuple); InvalidRequest for anything else."""
    if type(key) is not str:
        if type(key) is list:
            key = tuple_of(key)
        key = to_stored(key)
    elif not key:
        raise InvalidRequest("empty key")
    elif key < PACKED_BELOW:
        check_packed(key)
    if len(key) > settings.key_bytes_max or len(key.encode()) > settings.key_bytes_max:
        raise InvalidRequest(f"key longer than {settings.key_bytes_max} bytes")
    return key


def check_range(lo: object, hi: object, limit: object, settings: Settings) -> tuple[str, str, int]:
    """A scan of ``[lo, hi)`` as the store runs it: ``(lo, hi, limit)`` with a negative
    limit for a reverse scan (the last ``-limit`` keys, highest first)."""
    stored_lo, stored_hi = _check_bound(lo, settings), _check_bound(hi, settings)
    if type(limit) is not int or not 0 < abs(limit) <= settings.scan_limit_max:
        raise InvalidRequest(f"scan limit must be 1..{settings.scan_limit_max}")
    if not in_one_table(stored_lo, stored_hi):
        raise InvalidRequest(
            "a scan's range must lie in one table (string keys 'table/...'; tuple keys "
            "sharing their first element)"
        )
    return stored_lo, stored_hi, limit


def _check_bound(bound: object, settings: Settings) -> str:
    """A range's bound: a key, the end of a prefix's range (a packing and 0xFF) or the
    least key above a key (a packing and 0x00)."""
    if type(bound) is str and bound < PACKED_BELOW and bound[-1:] in (PREFIX_END, "\x00"):
        try:
            return check_key(bound, settings)
        except InvalidRequest:
            check_key(bound[:-1], settings)
            return bound
    return check_key(bound, settings)


def clear_range_limit(settings: Settings) -> int:
    """What a clear_range scans for: one key more than a transaction may delete."""
    return min(settings.scan_limit_max, settings.ops_per_txn_max + 1)


def check_prefix(prefix: object, limit: object, settings: Settings) -> tuple[str, str, int]:
    """The scan of every tuple key that starts with ``prefix`` (a tuple)."""
    if type(prefix) is list:
        prefix = tuple_of(prefix)
    if type(prefix) is not tuple:
        raise InvalidRequest(f"a prefix is a tuple, got {type(prefix).__name__}")
    lo, hi = prefix_range(prefix)
    return check_range(lo, hi, limit, settings)



def value_size(value: object, depth: int = 0) -> int:
    """Approximate encoded size of a value; raises InvalidRequest for unsupported types."""
    if depth > 32:
        raise InvalidRequest("value nested deeper than 32 levels")
    if value is None or isinstance(value, bool):
        return 1
    if isinstance(value, int):
        if not -(1 << 63) <= value < (1 << 64):
            raise InvalidRequest("integers must fit in 64 bits")
        return 9
    if isinstance(value, float):
        return 9
    if isinstance(value, str):
        return len(value.encode()) + 5
    if isinstance(value, bytes):
        return len(value) + 5
    if isinstance(value, list | tuple):
        return 5 + sum(value_size(item, depth + 1) for item in value)
    if isinstance(value, dict):
        total = 5
        for key, item in value.items():
            if type(key) is not str:
                raise InvalidRequest("map keys in values must be strings")
            total += len(key.encode()) + 5 + value_size(item, depth + 1)
        return total
    kind = type(value)
    if kind is datetime.datetime:
        return check_datetime(value)  # type: ignore[arg-type]
    if kind is decimal.Decimal:
        return check_decimal(value)  # type: ignore[arg-type]
    raise InvalidRequest(f"values of type {type(value).__name__} cannot be stored")


def check_value(value: object, settings: Settings) -> None:
    if value_size(value) > settings.value_bytes_max:
        raise InvalidRequest(f"value larger than {settings.value_bytes_max} bytes")


# ---- built-in operation lists --------------------------------------------------------------

# name -> number of arguments after the op name
OP_ARITY: Final = {
    "get": 1,
    "put": 2,
    "delete": 1,
    "scan": 3,
    "append": 2,
    "cas": 3,
    "increment": 2,
    "clear_range": 2,
    "keys": 3,
    "count": 3,
}


# Operation codes of a parsed list (``OpList.ops``).
GET: Final = 0
PUT: Final = 1
DELETE: Final = 2
SCAN: Final = 3
APPEND: Final = 4
CAS: Final = 5
INCREMENT: Final = 6
CLEAR_RANGE: Final = 7
KEYS: Final = 8
COUNT: Final = 9
_CODES: Final = {
    "get": GET, "put": PUT, "delete": DELETE, "scan": SCAN, "append": APPEND, "cas": CAS,
    "increment": INCREMENT, "clear_range": CLEAR_RANGE, "keys": KEYS, "count": COUNT,
}
# Operations over a range (their key is the range's lower bound): a scan, and a scan that
# answers with the keys alone or their number (the values never leave the server).
_RANGES: Final = (SCAN, KEYS, COUNT, CLEAR_RANGE)
_INT_MIN, _INT_END = -(1 << 63), 1 << 64
_SPECS: Final = {name: (code, OP_ARITY[name]) for name, code in _CODES.items()}


def _bad_operation(op: object) -> None:
    """Raises the precise error for an operation that is not a known one of the right size."""
    kind = type(op)
    if (kind is not list and kind is not tuple) or not op or type(op[0]) is not str:  # type: ignore[index]
        raise InvalidRequest("each operation is a list: [name, args...]")
    name = op[0]  # type: ignore[index]
    if name not in _CODES:
        raise InvalidRequest(f"unknown operation {name!r}; known: {sorted(OP_ARITY)}")
    arity = OP_ARITY[name]
    raise InvalidRequest(f"operation {name!r} takes {arity} arguments")


class OpList:
    """A built-in operation list, checked once and run without a coroutine.

    Every key the list reads (get, append, increment, compare-and-set) and every range it
    scans is fetched in one ``ReadBatch`` (one round per shard); ``run`` then applies the
    operations in order to those values and to the list's own writes, which later
    operations see (a scan sees the list's writes made before it). Parsing checks every
    key, value and argument before anything runs (``InvalidRequest`` otherwise), so the
    keys are never checked again.
    """

    __slots__ = ("batch", "conditional", "keys", "ops", "written")

    def __init__(self, ops: object, settings: Settings) -> None:
        if type(ops) is not list:
            raise InvalidRequest("operations must be a list")
        if len(ops) > settings.ops_per_txn_max:
            raise InvalidRequest(f"more than {settings.ops_per_txn_max} operations")
        key_max = settings.key_bytes_max
        # A key of at most this many characters fits in key_max bytes whatever they are.
        short_key = key_max // 4
        # (code, key, first argument, second argument, index of the key's read value)
        parsed: list[tuple[int, str, Any, Any, int]] = []
        read_keys: dict[str, int] = {}
        keys: dict[str, None] = {}  # every key read or written, first use first
        written: dict[str, None] = {}  # every key an operation writes whatever it reads
        conditional = False  # a compare-and-set: whether it writes depends on what it reads
        scans: list[tuple[str, str, int]] = []
        removals: list[str] = []  # keys deleted (or perhaps, by a compare-and-set) so far
        cleared: list[tuple[str, str]] = []  # ranges of the clear_range operations so far
        specs = _SPECS
        for op in ops:
            kind = type(op)
            try:
                code, arity = specs[op[0]]
            except (KeyError, IndexError, TypeError):
                _bad_operation(op)
                raise  # pragma: no cover - _bad_operation raises
            if (kind is not list and kind is not tuple) or len(op) != arity + 1:
                _bad_operation(op)
            key = op[1]
            if (type(key) is not str or key < PACKED_BELOW or (
                len(key) > short_key and len(key.encode()) > key_max
            )) and code not in _RANGES:  # a range's bounds: check_range below
                key = check_key(key, settings)  # a tuple packed, or the precise error
            # The two operations of most lists first, without the general checks below.
            if code == INCREMENT:
                first = op[2]
                if type(first) is not int:
                    raise InvalidRequest("increment delta must be an integer")
                index = read_keys.setdefault(key, len(read_keys))  # its slot in the read batch
                parsed.append((INCREMENT, key, first, None, index))
                keys[key] = None
                written[key] = None
                continue
            if code == GET:
                index = read_keys.setdefault(key, len(read_keys))
                parsed.append((GET, key, None, None, index))
                keys[key] = None
                continue
            first = op[2] if arity > 1 else None
            second = op[3] if arity > 2 else None
            index = -1
            if code in (APPEND, CAS):
                index = read_keys.setdefault(key, len(read_keys))
                if code == APPEND:
                    check_value(first, settings)
                else:
                    check_value(first, settings)
                    check_value(second, settings)
            elif code == PUT:
                check_value(first, settings)
            elif code in _RANGES:
                if code == CLEAR_RANGE:
                    second = clear_range_limit(settings)
                key, first, second = check_range(key, first, second, settings)
                index = len(scans)
                # The operations before it may delete keys the store returns: ask for one
                # more key per such delete (for a clear_range before it, for every key).
                extra = sum(1 for k in removals if key <= k < first)
                if any(lo < first and key < hi for lo, hi in cleared):
                    extra = settings.scan_limit_max
                scans.append((key, first, second - extra if second < 0 else second + extra))
                if code == CLEAR_RANGE:
                    cleared.append((key, first))
                    conditional = True  # it writes what it finds
            if code not in _RANGES:
                keys[key] = None
            if code in (DELETE, CAS):
                removals.append(key)
            if code in (PUT, DELETE, APPEND, INCREMENT):
                written[key] = None
            elif code == CAS:
                conditional = True
            parsed.append((code, key, first, second, index))
        self.ops = parsed
        self.keys = list(keys)
        # Without a compare-and-set, ``written`` is exactly the keys ``run`` writes, known
        # before anything is read: what the one-round two-shard path locks up front.
        self.written = list(written)
        self.conditional = conditional
        self.batch = ReadBatch(list(read_keys), scans)

    def run(
        self, values: list[Any], scanned: list[list[tuple[str, Any]]],
        writes: dict[str, tuple[Any, bool]], settings: Settings,
    ) -> list[Any]:
        """Applies the operations to the values read (``values[i]`` of ``batch.keys[i]``,
        ``scanned[j]`` of ``batch.scans[j]``), buffering writes in ``writes``; returns one
        result per operation. InvalidRequest for an operation the data does not allow (an
        increment of a string, say): nothing has been written then."""
        results: list[Any] = []
        for code, key, first, second, index in self.ops:
            if code == PUT:
                writes[key] = (first, False)
                results.append(None)
                continue
            if code == DELETE:
                writes[key] = (None, True)
                results.append(None)
                continue
            if code == SCAN:
                results.append(
                    [[from_stored(k), value] for k, value in _overlay(scanned[index], writes, key, first, second)]
                )
                continue
            if code == KEYS:
                found = _overlay(scanned[index], writes, key, first, second)
                results.append([from_stored(k) for k, _ in found])
                continue
            if code == COUNT:
                results.append(len(_overlay(scanned[index], writes, key, first, second)))
                continue
            if code == CLEAR_RANGE:
                found = _overlay(scanned[index], writes, key, first, second)
                if len(found) >= second:
                    raise InvalidRequest(
                        f"clear_range of more than {second - 1} keys; clear it in parts of fewer"
                    )
                for k, _ in found:
                    writes[k] = (None, True)
                results.append(len(found))
                continue
            if key in writes:
                buffered = writes[key]
                current = None if buffered[1] else buffered[0]
            else:
                current = values[index]
            if code == GET:
                results.append(current)
            elif code == INCREMENT:
                if current is None:
                    current = 0
                elif type(current) is not int:
                    raise InvalidRequest(
                        f"increment of {key!r}, which holds a {type(current).__name__}"
                    )
                current += first
                if not _INT_MIN <= current < _INT_END:
                    raise InvalidRequest("integers must fit in 64 bits")
                writes[key] = (current, False)
                results.append(current)
            elif code == APPEND:
                if current is None:
                    current = []
                elif type(current) is not list:
                    raise InvalidRequest(
                        f"append to {key!r}, which holds a {type(current).__name__}"
                    )
                updated = [*current, first]
                check_value(updated, settings)
                writes[key] = (updated, False)
                results.append(None)
            else:
                assert code == CAS
                if current != first:
                    results.append(False)
                    continue
                writes[key] = (None, True) if second is None else (second, False)
                results.append(True)
        return results


def _overlay(
    found: list[tuple[str, Any]], writes: dict[str, tuple[Any, bool]], lo: str, hi: str,
    limit: int,
) -> list[tuple[str, Any]]:
    """A scan's pairs with the list's own writes in [lo, hi) laid over them (a negative
    ``limit``: a reverse scan's)."""
    merged = {key: value for key, value in found}
    overlaid = False
    for key, (value, deleted) in writes.items():
        if lo <= key < hi:
            overlaid = True
            if deleted:
                merged.pop(key, None)
            else:
                merged[key] = value
    if not overlaid:  # the store may have been asked for more (``OpList``: its deletes)
        return list(merged.items())[: abs(limit)]
    if limit < 0:
        return sorted(merged.items(), reverse=True)[:-limit]
    return sorted(merged.items())[:limit]
