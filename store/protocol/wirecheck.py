"""Strict decoding shared by the wire codecs (``store.protocol.codec``,
``store.protocol.cluster_map``, ``store.core.paxos.messages``, ``store.core.transfer``).

Messages are msgpack arrays ``[tag, field, ...]``. ``decode_tagged`` unpacks one, finds
the tag's builder and arity, and turns every failure — garbage bytes, a wrong arity, a field
of the wrong shape deep inside — into ``InvalidRequest``, and nothing else: no input from
the network may crash a server (DESIGN.md §1). The ``Fields`` checkers name the field that
was wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from store.core.errors import InvalidRequest
from store.core.values import unpackb

T = TypeVar("T")


class Fields:
    """Field checkers whose errors say which message family was malformed."""

    def __init__(self, what: str, list_length_max: int | None = None) -> None:
        self.what = what
        self.list_length_max = list_length_max

    def bad(self, problem: str) -> InvalidRequest:
        return InvalidRequest(f"malformed {self.what}: {problem}")

    def integer(self, value: Any, name: str) -> int:
        if type(value) is not int or value < 0:
            raise self.bad(f"{name} must be a non-negative integer")
        return value

    def boolean(self, value: Any, name: str) -> bool:
        if type(value) is not bool:
            raise self.bad(f"{name} must be a boolean")
        return value

    def string(self, value: Any, name: str) -> str:
        if type(value) is not str:
            raise self.bad(f"{name} must be a string")
        return value

    def array(self, value: Any, name: str, length_max: int | None = None) -> list[Any]:
        if type(value) is not list:
            raise self.bad(f"{name} must be a list")
        limit = length_max if length_max is not None else self.list_length_max
        if limit is not None and len(value) > limit:
            raise self.bad(f"{name} longer than {limit}")
        return value


def decode_tagged(
    data: bytes | bytearray | memoryview,
    decoders: Mapping[int, tuple[int, Callable[[list[Any]], T]]],
    fields: Fields,
    max_bytes: int,
    strict_map_key: bool = True,
) -> T:
    if len(data) > max_bytes:
        raise fields.bad(f"larger than {max_bytes} bytes")
    try:
        unpacked = unpackb(data, strict_map_key)
    except InvalidRequest as invalid:  # a value extension (store.core.values) that is malformed
        raise fields.bad(str(invalid)) from None
    # (Each clause its own name: compiled by mypyc, a name bound by two clauses takes the
    # first one's type, and the second clause's exception fails with a TypeError.)
    except Exception as garbage:  # msgpack raises many types on garbage; all mean the same
        raise fields.bad(f"not msgpack ({type(garbage).__name__})") from None
    if type(unpacked) is not list or not unpacked or type(unpacked[0]) is not int:
        raise fields.bad("expected [tag, ...]")
    entry = decoders.get(unpacked[0])
    if entry is None:
        raise fields.bad(f"unknown tag {unpacked[0]}")
    arity, build = entry
    if len(unpacked) != arity:
        raise fields.bad(f"tag {unpacked[0]} has {arity - 1} fields, got {len(unpacked) - 1}")
    try:
        return build(unpacked)
    except InvalidRequest:
        raise
    except Exception as exc:  # a field of an unexpected shape deep inside
        raise fields.bad(type(exc).__name__) from None
