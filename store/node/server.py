"""A server process: a shard's leader or follower, or a configuration manager (CM) member,
hosted on UDP, gRPC and the event loop.

This module adds no protocol logic (DESIGN.md §7). The replica is hosted by
``store.node.host.ReplicaHost`` — the same adapter the simulator drives — on an RPC
endpoint over UDP (clients and peer leaders), the gRPC replication transport (Paxos between
regions) and the event loop's timers. What is here is what only a process has: loading the
procedures, sockets, the status request, signals, logs and the pause monitor.

A broken invariant stops the process: the host hands the exception to ``_fatal``, which
logs it (with its traceback, in the JSON log and on stderr) and exits with status 70, so
that ``meridian up`` (and any supervisor) sees the process end and reports why.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack

from store import wire
from store.config import SCHED_POLICIES, ClusterConfig, ConfigError, ReplicaNode
from store.core.cm import CM_STREAM, ConfigMember
from store.core.errors import InvalidRequest
from store.core.follower import ShardFollower
from store.core.paxos import DEFAULT_STREAM_SETTINGS, Acceptor, PaxosMessage
from store.core.replica import ShardLeader
from store.core.txn import Procedures
from store.node.durable import WalDurable
from store.node.generator import (
    GENERATORS_ENV,
    GenerateSpec,
    Generator,
    LocalRun,
    generators_enabled,
    micro_keys,
)
from store.node.host import ReplicaHost, restore_follower
from store.node.metrics import MetricsServer, ServerCollector
from store.node.replication import ReplicationTransport, TlsIdentity
from store.node.snapshot import SnapshotWriter, read_snapshot
from store.protocol.cluster_map import ClusterMap
from store.rpc import Nexus, ReqHandle
from store.rpc._native import SharedCounter, SharedWatermarks
from store.rpc.aio import Rpc, new_event_loop
from store.rpc.timers import PreciseTimers

log = logging.getLogger("meridian.server")

# The exit status of a process stopped by a broken invariant (EX_SOFTWARE).
EXIT_INVARIANT_BROKEN = 70


def load_procedures(config: ClusterConfig) -> Procedures:
    """Imports every ``module:function`` of the cluster file and lets it register."""
    for path in config.python_path:
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    procedures = Procedures()
    for spec in config.procedures:
        module_name, function_name = spec.split(":")
        register = getattr(importlib.import_module(module_name), function_name)
        register(procedures)
    return procedures


# The collector's thresholds in a server: a transaction allocates about a hundred objects,
# so CPython's default (a young collection every 700 allocations, an older one every 10 of
# those) collected every few transactions; measured on bench/core.py's mix, 30-50% of the
# time. Young collections every 50,000 allocations cost the same per object and run far
# less often; what survives is frozen once a second anyway (below).
GC_THRESHOLDS = (50_000, 20, 100)


def _fatal(exc: BaseException) -> None:
    """A broken invariant: say so loudly and stop the process (never serve on)."""
    text = "".join(traceback.format_exception(exc))
    log.critical("invariant broken; stopping", extra={"fields": {"error": repr(exc), "traceback": text}})
    print(f"meridian: invariant broken, stopping:\n{text}", file=sys.stderr, flush=True)
    logging.shutdown()
    os._exit(EXIT_INVARIANT_BROKEN)


def _peer_address(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def initial_map(config: ClusterConfig) -> ClusterMap:
    """The cluster map of epoch 0: the cluster file's leaders and followers."""
    return ClusterMap(
        0,
        config.leader_addresses(),
        [[f"{host}:{port}" for _, (host, port) in shard.followers] for shard in config.shards],
    )


def shard_counter(config: ClusterConfig, unit: int) -> SharedCounter | None:
    """The counter the workers of ``unit``'s shard share (None with one worker): a file
    under the run directory, mapped by every worker of the shard on this machine."""
    if config.workers == 1:
        return None
    directory = config.run_dir / "counters"
    directory.mkdir(parents=True, exist_ok=True)
    return SharedCounter(directory / f"shard-{unit // config.workers}", create=True)


def shard_board(config: ClusterConfig, unit: int) -> SharedWatermarks | None:
    """The watermark board the workers of ``unit``'s shard share (None with one worker):
    a file beside the shard's counter, one slot per worker."""
    if config.workers == 1:
        return None
    directory = config.run_dir / "counters"
    directory.mkdir(parents=True, exist_ok=True)
    return SharedWatermarks(
        directory / f"shard-{unit // config.workers}.vw", config.shard_count, config.workers,
        create=True,
    )


