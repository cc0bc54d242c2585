"""The wire codec: every message round-trips; garbage raises InvalidRequest, nothing else."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.core.errors import InvalidRequest
from store.core.vclock import VectorClock
from store.protocol import codec
from store.protocol.messages import (
    AbortReply,
    AbortRequest,
    AwaitOutcomes,
    Gossip,
    InstallReply,
    InstallRequest,
    LockReply,
    LockRequest,
    Outcome,
    Outcomes,
    PrepareReply,
    PrepareRequest,
    ReadReply,
    ReadRequest,
    SnapshotRead,
    SnapshotReply,
    SoloReply,
    SoloRequest,
    StatePiece,
    StateRequest,
    Submit,
    ValidateReply,
    ValidateRequest,
)

VC = VectorClock({0: 3, 2: 9})
ITEM = ("t/a", 4, {"x": [1, 2.5, "s", b"b", None, True]}, False, VC, 77)

MESSAGES = [
    Submit("client-1", 5, "transfer", ["a", 1, [2, 3]], True),
    Submit("c", 1, "", [[["get", "t/a"], ["put", "t/b", 1]]], False),
    Outcome(5, 2, {"r": 1}, VC, ""),
    ReadRequest(1 << 40, 2, ["t/a", "t/b"], [("t/", "t0", 10)]),
    ReadReply(9, 2, 1, [ITEM], [[ITEM, ITEM], []], 12),
    LockRequest(9, ["t/a"]),
    LockReply(9, 1, True, 44, VC, 40),
    ValidateRequest(9, [("t/a", 4)], [("t/", "t0", 5, [("t/a", 4)])], VC),
    ValidateReply(9, 1, False, 40),
    InstallRequest(9, [("t/a", 1, False), ("t/b", None, True)], VC, 3, VectorClock({1: 2}), True),
    InstallReply(9, 1, 41),
    AbortRequest(9),
    AbortReply(9, 0),
    SoloRequest(9, [("t/a", 4)], [], [("t/a", 2, False)], VC, 0, True),
    SoloReply(9, 0, True, VC, 41, VectorClock({3: 1})),
    Gossip(2, {0: 5, 2: 7}),
    Gossip(3, {0: 5, 1: 7}, 9, 4),
    SnapshotRead(3, ["t/a", "t/b"], [("t/", "t0", 10)]),
    SnapshotReply(3, 1, [1, None], [[("t/a", 1)]], VC, 12),
    StateRequest("127.0.0.1:7100", 4, 1, 262144, 262144),
    StatePiece(4, 1, 0, 10, b"\x00\x01state"),
    StatePiece(4, 1, 10, 4096, b"more", True),
    PrepareRequest(9, ["t/a", "t/b"], ["t/b"], VC, 2),
    PrepareReply(9, 1, 1, 44, [ITEM], VC, 40),
    PrepareReply(9, 1, 0, 0, [], VectorClock(), 0),
    AwaitOutcomes("client-1", [3, 5, 1 << 40]),
    Outcomes([Outcome(5, 2, {"r": 1}, VC, "", 7), Outcome(6, 4, None, VC, "rolled back")], [9]),
    Outcomes([], []),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(message) -> None:
    assert codec.decode(codec.encode(message)) == message


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",
        msgpack.packb([]),
        msgpack.packb([99, 1]),
        msgpack.packb([1, "c", -1, "", [], False]),
        msgpack.packb([1, "c", 1, "", "args", False]),
        msgpack.packb([5, 1, ["ok", 3]]),
        msgpack.packb([9, 1, [["k", 1]], [0, 1], 0, [], False]),  # a write of two fields
        msgpack.packb([4, 1, 1, 1, [["k", 1, None, False, [1], 0]], [], 0]),
        msgpack.packb({"a": 1}),
        msgpack.packb([24, 9, 1, 7, 0, [], [], 0]),  # a prepare status that does not exist
        msgpack.packb([23, 9, ["t/a"], "t/b", [], 0]),  # locks that are not a list
        msgpack.packb([25, "c", [1, -2]]),  # a negative sequence number
        msgpack.packb([25, "c", list(range(codec.AWAIT_SEQS_MAX + 1))]),  # too many
        msgpack.packb([26, [[1, "c", 1, "", [], False]], []]),  # a Submit for an outcome
        msgpack.packb([26, [], "unknown"]),
    ],
)
def test_malformed_messages_raise_invalid_request(payload: bytes) -> None:
    with pytest.raises(InvalidRequest):
        codec.decode(payload)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_raise_anything_but_invalid_request(data: bytes) -> None:
    with contextlib.suppress(InvalidRequest):
        codec.decode(data)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(MESSAGES).map(codec.encode),
    st.integers(0, 400),
    st.integers(0, 255),
)
def test_corrupted_messages_never_raise_anything_but_invalid_request(data, at, byte) -> None:
    corrupted = bytearray(data)
    corrupted[at % len(corrupted)] = byte
    with contextlib.suppress(InvalidRequest):
        codec.decode(bytes(corrupted))


def test_the_malformed_install_differs_from_a_valid_one_only_in_its_write() -> None:
    valid = codec.decode(msgpack.packb([9, 1, [["k", 1, False]], [0, 1], 0, [], False]))
    assert isinstance(valid, InstallRequest) and valid.writes == [("k", 1, False)]
