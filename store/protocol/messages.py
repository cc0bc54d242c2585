"""Every message Meridian's servers and its SDK exchange, except Paxos's own
(``store.core.paxos.messages``).

Plain slotted classes: the simulator hands them between nodes as objects, and
``store.protocol.codec`` turns them into bytes for the real transports. The families:

* client <-> coordinator (DESIGN.md §3): ``Submit``, ``Outcome``; ``AwaitOutcomes`` and
  ``Outcomes``, a client's transactions answered CERTIFIED waiting for their final outcomes
  together (one request for many, not one per transaction);
* coordinator <-> participant (DESIGN.md §3): the certification rounds. Every message
  between leaders carries the transaction id; every reply from a participant carries the
  sender's shard watermark (the piggybacking of DESIGN.md §4); ``Gossip`` between leaders;
* follower snapshot reads (DESIGN.md §4, ``store.core.follower``): ``SnapshotRead``,
  ``SnapshotReply``;
* the configuration manager (DESIGN.md §5, ``store.core.cm``): ``Heartbeat``,
  ``GetConfig``, ``ConfigReply`` (which carries a ``ClusterMap``);
* state transfer to a restarted replica (docs/recovery.md "Rejoining",
  ``store.core.transfer``): ``StateRequest``, ``StatePiece`` (opaque bytes of the state's
  encoding, which only ``store.core.transfer`` reads).

Shapes used below:
* a read item: ``(key, vid, value, deleted, vc, writer_txn_id)``; vid 0 means no version;
* a scan: ``(lo, hi, limit)``, the first ``limit`` keys of ``[lo, hi)`` or, with a negative
  limit, the last ``-limit`` keys, highest first;
* a recorded scan: ``(lo, hi, limit, [(key, vid), ...])``;
* a write: ``(key, value, deleted)``.
"""

from __future__ import annotations

from typing import Any, Final

from store.core.vclock import VectorClock
from store.protocol.cluster_map import ClusterMap

ReadItem = tuple[str, int, Any, bool, VectorClock, int]
RecordedScan = tuple[str, str, int, list[tuple[str, int]]]
Write = tuple[str, Any, bool]
ScanRange = tuple[str, str, int]


class Message:
    __slots__: tuple[str, ...] = ()

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in field_names(self))
        return f"{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and all(
            getattr(self, name) == getattr(other, name) for name in field_names(self)
        )

    __hash__ = None  # type: ignore[assignment]


def field_names(message: object) -> tuple[str, ...]:
    """A message's fields: its class's ``__slots__`` when run from source; compiled (mypyc,
    docs/performance.md), a class keeps none, and mypyc's ``__mypyc_attrs__`` names them."""
    cls = type(message)
    names: tuple[str, ...] | None = getattr(cls, "__slots__", None)
    if names is None:
        names = tuple(name for name in getattr(cls, "__mypyc_attrs__", ()) if not name.startswith("__"))
    return names


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
    """The coordinator's answer. CERTIFIED may be followed by COMMITTED or ROLLED_BACK.

    ``waited_ns``: in a COMMITTED answer, how long the transaction waited at the coordinator
    between its certification and its commit (0 when committed at once), so that a client
    that asked for the committed answer only (one request) still learns when it was
    certified."""

    __slots__ = ("detail", "result", "seq", "status", "vc", "waited_ns")

    def __init__(
        self, seq: int, status: int, result: Any, vc: VectorClock, detail: str,
        waited_ns: int = 0,
    ) -> None:
        self.seq = seq
        self.status = status
        self.result = result
        self.vc = vc
        self.detail = detail
        self.waited_ns = waited_ns


class AwaitOutcomes(Message):
    """A client's transactions ``seqs`` (answered CERTIFIED by this coordinator) whose final
    outcomes it waits for. Answered (``Outcomes``) once at least one of them has its final
    outcome, with every one that has it then; at once if one already has it, or if the
    coordinator does not know one of them (the client then asks with the ``Submit``)."""

    __slots__ = ("client_id", "seqs")

    def __init__(self, client_id: str, seqs: list[int]) -> None:
        self.client_id = client_id
        self.seqs = seqs


