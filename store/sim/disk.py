"""A simulated disk: what a process synced survives its crash, and nothing else is promised.

Each server process of a simulated cluster run with ``--disk`` has one (``SimCluster``); it
outlives the process, as a disk outlives a power cut. The host (``store.node.host``) hands
it the acceptor's records and asks it to sync; the records are kept as the bytes the
write-ahead log stores (``store.core.paxos.encode``, decoded again on recovery), and a sync
completes after a latency drawn per seed. At a crash, the records not yet synced are lost,
except for a random prefix of them (the operating system may have written some back on its
own): a crash may keep more than was synced, never less, and never a record without the
ones before it. A sync in flight at the crash never completes.

A follower's snapshot (``store.node.snapshot``) is kept the same way: written whole after
a latency drawn between a quarter and twice the disk's (another file than the log, it may
land before a log sync started earlier), unless a crash comes first. Every ``snapshot_every`` records the disk
asks for a fresh one, as a server's log compaction does.

``--break fsync`` makes the disk lie, as a log run with ``fsync = false`` does when the
power goes: a sync reports done at once and makes nothing durable, so a crash keeps only a
random prefix of everything written. The simulator must then find a committed transaction
lost once a majority of a shard's replicas crash together (``--scenario majority-crash``).
"""

from __future__ import annotations

from collections.abc import Callable

from store.core.paxos import Acceptor, PaxosMessage, StreamSettings, decode, encode
from store.core.transfer import FollowerState, decode_state, encode_state
from store.sim.loop import Simulator


class SimDisk:
    def __init__(
        self, sim: Simulator, sync_ns: int, *, lies: bool = False, snapshot_every: int = 0
    ) -> None:
        """``snapshot_every``: after that many records, ask the follower on it for a fresh
        snapshot (as a server's log compaction does; 0: only the host's own)."""
        self.sim = sim
        self.sync_ns = sync_ns
        self.lies = lies
        # A follower's snapshot (SnapshotDisk): the bytes a server's file holds, written
        # after the disk's latency; one a crash cuts short is not there.
        self.snapshot: bytes | None = None
        self.snapshot_wanted = False
        self.snapshot_every = snapshot_every
        self._since_snapshot = 0
        self.snapshots = 0
        self.synced: list[bytes] = []
        self._unsynced: list[bytes] = []
        self._crashes = 0  # a sync started before a crash does not complete after it
        self.syncs = 0
        self.lost_records = 0
        # The acceptor the synced records make, kept up to date: what a restart would
        # rebuild, and what counts of this process's votes (SimCluster.acceptors).
        self.acceptor: Acceptor | None = None

    def _made_durable(self, data: list[bytes]) -> None:
        self.synced.extend(data)
        for item in data:
            record = decode(item)
            if self.acceptor is None:
                self.acceptor = Acceptor(record.stream)
            self.acceptor.apply(record)

    def write(self, records: list[PaxosMessage]) -> None:
        self._unsynced.extend(encode(record) for record in records)
        self._since_snapshot += len(records)
        if self.snapshot_every and self._since_snapshot >= self.snapshot_every:
            self._since_snapshot = 0
            self.snapshot_wanted = True

    def save_snapshot(self, state: FollowerState, done: Callable[[int], None]) -> None:
        data = encode_state(state)
        crashes = self._crashes

        def durable() -> None:
            if crashes != self._crashes:
                return
            self.snapshot = data
            self.snapshots += 1
            done(state.slot)

        # Another file than the log: it may reach the disk before a log sync started
        # earlier does (the host must not count on the order).
        self.sim.after(self.sim.rng.randrange(self.sync_ns // 4, 2 * self.sync_ns + 1), durable)

    def read_snapshot(self) -> FollowerState | None:
        """The snapshot a process restarted on this disk reads (``store.node.snapshot``)."""
        return decode_state(self.snapshot) if self.snapshot is not None else None

    def sync(self, done: Callable[[], None]) -> None:
        self.syncs += 1
        if self.lies:
            done()
            return
        count = len(self._unsynced)
        crashes = self._crashes

        def durable() -> None:
            if crashes != self._crashes:
                return
            self._made_durable(self._unsynced[:count])
            del self._unsynced[:count]
            done()

        self.sim.after(self.sync_ns, durable)

    def crash(self) -> None:
        """The power goes: a random prefix of what was not synced survives."""
        kept = self.sim.rng.randrange(len(self._unsynced) + 1) if self._unsynced else 0
        self._made_durable(self._unsynced[:kept])
        self.lost_records += len(self._unsynced) - kept
        self._unsynced.clear()
        self._crashes += 1

    def records(self) -> list[PaxosMessage]:
        return [decode(data) for data in self.synced]

    def recover(self, stream: int, settings: StreamSettings) -> Acceptor:
        """The acceptor a process restarted on this disk rebuilds (``Acceptor.recover``)."""
        return Acceptor.recover(stream, self.records(), settings)
