"""Mako's microbenchmark against a real Meridian cluster (issue 4).

50% read-only and 50% read-modify-write transactions of 4 operations each; an access goes
to another shard than the transaction's home shard with probability 5%; keys uniform, or
zipfian with ``--zipf THETA``; K keys per shard preloaded. The cluster is started here
(separate server processes on loopback) unless ``--connect FILE`` names a running one.

Measured in the same run, ``core_txn_per_s`` is ``bench/core.py`` on the same mix (same
shards, keys per shard, remote fraction, 64 transactions in flight, committed only) on the
pure core in one process: its committed transactions over its time in six runs, three just
before the cluster's load and three just after; ``efficiency`` is the cluster's committed
throughput over it: what the real I/O path (RPC, processes, the SDK) keeps of what the
protocol alone can do on one core. Both figures are rates over spells of the machine around
the same minutes: on a shared host the core's speed moved by 1.9x within seconds (a run of
20,000 transactions at 26,000 and at 49,000 txn/s in the same hour) while the cluster's
15-second figure moved by 10%, so the ratio of the cluster's mean to the core's best run
measured the machine's spell more than the cluster. The best run is reported beside it
(``core_best_txn_per_s``, ``efficiency_vs_best``). The cluster has two cores for two
leaders and the client; the core's figure has one for both leaders and no client.
``submits_per_txn`` is the SUBMIT requests the shard leaders received (their own counters,
read before and after the load) per transaction attempt the clients made: 1.0 when every
transaction costs one request.

``--client-processes N`` spreads the clients over N driver processes, each with its own
SDK client and event loop, started together once all have drawn their transactions; their
counts, latencies, CPU and RPC counters are summed (``client_cpu_us_per_txn`` is then all
of theirs). One process is the default: one Python process drives at most one core, and on
this project's two-core machine it was a serial stage of the load: the leaders waited while
it answered its batch of responses and sent the next requests (the machine 75-78% busy).
Two processes kept it 83-89% busy, but each spent 5-36% more CPU per transaction (smaller
batches): in five alternating pairs (2026-12-06) they committed +3, +20, +4.5, -13.6 and
+7.7% against one, so the default stays one; four cost more than they gave (24 us of client
CPU per transaction against 17-18).

``--sched idle`` (the default) runs the cluster's processes and this one's load under Linux's
SCHED_IDLE policy (``cluster.sched_policy``; the core's runs keep the default): with three
busy processes on two cores, Linux left a runnable process queued behind another rather
than move it to the idle core (a process that ran in the last 0.5 ms counts as cache-hot;
SCHED_IDLE processes are exempt), each process waited runnable 23-26% of the time and the
machine was 74-77% busy. Under SCHED_IDLE it was 89% busy: +10.7 to +12.6% committed in three
alternating pairs (2026-12-06). ``--sched other`` measures Linux's default.

``--generators in-server`` measures the way Mako does: no client path. Each shard leader
runs the mix itself (store/node/generator.py; the cluster is started with
MERIDIAN_LOAD_GENERATORS=1), ``--clients`` transactions in flight per shard, each homed on
that shard with the same remote accesses; transactions go to the replica as objects and
their outcomes come back as objects (no codec, no SDK, no client RPC). Remote accesses
still cross the RPC core between leaders. ``txn_per_s_per_shard`` is the figure to set
beside Mako's per-thread throughput (each shard leader is one process on one core).

    python bench/micro.py --shards 2 --duration 20 [--client-processes 2] [--sched other] [--json]
    python bench/micro.py --shards 1 --generators in-server [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import gc
import itertools
import json
import multiprocessing
import os
import random
import resource
import sys
import tempfile
import time
from array import array
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import msgpack  # noqa: E402
from hdrh.histogram import HdrHistogram  # noqa: E402
from tqdm import tqdm  # noqa: E402

from bench.peers.meridian import machine_seconds, machine_shares  # noqa: E402
from store import config as config_module  # noqa: E402
from store import wire  # noqa: E402
from store.client import Aborted, Client, MeridianError  # noqa: E402
from store.client.protocol import Call, Connect  # noqa: E402
from store.config import SCHED_POLICIES  # noqa: E402
from store.node.generator import GENERATORS_ENV, GenerateSpec, micro_keys  # noqa: E402
from store.node.scrape import scrape_cluster, total  # noqa: E402
from store.node.server import GC_THRESHOLDS, apply_sched_policy  # noqa: E402
from store.node.up import ProcessCluster  # noqa: E402
from store.rpc.aio import new_event_loop  # noqa: E402

LOAD_BATCH = 500
# The pure core's runs for ``efficiency``: this many just before the cluster's load and as
# many just after, each of this many transactions (about a second each).
CORE_SLICES = 3
CORE_SLICE_TXNS = 20_000


def cluster_file(
    directory: Path, shards: int, base_port: int, workers: int = 1, sched: str = "other"
) -> Path:
    lines = [
        "[cluster]", 'name = "micro"', f'run_dir = "{directory / "run"}"', f"workers = {workers}",
        f'sched_policy = "{sched}"',
        "[settings]", "peer_retry_ns = 200_000_000", "peer_attempts_max = 15",
        "[[regions]]", 'name = "us"',
    ]
    for shard in range(shards):
        lines += ["[[shards]]", f'leader = "127.0.0.1:{base_port + shard}"']
    path = directory / "micro.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


class KeyChooser:
    def __init__(self, keys_by_shard: list[list[str]], zipf_theta: float, rng: random.Random) -> None:
        self.keys = keys_by_shard
        self.rng = rng
        count = len(keys_by_shard[0])
        self.cdf: list[float] | None = None
        if zipf_theta > 0:
            weights = [1.0 / (i + 1) ** zipf_theta for i in range(count)]
            total = sum(weights)
            running = 0.0
            self.cdf = []
            for weight in weights:
                running += weight / total
                self.cdf.append(running)

    def pick(self, shard: int) -> str:
        keys = self.keys[shard]
        if self.cdf is None:
            return keys[self.rng.randrange(len(keys))]
        return keys[min(bisect.bisect_left(self.cdf, self.rng.random()), len(keys) - 1)]


async def preload(client: Client, keys: list[list[str]], quiet: bool) -> None:
    batches = [
        (shard, shard_keys[i : i + LOAD_BATCH])
        for shard, shard_keys in enumerate(keys)
        for i in range(0, len(shard_keys), LOAD_BATCH)
    ]
    with tqdm(total=sum(len(k) for k in keys), desc="preload", unit="key", disable=quiet, file=sys.stderr) as bar:
        for shard, batch in batches:
            await client.run_ops([["put", key, 0] for key in batch], route=shard)
            bar.update(len(batch))


# Transactions drawn before the load starts (more than a second's worth at any rate seen
# here), then taken in turn.
POOL = 1 << 16


@contextlib.contextmanager
def load_policy(name: str) -> Iterator[str]:
    """This process under scheduling policy ``name`` for the load, back to Linux's default
    after it (the core's runs after the load keep the default); yields the policy the load
    ran under: 'other' where the process could not come back from SCHED_IDLE (no root, and
    RLIMIT_NICE below 20)."""
    if name == "other" or (os.geteuid() != 0 and resource.getrlimit(resource.RLIMIT_NICE)[0] < 20):
        yield "other"
        return
    apply_sched_policy(name)
    try:
        # the policy this process reads back, not the one asked for
        yield {policy: key for key, policy in SCHED_POLICIES.items()}.get(os.sched_getscheduler(0), "unknown")
    finally:
        apply_sched_policy("other")


def draw(
    rng: random.Random, chooser: KeyChooser, shards: int, remote: float
) -> tuple[int, str, list[list[Any]], bool]:
    """One transaction of the mix: (home shard, kind, operations, whether it is cross-shard)."""
    home = rng.randrange(shards)
    chosen: list[str] = []
    cross_shard = False
    for _ in range(4):
        shard = home
        if shards > 1 and rng.random() < remote:
            shard = (home + rng.randrange(1, shards)) % shards
            cross_shard = True
        chosen.append(chooser.pick(shard))
    kind = "read_only" if rng.random() < 0.5 else "rmw"
    ops = [["get", k] for k in chosen] if kind == "read_only" else [["increment", k, 1] for k in chosen]
    return home, kind, ops, cross_shard


async def drive(
    client: Client, keys: list[list[str]], args: argparse.Namespace, quiet: bool,
    clients: int | None = None, seed: int | None = None,
    start: Callable[[], Awaitable[None]] | None = None, stopped: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """``clients`` closed-loop workers (default ``--clients``) on this process's loop, from
    ``start()`` (once every transaction is drawn) for ``--duration`` seconds; ``stopped()``
    as the clock stops."""
    shards = len(keys)
    rng = random.Random(args.seed if seed is None else seed)
    chooser = KeyChooser(keys, args.zipf, rng)
    # Latencies in microseconds, by kind, into histograms once the clock has stopped: a
    # histogram's record_value (pure Python) cost 4.4% of this process's CPU per transaction
    # (py-spy, 2026-12-05), CPU the cluster's processes share on a two-core machine.
    latencies: dict[str, array[int]] = {kind: array("Q") for kind in ("read_only", "rmw")}
    counts = {"read_only": 0, "rmw": 0, "attempts": 0, "aborted_attempts": 0, "errors": 0, "cross_shard": 0}

    # The transactions are drawn before the clock starts, as bench/core.py draws its mix, so
    # that the figure (and ``efficiency``, its ratio to the core's) measures the store and
    # its SDK, not this driver's random number generator; the workers take them in turn,
    # from the start again once all are taken.
    pool = [draw(rng, chooser, shards, args.remote) for _ in range(POOL)]
    if start is not None:
        await start()
    taken = itertools.count()
    bar = tqdm(total=int(args.duration), desc="running", unit="s", disable=quiet, file=sys.stderr,
               bar_format="{desc}: {n_fmt}/{total_fmt} s |{bar}| {postfix}")
    stop_at = time.monotonic() + args.duration

    async def worker() -> None:
        while time.monotonic() < stop_at:
            home, kind, ops, cross_shard = pool[next(taken) % POOL]
            started = time.monotonic()
            try:
                result = await client.run_ops_detailed(ops, route=home)
            except Aborted:
                counts["attempts"] += client.settings.retries_max + 1
                counts["aborted_attempts"] += client.settings.retries_max + 1
                continue
            except MeridianError:
                counts["errors"] += 1
                continue
            latencies[kind].append(max(1, int((time.monotonic() - started) * 1e6)))
            counts[kind] += 1
            counts["attempts"] += result.attempts
            counts["aborted_attempts"] += result.attempts - 1
            if cross_shard:  # the keys of each shard are that shard's (micro_keys)
                counts["cross_shard"] += 1

    async def progress() -> None:
        last = 0
        while time.monotonic() < stop_at:
            await asyncio.sleep(1.0)
            done = counts["read_only"] + counts["rmw"]
            bar.set_postfix_str(f"{done - last:,} txn/s")
            bar.update(1)
            last = done

    started = time.monotonic()
    await asyncio.gather(progress(), *(worker() for _ in range(args.clients if clients is None else clients)))
    elapsed = time.monotonic() - started
    bar.close()
    if stopped is not None:
        stopped()
    histograms = {kind: HdrHistogram(1, 60_000_000, 3) for kind in latencies}
    for kind, values in latencies.items():
        for latency_us in values:
            histograms[kind].record_value(latency_us)
    return {"counts": counts, "histograms": histograms, "elapsed": elapsed}


def percentile_ms(histogram: HdrHistogram, p: float) -> float:
    return round(histogram.get_value_at_percentile(p) / 1000.0, 3)


class CoreMeter:
    """bench/core.py on the same mix, run in slices around the cluster's load: committed
    transactions per second of the pure core."""

    def __init__(self, shards: int, keys_per_shard: int, remote: float, transactions: int = CORE_SLICE_TXNS) -> None:
        sys.path.insert(0, str(REPO / "bench"))
        import core

        from store.core.partition import Partitioner

        self._core = core
        self.shards = shards
        self.keys = core.make_keys(Partitioner(shards), shards, keys_per_shard)
        self.mix = core.make_mix(random.Random(1), self.keys, transactions, remote=remote)
        self.slices: list[tuple[int, float]] = []  # (committed, seconds) of each run

    def measure(self, runs: int) -> None:
        for _ in range(runs):
            figures = self._core.run_mix(self.shards, self.keys, self.mix, encode=False)
            self.slices.append((int(figures["committed"]), float(figures["elapsed_s"])))

    @property
    def txn_per_s(self) -> float:
        """Committed over time, all runs together."""
        return sum(c for c, _ in self.slices) / sum(s for _, s in self.slices)

    @property
    def best_txn_per_s(self) -> float:
        return max(c / s for c, s in self.slices)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1,
                        help="worker processes per shard leader (each its own keys and stream)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load")
    parser.add_argument("--clients", type=int, default=64, help="concurrent closed-loop clients")
    parser.add_argument("--client-processes", type=int, default=1,
                        help="processes the clients are spread over (each its own SDK client)")
    parser.add_argument("--keys-per-shard", type=int, default=10_000)
    parser.add_argument("--remote", type=float, default=0.05, help="chance an access is remote")
    parser.add_argument("--zipf", type=float, default=0.0, help="zipfian theta (0: uniform)")
    parser.add_argument("--connect", type=Path, help="a running cluster's file (else start one)")
    parser.add_argument("--base-port", type=int, default=7400)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--geo3", type=float, metavar="RTT_MS",
                        help="run on cluster/geo3.toml's shape instead (2 shards, 3 regions, "
                             "replication on) with this round trip between regions")
    parser.add_argument("--generators", choices=("client", "in-server"), default="client",
                        help="where load is made: the SDK in this process, or inside each shard leader")
    parser.add_argument("--sched", choices=tuple(SCHED_POLICIES), default="idle",
                        help="Linux scheduling policy of the cluster's processes (cluster.sched_policy) "
                             "and of the load's while it runs (see the module doc)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    if not 1 <= args.client_processes <= args.clients:
        parser.error(f"--client-processes: from 1 to --clients ({args.clients})")
    if args.generators == "in-server" and args.zipf > 0:
        parser.error("--zipf: the in-server generators choose keys uniformly (not built for zipfian)")
    quiet = args.json and not sys.stderr.isatty()

    if args.connect:
        shards = config_module.load(args.connect).shard_count
    else:
        shards = 2 if args.geo3 is not None else args.shards  # geo3's shape has two
    core_meter = CoreMeter(shards, args.keys_per_shard, args.remote)
    core_meter.measure(CORE_SLICES)  # before the cluster starts (idle, when --connect)
    with tempfile.TemporaryDirectory(prefix="meridian-micro-") as scratch:
        cluster = None
        if args.connect:
            config = config_module.load(args.connect)
        else:
            if args.geo3 is not None:
                from bench.peers import meridian as geo3  # its cluster file, as bench/peers runs it

                path = geo3.cluster_file(Path(scratch), Path(scratch) / "logs", args.geo3,
                                         1.0 if args.geo3 > 0 else 0.0, args.base_port - 7400,
                                         workers=args.workers,
                                         settings=[("cluster", "sched_policy", args.sched)])
            else:
                path = cluster_file(Path(scratch), args.shards, args.base_port, args.workers, args.sched)
            config = config_module.load(path)
            if args.generators == "in-server":
                os.environ[GENERATORS_ENV] = "1"  # the servers inherit it
            cluster = ProcessCluster(config)
            cluster.start()
        try:
            if cluster is not None:
                cluster.wait_ready()
            loop = new_event_loop()
            try:
                with load_policy(args.sched) as sched:
                    measured = loop.run_until_complete(run(config, str(args.connect or path), args, quiet))
            finally:
                loop.close()
        finally:
            if cluster is not None:
                cluster.stop()
    core_meter.measure(CORE_SLICES)  # after it stopped
    core_txn_per_s = core_meter.txn_per_s
    counts, histograms, elapsed = measured["counts"], measured["histograms"], measured["elapsed"]
    committed = counts["read_only"] + counts["rmw"]
    in_server = args.generators == "in-server"
    both = HdrHistogram(1, 60_000_000, 3)
    for histogram in histograms.values():
        both.add(histogram)
    result: dict[str, Any] = {
        "shards": config.shard_count,
        "workers": config.workers,
        "geo3_rtt_ms": args.geo3,
        "generators": args.generators,
        # Linux scheduling policy of the cluster's processes and of the load's (--sched)
        "cluster_sched_policy": config.sched_policy,
        "sched_policy": sched,
        "clients": args.clients,
        "client_processes": args.client_processes if args.generators == "client" else 0,
        "duration_s": round(elapsed, 2),
        "keys_per_shard": args.keys_per_shard,
        "zipf_theta": args.zipf,
        "txn_per_s": round(committed / elapsed, 1),
        "abort_rate": round(counts["aborted_attempts"] / max(counts["attempts"], 1), 5),
        "errors": counts["errors"],
        "cross_shard_fraction": round(counts["cross_shard"] / max(committed, 1), 4),
        "p50_ms": percentile_ms(both, 50),
        "p99_ms": percentile_ms(both, 99),
        "p999_ms": percentile_ms(both, 99.9),
        "max_ms": round(both.get_max_value() / 1000.0, 3),
        "core_txn_per_s": round(core_txn_per_s, 1),
        "efficiency": round(committed / elapsed / core_txn_per_s, 4),
        "core_best_txn_per_s": round(core_meter.best_txn_per_s, 1),
        "efficiency_vs_best": round(committed / elapsed / core_meter.best_txn_per_s, 4),
        "core_runs_txn_per_s": [round(c / s) for c, s in core_meter.slices],
        # The whole machine over the load: busy, and stolen by the host (a virtual CPU ready
        # to run while the host ran something else; every figure moves with it).
        **measured["machine"],
        "metrics": metrics_check(measured["scraped"], committed),
    }
    if in_server:
        result["in_flight_per_worker"] = args.clients
        result["txn_per_s_per_shard"] = round(committed / elapsed / config.shard_count, 1)
        result["txn_per_s_per_worker"] = round(committed / elapsed / len(config.shards), 1)
        result["failed_after_retries"] = counts["failed"]
        replication = "" if args.geo3 is None else ", and replication to two more regions"
        result["not_measured"] = (
            "no client path (no SDK, no codec, no client RPC): load is made inside each shard "
            "leader, as Mako's benchmark does (remote accesses and the RPC between leaders are "
            f"measured{replication})" + ("; one region, no replication" if args.geo3 is None else ""))
    else:
        # What the client's RPC endpoint did per committed transaction: packets, the
        # datagrams that carried them (several packets for one leader share one), and the
        # retransmissions a response slower than the retransmission timeout costs.
        result["client_rpc_per_txn"] = {
            name: round(value / max(committed, 1), 3) for name, value in measured["client_rpc"].items()
        }
        # This process's CPU over the load (the SDK and the benchmark's own loop) per
        # committed transaction.
        result["client_cpu_us_per_txn"] = round(measured["client_cpu_s"] * 1e6 / max(committed, 1), 1)
        result["submits"] = measured["submits"]
        result["submits_per_txn"] = round(measured["submits"] / max(counts["attempts"], 1), 4)
    for kind, histogram in histograms.items():
        result[kind] = {
            "committed": counts[kind],
            "p50_ms": percentile_ms(histogram, 50),
            "p99_ms": percentile_ms(histogram, 99),
            "p999_ms": percentile_ms(histogram, 99.9),
            "max_ms": round(histogram.get_max_value() / 1000.0, 3),
        }
    if args.json:
        print(json.dumps(result))
        return
    made = "generated inside each shard leader" if in_server else f"{args.clients} clients"
    if not in_server and args.client_processes > 1:
        made += f" in {args.client_processes} processes"
    print(f"microbenchmark: {result['shards']} shards, {made}, {result['duration_s']} s; "
          f"scheduling: the cluster's processes {config.sched_policy}, the load's {sched}")
    print(f"  throughput {result['txn_per_s']:,.0f} txn/s  abort rate {result['abort_rate']:.2%}  "
          f"cross-shard {result['cross_shard_fraction']:.1%}  errors {result['errors']}")
    for kind in ("read_only", "rmw"):
        r = result[kind]
        print(f"  {kind:9} p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms  "
              f"p999 {r['p999_ms']:.2f} ms  max {r['max_ms']:.2f} ms")
    if in_server:
        print(f"  {result['txn_per_s_per_shard']:,.0f} txn/s per shard leader process "
              f"({args.clients} in flight each); not measured: {result['not_measured']}")
    else:
        print(f"  {result['submits_per_txn']} SUBMIT requests per transaction attempt")
    metrics = result["metrics"]
    print(f"  servers' metrics ({metrics['endpoints_scraped']} of {metrics['endpoints']} endpoints): "
          f"{metrics['committed_counted_by_servers']:,} committed, "
          f"{metrics['ratio_to_benchmark']:.4f} of the benchmark's count")
    print(f"  pure core on the same mix (same run) {result['core_txn_per_s']:,.0f} txn/s; "
          f"efficiency {result['efficiency']:.2f} (against its best run, "
          f"{result['core_best_txn_per_s']:,.0f} txn/s: {result['efficiency_vs_best']:.2f})")
    if "machine_steal" in result:
        print(f"  the machine over the load: {result['machine_busy']:.0%} busy, "
              f"{result['machine_steal']:.1%} stolen by the host")


def metrics_check(scraped: tuple[dict[str, Any], dict[str, Any]], committed: int) -> dict[str, Any]:
    """The servers' own count of COMMITTED answers over the load (their Prometheus
    endpoints, scraped before and after it) beside the benchmark's count."""
    before, after = scraped
    answered = [a for a in after if after[a] is not None and before.get(a) is not None]
    counted = sum(
        total(after[a], "meridian_transactions_committed_total")
        - total(before[a], "meridian_transactions_committed_total")
        for a in answered
    )
    return {
        "endpoints_scraped": len(answered),
        "endpoints": len(after),
        "committed_counted_by_servers": int(counted),
        "ratio_to_benchmark": round(counted / max(committed, 1), 5),
    }


