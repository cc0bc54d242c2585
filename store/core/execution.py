"""Procedure execution at a coordinator (DESIGN.md §3, step 1): one concern of ``Coordinator``.

A transaction runs either a registered procedure — its coroutine is driven by hand with
``send``, each ``ReadBatch`` it yields answered from the local participant at once or by
``ReadRequest``s to the owning shards (the coroutine stays parked until every reply is in)
— or a built-in operation list (``OpList``), which needs no coroutine: its one batch of
reads is fetched the same way, then the list runs on the values. Reads record
``(key, vid)`` per shard and fold the version's vector clock into ``read_vc``; when the
procedure ends, ``_executed`` (the certification side, ``store.core.coordinator``) takes
over.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from store.core.errors import InvalidRequest, Status
from store.core.oplist import OpList, ReadBatch
from store.core.participant import Participant
from store.core.partition import Partitioner
from store.core.settings import Settings
from store.core.txn import Tx, UserAbort
from store.core.vclock import EMPTY
from store.protocol.messages import (
    Message,
    ReadItem,
    ReadReply,
    ReadRequest,
    RecordedScan,
    Submit,
    Write,
)

EXECUTING: Final = 1
LOCKING: Final = 2
VALIDATING: Final = 3
SOLO: Final = 4
DECIDED: Final = 5  # certified: installs may still be in flight
ABORTING: Final = 6  # aborted: abort requests may still be in flight
PREPARING: Final = 7  # the pair path: its one PrepareRequest is out (store.core.coordinator)


def _key_of(item: ReadItem) -> str:
    return item[0]



class Transaction:
    """One transaction at its coordinator, from submission to its last message."""

    __slots__ = (
        "batch",
        "batch_items",
        "batch_scans",
        "certified",
        "certified_at",
        "client_id",
        "conflict",
        "coro",
        "counters",
        "deps",
        "durable",
        "epoch",
        "executed_at",
        "full_vc",
        "ops",
        "phase",
        "read_count",
        "read_from",
        "read_vc",
        "reads",
        "reply_to",
        "req_no",
        "result_value",
        "scans",
        "seq",
        "submitted_at",
        "tx",
        "txn_id",
        "vc",
        "waiting",
        "want_certified",
        "write_shards",
        "writes",
    )

    def __init__(
        self, txn_id: int, submit: Submit, reply_to: str, tx: Tx | None, epoch: int
    ) -> None:
        self.txn_id = txn_id
        self.epoch = epoch
        self.client_id = submit.client_id
        self.seq = submit.seq
        self.want_certified = submit.want_certified
        self.reply_to = reply_to
        self.tx = tx
        self.coro: Any = None  # a procedure's coroutine, or None: ``ops`` runs instead
        self.ops: OpList | None = None
        # key -> (value, deleted), buffered by the procedure or the operation list
        self.writes: dict[str, tuple[Any, bool]] = tx.writes if tx is not None else {}
        self.phase = EXECUTING
        self.batch: ReadBatch | None = None
        self.batch_items: dict[str, ReadItem] = {}
        self.batch_scans: list[list[ReadItem]] = []
        self.req_no = 0
        self.waiting: set[int] = set()
        self.reads: dict[int, dict[str, int]] = {}
        self.scans: dict[int, list[RecordedScan]] = {}
        self.read_vc = EMPTY
        self.read_from: list[tuple[str, int]] = []
        self.read_count = 0
        self.conflict = False
        self.counters: dict[int, int] = {}
        self.deps = EMPTY
        self.durable = EMPTY
        self.full_vc = EMPTY
        self.write_shards: dict[int, list[Write]] = {}
        self.vc = EMPTY
        self.certified = False
        self.certified_at = 0
        self.result_value: Any = None
        self.executed_at = 0  # when the procedure finished: its reads were all made
        self.submitted_at = 0  # when the SUBMIT arrived (latency metrics)

    def close(self) -> None:
        """Stops a procedure still executing (nothing to stop for an operation list)."""
        if self.coro is not None:
            self.coro.close()



class Execution:
    """Runs procedures and operation lists up to certification (mixed into ``Coordinator``)."""

    shard: int
    partitioner: Partitioner
    participant: Participant
    settings: Settings
    counters: dict[str, int]
    _txns: dict[int, Transaction]
    _pending: dict[tuple[int, int], list[Any]]

    def _request(self, now_ns: int, txn_id: int, shard: int, message: Message) -> None:
        raise NotImplementedError  # Coordinator's

    def _executed(self, now_ns: int, txn: Transaction, result: Any) -> None:
        raise NotImplementedError  # Coordinator's

    def _finish_client(self, txn: Transaction, status: Status, result: Any, detail: str) -> None:
        raise NotImplementedError  # Coordinator's

    def _count_abort(self, detail: str) -> None:
        raise NotImplementedError  # Coordinator's

    def _drive(self, now_ns: int, txn: Transaction, value: Any) -> None:
        """Runs ``txn`` until it waits for remote reads or ends; ``value``: the answer to
        the batch it waited for (None to start)."""
        ops = txn.ops
        if ops is not None:
            if value is None:
                value = self._start_batch(now_ns, txn, ops.batch)
                if value is None:
                    return  # parked until the remote reads are in, or ended
            try:
                result = ops.run(value[0], value[1], txn.writes, self.settings)
            except InvalidRequest as exc:
                self._end_before_certify(txn, Status.INVALID, str(exc))
                return
            self._executed(now_ns, txn, result)
            return
        while True:
            try:
                request = txn.coro.send(value)
            except StopIteration as stop:
                self._executed(now_ns, txn, stop.value)
                return
            except UserAbort as abort:
                self._end_before_certify(txn, Status.USER_ABORTED, abort.reason)
                return
            except InvalidRequest as exc:
                self._end_before_certify(txn, Status.INVALID, str(exc))
                return
            except Exception as bug:  # the procedure's own bug: report, change nothing
                self._end_before_certify(
                    txn, Status.PROCEDURE_FAILED, f"{type(bug).__name__}: {bug}"
                )
                return
            if not isinstance(request, ReadBatch):
                txn.close()
                self._end_before_certify(
                    txn, Status.PROCEDURE_FAILED, "procedures may only await tx operations"
                )
                return
            value = self._start_batch(now_ns, txn, request)
            if value is None:
                return  # parked until the remote reads are in

    def _start_batch(self, now_ns: int, txn: Transaction, batch: ReadBatch) -> Any:
        txn.read_count += len(batch.keys) + len(batch.scans)
        if txn.read_count > self.settings.reads_per_txn_max:
            txn.close()
            self._end_before_certify(
                txn, Status.INVALID, f"more than {self.settings.reads_per_txn_max} reads"
            )
            return None
        txn.req_no += 1
        txn.batch = batch
        txn.batch_items = {}
        txn.batch_scans = [[] for _ in batch.scans]
        keys_by_shard: dict[int, list[str]] = {}
        partitioner = self.partitioner
        if partitioner.replicated:  # a replicated table is read where this runs
            here = self.shard
            for key in batch.keys:
                shard = here if partitioner.is_replicated(key) else partitioner.shard_of(key)
                keys_by_shard.setdefault(shard, []).append(key)
        else:
            for key in batch.keys:
                keys_by_shard.setdefault(partitioner.shard_of(key), []).append(key)
        scans_by_shard: dict[int, list[tuple[str, str, int]]] = {}
        for lo, hi, limit in batch.scans:
            for shard in self._scan_shards(lo, hi):
                scans_by_shard.setdefault(shard, []).append((lo, hi, limit))
        for shard in sorted(keys_by_shard.keys() | scans_by_shard.keys()):
            keys = keys_by_shard.get(shard, [])
            scans = scans_by_shard.get(shard, [])
            if shard == self.shard:
                self._absorb_reads(
                    txn, shard, self.participant.read(keys), self.participant.scan_many(scans)
                )
            else:
                txn.waiting.add(shard)
                self._request(now_ns, txn.txn_id, shard, ReadRequest(txn.txn_id, txn.req_no, keys, scans))
        if txn.waiting:
            return None
        return self._batch_value(txn)

    def _scan_shards(self, lo: str, hi: str) -> Sequence[int]:
        """The shards a scan of ``[lo, hi)`` asks: this one for a replicated table."""
        partitioner = self.partitioner
        if partitioner.replicated and partitioner.is_replicated(lo):
            return (self.shard,)
        return partitioner.shards_of_range(lo, hi)

    def _absorb_reads(
        self, txn: Transaction, shard: int, items: list[ReadItem], scans: list[list[ReadItem]]
    ) -> None:
        recorded = txn.reads.get(shard)
        if recorded is None:
            recorded = txn.reads[shard] = {}
        read_vc = txn.read_vc
        for item in items:
            key, vid, _, _, vc, writer = item
            previous = recorded.get(key)
            if previous is None:
                recorded[key] = vid
            elif previous != vid:
                txn.conflict = True  # the key changed between two reads: cannot certify
            txn.batch_items[key] = item
            txn.read_from.append((key, writer))
            if vid:
                read_vc = read_vc.merge(vc)
        assert txn.batch is not None
        if scans:
            # The shard answered the scans it owns in the order they were asked.
            ranges = [
                (j, rng)
                for j, rng in enumerate(txn.batch.scans)
                if shard in self._scan_shards(rng[0], rng[1])
            ]
            recorded_scans = txn.scans.setdefault(shard, [])
            for (j, (lo, hi, limit)), found in zip(ranges, scans, strict=True):
                recorded_scans.append((lo, hi, limit, [(item[0], item[1]) for item in found]))
                txn.batch_scans[j].extend(found)
                for item in found:
                    read_vc = read_vc.merge(item[4])
                    txn.read_from.append((item[0], item[5]))
        txn.read_vc = read_vc

    def _batch_value(self, txn: Transaction) -> Any:
        batch = txn.batch
        assert batch is not None
        if txn.conflict:
            txn.close()
            self._end_before_certify(txn, Status.ABORTED, "a key changed between two reads")
            return None
        values = [txn.batch_items[key][2] for key in batch.keys]
        scans = []
        for j, (_, _, limit) in enumerate(batch.scans):
            found = sorted(txn.batch_scans[j], key=_key_of, reverse=limit < 0)[: abs(limit)]
            scans.append([(item[0], item[2]) for item in found])
        return values, scans

    def on_read_reply(self, now_ns: int, reply: ReadReply) -> None:
        txn = self._txns.get(reply.txn_id)
        if txn is None or txn.phase != EXECUTING or reply.req_no != txn.req_no:
            return  # late or duplicated
        if reply.shard not in txn.waiting:
            return
        txn.waiting.discard(reply.shard)
        self._pending.pop((txn.txn_id, reply.shard), None)
        if len(reply.scans) != len(
            [r for r in (txn.batch.scans if txn.batch else []) if reply.shard in self._scan_shards(r[0], r[1])]
        ):
            return  # malformed reply; the retransmission will ask again
        self._absorb_reads(txn, reply.shard, reply.items, reply.scans)
        if not txn.waiting:
            value = self._batch_value(txn)
            if value is not None:
                self._drive(now_ns, txn, value)

    def _end_before_certify(self, txn: Transaction, status: Status, detail: str) -> None:
        """Ends a transaction that holds nothing anywhere (still executing)."""
        for shard in txn.waiting:
            self._pending.pop((txn.txn_id, shard), None)
        txn.waiting.clear()
        del self._txns[txn.txn_id]
        if status == Status.ABORTED:
            self._count_abort(detail)
        self._finish_client(txn, status, None, detail)

