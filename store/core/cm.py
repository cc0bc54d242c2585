"""The configuration manager (CM): the cluster map, failure detection and failover
(DESIGN.md §2, §5; the protocol is `docs/recovery.md`).

Theory of operation. One CM member runs in every region. Together they keep one
**cluster map** — each shard's leader and followers, the **epoch**, and the finalized vector
watermark (FVW) of every epoch that has ended — as a replicated state machine: commands are
records of a Multi-Paxos stream of the project's own core (``store.core.paxos``, stream
``CM_STREAM``) and every member applies the chosen ones, in order, to its copy of the map.
Applying is deterministic and checks each command against the map it meets, so a stale or
duplicated command changes nothing.

* **Leadership.** The first member in rank order leads the CM stream. A member that hears
  nothing from a leader (no Accept, Commit or Chosen) for ``cm_timeout_ns`` times its rank
  takes the stream over with a higher ballot (phase 1 from what it has delivered, the
  takeover of ``store.core.paxos``); a leader that meets a higher ballot steps down. Losing
  one member (one region) leaves a majority: the CM goes on.
* **Failure detection.** Every replica sends a ``Heartbeat`` to every member each
  ``heartbeat_interval_ns``. The acting leader declares a shard leader dead after
  ``leader_timeout_ns`` without one (never within ``leader_timeout_ns`` of becoming leader,
  so a new CM leader first hears everyone), picks the follower of that shard that heartbeat
  most recently within the timeout and has delivered the most of the shard's stream, and
  proposes ``failover(shard, old, new, epoch + 1)``. The old leader stays one of the shard's
  replicas: the shard's stream still needs a majority of all its regions (a replica that is
  gone just never answers), so a shard that has lost two of three cannot commit.
* **Finalized watermarks.** A shard leader's heartbeat carries the finalized watermarks of
  the epochs that have ended on its stream; the leader proposes ``finalized(epoch, shard,
  watermark)`` for each it has not recorded. When every shard has one for an epoch, the
  epoch's FVW is complete and part of the map.
* **Distribution.** After a command changes the map, the acting leader pushes the map
  (``ConfigReply``) to every replica of it; and again to any replica whose heartbeat shows an
  older epoch or an older FVW. Any member answers ``GetConfig`` with the map it has.

The map (``ClusterMap``, with ``apply``) and the CM's messages (``Heartbeat``,
``GetConfig``, ``ConfigReply``) are part of the wire protocol: ``store.protocol``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, Final

from store.core.paxos import (
    DEFAULT_STREAM_SETTINGS,
    Acceptor,
    Ballot,
    Chosen,
    Commit,
    Entry,
    EntryKind,
    PaxosMessage,
    Phase,
    StreamFollower,
    StreamLeader,
    StreamSettings,
)
from store.core.paxos import Accept as PaxosAccept
from store.core.ready import Ready
from store.core.settings import DEFAULT_SETTINGS, Settings
from store.protocol.cluster_map import ClusterMap
from store.protocol.messages import (
    FOLLOWER,
    LEADER,
    REJOINING,
    ConfigReply,
    GetConfig,
    Heartbeat,
    Message,
)

# The CM's Paxos stream; shard streams are numbered by shard.
CM_STREAM: Final = 1 << 30

# ---- a member ------------------------------------------------------------------------------


class ConfigMember:
    """One CM member (see the module doc). Pure: ``handle``, ``tick``, ``ready``."""

    ANSWERS: tuple[type[Message], ...] = (GetConfig,)
    ONE_WAY: tuple[type[Message], ...] = (Heartbeat,)
    REPLIES: tuple[type[Message], ...] = ()

    def __init__(
        self,
        address: str,
        members: Sequence[str],
        initial: ClusterMap,
        settings: Settings = DEFAULT_SETTINGS,
        stream_settings: StreamSettings = DEFAULT_STREAM_SETTINGS,
        *,
        now_ns: int = 0,
        acceptor: Acceptor | None = None,
    ) -> None:
        """``acceptor``: a restarted member's, rebuilt from its log (``Acceptor.recover``).
        It starts from slot 0 with ``initial`` and learns its map again from the stream: the
        first member leads it again with a ballot above every promise (phase 1 from slot 0
        hears of every command chosen, as no CM acceptor forgets one), the others follow."""
        assert address in members
        self.address = address
        self.members = list(members)
        self.rank = self.members.index(address)
        self.settings = settings
        self.stream_settings = stream_settings
        self.map = initial.copy()
        self._others = [m for m in self.members if m != address]
        self._outbox: list[tuple[str, Message]] = []
        self._heard: dict[str, tuple[int, Heartbeat]] = {}
        self._proposed: set[tuple[Any, ...]] = set()
        self._next_counter = 1
        self._leader_seen_at = now_ns
        self._lead_since = now_ns
        self._round = 1
        self._stream_wake_at: int | None = None
        self._check_at = now_ns
        self.failovers = 0
        self._persist: list[object] = []  # the acceptor's records (Ready.persist)
        self._sealed: deque[StreamLeader] = deque()  # whose own votes await a sync, in order
        self.stream: StreamLeader | StreamFollower
        if acceptor is not None:
            self._round = acceptor.promised.round + 1
        if self.rank == 0:
            self.stream = self._new_leader(
                now_ns, acceptor or Acceptor(CM_STREAM, stream_settings), 0, {}
            )
        else:
            self.stream = StreamFollower(CM_STREAM, stream_settings, acceptor=acceptor)
        self._recent: dict[int, Entry] = {}  # chosen entries kept for a successor's takeover
        self._pump(now_ns)

    # ---- entry points --------------------------------------------------------------------

    def handle(self, now_ns: int, src: str, message: Message) -> None:
        if isinstance(message, PaxosMessage):
            if message.stream != CM_STREAM:
                return
            if isinstance(message, PaxosAccept | Commit):
                self._leader_seen_at = now_ns
                self._round = max(self._round, message.ballot.round)
            elif isinstance(message, Chosen):
                self._leader_seen_at = now_ns
            self.stream.handle(now_ns, src, message)
        elif isinstance(message, Heartbeat):
            self._on_heartbeat(now_ns, message)
        elif isinstance(message, GetConfig):
            self._outbox.append((src, ConfigReply(message.req_id, self.map.copy(), self._leader_hint())))
        self._pump(now_ns)

    def tick(self, now_ns: int) -> None:
        self.stream.tick(now_ns)
        if self.leading():
            if now_ns >= self._check_at:
                self._check_at = now_ns + self.settings.heartbeat_interval_ns
                self._detect_failures(now_ns)
        elif isinstance(self.stream, StreamFollower):
            patience = self.settings.cm_timeout_ns * max(1, self.rank)
            if now_ns - self._leader_seen_at > patience:
                self._take_over(now_ns)
        self._pump(now_ns)

    @property
    def has_successor(self) -> bool:
        """Whether the next ``ready()`` names a replica to host instead of this one."""
        return False  # a configuration manager member is never replaced

    def ready(self) -> Ready:
        messages, self._outbox = self._outbox, []
        if self.leading():
            check_at = self._check_at  # failure detection, every heartbeat interval
        elif isinstance(self.stream, StreamFollower):
            check_at = self._leader_seen_at + self.settings.cm_timeout_ns * max(1, self.rank) + 1
        else:
            check_at = None
        candidates = [w for w in (self._stream_wake_at, check_at) if w is not None]
        persist, self._persist = self._persist, []
        persist += self.stream.acceptor.take_persist()
        wake_at = min(candidates) if candidates else None
        stream = self.stream
        if isinstance(stream, StreamLeader):  # its own votes, as a shard leader's (Ready)
            hold, sealed = stream.take_hold(), stream.seal_votes()
            if sealed:
                self._sealed.append(stream)
            return Ready(messages, wake_at, None, persist, hold, sealed)
        return Ready(messages, wake_at, None, persist)

    def synced(self, now_ns: int) -> None:
        """The records of the oldest Ready that wanted it are on disk: the own votes in it
        count now, if the leader that sealed them still leads."""
        stream = self._sealed.popleft()
        if stream is self.stream:
            stream.synced(now_ns)
        self._pump(now_ns)

    def leading(self) -> bool:
        return isinstance(self.stream, StreamLeader) and self.stream.phase is Phase.LEADING

    # ---- the stream ----------------------------------------------------------------------

    def _new_leader(
        self, now_ns: int, acceptor: Acceptor, first_slot: int, known: dict[int, Entry]
    ) -> StreamLeader:
        self._lead_since = now_ns
        self._proposed.clear()
        leader = StreamLeader(
            CM_STREAM, self.address, self._others, Ballot(self._round, self.address),
            self.stream_settings, now_ns=now_ns, acceptor=acceptor, first_slot=first_slot,
            known_chosen=known, counters_in_order=True,
        )
        return leader

    def _take_over(self, now_ns: int) -> None:
        follower = self.stream
        assert isinstance(follower, StreamFollower)
        self._round = max(self._round, follower.acceptor.promised.round) + 1
        self.stream = self._new_leader(
            now_ns, follower.acceptor, follower.learner.delivered_through, dict(self._recent)
        )
        self._leader_seen_at = now_ns

    def _pump(self, now_ns: int) -> None:
        stream = self.stream
        ready = stream.ready()
        self._persist.extend(ready.persist)
        self._outbox.extend(ready.messages)
        self._stream_wake_at = ready.wake_at
        changed = False
        for slot, entry in ready.chosen:
            self._recent[slot] = entry
            if entry.kind == EntryKind.BATCH:
                for record in entry.records:
                    changed |= self.map.apply(list(record))
        if len(self._recent) > self.stream_settings.log_retained_slots:
            for slot in sorted(self._recent)[: len(self._recent) // 2]:
                del self._recent[slot]
        if isinstance(stream, StreamLeader) and stream.phase is Phase.DEPOSED:
            self._round = max(self._round, (stream.deposed_by or Ballot(0, "")).round)
            self.stream = StreamFollower(
                CM_STREAM, self.stream_settings, first_slot=stream.chosen_through,
                acceptor=stream.acceptor,
            )
            self._leader_seen_at = now_ns
        if changed and self.leading():
            self._proposed = {p for p in self._proposed if not self._settled(p)}
            self._push_all()

    def _propose(self, now_ns: int, command: list[Any]) -> bool:
        key = tuple(command)
        if key in self._proposed or not self.leading():
            return False
        stream = self.stream
        assert isinstance(stream, StreamLeader)
        if not stream.can_append():
            return False
        self._proposed.add(key)
        counter = self._next_counter
        self._next_counter += 1
        stream.append(now_ns, command, counter)
        return True

    def _settled(self, proposal: tuple[Any, ...]) -> bool:
        if proposal[0] == "failover":
            return bool(self.map.epoch >= proposal[4])
        epoch, shard = proposal[1], proposal[2]
        return bool(epoch in self.map.fvw or shard in self.map.finalized.get(epoch, {}))

    # ---- failure detection and distribution ----------------------------------------------

    def _on_heartbeat(self, now_ns: int, heartbeat: Heartbeat) -> None:
        rejoining = heartbeat.role == REJOINING
        if rejoining:
            # Restarted: what it said in its previous life no longer holds.
            self._heard.pop(heartbeat.address, None)
        else:
            self._heard[heartbeat.address] = (now_ns, heartbeat)
        if not self.leading():
            return
        cluster_map = self.map
        shard = heartbeat.shard
        if (
            heartbeat.role == LEADER
            and 0 <= shard < cluster_map.shards
            and cluster_map.leaders[shard] == heartbeat.address
        ):
            for epoch, watermark in heartbeat.finalized:
                if epoch < cluster_map.epoch and epoch not in cluster_map.fvw and (
                    shard not in cluster_map.finalized.get(epoch, {})
                ):
                    self._propose(now_ns, ["finalized", epoch, shard, watermark])
        if (
            rejoining
            or heartbeat.epoch < cluster_map.epoch
            or heartbeat.fvw_epoch < cluster_map.fvw_epoch()
        ):
            self._outbox.append((heartbeat.address, self._config()))

    def _detect_failures(self, now_ns: int) -> None:
        timeout = self.settings.leader_timeout_ns
        if now_ns - self._lead_since < timeout:
            return  # a new CM leader first hears everyone
        cluster_map = self.map
        for shard in range(cluster_map.shards):
            leader = cluster_map.leaders[shard]
            heard = self._heard.get(leader)
            if heard is not None and now_ns - heard[0] <= timeout:
                continue
            live = []
            for follower in cluster_map.followers[shard]:
                seen = self._heard.get(follower)
                if (
                    seen is not None
                    and now_ns - seen[0] <= timeout
                    and seen[1].role == FOLLOWER
                    and seen[1].shard == shard
                ):
                    live.append((-seen[1].delivered, follower))
            if not live:
                continue  # nobody to take over: the shard waits
            chosen = min(live)[1]
            if self._propose(now_ns, ["failover", shard, leader, chosen, cluster_map.epoch + 1]):
                self.failovers += 1
            return  # one epoch change at a time: the next waits for this one to be chosen

    def _config(self) -> ConfigReply:
        return ConfigReply(0, self.map.copy(), self.address)

    def _push_all(self) -> None:
        config = self._config()
        for replica in self.map.replicas():
            self._outbox.append((replica, config))

    def _leader_hint(self) -> str:
        return self.address if self.leading() else ""
