"""How values are laid out in msgpack, everywhere they travel or rest: requests and replies,
Paxos entries, write-ahead logs, snapshots and state transfer.

A value is None, a boolean, an integer (64 bits), a float, a string, bytes, a list (a tuple
travels as a list), a map with string keys, or:

* a **date and time**: a ``datetime`` with a time zone, stored as msgpack's timestamp
  extension (type -1: seconds and nanoseconds since 1970-01-01 UTC, so any msgpack library
  reads it), read back in UTC, to the microsecond. A ``datetime`` without a time zone is
  refused: which zone it meant is not known.
* a **decimal**: a finite ``decimal.Decimal``, stored as extension type 1 whose bytes are
  its text (``"12.50"``: every digit kept, trailing zeros too).

``PACK`` and ``UNPACK`` are the options of every packer and unpacker of the system; a value
of any other type is refused by ``store.core.txn.value_size`` before it is packed.
"""

from __future__ import annotations

import datetime
import decimal
from typing import Any, Final

import msgpack

from store.core.errors import InvalidRequest

DECIMAL_EXT: Final = 1
DECIMAL_DIGITS_MAX: Final = 100


def _default(value: Any) -> Any:
    if type(value) is decimal.Decimal:
        return msgpack.ExtType(DECIMAL_EXT, str(value).encode())
    raise TypeError(f"values of type {type(value).__name__} cannot be stored")


def _ext_hook(code: int, data: bytes) -> Any:
    if code == DECIMAL_EXT:
        return decimal_from_wire(data)
    raise InvalidRequest(f"unknown msgpack extension type {code}")


def decimal_from_wire(data: bytes) -> decimal.Decimal:
    if len(data) > DECIMAL_DIGITS_MAX + 8:
        raise InvalidRequest("a decimal longer than its limit")
    try:
        value = decimal.Decimal(data.decode("ascii"))
    except (UnicodeDecodeError, decimal.InvalidOperation):
        raise InvalidRequest("a decimal extension that is not a decimal number") from None
    check_decimal(value)
    return value


def check_decimal(value: decimal.Decimal) -> int:
    """Raises InvalidRequest unless ``value`` can be stored; returns its encoded size."""
    if not value.is_finite():
        raise InvalidRequest("decimal values must be finite (no NaN or infinity)")
    if len(value.as_tuple().digits) > DECIMAL_DIGITS_MAX:
        raise InvalidRequest(f"decimal values have at most {DECIMAL_DIGITS_MAX} digits")
    return len(str(value)) + 3


def check_datetime(value: datetime.datetime) -> int:
    """Raises InvalidRequest unless ``value`` can be stored (it names its time zone)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidRequest(
            "datetime values need a time zone (datetime.now(timezone.utc), say): "
            "a naive one could mean any zone"
        )
    return 15


# Options of every msgpack Packer and unpacker (``msgpack.Packer(**PACK)``).
PACK: Final[dict[str, Any]] = {"use_bin_type": True, "datetime": True, "default": _default}
# Timestamps decode as datetime objects (msgpack's timestamp=3).
_TIMESTAMP_AS_DATETIME: Final = 3
UNPACK: Final[dict[str, Any]] = {"raw": False, "timestamp": _TIMESTAMP_AS_DATETIME, "ext_hook": _ext_hook}


def unpackb(data: bytes | bytearray | memoryview, strict_map_key: bool = True) -> Any:
    """``msgpack.unpackb(data, strict_map_key=..., use_list=True, **UNPACK)``, its keywords
    written out, and those that are msgpack's defaults (>= 1.0: raw=False, use_list=True,
    strict_map_key=True) left out: a call's keywords are parsed on every call, and with
    all five it took 0.69 us for a 26-byte answer against 0.35 (2026-12-06)."""
    if strict_map_key:
        return msgpack.unpackb(data, timestamp=_TIMESTAMP_AS_DATETIME, ext_hook=_ext_hook)
    return msgpack.unpackb(
        data, strict_map_key=False, timestamp=_TIMESTAMP_AS_DATETIME, ext_hook=_ext_hook
    )
