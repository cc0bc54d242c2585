"""Core Paxos messages survive the protobuf form of proto/replication.proto unchanged, and
malformed protobuf input is an ``InvalidRequest`` (DESIGN.md §1 "bad input")."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.core.errors import InvalidRequest
from store.core.paxos import (
    Accept,
    Entry,
    EntryKind,
)
from tests.paxos_samples import B1, sample_messages

pb = pytest.importorskip("store.proto.replication_pb2", reason="protobuf is not installed")
convert = pytest.importorskip("store.proto.convert")

MESSAGES = sample_messages()


def test_every_message_round_trips_through_a_batch() -> None:
    batch = convert.to_batch("us", MESSAGES)
    src, messages = convert.parse_batch(batch.SerializeToString())
    assert src == "us"
    assert messages == MESSAGES


@pytest.mark.parametrize(
    "mutate",
    [
        lambda m: m.accept.entry.records.append(b"\xc1"),  # record not msgpack
        lambda m: m.accept.entry.counters.append(3),  # a counter without a record
        lambda m: setattr(m.accept.entry, "kind", 9),  # unknown kind (open proto3 enum)
        lambda m: (m.accept.entry.records.append(b"\x01"), m.accept.entry.counters.append(1),
                   setattr(m.accept.entry, "kind", 1)),  # a no-op with records
        lambda m: m.accept.entry.vw.extend([pb.ClockEntry(shard=1, counter=2)] * 2),
        lambda m: m.ClearField("body"),  # empty
    ],
)
def test_malformed_messages_are_invalid_requests(mutate: object) -> None:
    message = convert.message_to_pb(Accept(2, B1, 7, Entry(EntryKind.BATCH), 5))
    mutate(message)  # type: ignore[operator]
    batch = pb.ReplicationBatch(src="us", messages=[message])
    with pytest.raises(InvalidRequest):
        convert.parse_batch(batch.SerializeToString())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_bytes_never_raise_anything_but_invalid_request(data: bytes) -> None:
    with contextlib.suppress(InvalidRequest):
        convert.parse_batch(data)
