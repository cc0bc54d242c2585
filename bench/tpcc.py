"""TPC-C against Meridian: load, run the 45/43/4/4/4 mix, report, check consistency.

    python bench/tpcc.py --local --shards 2 --warehouses-per-shard 2 --duration 60 --json

``--local`` runs the real shard-leader code in this process on a fault-free simulated
network (``store.sim.local.LocalCluster``): latencies are the simulated cluster's, and
throughput is what this one Python process achieves. Otherwise the command starts a
one-region cluster of server processes on loopback (``--base-port``) and drives it through
the client SDK, or uses a running one named by ``--connect FILE`` (its cluster file must
load ``bench.tpcc.procedures:register`` and use the prefix partitioner). The functions
between the "REAL CLUSTER" markers below are all that ties the benchmark to it.

The report gives throughput (transactions/s, New-Orders per minute), per-type p50/p99
latency (certified and committed), the conflict abort rate, the rollback rate
(rolled-back New-Orders / New-Orders), the measured mix, the cross-shard fraction, the
twelve consistency conditions after the load and after the run, and a plot of throughput
per second saved in the run directory. ``--json`` prints it as one object.
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

from bench.tpcc import consistency, loader, procedures  # noqa: E402
from bench.tpcc.driver import Completed, Driver, DriverConfig, Stats, Target  # noqa: E402
from bench.tpcc.plot import write_throughput  # noqa: E402
from bench.tpcc.schema import Scale  # noqa: E402
from store.core.settings import DEFAULT_SETTINGS  # noqa: E402

DEFAULT_SCALE_FACTOR = 10.0
DEFAULT_CLIENTS_PER_WAREHOUSE = 2


class Session:
    """Where the benchmark runs: how to load it, drive it and read back its data."""

    target: Target
    shard_count: int

    async def load(self, rows_by_shard: list[dict[str, Any]], progress: bool) -> None:
        raise NotImplementedError

    async def rows(self, warehouses: Sequence[int]) -> dict[str, Any]:
        """Every row of the TPC-C tables of ``warehouses`` (nothing else may be running)."""
        raise NotImplementedError

    async def close(self) -> None:
        return None


class LocalSession(Session):
    """The in-process cluster: bulk preload, and reads straight from every leader's store."""

    def __init__(self, shard_count: int, seed: int) -> None:
        from bench.tpcc.local import SimulatedTarget
        from store.core.partition import PrefixPartitioner
        from store.core.txn import Procedures
        from store.sim.local import LocalCluster

        registry = Procedures()
        procedures.register(registry)
        self.cluster = LocalCluster(shard_count, registry, PrefixPartitioner(shard_count), seed=seed)
        self.target = SimulatedTarget(self.cluster)
        self.shard_count = shard_count

    async def load(self, rows_by_shard: list[dict[str, Any]], progress: bool) -> None:
        for rows in rows_by_shard:
            self.cluster.preload(rows)
        # Preloaded keys start out as garbage-collection candidates; let the first collection
        # (which visits them all) happen now rather than stall the measured run.
        sim = self.cluster.sim
        sim.run_until(sim.now_ns + 2 * DEFAULT_SETTINGS.gc_interval_ns)
        # The loaded rows live as long as the process: keep Python's collector from walking
        # them again and again during the run.
        gc.freeze()

    async def rows(self, warehouses: Sequence[int]) -> dict[str, Any]:
        from bench.tpcc.local import replica_rows

        return replica_rows(self.cluster)


