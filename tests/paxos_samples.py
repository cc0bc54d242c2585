"""One of every Paxos stream message, with real entries, for the codec, protobuf and
transport tests (each must carry all of them intact)."""

from __future__ import annotations

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

B1, B2 = Ballot(1, "us"), Ballot(2, "eu")
BATCH = Entry(
    EntryKind.BATCH,
    [["put", "k", 1], {"nested": [1, b"x"]}, None],
    [3, 5, 8],
    8,
    VectorClock({0: 7, 1: 4}),
)


def sample_messages(stream: int = 2, entry: Entry = BATCH) -> list[PaxosMessage]:
    return [
        Prepare(stream, B1, 0),
        Promise(stream, B2, 3, [(3, B1, entry), (4, B1, NOOP), (5, B2, INF)], True),
        Promise(stream, B2, 3, [(3, B1, entry)], False),
        Accept(stream, B1, 7, entry, 5),
        Accept(stream, B1, 8, INF, 5),
        Accept(stream, B1, 9, Entry(EntryKind.BATCH, watermark=14), 5),
        Accepted(stream, B1, 7),
        Reject(stream, B1, B2),
        Commit(stream, B1, 8),
        Fetch(stream, 0, 100),
        Chosen(stream, 5, [entry, NOOP, INF, Entry(EntryKind.BATCH, watermark=10)]),
    ]
