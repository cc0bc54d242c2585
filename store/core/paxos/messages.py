"""Messages of a Paxos stream and their wire encoding (msgpack, strictly validated).

Names follow "Paxos Made Simple" (Lamport, 2001): phase 1 is ``Prepare`` / ``Promise``,
phase 2 is ``Accept`` / ``Accepted``; a refusal of either is a ``Reject`` that names the
ballot the acceptor has promised, so a stale leader learns it was deposed. ``Commit``
announces the leader's commit index when no ``Accept`` carries it; ``Fetch`` / ``Chosen``
let a learner fill a gap from the leader.

Every message names its ``stream`` (an integer the replica assigns, e.g. one per shard
leader worker), so one connection between two regions carries all of their streams.

Each message is a msgpack array ``[tag, field, ...]``; tags start at 101 so they can never
be mistaken for the messages of ``store.protocol.codec``. ``decode`` checks every
field before building a message: malformed input raises ``InvalidRequest`` and nothing else.
The gRPC schema in ``proto/replication.proto`` mirrors these classes field for field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgpack

from store.core.paxos.types import Ballot, Entry, EntryKind
from store.core.values import PACK
from store.core.vclock import VectorClock
from store.protocol.messages import Message
from store.protocol.wirecheck import Fields, decode_tagged


class PaxosMessage(Message):
    __slots__: tuple[str, ...] = ()
    stream: int


class Prepare(PaxosMessage):
    """Phase 1a: promise ``ballot`` and report what you accepted from ``from_slot`` on."""

    __slots__ = ("ballot", "from_slot", "stream")

    def __init__(self, stream: int, ballot: Ballot, from_slot: int) -> None:
        self.stream = stream
        self.ballot = ballot
        self.from_slot = from_slot


class Promise(PaxosMessage):
    """Phase 1b: ``ballot`` promised; ``accepted`` is ``[(slot, ballot, entry)]`` in slot order
    from ``from_slot``. ``complete`` is False when the list was cut at
    ``promise_entries_max``: the leader asks again from the slot after the last one."""

    __slots__ = ("accepted", "ballot", "complete", "from_slot", "stream")

    def __init__(
        self,
        stream: int,
        ballot: Ballot,
        from_slot: int,
        accepted: list[tuple[int, Ballot, Entry]],
        complete: bool,
    ) -> None:
        self.stream = stream
        self.ballot = ballot
        self.from_slot = from_slot
        self.accepted = accepted
        self.complete = complete


class Accept(PaxosMessage):
    """Phase 2a for one slot, with the leader's commit index: every slot below
    ``chosen_through`` is chosen, with the value this ballot proposed for it."""

    __slots__ = ("ballot", "chosen_through", "entry", "slot", "stream")

    def __init__(
        self, stream: int, ballot: Ballot, slot: int, entry: Entry, chosen_through: int
    ) -> None:
        self.stream = stream
        self.ballot = ballot
        self.slot = slot
        self.entry = entry
        self.chosen_through = chosen_through


class Accepted(PaxosMessage):
    """Phase 2b: the sender accepted ``slot`` at ``ballot``."""

    __slots__ = ("ballot", "slot", "stream")

    def __init__(self, stream: int, ballot: Ballot, slot: int) -> None:
        self.stream = stream
        self.ballot = ballot
        self.slot = slot


class Reject(PaxosMessage):
    """A Prepare or Accept at ``ballot`` refused: the sender promised ``promised``."""

    __slots__ = ("ballot", "promised", "stream")

    def __init__(self, stream: int, ballot: Ballot, promised: Ballot) -> None:
        self.stream = stream
        self.ballot = ballot
        self.promised = promised


class Commit(PaxosMessage):
    """The commit index of the leader of ``ballot`` (same meaning as on ``Accept``)."""

    __slots__ = ("ballot", "chosen_through", "stream")

    def __init__(self, stream: int, ballot: Ballot, chosen_through: int) -> None:
        self.stream = stream
        self.ballot = ballot
        self.chosen_through = chosen_through


class Fetch(PaxosMessage):
    """A learner asks for the chosen entries of slots ``[from_slot, to_slot)``."""

    __slots__ = ("from_slot", "stream", "to_slot")

    def __init__(self, stream: int, from_slot: int, to_slot: int) -> None:
        self.stream = stream
        self.from_slot = from_slot
        self.to_slot = to_slot


class Chosen(PaxosMessage):
    """Chosen entries of consecutive slots from ``first_slot`` (possibly none)."""

    __slots__ = ("entries", "first_slot", "stream")

    def __init__(self, stream: int, first_slot: int, entries: list[Entry]) -> None:
        self.stream = stream
        self.first_slot = first_slot
        self.entries = entries


# ---- encoding --------------------------------------------------------------------------

_packb = msgpack.Packer(autoreset=True, **PACK).pack


def entry_to_wire(entry: Entry) -> list[Any]:
    # Index 3 held the batch's max clock until entries stopped carrying one; an empty array
    # (one byte) keeps the shape that write-ahead logs of earlier versions have.
    return [int(entry.kind), list(entry.records), list(entry.counters), [],
            entry.watermark, entry.vw.to_wire(), entry.epoch]


def _ballot(ballot: Ballot) -> list[Any]:
    return [ballot.round, ballot.leader]


_ENCODERS: Final[dict[type, Callable[[Any], list[Any]]]] = {
    Prepare: lambda m: [101, m.stream, _ballot(m.ballot), m.from_slot],
    Promise: lambda m: [
        102, m.stream, _ballot(m.ballot), m.from_slot,
        [[slot, _ballot(b), entry_to_wire(e)] for slot, b, e in m.accepted], m.complete,
    ],
    Accept: lambda m: [
        103, m.stream, _ballot(m.ballot), m.slot, entry_to_wire(m.entry), m.chosen_through,
    ],
    Accepted: lambda m: [104, m.stream, _ballot(m.ballot), m.slot],
    Reject: lambda m: [105, m.stream, _ballot(m.ballot), _ballot(m.promised)],
    Commit: lambda m: [106, m.stream, _ballot(m.ballot), m.chosen_through],
    Fetch: lambda m: [107, m.stream, m.from_slot, m.to_slot],
    Chosen: lambda m: [108, m.stream, m.first_slot, [entry_to_wire(e) for e in m.entries]],
}


def encode(message: PaxosMessage) -> bytes:
    encoder = _ENCODERS.get(type(message))
    if encoder is None:
        raise TypeError(f"no wire encoding for {type(message).__name__}")
    packed: bytes = _packb(encoder(message))
    return packed


# ---- decoding --------------------------------------------------------------------------

# Bounds on decoded shapes, so garbage cannot make a receiver allocate without limit.
RECORDS_PER_ENTRY_MAX: Final = 1 << 16
ENTRIES_PER_MESSAGE_MAX: Final = 1 << 16


_FIELDS: Final = Fields("stream message", ENTRIES_PER_MESSAGE_MAX)
_bad = _FIELDS.bad
_int = _FIELDS.integer
_bool = _FIELDS.boolean
_list = _FIELDS.array


def _decode_ballot(value: Any) -> Ballot:
    raw = _list(value, "ballot")
    if len(raw) != 2 or type(raw[1]) is not str:
        raise _bad("a ballot is [round, leader]")
    return Ballot(_int(raw[0], "ballot round"), raw[1])


def entry_from_wire(value: Any) -> Entry:
    raw = _list(value, "entry")
    if len(raw) != 7:
        raise _bad("an entry is [kind, records, counters, [], watermark, vw, epoch]")
    kind_value = _int(raw[0], "entry kind")
    if kind_value not in EntryKind._value2member_map_:
        raise _bad(f"unknown entry kind {kind_value}")
    kind = EntryKind(kind_value)
    records = _list(raw[1], "records", RECORDS_PER_ENTRY_MAX)
    counters = [_int(c, "counter") for c in _list(raw[2], "counters", RECORDS_PER_ENTRY_MAX)]
    if len(records) != len(counters):
        raise _bad("an entry has one counter per record")
    if kind != EntryKind.BATCH and records:
        raise _bad("a no-op or INF entry carries no records")
    VectorClock.from_wire(raw[3])  # checked, not kept: a batch clock an earlier version wrote
    return Entry(kind, records, counters, _int(raw[4], "watermark"), VectorClock.from_wire(raw[5]),
                 _int(raw[6], "epoch"))


def _accepted(value: Any) -> list[tuple[int, Ballot, Entry]]:
    items = []
    for raw in _list(value, "accepted"):
        raw = _list(raw, "accepted item")
        if len(raw) != 3:
            raise _bad("an accepted item is [slot, ballot, entry]")
        items.append((_int(raw[0], "slot"), _decode_ballot(raw[1]), entry_from_wire(raw[2])))
    return items


_DECODERS: Final[dict[int, tuple[int, Callable[[list[Any]], PaxosMessage]]]] = {
    101: (4, lambda f: Prepare(_int(f[1], "stream"), _decode_ballot(f[2]),
                               _int(f[3], "from_slot"))),
    102: (6, lambda f: Promise(_int(f[1], "stream"), _decode_ballot(f[2]),
                               _int(f[3], "from_slot"), _accepted(f[4]),
                               _bool(f[5], "complete"))),
    103: (6, lambda f: Accept(_int(f[1], "stream"), _decode_ballot(f[2]), _int(f[3], "slot"),
                              entry_from_wire(f[4]), _int(f[5], "chosen_through"))),
    104: (4, lambda f: Accepted(_int(f[1], "stream"), _decode_ballot(f[2]),
                                _int(f[3], "slot"))),
    105: (4, lambda f: Reject(_int(f[1], "stream"), _decode_ballot(f[2]),
                              _decode_ballot(f[3]))),
    106: (4, lambda f: Commit(_int(f[1], "stream"), _decode_ballot(f[2]),
                              _int(f[3], "chosen_through"))),
    107: (4, lambda f: Fetch(_int(f[1], "stream"), _int(f[2], "from_slot"),
                             _int(f[3], "to_slot"))),
    108: (4, lambda f: Chosen(_int(f[1], "stream"), _int(f[2], "first_slot"),
                              [entry_from_wire(e) for e in _list(f[3], "entries")])),
}


def decode(data: bytes | bytearray | memoryview, max_bytes: int = 64 << 20) -> PaxosMessage:
    """Decodes one stream message; ``InvalidRequest`` for anything malformed (only that)."""
    # Records are opaque to the stream, so map keys of any hashable type are allowed.
    return decode_tagged(data, _DECODERS, _FIELDS, max_bytes, strict_map_key=False)
