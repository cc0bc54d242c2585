"""Translation between the Paxos stream messages of ``store.core.paxos`` and the protobuf
messages of ``proto/replication.proto`` (generated into ``replication_pb2``).

The server's gRPC adapter calls ``to_batch`` on what a stream role's ``ready()`` returned
for one peer region, and ``from_batch`` on what arrives. ``from_batch`` validates like
``store.core.paxos.decode``: anything malformed raises ``InvalidRequest`` and nothing
else, so no input from another region can crash a server (DESIGN.md §1).

Records are opaque to replication: each travels as its own msgpack encoding.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import msgpack
from google.protobuf.message import DecodeError

from store.core.values import PACK, unpackb
from store.core.errors import InvalidRequest
from store.core.paxos import (
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
from store.core.paxos.messages import ENTRIES_PER_MESSAGE_MAX, RECORDS_PER_ENTRY_MAX
from store.core.vclock import VectorClock
from store.proto import replication_pb2 as pb

_packb = msgpack.Packer(autoreset=True, **PACK).pack


def _bad(what: str) -> InvalidRequest:
    return InvalidRequest(f"malformed replication message: {what}")


# ---- core -> protobuf ------------------------------------------------------------------


def _ballot_pb(out: Any, ballot: Ballot) -> None:
    out.round = ballot.round
    out.leader = ballot.leader


# Entries encoded lately, by identity: an entry goes to every follower of its stream (and
# again on a retransmission), so its records are packed once, not once per destination.
# Each holds its entry, so an id in it cannot be reused while it is there.
_ENCODED_ENTRIES_MAX = 256
_encoded_entries: OrderedDict[int, tuple[Entry, Any]] = OrderedDict()


def _entry_pb(out: Any, entry: Entry) -> None:
    cached = _encoded_entries.get(id(entry))
    if cached is not None and cached[0] is entry:
        out.CopyFrom(cached[1])
        return
    encoded = pb.Entry()
    _fill_entry_pb(encoded, entry)
    _encoded_entries[id(entry)] = (entry, encoded)
    if len(_encoded_entries) > _ENCODED_ENTRIES_MAX:
        _encoded_entries.popitem(last=False)
    out.CopyFrom(encoded)


def _fill_entry_pb(out: Any, entry: Entry) -> None:
    out.kind = int(entry.kind)
    out.records.extend(_packb(record) for record in entry.records)
    out.counters.extend(entry.counters)
    out.watermark = entry.watermark
    for shard, counter in sorted(entry.vw.items()):
        item = out.vw.add()
        item.shard = shard
        item.counter = counter
    out.epoch = entry.epoch


def message_to_pb(message: PaxosMessage) -> Any:
    """One core message as a ``ReplicationMessage``."""
    out = pb.ReplicationMessage()
    if isinstance(message, Prepare):
        body = out.prepare
        body.stream = message.stream
        _ballot_pb(body.ballot, message.ballot)
        body.from_slot = message.from_slot
    elif isinstance(message, Promise):
        body = out.promise
        body.stream = message.stream
        _ballot_pb(body.ballot, message.ballot)
        body.from_slot = message.from_slot
        for slot, ballot, entry in message.accepted:
            item = body.accepted.add()
            item.slot = slot
            _ballot_pb(item.ballot, ballot)
            _entry_pb(item.entry, entry)
        body.complete = message.complete
    elif isinstance(message, Accept):
        body = out.accept
        body.stream = message.stream
        _ballot_pb(body.ballot, message.ballot)
        body.slot = message.slot
        _entry_pb(body.entry, message.entry)
        body.chosen_through = message.chosen_through
    elif isinstance(message, Accepted):
        body = out.accepted
        body.stream = message.stream
        _ballot_pb(body.ballot, message.ballot)
        body.slot = message.slot
    elif isinstance(message, Reject):
        body = out.reject
        body.stream = message.stream
        _ballot_pb(body.ballot, message.ballot)
        _ballot_pb(body.promised, message.promised)
    elif isinstance(message, Commit):
        body = out.commit
        body.stream = message.stream
        _ballot_pb(body.ballot, message.ballot)
        body.chosen_through = message.chosen_through
    elif isinstance(message, Fetch):
        body = out.fetch
        body.stream = message.stream
        body.from_slot = message.from_slot
        body.to_slot = message.to_slot
    elif isinstance(message, Chosen):
        body = out.chosen
        body.stream = message.stream
        body.first_slot = message.first_slot
        for entry in message.entries:
            _entry_pb(body.entries.add(), entry)
    else:
        raise TypeError(f"no protobuf form for {type(message).__name__}")
    return out


# Messages per batch (one gRPC write): bounds the latency one write adds and its size.
BATCH_MESSAGES_MAX = 4096


def to_batch(src: str, messages: Iterable[PaxosMessage]) -> Any:
    """A ``ReplicationBatch`` from ``src`` holding ``messages`` in order."""
    batch = pb.ReplicationBatch(src=src)
    for message in messages:
        batch.messages.append(message_to_pb(message))
    return batch


# ---- protobuf -> core ------------------------------------------------------------------


def _ballot(value: Any) -> Ballot:
    return Ballot(value.round, value.leader)


def _entry(value: Any) -> Entry:
    if value.kind not in EntryKind._value2member_map_:
        raise _bad(f"unknown entry kind {value.kind}")
    kind = EntryKind(value.kind)
    if len(value.records) > RECORDS_PER_ENTRY_MAX:
        raise _bad(f"more than {RECORDS_PER_ENTRY_MAX} records")
    if len(value.records) != len(value.counters):
        raise _bad("an entry has one counter per record")
    if kind != EntryKind.BATCH and value.records:
        raise _bad("a no-op or INF entry carries no records")
    records = []
    for raw in value.records:
        try:
            records.append(unpackb(raw, strict_map_key=False))
        except Exception as exc:  # garbage of any shape means one thing
            raise _bad(f"record is not msgpack ({type(exc).__name__})") from None
    return Entry(kind, records, list(value.counters), value.watermark, _clock(value.vw), value.epoch)


def _clock(items: Any) -> VectorClock:
    clock: dict[int, int] = {}
    for item in items:
        if item.shard in clock:
            raise _bad("a shard appears twice in a vector clock")
        clock[item.shard] = item.counter
    return VectorClock(clock)


def _entries(values: Sequence[Any]) -> list[Entry]:
    if len(values) > ENTRIES_PER_MESSAGE_MAX:
        raise _bad(f"more than {ENTRIES_PER_MESSAGE_MAX} entries")
    return [_entry(value) for value in values]


def message_from_pb(message: Any) -> PaxosMessage:
    which = message.WhichOneof("body")
    if which == "prepare":
        m = message.prepare
        return Prepare(m.stream, _ballot(m.ballot), m.from_slot)
    if which == "promise":
        m = message.promise
        if len(m.accepted) > ENTRIES_PER_MESSAGE_MAX:
            raise _bad(f"more than {ENTRIES_PER_MESSAGE_MAX} accepted entries")
        accepted = [(a.slot, _ballot(a.ballot), _entry(a.entry)) for a in m.accepted]
        return Promise(m.stream, _ballot(m.ballot), m.from_slot, accepted, m.complete)
    if which == "accept":
        m = message.accept
        return Accept(m.stream, _ballot(m.ballot), m.slot, _entry(m.entry), m.chosen_through)
    if which == "accepted":
        m = message.accepted
        return Accepted(m.stream, _ballot(m.ballot), m.slot)
    if which == "reject":
        m = message.reject
        return Reject(m.stream, _ballot(m.ballot), _ballot(m.promised))
    if which == "commit":
        m = message.commit
        return Commit(m.stream, _ballot(m.ballot), m.chosen_through)
    if which == "fetch":
        m = message.fetch
        return Fetch(m.stream, m.from_slot, m.to_slot)
    if which == "chosen":
        m = message.chosen
        return Chosen(m.stream, m.first_slot, _entries(m.entries))
    raise _bad("empty message")


def from_batch(batch: Any) -> tuple[str, list[PaxosMessage]]:
    """The sender and the core messages of a ``ReplicationBatch``, validated."""
    return batch.src, [message_from_pb(message) for message in batch.messages]


def parse_batch(data: bytes) -> tuple[str, list[PaxosMessage]]:
    """``from_batch`` of raw bytes; a protobuf parse failure is ``InvalidRequest`` too."""
    batch = pb.ReplicationBatch()
    try:
        batch.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise _bad(f"not a ReplicationBatch ({type(exc).__name__})") from None
    return from_batch(batch)
