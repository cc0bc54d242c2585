"""Simulated server processes: production's host, RPC core and codecs on virtual time.

A ``SimServer`` is what ``store/node/server.py`` is, minus the operating system: the same
``ReplicaHost`` (``store.node.host``) on an RPC endpoint that runs the real C core
(``sim_endpoint``: a ``store.rpc.sim.SimRpc`` on the simulated network), with Paxos messages
batched and encoded as the gRPC replication transport sends them (``SimStream``), and
timers on virtual time. Every message between processes crosses the network as the bytes
production sends. ``SimCluster`` builds the servers of a cluster: a leader of every shard in
the first region, and with more regions a follower of every shard in each of the others.

A broken invariant in a replica stops its server, as in production: the host hands the
exception to ``SimServer``, which records it (``SimCluster.fatal``) and crashes the server.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from typing import Any

from store.config import MERIDIAN_RPC_SETTINGS
from store.core.cm import CM_STREAM, ConfigMember
from store.core.errors import InvalidRequest
from store.core.follower import ShardFollower
from store.core.partition import Partitioner
from store.core.paxos import DEFAULT_STREAM_SETTINGS, PaxosMessage, StreamSettings
from store.core.replica import Probe, ShardLeader
from store.core.settings import DEFAULT_SETTINGS, Settings
from store.core.txn import Procedures
from store.core.vclock import EMPTY
from store.core.watermark import LocalCounter, LocalWatermarks
from store.node.host import ReplicaHost, restore_follower
from store.proto.convert import BATCH_MESSAGES_MAX, parse_batch, to_batch
from store.protocol.cluster_map import ClusterMap
from store.rpc import Nexus, RpcSettings
from store.rpc.sim import SimRpc
from store.sim.disk import SimDisk
from store.sim.loop import Simulator
from store.sim.network import MS, Link, Network

# Records after which a simulated disk asks its follower for a fresh snapshot (drawn per
# disk): often enough that restarts find snapshots at many points of the stream.
SIM_SNAPSHOT_EVERY = (20, 100, 400)

REGIONS = ("us", "eu", "ap")


def leader_address(shard: int) -> str:
    return f"leader/{shard}"


def follower_address(region: str, shard: int) -> str:
    return f"{region}/follower/{shard}"


def cm_address(region: str) -> str:
    return f"{region}/cm"


def sim_endpoint(
    nexus: Nexus, network: Network, address: str, settings: RpcSettings | None
) -> SimRpc:
    """An RPC endpoint on the cluster simulator's network, which it asks to be woken."""
    return SimRpc(nexus, network, address, settings, wake=network.arm)


