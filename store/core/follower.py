"""A shard's follower replica in another region (DESIGN.md §4): acceptor, learner, replay,
and bounded-stale snapshot reads.

Theory of operation. The follower runs the acceptor and learner of its shard's Paxos
stream (``StreamFollower``). Chosen entries arrive in slot order; each batch's records are
replayed into a local versioned store, every write kept as a version tagged with its
transaction's vector clock, and a write older than the key's newest version is skipped
(Thomas's write rule), so a record replayed twice changes nothing.

What a follower may show. Every entry carries the stream watermark (``Entry.watermark``: all
of this shard's counters at or below it are in this entry or earlier ones) and the leader's
vector watermark when it was closed (``Entry.vw``). From the entries applied so far the
follower knows ``vw``: its shard's entry is the largest applied stream watermark — every
counter at or below it is applied here and durable — and the other entries are the other
shards' watermarks as the leader knew them. A transaction is visible at the follower iff
``vc <= vw``: it is committed (every shard of its clock durable), and everything it depends
on that wrote to this shard is visible too, because clocks dominate every dependency
(write-read, write-write and read-write; participant.py), entries dropped from a sparse clock
were learned by this shard's leader before the transaction was appended (InstallRequest's
``durable``), and this shard's counters at or below ``vw`` are all applied. Versions of a key
are in write-write order, so the visible ones are a prefix of its chain: a snapshot read
returns, per key, the newest version whose clock is at or below ``vw``.

Snapshots cover the keys of this shard. A snapshot across shards needs one vector that
every follower involved can serve consistently; that is not built yet (docs/design.md).

Falling far behind. A follower whose gap is larger than what the leader keeps
(``log_retained_slots``) cannot fetch it; it copies a live replica's state the way a
rejoining replica does, keeping its acceptor (``_check_far_behind``).

Rejoining (docs/recovery.md). A replica restarted with its memory gone is built with
``rejoining=True``. It heartbeats to the configuration manager as REJOINING (neither a live
leader nor a candidate) and waits for a map that names another replica its shard's leader;
then it copies the state of a live follower (or of the leader) (``store.core.transfer``)
piece by piece, asking the
next source after ``transfer_retry_ns`` without progress. Until the copy is installed it
answers no stream message and no snapshot read. From then on it is a follower like any
other from the copied delivery point, except that its acceptor answers no older leader than
the current one, and votes in no phase 1 until it has learned every slot the current leader
can have proposed before the crash (``_check_voting``); until then it still heartbeats as
REJOINING, so the CM does not make it a leader. See ``Acceptor`` (restarted).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from store.core.epoch import StreamEpochs, counter_base
from store.core.errors import InvalidRequest
from store.core.partition import Partitioner
from store.core.paxos import (
    DEFAULT_STREAM_SETTINGS,
    Acceptor,
    Commit,
    Entry,
    PaxosMessage,
    Prepare,
    StreamFollower,
    StreamSettings,
)
from store.core.paxos import Accept as PaxosAccept
from store.core.ready import Ready
from store.core.replica import Probe, ShardLeader, Takeover
from store.core.settings import DEFAULT_SETTINGS, Settings
from store.core.storage import VersionedStore
from store.core.transfer import FollowerState, StateDecoder, StateServer, StoreSnapshot
from store.core.txn import Procedures
from store.core.vclock import EMPTY, VectorClock
from store.core.watermark import clock_watermark
from store.protocol.cluster_map import ClusterMap
from store.protocol.messages import (
    FOLLOWER,
    REJOINING,
    ConfigReply,
    Heartbeat,
    Message,
    SnapshotRead,
    SnapshotReply,
    StatePiece,
    StateRequest,
)

# What a follower answers once it serves (none while it rejoins).
_ANSWERS: Final[tuple[type[Message], ...]] = (SnapshotRead, StateRequest)


class ShardFollower:
    ANSWERS: tuple[type[Message], ...] = _ANSWERS
    ONE_WAY: tuple[type[Message], ...] = (ConfigReply,)
    REPLIES: tuple[type[Message], ...] = (StatePiece,)

    def __init__(
        self,
        shard: int,
        address: str,
        stream_settings: StreamSettings = DEFAULT_STREAM_SETTINGS,
        *,
        now_ns: int = 0,
        probe: Probe | None = None,
        cm_members: Sequence[str] = (),
        settings: Settings = DEFAULT_SETTINGS,
        partitioner: Partitioner | None = None,
        procedures: Procedures | None = None,
        breaks: frozenset[str] = frozenset(),
        rejoining: bool = False,
        acceptor: Acceptor | None = None,
    ) -> None:
        self.shard = shard
        self.breaks = breaks
        self.address = address
        self._probe = probe
        self.stream = StreamFollower(shard, stream_settings, acceptor=acceptor)
        self.stream_settings = stream_settings
        self.settings = settings
        self.partitioner = partitioner
        # A follower of one worker of a shard of several (``WorkerPartitioner``): ``shard``
        # is the worker's unit, ``clock`` its shard's vector-clock entry.
        self.workers = partitioner.workers if partitioner is not None else 1
        self.clock = partitioner.clock_of(shard) if partitioner is not None else shard
        self.procedures = procedures
        self.store = VersionedStore()
        self.vw = EMPTY
        self.applied_slots = 0
        self.applied_records = 0
        self._outbox: list[tuple[str, Message]] = []
        self._wake_at: int | None = None
        self.dropped_messages = 0
        # Epochs (docs/recovery.md).
        self.epoch = 0
        self.cm_members = list(cm_members)
        self.map: ClusterMap | None = None
        self.epochs = StreamEpochs()
        self.fvw_applied = -1
        self.rolled_back = 0
        # Replayed transactions not yet visible, by epoch (rolled back by its FVW if above).
        self._speculative: dict[int, list[tuple[int, VectorClock, list[str]]]] = {}
        # What an entry lets this follower show, held while an earlier epoch's FVW is not
        # applied here: (entry epoch, watermark, vw).
        self._held_visibility: list[tuple[int, int, VectorClock]] = []
        # Recently delivered entries, handed to the stream if this follower takes it over.
        self._recent: dict[int, Entry] = {}
        self._heartbeat_at = now_ns
        self._successor: Any = None
        # Rejoining (see the module doc): until the copied state is installed.
        self.rejoining = rejoining
        if rejoining:
            self.ANSWERS = ()
        self._transfer_sources: list[str] = []
        self._transfer_source = 0
        self._transfer_id = 0
        self._transfer = StateDecoder()
        self._transfer_deadline: int | None = None
        self._persist: list[object] = []  # the acceptor's records (Ready.persist)
        self._votes_from: int | None = None  # see _check_voting
        self._kept_acceptor = acceptor is not None
        self.transfers_started = 0
        self.transfer_bytes = 0
        self.catch_ups = 0  # copies started because it fell too far behind (_check_far_behind)
        self.restores = 0  # states restored from its own snapshot (restore)
        self._catch_up_from: str | None = None
        self._state_server = StateServer(
            shard, settings.transfer_piece_bytes, 4 * settings.transfer_retry_ns
        )

    @property
    def skipped_writes(self) -> int:
        return self.store.skipped_writes

    def handle(self, now_ns: int, src: str, message: Message) -> None:
        if isinstance(message, PaxosMessage):
            if message.stream != self.shard:
                self.dropped_messages += 1
                return
            if self.rejoining:
                self._while_rejoining(now_ns, src, message)
                return
            self.stream.handle(now_ns, src, message)
            self._pump()
            if not self.stream.acceptor.voting:
                self._check_voting(now_ns, src, message)
            self._check_far_behind(now_ns)
        elif isinstance(message, SnapshotRead) and not self.rejoining:
            self._outbox.append((src, self.snapshot(message)))
        elif isinstance(message, ConfigReply):
            self._on_config(now_ns, message.cluster_map)
        elif isinstance(message, StateRequest):
            capture = None if self.rejoining else self.capture_state
            self._outbox.append((src, self._state_server.serve(message, capture, now_ns)))
        elif isinstance(message, StatePiece) and self.rejoining:
            self._on_state_piece(now_ns, message)
        else:
            self.dropped_messages += 1

    def tick(self, now_ns: int) -> None:
        if self.rejoining:
            if self._transfer_deadline is not None and now_ns >= self._transfer_deadline:
                self._start_transfer(now_ns, self._transfer_source + 1)
        else:
            self.stream.tick(now_ns)
            self._pump()
        if self.cm_members and now_ns >= self._heartbeat_at:
            self._heartbeat_at = now_ns + self.settings.heartbeat_interval_ns
            if not self.voting:
                # Not yet a full member: neither a candidate for leader nor counted alive.
                heartbeat = Heartbeat(self.address, self.shard, REJOINING, 0, 0, -1, [])
            else:
                heartbeat = Heartbeat(
                    self.address, self.shard, FOLLOWER, self.epoch,
                    self.stream.learner.delivered_through, self.fvw_applied, [],
                )
            for member in self.cm_members:
                self._outbox.append((member, heartbeat))

    @property
    def has_successor(self) -> bool:
        """Whether the next ``ready()`` names a replica to host instead of this one."""
        return self._successor is not None

    def ready(self) -> Ready:
        messages, self._outbox = self._outbox, []
        wake_at = self._wake_at if not self.rejoining else self._transfer_deadline
        if self.cm_members and (wake_at is None or self._heartbeat_at < wake_at):
            wake_at = self._heartbeat_at
        successor, self._successor = self._successor, None
        persist, self._persist = self._persist, []
        persist += self.stream.acceptor.take_persist()  # what direct calls left there
        return Ready(messages, wake_at, successor, persist)

    # ---- replay --------------------------------------------------------------------------

    def _pump(self) -> None:
        ready = self.stream.ready()
        self._persist.extend(ready.persist)
        self._outbox.extend(ready.messages)
        self._wake_at = ready.wake_at
        if ready.chosen:
            acceptor = self.stream.acceptor
            forget = self.stream.learner.delivered_through - self.stream_settings.log_retained_slots
            if forget > acceptor.forgotten_before:
                acceptor.forget_before(forget)
                recent = self._recent  # in slot order: the oldest first
                while recent and next(iter(recent)) < forget:
                    del recent[next(iter(recent))]
        acceptor = self.stream.acceptor
        for slot, entry in ready.chosen:
            self.applied_slots += 1
            self._recent[slot] = entry
            acceptor.learned(slot, entry)
            if not self.epochs.add(entry):
                continue  # a marker, or void: its epoch already ended on this stream
            # An entry of an epoch whose FVW is already applied here (this follower caught up
            # late) keeps only what the FVW keeps.
            unit_fvw = self.map.fvw.get(entry.epoch) if self.map and entry.epoch <= self.fvw_applied else None
            fvw = clock_watermark(unit_fvw, self.workers) if unit_fvw is not None else None
            for record in entry.records:
                self.applied_records += 1
                if fvw is not None and not VectorClock.from_wire(record[2]).le_watermark(fvw):
                    continue
                replayed = self.store.replay(record, self.clock, entry.epoch)
                if replayed is not None and fvw is None:
                    self._speculative.setdefault(entry.epoch, []).append(replayed)
            self._held_visibility.append((entry.epoch, entry.watermark, entry.vw))
        self._release_visibility()

    def _release_visibility(self) -> None:
        """Applies what entries let this follower show, in stream order, up to the first of
        an epoch whose predecessors' FVWs are not all applied here: until the old epoch's
        rollback is done, a later epoch's watermarks would show what it rolls back."""
        held = self._held_visibility
        vw = self.vw
        released = 0
        for epoch, watermark, entry_vw in held:
            if epoch > self.fvw_applied + 1:
                break
            released += 1
            vw = vw.merge(entry_vw)
            if watermark >= counter_base(epoch) and self.workers == 1:
                # (With several workers the stream's stamp is one worker's claim: the
                # shard's entry comes from the leader's vector watermark alone.)
                vw = vw.with_entry(self.clock, max(watermark, vw[self.clock]))
        if not released:
            return
        del held[:released]
        if vw != self.vw:
            if self._probe is not None:
                self._probe.watermark(self.address, dict(vw.items()))
            self.vw = vw
            current = self._speculative.get(self.epoch)
            if current and len(current) > 64:
                marks = dict(vw.items())
                self._speculative[self.epoch] = [e for e in current if not e[1].le_watermark(marks)]

    # ---- epochs (docs/recovery.md) -------------------------------------------------------

    def _on_config(self, now_ns: int, cluster_map: ClusterMap) -> None:
        if not 0 <= self.shard < cluster_map.shards:
            self.dropped_messages += 1
            return
        if self.map is None or (cluster_map.epoch, cluster_map.fvw_epoch()) > (
            self.map.epoch, self.map.fvw_epoch()
        ):
            self.map = cluster_map
        if self.rejoining:
            if self._transfer_deadline is None:
                self._start_transfer(now_ns, 0)
            return
        if cluster_map.epoch > self.epoch:
            self.epoch = cluster_map.epoch
            if (
                cluster_map.leaders[self.shard] == self.address
                and self.partitioner is not None
                and self.voting  # else it is promoted once it votes (_check_voting)
            ):
                self._apply_fvws()
                self._successor = self.promote(now_ns, cluster_map)
                return
        self._apply_fvws()

    def _apply_fvws(self) -> None:
        cluster_map = self.map
        if cluster_map is None:
            return
        for epoch in sorted(cluster_map.fvw):
            if epoch <= self.fvw_applied:
                continue
            fvw = clock_watermark(cluster_map.fvw[epoch], self.workers)
            for txn_id, vc, keys in self._speculative.pop(epoch, []):
                if not vc.le_watermark(fvw):
                    for key in keys:
                        self.store.roll_back(key, txn_id)
                    self.rolled_back += 1
                    if self._probe is not None:
                        self._probe.rolled_back(self.address, txn_id)
            self.fvw_applied = epoch
        self._release_visibility()

    def promote(self, now_ns: int, cluster_map: ClusterMap) -> ShardLeader:
        """This follower becomes its shard's leader in ``cluster_map.epoch`` (rule 4 of
        docs/recovery.md): it takes the stream over from what it has delivered, keeps its
        store, and ends the old epoch on the stream before it certifies anything."""
        assert self.partitioner is not None and self.procedures is not None
        stream = self.stream
        takeover = Takeover(
            acceptor=stream.acceptor,
            first_slot=stream.learner.delivered_through,
            known_chosen=dict(self._recent),
            # The epoch orders takeovers: the leader of a later epoch proposes above every
            # earlier one, and one promoted by a map that is out of date (a late message)
            # loses to the leader of the current epoch instead of deposing it.
            ballot_round=cluster_map.epoch + 1,
            epochs=self.epochs,
            vw=dict(self.vw.items()),
            fvw_applied=self.fvw_applied,
            speculative=self._speculative,
            cluster_map=cluster_map,
        )
        return ShardLeader(
            self.shard, cluster_map.leaders, self.partitioner, self.procedures, self.settings,
            breaks=self.breaks, probe=self._probe, now_ns=now_ns,
            followers=cluster_map.followers[self.shard],
            stream_settings=self.stream_settings, cm_members=self.cm_members,
            store=self.store, takeover=takeover,
        )

    # ---- rejoining (see the module doc) --------------------------------------------------

    def _start_transfer(self, now_ns: int, source: int) -> None:
        """Asks source number ``source`` (the map's followers, then its leader) for a fresh
        copy of its state; while the map still names this replica leader, looks again after
        ``transfer_retry_ns``."""
        self._transfer_deadline = now_ns + self.settings.transfer_retry_ns
        cluster_map = self.map
        if cluster_map is None and self._catch_up_from is not None:
            # A follower far behind with no map yet (no failover happened): its leader.
            self._transfer_sources = [self._catch_up_from]
        elif cluster_map is None or cluster_map.leaders[self.shard] == self.address:
            self._transfer_sources = []
            return  # the CM has not yet replaced this replica as leader: wait
        elif self._catch_up_from is not None:
            # Far behind: the leader first, the one sure to be ahead by more than its gap (a
            # follower lagging too would leave it as far behind as before, and it would copy
            # again and again: seed 1 of the far-behind scenario did so, 2026-12-02).
            leader = cluster_map.leaders[self.shard]
            self._transfer_sources = [leader] + [
                f for f in cluster_map.followers[self.shard] if f not in (self.address, leader)
            ]
        else:
            # Followers first; the leader last (it has more to do, and may be taking over).
            self._transfer_sources = [
                f for f in cluster_map.followers[self.shard] if f != self.address
            ] + [cluster_map.leaders[self.shard]]
        self._transfer_source = source % len(self._transfer_sources)
        self._transfer_id += 1
        # Versions go into a fresh store as they are decoded (one a failed copy half filled
        # is dropped here).
        self.store = VersionedStore()
        self._transfer = StateDecoder(into=self.store)
        self.transfers_started += 1
        self._ask_piece()

    def _ask_piece(self) -> None:
        request = StateRequest(
            self.address, self._transfer_id, self.shard, self._transfer.size,
            self.settings.transfer_piece_bytes,
        )
        self._outbox.append((self._transfer_sources[self._transfer_source], request))

    def _on_state_piece(self, now_ns: int, piece: StatePiece) -> None:
        transfer = self._transfer
        received = transfer.size
        if piece.req_id != self._transfer_id or piece.offset != received:
            return  # a late answer to an abandoned transfer, or a duplicate
        if piece.total == 0 or piece.shard != self.shard or received + len(piece.data) > piece.total:
            self._start_transfer(now_ns, self._transfer_source + 1)  # refused: ask another
            return
        try:
            transfer.feed(piece.data)  # decoded as it comes
            self.transfer_bytes += len(piece.data)
            self._transfer_deadline = now_ns + self.settings.transfer_retry_ns
            if piece.more:
                self._ask_piece()
                return
            state = transfer.finish()
        except InvalidRequest:
            self._start_transfer(now_ns, self._transfer_source + 1)
            return
        self._install_state(state)

    def _while_rejoining(self, now_ns: int, src: str, message: PaxosMessage) -> None:
        """A retired leader's acceptor kept its memory: it goes on serving its stream while
        the rest of the state is copied (its shard may need it for a majority). A restarted
        one has none yet: silent."""
        acceptor = self.stream.acceptor
        if self._kept_acceptor and isinstance(message, Prepare | PaxosAccept):
            acceptor.handle(now_ns, src, message)
            self._outbox.extend(acceptor.ready(keep_persist=True).messages)
        else:
            self.dropped_messages += 1

    def _check_far_behind(self, now_ns: int) -> None:
        """A follower that fell behind by more than the leader keeps (``log_retained_slots``
        below its commit index: cut off, or paused, for that long) can no longer fetch the
        slots it lacks. It copies a live replica's state instead, as a rejoining replica
        does, keeping its acceptor (which remembers all, and goes on voting meanwhile)."""
        learner = self.stream.learner
        if (
            self.rejoining
            or learner.leader is None
            or learner.chosen_through - learner.delivered_through
            <= self.stream_settings.log_retained_slots
        ):
            return
        self._catch_up_from = learner.leader  # the source when no map names one yet
        self.rejoining = True
        self.ANSWERS = ()
        self._kept_acceptor = True
        self.catch_ups += 1
        self._start_transfer(now_ns, 0)

    def _check_voting(self, now_ns: int, src: str, message: PaxosMessage) -> None:
        """A restarted acceptor votes in phase 1 once this replica has learned every slot
        the current leader can have proposed before the crash: those below its commit index
        when it first speaks to the restarted replica, plus the proposals it may have had
        in flight beyond it (``slots_in_flight_max``)."""
        acceptor = self.stream.acceptor
        if self._votes_from is None:
            if src != acceptor.leader or not isinstance(message, PaxosAccept | Commit):
                return
            self._votes_from = message.chosen_through + self.stream_settings.slots_in_flight_max
        if self.stream.learner.delivered_through >= self._votes_from:
            acceptor.voting = True
            cluster_map = self.map
            if (
                cluster_map is not None
                and cluster_map.leaders[self.shard] == self.address
                and self.partitioner is not None
            ):
                # The map made it leader while it could not lead yet: it can now.
                self._apply_fvws()
                self._successor = self.promote(now_ns, cluster_map)

    @property
    def voting(self) -> bool:
        """Whether this replica's acceptor counts in its shard's phase 1 (after a restart:
        once it has caught up; see Acceptor)."""
        return not self.rejoining and self.stream.acceptor.voting

    @staticmethod
    def may_restore(state: FollowerState, acceptor: Acceptor, address: str) -> bool:
        """Whether a replica restarted with ``acceptor`` (from its log) may go on from its
        own snapshot ``state`` as a follower (``restore``). Not if it may have led its shard
        after the snapshot was taken (the snapshot's map names it leader, or its last promise
        was to its own ballot): a leader's store held what was never chosen, and the CM must
        see it gone (REJOINING) to hand its shard to a live follower. It then copies a live
        replica's state instead."""
        cluster_map = state.cluster_map
        return (
            cluster_map is not None
            and 0 <= state.shard < cluster_map.shards
            and cluster_map.leaders[state.shard] != address
            and acceptor.promised.leader != address
        )

    def restore(self, state: FollowerState) -> None:
        """A replica restarted with its acceptor (``acceptor``, from its log) goes on from
        its own snapshot, a state it captured itself (``capture_state``) before the crash, as
        it would from a copied one: a follower at the snapshot's delivery point, whose
        acceptor remembers every promise and vote (so it votes at once), and which learns
        the slots above from its shard's leader. See ``may_restore``."""
        assert self.rejoining and self._kept_acceptor, "restore() is for a restarted replica"
        assert self.may_restore(state, self.stream.acceptor, self.address)
        self.restores += 1
        if not state.recent:
            state.recent = self._recent_from_log(state.slot)
        self._install_state(state)

    def _recent_from_log(self, slot: int) -> dict[int, Entry]:
        """The entries delivered below ``slot`` that a snapshot on disk leaves out: its
        acceptor (from its log) holds the chosen value of every slot its learner delivered
        and did not forget (``Acceptor.learned``), and the host writes a snapshot only once
        the log records of what it delivered are synced. Back from ``slot`` to the first
        slot it does not hold, at most ``log_retained_slots`` of them."""
        acceptor = self.stream.acceptor
        recent: dict[int, Entry] = {}
        for back in range(slot - 1, max(slot - self.stream_settings.log_retained_slots, 0) - 1, -1):
            held = acceptor.accepted(back)
            if held is None:
                break
            recent[back] = held[1]
        return dict(sorted(recent.items()))

    def _install_state(self, state: FollowerState) -> None:
        """Becomes the follower the source was at its delivery point (module doc)."""
        assert state.shard == self.shard
        store = self.store
        for key, chain in state.chains:
            for value, deleted, vc, epoch, txn_id in chain:
                store.install(key, value, deleted, vc, epoch, txn_id)
        cluster_map = self.map
        if state.cluster_map is not None and (
            cluster_map is None
            or (state.cluster_map.epoch, state.cluster_map.fvw_epoch())
            > (cluster_map.epoch, cluster_map.fvw_epoch())
        ):
            cluster_map = self.map = state.cluster_map
        if cluster_map is not None:
            leader = cluster_map.leaders[self.shard]
            self.epoch = max(state.epoch, cluster_map.epoch)
        else:  # a far-behind follower of a cluster with no CM: the leader it copied from
            assert self._kept_acceptor and self._catch_up_from is not None
            leader = self._catch_up_from
            self.epoch = state.epoch
        self._catch_up_from = None
        if self._kept_acceptor:
            acceptor = self.stream.acceptor  # a retired leader's: it remembers all
        else:
            # No ballot this replica promised or accepted before it crashed is of a round
            # above the current epoch's (a leader of epoch e proposes in round e + 1).
            acceptor = Acceptor(
                self.shard, self.stream_settings, restarted_round=self.epoch + 1,
                leader=leader, promised=state.promised,
            )
            # --break rejoin-vote: vote in phase 1 at once (the simulator must catch it).
            acceptor.voting = "rejoin-vote" in self.breaks
        self.stream = StreamFollower(
            self.shard, self.stream_settings, first_slot=state.slot, acceptor=acceptor
        )
        self.stream.learner.leader = leader
        for slot, entry in sorted(state.recent.items()):
            acceptor.learned(slot, entry)
        self._recent = dict(state.recent)
        self.epochs = state.epochs
        self.fvw_applied = state.fvw_applied
        self.vw = state.vw
        self._speculative = state.speculative
        self._held_visibility = list(state.held_visibility)
        self.applied_slots = state.applied_slots
        self.applied_records = state.applied_records
        self.rejoining = False
        self._transfer_deadline = None
        self._transfer = StateDecoder()
        self._votes_from = None
        self.ANSWERS = _ANSWERS  # snapshot reads and state requests again
        if self._probe is not None:
            self._probe.watermark(self.address, dict(self.vw.items()))
        self._apply_fvws()

    def capture_state(self, *, with_recent: bool = True) -> FollowerState:
        """This follower's state at its delivery point, for a rejoining replica.
        ``with_recent=False``: without the recently delivered entries (its own snapshot on
        disk: its log holds them, see ``restore``)."""
        return FollowerState(
            shard=self.shard,
            slot=self.stream.learner.delivered_through,
            epoch=self.epoch,
            fvw_applied=self.fvw_applied,
            promised=self.stream.acceptor.promised,
            vw=self.vw,
            epochs=self.epochs.copy(),
            cluster_map=self.map,
            chains=StoreSnapshot(self.store, visible=dict(self.vw.items())),
            speculative={e: list(items) for e, items in self._speculative.items()},
            held_visibility=list(self._held_visibility),
            recent=dict(self._recent) if with_recent else {},
            applied_slots=self.applied_slots,
            applied_records=self.applied_records,
        )

    # ---- reads ---------------------------------------------------------------------------

    def snapshot(self, request: SnapshotRead) -> SnapshotReply:
        """Reads at this follower's vector watermark: only committed transactions."""
        vw = dict(self.vw.items())
        values = []
        for key in request.keys:
            version = self.store.latest_at_or_below(key, vw)
            values.append(None if version is None or version.deleted else version.value)
        scans = []
        for lo, hi, limit in request.scans:
            found: list[tuple[str, Any]] = []
            keys = self.store.keys_in_range(lo, hi)
            for key in reversed(keys) if limit < 0 else keys:
                version = self.store.latest_at_or_below(key, vw)
                if version is not None and not version.deleted:
                    found.append((key, version.value))
                    if len(found) >= abs(limit):
                        break
            scans.append(found)
        return SnapshotReply(request.req_id, self.shard, values, scans, self.vw, self.applied_slots)

    def visible_data(self) -> dict[str, Any]:
        """Every key's value at this follower's vector watermark (for convergence checks)."""
        vw = dict(self.vw.items())
        data = {}
        for key in self.store.all_keys():
            version = self.store.latest_at_or_below(key, vw)
            if version is not None and not version.deleted:
                data[key] = version.value
        return data


def leader_data(store: VersionedStore, watermark: dict[int, int]) -> dict[str, Any]:
    """A leader's committed data: each key's newest version at or below ``watermark``."""
    data = {}
    for key in store.all_keys():
        version = store.latest_at_or_below(key, watermark)
        if version is not None and not version.deleted:
            data[key] = version.value
    return data