async def submits(client: Client) -> int:
    """SUBMIT requests the shard leaders have received (their status counters)."""
    total = 0
    for status in await client.status():
        if status is None:
            raise RuntimeError("a shard leader did not answer its status request")
        total += int(status["counters"]["submits"])
    return total


RPC_COUNTERS = ("tx_pkts", "rx_pkts", "tx_datagrams", "rx_datagrams", "retransmits", "rx_held", "rx_stale")


def rpc_counters(client: Client) -> dict[str, int]:
    """The client endpoint's counters ``client_rpc_per_txn`` reports."""
    stats = client._rpc.stats()
    # Datagrams: since bundling (an older core counts only packets).
    counters = {name: stats[name] for name in RPC_COUNTERS if name in stats}
    counters["timer_wakes"] = client._rpc.timer_wakes
    return counters


def driver_process(path: str, args: argparse.Namespace, clients: int, seed: int, conn: Any) -> None:
    """One process of ``--client-processes``: its own event loop and SDK client driving
    ``clients`` of the closed-loop workers. It says "ready" once its transactions are drawn,
    starts on the parent's word, says "stopped" as its clock stops, then sends what it
    counted (histograms encoded) and its CPU and RPC counters over the load."""
    loop = new_event_loop()  # its scheduling policy: the parent's while it runs the load
    try:
        conn.send(loop.run_until_complete(drive_share(path, args, clients, seed, conn)))
    finally:
        loop.close()
        conn.close()


