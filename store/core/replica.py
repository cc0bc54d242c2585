"""The shard-leader replica: storage and certification composed into one pure object.

This is the object the simulator drives and the server process adapts to real I/O
(DESIGN.md §7): it takes messages and timer firings with ``now_ns`` and hands back, through
``ready()``, the messages to send and the time it next wants to be woken. It does no I/O,
reads no clock and draws no random numbers.

Addresses are strings; ``peers[s]`` is the address of shard ``s``'s leader. Clients are any
other address: an ``Outcome`` goes back to the address a ``Submit`` came from.

Replication (DESIGN.md §4). With ``followers`` (this shard's replicas in the other regions)
the leader runs one Paxos stream (``store.core.paxos.StreamLeader``). Every install appends
the transaction's record to the stream; its counter then counts as settled for the
*appended* watermark (``self.watermark``), which the stream stamps on each entry it closes.
The shard's watermark in the sense of DESIGN.md §4 — every counter at or below it aborted or
accepted by a majority of regions — is the largest stamp over the stream's chosen prefix
(``durable_watermark``); that is what goes into the vector watermark, the piggybacked
replies and the gossip. Without followers an install is durable when applied.

Epochs (docs/recovery.md). The replica heartbeats to the configuration manager's members
(``cm_members``) and acts on the cluster map they push (``ConfigReply``): on a new epoch
it ends the old one (its participant aborts what still holds locks, its coordinator stops
certifying old transactions, its stream gets an INF marker), draws counters of the new
epoch, and reports the old epoch's finalized watermark in its heartbeats once the marker is
chosen; on an FVW it rolls back what is above it and answers what waited for it. A leader
the map no longer names stops serving (``retired``). A follower promoted by the map becomes
a leader through ``ShardLeader.take_over``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from store.core.coordinator import Certification, Coordinator
from store.core.epoch import EPOCH_SHIFT, StreamEpochs, counter_base
from store.core.errors import Status
from store.core.participant import Participant
from store.core.partition import Partitioner
from store.core.paxos import (
    DEFAULT_STREAM_SETTINGS,
    Acceptor,
    Ballot,
    Entry,
    PaxosMessage,
    Phase,
    StreamLeader,
    StreamSettings,
)
from store.core.ready import Ready
from store.core.settings import DEFAULT_SETTINGS, Settings
from store.core.storage import ROLLED_BACK, VersionedStore
from store.core.transfer import FollowerState, StateServer, StoreSnapshot
from store.core.txn import Procedures
from store.core.vclock import EMPTY, VectorClock
from store.core.watermark import (
    CLAIM_SLOTS,
    ClockWaits,
    CounterSource,
    ShardWatermark,
    VectorWatermark,
    WatermarkBoard,
    clock_watermark,
)
from store.protocol.cluster_map import ClusterMap
from store.protocol.messages import (
    LEADER,
    PEER_REPLIES,
    PEER_REQUESTS,
    PREPARE_REFUSED,
    READ_REFUSED,
    AbortReply,
    AbortRequest,
    ConfigReply,
    Gossip,
    Heartbeat,
    InstallReply,
    InstallRequest,
    LockReply,
    LockRequest,
    Message,
    Outcome,
    PrepareReply,
    PrepareRequest,
    ReadReply,
    ReadRequest,
    SoloReply,
    SoloRequest,
    StateRequest,
    Submit,
    ValidateReply,
    ValidateRequest,
    Write,
)


class Probe(Protocol):
    """What the simulator's oracles watch in a replica (production passes none): every
    certification at its coordinator, every install in its store, in order, its vector
    watermark after every step that raised it, and every counter value drawn (the shard's
    clock entry, the drawing unit). ``installed`` names, per write, the
    transaction whose version it overwrote in this store (0: none or preloaded)."""

    def certified(self, certification: Certification) -> None: ...

    def installed(
        self, shard: int, txn_id: int, writes: list[Write], vc: VectorClock,
        overwritten: list[int],
    ) -> None: ...

    def watermark(self, address: str, vw: Mapping[int, int]) -> None: ...

    def rolled_back(self, address: str, txn_id: int) -> None: ...

    def drew(self, clock: int, unit: int, counter: int) -> None: ...


@dataclass
class Takeover:
    """What a follower hands over when the cluster map makes it its shard's leader
    (docs/recovery.md, rule 4): its stream's acceptor and delivery point, the entries it
    still has (for lagging learners), a ballot round above any it promised, what it knows
    of the stream's epochs, its vector watermark, and its transactions not yet known
    committed."""

    acceptor: Acceptor
    first_slot: int
    known_chosen: dict[int, Entry]
    ballot_round: int
    epochs: StreamEpochs
    vw: dict[int, int]
    fvw_applied: int
    speculative: dict[int, list[tuple[int, VectorClock, list[str]]]]
    cluster_map: ClusterMap


class ShardLeader:
    # What it takes from peers: requests it answers within the handle call (the reply
    # rule of store.protocol.messages), and one-way messages.
    ANSWERS: tuple[type[Message], ...] = (*PEER_REQUESTS, StateRequest)
    ONE_WAY: tuple[type[Message], ...] = (Gossip, ConfigReply)
    # What it takes as replies to its own requests to peers.
    REPLIES: tuple[type[Message], ...] = PEER_REPLIES

    def __init__(
        self,
        shard: int,
        peers: Sequence[str],
        partitioner: Partitioner,
        procedures: Procedures,
        settings: Settings = DEFAULT_SETTINGS,
        *,
        breaks: frozenset[str] = frozenset(),
        probe: Probe | None = None,
        now_ns: int = 0,
        followers: Sequence[str] = (),
        stream_settings: StreamSettings = DEFAULT_STREAM_SETTINGS,
        ballot_round: int = 1,
        cm_members: Sequence[str] = (),
        store: VersionedStore | None = None,
        takeover: Takeover | None = None,
        counter: CounterSource | None = None,
        board: WatermarkBoard | None = None,
    ) -> None:
        assert 0 <= shard < len(peers)
        assert partitioner.workers == 1 or len(peers) == partitioner.shard_count
        self.shard = shard
        # With several workers per shard (``WorkerPartitioner``) ``shard`` is this worker's
        # unit: its address, stream and place in the cluster map; ``clock`` is the shard,
        # the entry of vector clocks and watermarks its counter values go to, drawn from
        # ``counter`` (shared with the shard's other workers) when there is one.
        self.workers = partitioner.workers
        self.clock = partitioner.clock_of(shard)
        self.address = peers[shard]
        self.peers = list(peers)
        self.settings = settings
        self._partitioner = partitioner
        self._procedures = procedures
        self._stream_settings = stream_settings
        self._breaks = breaks
        self.store = store if store is not None else VersionedStore()
        self.watermark = ShardWatermark(counter=counter)
        self.vw = VectorWatermark(self.workers)
        # Where the workers of this shard publish their claims for each other (beside the
        # shared counter), so that a fellow's transactions need not wait for the gossip.
        self._shared = counter if counter is not None and 1 < self.workers <= CLAIM_SLOTS else None
        self._worker = shard % self.workers
        # The fellows' units and their slots in the shared counter.
        first_unit = shard - self._worker
        self._fellow_slots = [
            (first_unit + worker, worker) for worker in range(self.workers) if worker != self._worker
        ]
        # Where the shard's workers share what each knows of every shard's watermark
        # (``WatermarkBoard``): a worker publishes its vector watermark after a step that
        # moved it and reads its fellows' before every step.
        # (With one shard there is no other shard's entry to share.)
        self._board = board if self.workers > 1 and len(peers) > self.workers else None
        self._board_known = [0] * (len(peers) // self.workers)  # what it has read there
        self._board_seen = [0] * self.workers  # each fellow's last sequence number read
        self._board_moves = -1  # vw.moves when this worker last published
        self._floor = 0  # the largest fellow worker's claim raise_floor was given
        # What waits for the vector watermark: the coordinator's certified transactions
        # and the participant's hidden writes; released whenever an entry rises (_learn).
        self.waits = ClockWaits(self.vw.entries)
        self.participant = Participant(
            self.clock, self.store, self.watermark, settings, self._on_installed, breaks,
            self.vw.entries, self.waits,
        )
        self.participant.floor_on_deps = self.workers > 1
        if self.workers > 1:
            self.participant.snapshots = False
        self.coordinator = Coordinator(
            shard,
            shard,
            partitioner,
            self.participant,
            procedures,
            settings,
            self.vw,
            self._send_to_shard,
            self._send_to_client,
            probe.certified if probe is not None else None,
            self.waits,
        )
        self._probe = probe
        if probe is not None:
            clock = self.clock
            self.watermark.on_draw = lambda counter: probe.drew(clock, shard, counter)
        self._probed_moves = -1
        self._outbox: list[tuple[str, Message]] = []
        self.coordinator.admits = self.accepts_more
        self.coordinator.may_acknowledge = self._may_acknowledge
        self.coordinator.commit_awaited = self._hurry_stream
        self.coordinator.durable_watermark = self.durable_watermark
        self._replicated = bool(followers)
        # A shard's first leader (no takeover) follows nobody's lease: no hold.
        self._follows_a_leader = takeover is not None
        self._now_ns = now_ns
        self.stream: StreamLeader | None = None
        self._stream_wake_at: int | None = None
        self._persist: list[object] = []  # the acceptor's records (Ready.persist)
        self._streamed_moves = -1  # vw.moves when the stream was last told the vector watermark
        self._durable_mark = 0
        if followers and takeover is None:
            self.stream = StreamLeader(
                shard, self.address, list(followers), Ballot(ballot_round, self.address),
                stream_settings, now_ns=now_ns,
            )
            self.stream.break_own_vote = "own-vote" in breaks
            self._pump_stream()
        self._gossip_at = now_ns + settings.gossip_interval_ns
        self._gossip_next = 0
        # When this leader last gossiped, and how far its vector watermark had moved then.
        self._gossiped_at = now_ns
        self._gossiped_moves = -1
        # Workers of a shard of several: whether this one has heard, in a reply, of another
        # shard's entry rising since it last gossiped to its fellows, and when that was.
        self._fellow_news = False
        self._fellow_gossiped_at = now_ns
        # Whether messages were received (``receive``) since the last step ended, and how
        # many messages were received into a step another had opened (batched).
        self._step_open = False
        self.joined_messages = 0
        self._gc_at = now_ns + settings.gc_interval_ns
        # Epochs (docs/recovery.md).
        self.epoch = 0
        self.cm_members = list(cm_members)
        self.map: ClusterMap | None = None
        self.retired = False
        self._retired_in = 0  # the epoch whose map named another leader
        self._successor: Any = None
        self.epochs = StreamEpochs()
        self.fvw_applied = -1
        self.rolled_back = 0
        # Installed transactions not yet known committed, by epoch: (txn_id, vc, keys). An
        # ended epoch's are rolled back by its FVW if above it.
        self._speculative: dict[int, list[tuple[int, VectorClock, list[str]]]] = {}
        self._heartbeat_at = now_ns
        # Recovery steps that --break switches off (the simulator must catch each).
        self._break_fvw = "fvw" in breaks
        self._break_inf = "no-inf" in breaks
        self._break_takeover = "takeover" in breaks
        self._break_lease = "lease" in breaks
        self._break_stamps = "stamps" in breaks
        if takeover is not None:
            self._take_over(now_ns, list(followers), stream_settings, takeover)
        self._handlers: dict[type, Callable[[int, str, Message], None]] = {
            Submit: self._on_submit,
            ReadRequest: self._on_read_request,
            ReadReply: self._on_read_reply,
            LockRequest: self._on_lock_request,
            LockReply: self._on_lock_reply,
            ValidateRequest: self._on_validate_request,
            ValidateReply: self._on_validate_reply,
            InstallRequest: self._on_install_request,
            InstallReply: self._on_install_reply,
            AbortRequest: self._on_abort_request,
            AbortReply: self._on_abort_reply,
            SoloRequest: self._on_solo_request,
            SoloReply: self._on_solo_reply,
            PrepareRequest: self._on_prepare_request,
            PrepareReply: self._on_prepare_reply,
            Gossip: self._on_gossip,
            ConfigReply: self._on_config,
            StateRequest: self._on_state_request,
        }
        self._state_server = StateServer(
            shard, settings.transfer_piece_bytes, 4 * settings.transfer_retry_ns
        )
        self.dropped_messages = 0
        self.reads_refused = 0  # reads of other shards' transactions served without a lease

    # ---- entry points --------------------------------------------------------------------

    def handle(self, now_ns: int, src: str, message: Message) -> None:
        """One message as one step: handled, and the step ended (``_after_step``)."""
        self.receive(now_ns, src, message)
        self._end_step()

    def receive(self, now_ns: int, src: str, message: Message) -> None:
        """A message of a batch received together (a batch of packets, an in-server
        generator's submissions): handled now, while the step stays open until ``ready``
        (or ``tick``) ends it, so that what a step ends with (``_after_step``: the stream
        pumped, the watermark refreshed and shared with the fellows, held transactions
        released) runs once per batch, as if its messages had arrived at one instant."""
        self._now_ns = self.coordinator.now_ns = now_ns
        if self._step_open:
            self.joined_messages += 1
        else:
            self._step_open = True
            if self._board is not None:
                self._read_board()
        if isinstance(message, PaxosMessage):
            if self.stream is not None and message.stream == self.shard:
                self.stream.handle(now_ns, src, message)
            else:
                self.dropped_messages += 1
            return
        handler = self._handlers.get(type(message))
        if handler is None:
            self.dropped_messages += 1
            return
        handler(now_ns, src, message)

    def _end_step(self) -> None:
        if self._step_open:
            self._step_open = False
            self._after_step()

    def _after_step(self) -> None:
        """What every input ends with: the stream's output carried out, the watermark
        refreshed, transactions held for it released."""
        self._pump_stream()
        self._refresh_watermark()
        if self._fellow_news:
            self._gossip_to_fellows()
        if self.coordinator.held:
            self.coordinator.release_held()
        if self._probe is not None:
            self._report_watermark()

    def tick(self, now_ns: int) -> None:
        self._end_step()
        self._now_ns = self.coordinator.now_ns = now_ns
        if self._board is not None:
            self._read_board()
        if self.stream is not None:
            self.stream.tick(now_ns)
        self.coordinator.on_timer(now_ns)
        self.participant.expire(now_ns)
        if now_ns >= self._next_gossip_at():
            self._gossip_at = now_ns + self.settings.gossip_interval_ns
            self._gossiped_at = now_ns
            self._gossiped_moves = self.vw.moves
            others = len(self.peers) - 1
            if others:
                # Shards' entries, not units' claims: each vouches for every worker of
                # its shard, and this shard's is fresh (its fellows' claims are read from
                # the shared counter at every step), so a peer hears of a shard from any of
                # its workers instead of waiting for every one.
                gossip = self._gossip_message()
                sent = []
                workers = self.workers
                shards = len(self.peers) // workers
                if self._board is not None and shards > 1:
                    # To shards, not units: a worker's fellows read what it hears from
                    # their board, so one worker of each shard in turn (its workers taken
                    # round robin) reaches the whole shard.
                    other_shards = shards - 1
                    steps = min(self.settings.gossip_fanout, other_shards)
                    for step in range(steps):
                        k = self._gossip_next + step
                        clock = (self.clock + 1 + k % other_shards) % shards
                        unit = clock * workers + (self._worker + k // other_shards) % workers
                        sent.append(unit)
                        self._outbox.append((self.peers[unit], gossip))
                    self._gossip_next = (self._gossip_next + steps) % (other_shards * workers)
                else:
                    for step in range(min(self.settings.gossip_fanout, others)):
                        shard = (self.shard + 1 + (self._gossip_next + step) % others) % len(self.peers)
                        sent.append(shard)
                        self._outbox.append((self.peers[shard], gossip))
                    self._gossip_next = (self._gossip_next + self.settings.gossip_fanout) % others
                if self.workers > 1:
                    # A worker's fellows always: the shard's watermark is the least of their
                    # claims, and an idle fellow's stream stamps its claim when woken.
                    first = self.clock * self.workers
                    for fellow in range(first, first + self.workers):
                        if fellow != self.shard and fellow not in sent:
                            self._outbox.append((self.peers[fellow], gossip))
                    self._fellow_news = False
                    self._fellow_gossiped_at = now_ns
        if self._fellow_news:
            self._gossip_to_fellows()
        self._pump_stream()
        if now_ns >= self._gc_at:
            self._gc_at = now_ns + self.settings.gc_interval_ns
            # While an ended epoch's FVW is unknown, only what was committed when it ended
            # may count as committed: a later epoch's watermark says nothing of it.
            committed = self.participant.committed_watermark(self.vw.entries)
            if not self._state_server.holding(now_ns):  # a transfer reads the versions
                self.store.collect_garbage(committed, self.settings.gc_keys_per_pass_max)
            self.participant.collect_stamps(committed, self.settings.gc_keys_per_pass_max)
            current = self._speculative.get(self.epoch)
            if current:
                vw = self.vw.entries
                self._speculative[self.epoch] = [e for e in current if not e[1].le_watermark(vw)]
        if self.cm_members and now_ns >= self._heartbeat_at:
            self._heartbeat_at = now_ns + self.settings.heartbeat_interval_ns
            self._heartbeat()
        self._refresh_watermark()
        if self.coordinator.holds_answers():
            self.coordinator.release_held()
        if self._probe is not None:
            self._report_watermark()

    def _next_gossip_at(self) -> int:
        """Every gossip_interval_ns while the vector watermark moves; a refresh every
        gossip_idle_interval_ns while it does not (an idle cluster sends almost nothing)."""
        if self.vw.moves != self._gossiped_moves:
            return self._gossip_at
        return max(self._gossip_at, self._gossiped_at + self.settings.gossip_idle_interval_ns)

    @property
    def has_successor(self) -> bool:
        """Whether the next ``ready()`` names a replica to host instead of this one."""
        return self._successor is not None

    def ready(self) -> Ready:
        self._end_step()
        messages, self._outbox = self._outbox, []
        wake_at = min(self._next_gossip_at(), self._gc_at)
        heartbeat_at = self._heartbeat_at if self.cm_members else None
        if self._fellow_news:
            wake_at = min(
                wake_at, self._fellow_gossiped_at + self.settings.fellow_gossip_spacing_ns
            )
        for deadline in (
            self.coordinator.next_deadline(), self._stream_wake_at, heartbeat_at,
            self.participant.next_expiry(), self._hold_ends_at(),
        ):
            if deadline is not None and deadline < wake_at:
                wake_at = deadline
        successor, self._successor = self._successor, None
        persist, self._persist = self._persist, []
        stream = self.stream
        if stream is None:
            return Ready(messages, wake_at, successor, persist)
        persist += stream.acceptor.take_persist()
        return Ready(messages, wake_at, successor, persist, stream.take_hold(), stream.seal_votes())

    def synced(self, now_ns: int) -> None:
        """The records of a Ready that wanted it are on disk (the stream's own votes in it
        count now)."""
        self._now_ns = self.coordinator.now_ns = now_ns
        if self.stream is None:
            return  # retired: the votes went with the stream
        self.stream.synced(now_ns)
        self._after_step()

    # ---- leases (docs/recovery.md "Stale reads") -------------------------------------------

    def _lease_covers(self, read_at_ns: int) -> bool:
        """Whether a read made at ``read_at_ns`` was made under this leader's lease: less
        than ``leader_lease_ns`` after it proposed an entry a majority then accepted."""
        if not self._replicated or self._break_lease:
            return True
        confirmed = self.stream.confirmed_sent_ns if self.stream is not None else None
        return confirmed is not None and read_at_ns < confirmed + self.settings.leader_lease_ns

    def _new_leader_hold_ns(self) -> int | None:
        """Until when this leader, new in its ballot, tells no client COMMITTED: another
        leader's lease may run until then."""
        if not self._replicated or self._break_lease:
            return None
        since = self.stream.leading_since_ns if self.stream is not None else None
        if since is None or not self._follows_a_leader:
            return since
        return since + self.settings.leader_lease_ns * 11 // 10

    def _may_acknowledge(self, executed_at_ns: int) -> bool:
        if not self._replicated or self._break_lease:
            return True
        hold = self._new_leader_hold_ns()
        if hold is None or self._now_ns < hold:
            return False
        return self._lease_covers(executed_at_ns)

    def _hold_ends_at(self) -> int | None:
        """A wake-up for held answers that only time releases."""
        if not self.coordinator.holds_answers():
            return None
        hold = self._new_leader_hold_ns()
        return hold if hold is not None and hold > self._now_ns else None

    def durable_watermark(self) -> int:
        """This shard's watermark (DESIGN.md §4): with replication, the stream's."""
        if self.stream is None:
            return self.watermark.watermark
        return self._durable_mark

    def reply_watermark(self) -> int:
        """The watermark a reply to another leader carries. One worker: this shard's. Several:
        the shard's entry as this worker knows it (the minimum of its own claim and its
        fellows' claims, read from the shared counter at every step), which vouches for every
        worker of the shard (``_learn_reply``): a coordinator hearing from one worker of a
        shard then knows the shard's watermark as freshly as the worker does, instead of
        waiting for the other workers' gossip to raise their claims too."""
        own = self.durable_watermark()
        if self.workers == 1:
            return own
        if self._shared is not None:
            # The fellows' claims as they stand now, not as at this worker's last step: one
            # may have settled since what holds the shard's entry below a coordinator's
            # transaction, which would otherwise learn it by gossip only.
            self._share_claims(own)
        # The shard's entry is the least of its units' claims, this worker's as last learned
        # (at most ``own``) among them.
        entry = min(own, self.vw[self.clock])
        if entry >> EPOCH_SHIFT < self.epoch:
            # Of an earlier epoch than this worker's, the entry may rest on a claim of this
            # one (its own first stamp after an epoch change vouches for the rollback above
            # the ended epoch's FVW), which a coordinator still in the earlier epoch must not
            # take (VectorWatermark.learn_entries): nothing, until the shard's units all
            # claim in this epoch.
            return 0
        return entry

    def accepts_more(self) -> bool:
        """False while the replication stream holds too many records not yet in a slot."""
        return self.stream is None or self.stream.can_append()

    def preload(self, key: str, value: object) -> None:
        """Loads a key before the cluster serves (an initial, durable version at clock 0)."""
        self.store.install(key, value, False, EMPTY, 0, 0)

    # ---- plumbing ------------------------------------------------------------------------

    def _send_to_shard(self, shard: int, message: Message) -> None:
        self._outbox.append((self.peers[shard], message))

    def _send_to_client(self, address: str, outcome: Outcome) -> None:
        self._outbox.append((address, outcome))

    def _report_watermark(self) -> None:
        assert self._probe is not None
        if self.vw.moves != self._probed_moves:
            self._probed_moves = self.vw.moves
            self._probe.watermark(self.address, self.vw.entries)

    def _on_installed(self, txn_id: int, counter: int, writes: list[Write], vc: VectorClock) -> None:
        if self._probe is not None:
            self._probe.installed(self.shard, txn_id, writes, vc, self._overwritten(writes))
        if self.stream is not None:
            keys = [key for key, _, _ in writes]
            self._speculative.setdefault(self.epoch, []).append((txn_id, vc, keys))
        if self.stream is not None:
            record = [txn_id, [[key, value, deleted] for key, value, deleted in writes], vc.to_wire()]
            self.stream.append(self._now_ns, record, counter)
        # Settled for the appended watermark; durable once the stream's entry is chosen
        # (without followers, at once: the coordinator may then answer COMMITTED in the
        # same step).
        self.watermark.settle(counter)
        if self.stream is not None:
            self.stream.advance_watermark(self.watermark.watermark)
            if self.workers > 1:
                # Wakes the fellows soon (a gossip push): an idle one's claim has risen
                # with this draw, and this transaction commits once its stream carries it.
                self._push_gossip()
        else:
            mark = self.watermark.watermark
            self._learn(self.shard, mark)
            if self.workers > 1:
                # Fresh claims of the fellows: the coordinator may answer COMMITTED in this
                # step if they cover the transaction's counter.
                self._share_claims(mark)

    def _hurry_stream(self, now_ns: int) -> None:
        """A client waits for the commit of a transaction whose writes are in the stream's
        open batch (or already closed ones): the batch closes sooner (StreamLeader.hurry)."""
        if self.stream is not None:
            self.stream.hurry(now_ns)

    def _pump_stream(self) -> None:
        """Carries out the stream's Ready: messages out, chosen entries into the watermark."""
        stream = self.stream
        if stream is None:
            return
        # Aborts settle counters too: the stream learns the appended watermark either way.
        stream.advance_watermark(self.watermark.watermark)
        if self.vw.moves != self._streamed_moves:  # a clock of it only when it has moved
            self._streamed_moves = self.vw.moves
            stream.advance_vector_watermark(VectorClock(self.vw.entries))
        ready = stream.ready()
        self._persist.extend(ready.persist)
        self._outbox.extend(ready.messages)
        mark = self._durable_mark
        for _, entry in ready.chosen:
            if not self.epochs.add(entry):
                continue  # a marker, or void: its epoch already ended on this stream
            # A stamp speaks for its entry's epoch only (an idle worker's claim is capped to
            # its epoch: ShardWatermark.watermark); the epoch's finalized watermark is below
            # the next epoch's base.
            assert entry.watermark < counter_base(entry.epoch + 1), (
                f"stream {self.shard}: a stamp {entry.watermark} past epoch {entry.epoch}"
            )
            if entry.epoch < self.epoch:
                # Chosen by a leader before us (a takeover re-proposed it): apply it.
                self._replay_entry(entry)
            # A watermark counts only once the shard has entered the entry's epoch: below
            # that base it would vouch for counters of an epoch that has ended.
            if entry.watermark >= counter_base(entry.epoch) and entry.watermark > self._durable_mark:
                self._durable_mark = entry.watermark
        if self._durable_mark > mark:
            self._push_gossip()  # to the peers at once
        if not self.participant.certifying and self.epochs.ended >= self.epoch - 1:
            self.participant.certifying = True  # the takeover is complete: all is replayed
        if ready.chosen:
            forget = stream.chosen_through - stream.settings.log_retained_slots
            if forget > stream.acceptor.forgotten_before:
                stream.forget_before(forget)
                stream.acceptor.forget_before(forget)
        self._stream_wake_at = ready.wake_at

    def _gossip_to_fellows(self) -> None:
        """What this worker heard in replies of other shards' entries, to its fellows at
        once (at most every ``Settings.fellow_gossip_spacing_ns``). A shard's load is spread
        over its workers, so each hears from other shards 1/W as often as a single leader
        would; without this a fellow's transaction waiting on an entry this worker already
        knows would wait for the next round of gossip."""
        now_ns = self._now_ns
        if now_ns < self._fellow_gossiped_at + self.settings.fellow_gossip_spacing_ns:
            return  # the next tick sends it (ready's wake_at)
        self._fellow_news = False
        self._fellow_gossiped_at = now_ns
        gossip = self._gossip_message()
        first = self.clock * self.workers
        for fellow in range(first, first + self.workers):
            if fellow != self.shard:
                self._outbox.append((self.peers[fellow], gossip))

    def _gossip_message(self) -> Gossip:
        """What this replica knows of every shard's entry, its own claim (workers > 1) and
        its epoch."""
        known = self.vw
        claim = known.claims.get(self.shard, 0) if self.workers > 1 else 0
        return Gossip(self.shard, dict(known.entries), claim, self.epoch)

    def _push_gossip(self) -> None:
        """Gossip at once, but not more often than Settings.gossip_push_spacing_ns (also
        when the vector watermark has not moved since the last: a fellow worker is woken)."""
        soon = max(self._now_ns, self._gossiped_at + self.settings.gossip_push_spacing_ns)
        self._gossip_at = min(self._gossip_at, soon)
        self._gossiped_moves = -1

    def _overwritten(self, writes: list[Write]) -> list[int]:
        """For the probe: the writer of the version each write overwrote here."""
        found = []
        for key, _, _ in writes:
            previous = 0
            for version in reversed(self.store.chain(key)[:-1]):
                if version.state != ROLLED_BACK:
                    previous = version.txn_id
                    break
            found.append(previous)
        return found

    def _replay_entry(self, entry: Any) -> None:
        # An entry of an epoch whose FVW is already applied keeps only what the FVW keeps.
        fvw = None
        if self.map is not None and entry.epoch <= self.fvw_applied:
            unit_fvw = self.map.fvw.get(entry.epoch)
            if unit_fvw is not None:
                fvw = clock_watermark(unit_fvw, self.workers)
        for record in entry.records:
            if fvw is not None and not VectorClock.from_wire(record[2]).le_watermark(fvw):
                continue
            replayed = self.store.replay(record, self.clock, entry.epoch)
            if replayed is None:
                continue
            txn_id, vc, keys = replayed
            if fvw is None:
                self._speculative.setdefault(entry.epoch, []).append((txn_id, vc, keys))
            self.participant.remember_installed(txn_id, vc)

    # ---- epochs (docs/recovery.md) -------------------------------------------------------

    def _heartbeat(self) -> None:
        stream = self.stream
        delivered = stream.chosen_through if stream is not None else 0
        known = self.map.fvw if self.map is not None else {}
        finalized = [
            (epoch, mark) for epoch, mark in sorted(self.epochs.finalized.items())
            if epoch not in known
        ]
        heartbeat = Heartbeat(
            self.address, self.shard, LEADER, self.epoch, delivered, self.fvw_applied, finalized
        )
        for member in self.cm_members:
            self._outbox.append((member, heartbeat))

    def _on_config(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, ConfigReply)
        cluster_map = message.cluster_map
        if cluster_map.shards != len(self.peers):
            self.dropped_messages += 1
            return
        if self.map is None or (cluster_map.epoch, cluster_map.fvw_epoch()) > (
            self.map.epoch, self.map.fvw_epoch()
        ):
            self.map = cluster_map
        if cluster_map.epoch > self.epoch:
            self._enter_epoch(now_ns, cluster_map)
        self._apply_fvws()

    def _take_over(
        self, now_ns: int, followers: list[str], stream_settings: StreamSettings,
        takeover: Takeover,
    ) -> None:
        """Starts as the leader a follower was promoted to (see ``Takeover``)."""
        cluster_map = takeover.cluster_map
        epoch = cluster_map.epoch
        self.map = cluster_map
        self.epoch = epoch
        self.epochs = takeover.epochs
        self.fvw_applied = takeover.fvw_applied
        self._speculative = takeover.speculative
        if self.workers == 1:
            self.vw.entries.update(takeover.vw)
        else:
            self.vw.learn_clocks(takeover.vw)
        self.vw.enter_epoch(epoch)
        self._durable_mark = takeover.vw.get(self.clock, 0)
        self.participant.begin_epoch(epoch, takeover.vw)
        if not self._break_stamps:
            # Every transaction of an ended epoch that survives is at or below its shards'
            # finalized watermarks, which the base of this epoch dominates on every shard.
            base = counter_base(epoch)
            self.participant.readers_unknown(
                VectorClock({shard: base for shard in range(len(self.peers) // self.workers)})
            )
        for resolved in range(takeover.fvw_applied + 1):
            self.participant.end_doubt(resolved, {})
        self.coordinator.begin_epoch(now_ns, epoch)
        self.watermark.start_epoch(epoch)
        # Phase 1 over what the old leader may have had accepted; holes become no-ops of the
        # epoch being ended, which INF then closes; new records are of the new epoch.
        stream = StreamLeader(
            self.shard, self.address, followers, Ballot(takeover.ballot_round, self.address),
            stream_settings, now_ns=now_ns, acceptor=takeover.acceptor,
            first_slot=takeover.first_slot, known_chosen=takeover.known_chosen,
            epoch=epoch - 1, skip_phase1=self._break_takeover,
        )
        stream.break_own_vote = "own-vote" in self._breaks
        stream.append_inf(now_ns)
        stream.set_epoch(epoch)
        self.stream = stream
        self._streamed_moves = -1
        self.participant.certifying = False  # until the old epoch has ended on the stream
        self._pump_stream()
        self._apply_fvws()

    def _enter_epoch(self, now_ns: int, cluster_map: ClusterMap) -> None:
        epoch = cluster_map.epoch
        self.peers[:] = cluster_map.leaders
        abandoned = self.participant.begin_epoch(epoch, self.vw.entries)
        self.coordinator.begin_epoch(now_ns, epoch)
        stream = self.stream
        if stream is not None and stream.phase is not Phase.DEPOSED:
            if not self._break_inf:
                # Closes the open batch first: all of the old epoch; ends every epoch before
                # the new one, also those this shard skipped (a map two epochs ahead).
                stream.append_inf(now_ns, epoch - 1)
            stream.set_epoch(epoch)
        # The old epoch has ended on the stream before these settle: they stay unsettled in
        # it (its finalized watermark stops below them), and no longer hold the new one back.
        for counter in abandoned:
            self.watermark.settle(counter)
        self.watermark.start_epoch(epoch)
        self.epoch = epoch
        if self.vw.enter_epoch(epoch):
            self.waits.release()
        if cluster_map.leaders[self.shard] != self.address and not self.retired:
            self.retired = True
            self._retired_in = epoch
            if self.workers > 1:
                # Its unit has another leader now, counting on its own: what the shared
                # counter does from here on says nothing of that leader's draws, so this one
                # neither follows it into its claims nor publishes them.
                self._shared = None
                self.watermark.detach(counter_base(epoch))

    def _apply_fvws(self) -> None:
        cluster_map = self.map
        if cluster_map is None:
            return
        for epoch in sorted(cluster_map.fvw):
            if epoch <= self.fvw_applied or epoch >= self.epoch:
                continue
            fvw = clock_watermark(cluster_map.fvw[epoch], self.workers)
            if self._break_fvw:
                fvw = self.participant.frozen(epoch) or fvw  # the last known watermark
            for txn_id, vc, keys in self._speculative.pop(epoch, []):
                if not vc.le_watermark(fvw):
                    self._roll_back(txn_id, keys)
            for txn_id, keys in self.participant.end_doubt(epoch, fvw):
                self._roll_back(txn_id, keys)
                self.participant.release_hidden(txn_id)
            self.coordinator.resolve_epoch(epoch, fvw)
            self.fvw_applied = epoch
        if self.retired and self.fvw_applied >= self._retired_in - 1 and self.stream is not None:
            self._become_follower()

    def _become_follower(self) -> None:
        """A retired leader whose last epoch is settled (its clients answered by the FVW)
        becomes a follower of its shard again: it keeps its acceptor, which remembers all,
        and copies the rest of a follower's state (``ShardFollower``, rejoining)."""
        from store.core.follower import ShardFollower  # the follower module builds on this one

        assert self.stream is not None and self._successor is None
        self._successor = ShardFollower(
            self.shard, self.address, self._stream_settings, now_ns=self._now_ns,
            probe=self._probe, cm_members=self.cm_members, settings=self.settings,
            partitioner=self._partitioner, procedures=self._procedures, breaks=self._breaks,
            rejoining=True, acceptor=self.stream.acceptor,
        )
        self.stream = None  # the successor serves the stream from now on

    def _roll_back(self, txn_id: int, keys: list[str]) -> None:
        for key in keys:
            self.store.roll_back(key, txn_id)
        self.rolled_back += 1
        if self._probe is not None:
            self._probe.rolled_back(self.address, txn_id)

    def _refresh_watermark(self) -> None:
        mark = self.durable_watermark()
        if mark > self.vw.claims.get(self.shard, 0):
            self._learn(self.shard, mark)
        if self.workers > 1:
            self._share_claims(mark)
            board = self._board
            if board is not None and self.vw.moves != self._board_moves:
                self._board_moves = self.vw.moves
                # Tagged with the later of its two epochs: a fellow in an earlier epoch
                # takes nothing from it (the rule of gossip, VectorWatermark.learn_entries).
                board.publish(self._worker, max(self.epoch, self.vw.epoch), self.vw.entries)

    def _read_board(self) -> None:
        """What this worker's fellows know of other shards' watermarks, from the board: as
        gossip from each of them would tell it, at once and without a message. Not its own
        shard's entry: the fellows' claims come from the shared counter, and a fellow's entry
        rests on its own claim, which after a failover of its unit (it retired; the unit's
        new leader counts alone elsewhere) says nothing of that unit's draws (seed 386 of
        the worker faults in tests/sim/test_workers.py committed a transaction before it was
        durable)."""
        board = self._board
        assert board is not None
        epoch = self.vw.epoch
        known, seen = self._board_known, self._board_seen
        own = self.clock
        moved = False
        for worker in range(self.workers):
            if worker == self._worker:
                continue
            got = board.pull(worker, epoch, known, seen[worker])
            if got is not None:
                seen[worker], raised = got
                entries = {shard: mark for shard, mark in raised if shard != own}
                if entries:
                    moved |= self.vw.learn_entries(entries, epoch)
        if moved:
            self.waits.release()

    def _share_claims(self, mark: int) -> None:
        """A worker of a shard of several: publishes its claim ``mark`` for its fellows and
        learns theirs (``_shared``), and draws above the largest claim of theirs."""
        shared = self._shared
        if shared is not None:
            # With replication a claim is the stream's chosen stamp; without, it is durable
            # once made (and an idle worker's is the live counter).
            self.watermark.share_claim(self._worker, mark if self._replicated else None)
            claims = self.vw.claims
            for unit, slot in self._fellow_slots:
                claim = shared.claim(slot)
                if claim > claims.get(unit, 0):  # else learn would take nothing (hot path)
                    self._learn(unit, claim)
        # Also with a shared counter: a fellow a failover promoted elsewhere counts alone,
        # and its claims can pass this counter.
        top = self.vw.shard_top(self.clock)
        if top > self._floor:
            self._floor = top
            self.watermark.raise_floor(top)

    def _learn(self, unit: int, watermark: int) -> None:
        """A unit's claim (one worker: its shard's watermark)."""
        if self.vw.learn(unit, watermark):
            self.waits.release(unit // self.workers)

    def _learn_reply(self, unit: int, watermark: int) -> None:
        """What a reply from ``unit`` carries (``reply_watermark``): its shard's watermark."""
        if self.workers == 1:
            self._learn(unit, watermark)
            return
        shard = unit // self.workers
        if self.vw.learn_clocks({shard: watermark}):
            self.waits.release(shard)
            if shard != self.clock and not self._replicated and self._board is None:
                # (With followers a worker that installs pushes gossip, to its fellows too.)
                self._fellow_news = True

    # ---- handlers ------------------------------------------------------------------------

    def _on_submit(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, Submit)
        if self.retired and not self.coordinator.knows(message.client_id, message.seq):
            leader = self.peers[self.shard]
            outcome = Outcome(
                message.seq, Status.UNAVAILABLE, None, EMPTY,
                f"not the leader of shard {self.shard} in epoch {self.epoch} ({leader} is)",
            )
            self._outbox.append((src, outcome))
            return
        self.coordinator.submit(now_ns, src, message)

    def _on_read_request(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, ReadRequest)
        if not self._lease_covers(now_ns):
            # A leader without a lease may have been replaced: its data may be stale. The
            # coordinator asks again, and gives up (aborts) if this goes on.
            self.reads_refused += 1
            refused = ReadReply(message.txn_id, READ_REFUSED, self.shard, [], [], 0)
            self._outbox.append((src, refused))
            return
        participant = self.participant
        self._outbox.append(
            (
                src,
                ReadReply(
                    message.txn_id,
                    message.req_no,
                    self.shard,
                    participant.read(message.keys, sparse=True),
                    participant.scan_many(message.scans, sparse=True),
                    self.reply_watermark(),
                ),
            )
        )

    def _on_read_reply(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, ReadReply)
        self._learn_reply(message.shard, message.watermark)
        self.coordinator.on_read_reply(now_ns, message)

    def _on_lock_request(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, LockRequest)
        ok, counter, deps = self.participant.lock(
            message.txn_id, message.keys, message.epoch, now_ns
        )
        reply = LockReply(message.txn_id, self.shard, ok, counter, deps, self.reply_watermark())
        self._outbox.append((src, reply))

    def _on_lock_reply(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, LockReply)
        self._learn_reply(message.shard, message.watermark)
        self.coordinator.on_lock_reply(now_ns, message)

    def _on_validate_request(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, ValidateRequest)
        ok = self.participant.validate(
            message.txn_id, message.reads, message.scans, message.vc, message.epoch
        )
        reply = ValidateReply(message.txn_id, self.shard, ok, self.reply_watermark())
        self._outbox.append((src, reply))

    def _on_validate_reply(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, ValidateReply)
        self._learn_reply(message.shard, message.watermark)
        self.coordinator.on_validate_reply(now_ns, message)

    def _on_install_request(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, InstallRequest)
        # The coordinator's entries, of its epoch (a later one than this worker's, maybe).
        if self.vw.learn_entries(dict(message.durable.items()), message.epoch):
            self.waits.release()
        self.participant.install(message.txn_id, message.writes, message.vc, message.epoch)
        if message.hurry:
            self._hurry_stream(now_ns)
        reply = InstallReply(message.txn_id, self.shard, self.reply_watermark())
        self._outbox.append((src, reply))

    def _on_install_reply(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, InstallReply)
        self._learn_reply(message.shard, message.watermark)
        self.coordinator.on_install_reply(message)

    def _on_abort_request(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, AbortRequest)
        self.participant.abort(message.txn_id)
        self._outbox.append((src, AbortReply(message.txn_id, self.shard)))

    def _on_abort_reply(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, AbortReply)
        self.coordinator.on_abort_reply(message)

    def _on_solo_request(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, SoloRequest)
        clocks = self.participant.certify_solo(
            message.txn_id, message.reads, message.scans, message.writes, message.read_vc,
            message.epoch,
        )
        if clocks is None:
            reply = SoloReply(message.txn_id, self.shard, False, EMPTY, self.reply_watermark(), EMPTY)
        else:
            if message.hurry and message.writes:
                self._hurry_stream(now_ns)  # as for an InstallRequest
            vc, full = clocks
            durable = VectorClock({s: c for s, c in full.items() if vc[s] != c})
            reply = SoloReply(message.txn_id, self.shard, True, vc, self.reply_watermark(), durable)
        self._outbox.append((src, reply))

    def _on_prepare_request(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, PrepareRequest)
        if message.reads and not self._lease_covers(now_ns):
            # As for a ReadRequest: no lease, no reads for another shard's transaction.
            self.reads_refused += 1
            refused = PrepareReply(message.txn_id, self.shard, PREPARE_REFUSED, 0, [], EMPTY, 0)
            self._outbox.append((src, refused))
            return
        status, counter, items, deps = self.participant.prepare(
            message.txn_id, message.reads, message.locks, message.base, message.epoch
        )
        reply = PrepareReply(
            message.txn_id, self.shard, status, counter, items, deps, self.reply_watermark()
        )
        self._outbox.append((src, reply))

    def _on_prepare_reply(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, PrepareReply)
        if message.status != PREPARE_REFUSED:
            self._learn_reply(message.shard, message.watermark)
        self.coordinator.on_prepare_reply(now_ns, message)

    def _on_solo_reply(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, SoloReply)
        self._learn_reply(message.shard, message.watermark)
        if self.vw.learn_clocks(dict(message.durable.items())):
            self.waits.release()
        self.coordinator.on_solo_reply(now_ns, message)

    def _on_state_request(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, StateRequest)
        serving = (
            self.stream is not None and not self.retired and self.participant.certifying
            and self.stream.phase is Phase.LEADING
        )
        capture = self.capture_state if serving else None
        self._outbox.append((src, self._state_server.serve(message, capture, now_ns)))

    def capture_state(self) -> FollowerState:
        """What a follower of this shard would hold at the stream's chosen point, for a
        rejoining replica (``store.core.transfer``): the store also holds what was installed
        beyond that point; the copy's replay skips it (Thomas's write rule), or the FVW of
        its epoch rolls it back, as at any follower."""
        stream = self.stream
        assert stream is not None
        chosen = stream.chosen_through
        return FollowerState(
            shard=self.shard,
            slot=chosen,
            epoch=self.epoch,
            fvw_applied=self.fvw_applied,
            promised=stream.acceptor.promised,
            vw=VectorClock(self.vw.entries),
            epochs=self.epochs.copy(),
            cluster_map=self.map,
            chains=StoreSnapshot(self.store),
            speculative={e: list(items) for e, items in self._speculative.items()},
            held_visibility=[],
            recent=stream.chosen_log(),
            applied_slots=chosen,
            applied_records=0,
        )

    def _on_gossip(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, Gossip)
        moved = self.vw.learn_entries(message.watermarks, message.epoch)
        if message.claim and self.workers > 1:
            moved |= self.vw.learn(message.shard, message.claim)
        if moved:
            self.waits.release()
        stream = self.stream
        if stream is not None and message.shard != self.shard and message.shard // self.workers == self.clock:
            # A fellow worker (it pushes gossip when it certifies): its transactions commit
            # once this stream's stamp covers them, and this worker's claim has risen with
            # the counter it drew. The stream proposes it soon even if idle.
            stream.want(self.watermark.watermark)
