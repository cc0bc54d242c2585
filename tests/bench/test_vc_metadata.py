"""bench/vc_metadata.py: the clocks' share of what is sent, and a small run in one and
three regions (issue 12 item 4)."""

from __future__ import annotations

import msgpack
import pytest

from bench.vc_metadata import WireMeter, clock_share, row
from store.core.errors import Status
from store.core.paxos import Accept, Ballot, Entry, EntryKind
from store.core.vclock import EMPTY, VectorClock
from store.proto.convert import to_batch
from store.protocol import codec
from store.protocol.messages import Gossip, InstallRequest, Outcome, ReadReply


def clock_bytes(clock: VectorClock) -> int:
    """What a clock adds to a msgpack message over an empty one ([] is one byte)."""
    return len(msgpack.packb(clock.to_wire())) - 1


def test_the_share_is_the_message_minus_the_message_with_empty_clocks() -> None:
    vc = VectorClock({0: 5, 3: 70_000, 9: 1})
    durable = VectorClock({1: 300})
    data = codec.encode(InstallRequest(7, [("k/1", 1, False)], vc, 0, durable, False))
    share, by_field, clocks = clock_share(data)
    assert share == clock_bytes(vc) + clock_bytes(durable)
    assert by_field == {"InstallRequest.vc": clock_bytes(vc),
                        "InstallRequest.durable": clock_bytes(durable)}
    assert clocks == 2
    empty = codec.encode(Outcome(1, int(Status.COMMITTED), None, EMPTY, ""))
    assert clock_share(empty) == (0, {"Outcome.vc": 0}, 1)


def test_read_items_clocks_count_and_gossip_is_watermark_only() -> None:
    items = [("k/1", 1, 5, False, VectorClock({2: 9}), 4), ("k/2", 2, 6, False, EMPTY, 0)]
    data = codec.encode(ReadReply(1, 1, 0, items, [[items[0]]], 3))
    share, by_field, clocks = clock_share(data)
    assert by_field == {"ReadReply.items": clock_bytes(VectorClock({2: 9})),
                        "ReadReply.scans": clock_bytes(VectorClock({2: 9}))}
    assert share == sum(by_field.values()) and clocks == 3
    meter = WireMeter()
    meter.active = True
    meter.payload(codec.encode(Gossip(0, {1: 10, 2: 20})))
    assert meter.per_txn()["msgpack_clock_bytes"] == 0
    assert meter.per_txn()["watermark_bytes"] > 0


def test_stream_share_is_the_records_clocks() -> None:
    clocks = [VectorClock({0: 4, 5: 900}), VectorClock({0: 5})]
    records = [[10 + i, [["k/1", i, False]], vc.to_wire()] for i, vc in enumerate(clocks)]
    vw = VectorClock({0: 3, 5: 800})
    entry = Entry(EntryKind.BATCH, records, [4, 5], 3, vw, 0)
    data = to_batch("leader/0", [Accept(0, Ballot(1, "leader/0"), 0, entry, 0)]).SerializeToString()
    meter = WireMeter()
    meter.active = True
    meter.certified = 1
    meter.batch(data)
    result = meter.per_txn()
    # Small enough that no length prefix changes size: the shares are exact.
    assert result["stream_clock_bytes"] == sum(clock_bytes(c) for c in clocks)
    assert result["watermark_bytes"] > 0
    assert result["stream_bytes"] == len(data)


@pytest.mark.patches_core  # the meter wraps the simulated servers' RPC endpoints
def test_a_small_run_in_one_and_three_regions() -> None:
    one = row(4, 1, 1, 150, 8)
    three = row(4, 3, 1, 600, 8)
    assert one["transactions"] > 0 and three["transactions"] > 0
    assert one["sparse_stream_bytes"] == 0  # no followers, no stream
    for r in (one, three):
        assert r["sparse_msgpack_clock_bytes"] > 0
        assert r["sparse_msgpack_clock_bytes"] <= r["unsparse_msgpack_clock_bytes"]
        assert r["sparse_entries"] <= r["unsparse_entries"]
        assert r["dense_bytes_per_clock"] == 32
        assert r["sparse_msgpack_bytes_per_clock"] == pytest.approx(
            r["sparse_msgpack_clock_bytes"] / r["sparse_msgpack_clocks"], rel=0.01
        )
    assert three["sparse_stream_clock_bytes"] > 0
    assert three["sparse_stream_clock_bytes"] <= three["unsparse_stream_clock_bytes"]
