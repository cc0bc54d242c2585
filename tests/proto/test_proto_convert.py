"""Core Paxos messages survive the protobuf form of proto/replication.proto unchanged, and
malformed protobuf input is an ``InvalidRequest`` (DESIGN.md §1 "bad input")."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.core.errors import InvalidRequest
from store.core.paxos import (
    INF,
    NOOP,
    Accept,
    Accepted,
    Ballot,
    Chosen,
    Commit,
    Entry,
    EntryKind,
    Fetch,
    PaxosMessage,
    Prepare,
    Promise,
    Reject,
)
from store.core.vclock import VectorClock

pb = pytest.importorskip("store.proto.replication_pb2", reason="protobuf is not installed")
convert = pytest.importorskip("store.proto.convert")

B1, B2 = Ballot(1, "us"), Ballot(2, "eu")
BATCH = Entry(EntryKind.BATCH, [["w", "k", 1], {"a": b"\x00"}], [4, 9], VectorClock({0: 9, 3: 2}),
              9)
MESSAGES: list[PaxosMessage] = [
    Prepare(1, B1, 0),
    Promise(1, B2, 3, [(3, B1, BATCH), (4, B1, NOOP)], False),
    Accept(2, B1, 7, BATCH, 5),
    Accept(2, B1, 8, INF, 5),
    Accepted(2, B1, 7),
    Reject(2, B1, B2),
    Commit(2, B1, 8),
    Fetch(2, 0, 100),
    Chosen(2, 5, [BATCH, Entry(EntryKind.BATCH, watermark=10)]),
]


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
        lambda m: m.accept.entry.vc.extend([pb.ClockEntry(shard=1, counter=2)] * 2),
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