class ClusterSession(Session):
    """A cluster of server processes reached through the client SDK."""

    def __init__(self, client: Any, shard_count: int) -> None:
        self.client = client
        self.target = _SdkTarget(client)
        self.shard_count = shard_count

    async def load(self, rows_by_shard: list[dict[str, Any]], progress: bool) -> None:
        await loader.load_through_transactions(self.target.run, rows_by_shard, progress=progress)

    async def rows(self, warehouses: Sequence[int]) -> dict[str, Any]:
        return await consistency.snapshot(
            self.target.run, warehouses, self.shard_count, page_rows=SNAPSHOT_PAGE_ROWS
        )

    async def close(self) -> None:
        await self.client.close()


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
# Rows per tpcc_scan page: a page of 5000 customers is about 3.5 MB, one answer the RPC
# layer may fail to deliver within its session timeout; 500 rows keep answers near 350 KB.
SNAPSHOT_PAGE_ROWS = 500
# Times one transaction whose outcome is unknown is asked for again (same id, never rerun).
RESUMES_MAX = 5


def cluster_file(directory: Path, shard_count: int, base_port: int) -> Path:
    """A one-region cluster file with the TPC-C procedures and warehouse placement."""
    lines = [
        "# Written by bench/tpcc.py: one region on loopback, warehouse w on shard w mod S.",
        "[cluster]",
        'name = "tpcc"',
        f"run_dir = {json.dumps(str(directory / 'cluster'))}",
        f"python_path = [{json.dumps(str(REPO))}]",
        f"procedures = [{json.dumps(PROCEDURE_MODULE)}]",
        'partitioner = "prefix"',
        "[settings]",
        "peer_retry_ns = 200_000_000",
        "peer_attempts_max = 15",
        "[[regions]]",
        'name = "us"',
    ]
    for shard in range(shard_count):
        lines += ["[[shards]]", f'leader = "127.0.0.1:{base_port + shard}"']
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
        if config.partitioner_kind != "prefix" or PROCEDURE_MODULE not in config.procedures:
            raise SystemExit(
                f"tpcc: {args.connect} needs partitioner = \"prefix\" and procedures including"
                f" \"{PROCEDURE_MODULE}\""
            )
        return config, None
    from store.node.up import LocalCluster as ProcessCluster

    config = config_module.load(cluster_file(run_dir, args.shards, args.base_port))
    processes = ProcessCluster(config)
    processes.start()
    try:
        processes.wait_ready()
    except BaseException:
        processes.stop()
        raise
    _log(f"tpcc: started {len(config.shards)} shard servers (logs in {config.run_dir})")
    return config, processes


async def connect_cluster(config: Any, terminals: int) -> Session:
    from store.client import Client

    client = await Client.connect(config, in_flight_max=max(256, 2 * terminals))
    return ClusterSession(client, len(config.shards))
# =============================================================================================


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--local", action="store_true", help="run on an in-process simulated cluster")
    where.add_argument("--connect", type=Path, metavar="FILE", help="a running cluster's file")
    parser.add_argument(
        "--base-port", type=int, default=DEFAULT_BASE_PORT, help="first port of a started cluster"
    )
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--warehouses-per-shard", type=int, default=2)
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
    parser.add_argument("--workers", type=int, default=1, help="processes generating warehouses")
    parser.add_argument("--run-dir", type=Path, default=None, help="default runs/tpcc-<time>")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars or live lines")
    args = parser.parse_args(argv)
    if args.shards < 1 or args.warehouses_per_shard < 1 or args.duration <= 0:
        parser.error("--shards, --warehouses-per-shard and --duration must be positive")
    if args.clients is not None and args.clients < 1:
        parser.error("--clients must be positive")
    return args


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _live_line(second: int, stats: Stats) -> None:
    completed = stats.completed()
    new_orders = stats.by_type["new_order"].completed
    aborts = sum(s.aborts for s in stats.by_type.values())
    _log(f"tpcc [{second:4d}s] {completed} transactions, {new_orders} New-Orders, {aborts} aborts")


async def _check(session: Session, warehouses: Sequence[int], scale: Scale) -> consistency.Report:
    """The twelve conditions on the session's data; all false if it cannot be read."""
    from store.core.errors import MeridianError

    try:
        rows = await session.rows(warehouses)
    except MeridianError as exc:
        report = consistency.Report()
        for number in consistency.CONDITIONS:
            report.fail(number, f"could not read the data: {type(exc).__name__}: {exc}")
        return report
    return consistency.check(rows, scale)