async def drive_share(path: str, args: argparse.Namespace, clients: int, seed: int, conn: Any) -> dict[str, Any]:
    config = config_module.load(path)
    client = await Client.connect(config, in_flight_max=max(256, clients))
    try:
        keys = micro_keys(client.partitioner, len(config.shards), args.keys_per_shard)
        gc.set_threshold(*GC_THRESHOLDS)
        gc.collect()
        gc.freeze()
        at_start: dict[str, Any] = {}
        over_load: dict[str, Any] = {}  # this process's CPU and RPC counters, start to stop

        async def start() -> None:
            conn.send("ready")
            await asyncio.to_thread(conn.recv)  # the parent's word: every process is ready
            at_start.update(cpu=time.process_time(), rpc=rpc_counters(client))

        def stopped() -> None:
            over_load["cpu"] = time.process_time() - at_start["cpu"]
            over_load["rpc"] = {
                name: value - at_start["rpc"][name] for name, value in rpc_counters(client).items()
            }
            conn.send("stopped")

        measured = await drive(client, keys, args, True, clients, seed, start, stopped)
        return {
            "counts": measured["counts"], "elapsed": measured["elapsed"],
            "histograms": {kind: h.encode() for kind, h in measured["histograms"].items()},
            "client_cpu_s": over_load["cpu"], "client_rpc": over_load["rpc"],
        }
    finally:
        await client.close()


