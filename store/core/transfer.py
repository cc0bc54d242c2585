"""State transfer to a restarted replica (docs/recovery.md "Rejoining").

A replica that restarts has lost its memory. Before it may take part in its shard's stream
again it copies the state of a live follower of its shard: everything that follower has
applied through slot ``P`` of the stream (its delivery point), plus what it needs to go on
exactly as that follower would from ``P``:

* the store — every version not rolled back, with its value, clock, epoch and writer;
* the stream position ``P``, the stream's epoch bookkeeping (``StreamEpochs``) and the
  entries the follower still keeps (a later phase 1 must hear of them);
* the epoch, the FVWs applied, the vector watermark, the entries whose visibility is held
  back for an FVW, and the transactions that an FVW may still roll back;
* the cluster map it knows, and the ballot its acceptor promised.

The source is a follower of the shard, or its leader (``ShardLeader.capture_state``: what
its stream has chosen, plus what it installed beyond, which the stream's replay then skips
or its epoch's FVW rolls back). It takes its state once per transfer, when the first piece is asked for, in an
explicit msgpack layout (no pickle: the bytes cross the network), and serves it in pieces of
``transfer_piece_bytes`` (``StateRequest`` / ``StatePiece``), so a large store never needs
one message larger than the RPC core's limit and a lost piece costs one piece (the two
messages are in ``store.protocol.messages``; a piece's bytes are opaque to the protocol).
The rejoiner decodes with ``decode_state``, which checks every field's shape
(``InvalidRequest``).

The source never stops to copy its store. Taking the state copies the small parts and only
the list of keys and the store's next version id (``StoreSnapshot``); each piece then
encodes just the keys it needs, reading every key's versions *with an id below that mark*.
What changes meanwhile cannot leak in or out: versions installed later have larger ids and
are left out (the rejoiner replays them from ``P``); a version rolled back later is left out
too, as if it had been rolled back already (it is of an epoch whose FVW the rejoiner
learns from the same stream, and that rollback finds nothing to do); and the source
collects no garbage while one of its transfers is still encoding (``StateServer.holding``),
so no version the state needs is dropped. Measured on a TPC-C shard (66k rows, 15.6 MB):
taking and encoding the whole state at once stopped the source's event loop for about a
second, longer than ``transfer_retry_ns``, so the rejoiner asked the next source, which
stopped too: the Jepsen TPC-C run with kills never got a replica back, and a leader that is
asked stops heartbeating. A piece now costs the source a few milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from store.core.epoch import StreamEpochs
from store.core.errors import InvalidRequest
from store.core.paxos import Ballot, Entry
from store.core.paxos.messages import entry_from_wire, entry_to_wire
from store.core.storage import CERTIFIED, ROLLED_BACK, VersionedStore
from store.core.values import PACK, UNPACK
from store.core.vclock import VectorClock
from store.protocol.cluster_map import ClusterMap, cluster_map_from_wire
from store.protocol.messages import StatePiece, StateRequest
from store.protocol.wirecheck import Fields

STATE_TAG: Final = 1
STATE_BYTES_MAX: Final = 1 << 34  # what a rejoiner accepts as one state, in all pieces together
# Transfers a source keeps at once (a new one evicts the oldest).
TRANSFERS_KEPT: Final = 2
# Keys (with their versions), or kept stream entries, that one step of encoding packs; a
# piece takes as many steps as it needs.
ITEMS_PER_STEP: Final = 32
# The state's layout: 17 fields; the chains and the kept stream entries go item by item.
_STATE_FIELDS: Final = 17
_CHAINS_AT: Final = 11
_RECENT_AT: Final = 14

# (txn_id, vc, keys written): a replayed transaction an FVW may still roll back.
Speculative = tuple[int, VectorClock, list[str]]
# One key's versions, oldest first: (value, deleted, vc, epoch, txn_id).
Chain = list[tuple[Any, bool, VectorClock, int, int]]


@dataclass
class FollowerState:
    """What a follower hands to a restarted replica of its shard (see the module doc)."""

    shard: int
    slot: int
    epoch: int
    fvw_applied: int
    promised: Ballot
    vw: VectorClock
    epochs: StreamEpochs
    cluster_map: ClusterMap | None
    # key -> versions oldest first: (value, deleted, vc, epoch, txn_id); at the source a
    # StoreSnapshot read as it is encoded, at the rejoiner a list (a key may have none)
    chains: Sequence[tuple[str, Chain]] | StoreSnapshot
    speculative: dict[int, list[Speculative]]
    held_visibility: list[tuple[int, int, VectorClock]]
    recent: dict[int, Entry]
    applied_slots: int
    applied_records: int


class StoreSnapshot:
    """A store's versions as they are now, read later, key by key (see the module doc):
    every key there is now, with its versions whose id is below the store's next id now
    and that are not rolled back when read. Valid while the store collects no garbage.

    ``visible``: a follower's vector watermark now. Its reads are at that watermark or a
    later one, so a version older than a key's newest certified one at or below it is never
    read again (nor rolled back: it is committed): those are left out, as garbage
    collection would drop them. A follower keeps every version it replays, so without this
    its snapshot grew with every write (15 MB per follower after 10 minutes of
    bench/micro.py on geo3, for 10,000 keys a shard)."""

    __slots__ = ("_store", "keys", "vid_limit", "visible")

    def __init__(self, store: VersionedStore, visible: dict[int, int] | None = None) -> None:
        self._store = store
        self.keys = store.all_keys()
        self.vid_limit = store.next_vid
        self.visible = visible

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self) -> Iterator[tuple[str, Chain]]:
        versions, limit, visible = self._store.versions, self.vid_limit, self.visible
        for key in self.keys:
            chain = [v for v in versions(key) if v.vid < limit and v.state != ROLLED_BACK]
            if visible is not None:
                for index in range(len(chain) - 1, 0, -1):
                    version = chain[index]
                    if version.state == CERTIFIED and version.vc.le_watermark(visible):
                        chain = chain[index:]
                        break
            yield key, [(v.value, v.deleted, v.vc, v.epoch, v.txn_id) for v in chain]


def version_chains(store: VersionedStore) -> list[tuple[str, Chain]]:
    """Every key's versions that are not rolled back, oldest first (a key may have none)."""
    return list(StoreSnapshot(store))


