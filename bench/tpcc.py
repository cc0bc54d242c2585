"""TPC-C against Meridian: load, run the 45/43/4/4/4 mix, report, check consistency.

    python bench/tpcc.py --local --shards 2 --warehouses-per-shard 2 --duration 60 --json

By default the command starts a cluster of server processes on loopback (``--base-port``)
in three regions: every shard leader in ``us``, a follower of each shard in ``eu`` and
``ap``, replication between regions through ``meridian wan-proxy`` at ``--rtt-ms`` round
trips (``--regions 1``: leaders only). It drives the leaders through the client SDK, or
uses a running cluster named by ``--connect FILE`` (its cluster file must load
``bench.tpcc.procedures:register``, use the prefix partitioner and replicate ITEM:
``[placement] replicated = ["item"]``). ``--local`` runs the
real shard-leader code in this process on a fault-free simulated network
(``store.sim.local.LocalCluster``): latencies are the simulated cluster's, and throughput
is what this one Python process achieves. The functions between the "REAL CLUSTER" markers
below are all that ties the benchmark to a cluster.

The report gives throughput (transactions/s, New-Orders per minute), per-type p50, p99,
p99.9 and maximum latency (certified and committed), the conflict abort rate, the rollback rate
(rolled-back New-Orders / New-Orders), the measured mix, the cross-shard fraction, the
twelve consistency conditions after the load and after the run on every replica (the
leaders through ``tpcc_scan`` transactions, each region's followers through snapshot reads
once they have caught up), and a plot of throughput per second saved in the run directory.
``--json`` prints it as one object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# Run as a script, this file's folder is sys.path[0]; the imports below want the repository.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(REPO)
elif str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.tpcc import consistency, loader, procedures, replicas, schema  # noqa: E402
from bench.tpcc.driver import Completed, Driver, DriverConfig, Stats, Target  # noqa: E402
from bench.tpcc.loader import InitialRows  # noqa: E402
from bench.tpcc.plot import write_throughput  # noqa: E402
from bench.tpcc.schema import Key, Scale  # noqa: E402
from store.core.errors import Unavailable  # noqa: E402
from store.core.keys import pack  # noqa: E402
from store.core.settings import DEFAULT_SETTINGS  # noqa: E402

DEFAULT_SCALE_FACTOR = 10.0
DEFAULT_CLIENTS_PER_WAREHOUSE = 2
# The name of the leaders' replica set when they have no region to name it (``--local``).
LEADERS = "leaders"


class Session:
    """Where the benchmark runs: how to load it, drive it and read back its data."""

    target: Target
    layout: schema.Layout

    async def load(self, initial: InitialRows, progress: bool) -> None:
        raise NotImplementedError

    async def rows(self, warehouses: Sequence[int]) -> dict[Key, Any]:
        """Every row of the TPC-C tables of ``warehouses`` (nothing else may be running)."""
        raise NotImplementedError

    def replica_names(self) -> list[str]:
        """The replica sets holding every warehouse; the first is the leaders'."""
        return [LEADERS]

    async def replica_rows(self, name: str, warehouses: Sequence[int]) -> dict[Key, Any]:
        """``rows`` as the replica set ``name`` holds them."""
        return await self.rows(warehouses)

    async def catch_up(self) -> dict[str, Any] | None:
        """Waits for the followers to show what the leaders have committed (if any)."""
        return None

    async def close(self) -> None:
        return None


class LocalSession(Session):
    """The in-process cluster: bulk preload (ITEM through transactions, to every shard), and
    reads straight from every leader's store."""

    def __init__(self, layout: schema.Layout, seed: int) -> None:
        from bench.tpcc.local import SimulatedTarget
        from store.core.txn import Procedures
        from store.sim.local import LocalCluster

        registry = Procedures()
        procedures.register(registry)
        assert layout.workers == 1, "the in-process cluster has no workers (parse_args refuses)"
        self.cluster = LocalCluster(
            layout.shards, registry, schema.partitioner(layout.shards), seed=seed
        )
        self.target = SimulatedTarget(self.cluster)
        self.layout = layout

    async def load(self, initial: InitialRows, progress: bool) -> None:
        from bench.tpcc.local import load

        load(self.cluster, initial)
        # Preloaded keys start out as garbage-collection candidates; let the first collection
        # (which visits them all) happen now rather than stall the measured run.
        sim = self.cluster.sim
        sim.run_until(sim.now_ns + 2 * DEFAULT_SETTINGS.gc_interval_ns)
        # The loaded rows live as long as the process: keep Python's collector from walking
        # them again and again during the run.
        gc.freeze()

    async def rows(self, warehouses: Sequence[int]) -> dict[Key, Any]:
        from bench.tpcc.local import replica_rows

        return replica_rows(self.cluster)