class ShardServer:
    """One server process: a shard's leader, one of its followers, or a CM member
    (``node.role``). A follower the CM promotes becomes its shard's leader in place: the
    host swaps the replica, and ``replica`` is always the one serving now."""

    def __init__(
        self,
        config: ClusterConfig,
        shard: int,
        loop: asyncio.AbstractEventLoop,
        node: ReplicaNode | None = None,
        on_fatal: Callable[[BaseException], None] = _fatal,
        rejoin: bool = False,
        breaks: frozenset[str] = frozenset(),
    ) -> None:
        self.config = config
        self.shard = shard
        self.loop = loop
        self.node = node or config.node("leader", shard)
        self.procedures = load_procedures(config)
        stream_settings = DEFAULT_STREAM_SETTINGS.with_overrides(**config.stream)
        cm_members = config.cm_addresses()
        replica: ShardLeader | ShardFollower | ConfigMember
        # Every replica's acceptor records go to its write-ahead logs (store.node.durable);
        # a follower keeps a snapshot of its state beside them (store.node.snapshot).
        directory = config.process_data_dir(self.node)
        self.durable, recovered = WalDurable.open(
            directory, loop, fsync=config.fsync, on_fatal=on_fatal
        )
        self.durable.data_bytes_max = config.data_bytes_max
        stream_id = CM_STREAM if self.node.role == "cm" else shard
        records = recovered.get(stream_id, [])
        self.recovered_records = len(records)
        self.snapshots: SnapshotWriter | None = None
        # What a restart found on disk (the status says it): the snapshot's delivery
        # point and watermark, or None.
        self.recovered: dict[str, Any] | None = None
        snapshot = None
        try:
            if self.node.role != "cm":
                self.snapshots = self.durable.snapshots = SnapshotWriter(
                    directory, loop, fsync=config.fsync, on_fatal=on_fatal
                )
                snapshot = read_snapshot(directory)
            if (records or snapshot is not None) and not rejoin:
                raise ConfigError(
                    f"{self.node.name}: {directory} holds the write-ahead log or snapshot of "
                    f"an earlier run ({len(records)} records); a process with a past rejoins "
                    f"its shard (meridian serve --rejoin; meridian up does so for a whole "
                    f"cluster), or move the directory away to start afresh"
                )
        except BaseException:
            self._close_disk()
            raise
        acceptor = None
        if records:
            acceptor = Acceptor.recover(stream_id, records, stream_settings)
        elif snapshot is not None:
            acceptor = Acceptor(stream_id, stream_settings)  # it never promised nor voted
        if self.node.role == "cm":
            replica = ConfigMember(
                self.node.address, cm_members, initial_map(config), config.settings,
                stream_settings, now_ns=time.monotonic_ns(),
                acceptor=acceptor if rejoin else None,
            )
        elif rejoin:
            # Restarted: with its acceptor as its log kept it, if it has one (then it votes
            # at once); goes on from its own snapshot if it may (ShardFollower.restore), else
            # copies its state from a live replica of its shard first (docs/recovery.md).
            follower = ShardFollower(
                shard, self.node.address, stream_settings, now_ns=time.monotonic_ns(),
                cm_members=cm_members, settings=config.settings,
                partitioner=config.partitioner(), procedures=self.procedures, rejoining=True,
                breaks=breaks, acceptor=acceptor,
            )
            if restore_follower(follower, snapshot, initial_map(config)):
                assert snapshot is not None
                self.recovered = {
                    "slot": snapshot.slot, "epoch": snapshot.epoch,
                    "watermark": snapshot.vw[shard],
                }
            replica = follower
        elif self.node.role == "leader":
            replica = ShardLeader(
                shard,
                config.leader_addresses(),
                config.partitioner(),
                self.procedures,
                config.settings,
                now_ns=time.monotonic_ns(),
                followers=[f"{host}:{port}" for _, (host, port) in config.shards[shard].followers],
                stream_settings=stream_settings,
                cm_members=cm_members,
                breaks=breaks,
                counter=shard_counter(config, shard),
                board=shard_board(config, shard),
            )
        else:
            replica = ShardFollower(
                shard, self.node.address, stream_settings, now_ns=time.monotonic_ns(),
                cm_members=cm_members, settings=config.settings,
                partitioner=config.partitioner(), procedures=self.procedures, breaks=breaks,
            )
        nexus = Nexus()
        host, port = self.node.rpc
        if config.transport == "rdma":
            from store.rpc.rdma import require_rdma

            require_rdma()  # raises, saying why (no device here, or not built)
        self.rpc = Rpc.udp(nexus, host, port, settings=config.rpc, loop=loop)
        security = config.security
        secret = security.secret() if security is not None else None
        if secret is not None:
            self.rpc.set_secret(secret)
        self._refused_seen = 0  # sessions refused for want of the secret, already logged
        routes = config.replication_routes(self.node)
        self.transport: ReplicationTransport | None = None
        if routes:
            self.transport = ReplicationTransport(
                self.node.address,
                config.replication_listen(self.node),
                routes,
                self._on_paxos,
                loop=loop,
                tls=tls_identity(config, self.node),
            )
        self.timers = PreciseTimers(loop)
        self.host = ReplicaHost(
            replica,
            self.rpc,
            self.timers,
            peer_address=_peer_address,
            stream_send=self._send_paxos if self.transport is not None else None,
            request_bytes_max=config.settings.request_bytes_max,
            on_fatal=on_fatal,
            durable=self.durable,
        )
        if self.recovered is not None:
            assert isinstance(replica, ShardFollower)
            self.host.restored(replica, self.recovered["slot"])
        self.durable.checkpoint = self.host.checkpoint
        self.host.register(nexus)
        nexus.register_req_func(wire.STATUS, self._on_status)
        nexus.register_req_func(wire.GENERATE, self._on_generate)
        # The running load generator: the micro one, or a registered workload's task.
        self._generator: Generator | asyncio.Task[None] | None = None
        self.started_at = time.time()
        self.counters: dict[str, Any] = self.host.counters
        self.transport_routes = set(routes)
        self.metrics: MetricsServer | None = None  # started by start()
        self.ready = False
        self.host.start()

    async def start(self) -> None:
        if self.transport is not None:
            await self.transport.start()
        listen = self.config.metrics_listen(self.node)
        if listen is not None:
            self.metrics = MetricsServer(ServerCollector(self.metrics_snapshot), *listen)
            await self.metrics.start()
        self.ready = True  # every endpoint is up (status says so: ProcessCluster waits for it)

    def report_refusals(self) -> None:
        """Logs sessions refused for want of the cluster secret since the last call."""
        refused = self.rpc.stats()["sm_unauthenticated"]
        if refused > self._refused_seen:
            log.warning(
                "refused session packets without the cluster secret",
                extra={"fields": {"count": refused - self._refused_seen, "total": refused}},
            )
            self._refused_seen = refused

    def metrics_snapshot(self) -> dict[str, Any]:
        """What the metrics endpoint shows (store/node/metrics.py), read between two steps."""
        replica = self.replica
        state: dict[str, Any] = {
            "role": self.node.role, "shard": self.node.shard, "region": self.node.region,
            "rpc": self.rpc.stats(),
            "timer_lateness": self.timers.lateness(),
        }
        if isinstance(replica, ConfigMember):
            state["epoch"] = replica.map.epoch
            state["vector_watermark"] = {}
        elif isinstance(replica, ShardFollower):
            state["role"] = "follower"
            state["epoch"] = replica.epoch
            state["vector_watermark"] = dict(replica.vw.items())
            state["applied_slots"] = replica.applied_slots
            state["keys"] = replica.store.key_count()
        else:
            state["role"] = "retired" if replica.retired else "leader"
            coordinator = replica.coordinator
            state["epoch"] = replica.epoch
            state["vector_watermark"] = dict(replica.vw.entries)
            state["keys"] = replica.store.key_count()
            state["coordinator"] = {
                "counters": dict(coordinator.counters),
                "aborts_by_cause": dict(coordinator.aborts_by_cause),
                "in_flight": coordinator.in_flight(),
                "certify_latency": coordinator.certify_latency,
                "commit_latency": coordinator.commit_latency,
            }
            stream = replica.stream
            if stream is not None:
                state["follower_lag_slots"] = {peer: stream.lag_slots(peer) for peer in stream.peers}
                state["stream"] = {
                    "batch_wait": stream.batch_wait, "choose_latency": stream.choose_latency,
                }
        if self.transport is not None:
            state["replication"] = {**self.transport.stats(), "queued": self.transport.queued()}
        return state

    def _on_paxos(self, src: str, message: PaxosMessage) -> None:
        self.host.on_stream_message(src, message)

    def _send_paxos(self, dst: str, message: PaxosMessage) -> None:
        if self.transport is not None and dst in self.transport_routes:
            self.transport.send(dst, message)

    @property
    def replica(self) -> ShardLeader | ShardFollower | ConfigMember:
        return self.host.replica

    def _close_disk(self) -> None:
        self.durable.close()

    def _disk_status(self) -> dict[str, Any] | None:
        durable = self.durable
        if durable is None:
            return None
        return {
            "data_dir": str(durable.directory),
            "fsync": durable.fsync,
            "recovered_records": self.recovered_records,
            "records_written": durable.records_written,
            "syncs": durable.syncs,
            "inline_syncs": durable.inline_syncs,  # on the loop's thread (a fast disk)
            "sync_ms_mean": round(durable.sync_ns_total / durable.syncs / 1e6, 3) if durable.syncs else 0.0,
            "log_bytes": durable.disk_bytes(),
            "data_bytes": durable.data_bytes(),
            "data_bytes_peak": durable.peak_bytes,
            "data_bytes_max": durable.data_bytes_max,
            "compactions": durable.compactions,
            # Rewrites that could not bring the directory under data_bytes_max (what the
            # acceptor keeps, log_retained_slots, does not fit in it).
            "over_bound": durable.over_bound,
            # What this process came back with: its snapshot's slot and watermark (a
            # follower that restored it), else None.
            "recovered": self.recovered,
            "snapshots": {
                "written": snapshots.written, "slot": snapshots.last_slot,
                "bytes": snapshots.last_bytes, "ms": round(snapshots.last_ms, 1),
            } if (snapshots := self.snapshots) is not None else None,
        }

    def _metrics_url(self) -> str:
        listen = self.config.metrics_listen(self.node)
        return "" if listen is None else f"http://{listen[0]}:{listen[1]}/metrics"

    def _on_generate(self, handle: ReqHandle, payload: bytes) -> bytes | None:
        """Runs in-server load (store/node/generator.py) and answers when it is done."""

        def refuse(why: str) -> bytes:
            return bytes(msgpack.packb({"error": why}))

        if not generators_enabled():
            return refuse(f"load generators are off on this server (start it with {GENERATORS_ENV}=1)")
        if not isinstance(self.replica, ShardLeader) or self.replica.retired:
            return refuse("not a shard leader")
        if self._generator is not None:
            return refuse("a load generator is already running here")
        try:
            spec = GenerateSpec.from_wire(payload)
            workload = None if spec.workload == "micro" else self.procedures.workload(spec.workload)
        except InvalidRequest as exc:
            return refuse(str(exc))
        if workload is not None:
            self._generate_registered(handle, spec, workload)
            return None
        shards = len(self.config.shards)
        keys = micro_keys(self.config.partitioner(), shards, spec.keys_per_shard)

        def done(result: dict[str, Any]) -> None:
            self._generator = None
            self.rpc.enqueue_response(handle, bytes(msgpack.packb(result)))

        self._generator = Generator(
            self.host, self.shard, keys, spec, workers=self.config.workers,
            now_s=time.monotonic, soon=self.loop.call_soon, done=done,
        )
        self._generator.start()
        return None

    def _generate_registered(
        self, handle: ReqHandle, spec: GenerateSpec, workload: Callable[[LocalRun], Awaitable[dict[str, Any]]]
    ) -> None:
        """A workload a procedures module registered: a task on this loop; its answer (or
        the error that ended it) goes back when it returns."""
        run = LocalRun(
            self.host, spec, self.shard, self.config.partitioner(), self.loop.call_soon,
            self.loop.create_future,
        )

        async def go() -> None:
            try:
                answer = bytes(msgpack.packb(await workload(run)))
            except Exception as exc:  # the workload's own failure: the asker is told
                log.exception("load generator %r failed", spec.workload)
                failed = f"workload {spec.workload!r} failed: {type(exc).__name__}: {exc}"
                answer = bytes(msgpack.packb({"error": failed}))
            self._generator = None
            self.rpc.enqueue_response(handle, answer)

        self._generator = self.loop.create_task(go())

    def _on_status(self, handle: ReqHandle, payload: bytes) -> bytes:
        replica = self.replica
        if isinstance(replica, ConfigMember):
            cluster_map = replica.map
            cm_status = {
                "shard": -1,
                "address": replica.address,
                "region": self.node.region,
                "role": "cm",
                "pid": os.getpid(),
                "ready": self.ready,
                "metrics": self._metrics_url(),
                "uptime_s": round(time.time() - self.started_at, 3),
                "leading": replica.leading(),
                "epoch": cluster_map.epoch,
                "leaders": list(cluster_map.leaders),
                "followers": [list(f) for f in cluster_map.followers],
                "failovers": replica.failovers,
                "disk": self._disk_status(),
                "counters": dict(self.counters),
            }
            return bytes(msgpack.packb(cm_status))
        if isinstance(replica, ShardFollower):
            follower_status = {
                "shard": self.shard,
                "address": replica.address,
                "region": self.node.region,
                "role": "follower",
                "rejoining": replica.rejoining,
                "voting": replica.voting,
                "pid": os.getpid(),
                "ready": self.ready,
                "metrics": self._metrics_url(),
                "uptime_s": round(time.time() - self.started_at, 3),
                "epoch": replica.epoch,
                "label": self.node.label,
                "watermark": replica.vw[replica.clock],
                "vector_watermark": {str(k): v for k, v in sorted(replica.vw.items())},
                "keys": replica.store.key_count(),
                "applied_slots": replica.applied_slots,
                "disk": self._disk_status(),
                "counters": {
                    "applied_records": replica.applied_records,
                    **self.counters,
                    **(self.transport.stats() if self.transport else {}),
                },
            }
            return bytes(msgpack.packb(follower_status))
        coordinator = replica.coordinator
        status = {
            "shard": self.shard,
            "address": replica.address,
            "region": self.node.region,
            "role": "retired" if replica.retired else "leader",
            "pid": os.getpid(),
            "ready": self.ready,
            "metrics": self._metrics_url(),
            "uptime_s": round(time.time() - self.started_at, 3),
            "epoch": replica.epoch,
            "label": self.node.label,  # "3", or with workers "3.1" (shard 3, worker 1)
            # With workers: this worker's claim (its stream's), the shard's is in the vector.
            "watermark": replica.durable_watermark(),
            "stream_chosen_slot": replica.stream.chosen_through if replica.stream is not None else None,
            "vector_watermark": {str(k): v for k, v in sorted(replica.vw.entries.items())},
            "keys": replica.store.key_count(),
            "locks_held": replica.store.locked_count(),
            "in_flight": coordinator.in_flight(),
            "disk": self._disk_status(),
            "follower_lag_slots": (
                {peer: replica.stream.lag_slots(peer) for peer in replica.stream.peers}
                if replica.stream is not None else {}
            ),
            # Sums and counts of the stream's latencies (metrics: the histograms): a reader
            # takes means over an interval from two readings.
            "stream_latency": (
                {
                    name: {"count": h.observations, "sum_ns": h.sum_ns}
                    for name, h in (
                        ("batch_wait", replica.stream.batch_wait),
                        ("choose", replica.stream.choose_latency),
                    )
                }
                if replica.stream is not None else {}
            ),
            # How late the replica's deadlines ran (store/rpc/timers.py), summed likewise.
            "timer_lateness": self.timers.lateness(),
            "counters": {
                **coordinator.counters,
                "locks_expired": replica.participant.expired,
                **self.counters,
                **(self.transport.stats() if self.transport else {}),
            },
            "procedures": self.procedures.names(),
        }
        packed: bytes = msgpack.packb(status)
        return packed

    async def close(self) -> None:
        if self.metrics is not None:
            await self.metrics.close()
        self.host.close()
        self.timers.close()
        if self.transport is not None:
            await self.transport.close()
        self.rpc.close()
        self._close_disk()