class _Transfer:
    """One transfer at its source: the bytes encoded so far, the rest still to encode."""

    __slots__ = ("asked_ns", "data", "rest")

    def __init__(self, rest: Iterator[bytes], now_ns: int) -> None:
        self.data = bytearray()
        self.rest: Iterator[bytes] | None = rest
        self.asked_ns = now_ns

    def encode_through(self, end: int) -> None:
        rest = self.rest
        while rest is not None and len(self.data) < end:
            step = next(rest, None)
            if step is None:
                self.rest = rest = None
            else:
                self.data += step


class StateServer:
    """The source's side: takes a state when a transfer's first piece is asked for, and
    encodes it as its pieces are asked for; keeps the latest ``TRANSFERS_KEPT`` transfers,
    and forgets one not asked for within ``idle_ns``."""

    def __init__(self, shard: int, piece_bytes: int, idle_ns: int) -> None:
        self.shard = shard
        self.piece_bytes = piece_bytes
        self.idle_ns = idle_ns
        self._served: dict[tuple[str, int], _Transfer] = {}
        self.started = 0

    def serve(
        self,
        request: StateRequest,
        capture: Callable[[], FollowerState] | None,
        now_ns: int,
    ) -> StatePiece:
        """One piece; ``capture`` (None: this replica has no state to give) takes the state."""
        key = (request.requester, request.req_id)
        transfer = self._served.get(key)
        if (
            transfer is None and request.offset == 0 and capture is not None
            and request.shard == self.shard
        ):
            transfer = _Transfer(encode_state_steps(capture()), now_ns)
            self.started += 1
            self._served[key] = transfer
            while len(self._served) > TRANSFERS_KEPT:
                del self._served[next(iter(self._served))]
        if transfer is None:
            return StatePiece(request.req_id, self.shard, request.offset, 0, b"")
        transfer.asked_ns = now_ns
        end = request.offset + min(request.length, self.piece_bytes)
        transfer.encode_through(end)
        data = transfer.data
        if request.offset > len(data):
            return StatePiece(request.req_id, self.shard, request.offset, 0, b"")
        more = transfer.rest is not None or end < len(data)
        return StatePiece(
            request.req_id, self.shard, request.offset, len(data),
            bytes(data[request.offset : end]), more,
        )

    def holding(self, now_ns: int) -> bool:
        """Whether a transfer still reads the store (its garbage must stay); forgets the
        transfers nobody asked for within ``idle_ns``."""
        for key, transfer in list(self._served.items()):
            if now_ns - transfer.asked_ns > self.idle_ns:
                del self._served[key]
        return any(transfer.rest is not None for transfer in self._served.values())


def encode_state(state: FollowerState) -> bytes:
    return b"".join(encode_state_steps(state))


