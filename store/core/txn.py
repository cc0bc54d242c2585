"""One-shot transactions: the ``tx`` API procedures see, and the built-in operations.

A procedure is ``async def proc(tx, *args)``. It touches data only through ``tx``; it never
does I/O itself. Every ``await tx.get(...)`` or ``await tx.scan(...)`` ends, at the bottom of
the await chain, in ``yield ReadBatch(...)``: the coordinator drives the coroutine by hand
with ``coro.send`` and fulfils each batch from the local store or by a message to the
owning shard, so the same procedure runs unchanged under real I/O and in the simulator.

Writes are buffered in the transaction and become visible only when it is certified; a
procedure reads its own buffered writes.
"""

from __future__ import annotations

import datetime
import decimal
import inspect
from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import Any, NoReturn

from store.core.errors import InvalidRequest, UnknownProcedure
from store.core.keys import (
    PACKED_BELOW,
    PREFIX_END,
    Element,
    Key,
    check_packed,
    from_stored,
    prefix_range,
    to_stored,
    tuple_of,
)
from store.core.partition import in_one_table
from store.core.settings import Settings
from store.core.values import check_datetime, check_decimal

Procedure = Callable[..., Awaitable[Any]]

# The procedure name a Submit uses for a list of built-in operations.
OPS_PROCEDURE = ""


