"""Running simulated clusters: one seed, or many, each history checked.

``run_seed`` builds a cluster of shard leaders and clients on a fresh simulator, runs the
workload under the requested faults, lets the system settle with the faults healed, and
checks what happened:

* the history, with the list-append (Elle-style) or the bank checker;
* the vector-clock dominance invariant of DESIGN.md §3, on every certification;
* that no lock is left held once the load has stopped (every abort path releases what it
  took).

A failing seed is reported with the command that replays it exactly.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jepsen.checkers.bank import check_bank
from jepsen.history import write_history
from store.core.follower import ShardFollower
from store.core.partition import Partitioner
from store.core.replica import ShardLeader
from store.core.settings import DEFAULT_SETTINGS
from store.core.txn import Procedures
from store.core.vclock import VectorClock
from store.sim.client import History, SimClient
from store.sim.geo import REGIONS, DurabilityOracle, divergence, follower_address
from store.sim.host import ReplicaHost
from store.sim.loop import Simulator
from store.sim.network import MS, Faults, Link, Network
from store.sim.workloads import WORKLOADS, Bank, register_bank

BREAKABLE_STEPS = ("validation", "locking")


@dataclass
class SimOptions:
    shards: int = 3
    clients: int = 8
    workload: str = "list-append"
    loss: float = 0.0
    duplicate: float | None = None  # default: the loss rate, and 0.02 when loss is 0
    reorder: float | None = None  # default: 0.05
    duration_ms: int = 400
    settle_ms: int = 6000
    partitions: bool = False
    break_step: str | None = None
    speculation: bool = True
    regions: int = 1  # 1: leaders only; 3: a follower of every shard in two more regions
    wan_rtt_ms: float = 50.0

    def faults(self) -> Faults:
        duplicate = self.duplicate if self.duplicate is not None else (self.loss or 0.02)
        reorder = self.reorder if self.reorder is not None else 0.05
        return Faults(loss=self.loss, duplicate=duplicate, reorder=reorder)


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

    @property
    def valid(self) -> bool:
        return self.anomalies == 0


class _DominanceCheck:
    """Checks vc(T) >= vc(W) for every version W that T read (Mako §4.2), as it happens;
    entries T's sparse clock dropped as durable count (``full``)."""

    def __init__(self) -> None:
        self.clocks: dict[int, VectorClock] = {}
        self.violations: list[str] = []

    def __call__(
        self, txn_id: int, vc: VectorClock, full: VectorClock, read_from: list[int]
    ) -> None:
        for writer in read_from:
            writer_vc = self.clocks.get(writer)
            if writer_vc is not None and not writer_vc <= full:
                self.violations.append(f"txn {txn_id} {full} read from {writer} {writer_vc}")
        self.clocks[txn_id] = vc