async def drive_processes(path: str, args: argparse.Namespace) -> dict[str, Any]:
    """``--clients`` spread over ``--client-processes`` driver processes (seeds ``--seed``,
    ``--seed`` + 1, ...), started together once all are ready; their counts, histograms,
    CPU and RPC counters summed, the load's time the longest of theirs."""
    context = multiprocessing.get_context("spawn")  # no fork of a loop, a gRPC or an SDK
    processes, pipes = [], []
    n = args.client_processes
    for i in range(n):
        parent_end, child_end = context.Pipe()
        clients = args.clients // n + (1 if i < args.clients % n else 0)
        process = context.Process(
            target=driver_process, args=(path, args, clients, args.seed + i, child_end), daemon=True
        )
        process.start()
        child_end.close()
        processes.append(process)
        pipes.append(parent_end)

    def expect(word: str) -> None:
        for pipe in pipes:
            said = pipe.recv()
            if said != word:
                raise SystemExit(f"micro: a driver process said {said!r}, not {word!r}")

    try:
        await asyncio.to_thread(expect, "ready")
        machine_before = machine_seconds()
        for pipe in pipes:
            pipe.send("go")
        await asyncio.to_thread(expect, "stopped")
        machine = machine_shares(machine_before, machine_seconds())
        answers = await asyncio.to_thread(lambda: [pipe.recv() for pipe in pipes])
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    counts, histograms = summed(answers, answers[0]["counts"])
    rpc = {name: sum(a["client_rpc"][name] for a in answers) for name in answers[0]["client_rpc"]}
    return {
        "counts": counts, "histograms": histograms,
        "elapsed": max(a["elapsed"] for a in answers), "machine": machine,
        "client_cpu_s": sum(a["client_cpu_s"] for a in answers), "client_rpc": rpc,
    }


