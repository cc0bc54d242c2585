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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from store.core.coordinator import Certification, Coordinator
from store.core.messages import (
    AbortReply,
    AbortRequest,
    Gossip,
    InstallReply,
    InstallRequest,
    LockReply,
    LockRequest,
    Message,
    Outcome,
    ReadReply,
    ReadRequest,
    SoloReply,
    SoloRequest,
    Submit,
    ValidateReply,
    ValidateRequest,
    Write,
)
from store.core.participant import Participant
from store.core.partition import Partitioner
from store.core.paxos import (
    DEFAULT_STREAM_SETTINGS,
    Ballot,
    EntryKind,
    PaxosMessage,
    StreamLeader,
    StreamSettings,
)
from store.core.settings import DEFAULT_SETTINGS, Settings
from store.core.storage import VersionedStore
from store.core.txn import Procedures
from store.core.vclock import EMPTY, VectorClock
from store.core.watermark import ShardWatermark, VectorWatermark


class Probe(Protocol):
    """What the simulator's oracles watch in a replica (production passes none): every
    certification at its coordinator, every install in its store, in order, and its vector
    watermark after every step that raised it."""

    def certified(self, certification: Certification) -> None: ...

    def installed(self, shard: int, txn_id: int, writes: list[Write], vc: VectorClock) -> None: ...

    def watermark(self, address: str, vw: Mapping[int, int]) -> None: ...


@dataclass(slots=True)
class Ready:
    """What the replica wants done: send ``messages`` (in order), wake it at ``wake_at``."""

    messages: list[tuple[str, Message]] = field(default_factory=list)
    wake_at: int | None = None


