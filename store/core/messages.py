"""Messages a shard leader sends and receives (DESIGN.md §3).

Plain slotted classes: the simulator hands them between nodes as objects, and
``store.core.codec`` turns them into bytes for the real transports. Every message between
leaders carries the transaction id; every reply from a participant carries the sender's
shard watermark (the piggybacking of DESIGN.md §4).

Shapes used below:
* a read item: ``(key, vid, value, deleted, vc, writer_txn_id)``; vid 0 means no version;
* a recorded scan: ``(lo, hi, limit, [(key, vid), ...])``;
* a write: ``(key, value, deleted)``.
"""

from __future__ import annotations

from typing import Any

from store.core.vclock import VectorClock

ReadItem = tuple[str, int, Any, bool, VectorClock, int]
RecordedScan = tuple[str, str, int, list[tuple[str, int]]]
Write = tuple[str, Any, bool]
ScanRange = tuple[str, str, int]


class Message:
    __slots__: tuple[str, ...] = ()

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and all(
            getattr(self, name) == getattr(other, name) for name in self.__slots__
        )

    __hash__ = None  # type: ignore[assignment]


# ---- client <-> coordinator ----------------------------------------------------------------


class Submit(Message):
    """A one-shot transaction: a procedure call, or ``procedure == ""`` and ``args == [ops]``."""

    __slots__ = ("args", "client_id", "procedure", "seq", "want_certified")

    def __init__(
        self, client_id: str, seq: int, procedure: str, args: list[Any], want_certified: bool
    ) -> None:
        self.client_id = client_id
        self.seq = seq
        self.procedure = procedure
        self.args = args
        self.want_certified = want_certified


class Outcome(Message):
    """The coordinator's answer. CERTIFIED may be followed by COMMITTED or ROLLED_BACK."""

    __slots__ = ("detail", "result", "seq", "status", "vc")

    def __init__(self, seq: int, status: int, result: Any, vc: VectorClock, detail: str) -> None:
        self.seq = seq
        self.status = status
        self.result = result
        self.vc = vc
        self.detail = detail


# ---- coordinator <-> participant -----------------------------------------------------------


class ReadRequest(Message):
    __slots__ = ("keys", "req_no", "scans", "txn_id")

    def __init__(self, txn_id: int, req_no: int, keys: list[str], scans: list[ScanRange]) -> None:
        self.txn_id = txn_id
        self.req_no = req_no
        self.keys = keys
        self.scans = scans


# A ReadReply with this req_no (a transaction's first batch is 1) serves nothing: the leader
# could not serve the read now (it has no lease: docs/recovery.md "Stale reads"). The
# coordinator ignores it as it ignores a late reply, and its retry asks again.
READ_REFUSED = 0


class ReadReply(Message):
    __slots__ = ("items", "req_no", "scans", "shard", "txn_id", "watermark")

    def __init__(
        self,
        txn_id: int,
        req_no: int,
        shard: int,
        items: list[ReadItem],
        scans: list[list[ReadItem]],
        watermark: int,
    ) -> None:
        self.txn_id = txn_id
        self.req_no = req_no
        self.shard = shard
        self.items = items
        self.scans = scans
        self.watermark = watermark


class LockRequest(Message):
    """``epoch``: the transaction's; a participant in another epoch refuses it."""

    __slots__ = ("epoch", "keys", "txn_id")

    def __init__(self, txn_id: int, keys: list[str], epoch: int = 0) -> None:
        self.txn_id = txn_id
        self.keys = keys
        self.epoch = epoch


class LockReply(Message):
    """``deps``: the clocks of what the writes will overwrite and of the transactions that
    validated reads of those keys (write-write and read-write dependencies)."""

    __slots__ = ("counter", "deps", "ok", "shard", "txn_id", "watermark")

    def __init__(
        self, txn_id: int, shard: int, ok: bool, counter: int, deps: VectorClock, watermark: int
    ) -> None:
        self.txn_id = txn_id
        self.shard = shard
        self.ok = ok
        self.counter = counter
        self.deps = deps
        self.watermark = watermark