async def run(config: Any, path: str, args: argparse.Namespace, quiet: bool) -> dict[str, Any]:
    client = await Client.connect(config, in_flight_max=max(256, args.clients))
    try:
        keys = micro_keys(client.partitioner, len(config.shards), args.keys_per_shard)
        if not args.connect:
            await preload(client, keys, quiet)
        # The collector as the servers set theirs, and as bench/core.py sets it for the
        # core's figure that ``efficiency`` divides by: thresholds raised, the preload frozen.
        gc.set_threshold(*GC_THRESHOLDS)
        gc.collect()
        gc.freeze()
        before = await submits(client)
        scraped_before = await asyncio.to_thread(scrape_cluster, config)
        if args.generators == "client" and args.client_processes > 1:
            measured = await drive_processes(path, args)
        else:
            rpc_before = rpc_counters(client)
            machine_before = machine_seconds()
            cpu_before = time.process_time()
            if args.generators == "in-server":
                measured = await generate_in_servers(client, args)
            else:
                measured = await drive(client, keys, args, quiet)
            measured["client_cpu_s"] = time.process_time() - cpu_before
            measured["machine"] = machine_shares(machine_before, machine_seconds())
            measured["client_rpc"] = {
                name: value - rpc_before[name] for name, value in rpc_counters(client).items()
            }
        measured["submits"] = await submits(client) - before
        measured["scraped"] = (scraped_before, await asyncio.to_thread(scrape_cluster, config))
        return measured
    finally:
        await client.close()