class ShardLeader:
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
    ) -> None:
        assert 0 <= shard < len(peers)
        self.shard = shard
        self.address = peers[shard]
        self.peers = list(peers)
        self.settings = settings
        self.store = VersionedStore()
        self.watermark = ShardWatermark()
        self.vw = VectorWatermark()
        self.participant = Participant(
            shard, self.store, self.watermark, settings, self._on_installed, breaks,
            self.vw.entries,
        )
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
        )
        self._probe = probe
        self._probed_moves = -1
        self._outbox: list[tuple[str, Message]] = []
        self.coordinator.admits = self.accepts_more
        self._now_ns = now_ns
        self.stream: StreamLeader | None = None
        self._stream_wake_at: int | None = None
        self._durable_mark = 0
        if followers:
            self.stream = StreamLeader(
                shard, self.address, list(followers), Ballot(ballot_round, self.address),
                stream_settings, now_ns=now_ns,
            )
            self._pump_stream()
        self._gossip_at = now_ns + settings.gossip_interval_ns
        self._gossip_next = 0
        self._gc_at = now_ns + settings.gc_interval_ns
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
            Gossip: self._on_gossip,
        }
        self.dropped_messages = 0

    # ---- entry points --------------------------------------------------------------------

    def handle(self, now_ns: int, src: str, message: Message) -> None:
        self._now_ns = now_ns
        if isinstance(message, PaxosMessage):
            if self.stream is not None and message.stream == self.shard:
                self.stream.handle(now_ns, src, message)
            else:
                self.dropped_messages += 1
        else:
            handler = self._handlers.get(type(message))
            if handler is None:
                self.dropped_messages += 1
                return
            handler(now_ns, src, message)
        self._pump_stream()
        self._refresh_watermark()
        if self._probe is not None:
            self._report_watermark()

    def tick(self, now_ns: int) -> None:
        self._now_ns = now_ns
        if self.stream is not None:
            self.stream.tick(now_ns)
        self.coordinator.on_timer(now_ns)
        if now_ns >= self._gossip_at:
            self._gossip_at = now_ns + self.settings.gossip_interval_ns
            others = len(self.peers) - 1
            if others:
                gossip = Gossip(self.shard, dict(self.vw.entries))
                for step in range(min(self.settings.gossip_fanout, others)):
                    shard = (self.shard + 1 + (self._gossip_next + step) % others) % len(self.peers)
                    self._outbox.append((self.peers[shard], gossip))
                self._gossip_next = (self._gossip_next + self.settings.gossip_fanout) % others
        self._pump_stream()
        if now_ns >= self._gc_at:
            self._gc_at = now_ns + self.settings.gc_interval_ns
            self.store.collect_garbage(self.vw.entries, self.settings.gc_keys_per_pass_max)
            self.participant.collect_stamps(self.vw.entries, self.settings.gc_keys_per_pass_max)
        self._refresh_watermark()
        if self._probe is not None:
            self._report_watermark()

    def ready(self) -> Ready:
        messages, self._outbox = self._outbox, []
        wake_at = min(self._gossip_at, self._gc_at)
        for deadline in (self.coordinator.next_deadline(), self._stream_wake_at):
            if deadline is not None and deadline < wake_at:
                wake_at = deadline
        return Ready(messages, wake_at)

    def durable_watermark(self) -> int:
        """This shard's watermark (DESIGN.md §4): with replication, the stream's."""
        if self.stream is None:
            return self.watermark.watermark
        return self._durable_mark

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
            self._probe.installed(self.shard, txn_id, writes, vc)
        if self.stream is not None:
            record = [txn_id, [[key, value, deleted] for key, value, deleted in writes], vc.to_wire()]
            self.stream.append(self._now_ns, record, counter, vc)
        # Settled for the appended watermark; durable once the stream's entry is chosen
        # (without followers, at once).
        self.watermark.settle(counter)
        if self.stream is not None:
            self.stream.advance_watermark(self.watermark.watermark)

    def _pump_stream(self) -> None:
        """Carries out the stream's Ready: messages out, chosen entries into the watermark."""
        stream = self.stream
        if stream is None:
            return
        # Aborts settle counters too: the stream learns the appended watermark either way.
        stream.advance_watermark(self.watermark.watermark)
        stream.advance_vector_watermark(VectorClock(self.vw.entries))
        ready = stream.ready()
        self._outbox.extend(ready.messages)
        for _, entry in ready.chosen:
            if entry.kind == EntryKind.BATCH and entry.watermark > self._durable_mark:
                self._durable_mark = entry.watermark
        if ready.chosen:
            forget = stream.chosen_through - stream.settings.log_retained_slots
            if forget > stream.acceptor.forgotten_before:
                stream.forget_before(forget)
                stream.acceptor.forget_before(forget)
        self._stream_wake_at = ready.wake_at

    def _refresh_watermark(self) -> None:
        self._learn(self.shard, self.durable_watermark())

    def _learn(self, shard: int, watermark: int) -> None:
        if self.vw.learn(shard, watermark):
            self.participant.reveal_committed(self.vw.entries, shard)
            self.coordinator.check_commits(shard)

    # ---- handlers ------------------------------------------------------------------------

    def _on_submit(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, Submit)
        self.coordinator.submit(now_ns, src, message)

    def _on_read_request(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, ReadRequest)
        participant = self.participant
        self._outbox.append(
            (
                src,
                ReadReply(
                    message.txn_id,
                    message.req_no,
                    self.shard,
                    participant.read(message.keys),
                    participant.scan_many(message.scans),
                    self.durable_watermark(),
                ),
            )
        )

    def _on_read_reply(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, ReadReply)
        self._learn(message.shard, message.watermark)
        self.coordinator.on_read_reply(now_ns, message)

    def _on_lock_request(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, LockRequest)
        ok, counter, deps = self.participant.lock(message.txn_id, message.keys)
        reply = LockReply(message.txn_id, self.shard, ok, counter, deps, self.durable_watermark())
        self._outbox.append((src, reply))

    def _on_lock_reply(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, LockReply)
        self._learn(message.shard, message.watermark)
        self.coordinator.on_lock_reply(now_ns, message)

    def _on_validate_request(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, ValidateRequest)
        ok = self.participant.validate(message.txn_id, message.reads, message.scans, message.vc)
        reply = ValidateReply(message.txn_id, self.shard, ok, self.durable_watermark())
        self._outbox.append((src, reply))

    def _on_validate_reply(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, ValidateReply)
        self._learn(message.shard, message.watermark)
        self.coordinator.on_validate_reply(now_ns, message)

    def _on_install_request(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, InstallRequest)
        if self.vw.learn_all(dict(message.durable.items())):
            self.participant.reveal_committed(self.vw.entries)
            self.coordinator.check_commits()
        self.participant.install(message.txn_id, message.writes, message.vc, message.epoch)
        reply = InstallReply(message.txn_id, self.shard, self.durable_watermark())
        self._outbox.append((src, reply))

    def _on_install_reply(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, InstallReply)
        self._learn(message.shard, message.watermark)
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
            reply = SoloReply(message.txn_id, self.shard, False, EMPTY, self.durable_watermark(), EMPTY)
        else:
            vc, full = clocks
            durable = VectorClock({s: c for s, c in full.items() if vc[s] != c})
            reply = SoloReply(message.txn_id, self.shard, True, vc, self.durable_watermark(), durable)
        self._outbox.append((src, reply))

    def _on_solo_reply(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, SoloReply)
        self._learn(message.shard, message.watermark)
        if self.vw.learn_all(dict(message.durable.items())):
            self.participant.reveal_committed(self.vw.entries)
            self.coordinator.check_commits()
        self.coordinator.on_solo_reply(now_ns, message)

    def _on_gossip(self, now_ns: int, src: str, message: Message) -> None:
        assert isinstance(message, Gossip)
        if self.vw.learn_all(message.watermarks):
            self.participant.reveal_committed(self.vw.entries)
            self.coordinator.check_commits()
