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
"""

from __future__ import annotations

from typing import Any

from store.core.messages import Message
from store.core.paxos import (
    DEFAULT_STREAM_SETTINGS,
    EntryKind,
    PaxosMessage,
    StreamFollower,
    StreamSettings,
)
from store.core.replica import Probe, Ready
from store.core.storage import VersionedStore
from store.core.vclock import EMPTY, VectorClock


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


class ShardFollower:
    def __init__(
        self,
        shard: int,
        address: str,
        stream_settings: StreamSettings = DEFAULT_STREAM_SETTINGS,
        *,
        now_ns: int = 0,
        probe: Probe | None = None,
    ) -> None:
        self.shard = shard
        self.address = address
        self._probe = probe
        self.stream = StreamFollower(shard, stream_settings)
        self.stream_settings = stream_settings
        self.store = VersionedStore()
        self.vw = EMPTY
        self.applied_slots = 0
        self.applied_records = 0
        self.skipped_writes = 0
        self._outbox: list[tuple[str, Message]] = []
        self._wake_at: int | None = None
        self.dropped_messages = 0

    def handle(self, now_ns: int, src: str, message: Message) -> None:
        if isinstance(message, PaxosMessage):
            if message.stream != self.shard:
                self.dropped_messages += 1
                return
            self.stream.handle(now_ns, src, message)
            self._pump()
        elif isinstance(message, SnapshotRead):
            self._outbox.append((src, self.snapshot(message)))
        else:
            self.dropped_messages += 1

    def tick(self, now_ns: int) -> None:
        self.stream.tick(now_ns)
        self._pump()

    def ready(self) -> Ready:
        messages, self._outbox = self._outbox, []
        return Ready(messages, self._wake_at)

    # ---- replay --------------------------------------------------------------------------

    def _pump(self) -> None:
        ready = self.stream.ready()
        self._outbox.extend(ready.messages)
        self._wake_at = ready.wake_at
        if ready.chosen:
            acceptor = self.stream.acceptor
            forget = self.stream.learner.delivered_through - self.stream_settings.log_retained_slots
            if forget > acceptor.forgotten_before:
                acceptor.forget_before(forget)
        for _, entry in ready.chosen:
            self.applied_slots += 1
            if entry.kind != EntryKind.BATCH:
                continue  # no-ops and INF markers end an epoch: recovery's business
            for record in entry.records:
                self._replay(record)
            vw = self.vw.merge(entry.vw).with_entry(self.shard, entry.watermark)
            if self._probe is not None and vw != self.vw:
                self._probe.watermark(self.address, dict(vw.items()))
            self.vw = vw

    def _replay(self, record: Any) -> None:
        txn_id, writes, vc_wire = record
        vc = VectorClock.from_wire(vc_wire)
        counter = vc[self.shard]
        self.applied_records += 1
        store = self.store
        for key, value, deleted in writes:
            latest = store.latest(key)
            if latest is not None and latest.vc[self.shard] >= counter:
                self.skipped_writes += 1  # Thomas's write rule: an older write loses
                continue
            store.install(key, value, deleted, vc, 0, txn_id)

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
            for key in self.store.keys_in_range(lo, hi):
                version = self.store.latest_at_or_below(key, vw)
                if version is not None and not version.deleted:
                    found.append((key, version.value))
                    if len(found) >= limit:
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