def encode_state_steps(state: FollowerState) -> Iterator[bytes]:
    """The msgpack encoding of ``[STATE_TAG, shard, ..., chains, ..., recent, ...]`` (17
    fields), in steps: the head, ``ITEMS_PER_STEP`` keys' versions at a time, the middle,
    ``ITEMS_PER_STEP`` kept entries at a time, the end. The chains are read as the steps
    are taken (``StoreSnapshot``); everything else that can change at the source is packed
    now, and the kept entries (up to ``log_retained_slots``, never changed once chosen) are
    only listed now."""
    packer = msgpack.Packer(**PACK)
    pack = packer.pack
    fvw_applied = state.fvw_applied + 1  # -1 (none) travels as 0: integers are non-negative
    head: list[Any] = [
        STATE_TAG, state.shard, state.slot, state.epoch, fvw_applied,
        [state.promised.round, state.promised.leader],
        state.vw.to_wire(), state.epochs.ended + 1, state.epochs.valid_watermark,
        [[e, w] for e, w in sorted(state.epochs.finalized.items())],
        state.cluster_map.to_wire() if state.cluster_map is not None else None,
    ]
    middle: list[Any] = [
        [
            [epoch, [[txn, vc.to_wire(), keys] for txn, vc, keys in items]]
            for epoch, items in sorted(state.speculative.items())
        ],
        [[epoch, mark, vw.to_wire()] for epoch, mark, vw in state.held_visibility],
    ]
    recent = sorted(state.recent.items())
    first = b"".join([
        packer.pack_array_header(_STATE_FIELDS), *map(pack, head),
        packer.pack_array_header(len(state.chains)),
    ])
    second = b"".join([*map(pack, middle), packer.pack_array_header(len(recent))])
    last = b"".join(map(pack, [state.applied_slots, state.applied_records]))
    return _steps(first, state.chains, second, recent, last, pack)


def _steps(
    first: bytes,
    chains: Iterable[tuple[str, Chain]],
    second: bytes,
    recent: list[tuple[int, Entry]],
    last: bytes,
    pack: Callable[[Any], bytes],
) -> Iterator[bytes]:
    step: list[bytes] = [first]
    for key, chain in chains:
        step.append(pack([
            key,
            [[value, deleted, vc.to_wire(), epoch, txn] for value, deleted, vc, epoch, txn in chain],
        ]))
        if len(step) >= ITEMS_PER_STEP:
            yield b"".join(step)
            step = []
    step.append(second)
    for slot, entry in recent:
        step.append(pack([slot, entry_to_wire(entry)]))
        if len(step) >= ITEMS_PER_STEP:
            yield b"".join(step)
            step = []
    step.append(last)
    yield b"".join(step)


_FIELDS: Final = Fields("transferred state")
_bad = _FIELDS.bad
_int = _FIELDS.integer
_bool = _FIELDS.boolean
_str = _FIELDS.string
_list = _FIELDS.array


def _pairs(value: Any, what: str) -> list[list[Any]]:
    items = _list(value, what)
    for item in items:
        if type(item) is not list or len(item) != 2:
            raise _bad(f"{what}: each item is a pair")
    return items


def _ballot(value: Any) -> Ballot:
    raw = _list(value, "ballot")
    if len(raw) != 2:
        raise _bad("a ballot is [round, leader]")
    return Ballot(_int(raw[0], "round"), _str(raw[1], "leader"))


def _chain(value: Any) -> Chain:
    versions = []
    for raw in _list(value, "versions"):
        raw = _list(raw, "version")
        if len(raw) != 5:
            raise _bad("a version is [value, deleted, vc, epoch, txn_id]")
        versions.append((
            raw[0], _bool(raw[1], "deleted"), VectorClock.from_wire(raw[2]),
            _int(raw[3], "epoch"), _int(raw[4], "txn_id"),
        ))
    return versions


def _speculative(value: Any) -> list[Speculative]:
    items = []
    for raw in _list(value, "speculative"):
        raw = _list(raw, "speculative item")
        if len(raw) != 3:
            raise _bad("a speculative item is [txn_id, vc, keys]")
        keys = [_str(k, "key") for k in _list(raw[2], "keys")]
        items.append((_int(raw[0], "txn_id"), VectorClock.from_wire(raw[1]), keys))
    return items


def _held(value: Any) -> list[tuple[int, int, VectorClock]]:
    held = []
    for raw in _list(value, "held visibility"):
        raw = _list(raw, "held item")
        if len(raw) != 3:
            raise _bad("a held item is [epoch, watermark, vw]")
        held.append((_int(raw[0], "epoch"), _int(raw[1], "watermark"), VectorClock.from_wire(raw[2])))
    return held


def _epochs(ended: Any, valid_watermark: Any, finalized: Any) -> StreamEpochs:
    epochs = StreamEpochs()
    epochs.ended = _int(ended, "epochs ended") - 1
    epochs.valid_watermark = _int(valid_watermark, "valid watermark")
    epochs.finalized = {
        _int(e, "epoch"): _int(w, "watermark") for e, w in _pairs(finalized, "finalized")
    }
    return epochs