class PauseMonitor:
    """Measures what stalls the process: the cyclic garbage collector's pauses and the event
    loop's lag (a callback scheduled every 50 ms that runs late). Logged when long, and
    reported in the status counters.

    It also keeps the collector's pauses short. A server holds millions of long-lived objects
    (versions, chains) and CPython's full collection scans them all: measured here, 50 ms to
    1.1 s pauses under TPC-C, long enough for clients' sessions to time out. The store's
    data holds no reference cycles (reference counting frees it), so every second the
    objects that survived are moved to the permanent generation (``gc.freeze``), and a
    collection only scans what is younger than that.
    """

    FREEZE_EVERY_TICKS = 20  # 50 ms ticks: once a second

    def __init__(self, loop: asyncio.AbstractEventLoop, counters: dict[str, Any]) -> None:
        gc.set_threshold(*GC_THRESHOLDS)
        self.loop = loop
        self.counters = counters
        counters.update(gc_pause_max_ms=0.0, gc_pauses_over_50ms=0, loop_lag_max_ms=0.0)
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)
        self._expected = loop.time() + 0.05
        self._ticks = 0
        loop.call_later(0.05, self._tick)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        pause_ms = (time.perf_counter() - self._gc_started) * 1000
        self.counters["gc_pause_max_ms"] = max(self.counters["gc_pause_max_ms"], round(pause_ms, 2))
        if pause_ms > 50:
            self.counters["gc_pauses_over_50ms"] += 1
            log.warning("long gc pause", extra={"fields": {"ms": round(pause_ms, 1), **info}})

    def _tick(self) -> None:
        now = self.loop.time()
        lag_ms = (now - self._expected) * 1000
        if lag_ms > self.counters["loop_lag_max_ms"]:
            self.counters["loop_lag_max_ms"] = round(lag_ms, 2)
        if lag_ms > 100:
            log.warning("event loop stalled", extra={"fields": {"ms": round(lag_ms, 1)}})
        self._expected = now + 0.05
        self._ticks += 1
        if self._ticks % self.FREEZE_EVERY_TICKS == 0:
            gc.freeze()
        self.loop.call_later(0.05, self._tick)