class ClusterSession(Session):
    """A cluster of server processes reached through the client SDK."""

    def __init__(self, client: Any, config: Any) -> None:
        self.client = client
        self.config = config
        self.target = _SdkTarget(client)
        self.layout = schema.Layout(config.shard_count, config.workers)
        self.replicas, notes = replicas.replicas_of(config)
        self.dead: set[str] = set()  # replicas killed by --kill-leader-at
        for note in notes:
            _log(f"tpcc: not checked: {note}")

    def replica_names(self) -> list[str]:
        return [replica.name for replica in self.replicas]

    async def replica_rows(self, name: str, warehouses: Sequence[int]) -> dict[Key, Any]:
        replica = next(r for r in self.replicas if r.name == name)
        if replica.region is None:
            return await self.rows(warehouses)
        # After a failover a region's replica of a shard may lead it (read it as the leader)
        # or be dead (then the region cannot be read whole).
        _, leaders = await self.client.cluster_map()
        led = set()
        for shard in self.config.shards:
            address = next(f"{h}:{p}" for r, (h, p) in replicas.replicas_in(shard) if r == replica.region)
            if address in self.dead:
                raise Unavailable(f"{address} (shard {shard.shard}, {replica.region}) was killed")
            if address == leaders[shard.shard]:
                led.add(shard.shard)
        partitioner = self.config.partitioner()
        by_leader = [
            w for w in warehouses if partitioner.shard_of(pack(schema.warehouse_key(w))) in led
        ]
        rows = await self.rows(by_leader) if by_leader else {}
        rest = [w for w in warehouses if w not in by_leader]
        rows.update(await replicas.follower_rows(self.client, rest, replica.region))
        return rows

    async def catch_up(self) -> dict[str, Any] | None:
        if len(self.replicas) == 1:
            return None
        return await replicas.wait_caught_up(self.client, self.config, dead=self.dead)

    async def load(self, initial: InitialRows, progress: bool) -> None:
        await loader.load_through_transactions(self.target.run, initial, progress=progress)

    async def rows(self, warehouses: Sequence[int]) -> dict[Key, Any]:
        return await consistency.snapshot(
            self.target.run, warehouses, self.layout, page_rows=SNAPSHOT_PAGE_ROWS
        )

    async def close(self) -> None:
        await self.client.close()

    async def generate(self, duration_s: float, per_unit: int, seed: int, params: dict[str, Any]) -> list[dict[str, Any]]:
        """``--generators in-server``: every shard leader runs ``per_unit`` terminals of the
        driver itself (``bench.tpcc.inserver``, a ``wire.GENERATE`` request); their answers.
        Uses the SDK's session plumbing directly: a benchmark's request, not an API."""
        import msgpack

        from bench.tpcc import inserver
        from store import wire
        from store.client.protocol import Call, Connect
        from store.node.generator import GenerateSpec

        spec = GenerateSpec(duration_s, per_unit, 1, 0.0, seed, inserver.WORKLOAD, params)
        client = self.client

        async def one(address: Any) -> dict[str, Any]:
            await client._carry_out(Connect(address, client.settings.connect_timeout_s))
            call = Call(address, wire.GENERATE, spec.to_wire(), duration_s + GENERATE_DRAIN_S)
            answer = msgpack.unpackb(await client._carry_out(call))
            if "error" in answer:
                raise SystemExit(f"tpcc: {address} refused to generate load: {answer['error']}")
            return dict(answer)

        return list(await asyncio.gather(*(one(a) for a in client.protocol.leaders)))


