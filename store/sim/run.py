"""Running simulated clusters: one seed, or many, each history checked.

``run_seed`` builds a cluster of server processes (``store.sim.cluster``: production's host,
RPC core and codecs on virtual time) and client processes running the SDK's own logic
(``store.sim.client``), runs the workload under the requested faults, stops the nemesis,
lets the system settle with the faults healed — until it is quiet, within ``settle_ms`` —
and checks what happened:

* the history, with the list-append (Elle-style) or the bank checker;
* the oracles of ``store.sim.oracles``: clock dominance at every certification, dependency
  closure at every vector watermark any replica held, every follower snapshot read during
  the run, and with followers the durability of every COMMITTED a client heard and the
  convergence of every follower with its leader;
* that no lock is left held, every client got its answer, and no server stopped on a
  broken invariant.

A failing seed is reported with the command that replays it exactly (every option).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from jepsen.checkers.bank import check_bank
from jepsen.history import write_history
from store.client.protocol import ClientSettings, TxnResult
from store.core.partition import Partitioner, PrefixPartitioner, WorkerPartitioner
from store.core.paxos import DEFAULT_STREAM_SETTINGS
from store.core.replica import ShardLeader
from store.core.settings import BREAKABLE_STEPS, DEFAULT_SETTINGS
from store.core.txn import Procedures
from store.core.watermark import clock_watermark
from store.sim import SCENARIO_NAMES
from store.sim.client import History, SdkProcess, SnapshotReads, WorkloadClient
from store.sim.cluster import REGIONS, SimCluster, follower_address, leader_address
from store.sim.loop import Simulator
from store.sim.network import MS, US, Faults, Network
from store.sim.oracles import DurabilityOracle, Recorder, divergence
from store.sim.workloads import Bank, ListAppend, register_bank

CLIENT_PREFIX = "client/"
# How often the settle phase looks whether the cluster has gone quiet.
SETTLE_CHECK_NS = 50 * MS
# A state copy's pieces (Settings.transfer_piece_bytes is 256 KiB): a simulated store is a
# few KB, and its copy must take many pieces, the store changing under it, as a real one does.
SIM_TRANSFER_PIECE_BYTES = 512
# Idle timings drawn per seed (FoundationDB's "buggify" of configuration): production's
# defaults, or the 10 ms a user may set. An idle stream heartbeats every 100 ms by default,
# so a crash seldom finds slots in flight; seeds with 10 ms keep reaching the recovery
# paths of accepted-but-unannounced slots (``--break takeover`` is caught by 2 of 40 seeds
# with only the defaults, by 13 of 40 with only 10 ms).
SIM_IDLE_INTERVALS_NS = (100 * MS, 10 * MS)
# With --disk, a sync's latency, drawn per process's disk: a fast NVMe drive, this machine's
# disk (about 0.15 ms per fsync), a slow one, a busy one, one behind a saturated controller
# (slower than a wide-area round trip: a leader's own vote is then the last to be durable).
SIM_SYNC_LATENCIES_NS = (20 * US, 150 * US, 2 * MS, 10 * MS, 80 * MS)


@dataclass
class SimOptions:
    shards: int = 3
    workers: int = 1  # worker processes per shard leader, each with its own stream
    clients: int = 8
    # Workload clients that share one client process (one SDK client, one RPC endpoint, one
    # client id and sequence of transaction ids), as an application's concurrent
    # transactions share its Client.
    clients_per_process: int = 4
    workload: str = "list-append"
    loss: float = 0.0
    duplicate: float | None = None  # default: the loss rate, and 0.02 when loss is 0
    reorder: float | None = None  # default: 0.05
    receive_batch_us: int = 0  # Faults.receive_batch_ns, in microseconds (0: off)
    duration_ms: int = 400
    settle_ms: int = 6000
    partitions: bool = False
    break_step: str | None = None
    speculation: bool = True
    regions: int = 1  # 1: leaders only; 3: a follower of every shard in two more regions
    wan_rtt_ms: float = 50.0
    scan_fraction: float = 0.15  # list-append: share of micro-operations that scan a range
    reverse_fraction: float = 0.0  # list-append: share of scans that read from the range's end
    clear_fraction: float = 0.0  # list-append: share of operations that clear retired keys
    replicated: bool = False  # the workload's table is replicated: read locally, written everywhere
    snapshot_fraction: float = 0.1  # with followers: share of client operations that read one
    crashes: bool = False  # crash shard leaders during the load (followers take over)
    disk: bool = False  # processes sync their acceptors to a disk that survives a crash
    scenario: str | None = None  # a scripted fault schedule (SCENARIOS) on top of the rest

    def faults(self) -> Faults:
        duplicate = self.duplicate if self.duplicate is not None else (self.loss or 0.02)
        reorder = self.reorder if self.reorder is not None else 0.05
        return Faults(
            loss=self.loss, duplicate=duplicate, reorder=reorder,
            receive_batch_ns=self.receive_batch_us * 1000,
        )


# The command-line flag of every option: ``replay_command`` writes them all.
OPTION_FLAGS = {
    "shards": "--shards", "workers": "--workers", "clients": "--clients", "clients_per_process": "--clients-per-process",
    "workload": "--workload", "loss": "--loss",
    "duplicate": "--duplicate", "reorder": "--reorder", "receive_batch_us": "--receive-batch-us",
    "duration_ms": "--duration-ms",
    "settle_ms": "--settle-ms", "partitions": "--partitions", "break_step": "--break",
    "speculation": "--no-speculation", "regions": "--regions", "wan_rtt_ms": "--wan-rtt-ms",
    "scan_fraction": "--scan-fraction", "reverse_fraction": "--reverse-fraction",
    "clear_fraction": "--clear-fraction",
    "snapshot_fraction": "--snapshot-fraction",
    "crashes": "--crashes", "scenario": "--scenario", "disk": "--disk",
    "replicated": "--replicated",
}
assert set(OPTION_FLAGS) == {f.name for f in fields(SimOptions)}, "a SimOptions field has no flag"


@dataclass
class SeedResult:
    seed: int
    transactions: int
    committed: int
    failed: int
    indeterminate: int
    cross_shard: int
    anomalies: int
    anomaly_kinds: list[str]
    details: dict[str, Any] = field(default_factory=dict)
    history_path: str | None = None
    snapshot_reads: int = 0
    settled_ms: int = 0
    # Undecided transactions whose coordinator gave up on an unreachable participant.
    coordinator_gave_up: int = 0
    # Transactions a participant aborted on its own: their locks expired before they voted.
    locks_expired: int = 0
    # Client operations by the error they ended with (Aborted after its retries, ...).
    client_errors: dict[str, int] = field(default_factory=dict)
    # Recovery: epochs the cluster went through (failovers), processes crashed, and
    # transactions rolled back.
    failovers: int = 0
    crashes: int = 0
    restarts: int = 0
    majority_crashes: int = 0  # times two replicas of one shard were down at once (--disk)
    restores: int = 0  # restarted replicas that went on from their own snapshot (--disk)
    rolled_back: int = 0
    ranges_cleared: int = 0  # list-append: clear_range transactions that committed
    # Messages live shard leaders handled in a step with others (--receive-batch-us).
    joined_messages: int = 0

    @property
    def valid(self) -> bool:
        return self.anomalies == 0


def run_seed(seed: int, options: SimOptions, out_dir: Path | None = None) -> SeedResult:
    if options.break_step is not None and options.break_step not in BREAKABLE_STEPS:
        raise ValueError(f"--break takes one of {BREAKABLE_STEPS}")
    if options.scenario is not None and (
        options.scenario not in SCENARIOS or options.regions != 3
    ):
        raise ValueError(f"--scenario takes one of {sorted(SCENARIOS)}, with --regions 3")
    # Drawn from the seed apart from the simulator's own generator, so the draw does not
    # shift the rest of the schedule.
    idle_ns = SIM_IDLE_INTERVALS_NS[random.Random(seed ^ 0x1D1E).randrange(2)]
    sync_ns = SIM_SYNC_LATENCIES_NS if options.disk else None
    if options.break_step in ("fsync", "own-vote") and not options.disk:
        raise ValueError(f"--break {options.break_step} needs --disk")
    sim = Simulator(seed)
    network = Network(sim, options.faults())
    partitioner: Partitioner = Partitioner(options.shards)
    if options.replicated:  # the workload's table on every shard (PrefixPartitioner)
        partitioner = PrefixPartitioner(options.shards, field=None, replicated_tables=["la", "bank"])
    if options.workers != 1:
        partitioner = WorkerPartitioner(partitioner, options.workers)
    procedures = Procedures()
    register_bank(procedures)
    breaks = frozenset({options.break_step}) if options.break_step else frozenset()
    recorder = Recorder(partitioner.shard_of)
    regions = REGIONS[: options.regions]
    cluster = SimCluster(
        sim, network, partitioner.shard_count, procedures,
        partitioner=partitioner,
        settings=DEFAULT_SETTINGS.with_overrides(
            speculation=options.speculation,
            transfer_piece_bytes=SIM_TRANSFER_PIECE_BYTES,
            gossip_idle_interval_ns=idle_ns,
        ),
        stream_settings=DEFAULT_STREAM_SETTINGS.with_overrides(
            heartbeat_idle_interval_ns=idle_ns,
            **SCENARIO_STREAM_SETTINGS.get(options.scenario or "", {}),
        ),
        regions=regions, wan_rtt_ms=options.wan_rtt_ms, breaks=breaks, probe=recorder,
        disk_sync_ns=sync_ns,
    )
    with_followers = options.regions > 1
    oracle = (
        DurabilityOracle(cluster.all_replicas, options.regions, cluster.acceptors, recorder.draws)
        if with_followers else None
    )

    workload: Any
    if options.workload == "bank":
        workload = Bank(sim.rng)
        for key, balance in workload.initial_data().items():
            cluster.preload(key, balance)
            recorder.preload(key, balance)
    elif options.workload == "list-append":
        workload = ListAppend(
            sim.rng, scan_fraction=options.scan_fraction,
            reverse_fraction=options.reverse_fraction, clear_fraction=options.clear_fraction,
        )
    else:
        raise ValueError(f"no workload {options.workload!r}")

    snapshots = None
    if with_followers and options.snapshot_fraction > 0:
        def check_snapshot(shard: int, keys: list[str], reply: Any) -> None:
            recorder.check_snapshot(shard, keys, reply)
            if oracle is not None:
                oracle.check(f"a snapshot of shard {shard}", reply.vw)

        def followers_now() -> dict[int, list[str]]:
            return {s: [f.address for f in fs] for s, fs in cluster.current_followers().items()}

        snapshots = SnapshotReads(followers_now, check_snapshot, options.snapshot_fraction)

    def committed(label: str, result: TxnResult) -> None:
        recorder.client_committed(result.txn)
        if oracle is not None:
            oracle.check(f"{label} committed", result.vc)

    history = History()
    stop_at = options.duration_ms * MS
    if options.clients_per_process < 1:
        raise ValueError("clients_per_process must be at least 1")
    processes = [
        SdkProcess(
            sim, network, f"{CLIENT_PREFIX}{p}", regions[0], cluster.leader_addresses, partitioner,
            ClientSettings(), cluster.rpc_settings, cm_members=cluster.cm_members,
        )
        for p in range(-(-options.clients // options.clients_per_process))
    ]
    clients = [
        WorkloadClient(
            processes[i // options.clients_per_process],
            history, i, options.clients, workload, stop_at, committed, snapshots,
        )
        for i in range(options.clients)
    ]
    cluster.start()
    for client in clients:
        client.start()
    nemesis = None
    if options.partitions:
        nemesis = PartitionNemesis(sim, network, cluster, with_followers, stop_at)
        nemesis.start()
    if options.scenario is not None:
        SCENARIOS[options.scenario](sim, network, cluster)
    crashes = None
    if options.crashes:
        if not with_followers:
            raise ValueError("--crashes needs followers to take over (--regions 3)")
        crashes = CrashNemesis(sim, cluster, stop_at)
        crashes.start()

    sim.run_until(stop_at)
    while nemesis is not None and network.is_partitioned():
        sim.run_until(sim.now_ns + SETTLE_CHECK_NS)  # the last partition runs its course
    network.heal()
    network.faults = Faults()
    healed_at = sim.now_ns
    settle_end = healed_at + options.settle_ms * MS

    def quiet() -> bool:
        if any(client.busy() for client in clients) or cluster.locks_held():
            return False
        if not with_followers:
            return True
        return not cluster.unsettled() and not divergence(
            cluster.current_leaders(), cluster.current_followers()
        )

    while sim.now_ns < settle_end and not quiet():
        sim.run_until(min(settle_end, sim.now_ns + SETTLE_CHECK_NS))

    kinds: dict[str, int] = {}
    details: dict[str, Any] = {}

    def found(kind: str, problems: list[str]) -> None:
        if problems:
            kinds[kind] = len(problems)
            details[kind] = problems[:3]

    if options.workload == "bank":
        assert isinstance(workload, Bank)
        verdict = check_bank(history.ops, total=workload.total)
        if not verdict["valid"]:
            for kind in verdict["error_types"]:
                kinds[kind] = kinds.get(kind, 0) + 1
            details["bank"] = verdict["first_error"]
    else:
        from jepsen.checkers.list_append import check_list_append

        verdict = check_list_append(history.ops)
        if not verdict["valid"]:
            for kind in verdict["anomaly_types"]:
                kinds[kind] = kinds.get(kind, 0) + verdict["anomaly_counts"][kind]
            details["not"] = sorted(verdict.get("not", []))
    if cluster.cm:
        recorder.conclude({
            epoch: clock_watermark(fvw, partitioner.workers)
            for epoch, fvw in cluster.final_map().fvw.items()
        })
    recorder.check_snapshots()
    found("vc-dominance", recorder.dominance)
    found("dependency-uncovered", recorder.uncovered_dependencies())
    found("dependency-closure", recorder.closure_violations())
    found("snapshot-mismatch", recorder.snapshots)
    if oracle is not None:
        found("committed-before-durable", oracle.violations)
        found("follower-diverged", divergence(cluster.current_leaders(), cluster.current_followers()))
        found("recovery-unfinished", cluster.unsettled())
    found("lost-committed", recorder.lost_committed())
    found("rollback-incomplete", recorder.rollback_violations())
    found("invariant-broken", [f"{address}: {text}" for address, _, text in cluster.fatal])
    leaked = cluster.locks_held()
    if leaked:
        kinds["leaked-locks"] = leaked
    found("client-never-answered", [c.process.address for c in clients if c.busy()])

    history_path = None
    if out_dir is not None:
        seed_dir = out_dir / str(seed)
        seed_dir.mkdir(parents=True, exist_ok=True)
        write_history(seed_dir / "history.edn", history.ops)
        history_path = str(seed_dir / "history.edn")

    counts = {k: sum(c.counts[k] for c in clients) for k in clients[0].counts}
    client_errors: dict[str, int] = {}
    for client in clients:
        for name, count in client.errors.items():
            client_errors[name] = client_errors.get(name, 0) + count
    return SeedResult(
        seed=seed,
        transactions=counts["ok"] + counts["fail"] + counts["info"],
        committed=counts["ok"],
        failed=counts["fail"],
        indeterminate=counts["info"],
        cross_shard=counts["cross_shard"],
        anomalies=sum(kinds.values()),
        anomaly_kinds=sorted(kinds),
        details=details,
        history_path=history_path,
        snapshot_reads=recorder.snapshots_checked,
        settled_ms=(sim.now_ns - healed_at) // MS,
        coordinator_gave_up=sum(
            replica.coordinator.counters["gave_up"] for replica in cluster.live_replicas()
            if isinstance(replica, ShardLeader)
        ),
        locks_expired=sum(
            server.host.replica.participant.expired for server in cluster.servers
            if isinstance(server.host.replica, ShardLeader)
        ),
        failovers=max((member.map.epoch for member in cluster.cm), default=0),
        crashes=crashes.crashed if crashes is not None else 0,
        restarts=crashes.restarted if crashes is not None else 0,
        majority_crashes=crashes.majority_down if crashes is not None else 0,
        restores=cluster.restores,
        rolled_back=len(recorder.rolled_back_txns),
        ranges_cleared=getattr(workload, "ranges_cleared", 0),
        joined_messages=sum(
            replica.joined_messages for replica in cluster.live_replicas()
            if isinstance(replica, ShardLeader)
        ),
        client_errors=dict(sorted(client_errors.items())),
    )


class PartitionNemesis:
    """Now and then cuts one shard leader (or, with followers, one whole region) off from
    everything else, then heals. Half of the leader partitions are one-way: the leader
    still sends but hears nothing.

    The nemesis looks inside the cluster to strike where it hurts (as a targeted fault
    injector does): it prefers a leader that a transaction about to be decided still has to
    install at (it holds the transaction's locks, and the coordinator waits for nothing
    more from it), else one that holds locks for transactions in certification. Those
    transactions then lose a participant mid-way: undecided ones must be aborted; decided
    ones must install once it is back. Most
    partitions are short; about one in four outlasts the coordinators' retry budget
    (``peer_attempts_max`` tries, ``peer_retry_ns`` apart) and the RPC sessions that still
    hold the last tries (``session_timeout_ns``), so that a coordinator does give up on an
    undecided transaction, and must keep retrying a decided one's installs for as long as
    it takes. It strikes only while the load runs; a partition still on when the load stops
    runs its course."""

    # How long a strike looks for the leader it prefers before it takes another.
    TARGET_WAIT_STEPS = 200
    TARGET_WAIT_STEP_NS = 100 * US

    def __init__(
        self, sim: Simulator, network: Network, cluster: SimCluster, by_region: bool, stop_at: int
    ) -> None:
        self.sim = sim
        self.network = network
        self.cluster = cluster
        self.by_region = by_region
        self.stop_at = stop_at
        settings = cluster.settings
        self.long_ns = (
            settings.peer_attempts_max * settings.peer_retry_ns
            + cluster.rpc_settings.session_timeout_ns
        )
        self.strikes = 0
        self.long_strikes = 0

    def start(self) -> None:
        self.sim.after(self.sim.rng.randrange(20 * MS, 100 * MS), self._strike)

    def _strike(self) -> None:
        sim, network = self.sim, self.network
        if sim.now_ns >= self.stop_at:
            return
        if self.by_region and sim.rng.random() < 0.5:
            region = sim.rng.choice(self.cluster.regions)
            # Half of them cut servers only: the clients still reach both sides (as in
            # Jepsen), so a client that heard of a new leader's commit may then ask a
            # deposed leader that does not know it yet (its lease must stop it). Half of
            # those cut the leaders' region for longer than the leader timeout: the shards
            # fail over while their old leaders still serve clients.
            servers_only = sim.rng.random() < 0.5
            lasts = None
            if servers_only and sim.rng.random() < 0.5:
                leaders = [x for x in self.cluster.current_leaders() if x is not None]
                if leaders:
                    region = network.region_of(sim.rng.choice(leaders).address)
                    timeout = self.cluster.settings.leader_timeout_ns
                    lasts = timeout + sim.rng.randrange(200 * MS, 800 * MS)
            inside = [a for a in network.addresses() if network.region_of(a) == region]
            self._cut(inside, one_way=False, servers_only=servers_only, lasts=lasts)
        else:
            self._strike_leader(0)

    def _strike_leader(self, waited: int) -> None:
        targets = self._about_to_install()
        if not targets and waited < self.TARGET_WAIT_STEPS:
            self.sim.after(self.TARGET_WAIT_STEP_NS, self._strike_leader, waited + 1)
            return
        targets = targets or [
            leader.address for leader in self.cluster.current_leaders()
            if leader is not None and leader.participant.held_count()
        ]
        live = [leader.address for leader in self.cluster.current_leaders() if leader is not None]
        if not (targets or live):
            self.sim.after(self.TARGET_WAIT_STEP_NS, self._strike_leader, waited)
            return
        chosen = self.sim.rng.choice(targets or live)
        self._cut([chosen], one_way=self.sim.rng.random() < 0.5)

    def _cut(
        self, inside: list[str], one_way: bool, servers_only: bool = False,
        lasts: int | None = None,
    ) -> None:
        sim, network = self.sim, self.network
        outside = [a for a in network.addresses() if a not in inside]
        if servers_only:
            inside = [a for a in inside if not a.startswith(CLIENT_PREFIX)]
            outside = [a for a in outside if not a.startswith(CLIENT_PREFIX)]
        if one_way:
            network.block(outside, inside)
        else:
            network.partition(inside, outside)
        self.strikes += 1
        if lasts is not None:
            pass
        elif sim.rng.random() < 0.25:
            self.long_strikes += 1
            lasts = sim.rng.randrange(self.long_ns + 200 * MS, 2 * self.long_ns)
        else:
            lasts = sim.rng.randrange(20 * MS, 300 * MS)
        sim.after(lasts, self._heal)

    def _about_to_install(self) -> list[str]:
        """Leaders that validating transactions will install at, and wait for no more."""
        addresses = self.cluster.leader_addresses
        found = set()
        for leader in self.cluster.current_leaders():
            if leader is None:
                continue
            for shard in leader.coordinator.install_targets_pending_decision():
                if shard != leader.shard:
                    found.add(addresses[shard])
        return sorted(found)

    def _heal(self) -> None:
        self.network.heal()
        self.sim.after(self.sim.rng.randrange(50 * MS, 300 * MS), self._strike)


class CrashNemesis:
    """Crashes shard replicas while the load runs and restarts them: the process vanishes
    with all it held in memory (a follower takes over a crashed leader), and comes back after
    a while, copies a live follower's state and rejoins its shard (docs/recovery.md). Without
    disks, one replica of a shard is down at a time, until its restarted replica votes again
    (a second would leave its stream without a majority, and two lost memories can lose a
    chosen value). With disks (``--disk``) two of a shard's three may be down at once (down:
    crashed, or restarted and still copying its state; one must hold a store to copy): the
    shard stops until one is back, and a restarted replica votes with the acceptor its disk
    kept. The victim is a leader two times in three, else a follower. The first crash comes
    in the first half of the load; more may follow."""

    def __init__(self, sim: Simulator, cluster: SimCluster, stop_at: int) -> None:
        self.sim = sim
        self.cluster = cluster
        self.stop_at = stop_at
        self.crashed = 0
        self.restarted = 0
        self.majority_down = 0
        self._down: dict[int, list[str]] = {}  # shard -> addresses of its crashed replicas
        self.down_max = 2 if cluster.disk_sync_ns is not None else 1

    def start(self) -> None:
        self.sim.after(self.sim.rng.randrange(self.stop_at // 10, self.stop_at // 2), self._crash)

    def _crash(self) -> None:
        sim = self.sim
        if sim.now_ns >= self.stop_at:
            return
        rng = sim.rng
        if not self.crashed or rng.random() < 0.5:
            candidates: list[Any] = [
                leader for leader in self.cluster.current_leaders() if leader is not None
            ]
        else:
            candidates = [f for fs in self.cluster.current_followers().values() for f in fs]
        # A restarted replica still copying its state counts as down too: without disks it
        # does not vote yet; with them it votes, but holds no store to copy from. (A whole
        # shard, and a whole cluster, down at once: --scenario whole-cluster.)
        out = {shard: len(addresses) for shard, addresses in self._down.items()}
        for fs in self.cluster.current_followers().values():
            for f in fs:
                if not f.voting:
                    out[f.shard] = out.get(f.shard, 0) + 1
        candidates = [r for r in candidates if out.get(r.shard, 0) < self.down_max]
        if candidates:
            victim = rng.choice(candidates)
            down = self._down.setdefault(victim.shard, [])
            down.append(victim.address)
            self.majority_down += len(down) > 1
            self.cluster.server_of(victim).crash()
            self.crashed += 1
            # Down for a while: sometimes longer than the failover takes, sometimes not.
            sim.after(rng.randrange(100 * MS, 3000 * MS), self._restart, victim.shard, victim.address)
        if rng.random() < 0.6:
            sim.after(rng.randrange(1, max(2, (self.stop_at - sim.now_ns))), self._crash)

    def _restart(self, shard: int, address: str) -> None:
        self._down[shard].remove(address)
        self.cluster.restart(address)
        self.restarted += 1


def rejoin_behind(sim: Simulator, network: Network, cluster: SimCluster) -> None:
    """A scripted schedule (TigerBeetle's replica tests: cut this, kill that) for the rule
    that a restarted replica does not vote before it has caught up with its shard's
    current leader (``Acceptor``, docs/recovery.md "Rejoining"), on shard 0 of a
    three-region cluster (run it for at least 3.5 s of load):

    * 200 ms: the leader (us) stops reaching the ap follower, so what it commits from then
      on is chosen with the eu follower's vote alone;
    * 800 ms: the leader crashes; eu stops reaching ap and the leader's address; 50 ms
      later the crashed replica restarts with empty memory. The configuration manager
      makes eu, the most up-to-date follower, leader of epoch 1, but eu's phase 1 cannot
      complete: every other replica is cut off from it. The restarted replica copies the
      state of the one replica it reaches, ap, which lacks what eu and the old leader chose;
    * 1500 ms: eu is cut off from the configuration manager too; a leader timeout later ap
      becomes leader of epoch 2, and its phase 1 needs one vote besides its own.

    Had the restarted replica voted as soon as its copy was in, ap's phase 1 would be
    complete with two replicas that both lack those slots: committed transactions lost, and
    another value chosen for their slots. It waits until it has caught up with the current
    leader, which cannot happen before eu is back: when the load ends every fault heals,
    and ap's phase 1 finds the slots at eu."""
    leader = leader_address(0)
    eu, ap = follower_address("eu", 0), follower_address("ap", 0)
    cms = [address for address in network.addresses() if address.endswith("/cm")]

    def crash_leader_and_isolate_eu() -> None:
        cluster.server(leader).crash()
        network.heal()  # the restarted replica will reach ap
        network.partition([eu], [ap, leader])

    sim.after(200 * MS, lambda: network.partition([leader], [ap]))
    sim.after(800 * MS, crash_leader_and_isolate_eu)
    sim.after(850 * MS, lambda: cluster.restart(leader))
    sim.after(3300 * MS, lambda: network.partition([eu], cms))


def majority_crash(sim: Simulator, network: Network, cluster: SimCluster) -> None:
    """A scripted schedule for durability (``--disk``): two of shard 0's three replicas lose
    power together, and what they synced must be enough (run it for at least 2 s of load):

    * 200 ms: the leader (us) stops reaching the ap follower, so what it commits from then
      on is chosen with the eu follower's vote alone;
    * 800 ms: the leader and eu crash together, and the network heals. Only ap is left, and
      it lacks every slot chosen since 200 ms;
    * 850 ms: eu restarts on its disk. The configuration manager makes ap leader; ap's phase
      1 needs eu's vote, and eu's acceptor, rebuilt from its disk, reports the slots;
    * 1600 ms: the old leader restarts on its disk and rejoins as a follower.

    With ``--break fsync`` (a disk that acknowledges syncs it did not do) eu comes back
    without its last votes, ap's phase 1 completes without the slots, and transactions
    clients heard COMMITTED are lost."""
    if cluster.disk_sync_ns is None:
        raise ValueError("--scenario majority-crash needs --disk")
    leader = leader_address(0)
    eu, ap = follower_address("eu", 0), follower_address("ap", 0)

    def crash_two() -> None:
        cluster.server(leader).crash()
        cluster.server(eu).crash()
        network.heal()

    sim.after(200 * MS, lambda: network.partition([leader], [ap]))
    sim.after(800 * MS, crash_two)
    sim.after(850 * MS, lambda: cluster.restart(eu))
    sim.after(1600 * MS, lambda: cluster.restart(leader))


def whole_cluster(sim: Simulator, network: Network, cluster: SimCluster) -> None:
    """Every process of the cluster loses power at once (``--disk``), shard replicas and
    configuration manager members alike, at 800 ms, and each comes back on its disk within
    the next 300 ms, in a random order (``meridian up`` on a cluster's data directories).
    Nothing is left alive to copy a store from: followers go on from their own snapshots
    (``restore_follower``), the CM members relearn the map from their acceptors, and every
    shard fails over, since its leader (which may have led since its last snapshot) copies
    its state from a live follower. Then a crash nemesis may strike as usual."""
    if cluster.disk_sync_ns is None or not cluster.cm:
        raise ValueError("--scenario whole-cluster needs --disk and several regions")

    def crash_all() -> None:
        addresses = [server.address for server in cluster.servers if not server.crashed]
        for address in addresses:
            cluster.server(address).crash()
        network.heal()
        for address in addresses:
            sim.after(sim.rng.randrange(10 * MS, 300 * MS), cluster.restart, address)

    sim.after(800 * MS, crash_all)


def far_behind(sim: Simulator, network: Network, cluster: SimCluster) -> None:
    """A follower cut off for longer than its leader keeps slots (``log_retained_slots`` is
    32 in this scenario, ``SCENARIO_STREAM_SETTINGS``): shard 0's eu follower loses every
    link from 200 ms to 1700 ms while the load goes on, so when it is back, the slots it
    lacks are gone from the leader's log. It copies a live replica's state and follows on
    from there (``ShardFollower._check_far_behind``); without that it never catches up, and
    the settle phase ends with it diverged. Run it with ``--disk``: the durability oracle
    then counts the votes on the disks, which keep every slot, where the acceptors keep 32."""
    if cluster.disk_sync_ns is None:
        raise ValueError("--scenario far-behind needs --disk")
    eu = follower_address("eu", 0)
    others = [address for address in network.addresses() if address != eu]
    sim.after(200 * MS, lambda: network.partition([eu], others))
    sim.after(1700 * MS, network.heal)


SCENARIOS: dict[str, Callable[[Simulator, Network, SimCluster], None]] = {
    "rejoin-behind": rejoin_behind,
    "majority-crash": majority_crash,
    "far-behind": far_behind,
    "whole-cluster": whole_cluster,
}
# Stream settings a scenario needs (over the seed's own).
SCENARIO_STREAM_SETTINGS: dict[str, dict[str, Any]] = {"far-behind": {"log_retained_slots": 32}}
assert set(SCENARIOS) == set(SCENARIO_NAMES), "store.sim.SCENARIO_NAMES names every scenario"


def run_many(seeds: list[int], options: SimOptions, out_dir: Path | None = None) -> dict[str, Any]:
    results = [run_seed(seed, options, out_dir) for seed in seeds]
    return summarize(results, options)


def summarize(results: list[SeedResult], options: SimOptions) -> dict[str, Any]:
    kinds: dict[str, int] = {}
    for result in results:
        for kind in result.anomaly_kinds:
            kinds[kind] = kinds.get(kind, 0) + 1
    failing = [r for r in results if not r.valid]
    transactions = sum(r.transactions for r in results)
    summary: dict[str, Any] = {
        "seeds": len(results),
        "histories_checked": len(results),
        "workload": options.workload,
        "shards": options.shards,
        "workers": options.workers,
        "loss": options.loss,
        "break": options.break_step,
        "speculation": options.speculation,
        "regions": options.regions,
        "transactions": transactions,
        "transactions_committed": sum(r.committed for r in results),
        "transactions_failed": sum(r.failed for r in results),
        "transactions_indeterminate": sum(r.indeterminate for r in results),
        "cross_shard_fraction": round(sum(r.cross_shard for r in results) / max(transactions, 1), 4),
        "snapshot_reads_checked": sum(r.snapshot_reads for r in results),
        "coordinator_gave_up": sum(r.coordinator_gave_up for r in results),
        "locks_expired": sum(r.locks_expired for r in results),
        "leader_messages_batched": sum(r.joined_messages for r in results),
        "failovers": sum(r.failovers for r in results),
        "seeds_with_failover": sum(1 for r in results if r.failovers),
        "crashes": sum(r.crashes for r in results),
        "restarts": sum(r.restarts for r in results),
        "majority_crashes": sum(r.majority_crashes for r in results),
        "restores": sum(r.restores for r in results),
        "rolled_back": sum(r.rolled_back for r in results),
        "ranges_cleared": sum(r.ranges_cleared for r in results),
        "lost_committed": sum(1 for r in results if "lost-committed" in r.anomaly_kinds),
        "client_errors": _add_counts(r.client_errors for r in results),
        "anomalies": sum(r.anomalies for r in results),
        "anomaly_kinds": sorted(kinds),
        "seeds_with_anomalies": {kind: count for kind, count in sorted(kinds.items())},
        "failing_seeds": [r.seed for r in failing][:20],
    }
    if failing:
        first = failing[0]
        summary["first_failure"] = {**asdict(first), "replay": replay_command(first.seed, options)}
    return summary


def _add_counts(parts: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for part in parts:
        for name, count in part.items():
            total[name] = total.get(name, 0) + count
    return dict(sorted(total.items()))


def replay_command(seed: int, options: SimOptions, out_dir: str | None = None) -> str:
    """The command that replays ``seed`` exactly: every option is written out."""
    parts = ["meridian sim", f"--seed {seed}"]
    for name, flag in OPTION_FLAGS.items():
        value = getattr(options, name)
        if name in ("partitions", "crashes", "disk", "replicated"):
            if value:
                parts.append(flag)
        elif name == "speculation":
            if not value:
                parts.append(flag)
        elif value is not None:
            parts.append(f"{flag} {value}")
    if out_dir is not None:
        parts.append(f"--out {out_dir}")
    return " ".join(parts)


def dumps(summary: dict[str, Any]) -> str:
    return json.dumps(summary, sort_keys=False)
