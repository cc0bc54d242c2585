"""Typed keys: tuples packed into strings whose order is the tuples' order.

A key is a string (``"stock/0001/42"``) or a tuple of strings, integers, bytes and nested
tuples (``("stock", 1, 42)``). The store orders keys as strings, by code point; a tuple is
stored as its packing, a string of code points 0-255 laid out as FoundationDB's tuple layer
lays out bytes, so that comparing two packings compares the tuples:

* each element starts with a type code: bytes 0x01, string 0x02, nested tuple 0x05,
  integers 0x0C-0x1C (0x14 is zero; 0x14+n a positive integer of n big-endian bytes,
  0x14-n a negative one of n bytes in ones' complement, so that more bytes sort further
  out);
* bytes and strings (UTF-8) end with 0x00; a 0x00 inside them is written 0x00 0xFF;
* a nested tuple ends with 0x00.

Elements of different types order by type code: bytes < strings < tuples < integers. A
plain string key never begins with a character below a space, and every packing begins with
a type code (below 0x20), so the two kinds never collide; a string key that begins with
such a character must be a valid packing (``check_packed``), else it is refused.

A tuple's *table* is its first element (``table_of``): a scan stays in one table, and the
store keeps each table's keys apart. ``prefix_range(prefix)`` is the range of every tuple
that starts with ``prefix``.
"""

from __future__ import annotations

from typing import Any, Final, Union

from store.core.errors import InvalidRequest

# An element of a tuple key, and a key as the API takes it.
Element = Union[str, int, bytes, "tuple[Element, ...]"]
Key = Union[str, "tuple[Element, ...]"]

BYTES: Final = 0x01
STRING: Final = 0x02
NESTED: Final = 0x05
INT_ZERO: Final = 0x14
INT_BYTES_MAX: Final = 8
# Every packing begins with a type code below this; a plain string key does not.
PACKED_BELOW: Final = " "
# Above every element's first code point: the end of a prefix's range.
PREFIX_END: Final = "\xff"
_DEPTH_MAX: Final = 16


def is_packed(key: str) -> bool:
    return key < PACKED_BELOW


def pack(key: tuple[object, ...]) -> str:
    """The stored form of a tuple key (see the module doc). Its elements are checked here
    (InvalidRequest), so they are typed ``object``: the compiled build would refuse a wrong
    one with a TypeError before the check."""
    if type(key) is not tuple:
        raise InvalidRequest(f"a typed key is a tuple, got {type(key).__name__}")
    if not key:
        raise InvalidRequest("an empty tuple is not a key")
    out: list[str] = []
    for element in key:
        _pack_element(element, out, 0)
    return "".join(out)


def _pack_element(element: object, out: list[str], depth: int) -> None:
    kind = type(element)
    if kind is str:
        assert isinstance(element, str)
        out.append("\x02")
        out.append(element.encode().decode("latin-1").replace("\x00", "\x00\xff"))
        out.append("\x00")
    elif kind is int:
        assert isinstance(element, int)
        out.append(_pack_int(element))
    elif kind is bytes:
        assert isinstance(element, bytes)
        out.append("\x01")
        out.append(element.decode("latin-1").replace("\x00", "\x00\xff"))
        out.append("\x00")
    elif kind is tuple:
        assert isinstance(element, tuple)
        if depth >= _DEPTH_MAX:
            raise InvalidRequest(f"a key's tuples nest deeper than {_DEPTH_MAX} levels")
        out.append("\x05")
        for item in element:
            _pack_element(item, out, depth + 1)
        out.append("\x00")
    else:
        raise InvalidRequest(
            f"a key's elements are strings, integers, bytes or tuples, got {kind.__name__}"
        )


def _pack_int(value: int) -> str:
    if value == 0:
        return "\x14"
    size = (abs(value).bit_length() + 7) // 8
    if size > INT_BYTES_MAX:
        raise InvalidRequest(f"integers in keys must fit in {INT_BYTES_MAX} bytes (|n| < 2**64)")
    if value > 0:
        return chr(INT_ZERO + size) + value.to_bytes(size, "big").decode("latin-1")
    complement = value + (1 << (8 * size)) - 1
    return chr(INT_ZERO - size) + complement.to_bytes(size, "big").decode("latin-1")


def unpack(packed: str) -> tuple[Element, ...]:
    """The tuple ``pack`` made ``packed`` from; raises InvalidRequest for anything else."""
    fast = _unpack_flat(packed)
    if fast is not None:
        return fast
    items, end = _unpack_items(packed, 0, nested=False, depth=0)
    assert end == len(packed)
    if not items:
        raise InvalidRequest("an empty tuple is not a key")
    return tuple(items)


