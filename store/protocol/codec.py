"""Wire encoding of the protocol's messages (``store.protocol.messages``; msgpack), with
strict validation on decode.

Every message is a msgpack array ``[tag, field, ...]``. Decoding checks the type of every
field before a message object is built, so a replica's handlers only ever see well-formed
messages: anything else raises ``InvalidRequest`` (the server answers with a typed error and
changes nothing; DESIGN.md §1 "bad input").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack

from store.core.values import PACK
from store.core.vclock import VectorClock
from store.protocol.cluster_map import cluster_map_from_wire
from store.protocol.messages import (
    PREPARE_STATUSES,
    ROLES,
    AbortReply,
    AbortRequest,
    AwaitOutcomes,
    ConfigReply,
    GetConfig,
    Gossip,
    Heartbeat,
    InstallReply,
    InstallRequest,
    LockReply,
    LockRequest,
    Message,
    Outcome,
    Outcomes,
    PrepareReply,
    PrepareRequest,
    ReadItem,
    ReadReply,
    ReadRequest,
    RecordedScan,
    SnapshotRead,
    SnapshotReply,
    SoloReply,
    SoloRequest,
    StatePiece,
    StateRequest,
    Submit,
    ValidateReply,
    ValidateRequest,
    Write,
)
from store.protocol.wirecheck import Fields, decode_tagged

_packb = msgpack.Packer(autoreset=True, **PACK).pack


def _vc(clock: VectorClock) -> list[int]:
    return clock.to_wire()


def _items(items: list[ReadItem]) -> list[list[Any]]:
    return [[k, vid, value, deleted, vc.to_wire(), writer] for k, vid, value, deleted, vc, writer in items]


def _outcome(m: Outcome) -> list[Any]:
    return [2, m.seq, m.status, m.result, _vc(m.vc), m.detail, m.waited_ns]


_ENCODERS: dict[type, Callable[[Any], list[Any]]] = {
    Submit: lambda m: [1, m.client_id, m.seq, m.procedure, m.args, m.want_certified],
    Outcome: _outcome,
    ReadRequest: lambda m: [3, m.txn_id, m.req_no, m.keys, [list(s) for s in m.scans]],
    ReadReply: lambda m: [
        4, m.txn_id, m.req_no, m.shard, _items(m.items), [_items(s) for s in m.scans], m.watermark,
    ],
    LockRequest: lambda m: [5, m.txn_id, m.keys, m.epoch],
    LockReply: lambda m: [6, m.txn_id, m.shard, m.ok, m.counter, _vc(m.deps), m.watermark],
    ValidateRequest: lambda m: [
        7, m.txn_id, [list(r) for r in m.reads],
        [[lo, hi, limit, [list(p) for p in seen]] for lo, hi, limit, seen in m.scans],
        _vc(m.vc), m.epoch,
    ],
    ValidateReply: lambda m: [8, m.txn_id, m.shard, m.ok, m.watermark],
    InstallRequest: lambda m: [
        9, m.txn_id, [list(w) for w in m.writes], _vc(m.vc), m.epoch, _vc(m.durable), m.hurry,
    ],
    InstallReply: lambda m: [10, m.txn_id, m.shard, m.watermark],
    AbortRequest: lambda m: [11, m.txn_id],
    AbortReply: lambda m: [12, m.txn_id, m.shard],
    SoloRequest: lambda m: [
        13, m.txn_id, [list(r) for r in m.reads],
        [[lo, hi, limit, [list(p) for p in seen]] for lo, hi, limit, seen in m.scans],
        [list(w) for w in m.writes], _vc(m.read_vc), m.epoch, m.hurry,
    ],
    SoloReply: lambda m: [14, m.txn_id, m.shard, m.ok, _vc(m.vc), m.watermark, _vc(m.durable)],
    Gossip: lambda m: [15, m.shard, [[s, w] for s, w in m.watermarks.items()], m.claim, m.epoch],
    SnapshotRead: lambda m: [16, m.req_id, m.keys, [list(s) for s in m.scans]],
    SnapshotReply: lambda m: [
        17, m.req_id, m.shard, m.values, [[list(p) for p in scan] for scan in m.scans],
        _vc(m.vw), m.applied_slots,
    ],
    Heartbeat: lambda m: [
        18, m.address, m.shard, m.role, m.epoch, m.delivered, m.fvw_epoch + 1,
        [[e, w] for e, w in m.finalized],
    ],
    GetConfig: lambda m: [19, m.req_id],
    ConfigReply: lambda m: [20, m.req_id, m.cluster_map.to_wire(), m.cm_leader],
    StateRequest: lambda m: [21, m.requester, m.req_id, m.shard, m.offset, m.length],
    StatePiece: lambda m: [22, m.req_id, m.shard, m.offset, m.total, m.data, m.more],
    PrepareRequest: lambda m: [23, m.txn_id, m.reads, m.locks, _vc(m.base), m.epoch],
    AwaitOutcomes: lambda m: [25, m.client_id, m.seqs],
    Outcomes: lambda m: [26, [_outcome(o) for o in m.outcomes], m.unknown],
    PrepareReply: lambda m: [
        24, m.txn_id, m.shard, m.status, m.counter, _items(m.items), _vc(m.deps), m.watermark,
    ],
}


def encode(message: Message) -> bytes:
    encoder = _ENCODERS.get(type(message))
    if encoder is None:
        raise TypeError(f"no wire encoding for {type(message).__name__}")
    packed: bytes = _packb(encoder(message))
    return packed


# ---- decoding ------------------------------------------------------------------------------


_FIELDS = Fields("message")
_bad = _FIELDS.bad
_int = _FIELDS.integer
_bool = _FIELDS.boolean
_str = _FIELDS.string


def _limit(value: Any) -> int:
    """A scan's limit: how many keys from the range's start, or (negative) from its end."""
    if type(value) is not int or value == 0:
        raise _bad("limit must be a non-zero integer (negative: from the range's end)")
    return value
_list = _FIELDS.array


def _strs(value: Any, what: str) -> list[str]:
    items = _list(value, what)
    for item in items:
        _str(item, what)
    return items


def _ints(value: Any, what: str) -> list[int]:
    items = _list(value, what)
    for item in items:
        _int(item, what)
    return items


# The most transactions one AwaitOutcomes may name (a client asks for at most its
# ``in_flight_max`` at once; the bound keeps a hostile request from costing the server more).
AWAIT_SEQS_MAX = 65_536


def _await_seqs(value: Any) -> list[int]:
    seqs = _ints(value, "seqs")
    if len(seqs) > AWAIT_SEQS_MAX:
        raise _bad(f"at most {AWAIT_SEQS_MAX} transactions per AwaitOutcomes")
    return seqs


def _decode_outcome(f: list[Any]) -> Outcome:
    return Outcome(_int(f[1], "seq"), _status(f[2]), f[3], _clock(f[4]), _str(f[5], "detail"),
                   _int(f[6], "waited_ns"))


def _outcomes(value: Any) -> list[Outcome]:
    """The outcomes an ``Outcomes`` carries, each in its own message's form (tag 2)."""
    outcomes = []
    for raw in _list(value, "outcomes"):
        raw = _list(raw, "outcome")
        if len(raw) != 7 or raw[0] != 2:
            raise _bad("an outcome is [2, seq, status, result, vc, detail, waited_ns]")
        outcomes.append(_decode_outcome(raw))
    return outcomes