async def _serve(
    config: ClusterConfig, node: ReplicaNode, rejoin: bool, breaks: frozenset[str]
) -> None:
    loop = asyncio.get_running_loop()
    server = ShardServer(config, node.shard, loop, node, rejoin=rejoin, breaks=breaks)
    await server.start()
    PauseMonitor(loop, server.counters)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    parent = os.getppid()
    log.info("serving", extra={"fields": {"shard": node.shard, "role": node.role, "address": node.address, "pid": os.getpid()}})
    how = "rejoining" if rejoin else "serving"
    print(f"shard {node.shard} {node.role} ({node.region}) {how} on {node.address}", flush=True)
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except TimeoutError:
            server.report_refusals()
            if os.getppid() != parent:  # the process that started us is gone: so are we
                log.info("parent exited; stopping")
                break
    log.info("stopping", extra={"fields": {"counters": server.counters}})
    await server.close()


def tls_identity(config: ClusterConfig, node: ReplicaNode) -> TlsIdentity | None:
    """``node``'s TLS material, read from where ``[security]`` says (None: no TLS)."""
    security = config.security
    if security is None or not security.tls:
        return None
    assert security.ca is not None
    key_path, cert_path = security.identity_files(node)
    try:
        key, certificate, ca = (p.read_bytes() for p in (key_path, cert_path, security.ca))
    except OSError as exc:
        raise ConfigError(
            f"[security] tls: cannot read {exc.filename}: {exc.strerror} (make the files with "
            f"meridian certs --config FILE)"
        ) from None
    return TlsIdentity(key, certificate, ca, {peer.address: peer.name for peer in config.peers(node)})