async def generate_in_servers(client: Client, args: argparse.Namespace) -> dict[str, Any]:
    """Every shard leader runs the mix itself (wire.GENERATE); their counts and histograms
    summed. Uses the SDK's session plumbing directly: a benchmark's request, not an API."""
    spec = GenerateSpec(args.duration, args.clients, args.keys_per_shard, args.remote, args.seed)
    timeout = args.duration + 120.0

    async def one(address: Any) -> dict[str, Any]:
        await client._carry_out(Connect(address, client.settings.connect_timeout_s))
        answer = msgpack.unpackb(await client._carry_out(Call(address, wire.GENERATE, spec.to_wire(), timeout)))
        if "error" in answer:
            raise SystemExit(f"micro: {address} refused to generate load: {answer['error']}")
        return dict(answer)

    answers = await asyncio.gather(*(one(address) for address in client.protocol.leaders))
    elapsed = max(a["elapsed_s"] for a in answers)  # each server's run, its drain included
    counts, histograms = summed(answers, ("read_only", "rmw", "attempts", "aborted_attempts",
                                          "errors", "cross_shard", "failed"))
    return {"counts": counts, "histograms": histograms, "elapsed": elapsed}


def summed(answers: list[dict[str, Any]], names: Iterable[str]) -> tuple[dict[str, int], dict[str, HdrHistogram]]:
    """The counts ``names`` and the latency histograms (encoded, by kind) of several load
    makers (driver processes, or the shard leaders' generators), added up."""
    counts = {name: sum(answer["counts"][name] for answer in answers) for name in names}
    histograms = {kind: HdrHistogram(1, 60_000_000, 3) for kind in ("read_only", "rmw")}
    for answer in answers:
        for kind, encoded in answer["histograms"].items():
            histograms[kind].add(HdrHistogram.decode(encoded))
    return counts, histograms


if __name__ == "__main__":
    main()
