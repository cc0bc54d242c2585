"""The coordinator of one-shot transactions at a shard leader (DESIGN.md §3).

Theory of operation. The coordinator is the leader that received the transaction. It

1. **executes** the procedure or operation list (``store.core.execution``). An operation
   list whose keys are all on this shard takes the short path: it is read, run and
   certified by the participant in one step (``Participant.run_local``), and answered
   COMMITTED in the same step when the local watermark already covers its clock;
2. **certifies** it: a transaction that touches one shard is certified there in one step
   (locally, or by one ``SoloRequest``); otherwise it locks the write set on every write
   shard (each draws a counter), then validates the read set on every read shard, and on
   success installs the writes everywhere tagged with
   ``vc = read_vc ⊔ {shard: counter}``. Any failed round aborts and releases what was taken;
3. answers the client: CERTIFIED as soon as the decision is made (if asked), COMMITTED once
   ``vc`` is at or below the known vector watermark (``ClockWaits``, shared with the
   participant, calls it back when the watermark gets there).

Requests to other shards are retransmitted until answered (the participant side is
idempotent), so lost, duplicated and reordered messages are harmless. Before the decision,
a shard that does not answer within ``peer_attempts_max`` tries aborts the transaction; after
it, installs are retried until acknowledged, because the outcome is already decided.

Epochs (docs/recovery.md). A transaction belongs to the epoch it was submitted in. When the
coordinator enters a new epoch (``begin_epoch``) it aborts its older transactions that are
not decided, stops retrying the installs of decided ones (a participant that had not
installed has aborted on its own, and recovery rolls the transaction back), and from then
on answers an older transaction only by its epoch's FVW (``resolve_epoch``): COMMITTED if
its clock is at or below it, ROLLED_BACK if not — never by a watermark of a later epoch.

Snapshot reads (``Settings.snapshot_reads``). A read-only operation list whose keys are all
on this shard (the short path) does not read the newest versions, which may be speculative
and would make its answer wait for their commit (a round trip between regions). It reads
the newest version whose writer's counter here is at most ``S``, this shard's durable
watermark when the list arrives (``Coordinator.durable_watermark``). Every version here
carries its writer's own counter here (never left out of a sparse clock: it was not
durable when its writer was certified), so each is judged exactly. Strictly serializable:

* *Nothing committed before it began is missed,* and nothing that committed before a
  transaction it shows: a transaction answered COMMITTED has its clock under a vector
  watermark, whose entry here is what this shard said of its durable watermark and never
  passes it; that watermark only rises. (Of a writer that touched no key here the list
  shows nothing either way.)
* *What it sees is a consistent cut:* the writers within ``S`` here are closed under every
  dependency (a clock dominates the clocks of what its transaction depends on,
  ``store.core.participant``), a key's versions overwrite one another (the counter rises
  along the chain: the first found from the newest is the one), and every counter at or
  below ``S`` is settled, so each of them is installed.
* *It needs no validation and no stamps:* no version within ``S`` can appear later (a
  counter drawn from now on is above it), and a transaction that writes nothing is in no
  cut and no rollback, so no writer's clock must dominate it.

Its answer is COMMITTED once its clock (the merge of the versions it read) is under the
vector watermark, as before; their entries here already are. Not taken (the newest versions
are read, as before): with several workers to a shard (a worker's watermark is not its
shard's), versions in doubt, a takeover not finished, before the durable watermark has
entered this epoch (a promoted leader starts from what its follower had learned, which may
be below what its predecessor had said), with speculation off, and on two shards or more.
There a snapshot of the coordinator's entry alone is not enough (tried, 2026-12-06: the
simulator found half a writer and stale reads): another shard's versions carry sparse
clocks, and its reads happen later than the snapshot was taken, so it shows writers that
began after a commit the snapshot leaves out.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from store.core.epoch import counter_base
from store.core.errors import InvalidRequest, Status, UnknownProcedure
from store.core.execution import (
    ABORTING,
    DECIDED,
    EXECUTING,
    LOCKING,
    PREPARING,
    SOLO,
    VALIDATING,
    Execution,
    Transaction,
)
from store.core.metrics import ABORT_CAUSES, LatencyHistogram, abort_cause
from store.core.oplist import OPS_PROCEDURE, OpList
from store.core.participant import NO_SNAPSHOT, Participant
from store.core.partition import Partitioner
from store.core.settings import Settings
from store.core.txn import Procedures, Tx
from store.core.vclock import EMPTY, VectorClock
from store.core.watermark import ClockWaits, VectorWatermark
from store.protocol.messages import (
    PREPARE_CONFLICT,
    PREPARE_OK,
    AbortReply,
    AbortRequest,
    InstallReply,
    InstallRequest,
    LockReply,
    LockRequest,
    Message,
    Outcome,
    PrepareReply,
    PrepareRequest,
    SoloReply,
    SoloRequest,
    Submit,
    ValidateReply,
    ValidateRequest,
)

# A coordinator's transaction ids in epoch e start at (e << TXN_SEQ_EPOCH_SHIFT) + 1.
TXN_SEQ_EPOCH_SHIFT: Final = 28


@dataclass(frozen=True, slots=True)
class Certification:
    """A certified transaction as the simulator's oracles see it (production observes none).

    ``reads``: (key, writer txn id) of every version read, point reads and scanned keys
    alike; writer 0 means no version, or one loaded before the cluster served.
    ``scans``: (shard, lo, hi, limit, keys seen) of each shard's part of each scan.
    """

    txn_id: int
    vc: VectorClock
    full: VectorClock  # vc with the entries dropped as durable put back
    reads: list[tuple[str, int]]
    scans: list[tuple[int, str, str, int, list[str]]]
    writes: list[str]
    client: tuple[str, int]  # (client_id, seq): the id the client knows it by
    epoch: int


CertifiedObserver = Callable[[Certification], None]


class Coordinator(Execution):
    def __init__(
        self,
        shard: int,
        coordinator_id: int,
        partitioner: Partitioner,
        participant: Participant,
        procedures: Procedures,
        settings: Settings,
        vector_watermark: VectorWatermark,
        send: Callable[[int, Message], None],
        reply: Callable[[str, Outcome], None],
        observer: CertifiedObserver | None = None,
        waits: ClockWaits | None = None,
    ) -> None:
        assert 0 <= coordinator_id < 1 << 16
        self.shard = shard
        self.coordinator_id = coordinator_id
        self.partitioner = partitioner
        self.participant = participant
        self.procedures = procedures
        self.settings = settings
        self.vw = vector_watermark
        self.epoch = 0
        self.now_ns = 0  # of the replica's current step (set by it): when answers leave
        self._send = send
        self._reply = reply
        self._observer = observer
        # Called when a transaction whose client waits for COMMITTED (not for CERTIFIED)
        # starts waiting for the watermark: the replica hurries its stream's open batch.
        self.commit_awaited: Callable[[int], None] | None = None
        self._next_seq = 1
        self._txns: dict[int, Transaction] = {}
        self._by_client: dict[tuple[str, int], int] = {}
        self._outcomes: OrderedDict[tuple[str, int], Outcome] = OrderedDict()
        # Requests to other shards awaiting an answer: (txn_id, shard) -> [message, attempts,
        # due_at]. A heap entry retransmits only if it is the request's current one (its time
        # is due_at): one chain of retries per request, however many rounds the transaction
        # has had with that shard.
        self._pending: dict[tuple[int, int], list[Any]] = {}
        self._retry_heap: list[tuple[int, int, int]] = []
        # Certified transactions not yet known durable; each waits in ``_waits`` until its
        # clock is under the vector watermark.
        self._awaiting_commit: dict[int, Transaction] = {}
        self._waits = waits if waits is not None else ClockWaits(vector_watermark.entries)
        # Aborts by cause (store.core.metrics.abort_cause), and the latencies from a
        # SUBMIT's arrival to certification and to the COMMITTED answer (server side).
        self.aborts_by_cause = dict.fromkeys(ABORT_CAUSES, 0)
        self.certify_latency = LatencyHistogram()
        self.commit_latency = LatencyHistogram()
        # gave_up: undecided transactions ended because a participant stayed unreachable.
        self.counters = {
            "certified": 0, "committed": 0, "aborted": 0, "solo": 0, "gave_up": 0,
            "rolled_back": 0,
        }
        # Epochs (docs/recovery.md): transactions of ended epochs waiting for their FVW, and
        # the FVWs known.
        self._awaiting_fvw: dict[int, dict[int, Transaction]] = {}
        self._fvw: dict[int, dict[int, int]] = {}
        # Whether the replica can take more work now (its replication stream's backlog).
        self.admits: Callable[[], bool] = lambda: True
        # Whether the replica's lease lets it tell a client COMMITTED for a transaction
        # whose reads were made by the given time (docs/recovery.md "Stale reads"); answers
        # it does not let out wait in _held until it does (or forever, on a deposed leader:
        # the client's retry finds the shard's new leader).
        self.may_acknowledge: Callable[[int], bool] = lambda executed_at_ns: True
        # This shard's durable watermark (every counter at or below it durable or aborted):
        # the snapshot of the read-only lists it runs alone (``ShardLeader.durable_watermark``).
        self.durable_watermark: Callable[[], int] = lambda: participant.watermark.watermark
        # Answers the lease holds back (read-only outside: ``release_held`` lets them out).
        self.held: list[tuple[Transaction, Any, str]] = []

    # ---- client side ---------------------------------------------------------------------

    def submit(self, now_ns: int, src: str, submit: Submit) -> None:
        key = (submit.client_id, submit.seq)
        outcome = self._outcomes.get(key)
        if outcome is not None:
            self._reply(src, outcome)
            return
        txn_id = self._by_client.get(key)
        if txn_id is not None:  # a retry of a transaction still running
            txn = self._txns[txn_id]
            txn.reply_to = src
            txn.want_certified |= submit.want_certified
            if txn.certified and not self._waits_for_commit(txn):
                self._reply(src, Outcome(txn.seq, Status.CERTIFIED, None, txn.vc, ""))
            return
        if len(self._by_client) >= self.settings.txns_in_flight_max or not self.admits():
            # Remembered like any outcome: a duplicate of this request that arrives later must
            # not run what the client was told did not run. The client retries with a new id.
            outcome = Outcome(submit.seq, Status.UNAVAILABLE, None, EMPTY, "overloaded")
            self._remember(key, outcome)
            self._reply(src, outcome)
            return
        txn_id = (self._next_seq << 16) | self.coordinator_id
        self._next_seq += 1
        if submit.procedure == OPS_PROCEDURE:
            try:
                args = submit.args
                if type(args) is not list or len(args) != 1:
                    raise InvalidRequest("an operation list is one argument")
                ops = OpList(args[0], self.settings)
                if self._run_local(now_ns, src, submit, key, txn_id, ops):
                    return
                if self._run_pair(now_ns, src, submit, key, txn_id, ops):
                    return
            except InvalidRequest as exc:
                outcome = Outcome(submit.seq, Status.INVALID, None, EMPTY, str(exc))
                self._remember(key, outcome)
                self._reply(src, outcome)
                return
            txn = Transaction(txn_id, submit, src, None, self.epoch)
            txn.submitted_at = now_ns
            txn.ops = ops
        else:
            tx = Tx(self.settings)
            txn = Transaction(txn_id, submit, src, tx, self.epoch)
            txn.submitted_at = now_ns
            try:
                txn.coro = self.procedures.start(submit.procedure, tx, submit.args, self.settings)
            except UnknownProcedure as unknown:
                self._finish_client(txn, Status.UNKNOWN_PROCEDURE, None, str(unknown))
                return
            except InvalidRequest as invalid:
                self._finish_client(txn, Status.INVALID, None, str(invalid))
                return
        self._txns[txn_id] = txn
        self._by_client[key] = txn_id
        self._drive(now_ns, txn, None)

    def _run_local(
        self, now_ns: int, src: str, submit: Submit, key: tuple[str, int], txn_id: int,
        ops: OpList,
    ) -> bool:
        """The short path of an operation list whose keys are all on this shard: read, run
        and certified in one step by the participant, and answered COMMITTED at once if the
        vector watermark covers its clock. False if it must take the general path (a key
        elsewhere, a scan, or a participant that cannot certify alone now)."""
        if ops.batch.scans or not self.partitioner.owns_all(ops.keys, self.shard):
            return False
        if self.partitioner.replicated and self.partitioner.shard_count > 1 and self._writes_replicated(ops):
            return False  # a replicated table's writes go to every shard
        observed = self._observer is not None
        snapshot = NO_SNAPSHOT if ops.written or ops.conditional else self._snapshot()
        ran = self.participant.run_local(txn_id, ops, self.epoch, observed, snapshot)
        if ran is None:
            return False
        counters = self.counters
        counters["solo"] += 1
        if ran is False:
            self._count_abort("conflict")
            self.certify_latency.observe(0)
            outcome = Outcome(submit.seq, Status.ABORTED, None, EMPTY, "conflict")
            self._remember(key, outcome)
            self._reply(src, outcome)
            return True
        result, vc, full, writes, read_from = ran
        counters["certified"] += 1
        self.certify_latency.observe(0)  # certified in the step that received it
        if observed:
            assert self._observer is not None
            self._observer(
                Certification(txn_id, vc, full, read_from, [], writes, key, self.epoch)
            )
        entries = self.vw.entries
        for shard, counter in vc.items():
            if counter > entries.get(shard, 0):
                break
        else:
            if self.may_acknowledge(now_ns):
                counters["committed"] += 1
                self.commit_latency.observe(0)
                outcome = Outcome(submit.seq, Status.COMMITTED, result, vc, "")
                self._remember(key, outcome)
                self._reply(src, outcome)
                return True
        # Certified, not yet durable: it waits like any other certified transaction.
        txn = Transaction(txn_id, submit, src, None, self.epoch)
        txn.submitted_at = now_ns
        txn.ops = ops
        txn.executed_at = now_ns
        txn.read_vc = full
        self._txns[txn_id] = txn
        self._by_client[key] = txn_id
        txn.result_value = result
        self._certified(now_ns, txn, vc, full, observe=False)
        return True

    def _snapshot(self) -> int:
        """The snapshot of a read-only list on this shard alone arriving now (module doc,
        "snapshot reads"): this shard's durable watermark, or NO_SNAPSHOT where none is
        taken. Not before the watermark has entered this epoch: a leader promoted by a
        takeover starts from what its follower had learned, which may be below what its
        predecessor had said."""
        if not self.participant.snapshots:
            return NO_SNAPSHOT
        mark = self.durable_watermark()
        if mark < counter_base(self.epoch):
            return NO_SNAPSHOT
        return mark

    def _writes_replicated(self, ops: OpList) -> bool:
        """Whether the list may write a replicated table (any key, with a compare-and-set)."""
        partitioner = self.partitioner
        return any(partitioner.is_replicated(key) for key in (ops.keys if ops.conditional else ops.written))

    def _write_shards_of(self, key: str) -> Sequence[int]:
        """Where a key is written: a replicated table's on every shard."""
        partitioner = self.partitioner
        if partitioner.is_replicated(key):
            return range(partitioner.shard_count)
        return (partitioner.shard_of(key),)

    def _read_shard_of(self, key: str) -> int:
        """Where a key is read: a replicated table's on this shard."""
        partitioner = self.partitioner
        return self.shard if partitioner.is_replicated(key) else partitioner.shard_of(key)

    def _run_pair(
        self, now_ns: int, src: str, submit: Submit, key: tuple[str, int], txn_id: int,
        ops: OpList,
    ) -> bool:
        """The prepared path: an operation list whose keys are on this shard and at least
        one other (no scan, no compare-and-set, speculation on) locks and reads in one round.

        Here, in this step: lock this shard's writes (drawing its counter) and read this
        shard's keys. Then one ``PrepareRequest`` to each other shard, carrying this part of
        the clock: it locks its writes, reads, checks its only-read keys against other
        transactions' locks and votes (``Participant.prepare``). Once every answer is in
        (``on_prepare_reply``) the list runs on the values and this shard's reads are
        validated. With one other shard (the pair path) the transaction is decided and
        installed then: the other shard's clock was whole when it stamped its only-read
        keys. With more, each other shard that has keys it only read validates them (and
        stamps the whole clock on them) in a second round (``ValidateRequest``), a shard
        whose every read is of a key it locked needs none (its locks kept those versions);
        then the decision. Against the general path (read, lock, validate, install: four
        rounds) this is one or two rounds before the decision; the reasons it is still
        serializable are in ``Participant.prepare``. False (nothing done) if the list does
        not qualify."""
        if ops.batch.scans or ops.conditional or not self.settings.speculation:
            return False
        if self.partitioner.replicated and self._writes_replicated(ops):
            return False
        partitioner = self.partitioner
        replicated = partitioner.replicated
        here = self.shard
        local_reads: list[str] = []
        remote_reads: dict[int, list[str]] = {}
        for read_key in ops.batch.keys:
            shard = self._read_shard_of(read_key) if replicated else partitioner.shard_of(read_key)
            if shard == here:
                local_reads.append(read_key)
            else:
                remote_reads.setdefault(shard, []).append(read_key)
        local_locks: list[str] = []
        remote_locks: dict[int, list[str]] = {}
        for written in ops.written:
            shard = partitioner.shard_of(written)
            if shard == here:
                local_locks.append(written)
            else:
                remote_locks.setdefault(shard, []).append(written)
        others = remote_reads.keys() | remote_locks.keys()
        if not others or not (local_reads or local_locks):
            return False
        txn = Transaction(txn_id, submit, src, None, self.epoch)
        txn.submitted_at = now_ns
        txn.ops = ops
        txn.executed_at = now_ns
        txn.batch = ops.batch
        counter = 0
        if local_locks:
            ok, counter, deps = self.participant.lock(txn_id, local_locks, self.epoch, now_ns)
            if not ok:
                self._count_abort("lock conflict")
                outcome = Outcome(submit.seq, Status.ABORTED, None, EMPTY, "lock conflict")
                self._remember(key, outcome)
                self._reply(src, outcome)
                return True
            txn.counters[here] = counter
            txn.deps = deps
            txn.write_shards[here] = []
        for shard in remote_locks:
            txn.write_shards[shard] = []
        self._absorb_reads(txn, here, self.participant.read(local_reads), [])
        base = EMPTY
        if len(others) == 1:
            # The pair path: the other shard stamps its only-read keys with the whole clock,
            # this part and its own. With more, the stamps come with the validation round,
            # and ``base`` would be bytes no one uses.
            base = txn.read_vc.merge(txn.deps)
            if counter:
                base = base.with_entry(self.partitioner.clock_of(here), counter)
        self._txns[txn_id] = txn
        self._by_client[key] = txn_id
        txn.phase = PREPARING
        for shard in sorted(others):
            txn.waiting.add(shard)
            self._request(
                now_ns, txn_id, shard,
                PrepareRequest(
                    txn_id, remote_reads.get(shard, []), remote_locks.get(shard, []), base,
                    self.epoch,
                ),
            )
        return True

    def on_prepare_reply(self, now_ns: int, reply: PrepareReply) -> None:
        txn = self._txns.get(reply.txn_id)
        if (
            txn is None or txn.phase != PREPARING or reply.shard not in txn.waiting
            or reply.status not in (PREPARE_OK, PREPARE_CONFLICT)
        ):
            return  # late, duplicated, or refused for now (no lease): the retry asks again
        shard = reply.shard
        txn.waiting.discard(shard)
        self._pending.pop((txn.txn_id, shard), None)
        if reply.status == PREPARE_CONFLICT:
            self._abort_everywhere(now_ns, txn, "conflict")
            return
        if shard in txn.write_shards:
            assert reply.counter > 0, "a prepare that locked drew no counter"
            txn.counters[shard] = reply.counter
        txn.deps = txn.deps.merge(reply.deps)
        self._absorb_reads(txn, shard, reply.items, [])
        if txn.waiting:
            return
        ops = txn.ops
        assert ops is not None
        if len(txn.batch_items) != len(ops.batch.keys):
            # A reply that does not answer what was asked (only a faulty peer sends one).
            self._abort_everywhere(now_ns, txn, "malformed prepare reply")
            return
        try:
            result = ops.run(
                [txn.batch_items[read_key][2] for read_key in ops.batch.keys], [], txn.writes,
                self.settings,
            )
        except InvalidRequest as exc:
            self._abort_everywhere(now_ns, txn, str(exc), Status.INVALID)
            return
        txn.result_value = result
        partitioner = self.partitioner
        for written, (value, deleted) in txn.writes.items():
            txn.write_shards[partitioner.shard_of(written)].append((written, value, deleted))
        self._clock(txn)
        here = self.shard
        reads = list(txn.reads.get(here, {}).items())
        if (reads or here in txn.counters) and not self.participant.validate(
            txn.txn_id, reads, [], txn.vc, txn.epoch
        ):
            self._abort_everywhere(now_ns, txn, "validation failed")
            return
        if len(txn.reads) > 2 and self._validate_only_read(now_ns, txn):
            return
        self._decide(now_ns, txn)

    def _validate_only_read(self, now_ns: int, txn: Transaction) -> bool:
        """The prepared path's second round, with more than one other shard: each stamped
        its only-read keys with a part of the clock and read them before every lock was
        held, so each validates them now (and stamps the whole clock on them). A shard
        whose every read is of a key it locked is not asked: its locks kept those versions,
        and the versions this transaction installs dominate their clocks. True if a
        ``ValidateRequest`` is out (``on_validate_reply`` decides)."""
        txn.phase = VALIDATING
        here = self.shard
        for shard, shard_reads in sorted(txn.reads.items()):
            if shard == here:
                continue
            # Without a compare-and-set the keys written are the keys locked.
            only_read = [
                (read_key, vid) for read_key, vid in shard_reads.items()
                if read_key not in txn.writes
            ]
            if only_read:
                txn.waiting.add(shard)
                self._request(
                    now_ns, txn.txn_id, shard,
                    ValidateRequest(txn.txn_id, only_read, [], txn.vc, txn.epoch),
                )
        return bool(txn.waiting)

    def _finish_client(self, txn: Transaction, status: Status, result: Any, detail: str) -> None:
        waited_ns = 0
        if status == Status.COMMITTED:
            if not self.may_acknowledge(txn.executed_at):
                # Still counted in flight (_by_client): a retry of it waits like the original.
                self.held.append((txn, result, detail))
                return
            waited_ns = max(0, self.now_ns - txn.certified_at)
            self.commit_latency.observe(max(0, self.now_ns - txn.submitted_at))
        outcome = Outcome(txn.seq, status, result, txn.vc, detail, waited_ns)
        key = (txn.client_id, txn.seq)
        self._by_client.pop(key, None)
        self._remember(key, outcome)
        self._reply(txn.reply_to, outcome)

    def _count_abort(self, detail: str) -> None:
        self.counters["aborted"] += 1
        self.aborts_by_cause[abort_cause(detail)] += 1

    def _remember(self, key: tuple[str, int], outcome: Outcome) -> None:
        """Every final outcome is remembered, aborts included: a duplicate of a request
        that arrives after its abort must get the abort, not run the transaction again."""
        self._outcomes[key] = outcome
        if len(self._outcomes) > self.settings.outcomes_remembered_max:
            self._outcomes.popitem(last=False)

    # ---- certification -------------------------------------------------------------------

    def _executed(self, now_ns: int, txn: Transaction, result: Any) -> None:
        txn.result_value = result
        txn.executed_at = now_ns
        partitioner = self.partitioner
        if partitioner.replicated:  # a replicated table is written on every shard
            write_shards = self._write_shards_of
            for key, (value, deleted) in txn.writes.items():
                for shard in write_shards(key):
                    txn.write_shards.setdefault(shard, []).append((key, value, deleted))
        else:
            for key, (value, deleted) in txn.writes.items():
                txn.write_shards.setdefault(partitioner.shard_of(key), []).append((key, value, deleted))
        read_shards = {s for s, reads in txn.reads.items() if reads} | {
            s for s, scans in txn.scans.items() if scans
        }
        participants = sorted(read_shards | txn.write_shards.keys())
        if not participants:
            self._certified(now_ns, txn, EMPTY, EMPTY)
            return
        if len(participants) == 1:
            shard = participants[0]
            reads = list(txn.reads.get(shard, {}).items())
            scans = txn.scans.get(shard, [])
            writes = txn.write_shards.get(shard, [])
            self.counters["solo"] += 1
            if shard == self.shard:
                clocks = self.participant.certify_solo(
                    txn.txn_id, reads, scans, writes, txn.read_vc, txn.epoch
                )
                if clocks is None:
                    self._aborted(txn, "conflict")
                else:
                    self._certified(now_ns, txn, clocks[0], clocks[1])
            else:
                txn.phase = SOLO
                self._request(
                    now_ns,
                    txn.txn_id,
                    shard,
                    SoloRequest(
                        txn.txn_id, reads, scans, writes, txn.read_vc, txn.epoch,
                        self._waits_for_commit(txn),
                    ),
                )
            return
        if not txn.write_shards:
            self._start_validation(now_ns, txn)
            return
        txn.phase = LOCKING
        for shard, writes in sorted(txn.write_shards.items()):
            keys = [key for key, _, _ in writes]
            if shard == self.shard:
                ok, counter, deps = self.participant.lock(txn.txn_id, keys, txn.epoch, now_ns)
                if not ok:
                    self._abort_everywhere(now_ns, txn, "lock conflict")
                    return
                txn.counters[shard] = counter
                txn.deps = txn.deps.merge(deps)
            else:
                txn.waiting.add(shard)
                self._request(now_ns, txn.txn_id, shard, LockRequest(txn.txn_id, keys, txn.epoch))
        if not txn.waiting:
            self._start_validation(now_ns, txn)

    def on_lock_reply(self, now_ns: int, reply: LockReply) -> None:
        txn = self._txns.get(reply.txn_id)
        if txn is None or txn.phase != LOCKING or reply.shard not in txn.waiting:
            return
        txn.waiting.discard(reply.shard)
        self._pending.pop((txn.txn_id, reply.shard), None)
        if not reply.ok:
            self._abort_everywhere(now_ns, txn, "lock conflict")
            return
        txn.counters[reply.shard] = reply.counter
        txn.deps = txn.deps.merge(reply.deps)
        if not txn.waiting:
            self._start_validation(now_ns, txn)

    def _clock(self, txn: Transaction) -> None:
        """Sets ``txn``'s clock from its reads, the dependencies of its locks and its
        counters, once every lock is held."""
        full = txn.read_vc.merge(txn.deps)
        clock_of = self.partitioner.clock_of  # a worker's counter is its shard's
        for shard, counter in txn.counters.items():
            full = full.with_entry(clock_of(shard), counter)
        # Sparse clocks (DESIGN.md §4): entries at or below the known vector watermark are
        # durable and carry no information; participants learn them as watermarks instead.
        vc = full.above(self.vw.entries) if self.settings.sparse_clocks else full
        txn.durable = VectorClock({s: c for s, c in full.items() if vc[s] != c})
        txn.full_vc = full
        txn.vc = vc

    def _start_validation(self, now_ns: int, txn: Transaction) -> None:
        txn.phase = VALIDATING
        self._clock(txn)
        # Every shard that read or locked votes: a write-only participant's vote tells it
        # the transaction is still alive, so that its locks do not expire under it.
        voters = sorted(
            {s for s, reads in txn.reads.items() if reads}
            | {s for s, scans in txn.scans.items() if scans}
            | set(txn.counters)
        )
        for shard in voters:
            reads = list(txn.reads.get(shard, {}).items())
            scans = txn.scans.get(shard, [])
            if shard == self.shard:
                if not self.participant.validate(txn.txn_id, reads, scans, txn.vc, txn.epoch):
                    self._abort_everywhere(now_ns, txn, "validation failed")
                    return
            else:
                txn.waiting.add(shard)
                self._request(
                    now_ns, txn.txn_id, shard,
                    ValidateRequest(txn.txn_id, reads, scans, txn.vc, txn.epoch),
                )
        if not txn.waiting:
            self._decide(now_ns, txn)

    def on_validate_reply(self, now_ns: int, reply: ValidateReply) -> None:
        txn = self._txns.get(reply.txn_id)
        if txn is None or txn.phase != VALIDATING or reply.shard not in txn.waiting:
            return
        txn.waiting.discard(reply.shard)
        self._pending.pop((txn.txn_id, reply.shard), None)
        if not reply.ok:
            self._abort_everywhere(now_ns, txn, "validation failed")
            return
        if not txn.waiting:
            self._decide(now_ns, txn)

    def _decide(self, now_ns: int, txn: Transaction) -> None:
        """Every lock is held and every read validated: the transaction is certified."""
        txn.phase = DECIDED
        # A client waiting for the commit waits for every shard's record: each participant
        # hurries its batch as this shard does (``_certified``).
        hurry = self._waits_for_commit(txn)
        for shard, writes in sorted(txn.write_shards.items()):
            if shard == self.shard:
                self.participant.install(txn.txn_id, writes, txn.vc, txn.epoch)
            else:
                txn.waiting.add(shard)
                self._request(
                    now_ns,
                    txn.txn_id,
                    shard,
                    InstallRequest(txn.txn_id, writes, txn.vc, txn.epoch, txn.durable, hurry),
                )
        self._certified(now_ns, txn, txn.vc, txn.full_vc)

    def on_solo_reply(self, now_ns: int, reply: SoloReply) -> None:
        txn = self._txns.get(reply.txn_id)
        if txn is None or txn.phase != SOLO:
            return
        self._pending.pop((txn.txn_id, reply.shard), None)
        if reply.ok:
            self._certified(now_ns, txn, reply.vc, reply.vc.merge(reply.durable))
        else:
            self._aborted(txn, "conflict")

    def on_install_reply(self, reply: InstallReply) -> None:
        txn = self._txns.get(reply.txn_id)
        if txn is None or reply.shard not in txn.waiting:
            return
        txn.waiting.discard(reply.shard)
        self._pending.pop((txn.txn_id, reply.shard), None)
        self._forget_if_done(txn)

    def on_abort_reply(self, reply: AbortReply) -> None:
        txn = self._txns.get(reply.txn_id)
        if txn is None or txn.phase != ABORTING or reply.shard not in txn.waiting:
            return
        txn.waiting.discard(reply.shard)
        self._pending.pop((txn.txn_id, reply.shard), None)
        self._forget_if_done(txn)

    def _certified(
        self, now_ns: int, txn: Transaction, vc: VectorClock, full: VectorClock,
        observe: bool = True,
    ) -> None:
        """``full``: ``vc`` with the entries dropped as durable put back."""
        assert txn.read_vc <= full, "vector clock below a version it read (DESIGN.md §3)"
        assert vc <= full
        txn.vc = vc
        txn.full_vc = full
        txn.certified = True
        txn.certified_at = now_ns
        if txn.phase != DECIDED:
            txn.phase = DECIDED
        if observe:
            self.counters["certified"] += 1
            self.certify_latency.observe(now_ns - txn.submitted_at)
        if self._observer is not None and observe:
            scans = [
                (shard, lo, hi, limit, [key for key, _ in seen])
                for shard, recorded in sorted(txn.scans.items())
                for lo, hi, limit, seen in recorded
            ]
            self._observer(
                Certification(
                    txn.txn_id, vc, full, txn.read_from, scans, list(txn.writes),
                    (txn.client_id, txn.seq), txn.epoch,
                )
            )
        self._awaiting_commit[txn.txn_id] = txn
        # A transaction already durable (a read of durable data, say) is answered COMMITTED
        # at once, without a CERTIFIED first that would cost the client a second request.
        if self._wait_or_commit(txn):
            if not self._waits_for_commit(txn):
                self._reply(txn.reply_to, Outcome(txn.seq, Status.CERTIFIED, txn.result_value, vc, ""))
            elif self.commit_awaited is not None:
                self.commit_awaited(now_ns)

    def _waits_for_commit(self, txn: Transaction) -> bool:
        """Whether ``txn``'s client hears nothing before the commit: it did not ask for the
        certified answer, or speculation is off (then certification waits for the commit)."""
        return not (txn.want_certified and self.settings.speculation)

    def _wait_or_commit(self, txn: Transaction) -> bool:
        """Commits ``txn`` if its clock is under the watermark; True if it must wait."""
        if txn.epoch < self.epoch:
            return self._wait_for_fvw(txn)
        if self._waits.wait(txn.vc, lambda: self._durable(txn)):
            return True
        del self._awaiting_commit[txn.txn_id]
        self.counters["committed"] += 1
        self._finish_client(txn, Status.COMMITTED, txn.result_value, "")
        self._forget_if_done(txn)
        return False

    # ---- epochs (docs/recovery.md) -------------------------------------------------------

    def begin_epoch(self, now_ns: int, epoch: int) -> None:
        """Enters ``epoch`` (see the module doc)."""
        assert epoch > self.epoch
        self.epoch = epoch
        # Transaction ids of a new epoch never repeat an old one's, even when a new leader
        # of this shard (a promoted follower) coordinates under the same coordinator id.
        self._next_seq = max(self._next_seq, (epoch << TXN_SEQ_EPOCH_SHIFT) + 1)
        for txn in list(self._txns.values()):
            if txn.epoch >= epoch:
                continue
            if txn.phase == EXECUTING:
                txn.close()
                self._end_before_certify(txn, Status.ABORTED, "the epoch changed")
            elif txn.phase in (LOCKING, VALIDATING, PREPARING):
                self._abort_everywhere(now_ns, txn, "the epoch changed")
            elif txn.phase == DECIDED:
                for shard in txn.waiting:
                    self._pending.pop((txn.txn_id, shard), None)
                txn.waiting.clear()
                awaiting = self._awaiting_commit.pop(txn.txn_id, None)
                if awaiting is not None:
                    self._wait_for_fvw(txn)
                self._forget_if_done(txn)

    def _wait_for_fvw(self, txn: Transaction) -> bool:
        fvw = self._fvw.get(txn.epoch)
        if fvw is None:
            self._awaiting_fvw.setdefault(txn.epoch, {})[txn.txn_id] = txn
            return True
        self._awaiting_commit.pop(txn.txn_id, None)
        if txn.vc.le_watermark(fvw):
            self.counters["committed"] += 1
            self._finish_client(txn, Status.COMMITTED, txn.result_value, "")
        else:
            self.counters["rolled_back"] += 1
            self._finish_client(txn, Status.ROLLED_BACK, None, "rolled back by recovery")
        self._forget_if_done(txn)
        return False

    def resolve_epoch(self, epoch: int, fvw: dict[int, int]) -> None:
        """The FVW of ``epoch`` is known: its waiting transactions get their answer."""
        self._fvw[epoch] = dict(fvw)
        for txn in list(self._awaiting_fvw.pop(epoch, {}).values()):
            self._wait_for_fvw(txn)

    def _durable(self, txn: Transaction) -> None:
        """``txn``'s clock is under the watermark now (called back by ``ClockWaits``)."""
        if self._awaiting_commit.get(txn.txn_id) is txn and txn.epoch == self.epoch:
            self._wait_or_commit(txn)

    def _aborted(self, txn: Transaction, detail: str, status: Status = Status.ABORTED) -> None:
        if status == Status.ABORTED:
            self._count_abort(detail)
        self._finish_client(txn, status, None, detail)
        txn.phase = ABORTING
        self._forget_if_done(txn)

    def _abort_everywhere(
        self, now_ns: int, txn: Transaction, detail: str, status: Status = Status.ABORTED
    ) -> None:
        """Releases whatever the transaction may hold on its write shards."""
        for shard in txn.waiting:
            self._pending.pop((txn.txn_id, shard), None)
        txn.waiting.clear()
        for shard in sorted(txn.write_shards):
            if shard == self.shard:
                self.participant.abort(txn.txn_id)
            else:
                txn.waiting.add(shard)
                self._request(now_ns, txn.txn_id, shard, AbortRequest(txn.txn_id))
        self._aborted(txn, detail, status)

    def _forget_if_done(self, txn: Transaction) -> None:
        if txn.waiting or txn.txn_id in self._awaiting_commit:
            return
        if txn.phase in (DECIDED, ABORTING) and (txn.client_id, txn.seq) not in self._by_client:
            self._txns.pop(txn.txn_id, None)

    # ---- retransmission ------------------------------------------------------------------

    def _request(self, now_ns: int, txn_id: int, shard: int, message: Message) -> None:
        due_at = now_ns + self.settings.peer_retry_ns
        self._pending[(txn_id, shard)] = [message, 1, due_at]
        heapq.heappush(self._retry_heap, (due_at, txn_id, shard))
        self._send(shard, message)

    def next_deadline(self) -> int | None:
        """When the next retransmission is due. Heap entries of requests answered since
        (or superseded by a later round's) are dropped here, as ``on_timer`` would: left
        on the heap, each would wake the replica once for nothing."""
        heap, pending = self._retry_heap, self._pending
        while heap:
            due_at, txn_id, shard = heap[0]
            entry = pending.get((txn_id, shard))
            if entry is not None and entry[2] == due_at:
                return due_at
            heapq.heappop(heap)
        return None

    def on_timer(self, now_ns: int) -> None:
        heap = self._retry_heap
        while heap and heap[0][0] <= now_ns:
            due_at, txn_id, shard = heapq.heappop(heap)
            entry = self._pending.get((txn_id, shard))
            if entry is None or entry[2] != due_at:
                continue  # answered, or an earlier round's timer: not this request's
            message, attempts, _ = entry
            txn = self._txns.get(txn_id)
            # A solo request may already have been applied, so it is retried until answered,
            # like an install: only rounds before any decision may give up.
            undecided = txn is not None and txn.phase in (
                EXECUTING, LOCKING, VALIDATING, PREPARING
            )
            if undecided and attempts >= self.settings.peer_attempts_max and txn is not None:
                self.counters["gave_up"] += 1
                if txn.phase == EXECUTING:
                    txn.close()
                    self._end_before_certify(txn, Status.UNAVAILABLE, f"shard {shard} unreachable")
                else:
                    self._abort_everywhere(now_ns, txn, f"shard {shard} unreachable")
                continue
            entry[1] = attempts + 1
            entry[2] = now_ns + self.settings.peer_retry_ns
            heapq.heappush(heap, (entry[2], txn_id, shard))
            self._send(shard, message)

    # ---- introspection -------------------------------------------------------------------

    def holds_answers(self) -> bool:
        return bool(self.held)

    def release_held(self) -> None:
        """Tells COMMITTED to the held transactions the lease now lets out."""
        held, self.held = self.held, []
        for txn, result, detail in held:
            self._finish_client(txn, Status.COMMITTED, result, detail)
            self._forget_if_done(txn)

    def final_outcome(self, client_id: str, seq: int) -> Outcome | None:
        """That transaction's final outcome, if it has one and it is still remembered."""
        return self._outcomes.get((client_id, seq))

    def knows(self, client_id: str, seq: int) -> bool:
        """Whether this coordinator has run (or is running) that transaction id."""
        key = (client_id, seq)
        return key in self._outcomes or key in self._by_client

    def in_flight(self) -> int:
        return len(self._by_client)

    def install_targets_pending_decision(self) -> list[int]:
        """Shards that transactions in validation hold locks on and wait for nothing more
        from: they will be sent installs once the other shards answer (for the simulator's
        nemesis, which partitions them to test that installs are retried until answered)."""
        return [
            shard
            for txn in self._txns.values()
            if txn.phase == VALIDATING
            for shard in txn.write_shards
            if shard not in txn.waiting
        ]

    def pending_requests(self) -> int:
        return len(self._pending)