def _unpack_flat(packed: str) -> tuple[Element, ...] | None:
    """``unpack`` of the common packing, a flat tuple of ASCII strings and non-negative
    integers without a 0x00 inside (most keys); None for anything else, which the general
    parse then reads or refuses."""
    items: list[Element] = []
    at, size = 0, len(packed)
    while at < size:
        code = ord(packed[at])
        if code == STRING:
            zero = packed.find("\x00", at + 1)
            if zero < 0 or packed.startswith("\xff", zero + 1):
                return None
            body = packed[at + 1 : zero]
            if not body.isascii():
                return None
            items.append(body)
            at = zero + 1
        elif INT_ZERO <= code <= INT_ZERO + INT_BYTES_MAX:
            end = at + 1 + code - INT_ZERO
            body = packed[at + 1 : end]
            if len(body) != code - INT_ZERO or (body and (body[0] == "\x00" or max(body) > "\xff")):
                return None
            items.append(int.from_bytes(body.encode("latin-1"), "big"))
            at = end
        else:
            return None
    return tuple(items) if items else None


def _unpack_items(packed: str, at: int, *, nested: bool, depth: int) -> tuple[list[Element], int]:
    items: list[Element] = []
    size = len(packed)
    while at < size:
        code = ord(packed[at])
        if code in (BYTES, STRING):
            raw, at = _unpack_escaped(packed, at + 1)
            if code == BYTES:
                items.append(raw.encode("latin-1"))
            else:
                try:
                    items.append(raw.encode("latin-1").decode())
                except UnicodeError:
                    raise InvalidRequest("a packed key's string is not UTF-8") from None
        elif INT_ZERO - INT_BYTES_MAX <= code <= INT_ZERO + INT_BYTES_MAX:
            n = abs(code - INT_ZERO)
            body = packed[at + 1 : at + 1 + n]
            if len(body) != n or max(body, default="\x00") > "\xff":
                raise InvalidRequest("a packed key's integer is cut short")
            magnitude = int.from_bytes(body.encode("latin-1"), "big")
            if code >= INT_ZERO:
                value = magnitude
            else:
                value = magnitude - (1 << (8 * n)) + 1
            if n and (abs(value).bit_length() + 7) // 8 != n:
                raise InvalidRequest("a packed key's integer is not in its shortest form")
            items.append(value)
            at += 1 + n
        elif code == NESTED:
            if depth >= _DEPTH_MAX:
                raise InvalidRequest(f"a key's tuples nest deeper than {_DEPTH_MAX} levels")
            inner, at = _unpack_items(packed, at + 1, nested=True, depth=depth + 1)
            items.append(tuple(inner))
        elif code == 0 and nested:
            return items, at + 1
        else:
            raise InvalidRequest(f"not a packed key: type code {code:#x} at {at}")
    if nested:
        raise InvalidRequest("a packed key's nested tuple is not closed")
    return items, at


def _unpack_escaped(packed: str, at: int) -> tuple[str, int]:
    """The body of a bytes or string element starting at ``at``, and where it ends."""
    parts: list[str] = []
    while True:
        zero = packed.find("\x00", at)
        if zero < 0:
            raise InvalidRequest("a packed key's string or bytes is not closed")
        body = packed[at:zero]
        if body and max(body) > "\xff":
            raise InvalidRequest("a packed key holds a character above 0xFF")
        parts.append(body)
        if packed.startswith("\xff", zero + 1):
            parts.append("\x00")
            at = zero + 2
        else:
            return "".join(parts), zero + 1


def check_packed(key: str) -> None:
    """Raises InvalidRequest unless ``key`` is a packing (``pack(unpack(key)) == key``), as
    ``unpack`` would, without building the tuple (a server checks every packed key of
    every request)."""
    if not key:
        raise InvalidRequest("an empty tuple is not a key")
    _check_items(key, 0, nested=False, depth=0)