class Outcomes(Message):
    """The answer to ``AwaitOutcomes``: final outcomes (never CERTIFIED), and the asked-for
    transactions this coordinator does not know (``unknown``: not run here, or run so long
    ago that its outcome is forgotten, or this process is no coordinator)."""

    __slots__ = ("outcomes", "unknown")

    def __init__(self, outcomes: list[Outcome], unknown: list[int]) -> None:
        self.outcomes = outcomes
        self.unknown = unknown


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
READ_REFUSED: Final = 0


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
    at or below its vector watermark; the participant learns them as watermarks. ``hurry``:
    the transaction's client waits for its commit (not for its certification), so the
    participant's stream closes the batch holding these writes on the next tick of the
    shorter delay (StreamLeader.hurry), as the coordinator's own does."""

    __slots__ = ("durable", "epoch", "hurry", "txn_id", "vc", "writes")

    def __init__(
        self,
        txn_id: int,
        writes: list[Write],
        vc: VectorClock,
        epoch: int,
        durable: VectorClock,
        hurry: bool,
    ) -> None:
        self.txn_id = txn_id
        self.writes = writes
        self.vc = vc
        self.epoch = epoch
        self.durable = durable
        self.hurry = hurry


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
    """Lock, validate and install in one step at the only participant shard. ``hurry``: as
    InstallRequest's (the client waits for the commit of these writes)."""

    __slots__ = ("epoch", "hurry", "read_vc", "reads", "scans", "txn_id", "writes")

    def __init__(
        self,
        txn_id: int,
        reads: list[tuple[str, int]],
        scans: list[RecordedScan],
        writes: list[Write],
        read_vc: VectorClock,
        epoch: int,
        hurry: bool,
    ) -> None:
        self.txn_id = txn_id
        self.reads = reads
        self.scans = scans
        self.writes = writes
        self.read_vc = read_vc
        self.epoch = epoch
        self.hurry = hurry


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


class PrepareRequest(Message):
    """The one round of a two-shard operation list (``store.core.coordinator``, "the pair
    path"): lock ``locks``, read ``reads`` (and check that no key read is locked by another
    transaction), draw a counter if anything is locked, and vote yes, in one step.
    ``base``: the coordinator's part of the transaction's clock (its shard's reads, the
    dependencies of its locks and its counter), so that the participant knows the whole
    clock in that step and can stamp the keys it only reads; ``epoch``: the transaction's."""

    __slots__ = ("base", "epoch", "locks", "reads", "txn_id")

    def __init__(
        self, txn_id: int, reads: list[str], locks: list[str], base: VectorClock, epoch: int
    ) -> None:
        self.txn_id = txn_id
        self.reads = reads
        self.locks = locks
        self.base = base
        self.epoch = epoch


# PrepareReply.status: the leader could not serve the reads now (no lease: the coordinator's
# retry asks again, as for READ_REFUSED); prepared (voted yes); refused (a conflict, another
# epoch, versions in doubt): nothing is held.
PREPARE_REFUSED: Final = 0
PREPARE_OK: Final = 1
PREPARE_CONFLICT: Final = 2
PREPARE_STATUSES: Final = (PREPARE_REFUSED, PREPARE_OK, PREPARE_CONFLICT)


class PrepareReply(Message):
    """``items``: what ``reads`` found; ``counter``: drawn (0 if nothing was locked);
    ``deps``: the clocks the writes must dominate (as ``LockReply.deps``)."""

    __slots__ = ("counter", "deps", "items", "shard", "status", "txn_id", "watermark")

    def __init__(
        self, txn_id: int, shard: int, status: int, counter: int, items: list[ReadItem],
        deps: VectorClock, watermark: int,
    ) -> None:
        self.txn_id = txn_id
        self.shard = shard
        self.status = status
        self.counter = counter
        self.items = items
        self.deps = deps
        self.watermark = watermark


class Gossip(Message):
    """Periodic watermark exchange between shard leaders: ``{shard: watermark}``, what the
    sender knows of every shard's watermark (keyed by shard, as a vector clock is) in its
    ``epoch``. With several workers per shard ``shard`` is the sender's unit and ``claim``
    its own claim (its fellows take the largest of their claims as a counter floor); 0 with
    one worker, where the shard's watermark is the claim."""

    __slots__ = ("claim", "epoch", "shard", "watermarks")

    def __init__(
        self, shard: int, watermarks: dict[int, int], claim: int = 0, epoch: int = 0
    ) -> None:
        self.shard = shard
        self.watermarks = watermarks
        self.claim = claim
        self.epoch = epoch


# ---- follower snapshot reads ---------------------------------------------------------------


class SnapshotRead(Message):
    """A read-only snapshot of keys (and ranges) of one shard, served by a follower."""

    __slots__ = ("keys", "req_id", "scans")

    def __init__(self, req_id: int, keys: list[str], scans: list[tuple[str, str, int]]) -> None:
        self.req_id = req_id
        self.keys = keys
        self.scans = scans