def log_name(node: ReplicaNode) -> str:
    return node.name


def apply_sched_policy(name: str) -> None:
    """Puts every thread of this process under ``cluster.sched_policy``'s ``name`` (threads
    started later inherit it from the thread that starts them). ConfigError where the
    system cannot (no such policy, or no permission to leave SCHED_IDLE for 'other')."""
    policy = SCHED_POLICIES[name]
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            if os.sched_getscheduler(tid) != policy:
                os.sched_setscheduler(tid, policy, os.sched_param(0))
        except ProcessLookupError:  # a thread that has just ended
            continue
        except (OSError, AttributeError) as exc:
            raise ConfigError(f"cluster.sched_policy {name!r}: {exc}") from None


def serve(
    config: ClusterConfig, shard: int, role: str = "leader", region: str | None = None,
    rejoin: bool = False,
    breaks: frozenset[str] = frozenset(),
) -> None:
    """Runs one server process until SIGTERM/SIGINT. ``breaks`` switches safety steps off
    (the simulator's ``--break`` mutants), only to show that a checker catches them."""
    from store.node import logs

    node = config.node(role, shard, region)
    logs.setup(config.run_dir / f"{log_name(node)}.log")
    if config.sched_policy != "other":  # "other": the policy it was started with
        apply_sched_policy(config.sched_policy)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        if breaks:
            log.warning("safety steps switched off", extra={"fields": {"breaks": sorted(breaks)}})
            print(f"WARNING: built with broken safety steps {sorted(breaks)} (testing only)", flush=True)
        loop.run_until_complete(_serve(config, node, rejoin, breaks))
    finally:
        loop.close()