class _SdkTarget:
    """The driver's ``Target`` over the SDK's ``Client``.

    ``Client.run_detailed`` retries conflicts itself; its ``attempts`` tell how many there
    were, so the driver still counts them as aborts. An ``OutcomeUnknown`` (no answer in
    time: the transaction may have run) is asked again under the same transaction id with
    ``Client.resume``, which never runs it twice; HISTORY rows and order ids stay exact.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self.resumed = 0

    async def run_detailed(self, name: str, *args: Any, shard: int = 0) -> Completed:
        from store.core.errors import OutcomeUnknown

        try:
            outcome = await self.client.run_detailed(name, *args, route=shard)
        except OutcomeUnknown as exc:
            outcome = await self._resume(exc)
        return Completed(
            outcome.result, outcome.certified_s, outcome.committed_s, outcome.attempts - 1
        )

    async def _resume(self, error: Exception) -> Any:
        from store.core.errors import OutcomeUnknown

        pending = getattr(error, "txn", None)
        if pending is None:
            raise error
        for _ in range(RESUMES_MAX):
            self.resumed += 1
            try:
                return await self.client.resume(pending)
            except OutcomeUnknown as again:
                error = again
        raise error

    async def run(self, name: str, *args: Any, shard: int = 0) -> Any:
        return (await self.run_detailed(name, *args, shard=shard)).result


# ==== THE REAL CLUSTER IS CONNECTED HERE =====================================================
# The two functions below are all that ties the benchmark to server processes and the SDK:
# ``prepare_cluster`` finds (--connect) or starts one, ``connect_cluster`` opens a client.
PROCEDURE_MODULE = "bench.tpcc.procedures:register"
DEFAULT_BASE_PORT = 7500
DEFAULT_REGIONS = 3
DEFAULT_RTT_MS = 50.0
# The regions of a started cluster: leaders in the first, a follower of each shard in the
# others (loopback addresses 127.0.0.1, .2 and .3, the same ports).
REGION_NAMES = ("us", "eu", "ap")
# Rows per tpcc_scan page: a page of 5000 customers is about 3.5 MB, one answer the RPC
# layer may fail to deliver within its session timeout; 500 rows keep answers near 350 KB.
SNAPSHOT_PAGE_ROWS = 500
# How long after --duration a leader's in-server terminals may take to finish their last
# transactions and answer.
GENERATE_DRAIN_S = 120.0
# Times one transaction whose outcome is unknown is asked for again (same id, never rerun).
RESUMES_MAX = 5
# The wan-proxy's first port above --base-port (its control port is one below).
WAN_PORT_OFFSET = 500
# Units (shards times workers) of a started cluster at most: their ports (base_port + unit)
# stay below the configuration manager's, and the wan-proxy's links (four per unit, from
# base_port + 500) below the followers' replication ports (base_port + 1000 + unit).
MAX_UNITS = 100
# The configuration manager members' port above --base-port (one per region's address).
CM_PORT_OFFSET = 400
READY_TIMEOUT_S = 60.0


def cluster_file(
    directory: Path,
    shard_count: int,
    base_port: int,
    regions: int = DEFAULT_REGIONS,
    rtt_ms: float = DEFAULT_RTT_MS,
    workers: int = 1,
) -> Path:
    """A cluster file with the TPC-C procedures and their placement: warehouse w on shard
    w mod S (the prefix partitioner), ITEM on every shard (``[placement] replicated``), and
    with ``workers`` > 1 on worker (w // S) mod W of its shard (``schema.Layout``).

    Shard s's leader is 127.0.0.1:(base_port + s) in ``us``; with 3 regions its followers
    are 127.0.0.2 and 127.0.0.3 on the same port in ``eu`` and ``ap`` (replication on
    port + 1000), and the wan-proxy listens from base_port + 500 (control base_port + 499).
    Worker w of a shard listens on those ports plus w * S.
    """
    names = REGION_NAMES[:regions]
    lines = [
        f"# Written by bench/tpcc.py: {regions} region(s) on loopback, warehouse w on shard"
        " w mod S, ITEM on every shard.",
        "[cluster]",
        'name = "tpcc"',
        f"run_dir = {json.dumps(str(directory / 'cluster'))}",
        f"python_path = [{json.dumps(str(REPO))}]",
        f"procedures = [{json.dumps(PROCEDURE_MODULE)}]",
        'partitioner = "prefix"',
    ]
    if workers > 1:
        lines += [f"workers = {workers}", f"worker_port_stride = {shard_count}"]
    lines += [
        "[placement]",
        f"replicated = {json.dumps(list(schema.REPLICATED_TABLES))}",
        "[settings]",
        "peer_retry_ns = 200_000_000",
        "peer_attempts_max = 15",
    ]
    if regions > 1:
        lines += ["[client]", "timeout_s = 10.0"]
    for name in names:
        lines += ["[[regions]]", f"name = {json.dumps(name)}"]
    for shard in range(shard_count):
        port = base_port + shard
        lines += ["[[shards]]", f'leader = "127.0.0.1:{port}"', f"region = {json.dumps(names[0])}"]
        if regions > 1:
            followers = ", ".join(
                f'{{ region = {json.dumps(name)}, address = "127.0.0.{index + 1}:{port}" }}'
                for index, name in enumerate(names) if index > 0
            )
            lines.append(f"followers = [{followers}]")
    if regions > 1:
        # A configuration manager member per region: a killed leader is replaced.
        for index, name in enumerate(names):
            lines += [
                "[[cm]]", f"region = {json.dumps(name)}",
                f'address = "127.0.0.{index + 1}:{base_port + CM_PORT_OFFSET}"',
            ]
        lines += [
            "[wan]",
            f"rtt_ms = {float(rtt_ms)}",
            f"jitter_ms = {min(1.0, float(rtt_ms) / 10)}",
            f"port_base = {base_port + WAN_PORT_OFFSET}",
            f'control = "127.0.0.1:{base_port + WAN_PORT_OFFSET - 1}"',
        ]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tpcc-cluster.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def prepare_cluster(args: argparse.Namespace, run_dir: Path) -> tuple[Any, Any]:
    """(cluster config, the started processes or None): ``--connect FILE`` or a new cluster.

    Runs before the event loop: starting processes and waiting for them is synchronous.
    """
    from store import config as config_module

    if args.connect is not None:
        config = config_module.load(args.connect)
        if PROCEDURE_MODULE not in config.procedures:
            raise SystemExit(f'tpcc: {args.connect} needs procedures including "{PROCEDURE_MODULE}"')
        problem = schema.placement_problem(
            config.partitioner(), schema.Layout(config.shard_count, config.workers)
        )
        if problem is not None:
            raise SystemExit(
                f'tpcc: {args.connect} needs partitioner = "prefix" and [placement] replicated'
                f' = ["item"]: {problem}'
            )
        return config, None
    from store.node.up import ProcessCluster

    if args.generators == "in-server":
        import os

        from store.node.generator import GENERATORS_ENV

        os.environ[GENERATORS_ENV] = "1"  # the servers inherit it
    config = config_module.load(
        cluster_file(
            run_dir, args.shards, args.base_port, args.regions, args.rtt_ms, args.workers
        )
    )
    processes = ProcessCluster(config)
    processes.start()
    try:
        processes.wait_ready(timeout_s=READY_TIMEOUT_S)
    except BaseException:
        processes.stop()
        raise
    followers = sum(len(shard.followers) for shard in config.shards)
    _log(
        f"tpcc: started {len(config.shards)} shard leader processes"
        + (
            f" and {followers} followers in {', '.join(config.regions[1:])}"
            f" ({config.wan.rtt_ms:g} ms round trips)"
            if followers and config.wan is not None else ""
        )
        + f" (logs in {config.run_dir})"
    )
    return config, processes


async def connect_cluster(config: Any, terminals: int) -> Session:
    from store.client import Client

    client = await Client.connect(config, in_flight_max=max(256, 2 * terminals))
    return ClusterSession(client, config)
# =============================================================================================


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--local", action="store_true", help="run on an in-process simulated cluster")
    where.add_argument("--connect", type=Path, metavar="FILE", help="a running cluster's file")
    parser.add_argument(
        "--base-port", type=int, default=DEFAULT_BASE_PORT, help="first port of a started cluster"
    )
    parser.add_argument(
        "--regions", type=int, choices=(1, 3), default=DEFAULT_REGIONS,
        help="regions of a started cluster: leaders in us, followers in eu and ap (default 3)",
    )
    parser.add_argument(
        "--rtt-ms", type=float, default=DEFAULT_RTT_MS,
        help=f"round trip between regions of a started cluster (default {DEFAULT_RTT_MS:g})",
    )
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument(
        "--workers", type=int, default=1,
        help="worker processes per shard leader of a started cluster (default 1)",
    )
    parser.add_argument(
        "--warehouses-per-shard", type=int, default=2,
        help="warehouses per shard, or per worker of one with --workers (default 2)",
    )
    parser.add_argument(
        "--clients", type=int, default=None,
        help=f"terminals (default {DEFAULT_CLIENTS_PER_WAREHOUSE} per warehouse)",
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of measurement")
    parser.add_argument(
        "--scale-factor", type=float, default=DEFAULT_SCALE_FACTOR,
        help="divide items, customers and initial orders by this (1 = the full specification)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--kill-leader-at", type=float, metavar="S",
        help="SIGKILL shard 0's leader S seconds into the run (a started 3-region cluster)",
    )
    parser.add_argument(
        "--load-processes", type=int, default=1, help="processes generating warehouses"
    )
    parser.add_argument(
        "--generators", choices=("client", "in-server"), default="client",
        help="terminals in this process through the SDK (default), or inside every shard"
        " leader, Mako's way (bench/tpcc/inserver.py)",
    )
    parser.add_argument("--run-dir", type=Path, default=None, help="default runs/tpcc-<time>")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars or live lines")
    args = parser.parse_args(argv)
    if args.shards < 1 or args.warehouses_per_shard < 1 or args.duration <= 0:
        parser.error("--shards, --warehouses-per-shard and --duration must be positive")
    if args.workers < 1 or args.load_processes < 1:
        parser.error("--workers and --load-processes must be positive")
    if args.workers > 1 and args.local:
        parser.error("--workers: the in-process cluster (--local) has no workers")
    if args.workers > 1 and args.connect is not None:
        parser.error("--workers: a running cluster (--connect) has the workers its file sets")
    if args.generators == "in-server" and (args.local or args.kill_leader_at is not None):
        parser.error("--generators in-server: needs a cluster of server processes, without --kill-leader-at")
    if args.shards * args.workers > MAX_UNITS:
        parser.error(f"--shards times --workers must be at most {MAX_UNITS} (the ports used)")
    if args.clients is not None and args.clients < 1:
        parser.error("--clients must be positive")
    if args.rtt_ms < 0:
        parser.error("--rtt-ms must not be negative")
    if args.kill_leader_at is not None and (
        args.local or args.connect is not None or args.regions < 3 or args.kill_leader_at < 0
    ):
        parser.error("--kill-leader-at needs a started 3-region cluster and S >= 0")
    return args


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _live_line(second: int, stats: Stats) -> None:
    completed = stats.completed()
    new_orders = stats.by_type["new_order"].completed
    aborts = sum(s.aborts for s in stats.by_type.values())
    _log(f"tpcc [{second:4d}s] {completed} transactions, {new_orders} New-Orders, {aborts} aborts")


async def _check(
    session: Session, name: str, warehouses: Sequence[int], scale: Scale
) -> consistency.Report:
    """The twelve conditions on replica set ``name``'s data; all false if it cannot be read."""
    from store.core.errors import MeridianError

    try:
        rows = await session.replica_rows(name, warehouses)
    except MeridianError as exc:
        report = consistency.Report()
        for number in consistency.CONDITIONS:
            report.fail(number, f"could not read the data: {type(exc).__name__}: {exc}")
        return report
    return consistency.check(rows, scale)


async def check_replicas(
    session: Session, warehouses: Sequence[int], scale: Scale, when: str
) -> tuple[dict[str, consistency.Report], dict[str, Any] | None]:
    """The twelve conditions on every replica set, the followers once they have caught up;
    ({replica set: report}, how the catch-up went or None)."""
    from store.core.errors import MeridianError

    try:
        caught_up = await session.catch_up()
    except (MeridianError, RuntimeError) as exc:
        # The checks below then say which replicas cannot be read.
        caught_up = {"error": f"{type(exc).__name__}: {exc}"}
        _log(f"tpcc: {when}, could not tell whether the followers caught up: {caught_up['error']}")
    if caught_up is not None and "behind" in caught_up:
        lagging = {region: n for region, n in caught_up["behind"].items() if n}
        _log(
            f"tpcc: {when}, followers caught up in {caught_up['waited_s']:.2f} s"
            if not lagging else f"tpcc: {when}, followers STILL BEHIND after"
            f" {caught_up['waited_s']:.0f} s: {lagging}"
        )
    reports = {}
    for name in session.replica_names():
        reports[name] = await _check(session, name, warehouses, scale)
        _log(f"tpcc: {when}, {name}: " + reports[name].summary())
    return reports, caught_up


async def _kill_leader(session: ClusterSession, at_s: float) -> dict[str, Any]:
    """SIGKILLs shard 0's leader ``at_s`` seconds from now (``--kill-leader-at``)."""
    import os
    import signal

    client = session.client
    await client.cluster_map()
    status = (await client.status())[0]
    if status is None:
        raise RuntimeError("shard 0's leader does not answer: nothing to kill")
    await asyncio.sleep(at_s)
    os.kill(int(status["pid"]), signal.SIGKILL)
    session.dead.add(status["address"])
    _log(f"tpcc: killed shard 0's leader {status['address']} (pid {status['pid']}) at {at_s:g} s")
    return {"at_s": at_s, "shard": 0, "address": status["address"], "pid": status["pid"]}


async def benchmark(
    args: argparse.Namespace, run_dir: Path, cluster_config: Any | None
) -> dict[str, Any]:
    layout = (
        schema.Layout(args.shards) if cluster_config is None
        else schema.Layout(cluster_config.shard_count, cluster_config.workers)
    )
    warehouses = list(range(1, layout.units * args.warehouses_per_shard + 1))
    terminals = args.clients or DEFAULT_CLIENTS_PER_WAREHOUSE * len(warehouses)
    in_server = args.generators == "in-server"
    if in_server:  # the same number on every unit (each leader runs its own)
        terminals = max(1, terminals // layout.units) * layout.units
    scale = Scale.shrunk(args.scale_factor)
    progress = not args.no_progress
    if cluster_config is None:
        session: Session = LocalSession(layout, args.seed)
    else:
        session = await connect_cluster(cluster_config, terminals)
    try:
        started = time.monotonic()
        initial = loader.initial_rows(
            warehouses, layout, scale, seed=args.seed, processes=args.load_processes,
            progress=progress,
        )
        await session.load(initial, progress)
        del initial
        load_s = time.monotonic() - started
        _log(f"tpcc: loaded {len(warehouses)} warehouses ({scale}) in {load_s:.1f} s")
        load_replicas, load_catch_up = await check_replicas(
            session, warehouses, scale, "after the load"
        )

        config = DriverConfig(
            warehouses, layout, scale, terminals, seed=args.seed, duration_s=args.duration,
            run_id=re.sub(r"[^A-Za-z0-9-]", "-", run_dir.name),
        )
        driver = Driver(session.target, config, on_second=None if args.no_progress else _live_line)
        killer = None
        if args.kill_leader_at is not None:
            assert isinstance(session, ClusterSession)
            killer = asyncio.create_task(_kill_leader(session, args.kill_leader_at))
        resumed_before = getattr(session.target, "resumed", 0)
        if in_server:
            from bench.tpcc import inserver

            assert isinstance(session, ClusterSession)
            _log(f"tpcc: {terminals // layout.units} terminals in each of {layout.units} leaders")
            answers = await session.generate(
                args.duration, terminals // layout.units, args.seed,
                inserver.params(len(warehouses), scale, config.run_id),
            )
            generated: dict[str, Any] | None = inserver.merged_report(answers)
        else:
            generated = None
            stats = await driver.run()
        resumed_in_run = getattr(session.target, "resumed", 0) - resumed_before
        killed = await killer if killer is not None else None
        run_replicas, run_catch_up = await check_replicas(
            session, warehouses, scale, "after the run"
        )
        replica_names = session.replica_names()
    finally:
        await session.close()

    report = generated if generated is not None else stats.report()
    # Transactions of the measured run asked again after an unknown outcome; those of the
    # load and of the consistency checks (big transactions) apart.
    report["resumed_after_unknown_outcome"] = resumed_in_run
    report["resumed_outside_the_run"] = getattr(session.target, "resumed", 0) - resumed_in_run
    if killed is not None:
        report["killed"] = killed
    title = (
        f"TPC-C, {len(warehouses)} warehouses on {layout.describe()}, {terminals} terminals"
        + (" (in-process)" if args.local else "")
    )
    plot = write_throughput(report, run_dir, title)
    leaders = replica_names[0]
    failures: dict[str, dict[int, list[str]]] = {}
    for reports, when in ((load_replicas, "after_load"), (run_replicas, "after_run")):
        for name, checked in reports.items():
            if checked.failures:
                failures.setdefault(name, {}).update(
                    {number: [f"{when}: {text}" for text in texts]
                     for number, texts in checked.failures.items()}
                )
    report.update(
        consistency=dict(sorted(run_replicas[leaders].conditions.items())),
        consistency_after_load=dict(sorted(load_replicas[leaders].conditions.items())),
        consistency_failures={
            **load_replicas[leaders].failures, **run_replicas[leaders].failures
        },
        consistency_replicas={
            name: dict(sorted(checked.conditions.items())) for name, checked in run_replicas.items()
        },
        consistency_replicas_after_load={
            name: dict(sorted(checked.conditions.items()))
            for name, checked in load_replicas.items()
        },
        consistency_replica_failures=failures,
        replication_catch_up={"after_load": load_catch_up, "after_run": run_catch_up},
        plot=None if plot is None else str(plot),
        run_dir=str(run_dir),
        setup={
            "mode": "local" if args.local else "cluster",
            "generators": args.generators,
            "regions": [] if cluster_config is None else list(cluster_config.regions),
            "replicas_checked": replica_names,
            "shards": layout.shards,
            "workers": layout.workers,
            "warehouses": len(warehouses),
            "terminals": terminals,
            "duration_s": args.duration,
            "scale": {
                "scale_factor": args.scale_factor,
                "items": scale.items,
                "customers_per_district": scale.customers_per_district,
                "new_orders_per_district": scale.new_orders_per_district,
            },
            "seed": args.seed,
            "load_s": round(load_s, 2),
        },
    )
    (run_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def all_conditions_hold(report: dict[str, Any]) -> bool:
    """Every condition true on every replica set, after the load and after the run."""
    return all(
        all(conditions.values())
        for key in ("consistency_replicas", "consistency_replicas_after_load")
        for conditions in report[key].values()
    ) and all(report["consistency"].values())


def human_report(report: dict[str, Any]) -> str:
    setup = report["setup"]
    where = setup["mode"]
    if setup["regions"]:
        where += ", regions " + "/".join(setup["regions"])
    lines = [
        f"TPC-C: {setup['warehouses']} warehouses on "
        f"{schema.Layout(setup['shards'], setup.get('workers', 1)).describe()}, "
        f"{setup['terminals']} terminals, {report['elapsed_s']:.1f} s ({where})",
        f"  throughput     {report['txn_per_s']:.1f} transactions/s, "
        f"{report['new_order_per_min']:.0f} New-Orders/min",
        f"  abort rate     {report['abort_rate']:.2%} (conflicts, retried)",
        f"  rollback rate  {report['rollback_rate']:.2%} of New-Orders",
        f"  cross-shard    {report['cross_shard_fraction']:.2%} of transactions",
        "  mix            " + ", ".join(f"{k} {v:.1%}" for k, v in report["mix"].items()),
        "  latency (ms)   type: certified p50/p99/p99.9/max, committed p50/p99/p99.9/max",
    ]
    for kind, latency in report["latency_ms"].items():
        shown = [
            "/".join(
                "-" if latency[f"{what}_{name}"] is None else f"{latency[f'{what}_{name}']:.2f}"
                for name in ("p50", "p99", "p999", "max")
            )
            for what in ("certified", "committed")
        ]
        lines.append(f"    {kind:<13} {shown[0]}, {shown[1]}")
    lines.append("  consistency    conditions 1-12 after the load / after the run, per replica set")
    for name, conditions in report["consistency_replicas"].items():
        verdicts = []
        for checked in (report["consistency_replicas_after_load"][name], conditions):
            failed = [n for n, holds in checked.items() if not holds]
            verdicts.append("all true" if not failed else f"FAILED {failed}")
        role = "leaders" if name == setup["replicas_checked"][0] else "followers"
        lines.append(f"    {name:<13} ({role}) {verdicts[0]} / {verdicts[1]}")
    lines.append(f"  plot           {report['plot'] or 'skipped'}")
    if report["errors"]:
        lines.append("  errors         " + "; ".join(report["errors"][:3]))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    run_dir = args.run_dir or REPO / "runs" / time.strftime("tpcc-%Y%m%d-%H%M%S")
    cluster_config, processes = (None, None) if args.local else prepare_cluster(args, run_dir)
    try:
        if processes is None and cluster_config is None:
            loop = asyncio.new_event_loop()
        else:
            from store.rpc.aio import new_event_loop

            loop = new_event_loop()
        try:
            report = loop.run_until_complete(benchmark(args, run_dir, cluster_config))
        finally:
            loop.close()
    finally:
        if processes is not None:
            processes.stop()
    if args.json:
        print(json.dumps(report))
    else:
        print(human_report(report))
    return 0 if all_conditions_hold(report) else 1


if __name__ == "__main__":
    sys.exit(main())