class UserAbort(Exception):
    """Raised by ``tx.abort``: the procedure chose not to commit."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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


_DELETED = object()


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


class Range:
    """One range read of ``Tx.read_many``: ``Range(lo, hi)``, or ``Range.prefix(p)`` for
    every tuple key that starts with ``p``; ``limit`` keys at most, the highest first when
    ``reverse``; ``keys_only`` leaves the values out of the result."""

    __slots__ = ("hi", "keys_only", "limit", "lo", "prefix_of", "reverse")

    def __init__(
        self, lo: Key, hi: Key, limit: int = 100, *, reverse: bool = False,
        keys_only: bool = False,
    ) -> None:
        self.lo, self.hi, self.limit = lo, hi, limit
        self.reverse, self.keys_only = reverse, keys_only
        self.prefix_of: tuple[Element, ...] | None = None

    @classmethod
    def prefix(
        cls, prefix: tuple[Element, ...], limit: int = 100, *, reverse: bool = False,
        keys_only: bool = False,
    ) -> Range:
        spec = cls("", "", limit, reverse=reverse, keys_only=keys_only)
        spec.prefix_of = prefix
        return spec

    def stored(self, settings: Settings) -> tuple[str, str, int]:
        if type(self.reverse) is not bool or type(self.keys_only) is not bool:
            raise InvalidRequest("reverse and keys_only are true or false")
        limit = -self.limit if self.reverse and type(self.limit) is int else self.limit
        if self.prefix_of is not None:
            return check_prefix(self.prefix_of, limit, settings)
        return check_range(self.lo, self.hi, limit, settings)


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


class Tx:
    """The handle a procedure gets. Reads are awaited; writes are buffered."""

    __slots__ = ("_read", "_settings", "writes")

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        # key -> (value, deleted); insertion order is the order of first write.
        self.writes: dict[str, tuple[Any, bool]] = {}
        # Values already read: a key is read from the store at most once per transaction,
        # so a procedure sees one consistent value and pays one round for it.
        self._read: dict[str, Any] = {}

    async def get(self, key: Key) -> Any:
        """The value of ``key`` (a string or a tuple), or None if it does not exist."""
        if type(key) is not str:
            key = check_key(key, self._settings)
        buffered = self.writes.get(key)
        if buffered is not None:
            return None if buffered[1] else buffered[0]
        read = self._read
        if key in read:
            return read[key]
        check_key(key, self._settings)
        values, _ = await ReadBatch([key], [])
        read[key] = values[0]
        return values[0]

    async def get_many(self, keys: Sequence[Key]) -> list[Any]:
        """Values of several keys, read in one round per shard."""
        values, _ = await self.read_many(keys, ())
        return values

    async def read_many(
        self, gets: Sequence[Key] = (), scans: Sequence[Range] = (),
    ) -> tuple[list[Any], list[list[Any]]]:
        """Point reads and range reads together, in one round per shard: the values of
        ``gets`` (None where absent) and, for each ``Range`` of ``scans``, its pairs (its
        keys alone if ``keys_only``), as ``scan`` gives them."""
        settings = self._settings
        stored = [check_key(key, settings) for key in gets]
        ranges = [spec.stored(settings) for spec in scans]
        writes, read = self.writes, self._read
        missing = list(dict.fromkeys(k for k in stored if k not in writes and k not in read))
        found: list[list[tuple[str, Any]]] = []
        if missing or ranges:
            values, found = await ReadBatch(missing, [self._widened(r) for r in ranges])
            read.update(zip(missing, values, strict=True))
        result = []
        for key in stored:
            buffered = writes.get(key)
            if buffered is not None:
                result.append(None if buffered[1] else buffered[0])
            else:
                result.append(read[key])
        scanned: list[list[Any]] = []
        for spec, (lo, hi, limit), pairs in zip(scans, ranges, found, strict=True):
            merged = self._overlay(pairs, lo, hi, limit)
            if spec.keys_only:
                scanned.append([from_stored(key) for key, _ in merged])
            else:
                scanned.append([(from_stored(key), value) for key, value in merged])
        return result, scanned

    async def scan(
        self, lo: Key, hi: Key, limit: int = 100, *, reverse: bool = False,
    ) -> list[tuple[Key, Any]]:
        """Key-value pairs with lo <= key < hi in key order (highest first if ``reverse``),
        at most ``limit`` of them.

        The range must lie in one table: the part of a string key before its first ``/``
        (``scan("stock/", "stock0")`` covers the whole ``stock`` table), or the first
        element of a tuple key (``scan_prefix`` covers a tuple prefix with no end key).
        """
        _, (pairs,) = await self.read_many((), (Range(lo, hi, limit, reverse=reverse),))
        return pairs

    async def scan_prefix(
        self, prefix: tuple[Element, ...], limit: int = 100, *, reverse: bool = False,
    ) -> list[tuple[Key, Any]]:
        """The pairs of every tuple key that starts with ``prefix``: ``scan_prefix(("order",
        w, d), 1, reverse=True)`` is the newest order of a district."""
        _, (pairs,) = await self.read_many((), (Range.prefix(prefix, limit, reverse=reverse),))
        return pairs

    async def count(self, lo: Key, hi: Key, limit: int | None = None) -> int:
        """How many keys ``[lo, hi)`` holds, up to ``limit`` (the settings' scan limit)."""
        bound = self._settings.scan_limit_max if limit is None else limit
        _, (keys,) = await self.read_many((), (Range(lo, hi, bound, keys_only=True),))
        return len(keys)

    async def clear_range(self, lo: Key, hi: Key) -> int:
        """Deletes every key in ``[lo, hi)`` (one table); returns how many. The range is read
        as a scan is, so a key another transaction inserts in it meanwhile aborts one of the
        two; a range of more keys than a transaction may write (``ops_per_txn_max``) is
        refused: clear it in parts."""
        limit = clear_range_limit(self._settings)
        _, (keys,) = await self.read_many((), (Range(lo, hi, limit, keys_only=True),))
        if len(keys) >= limit:
            raise InvalidRequest(
                f"clear_range of more than {limit - 1} keys; clear it in parts of fewer"
            )
        for key in keys:
            self.delete(key)
        return len(keys)

    def _widened(self, scan: tuple[str, str, int]) -> tuple[str, str, int]:
        """The scan to ask the store for: one more key for each of this transaction's own
        deletes in the range, which may take the place of a key the store returns."""
        lo, hi, limit = scan
        deletes = sum(1 for k, (_, deleted) in self.writes.items() if deleted and lo <= k < hi)
        if not deletes:
            return scan
        return lo, hi, limit - deletes if limit < 0 else limit + deletes

    def _overlay(
        self, found: list[tuple[str, Any]], lo: str, hi: str, limit: int,
    ) -> list[tuple[str, Any]]:
        """A scan's pairs with this transaction's writes in ``[lo, hi)`` laid over them."""
        overlay = {k: w for k, w in self.writes.items() if lo <= k < hi}
        if not overlay:
            return found[: abs(limit)]
        merged = {key: value for key, value in found}
        for key, (value, deleted) in overlay.items():
            if deleted:
                merged.pop(key, None)
            else:
                merged[key] = value
        # Own inserts past the store's limit-th key are still in range; keep the limit.
        if limit < 0:
            return sorted(merged.items(), reverse=True)[:-limit]
        return sorted(merged.items())[:limit]

    def put(self, key: Key, value: Any) -> None:
        key = check_key(key, self._settings)
        check_value(value, self._settings)
        self.writes.pop(key, None)
        self.writes[key] = (value, False)
        if len(self.writes) > self._settings.ops_per_txn_max:
            raise InvalidRequest(f"more than {self._settings.ops_per_txn_max} writes")

    def delete(self, key: Key) -> None:
        key = check_key(key, self._settings)
        self.writes.pop(key, None)
        self.writes[key] = (None, True)
        if len(self.writes) > self._settings.ops_per_txn_max:
            raise InvalidRequest(f"more than {self._settings.ops_per_txn_max} writes")

    def abort(self, reason: str = "aborted by the procedure") -> NoReturn:
        """Ends the transaction without writing anything (not a conflict: no retry)."""
        raise UserAbort(reason)

    # Built-in read-modify-write helpers, used by the operation list and by procedures.

    async def append(self, key: Key, item: Any) -> list[Any]:
        current = await self.get(key)
        if current is None:
            current = []
        elif type(current) is not list:
            raise InvalidRequest(f"append to {key!r}, which holds a {type(current).__name__}")
        updated = [*current, item]
        self.put(key, updated)
        return updated

    async def increment(self, key: Key, delta: int = 1) -> int:
        if type(delta) is not int:
            raise InvalidRequest("increment delta must be an integer")
        current = await self.get(key)
        if current is None:
            current = 0
        elif type(current) is not int:
            raise InvalidRequest(f"increment of {key!r}, which holds a {type(current).__name__}")
        updated: int = current + delta
        self.put(key, updated)
        return updated

    async def compare_and_set(self, key: Key, expected: Any, new: Any) -> bool:
        current = await self.get(key)
        if current != expected:
            return False
        if new is None:
            self.delete(key)
        else:
            self.put(key, new)
        return True


# ---- built-in operation lists --------------------------------------------------------------

# name -> number of arguments after the op name
OP_ARITY = {
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
GET, PUT, DELETE, SCAN, APPEND, CAS, INCREMENT, CLEAR_RANGE, KEYS, COUNT = range(10)
_CODES = {
    "get": GET, "put": PUT, "delete": DELETE, "scan": SCAN, "append": APPEND, "cas": CAS,
    "increment": INCREMENT, "clear_range": CLEAR_RANGE, "keys": KEYS, "count": COUNT,
}
# Operations over a range (their key is the range's lower bound): a scan, and a scan that
# answers with the keys alone or their number (the values never leave the server).
_RANGES = (SCAN, KEYS, COUNT, CLEAR_RANGE)
_INT_MIN, _INT_END = -(1 << 63), 1 << 64
_SPECS = {name: (code, OP_ARITY[name]) for name, code in _CODES.items()}


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
                if key in read_keys:
                    index = read_keys[key]
                else:
                    index = read_keys[key] = len(read_keys)
                parsed.append((INCREMENT, key, first, None, index))
                keys[key] = None
                written[key] = None
                continue
            if code == GET:
                if key in read_keys:
                    index = read_keys[key]
                else:
                    index = read_keys[key] = len(read_keys)
                parsed.append((GET, key, None, None, index))
                keys[key] = None
                continue
            first = op[2] if arity > 1 else None
            second = op[3] if arity > 2 else None
            index = -1
            if code in (APPEND, CAS):
                if key in read_keys:
                    index = read_keys[key]
                else:
                    index = read_keys[key] = len(read_keys)
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


# Parameter annotations a registry checks before a procedure runs, so that a call with
# arguments of the wrong type is refused as InvalidRequest rather than failing inside.
_CHECKED_ANNOTATIONS: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "str": (str,),
    "float": (int, float),
    "bool": (bool,),
    "bytes": (bytes,),
    "list": (list,),
    "dict": (dict,),
    "datetime": (datetime.datetime,),
    "datetime.datetime": (datetime.datetime,),
    "Decimal": (decimal.Decimal,),
    "decimal.Decimal": (decimal.Decimal,),
    "None": (type(None),),
}


def _checked_types(annotation: object) -> tuple[type, ...] | None:
    """The types an annotation admits, if it is one the registry checks: a name above, or
    a union of them (``int | None``, ``Optional[int]``); None for anything else."""
    if isinstance(annotation, str):
        text = annotation.replace(" ", "")
    else:
        text = str(annotation) if getattr(annotation, "__args__", None) else getattr(annotation, "__name__", "")
        text = text.replace("typing.", "").replace("NoneType", "None").replace(" ", "")
    if text.startswith("Optional[") and text.endswith("]"):
        text = text[len("Optional[") : -1] + "|None"
    types: list[type] = []
    for part in text.split("|"):
        admitted = _CHECKED_ANNOTATIONS.get(part)
        if admitted is None:
            return None
        types.extend(admitted)
    return tuple(types) if types else None


class Procedures:
    """Registered procedures by name; the same registry is loaded on every server."""

    def __init__(self) -> None:
        self._by_name: dict[str, Procedure] = {}
        self._signatures: dict[str, inspect.Signature] = {}
        self._arg_types: dict[str, list[tuple[str, tuple[type, ...]] | None]] = {}
        # In-server load generators beside the procedures (store/node/generator.py): an
        # ``async def`` taking a ``store.node.generator.LocalRun`` and returning its answer.
        self._workloads: dict[str, Callable[[Any], Awaitable[dict[str, Any]]]] = {}

    def register_workload(self, name: str, run: Callable[[Any], Awaitable[dict[str, Any]]]) -> None:
        """A load generator a server runs when asked (``wire.GENERATE`` with ``workload``
        ``name``; only on servers started with load generators enabled)."""
        if not name or name == "micro":
            raise ValueError("a workload needs a name other than 'micro' (the built-in one)")
        if not inspect.iscoroutinefunction(run):
            raise TypeError(f"workload {name!r} must be an async def")
        self._workloads[name] = run

    def workload(self, name: str) -> Callable[[Any], Awaitable[dict[str, Any]]]:
        """The registered workload ``name``; InvalidRequest if there is none."""
        found = self._workloads.get(name)
        if found is None:
            known = ", ".join(["micro", *sorted(self._workloads)])
            raise InvalidRequest(f"GENERATE: no workload named {name!r} (this cluster has {known})")
        return found

    def register(self, name: str, procedure: Procedure) -> None:
        if not name or name == OPS_PROCEDURE:
            raise ValueError("a procedure needs a non-empty name")
        if not inspect.iscoroutinefunction(procedure):
            raise TypeError(f"procedure {name!r} must be an async def")
        signature = inspect.signature(procedure)
        self._by_name[name] = procedure
        self._signatures[name] = signature
        checks: list[tuple[str, tuple[type, ...]] | None] = []
        for parameter in list(signature.parameters.values())[1:]:
            if parameter.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD:
                break
            types = _checked_types(parameter.annotation)
            checks.append((parameter.name, types) if types else None)
        self._arg_types[name] = checks

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def start(self, name: str, tx: Tx, args: list[Any], settings: Settings) -> Any:
        """Creates the procedure's coroutine; InvalidRequest if it cannot be called so."""
        if type(args) is not list:
            raise InvalidRequest("procedure arguments must be a list")
        procedure = self._by_name.get(name)
        if procedure is None:
            raise UnknownProcedure(f"no procedure named {name!r}")
        if len(args) > settings.procedure_args_max:
            raise InvalidRequest(f"more than {settings.procedure_args_max} arguments")
        for arg in args:
            value_size(arg)
        try:
            self._signatures[name].bind(tx, *args)
        except TypeError as exc:
            raise InvalidRequest(f"wrong arguments for {name!r}: {exc}") from None
        for arg, check in zip(args, self._arg_types[name], strict=False):
            if check is None:
                continue
            parameter, types = check
            if type(arg) not in types or (type(arg) is bool and bool not in types):
                wanted = " or ".join(
                    "None" if t is type(None) else t.__name__ for t in dict.fromkeys(types)
                )
                raise InvalidRequest(
                    f"{name!r}: argument {parameter!r} must be {wanted}, got {type(arg).__name__}"
                )
        return procedure(tx, *args)


def procedure(registry: Procedures, name: str | None = None) -> Callable[[Procedure], Procedure]:
    """Decorator: ``@procedure(registry)`` registers an ``async def`` under its name."""

    def register(function: Procedure) -> Procedure:
        registry.register(name or function.__name__, function)
        return function

    return register