def _clock(value: Any) -> VectorClock:
    return VectorClock.from_wire(value)


def _read_items(value: Any) -> list[ReadItem]:
    items: list[ReadItem] = []
    for raw in _list(value, "read items"):
        raw = _list(raw, "read item")
        if len(raw) != 6:
            raise _bad("read item has 6 fields")
        items.append(
            (
                _str(raw[0], "key"),
                _int(raw[1], "vid"),
                raw[2],
                _bool(raw[3], "deleted"),
                _clock(raw[4]),
                _int(raw[5], "writer"),
            )
        )
    return items


def _reads(value: Any) -> list[tuple[str, int]]:
    reads = []
    for raw in _list(value, "reads"):
        raw = _list(raw, "read")
        if len(raw) != 2:
            raise _bad("a read is [key, vid]")
        reads.append((_str(raw[0], "key"), _int(raw[1], "vid")))
    return reads


def _scan_ranges(value: Any) -> list[tuple[str, str, int]]:
    ranges = []
    for raw in _list(value, "scans"):
        raw = _list(raw, "scan")
        if len(raw) != 3:
            raise _bad("a scan is [lo, hi, limit]")
        ranges.append((_str(raw[0], "lo"), _str(raw[1], "hi"), _limit(raw[2])))
    return ranges


