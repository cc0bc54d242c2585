"""The leader (distinguished proposer) of a Paxos stream: Multi-Paxos with batching.

Theory of operation ("Paxos Made Simple" §3, "Implementing a State Machine"):

* **Phase 1, once per ballot.** A leader starts by sending ``Prepare(ballot, first_slot)``
  to every acceptor, its own region's acceptor included (that one is called directly, not
  over the network). Each ``Promise`` reports what the acceptor accepted from
  ``first_slot`` on. Once a majority of regions has promised and reported everything, the
  leader owns every slot from ``first_slot``: it re-proposes, slot by slot, the value
  accepted at the highest ballot, fills every hole below the highest reported slot with a
  **no-op** (DESIGN.md §5 step 2), and then proposes new entries after them. A fresh
  stream runs the same phase 1 and simply finds nothing.
* **Phase 2, pipelined.** Certified records handed to ``append`` collect in an open batch,
  closed into an entry when it holds ``batch_size_max`` records or when its delay is up:
  ``batch_delay_ns`` after the previous batch closed by delay, or at the end of the step
  that opened it on a stream quiet for that long (later if the window is full: see
  ``_pump``). So a busy stream sends an entry every ``batch_delay_ns`` and a quiet one
  does not make its first record wait for it. When a client waits for the commit of a
  record in the open batch (``hurry``), the batch closes at the first multiple of
  ``batch_delay_awaited_ns`` after the previous close instead, if that is sooner: every
  stream on the same clock closes its hurried batches at the same instants. Entries wait
  in a queue and take the next slot when fewer than ``slots_in_flight_max`` slots are
  proposed and not yet chosen. A slot is **chosen** when
  a majority of regions accepted it; chosen slots are reported in slot order through
  ``ready().chosen``. An Accept a region has not acknowledged is sent again every
  ``accept_retry_ns``.
* **Heartbeats.** When nothing has been proposed for ``heartbeat_interval_ns`` and the
  stream watermark or the vector watermark has risen since the last entry, the leader
  proposes an empty entry carrying them, so an idle stream's followers keep learning both
  the commit index and the watermarks. With nothing new to carry it waits
  ``heartbeat_idle_interval_ns`` instead: that heartbeat only keeps followers and the lease
  evidence below fresh. When someone waits for a stamp (``want``: a fellow worker of the
  shard, whose transactions commit once this stream's stamp covers them) the wait is
  ``heartbeat_wanted_interval_ns``.
* **Commit index.** Every Accept carries ``chosen_through`` (all slots below it are chosen);
  when it moves and no Accept carries it within ``commit_announce_delay_ns``, a ``Commit``
  announces it. Learners also ``Fetch`` chosen entries they miss; the leader answers from
  its log (``forget_before`` bounds it).
* **Deposition.** A ``Reject`` naming a higher ballot, or its own acceptor promising one,
  deposes the leader: it proposes nothing more and says so in ``deposed_by``. What it had
  not seen chosen is for recovery to settle (DESIGN.md §5); the stream's next leader will
  find whatever a majority accepted.
* **Lease evidence.** ``leading_since_ns`` (when phase 1 ended) and ``confirmed_sent_ns``
  (the latest proposal time of an entry a majority accepted at this ballot): the replica's
  leader lease is built on them (docs/recovery.md, rule 8).
* **INF.** ``append_inf`` closes the open batch and queues an INF marker: the end of an
  epoch on this stream (DESIGN.md §5 step 3). Appends after it belong to the next epoch.

Own votes. This region's acceptor is called directly. Its records (``ready().persist``) must
be on disk before anything that counts on them leaves the process. By default its vote
counts at once, and ``take_hold()`` says the messages must wait for the sync. With
``votes_after_sync`` (set by a host with a disk) the vote counts only when the host calls
``synced`` for the group of votes ``seal_votes`` closed with that ready(): a slot is chosen
by votes that are all on disk, so nothing the leader does waits for its own disk but the
choice itself (its Accepts go out at once).

The leader's own region is one acceptor among ``len(peers) + 1``; a majority of regions is
``(len(peers) + 1) // 2 + 1``.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from store.core.metrics import LatencyHistogram
from store.core.paxos.acceptor import Acceptor
from store.core.paxos.messages import (
    Accept,
    Accepted,
    Chosen,
    Commit,
    Fetch,
    PaxosMessage,
    Prepare,
    Promise,
    Reject,
)
from store.core.paxos.types import (
    DEFAULT_STREAM_SETTINGS,
    Ballot,
    Entry,
    EntryKind,
    StreamReady,
    StreamSettings,
)
from store.core.vclock import EMPTY, VectorClock


class Phase(enum.Enum):
    PREPARING = "preparing"  # phase 1 running; appends are held
    LEADING = "leading"  # proposing
    DEPOSED = "deposed"  # a higher ballot exists; proposes nothing more


class StreamLeader:
    def __init__(
        self,
        stream: int,
        address: str,
        peers: Sequence[str],
        ballot: Ballot,
        settings: StreamSettings = DEFAULT_STREAM_SETTINGS,
        *,
        now_ns: int = 0,
        acceptor: Acceptor | None = None,
        first_slot: int = 0,
        known_chosen: Mapping[int, Entry] | None = None,
        counters_in_order: bool = False,
        epoch: int = 0,
        skip_phase1: bool = False,
    ) -> None:
        """A leader of ``stream`` at ``address``; ``peers`` are the acceptors of the other
        regions. ``acceptor`` is this region's acceptor (a fresh one by default; on takeover,
        the one this replica already ran as a follower). Phase 1 runs over every slot from
        ``first_slot``; the caller vouches that every slot below it is chosen, and
        ``known_chosen`` gives the ones it knows, so lagging learners can fetch them.

        ``counters_in_order``: the replica appends records in increasing counter order and
        never draws a counter for this stream that it appends later out of order (Mako's
        assumption), so each appended counter is also the stream watermark. Otherwise the
        replica raises the watermark itself with ``advance_watermark``.

        ``epoch``: the epoch entries are stamped with (``set_epoch`` moves it on); a leader
        taking a stream over fills holes with no-ops of the epoch it is ending.

        ``skip_phase1`` is for showing that the simulator catches it (``--break takeover``):
        the leader proposes from ``first_slot`` without asking anyone what was accepted.
        """
        assert ballot.leader == address, "a ballot names its leader"
        assert address not in peers
        assert len(set(peers)) == len(peers)
        self.stream = stream
        self.address = address
        self.peers = list(peers)
        self.ballot = ballot
        self.settings = settings
        self.quorum = (len(self.peers) + 1) // 2 + 1
        self.acceptor = acceptor if acceptor is not None else Acceptor(stream, settings)
        # Durability (module doc, "Own votes"): with votes_after_sync (the host has a disk),
        # this region's vote on a slot counts only once the host says its record is synced;
        # else it counts at once, and the records it left must hold the messages back.
        self.votes_after_sync = False
        self.break_own_vote = False  # --break own-vote: count it at once all the same
        self._votes_unsealed: list[Accepted] = []
        self._vote_groups: deque[list[Accepted]] = deque()
        self._hold = False  # records whose effect counted at once since take_hold()
        self.counters_in_order = counters_in_order
        self.epoch = epoch
        # Holes found by phase 1 are of the epoch the stream was in when it was taken over,
        # whatever epoch new entries have moved on to by the time phase 1 completes.
        self._takeover_epoch = epoch
        self.phase = Phase.PREPARING
        self.deposed_by: Ballot | None = None
        self.first_slot = first_slot
        # Every slot below chosen_through is chosen; next_slot is the next to propose.
        self.chosen_through = first_slot
        self.next_slot = first_slot
        self._log: dict[int, Entry] = dict(known_chosen or {})
        self._forgotten_before = 0
        self._accepted_by: dict[int, set[str]] = {}
        self._sent_at: dict[int, int] = {}
        self._majority: set[int] = set()
        self._queue: deque[Entry] = deque()
        self._queued_records = 0
        # The open batch.
        self._records: list[Any] = []
        self._counters: list[int] = []
        self._batch_close_at: int | None = None
        self._batch_closed_at = -(1 << 62)  # when a batch last closed by its delay
        self._batch_opened_at = 0  # when the open batch took its first record
        # Where a record's commit waits (metrics): from its batch's first record to the
        # batch's close (the batch delay), and from an entry's proposal to its choice (the
        # round trip to a majority of regions, their disks included).
        self.batch_wait = LatencyHistogram()
        self.choose_latency = LatencyHistogram()
        self._watermark = 0
        self._vector_watermark: VectorClock = EMPTY
        self._last_counter = 0
        self._last_proposed_at = now_ns
        # When a new leader's first heartbeat is due (``_lead_at_once``; None: proposed).
        self._first_heartbeat_at: int | None = None
        # The watermarks the last proposed entry carried: a heartbeat with the same is no news.
        self._proposed_watermark = -1
        self._proposed_vw: VectorClock | None = None
        # The stamp someone waits for this stream to propose (``want``; -1: nobody).
        self._wanted = -1
        self._announced = first_slot
        self._announce_at: int | None = None
        self._outbox: list[tuple[str, PaxosMessage]] = []
        self._chosen_out: list[tuple[int, Entry]] = []
        # Phase 1 state: per acceptor, the slot its next Promise piece starts at.
        self._prepare_from: dict[str, int] = {}
        self._prepare_sent_at: dict[str, int] = {}
        self._promised: set[str] = set()
        self._found: dict[int, tuple[Ballot, Entry]] = {}
        # The highest slot each acceptor has accepted at this ballot: how far behind it is.
        self.accepted_max: dict[str, int] = {}
        self.entries_proposed = 0
        self.heartbeats_proposed = 0
        self.noops_proposed = 0
        self.hurried = 0  # open batches whose deadline ``hurry`` brought forward
        self.retransmissions = 0
        # Leases (docs/recovery.md "Stale reads"): when this leader started leading (phase 1
        # done), and the latest time it proposed an entry that a majority accepted at its
        # ballot. An acceptor that accepted an Accept sent at t had promised no higher
        # ballot when it did, so no other leader finished phase 1 before t.
        self.leading_since_ns: int | None = None
        self.confirmed_sent_ns: int | None = None
        self._proposed_at: dict[int, int] = {}
        if skip_phase1:
            self.phase = Phase.LEADING
            self.leading_since_ns = now_ns
            self._lead_at_once(now_ns)
        else:
            self._start_phase1(now_ns)

    # ---- the replica's calls -----------------------------------------------------------

    def can_append(self) -> bool:
        """False when ``pending_records_max`` records wait for a slot: stop certifying."""
        return self.pending_records() < self.settings.pending_records_max

    def pending_records(self) -> int:
        return len(self._records) + self._queued_records

    def append(self, now_ns: int, record: Any, counter: int) -> None:
        """Adds a certified transaction (``record``, msgpack-able) that drew ``counter``."""
        assert self.can_append(), "pending_records_max reached: check can_append first"
        assert counter > 0
        if self.counters_in_order:
            assert counter > self._last_counter, "counters_in_order: appended out of order"
            self._watermark = counter
        self._last_counter = max(self._last_counter, counter)
        if not self._records:
            # batch_delay_ns after the previous batch closed, so entries go at most one per
            # delay; but on a stream that has been quiet that long, at once: as soon as the
            # step that appended ends (a nanosecond on), taking every record of that step.
            self._batch_close_at = max(now_ns + 1, self._batch_closed_at + self.settings.batch_delay_ns)
            self._batch_opened_at = now_ns
        self._records.append(record)
        self._counters.append(counter)
        if len(self._records) >= self.settings.batch_size_max:
            self._close_batch(now_ns, by_delay=False)
        self._pump(now_ns)

    def hurry(self, now_ns: int) -> None:
        """A client waits for a record appended so far (not one that went on at
        certification): the open batch closes at the first multiple of
        ``batch_delay_awaited_ns`` after the previous one closed (at once if that is past),
        if that is sooner than its own deadline. On the multiples, so that every stream
        whose leader reads the same clock closes its hurried batches at the same instants:
        a transaction of two shards commits once its entries on both streams are chosen,
        and with independent rhythms it waited for the later of its two batches. (Batches
        closed by ``batch_delay_ns`` keep their own rhythm: aligned, the streams' entries
        went out in bursts, and the throughput of clients going on at certification fell
        by 3% in ten alternating pairs on geo3.)"""
        if self._batch_close_at is None:
            return  # no open batch: every record appended is in a closed one already
        soon = max(now_ns + 1, _tick_after(self._batch_closed_at, self.settings.batch_delay_awaited_ns))
        if soon < self._batch_close_at:
            self._batch_close_at = soon
            self.hurried += 1

    def advance_watermark(self, watermark: int) -> None:
        """Promise: every counter at or below ``watermark`` that this stream will ever carry
        has been appended. Entries closed from now on carry it (heartbeats too)."""
        self._watermark = max(self._watermark, watermark)

    def advance_vector_watermark(self, vw: VectorClock) -> None:
        """The replica's vector watermark; entries closed from now on carry it."""
        self._vector_watermark = self._vector_watermark.merge(vw)

    def append_inf(self, now_ns: int, through: int | None = None) -> None:
        """Ends the epoch on this stream: the open batch (of the current epoch), then an INF
        marker (DESIGN.md §5) that ends every epoch up to ``through`` (default: the current
        one). A shard that hears of epoch 3 while in epoch 1 ends 2 as well: no transaction
        of it ran here, and without the marker the stream would never finalize it.
        ``set_epoch`` then starts the next one."""
        self._close_batch(now_ns, by_delay=False)
        ended = self.epoch if through is None else max(self.epoch, through)
        self._enqueue(Entry(EntryKind.INF, epoch=ended))
        self._pump(now_ns)

    def set_epoch(self, epoch: int) -> None:
        """Entries closed from now on belong to ``epoch``."""
        assert epoch >= self.epoch
        self._close_batch()
        self.epoch = epoch

    def forget_before(self, slot: int) -> None:
        """Drops chosen entries below ``slot`` from the log served to lagging learners."""
        assert slot <= self.chosen_through
        for old in range(self._forgotten_before, slot):
            self._log.pop(old, None)
        self._forgotten_before = max(self._forgotten_before, slot)

    def slots_in_flight(self) -> int:
        return self.next_slot - self.chosen_through

    def lag_slots(self, peer: str) -> int:
        """Slots proposed at this ballot that ``peer`` has not accepted yet (at most: it may
        have accepted some lower ones out of order)."""
        return max(0, self.next_slot - 1 - self.accepted_max.get(peer, self.first_slot - 1))

    # ---- entry points ------------------------------------------------------------------

    def handle(self, now_ns: int, src: str, message: PaxosMessage) -> None:
        assert message.stream == self.stream
        if isinstance(message, Accepted):
            self._on_accepted(now_ns, src, message)
        elif isinstance(message, Promise):
            self._on_promise(now_ns, src, message)
        elif isinstance(message, Reject):
            if message.ballot == self.ballot and message.promised > self.ballot:
                self._depose(message.promised)
        elif isinstance(message, Fetch):
            self._on_fetch(src, message)
        elif isinstance(message, (Prepare, Accept)):
            # Another leader addresses this region's acceptor: its answer waits for its record.
            self._hold = True
            self.acceptor.handle(now_ns, src, message)
            self._outbox.extend(self.acceptor.ready(keep_persist=True).messages)
            if self.acceptor.promised > self.ballot:
                self._depose(self.acceptor.promised)
        # Commit and Chosen are for learners; a leader knows more than they say.

    def tick(self, now_ns: int) -> None:
        if self.phase is Phase.PREPARING:
            self._retry_prepare(now_ns)
        if self.phase is not Phase.LEADING:
            return
        self._pump(now_ns)
        if (
            not self._queue
            and not self._records
            and self._window_open()
            and now_ns >= self._heartbeat_due_at()
        ):
            self._propose(
                now_ns,
                Entry(
                    EntryKind.BATCH, watermark=self._watermark, vw=self._vector_watermark,
                    epoch=self.epoch,
                ),
            )
            self.heartbeats_proposed += 1
        self._retransmit(now_ns)
        if self._announce_at is not None and now_ns >= self._announce_at:
            self._announce_at = None
            if self.chosen_through > self._announced:
                self._announced = self.chosen_through
                commit = Commit(self.stream, self.ballot, self.chosen_through)
                self._outbox.extend((peer, commit) for peer in self.peers)

    def ready(self) -> StreamReady:
        messages, self._outbox = self._outbox, []
        chosen, self._chosen_out = self._chosen_out, []
        # This region's acceptor is called directly: its records go out with ours, synced
        # before the Accepts (and Promises) that count on them are sent.
        return StreamReady(messages, chosen, self._next_wake(), self.acceptor.take_persist())

    # ---- phase 1 -----------------------------------------------------------------------

    def _start_phase1(self, now_ns: int) -> None:
        # This region's acceptor first, directly, piece by piece. Its promise counts at
        # once: the Prepares wait for its record, so no other promise can join it before.
        self._hold = True
        from_slot = self.first_slot
        while True:
            reply = self.acceptor.prepare(Prepare(self.stream, self.ballot, from_slot))
            if isinstance(reply, Reject):
                self._depose(reply.promised)
                return
            self._merge_found(reply)
            if reply.complete:
                break
            from_slot = reply.accepted[-1][0] + 1
        self._promised.add(self.address)
        for peer in self.peers:
            self._prepare_from[peer] = self.first_slot
            self._send_prepare(now_ns, peer)
        self._maybe_lead(now_ns)

    def _send_prepare(self, now_ns: int, peer: str) -> None:
        self._prepare_sent_at[peer] = now_ns
        self._outbox.append((peer, Prepare(self.stream, self.ballot, self._prepare_from[peer])))

    def _retry_prepare(self, now_ns: int) -> None:
        for peer in self.peers:
            if peer in self._promised:
                continue
            if now_ns >= self._prepare_sent_at[peer] + self.settings.prepare_retry_ns:
                self._send_prepare(now_ns, peer)
                self.retransmissions += 1

    def _merge_found(self, promise: Promise) -> None:
        for slot, ballot, entry in promise.accepted:
            held = self._found.get(slot)
            if held is None or ballot > held[0]:
                self._found[slot] = (ballot, entry)

    def _on_promise(self, now_ns: int, src: str, message: Promise) -> None:
        if (
            self.phase is not Phase.PREPARING
            or message.ballot != self.ballot
            or src not in self._prepare_from
            or src in self._promised
        ):
            return
        # Any piece at our ballot is true information; only the awaited piece moves on.
        self._merge_found(message)
        if message.from_slot != self._prepare_from[src]:
            return
        if message.complete:
            self._promised.add(src)
            self._maybe_lead(now_ns)
        elif message.accepted:
            self._prepare_from[src] = message.accepted[-1][0] + 1
            self._send_prepare(now_ns, src)

    def _maybe_lead(self, now_ns: int) -> None:
        if self.phase is not Phase.PREPARING or len(self._promised) < self.quorum:
            return
        self.phase = Phase.LEADING
        self.leading_since_ns = now_ns
        self._lead_at_once(now_ns)
        end = max(self._found, default=self.first_slot - 1) + 1
        # Re-proposals and no-ops go to the head of the queue in slot order; the queue
        # hands out slots in order from first_slot, so each lands in its own slot.
        noop = Entry(EntryKind.NOOP, epoch=self._takeover_epoch)
        takeover = [
            self._found[slot][1] if slot in self._found else noop
            for slot in range(self.first_slot, end)
        ]
        for entry in reversed(takeover):
            self._queue.appendleft(entry)
            self._queued_records += len(entry.records)
        self.noops_proposed += sum(1 for entry in takeover if entry is noop)
        self._found.clear()
        self._pump(now_ns)

    # ---- phase 2 -----------------------------------------------------------------------

    def _close_batch(self, now_ns: int | None = None, by_delay: bool = True) -> None:
        self._batch_close_at = None
        if not self._records:
            return
        if now_ns is not None:
            if by_delay:
                self._batch_closed_at = now_ns
            self.batch_wait.observe(now_ns - self._batch_opened_at)
        entry = Entry(
            EntryKind.BATCH, self._records, self._counters, self._watermark,
            self._vector_watermark, self.epoch,
        )
        self._records, self._counters = [], []
        self._enqueue(entry)

    def _enqueue(self, entry: Entry) -> None:
        self._queue.append(entry)
        self._queued_records += len(entry.records)

    def _window_open(self) -> bool:
        return self.slots_in_flight() < self.settings.slots_in_flight_max

    def _pump(self, now_ns: int) -> None:
        """Proposes queued entries while the window has room, then a due open batch.

        An open batch past its delay is closed only when it can take a slot at once: while
        the window is full it keeps growing up to ``batch_size_max``, so batches get larger
        exactly when the wide-area pipeline is the bottleneck.
        """
        while self.phase is Phase.LEADING and self._queue and self._window_open():
            entry = self._queue.popleft()
            self._queued_records -= len(entry.records)
            self._propose(now_ns, entry)
        if (
            self.phase is Phase.LEADING
            and self._batch_close_at is not None
            and now_ns >= self._batch_close_at
            and self._window_open()
        ):
            self._close_batch(now_ns)
            self._pump(now_ns)

    def _lead_at_once(self, now_ns: int) -> None:
        """A leader answers clients only with lease evidence (an entry of its own that a
        majority accepted): with nothing to (re-)propose, its first heartbeat is due at
        once instead of a heartbeat interval after it started leading."""
        self._first_heartbeat_at = now_ns

    def want(self, stamp: int) -> None:
        """Someone waits for an entry stamped ``stamp`` or more (a fellow worker, for its
        transactions' counters): an idle stream proposes its heartbeat sooner."""
        self._wanted = max(self._wanted, stamp)

    def _heartbeat_due_at(self) -> int:
        if self._first_heartbeat_at is not None:
            return self._first_heartbeat_at
        settings = self.settings
        if self._watermark != self._proposed_watermark:
            wanted = self._wanted > self._proposed_watermark
            interval = settings.heartbeat_wanted_interval_ns if wanted else settings.heartbeat_interval_ns
        elif self._vector_watermark != self._proposed_vw:
            interval = settings.heartbeat_interval_ns
        else:
            interval = settings.heartbeat_idle_interval_ns
        return self._last_proposed_at + interval

    def _propose(self, now_ns: int, entry: Entry) -> None:
        if entry.kind is EntryKind.BATCH:
            self._proposed_watermark = entry.watermark
            self._proposed_vw = entry.vw
        slot = self.next_slot
        self.next_slot += 1
        self._log[slot] = entry
        self._accepted_by[slot] = set()
        self._sent_at[slot] = now_ns
        self._proposed_at[slot] = now_ns
        self._last_proposed_at = now_ns
        self._first_heartbeat_at = None
        self.entries_proposed += 1
        accept = Accept(self.stream, self.ballot, slot, entry, self.chosen_through)
        self._announced = self.chosen_through
        self._outbox.extend((peer, accept) for peer in self.peers)
        reply = self.acceptor.accept(accept)
        if isinstance(reply, Reject):
            self._depose(reply.promised)
            return
        if self.votes_after_sync and not self.break_own_vote:
            self._votes_unsealed.append(reply)
        elif self.votes_after_sync:
            self._on_accepted(now_ns, self.address, reply)  # the mutant: no hold either
        else:
            self._hold = True
            self._on_accepted(now_ns, self.address, reply)

    # ---- own votes and the disk (module doc) -----------------------------------------

    def take_hold(self) -> bool:
        """Whether records handed out since the last call had their effect counted at once
        (the messages of the same ready() must wait for their sync)."""
        hold, self._hold = self._hold, False
        return hold

    def seal_votes(self) -> bool:
        """Closes the group of own votes whose records the caller's ready() hands out;
        ``synced`` counts the oldest group not yet counted. False: no vote to seal."""
        if not self._votes_unsealed:
            return False
        self._vote_groups.append(self._votes_unsealed)
        self._votes_unsealed = []
        return True

    def synced(self, now_ns: int) -> None:
        """The records of the oldest sealed group are on disk: those votes count now."""
        for reply in self._vote_groups.popleft():
            self._on_accepted(now_ns, self.address, reply)

    def _on_accepted(self, now_ns: int, src: str, message: Accepted) -> None:
        if message.ballot != self.ballot or self.phase is not Phase.LEADING:
            return
        if message.slot > self.accepted_max.get(src, -1):
            self.accepted_max[src] = message.slot
        voters = self._accepted_by.get(message.slot)
        if voters is None:
            return  # already chosen, or never proposed at this ballot
        voters.add(src)
        if len(voters) >= self.quorum:
            proposed_at = self._proposed_at[message.slot]
            if self.confirmed_sent_ns is None or proposed_at > self.confirmed_sent_ns:
                self.confirmed_sent_ns = proposed_at
            self._majority.add(message.slot)
            self._advance(now_ns)

    def _advance(self, now_ns: int) -> None:
        moved = False
        while self.chosen_through in self._majority:
            slot = self.chosen_through
            self._majority.discard(slot)
            del self._accepted_by[slot]
            del self._sent_at[slot]
            entry = self._log[slot]
            if entry.records:  # a batch of records, not a heartbeat, no-op or INF
                self.choose_latency.observe(now_ns - self._proposed_at[slot])
            del self._proposed_at[slot]
            self._chosen_out.append((slot, entry))
            self.chosen_through += 1
            moved = True
        if moved:
            if self._announce_at is None:
                self._announce_at = now_ns + self.settings.commit_announce_delay_ns
            self._pump(now_ns)

    def _retransmit(self, now_ns: int) -> None:
        deadline = now_ns - self.settings.accept_retry_ns
        for slot, sent_at in self._sent_at.items():
            if sent_at > deadline:
                continue
            self._sent_at[slot] = now_ns
            accept = Accept(self.stream, self.ballot, slot, self._log[slot], self.chosen_through)
            voters = self._accepted_by[slot]
            for peer in self.peers:
                if peer not in voters:
                    self._outbox.append((peer, accept))
                    self.retransmissions += 1

    def chosen_log(self) -> dict[int, Entry]:
        """The chosen entries this leader still keeps (for a replica that copies its state)."""
        chosen = self.chosen_through
        return {slot: entry for slot, entry in self._log.items() if slot < chosen}

    # ---- learners, deposition, timers --------------------------------------------------

    def _on_fetch(self, src: str, message: Fetch) -> None:
        entries: list[Entry] = []
        slot = message.from_slot
        end = min(message.to_slot, self.chosen_through,
                  message.from_slot + self.settings.fetch_entries_max)
        while slot < end and slot in self._log:
            entries.append(self._log[slot])
            slot += 1
        if entries:
            self._outbox.append((src, Chosen(self.stream, message.from_slot, entries)))

    def _depose(self, promised: Ballot) -> None:
        if self.phase is Phase.DEPOSED:
            return
        self.phase = Phase.DEPOSED
        self.deposed_by = promised
        self._announce_at = None

    def _next_wake(self) -> int | None:
        candidates: list[int] = []
        if self.phase is Phase.PREPARING:
            candidates.extend(
                self._prepare_sent_at[peer] + self.settings.prepare_retry_ns
                for peer in self.peers
                if peer not in self._promised
            )
        elif self.phase is Phase.LEADING:
            if self._window_open():
                # With the window full, the next Accepted reply is what wakes the pipeline.
                if self._batch_close_at is not None:
                    candidates.append(self._batch_close_at)
                elif not self._queue:
                    # A heartbeat is due only on an idle stream (tick's condition); listing
                    # it with records open would wake the replica in a loop at one instant.
                    candidates.append(self._heartbeat_due_at())
            if self._sent_at:
                candidates.append(min(self._sent_at.values()) + self.settings.accept_retry_ns)
            if self._announce_at is not None:
                candidates.append(self._announce_at)
        return min(candidates, default=None)


def _tick_after(instant_ns: int, period_ns: int) -> int:
    """The first multiple of ``period_ns`` after ``instant_ns`` (the instant after it for a
    period of 0): the instants a hurried stream's batches close at, the same on every stream
    whose leader reads the same clock."""
    if period_ns <= 0:
        return instant_ns + 1
    return (instant_ns // period_ns + 1) * period_ns