def _build(
    f: list[Any], chains: list[tuple[str, Chain]], recent: dict[int, Entry]
) -> FollowerState:
    return FollowerState(
        shard=_int(f[1], "shard"),
        slot=_int(f[2], "slot"),
        epoch=_int(f[3], "epoch"),
        fvw_applied=_int(f[4], "fvw_applied") - 1,
        promised=_ballot(f[5]),
        vw=VectorClock.from_wire(f[6]),
        epochs=_epochs(f[7], f[8], f[9]),
        cluster_map=None if f[10] is None else cluster_map_from_wire(f[10]),
        chains=chains,
        speculative={
            _int(epoch, "epoch"): _speculative(items)
            for epoch, items in _pairs(f[12], "speculative")
        },
        held_visibility=_held(f[13]),
        recent=recent,
        applied_slots=_int(f[15], "applied_slots"),
        applied_records=_int(f[16], "applied_records"),
    )


class StateDecoder:
    """The rejoiner's side: decodes a state as its pieces arrive (``feed``), key by key, so
    that the last piece does not stop the rejoiner for as long as decoding the whole state
    would (0.8 s for a 16 MB TPC-C shard); ``finish`` checks it is complete. Anything
    malformed is an ``InvalidRequest``, from ``feed`` or ``finish``. With ``into``, each
    key's versions go straight into that (fresh) store and the state's ``chains`` is empty;
    a transfer that fails half way leaves it half filled: start again with a new store."""

    def __init__(self, into: VersionedStore | None = None) -> None:
        self._into = into
        self._unpacker = msgpack.Unpacker(
            strict_map_key=False, use_list=True, max_buffer_size=STATE_BYTES_MAX, **UNPACK
        )
        self._arity: int | None = None
        self._fields: list[Any] = []
        self._items_left: int | None = None  # of the field sent item by item now
        self.chains: list[tuple[str, Chain]] = []
        self.recent: dict[int, Entry] = {}
        self.size = 0  # bytes fed

    def feed(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > STATE_BYTES_MAX:
            raise _bad(f"larger than {STATE_BYTES_MAX} bytes")
        self._unpacker.feed(data)
        try:
            self._advance()
        except InvalidRequest:
            raise
        except Exception as exc:  # msgpack raises many types on garbage; all mean the same
            raise _bad(f"not msgpack or not a state ({type(exc).__name__})") from None

    def _advance(self) -> None:
        unpacker, fields = self._unpacker, self._fields
        while len(fields) < _STATE_FIELDS:
            try:
                if self._arity is None:
                    self._arity = unpacker.read_array_header()
                    if self._arity != _STATE_FIELDS:
                        raise _bad(f"expected {_STATE_FIELDS} fields, got {self._arity}")
                elif len(fields) != _CHAINS_AT and len(fields) != _RECENT_AT:
                    fields.append(unpacker.unpack())
                    if len(fields) == 1 and fields[0] != STATE_TAG:
                        raise _bad(f"unknown tag {fields[0]!r}")
                elif self._items_left is None:
                    self._items_left = unpacker.read_array_header()
                elif self._items_left:
                    raw = unpacker.unpack()
                    if type(raw) is not list or len(raw) != 2:
                        raise _bad("chains and kept entries: each item is a pair")
                    if len(fields) == _RECENT_AT:
                        self.recent[_int(raw[0], "slot")] = entry_from_wire(raw[1])
                    else:
                        self._chain_item(_str(raw[0], "key"), _chain(raw[1]))
                    self._items_left -= 1
                else:
                    fields.append(None)  # decoded above
                    self._items_left = None
            except msgpack.OutOfData:
                return

    def _chain_item(self, key: str, chain: Chain) -> None:
        if self._into is None:
            self.chains.append((key, chain))
        else:
            for value, deleted, vc, epoch, txn_id in chain:
                self._into.install(key, value, deleted, vc, epoch, txn_id)

    def finish(self) -> FollowerState:
        if len(self._fields) < _STATE_FIELDS:
            raise _bad("truncated")
        try:
            self._unpacker.unpack()
        except msgpack.OutOfData:
            pass
        except Exception:
            raise _bad("trailing bytes") from None
        else:
            raise _bad("trailing bytes")
        try:
            return _build(self._fields, self.chains, self.recent)
        except InvalidRequest:
            raise
        except Exception as exc:  # a field of an unexpected shape deep inside
            raise _bad(type(exc).__name__) from None


def decode_state(data: bytes | bytearray | memoryview) -> FollowerState:
    """``encode_state``'s inverse; ``InvalidRequest`` for anything malformed."""
    decoder = StateDecoder()
    decoder.feed(bytes(data))
    return decoder.finish()
