"""Dates, times and decimals as values (issue 15; store.core.values): stored exactly, read
back the same through every encoding a value passes (requests, Paxos entries on the wire
and in the log, state transfer), and refused with a typed error where they would be
ambiguous; procedure arguments annotated ``int | None`` take None."""

from __future__ import annotations

import datetime
import decimal
from typing import Optional

import msgpack
import pytest

from store.core import paxos
from store.core.errors import InvalidRequest
from store.core.oplist import OpList
from store.core.paxos import Accept, Ballot, Entry, EntryKind
from store.core.settings import DEFAULT_SETTINGS
from store.core.storage import VersionedStore
from store.core.transfer import decode_state, encode_state, version_chains
from store.core.txn import Procedures, Tx
from store.core.vclock import VectorClock
from store.proto.convert import parse_batch, to_batch
from store.protocol import codec
from store.protocol.messages import Submit
from store.sim.local import LocalCluster
from tests.core.test_transfer import sample_state

UTC = datetime.UTC
WHEN = datetime.datetime(2026, 12, 2, 14, 30, 5, 123456, tzinfo=UTC)
PRICE = decimal.Decimal("12.50")
VALUE = {"at": WHEN, "price": PRICE, "lines": [PRICE, WHEN], "tiny": decimal.Decimal("-1E-30")}


def test_values_round_trip_through_a_cluster() -> None:
    cluster = LocalCluster(shards=2)
    cluster.ops([["put", "t/v", VALUE]])
    got = cluster.get("t/v")
    assert got == VALUE
    assert str(got["price"]) == "12.50"  # every digit kept
    assert got["at"].tzinfo is not None and got["at"].microsecond == 123456
    # A time in another zone is the same instant, read back in UTC.
    plus2 = datetime.timezone(datetime.timedelta(hours=2))
    cluster.ops([["put", "t/w", WHEN.astimezone(plus2)]])
    assert cluster.get("t/w") == WHEN and cluster.get("t/w").utcoffset() == datetime.timedelta(0)


def test_values_round_trip_through_paxos_entries_and_state_transfer() -> None:
    vc = VectorClock({0: 3})
    records = [[7, [["t/v", VALUE, False]], vc.to_wire()]]
    entry = Entry(EntryKind.BATCH, records, [3], 3, vc, 0)
    accept = Accept(0, Ballot(1, "a"), 4, entry, 3)
    # In the log (the Paxos codec) and on the replication stream (protobuf).
    for decoded in (paxos.decode(paxos.encode(accept)), parse_batch(to_batch("a", [accept]).SerializeToString())[1][0]):
        assert isinstance(decoded, Accept)
        assert decoded.entry.records[0][1][0][1] == VALUE
    store = VersionedStore()
    store.install("t/v", VALUE, False, vc, 0, 7)
    state = sample_state()
    state.chains = version_chains(store)
    assert dict(decode_state(encode_state(state)).chains)["t/v"][0][0] == VALUE
    # The decimal extension is its text; the timestamp is msgpack's own (type -1), which
    # any msgpack library reads.
    raw = codec.encode(Submit("c", 1, "p", [PRICE, WHEN], False))
    assert b"\x01" + b"12.50" in raw
    assert msgpack.unpackb(raw, timestamp=3, ext_hook=lambda code, data: (code, data))[4] == [
        (1, b"12.50"), WHEN,
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (datetime.datetime(2026, 1, 1), "need a time zone"),
        (decimal.Decimal("NaN"), "finite"),
        (decimal.Decimal("Infinity"), "finite"),
        (decimal.Decimal("1" * 101), "at most 100 digits"),
        (datetime.date(2026, 1, 1), "cannot be stored"),
    ],
)
def test_ambiguous_or_unbounded_values_are_refused(value: object, message: str) -> None:
    # The SDK checks an operation list before it sends it ...
    with pytest.raises(InvalidRequest, match=message):
        OpList([["put", "t/x", value]], DEFAULT_SETTINGS)
    # ... and a server refuses what a client that does not check would send.
    if isinstance(value, decimal.Decimal):
        forged = msgpack.packb(
            [1, "c", 1, "", [[["put", "t/x", msgpack.ExtType(1, str(value).encode())]]], False]
        )
        with pytest.raises(InvalidRequest, match=message):
            codec.decode(forged)


@pytest.mark.parametrize(
    "data", [b"\xd4\x01x", b"\xc7\x03\x01abc", b"\xd4\x07\x00"],  # not a number; unknown type 7
)
def test_malformed_extensions_on_the_wire_are_refused(data: bytes) -> None:
    message = b"\x96\x01\xa1c\x01\xa1p\x91" + data + b"\xc2"  # Submit with that one argument
    with pytest.raises(InvalidRequest):
        codec.decode(message)


def test_a_message_with_a_map_keyed_by_anything_but_strings_is_refused() -> None:
    """A value's map keys are strings (OpList refuses others); a client that does not check
    cannot send one either: the message is refused as it is read (msgpack's
    strict_map_key), and the same map with string keys goes through."""
    with pytest.raises(InvalidRequest, match="map keys in values must be strings"):
        OpList([["put", "t/x", {1: 2}]], DEFAULT_SETTINGS)
    forged = msgpack.packb([1, "c", 1, "", [[["put", "t/x", {1: 2}]]], False])
    with pytest.raises(InvalidRequest, match="not msgpack"):
        codec.decode(forged)
    fine = msgpack.packb([1, "c", 1, "", [[["put", "t/x", {"1": 2}]]], False])
    decoded = codec.decode(fine)
    assert isinstance(decoded, Submit) and decoded.args == [[["put", "t/x", {"1": 2}]]]


def test_optional_annotated_arguments_take_none_and_refuse_other_types() -> None:
    procedures = Procedures()

    async def pay(tx: Tx, amount: int | None, note: Optional[str], when: datetime.datetime) -> list[object]:  # noqa: UP045 (both spellings are checked)
        return [amount, note, when]

    procedures.register("pay", pay)
    cluster = LocalCluster(shards=1, procedures=procedures)
    assert cluster.run("pay", None, None, WHEN) == [None, None, WHEN]
    assert cluster.run("pay", 5, "x", WHEN) == [5, "x", WHEN]
    with pytest.raises(InvalidRequest, match="'amount' must be int or None, got str"):
        cluster.run("pay", "5", None, WHEN)
    with pytest.raises(InvalidRequest, match="'when' must be datetime, got str"):
        cluster.run("pay", 5, None, "2026-12-02")