def _recorded_scans(value: Any) -> list[RecordedScan]:
    scans: list[RecordedScan] = []
    for raw in _list(value, "scans"):
        raw = _list(raw, "scan")
        if len(raw) != 4:
            raise _bad("a recorded scan is [lo, hi, limit, seen]")
        scans.append(
            (_str(raw[0], "lo"), _str(raw[1], "hi"), _limit(raw[2]), _reads(raw[3]))
        )
    return scans


def _writes(value: Any) -> list[Write]:
    writes: list[Write] = []
    for raw in _list(value, "writes"):
        raw = _list(raw, "write")
        if len(raw) != 3:
            raise _bad("a write is [key, value, deleted]")
        writes.append((_str(raw[0], "key"), raw[1], _bool(raw[2], "deleted")))
    return writes


def _watermarks(value: Any) -> dict[int, int]:
    marks = {}
    for raw in _list(value, "watermarks"):
        raw = _list(raw, "watermark")
        if len(raw) != 2:
            raise _bad("a watermark is [shard, counter]")
        marks[_int(raw[0], "shard")] = _int(raw[1], "watermark")
    return marks


def _bytes(value: Any, what: str) -> bytes:
    if type(value) is not bytes:
        raise _bad(f"{what} must be bytes")
    return value


def _role(value: Any) -> int:
    role = _int(value, "role")
    if role not in ROLES:
        raise _bad(f"unknown role {role}")
    return role


def _status(value: Any) -> int:
    return _int(value, "status")


def _prepare_status(value: Any) -> int:
    status = _int(value, "status")
    if status not in PREPARE_STATUSES:
        raise _bad(f"unknown prepare status {status}")
    return status


_DECODERS: dict[int, tuple[int, Callable[[list[Any]], Message]]] = {
    1: (6, lambda f: Submit(_str(f[1], "client_id"), _int(f[2], "seq"), _str(f[3], "procedure"),
                            _list(f[4], "args"), _bool(f[5], "want_certified"))),
    2: (7, _decode_outcome),
    3: (5, lambda f: ReadRequest(_int(f[1], "txn_id"), _int(f[2], "req_no"),
                                 _strs(f[3], "keys"), _scan_ranges(f[4]))),
    4: (7, lambda f: ReadReply(_int(f[1], "txn_id"), _int(f[2], "req_no"), _int(f[3], "shard"),
                               _read_items(f[4]), [_read_items(s) for s in _list(f[5], "scans")],
                               _int(f[6], "watermark"))),
    5: (4, lambda f: LockRequest(_int(f[1], "txn_id"), _strs(f[2], "keys"), _int(f[3], "epoch"))),
    6: (7, lambda f: LockReply(_int(f[1], "txn_id"), _int(f[2], "shard"), _bool(f[3], "ok"),
                               _int(f[4], "counter"), _clock(f[5]), _int(f[6], "watermark"))),
    7: (6, lambda f: ValidateRequest(_int(f[1], "txn_id"), _reads(f[2]), _recorded_scans(f[3]),
                                     _clock(f[4]), _int(f[5], "epoch"))),
    8: (5, lambda f: ValidateReply(_int(f[1], "txn_id"), _int(f[2], "shard"), _bool(f[3], "ok"),
                                   _int(f[4], "watermark"))),
    9: (7, lambda f: InstallRequest(_int(f[1], "txn_id"), _writes(f[2]), _clock(f[3]),
                                    _int(f[4], "epoch"), _clock(f[5]), _bool(f[6], "hurry"))),
    10: (4, lambda f: InstallReply(_int(f[1], "txn_id"), _int(f[2], "shard"),
                                   _int(f[3], "watermark"))),
    11: (2, lambda f: AbortRequest(_int(f[1], "txn_id"))),
    12: (3, lambda f: AbortReply(_int(f[1], "txn_id"), _int(f[2], "shard"))),
    13: (8, lambda f: SoloRequest(_int(f[1], "txn_id"), _reads(f[2]), _recorded_scans(f[3]),
                                  _writes(f[4]), _clock(f[5]), _int(f[6], "epoch"),
                                  _bool(f[7], "hurry"))),
    14: (7, lambda f: SoloReply(_int(f[1], "txn_id"), _int(f[2], "shard"), _bool(f[3], "ok"),
                                _clock(f[4]), _int(f[5], "watermark"), _clock(f[6]))),
    15: (5, lambda f: Gossip(_int(f[1], "shard"), _watermarks(f[2]), _int(f[3], "claim"),
                             _int(f[4], "epoch"))),
    16: (4, lambda f: SnapshotRead(_int(f[1], "req_id"), _strs(f[2], "keys"), _scan_ranges(f[3]))),
    18: (8, lambda f: Heartbeat(_str(f[1], "address"), _int(f[2], "shard"), _role(f[3]),
                                _int(f[4], "epoch"), _int(f[5], "delivered"),
                                _int(f[6], "fvw_epoch") - 1, _epoch_marks(f[7]))),
    19: (2, lambda f: GetConfig(_int(f[1], "req_id"))),
    20: (4, lambda f: ConfigReply(_int(f[1], "req_id"), cluster_map_from_wire(f[2]),
                                  _str(f[3], "cm_leader"))),
    21: (6, lambda f: StateRequest(_str(f[1], "requester"), _int(f[2], "req_id"),
                                   _int(f[3], "shard"), _int(f[4], "offset"),
                                   _int(f[5], "length"))),
    22: (7, lambda f: StatePiece(_int(f[1], "req_id"), _int(f[2], "shard"), _int(f[3], "offset"),
                                 _int(f[4], "total"), _bytes(f[5], "data"), _bool(f[6], "more"))),
    23: (6, lambda f: PrepareRequest(_int(f[1], "txn_id"), _strs(f[2], "reads"),
                                    _strs(f[3], "locks"), _clock(f[4]), _int(f[5], "epoch"))),
    24: (8, lambda f: PrepareReply(_int(f[1], "txn_id"), _int(f[2], "shard"),
                                  _prepare_status(f[3]), _int(f[4], "counter"),
                                  _read_items(f[5]), _clock(f[6]), _int(f[7], "watermark"))),
    25: (3, lambda f: AwaitOutcomes(_str(f[1], "client_id"), _await_seqs(f[2]))),
    26: (3, lambda f: Outcomes(_outcomes(f[1]), _ints(f[2], "unknown"))),
    17: (7, lambda f: SnapshotReply(_int(f[1], "req_id"), _int(f[2], "shard"),
                                    _list(f[3], "values"), _pairs_lists(f[4]), _clock(f[5]),
                                    _int(f[6], "applied_slots"))),
}