def _check_items(packed: str, at: int, *, nested: bool, depth: int) -> int:
    size = len(packed)
    while at < size:
        code = ord(packed[at])
        if code in (STRING, BYTES):
            end = _escaped_end(packed, at + 1)
            if end < 0:
                raise InvalidRequest("a packed key's string or bytes is not closed")
            body = packed[at + 1 : end - 1]
            at = end
            if body:
                top = max(body)
                if top > "\xff":
                    raise InvalidRequest("a packed key holds a character above 0xFF")
                if code == STRING and top >= "\x80":
                    try:
                        body.replace("\x00\xff", "\x00").encode("latin-1").decode()
                    except UnicodeError:
                        raise InvalidRequest("a packed key's string is not UTF-8") from None
        elif INT_ZERO - INT_BYTES_MAX <= code <= INT_ZERO + INT_BYTES_MAX:
            n = code - INT_ZERO
            if n:
                width = abs(n)
                body = packed[at + 1 : at + 1 + width]
                if len(body) != width or max(body) > "\xff":
                    raise InvalidRequest("a packed key's integer is cut short")
                # Shortest form: no leading 0x00 byte (a positive integer), 0xFF (a negative).
                if body[0] == ("\x00" if n > 0 else "\xff"):
                    raise InvalidRequest("a packed key's integer is not in its shortest form")
                at += 1 + width
            else:
                at += 1
        elif code == NESTED:
            if depth >= _DEPTH_MAX:
                raise InvalidRequest(f"a key's tuples nest deeper than {_DEPTH_MAX} levels")
            at = _check_items(packed, at + 1, nested=True, depth=depth + 1)
        elif code == 0 and nested:
            return at + 1
        else:
            raise InvalidRequest(f"not a packed key: type code {code:#x} at {at}")
    if nested:
        raise InvalidRequest("a packed key's nested tuple is not closed")
    return at


def to_stored(key: object) -> str:
    """The stored form of a key as the API takes it: a tuple packed, a string as it is."""
    if type(key) is tuple:
        return pack(key)
    if type(key) is str:
        return key
    raise InvalidRequest(f"keys are strings or tuples, got {type(key).__name__}")


def tuple_of(items: list[Any]) -> tuple[Any, ...]:
    """A tuple as it arrived over the wire (an array, nested arrays for nested tuples)."""
    return tuple(tuple_of(item) if type(item) is list else item for item in items)


def from_stored(key: str) -> Key:
    """A key as the API hands it back: a packing unpacked, a string as it is."""
    return unpack(key) if key < PACKED_BELOW else key


def prefix_range(prefix: tuple[Element, ...]) -> tuple[str, str]:
    """``[lo, hi)``: the stored keys of every tuple that starts with ``prefix`` (and longer
    than it; ``prefix`` itself is in the range too)."""
    lo = pack(prefix)
    return lo, lo + PREFIX_END


def first_element_end(packed: str) -> int:
    """Where the first element of a packing ends (its table is ``packed[:end]``); the whole
    string if it does not end."""
    end = element_end(packed, 0)
    return end if end >= 0 else len(packed)


def element_end(packed: str, at: int) -> int:
    """Where the element of a packing that starts at ``at`` ends; -1 if none starts there
    or it is cut short. Finds the end only: the element is not checked."""
    if at >= len(packed):
        return -1
    code = ord(packed[at])
    if code in (STRING, BYTES):
        return _escaped_end(packed, at + 1)
    if INT_ZERO - INT_BYTES_MAX <= code <= INT_ZERO + INT_BYTES_MAX:
        end = at + 1 + abs(code - INT_ZERO)
        return end if end <= len(packed) else -1
    if code == NESTED:
        try:
            _, end = _unpack_items(packed, at + 1, nested=True, depth=1)
        except InvalidRequest:
            return -1
        return end
    return -1


def _escaped_end(packed: str, at: int) -> int:
    """Where a bytes or string body starting at ``at`` ends (after its 0x00; a 0x00 0xFF
    inside is an escaped 0x00); -1 if it is not closed."""
    while True:
        zero = packed.find("\x00", at)
        if zero < 0:
            return -1
        if not packed.startswith("\xff", zero + 1):
            return zero + 1
        at = zero + 2


def int_element(packed: str, at: int) -> tuple[int, int] | None:
    """The integer element of a packing that starts at ``at``, and where it ends; None if
    no integer starts there."""
    if at >= len(packed):
        return None
    n = ord(packed[at]) - INT_ZERO
    if not -INT_BYTES_MAX <= n <= INT_BYTES_MAX:
        return None
    width = abs(n)
    end = at + 1 + width
    if end > len(packed):
        return None
    try:
        magnitude = int.from_bytes(packed[at + 1 : end].encode("latin-1"), "big")
    except UnicodeError:
        return None
    return (magnitude if n >= 0 else magnitude - (1 << (8 * width)) + 1), end