async def benchmark(
    args: argparse.Namespace, run_dir: Path, cluster_config: Any | None
) -> dict[str, Any]:
    shard_count = args.shards if cluster_config is None else len(cluster_config.shards)
    warehouses = list(range(1, shard_count * args.warehouses_per_shard + 1))
    terminals = args.clients or DEFAULT_CLIENTS_PER_WAREHOUSE * len(warehouses)
    scale = Scale.shrunk(args.scale_factor)
    progress = not args.no_progress
    if cluster_config is None:
        session: Session = LocalSession(shard_count, args.seed)
    else:
        session = await connect_cluster(cluster_config, terminals)
    try:
        started = time.monotonic()
        rows_by_shard = loader.initial_rows(
            warehouses, shard_count, scale, seed=args.seed, workers=args.workers, progress=progress
        )
        await session.load(rows_by_shard, progress)
        del rows_by_shard
        load_s = time.monotonic() - started
        _log(f"tpcc: loaded {len(warehouses)} warehouses ({scale}) in {load_s:.1f} s")
        after_load = await _check(session, warehouses, scale)
        _log("tpcc: after the load, " + after_load.summary())

        config = DriverConfig(
            warehouses, shard_count, scale, terminals, seed=args.seed, duration_s=args.duration,
            run_id=re.sub(r"[^A-Za-z0-9-]", "-", run_dir.name),
        )
        driver = Driver(session.target, config, on_second=None if args.no_progress else _live_line)
        stats = await driver.run()
        after_run = await _check(session, warehouses, scale)
        _log("tpcc: after the run, " + after_run.summary())
    finally:
        await session.close()

    report = stats.report()
    report["resumed_after_unknown_outcome"] = getattr(session.target, "resumed", 0)
    title = (
        f"TPC-C, {len(warehouses)} warehouses on {shard_count} shards, {terminals} terminals"
        + (" (in-process)" if args.local else "")
    )
    plot = write_throughput(report, run_dir, title)
    report.update(
        consistency={number: holds for number, holds in sorted(after_run.conditions.items())},
        consistency_after_load=dict(sorted(after_load.conditions.items())),
        consistency_failures={**after_load.failures, **after_run.failures},
        plot=None if plot is None else str(plot),
        run_dir=str(run_dir),
        setup={
            "mode": "local" if args.local else "cluster",
            "shards": shard_count,
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


def human_report(report: dict[str, Any]) -> str:
    setup = report["setup"]
    lines = [
        f"TPC-C: {setup['warehouses']} warehouses on {setup['shards']} shards, "
        f"{setup['terminals']} terminals, {report['elapsed_s']:.1f} s ({setup['mode']})",
        f"  throughput     {report['txn_per_s']:.1f} transactions/s, "
        f"{report['new_order_per_min']:.0f} New-Orders/min",
        f"  abort rate     {report['abort_rate']:.2%} (conflicts, retried)",
        f"  rollback rate  {report['rollback_rate']:.2%} of New-Orders",
        f"  cross-shard    {report['cross_shard_fraction']:.2%} of transactions",
        "  mix            " + ", ".join(f"{k} {v:.1%}" for k, v in report["mix"].items()),
        "  latency (ms)   type: certified p50/p99, committed p50/p99",
    ]
    for kind, latency in report["latency_ms"].items():
        shown = [
            "-" if latency[name] is None else f"{latency[name]:.2f}"
            for name in ("certified_p50", "certified_p99", "committed_p50", "committed_p99")
        ]
        lines.append(f"    {kind:<13} {shown[0]}/{shown[1]}, {shown[2]}/{shown[3]}")
    verdict = "all true" if all(report["consistency"].values()) else "FAILED"
    failed = [n for n, holds in report["consistency"].items() if not holds]
    lines.append(f"  consistency    conditions 1-12 {verdict} {failed or ''}".rstrip())
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
    return 0 if all(report["consistency"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