class SimStream:
    """The replication transport of one process on the simulated network.

    As in production (``store.node.replication``): messages queued during one event go out
    together, one batch per destination, encoded by ``store.proto.convert``; what arrives is
    parsed strictly (a malformed batch is counted and dropped) and handed over in order.
    """

    def __init__(
        self,
        sim: Simulator,
        network: Network,
        address: str,
        on_message: Callable[[str, PaxosMessage], None],
    ) -> None:
        self.sim = sim
        self.network = network
        self.address = address
        self.on_message = on_message
        self._queues: dict[str, list[PaxosMessage]] = {}
        self._flush_scheduled = False
        self.bad_batches = 0
        network.listen(address, self)

    def send(self, dst: str, message: PaxosMessage) -> None:
        self._queues.setdefault(dst, []).append(message)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.sim.after(0, self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        queues, self._queues = self._queues, {}
        if self.network.is_down(self.address):
            return
        for dst, messages in queues.items():
            for start in range(0, len(messages), BATCH_MESSAGES_MAX):
                batch = to_batch(self.address, messages[start : start + BATCH_MESSAGES_MAX])
                self.network.send_stream(self.address, dst, batch.SerializeToString())

    def deliver(self, now_ns: int, src: str, data: bytes) -> None:
        try:
            sender, messages = parse_batch(data)
        except InvalidRequest:
            self.bad_batches += 1
            return
        for message in messages:
            self.on_message(sender, message)


class SimServer:
    """One server process of the simulated cluster (see the module doc)."""

    def __init__(
        self,
        sim: Simulator,
        network: Network,
        replica: ShardLeader | ShardFollower | ConfigMember,
        region: str,
        *,
        rpc_settings: RpcSettings,
        request_bytes_max: int,
        on_fatal: Callable[[str, BaseException], None],
        disk: SimDisk | None = None,
    ) -> None:
        self.sim = sim
        self.disk = disk
        self.network = network
        self.replica = replica
        self.address = replica.address
        self.region = region
        self._on_fatal = on_fatal
        network.add(self.address, region)
        nexus = Nexus()
        self.rpc = sim_endpoint(nexus, network, self.address, rpc_settings)
        self.stream = SimStream(sim, network, self.address, self._on_stream)
        self.host = ReplicaHost(
            replica,
            self.rpc,
            sim,
            peer_address=str,
            stream_send=self.stream.send,
            request_bytes_max=request_bytes_max,
            on_fatal=self._fatal,
            durable=disk,
        )
        self.host.register(nexus)
        self.crashed = False

    def start(self) -> None:
        self.host.start()

    def _on_stream(self, src: str, message: PaxosMessage) -> None:
        self.host.on_stream_message(src, message)

    def _fatal(self, exc: BaseException) -> None:
        self.crash()
        self._on_fatal(self.address, exc)

    def crash(self) -> None:
        """The process dies: no more sending, receiving or timers."""
        if self.crashed:
            return
        self.crashed = True
        self.host.close()
        self.rpc.crash()
        self.network.crash(self.address)
        if self.disk is not None:
            self.disk.crash()


class SimCluster:
    """The servers of one simulated cluster, built and started on ``network``."""

    def __init__(
        self,
        sim: Simulator,
        network: Network,
        shards: int,
        procedures: Procedures,
        *,
        partitioner: Partitioner | None = None,
        settings: Settings = DEFAULT_SETTINGS,
        regions: Sequence[str] = REGIONS[:1],
        wan_rtt_ms: float = 50.0,
        breaks: frozenset[str] = frozenset(),
        probe: Probe | None = None,
        stream_settings: StreamSettings = DEFAULT_STREAM_SETTINGS,
        rpc_settings: RpcSettings = MERIDIAN_RPC_SETTINGS,
        disk_sync_ns: Sequence[int] | None = None,
    ) -> None:
        self.sim = sim
        self.network = network
        # With sync latencies: every process has a disk (store.sim.disk), kept across its
        # crashes, whose latency is drawn from them; a restarted process recovers its
        # acceptor from it.
        self.disk_sync_ns = disk_sync_ns
        self.disks: dict[str, SimDisk] = {}
        self.partitioner = partitioner or Partitioner(shards)
        self.regions = list(regions)
        self.settings = settings
        self.rpc_settings = rpc_settings
        self.leader_addresses = [leader_address(s) for s in range(shards)]
        self.servers: list[SimServer] = []
        self.leaders: list[ShardLeader] = []
        self.followers: dict[int, list[ShardFollower]] = {s: [] for s in range(shards)}
        self.shards = shards
        # With followers, a configuration manager member in every region (docs/recovery.md).
        self.cm_members = [cm_address(region) for region in self.regions] if len(self.regions) > 1 else []
        self.procedures = procedures
        self.breaks = breaks
        self.probe = probe
        self.stream_settings = stream_settings
        self.cm: list[ConfigMember] = []
        # Broken invariants: (address, exception, traceback), in the order they happened.
        self.fatal: list[tuple[str, BaseException, str]] = []
        self.restores = 0  # restarted replicas that went on from their own snapshot
        one_way_ns = int(wan_rtt_ms * MS / 2)
        for i, a in enumerate(self.regions):
            for b in self.regions[i + 1 :]:
                network.set_link(a, b, Link(latency_ns=one_way_ns, jitter_ns=max(1, one_way_ns // 10)))
        home, *others = self.regions
        # The workers of one shard share a counter, as the processes of one machine share
        # a SharedCounter in production (none with one worker: the leader counts itself).
        workers = self.partitioner.workers
        counters = [LocalCounter() for _ in range(shards // workers)] if workers > 1 else None
        # And a watermark board, as they share a SharedWatermarks file.
        boards = (
            [LocalWatermarks(shards // workers, workers) for _ in range(shards // workers)]
            if workers > 1 else None
        )
        for shard in range(shards):
            leader = ShardLeader(
                shard, self.leader_addresses, self.partitioner, procedures, settings,
                breaks=breaks, probe=probe,
                followers=[follower_address(region, shard) for region in others],
                stream_settings=stream_settings, cm_members=self.cm_members,
                counter=counters[shard // workers] if counters is not None else None,
                board=boards[shard // workers] if boards is not None else None,
            )
            self.leaders.append(leader)
            self._serve(leader, home)
            for region in others:
                follower = ShardFollower(
                    shard, follower_address(region, shard), stream_settings, probe=probe,
                    cm_members=self.cm_members, settings=settings, partitioner=self.partitioner,
                    procedures=procedures, breaks=breaks,
                )
                self.followers[shard].append(follower)
                self._serve(follower, region)
        self.initial_map = ClusterMap(
            0, self.leader_addresses,
            [[follower_address(region, shard) for region in others] for shard in range(shards)],
        )
        initial = self.initial_map
        if self.cm_members:
            for region, address in zip(self.regions, self.cm_members, strict=True):
                member = ConfigMember(address, self.cm_members, initial, settings, stream_settings)
                self.cm.append(member)
                self._serve(member, region)

    def _serve(self, replica: ShardLeader | ShardFollower | ConfigMember, region: str) -> None:
        disk = None
        if self.disk_sync_ns is not None:
            disk = self.disks.get(replica.address)
            if disk is None:
                disk = self.disks[replica.address] = SimDisk(
                    self.sim, self.sim.rng.choice(self.disk_sync_ns),
                    lies="fsync" in self.breaks,
                    snapshot_every=self.sim.rng.choice(SIM_SNAPSHOT_EVERY),
                )
        self.servers.append(
            SimServer(
                self.sim, self.network, replica, region,
                rpc_settings=self.rpc_settings,
                request_bytes_max=self.settings.request_bytes_max,
                on_fatal=self._record_fatal,
                disk=disk,
            )
        )

    def _record_fatal(self, address: str, exc: BaseException) -> None:
        self.fatal.append((address, exc, "".join(traceback.format_exception(exc))))

    def start(self) -> None:
        for server in self.servers:
            server.start()

    def preload(self, key: str, value: Any) -> None:
        """Loads a key on its shard's leader and followers (every shard's, for a replicated
        table) before the cluster serves."""
        if self.partitioner.is_replicated(key):
            shards: Sequence[int] = range(len(self.leaders))
        else:
            shards = (self.partitioner.shard_of(key),)
        for shard in shards:
            self.leaders[shard].preload(key, value)
            for follower in self.followers[shard]:
                follower.store.install(key, value, False, EMPTY, 0, 0)

    def server(self, address: str) -> SimServer:
        """The server at ``address`` now (the restarted one, if it crashed and came back)."""
        return [server for server in self.servers if server.address == address][-1]

    def restart(self, address: str) -> ShardFollower | ConfigMember:
        """The crashed process at ``address`` starts again as ``meridian serve --rejoin``
        does. A shard replica rejoins its shard (docs/recovery.md "Rejoining"): with empty
        memory, or with a disk, with the acceptor it recovers from what the disk kept (it
        votes at once), going on from its own snapshot if it may (``restore_follower``),
        else copying its store from a live replica. A configuration manager member (disks
        only) relearns its map from the CM stream with the acceptor its disk kept. The
        crashed server stays in ``servers``: what its acceptor accepted before the crash
        counted then (``acceptors``)."""
        crashed = self.server(address)
        assert crashed.crashed, f"{address} is running"
        replica = crashed.host.replica
        disk = crashed.disk
        if isinstance(replica, ConfigMember):
            assert disk is not None, "a CM member restarts only with a disk"
            member = ConfigMember(
                address, self.cm_members, self.initial_map, self.settings,
                self.stream_settings, now_ns=self.sim.now_ns,
                acceptor=disk.recover(CM_STREAM, self.stream_settings),
            )
            self.cm.append(member)
            self._serve(member, crashed.region)
            self.servers[-1].start()
            return member
        follower = ShardFollower(
            replica.shard, address, self.stream_settings, now_ns=self.sim.now_ns,
            probe=self.probe, cm_members=self.cm_members, settings=self.settings,
            partitioner=self.partitioner, procedures=self.procedures, breaks=self.breaks,
            rejoining=True,
            acceptor=disk.recover(replica.shard, self.stream_settings) if disk else None,
        )
        snapshot = disk.read_snapshot() if disk is not None else None
        restored = restore_follower(follower, snapshot, self.initial_map)
        self._serve(follower, crashed.region)
        if restored:
            assert snapshot is not None
            self.restores += 1
            self.servers[-1].host.restored(follower, snapshot.slot)
        self.servers[-1].start()
        return follower

    def all_replicas(self) -> list[ShardLeader | ShardFollower]:
        """Every shard replica ever hosted, crashed or not, as it is now."""
        return [
            server.host.replica for server in self.servers
            if isinstance(server.host.replica, ShardLeader | ShardFollower)
        ]

    def acceptors(self, shard: int) -> list[Any]:
        """Every acceptor of ``shard``'s stream whose votes count (``DurabilityOracle``).
        Without disks: every process's, a crashed one's as it was then (what it accepted
        counted then). With disks: per address, what its disk holds (``SimDisk.acceptor``),
        running or not: a vote counts once it is synced, which is what "committed" promises.
        An object that changed hands (a promoted follower's acceptor is its leader's)
        counts once."""
        found: list[Any] = []
        disks_seen: set[str] = set()
        for server in self.servers:
            replica = server.host.replica
            if not isinstance(replica, ShardLeader | ShardFollower) or replica.shard != shard:
                continue
            if server.disk is not None:
                if server.address not in disks_seen:
                    disks_seen.add(server.address)
                    if server.disk.acceptor is not None:
                        found.append(server.disk.acceptor)
                continue
            if replica.stream is None:
                continue
            acceptor = replica.stream.acceptor
            if all(acceptor is not seen for seen in found):
                found.append(acceptor)
        return found

    def server_of(self, replica: object) -> SimServer:
        return next(server for server in self.servers if server.host.replica is replica)

    def unsettled(self) -> list[str]:
        """What recovery has not finished (docs/recovery.md): a shard with no live leader,
        a live replica behind the map's epoch, an ended epoch whose FVW is not applied."""
        if not self.cm:
            return []
        live_cm = [
            server.host.replica for server in self.servers
            if not server.crashed and isinstance(server.host.replica, ConfigMember)
        ]
        if not live_cm:
            return ["no configuration manager member alive"]
        cluster_map = self.final_map()
        problems = []
        leaders = self.current_leaders()
        for shard, leader in enumerate(leaders):
            if leader is None or leader.address != cluster_map.leaders[shard]:
                problems.append(f"shard {shard}: no live leader of epoch {cluster_map.epoch}")
        for replica in self.live_replicas():
            if isinstance(replica, ShardLeader) and replica.retired:
                continue
            if isinstance(replica, ShardFollower) and replica.rejoining:
                problems.append(f"{replica.address}: restarted, still copying its state")
                continue
            if replica.epoch != cluster_map.epoch or replica.fvw_applied != cluster_map.epoch - 1:
                problems.append(
                    f"{replica.address}: epoch {replica.epoch}, FVW applied through "
                    f"{replica.fvw_applied}; the map is at epoch {cluster_map.epoch}"
                )
        return problems

    def final_map(self) -> ClusterMap:
        """The most advanced cluster map any configuration manager member holds."""
        return max((member.map for member in self.cm), key=lambda m: (m.epoch, m.fvw_epoch()))

    def live_replicas(self) -> list[ShardLeader | ShardFollower]:
        """The shard replicas of servers still running, as they are now (a promoted
        follower is its leader object)."""
        return [
            server.host.replica for server in self.servers
            if not server.crashed and isinstance(server.host.replica, ShardLeader | ShardFollower)
        ]

    def current_leaders(self) -> list[ShardLeader | None]:
        """Per shard, the live leader of the highest epoch that is not retired (None: none)."""
        found: list[ShardLeader | None] = [None] * self.shards
        for replica in self.live_replicas():
            if isinstance(replica, ShardLeader) and not replica.retired:
                best = found[replica.shard]
                if best is None or replica.epoch > best.epoch:
                    found[replica.shard] = replica
        return found

    def current_followers(self) -> dict[int, list[ShardFollower]]:
        found: dict[int, list[ShardFollower]] = {s: [] for s in range(self.shards)}
        for replica in self.live_replicas():
            if isinstance(replica, ShardFollower):
                found[replica.shard].append(replica)
        return found

    def locks_held(self) -> int:
        return sum(
            replica.store.locked_count() for replica in self.live_replicas()
            if isinstance(replica, ShardLeader) and not replica.retired
        )
