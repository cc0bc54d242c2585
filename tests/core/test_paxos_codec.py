"""Wire encoding of the Paxos stream messages: round trips, and strict validation — every
malformed input is an ``InvalidRequest`` and nothing else (DESIGN.md §1 "bad input")."""

from __future__ import annotations

import contextlib
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.core.errors import InvalidRequest
from store.core.paxos import (
    Accept,
    PaxosMessage,
    decode,
    encode,
)
from tests.paxos_samples import sample_messages

MESSAGES = sample_messages()


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(message: PaxosMessage) -> None:
    assert decode(encode(message)) == message


def pack(value: Any) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


# A well-formed empty entry: kind, records, counters, vc, watermark, vw, epoch.
ENTRY = [0, [], [], [], 0, [], 0]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",
        pack({"a": 1}),
        pack([]),
        pack([999, 1]),
        pack([101, 1, [1, "us"]]),  # too few fields
        pack([101, -1, [1, "us"], 0]),  # negative stream
        pack([101, 1, [1, 2], 0]),  # ballot leader not a string
        pack([101, 1, [1, "us", 3], 0]),  # ballot of three fields
        pack([103, 1, [1, "us"], 0, [5, [], [], [], 0, [], 0], 0]),  # unknown entry kind
        pack([103, 1, [1, "us"], 0, [0, ["r"], [], [], 0, [], 0], 0]),  # record without counter
        pack([103, 1, [1, "us"], 0, [1, ["r"], [1], [], 0, [], 0], 0]),  # no-op with records
        pack([103, 1, [1, "us"], 0, [0, [], [], [1], 0, [], 0], 0]),  # odd vector clock
        pack([103, 1, [1, "us"], 0, [0, [], [], [], "w", [], 0], 0]),  # watermark not an int
        pack([103, 1, [1, "us"], 0, [0, [], [], [], 0, [1], 0], 0]),  # odd leader vector watermark
        pack([103, 1, [1, "us"], 0, [0, [], [], [], 0, [], -1], 0]),  # negative epoch
        pack([103, 1, [1, "us"], 0, [0, [], [], [], 0, []], 0]),  # entry without its epoch
        pack([102, 1, [1, "us"], 0, [[0, [1, "us"]]], True]),  # accepted item of two
        pack([102, 1, [1, "us"], 0, [], 1]),  # complete not a bool
        pack([108, 1, 0, [ENTRY, "x"]]),
        pack([108, 1, 0, list(range(70_000))]),  # longer than any message may be
    ],
)
def test_malformed_input_is_an_invalid_request(data: bytes) -> None:
    # Each case breaks one thing in an otherwise well-formed message (ENTRY decodes).
    with pytest.raises(InvalidRequest):
        decode(data)


def test_oversized_input_is_refused_before_parsing() -> None:
    with pytest.raises(InvalidRequest):
        decode(encode(MESSAGES[2]), max_bytes=8)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_never_raises_anything_but_invalid_request(data: bytes) -> None:
    with contextlib.suppress(InvalidRequest):
        decode(data)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(MESSAGES), st.data())
def test_mutated_messages_never_raise_anything_but_invalid_request(
    message: PaxosMessage, data: st.DataObject
) -> None:
    raw = bytearray(encode(message))
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(raw) - 1))
        raw[position] = data.draw(st.integers(0, 255))
    with contextlib.suppress(InvalidRequest):
        decode(bytes(raw))


def test_the_well_formed_base_of_the_malformed_cases_decodes() -> None:
    """The malformed cases above each break one field of this; it must itself be valid."""
    accept = decode(pack([103, 1, [1, "us"], 0, ENTRY, 0]))
    assert isinstance(accept, Accept) and accept.entry.is_heartbeat


def test_an_entry_logged_with_a_batch_clock_by_an_earlier_version_still_decodes() -> None:
    """Entries once carried their batch's max clock at index 3; a write-ahead log of that
    version must still be read (the clock is checked and dropped), and an entry encoded now
    keeps the shape with an empty array there."""
    logged = [0, [["t1"], ["t2"]], [4, 5], [0, 5, 3, 2], 5, [0, 4], 0]
    accept = decode(pack([103, 1, [1, "us"], 0, logged, 0]))
    assert isinstance(accept, Accept)
    assert accept.entry.counters == (4, 5) and accept.entry.watermark == 5
    assert msgpack.unpackb(encode(accept))[4][3] == []
    with pytest.raises(InvalidRequest):  # still checked: garbage there is refused
        decode(pack([103, 1, [1, "us"], 0, [*logged[:3], "x", *logged[4:]], 0]))