def _epoch_marks(value: Any) -> list[tuple[int, int]]:
    return sorted(_watermarks(value).items())


def _pairs_lists(value: Any) -> list[list[tuple[str, Any]]]:
    scans = []
    for scan in _list(value, "scans"):
        pairs = []
        for pair in _list(scan, "scan"):
            pair = _list(pair, "pair")
            if len(pair) != 2:
                raise _bad("a scanned pair is [key, value]")
            pairs.append((_str(pair[0], "key"), pair[1]))
        scans.append(pairs)
    return scans


def decode(data: bytes | bytearray | memoryview, max_bytes: int = 64 << 20) -> Message:
    """Decodes one message; ``InvalidRequest`` for anything malformed (never another error)."""
    return decode_tagged(data, _DECODERS, _FIELDS, max_bytes)


# ---- batches (wire.PEER_MANY) ----------------------------------------------------------------

# The most payloads one batch may carry; a batch is also bounded by the RPC core's message
# size. A leader sends what one ready() makes for one peer.
BATCH_ITEMS_MAX = 4096
_BATCH = Fields("batch")


def encode_batch(payloads: list[bytes]) -> bytes:
    """Several encoded messages (or answers) as one payload: a msgpack array of them."""
    packed: bytes = _packb(payloads)
    return packed


def decode_batch(data: bytes | bytearray | memoryview, count: int | None = None) -> list[bytes]:
    """The payloads of a batch, each still to be decoded on its own; ``count``: how many an
    answer must hold (one per item asked). ``InvalidRequest`` for anything else."""
    try:
        items = msgpack.unpackb(data, use_list=True, raw=False)
    except Exception as exc:  # msgpack raises many types on garbage; all mean the same
        raise _BATCH.bad(f"not msgpack ({type(exc).__name__})") from None
    if type(items) is not list or not 0 < len(items) <= BATCH_ITEMS_MAX:
        raise _BATCH.bad(f"expected a list of 1 to {BATCH_ITEMS_MAX} payloads")
    if count is not None and len(items) != count:
        raise _BATCH.bad(f"{len(items)} answers for {count} requests")
    for item in items:
        if type(item) is not bytes:
            raise _BATCH.bad("each item must be bytes")
    return items