class SnapshotReply(Message):
    """``values[i]`` for ``keys[i]`` (None: absent); ``scans[j]`` the pairs of range j;
    ``vw``: the vector watermark the snapshot is at; ``applied_slots``: replay progress."""

    __slots__ = ("applied_slots", "req_id", "scans", "shard", "values", "vw")

    def __init__(
        self,
        req_id: int,
        shard: int,
        values: list[Any],
        scans: list[list[tuple[str, Any]]],
        vw: VectorClock,
        applied_slots: int,
    ) -> None:
        self.req_id = req_id
        self.shard = shard
        self.values = values
        self.scans = scans
        self.vw = vw
        self.applied_slots = applied_slots


# ---- the configuration manager -------------------------------------------------------------

# A replica's role, in its heartbeats.
LEADER: Final = 0
FOLLOWER: Final = 1
# A restarted replica that has not yet copied its state (docs/recovery.md "Rejoining"): it
# counts neither as its shard's live leader nor as a candidate, and is sent the map.
REJOINING: Final = 2
ROLES: Final = (LEADER, FOLLOWER, REJOINING)


class Heartbeat(Message):
    """A replica to every CM member: alive, where it is, what it knows.

    ``role``: LEADER, FOLLOWER or REJOINING; ``delivered``: slots of its shard's stream it has applied
    (a leader: chosen); ``fvw_epoch``: the latest epoch whose FVW it has applied;
    ``finalized``: ``[[epoch, watermark], ...]`` ended on its stream (leaders)."""

    __slots__ = ("address", "delivered", "epoch", "finalized", "fvw_epoch", "role", "shard")

    def __init__(
        self, address: str, shard: int, role: int, epoch: int, delivered: int, fvw_epoch: int,
        finalized: list[tuple[int, int]],
    ) -> None:
        self.address = address
        self.shard = shard
        self.role = role
        self.epoch = epoch
        self.delivered = delivered
        self.fvw_epoch = fvw_epoch
        self.finalized = finalized


class GetConfig(Message):
    """Asks a CM member for the cluster map (answered with ``ConfigReply``)."""

    __slots__ = ("req_id",)

    def __init__(self, req_id: int) -> None:
        self.req_id = req_id


class ConfigReply(Message):
    """The cluster map, pushed by the CM leader or answering ``GetConfig`` (``req_id``; 0
    when pushed). ``cm_leader``: the member that believes it leads, if any."""

    __slots__ = ("cluster_map", "cm_leader", "req_id")

    def __init__(self, req_id: int, cluster_map: ClusterMap, cm_leader: str) -> None:
        self.req_id = req_id
        self.cluster_map = cluster_map
        self.cm_leader = cm_leader


# ---- state transfer ------------------------------------------------------------------------


class StateRequest(Message):
    """The replica at ``requester`` asks a follower for ``length`` bytes from ``offset`` of
    its state for transfer ``req_id`` (offset 0 with a new ``req_id`` fixes a new state)."""

    __slots__ = ("length", "offset", "req_id", "requester", "shard")

    def __init__(self, requester: str, req_id: int, shard: int, offset: int, length: int) -> None:
        self.requester = requester
        self.req_id = req_id
        self.shard = shard
        self.offset = offset
        self.length = length


class StatePiece(Message):
    """``data`` = bytes ``[offset, offset + len(data))`` of a state of which the source has
    encoded ``total`` bytes so far; ``more``: bytes follow beyond ``total`` (the source is
    still encoding). ``total`` 0: refused (the source has no state to give, or has dropped
    this transfer)."""

    __slots__ = ("data", "more", "offset", "req_id", "shard", "total")

    def __init__(
        self, req_id: int, shard: int, offset: int, total: int, data: bytes, more: bool = False
    ) -> None:
        self.req_id = req_id
        self.shard = shard
        self.offset = offset
        self.total = total
        self.data = data
        self.more = more


# ---- how peers exchange them -----------------------------------------------------------------

# A peer request is answered by exactly one reply, which the replica produces inside the very
# ``handle`` call that received the request (every participant step is synchronous). Hosts
# rely on that rule: the reply travels back as the RPC response of the request
# (``store/node/host.py`` checks the rule and stops the process if it is ever broken). A
# one-way message is answered by nothing.
PEER_REQUESTS: Final[tuple[type[Message], ...]] = (
    ReadRequest, LockRequest, ValidateRequest, InstallRequest, AbortRequest, SoloRequest,
    PrepareRequest,
)
PEER_ONE_WAY: Final[tuple[type[Message], ...]] = (Gossip,)
PEER_REPLIES: Final[tuple[type[Message], ...]] = (
    ReadReply, LockReply, ValidateReply, InstallReply, AbortReply, SoloReply, PrepareReply,
)