def run_seed(seed: int, options: SimOptions, out_dir: Path | None = None) -> SeedResult:
    if options.break_step is not None and options.break_step not in BREAKABLE_STEPS:
        raise ValueError(f"--break takes one of {BREAKABLE_STEPS}")
    sim = Simulator(seed)
    network = Network(sim, options.faults())
    partitioner = Partitioner(options.shards)
    procedures = Procedures()
    register_bank(procedures)
    leaders = [f"leader/{s}" for s in range(options.shards)]
    breaks = frozenset({options.break_step}) if options.break_step else frozenset()
    dominance = _DominanceCheck()
    hosts = []
    regions = REGIONS[: options.regions]
    follower_regions = regions[1:]
    followers: dict[int, list[ShardFollower]] = {s: [] for s in range(options.shards)}
    for shard in range(options.shards):
        replica = ShardLeader(
            shard, leaders, partitioner, procedures,
            DEFAULT_SETTINGS.with_overrides(speculation=options.speculation),
            breaks=breaks, observer=dominance,
            followers=[follower_address(region, shard) for region in follower_regions],
        )
        host = ReplicaHost(sim, network, replica)
        network.add(replica.address, host, regions[0])
        hosts.append(host)
        for region in follower_regions:
            follower = ShardFollower(shard, follower_address(region, shard))
            followers[shard].append(follower)
            follower_host = ReplicaHost(sim, network, follower)  # type: ignore[arg-type]
            network.add(follower.address, follower_host, region)
            hosts.append(follower_host)
    one_way_ns = int(options.wan_rtt_ms * MS / 2)
    for i, a in enumerate(regions):
        for b in regions[i + 1 :]:
            network.set_link(a, b, Link(latency_ns=one_way_ns, jitter_ns=max(1, one_way_ns // 10)))
    leader_replicas = [host.replica for host in hosts if isinstance(host.replica, ShardLeader)]
    oracle = DurabilityOracle(leader_replicas, followers) if follower_regions else None

    workload = WORKLOADS[options.workload](sim.rng)
    if isinstance(workload, Bank):
        for key, balance in workload.initial_data().items():
            leader_replicas[partitioner.shard_of(key)].preload(key, balance)
            for follower in followers[partitioner.shard_of(key)]:
                follower.store.install(key, balance, False, VectorClock(), 0, 0)

    history = History()
    stop_at = options.duration_ms * MS
    clients = [
        SimClient(
            sim, network, history, i, options.clients, workload, partitioner, leaders, stop_at,
            on_committed=oracle.check if oracle is not None else None,
        )
        for i in range(options.clients)
    ]
    for host in hosts:
        host.start()
    for client in clients:
        client.start()
    if options.partitions:
        if follower_regions:
            _schedule_region_partitions(sim, network, list(regions), stop_at)
        else:
            _schedule_partitions(sim, network, leaders, stop_at)

    sim.run_until(stop_at)
    network.heal()
    network.faults = Faults()
    sim.run_until(stop_at + options.settle_ms * MS)

    kinds: dict[str, int] = {}
    details: dict[str, Any] = {}
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
    if dominance.violations:
        kinds["vc-dominance"] = len(dominance.violations)
        details["vc-dominance"] = dominance.violations[:3]
    if oracle is not None:
        if oracle.violations:
            kinds["committed-before-durable"] = len(oracle.violations)
            details["committed-before-durable"] = oracle.violations[:3]
        diverged = divergence(leader_replicas, followers)
        if diverged:
            kinds["follower-diverged"] = len(diverged)
            details["follower-diverged"] = diverged[:3]
    leaked = sum(replica.store.locked_count() for replica in leader_replicas)
    if leaked:
        kinds["leaked-locks"] = leaked
    stuck = [c.address for c in clients if c.current is not None]
    if stuck:
        kinds["client-never-answered"] = len(stuck)

    history_path = None
    if out_dir is not None:
        seed_dir = out_dir / str(seed)
        seed_dir.mkdir(parents=True, exist_ok=True)
        write_history(seed_dir / "history.edn", history.ops)
        history_path = str(seed_dir / "history.edn")

    counts = {k: sum(c.counts[k] for c in clients) for k in clients[0].counts}
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
    )


def _schedule_partitions(sim: Simulator, network: Network, leaders: list[str], stop_at: int) -> None:
    """A nemesis: now and then cut one leader off from the others for a while, then heal."""

    def strike() -> None:
        if sim.now_ns >= stop_at:
            return
        victim = sim.rng.choice(leaders)
        network.partition([victim], [a for a in network.addresses() if a != victim])
        sim.after(sim.rng.randrange(20 * MS, 120 * MS), heal)

    def heal() -> None:
        network.heal()
        sim.after(sim.rng.randrange(50 * MS, 200 * MS), strike)

    sim.after(sim.rng.randrange(20 * MS, 100 * MS), strike)


def _schedule_region_partitions(
    sim: Simulator, network: Network, regions: list[str], stop_at: int
) -> None:
    """A nemesis: now and then cut one region (or the leaders' region) off, then heal."""

    def members(region: str) -> list[str]:
        return [a for a in network.addresses() if network.region_of(a) == region]

    def strike() -> None:
        if sim.now_ns >= stop_at:
            return
        victim = sim.rng.choice(regions)
        inside = members(victim)
        network.partition(inside, [a for a in network.addresses() if a not in inside])
        sim.after(sim.rng.randrange(50 * MS, 300 * MS), heal)

    def heal() -> None:
        network.heal()
        sim.after(sim.rng.randrange(100 * MS, 400 * MS), strike)

    sim.after(sim.rng.randrange(50 * MS, 200 * MS), strike)


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
        "loss": options.loss,
        "break": options.break_step,
        "speculation": options.speculation,
        "regions": options.regions,
        "transactions": transactions,
        "transactions_committed": sum(r.committed for r in results),
        "transactions_failed": sum(r.failed for r in results),
        "transactions_indeterminate": sum(r.indeterminate for r in results),
        "cross_shard_fraction": round(sum(r.cross_shard for r in results) / max(transactions, 1), 4),
        "anomalies": sum(r.anomalies for r in results),
        "anomaly_kinds": sorted(kinds),
        "seeds_with_anomalies": {kind: count for kind, count in sorted(kinds.items())},
        "failing_seeds": [r.seed for r in failing][:20],
    }
    if failing:
        first = failing[0]
        summary["first_failure"] = {**asdict(first), "replay": replay_command(first.seed, options)}
    return summary


def replay_command(seed: int, options: SimOptions) -> str:
    parts = [
        "meridian sim", f"--seed {seed}", f"--shards {options.shards}",
        f"--workload {options.workload}", f"--loss {options.loss}", f"--clients {options.clients}",
    ]
    if options.partitions:
        parts.append("--partitions")
    if not options.speculation:
        parts.append("--no-speculation")
    if options.regions != 1:
        parts.append(f"--regions {options.regions}")
    if options.break_step:
        parts.append(f"--break {options.break_step}")
    return " ".join(parts)


def dumps(summary: dict[str, Any]) -> str:
    return json.dumps(summary, sort_keys=False)