class ValidateRequest(Message):
    """``vc``: the transaction's clock, stamped on the keys it read (see participant.py);
    ``epoch``: the transaction's (a participant in another epoch refuses it)."""

    __slots__ = ("epoch", "reads", "scans", "txn_id", "vc")

    def __init__(
        self,
        txn_id: int,
        reads: list[tuple[str, int]],
        scans: list[RecordedScan],
        vc: VectorClock,
        epoch: int = 0,
    ) -> None:
        self.txn_id = txn_id
        self.reads = reads
        self.scans = scans
        self.vc = vc
        self.epoch = epoch


class ValidateReply(Message):
    __slots__ = ("ok", "shard", "txn_id", "watermark")

    def __init__(self, txn_id: int, shard: int, ok: bool, watermark: int) -> None:
        self.txn_id = txn_id
        self.shard = shard
        self.ok = ok
        self.watermark = watermark


class InstallRequest(Message):
    """``durable``: the clock entries the coordinator dropped from ``vc`` because they were
    at or below its vector watermark; the participant learns them as watermarks."""

    __slots__ = ("durable", "epoch", "txn_id", "vc", "writes")

    def __init__(
        self,
        txn_id: int,
        writes: list[Write],
        vc: VectorClock,
        epoch: int,
        durable: VectorClock,
    ) -> None:
        self.txn_id = txn_id
        self.writes = writes
        self.vc = vc
        self.epoch = epoch
        self.durable = durable


class InstallReply(Message):
    __slots__ = ("shard", "txn_id", "watermark")

    def __init__(self, txn_id: int, shard: int, watermark: int) -> None:
        self.txn_id = txn_id
        self.shard = shard
        self.watermark = watermark


class AbortRequest(Message):
    __slots__ = ("txn_id",)

    def __init__(self, txn_id: int) -> None:
        self.txn_id = txn_id


class AbortReply(Message):
    __slots__ = ("shard", "txn_id")

    def __init__(self, txn_id: int, shard: int) -> None:
        self.txn_id = txn_id
        self.shard = shard


class SoloRequest(Message):
    """Lock, validate and install in one step at the only participant shard."""

    __slots__ = ("epoch", "read_vc", "reads", "scans", "txn_id", "writes")

    def __init__(
        self,
        txn_id: int,
        reads: list[tuple[str, int]],
        scans: list[RecordedScan],
        writes: list[Write],
        read_vc: VectorClock,
        epoch: int,
    ) -> None:
        self.txn_id = txn_id
        self.reads = reads
        self.scans = scans
        self.writes = writes
        self.read_vc = read_vc
        self.epoch = epoch


class SoloReply(Message):
    """``durable``: clock entries dropped from ``vc`` as durable (see InstallRequest)."""

    __slots__ = ("durable", "ok", "shard", "txn_id", "vc", "watermark")

    def __init__(
        self,
        txn_id: int,
        shard: int,
        ok: bool,
        vc: VectorClock,
        watermark: int,
        durable: VectorClock,
    ) -> None:
        self.txn_id = txn_id
        self.shard = shard
        self.ok = ok
        self.vc = vc
        self.watermark = watermark
        self.durable = durable


class Gossip(Message):
    """Periodic watermark exchange between shard leaders: ``{shard: watermark}``."""

    __slots__ = ("shard", "watermarks")

    def __init__(self, shard: int, watermarks: dict[int, int]) -> None:
        self.shard = shard
        self.watermarks = watermarks


# ---- how peers exchange them -----------------------------------------------------------------

# A peer request is answered by exactly one reply, which the replica produces inside the very
# ``handle`` call that received the request (every participant step is synchronous). Hosts
# rely on that rule: the reply travels back as the RPC response of the request
# (``store/node/host.py`` checks the rule and stops the process if it is ever broken). A
# one-way message is answered by nothing.
PEER_REQUESTS: tuple[type[Message], ...] = (
    ReadRequest, LockRequest, ValidateRequest, InstallRequest, AbortRequest, SoloRequest,
)
PEER_ONE_WAY: tuple[type[Message], ...] = (Gossip,)
PEER_REPLIES: tuple[type[Message], ...] = (
    ReadReply, LockReply, ValidateReply, InstallReply, AbortReply, SoloReply,
)
