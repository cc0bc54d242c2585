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
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn

from store.core.errors import InvalidRequest, UnknownProcedure
from store.core.keys import (
    Element,
    Key,
    from_stored,
)

# Re-exported: the operation lists and the checks the tx API shares with them live in the
# compiled store.core.oplist (see its doc for why this module is not compiled).
from store.core.oplist import (
    OPS_PROCEDURE,
    ReadBatch,
    check_key,
    check_prefix,
    check_range,
    check_value,
    clear_range_limit,
    value_size,
)
from store.core.settings import Settings

Procedure = Callable[..., Awaitable[Any]]


class UserAbort(Exception):
    """Raised by ``tx.abort``: the procedure chose not to commit."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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
