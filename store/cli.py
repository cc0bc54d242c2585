"""The ``meridian`` command."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from store.core.settings import BREAKABLE_STEPS

if TYPE_CHECKING:
    from store.config import ClusterConfig
from store.sim import SCENARIO_NAMES


def _sim_options(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from store.sim.run import SimOptions

    return SimOptions(
        shards=args.shards,
        workers=args.workers,
        clients=args.clients,
        clients_per_process=args.clients_per_process,
        workload=args.workload,
        loss=args.loss,
        duplicate=args.duplicate,
        reorder=args.reorder,
        receive_batch_us=args.receive_batch_us,
        duration_ms=args.duration_ms,
        settle_ms=args.settle_ms,
        partitions=args.partitions,
        break_step=args.break_step,
        speculation=not args.no_speculation,
        regions=args.regions,
        wan_rtt_ms=args.wan_rtt_ms,
        scan_fraction=args.scan_fraction,
        reverse_fraction=args.reverse_fraction,
        clear_fraction=args.clear_fraction,
        replicated=args.replicated,
        snapshot_fraction=args.snapshot_fraction,
        crashes=args.crashes,
        scenario=args.scenario,
        disk=args.disk,
    )


def _run_chunk(seeds: list[int], options, out_dir: str | None):  # type: ignore[no-untyped-def]
    from store.sim.run import run_seed

    return [run_seed(seed, options, Path(out_dir) if out_dir else None) for seed in seeds]


def _exit_with_parent(parent: int) -> None:
    """In a sim worker: ends the worker when the ``meridian sim`` that started it is gone
    (killed), instead of running the rest of its seeds for nobody."""
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def cmd_sim(args: argparse.Namespace) -> int:
    from store.sim.run import dumps, summarize

    options = _sim_options(args)
    first = args.seed if args.seed is not None else 0
    count = args.seeds if args.seeds is not None else 1
    seeds = list(range(first, first + count))
    jobs = max(1, min(args.jobs or os.cpu_count() or 1, len(seeds)))
    out_dir = str(args.out) if args.out else None
    if jobs == 1:
        results = _run_chunk(seeds, options, out_dir)
    else:
        chunks = [seeds[i::jobs] for i in range(jobs)]
        # Fresh interpreters: a forked worker would inherit (and its garbage collector keep
        # scanning) everything the parent process holds, which made a test suite's run
        # of this command ten times slower.
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            jobs, mp_context=context, initializer=_exit_with_parent, initargs=(os.getpid(),)
        ) as pool:
            parts = list(pool.map(_run_chunk, chunks, [options] * jobs, [out_dir] * jobs))
        results = sorted((r for part in parts for r in part), key=lambda r: r.seed)
    summary = summarize(results, options)
    if args.json:
        print(dumps(summary))
    else:
        _print_summary(summary)
    return 0 if summary["anomalies"] == 0 or options.break_step else 1


def _print_summary(summary: dict) -> None:  # type: ignore[type-arg]
    print(
        f"simulated {summary['seeds']} seed(s) of {summary['workload']} on "
        f"{summary['shards']} shards, loss {summary['loss']}"
        + (f", break {summary['break']}" if summary["break"] else "")
    )
    print(
        f"  transactions: {summary['transactions']} "
        f"(committed {summary['transactions_committed']}, failed "
        f"{summary['transactions_failed']}, indeterminate "
        f"{summary['transactions_indeterminate']}); cross-shard "
        f"{summary['cross_shard_fraction']:.0%}"
    )
    if summary.get("failovers"):
        print(
            f"  recovery: {summary['failovers']} failover(s) in {summary['seeds_with_failover']} "
            f"seed(s), {summary['crashes']} crash(es) ({summary['majority_crashes']} leaving a shard "
            f"without a majority), {summary['restarts']} restart(s), "
            f"{summary['rolled_back']} transaction(s) "
            f"rolled back, committed ones lost in {summary['lost_committed']} seed(s)"
        )
    print(f"  histories checked: {summary['histories_checked']}; anomalies: {summary['anomalies']}")
    if summary["anomalies"]:
        print(f"  anomaly kinds: {', '.join(summary['anomaly_kinds'])}")
        failure = summary.get("first_failure")
        if failure:
            print(f"  first failing seed {failure['seed']}: {failure['anomaly_kinds']}")
            print(f"  you can reproduce this failure with: {failure['replay']}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="meridian", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    sim = commands.add_parser("sim", help="run simulated clusters and check every history")
    sim.add_argument("--seeds", type=int, help="number of seeds to run (default 1)")
    sim.add_argument("--seed", type=int, help="first seed (default 0)")
    sim.add_argument("--shards", type=int, default=3)
    sim.add_argument(
        "--workers", type=int, default=1,
        help="worker processes per shard leader, each with its own keys and Paxos stream "
        "(default 1)",
    )
    sim.add_argument("--clients", type=int, default=8)
    sim.add_argument(
        "--clients-per-process", type=int, default=4,
        help="workload clients sharing one SDK client (default 4)",
    )
    sim.add_argument("--workload", choices=["list-append", "bank"], default="list-append")
    sim.add_argument("--loss", type=float, default=0.0, help="message loss rate (also duplication)")
    sim.add_argument("--duplicate", type=float, help="duplication rate (default: the loss rate, or 0.02)")
    sim.add_argument("--reorder", type=float, help="chance a message is held back (default 0.05)")
    sim.add_argument(
        "--receive-batch-us", type=int, default=0,
        help="a process takes the datagrams that reach it within this many microseconds of "
        "one another in one batch, as a busy server reads its socket (a shard leader "
        "handles a batch as one step); 0: each at once (default)",
    )
    sim.add_argument("--duration-ms", type=int, default=400, help="virtual time under load")
    sim.add_argument("--partitions", action="store_true", help="add a partition nemesis")
    sim.add_argument(
        "--crashes", action="store_true",
        help="crash shard replicas during the load and restart them (with --regions 3: "
        "followers take over from a crashed leader; a restarted replica copies its state)",
    )
    sim.add_argument(
        "--disk", action="store_true",
        help="every process syncs its acceptor's promises and votes to a simulated disk that "
        "keeps only what was synced; a crash loses the rest, a restart recovers from it "
        "(with --crashes: two replicas of a shard may be down at once)",
    )
    sim.add_argument(
        "--regions", type=int, choices=[1, 3], default=1,
        help="3: every shard also has followers in two more regions, 50 ms round trips away",
    )
    sim.add_argument(
        "--settle-ms", type=int, default=6000,
        help="virtual time the cluster may take to go quiet after the load and the faults end",
    )
    sim.add_argument("--wan-rtt-ms", type=float, default=50.0, help="round trip between regions")
    sim.add_argument(
        "--scan-fraction", type=float, default=0.15,
        help="list-append: share of micro-operations that scan a range of keys",
    )
    sim.add_argument(
        "--replicated", action="store_true",
        help="the workload's table is replicated on every shard (read locally, written everywhere)",
    )
    sim.add_argument(
        "--reverse-fraction", type=float, default=0.0,
        help="list-append: share of scans that read from the range's end (highest key first)",
    )
    sim.add_argument(
        "--clear-fraction", type=float, default=0.0,
        help="list-append: share of operations that clear a range of retired keys (clear_range)",
    )
    sim.add_argument(
        "--snapshot-fraction", type=float, default=0.1,
        help="with followers: share of client operations that are follower snapshot reads",
    )
    sim.add_argument(
        "--break", dest="break_step",
        choices=list(BREAKABLE_STEPS),
        help="switch one safety step off in the servers, to show the checkers catch it",
    )
    sim.add_argument(
        "--scenario", choices=sorted(SCENARIO_NAMES),
        help="a scripted fault schedule on top of the others (with --regions 3): "
        "rejoin-behind crashes a leader whose last commits one follower holds, and restarts "
        "it while that follower is cut off; majority-crash (with --disk) crashes a leader and "
        "the follower that voted with it",
    )
    sim.add_argument(
        "--no-speculation", action="store_true",
        help="hide writes and keep locks until commit (Mako's OCC+OR baseline)",
    )
    sim.add_argument("--out", type=Path, help="write DIR/<seed>/history.edn")
    sim.add_argument("--jobs", type=int, help="worker processes (default: one per core)")
    sim.add_argument("--json", action="store_true", help="print one JSON object")
    sim.set_defaults(run=cmd_sim)

    serve = commands.add_parser(
        "serve", help="run one server process: a shard's leader or follower, or a CM member"
    )
    serve.add_argument("--config", required=True, type=Path, help="cluster file (TOML)")
    serve.add_argument(
        "--shard", type=_shard_arg,
        help="the shard (leader and follower roles); with workers, SHARD.WORKER (e.g. 1.0), "
        "or the unit number SHARD * workers + WORKER",
    )
    serve.add_argument("--role", choices=["leader", "follower", "cm"], default="leader")
    serve.add_argument("--region", help="the follower's or CM member's region")
    serve.add_argument(
        "--rejoin", action="store_true",
        help="a restarted replica: copy its state from a live one and rejoin as a follower",
    )
    serve.add_argument(
        "--break", dest="break_step", choices=list(BREAKABLE_STEPS),
        help="TESTING ONLY: switch one safety step off, to show a checker catches it",
    )
    serve.set_defaults(run=cmd_serve)

    up = commands.add_parser("up", help="start a local cluster; Ctrl-C stops it")
    up.add_argument("--config", required=True, type=Path, help="cluster file (TOML)")
    up.add_argument(
        "--no-restart", action="store_true",
        help="report a dead process but do not restart it (default: restart; it rejoins)",
    )
    up.add_argument(
        "--fresh", action="store_true",
        help="start a new cluster: move an earlier run's data to <data_dir>/previous-run "
        "(default: the cluster goes on from its data directories)",
    )
    up.set_defaults(run=cmd_up)

    status = commands.add_parser("status", help="each shard's leader, health and counters")
    status.add_argument("--config", required=True, type=Path, help="cluster file (TOML)")
    status.set_defaults(run=cmd_status)

    truncate = commands.add_parser(
        "truncate", help="delete every key of a table (its string and tuple keys), in batches",
    )
    truncate.add_argument("--config", required=True, type=Path, help="cluster file (TOML)")
    truncate.add_argument("table", help="the table: keys 'table/...' and ('table', ...)")
    truncate.set_defaults(run=cmd_truncate)

    wan = commands.add_parser(
        "wan-proxy", help="emulate wide-area links: a delaying, partitionable TCP proxy",
        add_help=False,
    )
    wan.add_argument("options", nargs=argparse.REMAINDER, help="see meridian wan-proxy --help")

    certs = commands.add_parser(
        "certs",
        help="make the cluster's CA, each process's TLS key and certificate, and the "
        "cluster secret, where the cluster file's [security] says",
    )
    certs.add_argument("--config", required=True, type=Path, help="cluster file (TOML)")
    certs.add_argument("--days", type=int, default=365, help="validity of the certificates")
    certs.set_defaults(run=cmd_certs)

    reference = commands.add_parser(
        "config-reference",
        help="print the cluster file reference (docs/configuration.md) from the definitions",
    )
    reference.set_defaults(run=cmd_config_reference)

    demo = commands.add_parser(
        "demo", help="the main job: a short microbenchmark and a short TPC-C on local clusters"
    )
    demo.add_argument("--duration", type=float, default=15.0, help="seconds of load, each")
    demo.set_defaults(run=cmd_demo)
    return parser


def _config(path: Path):  # type: ignore[no-untyped-def]
    from store.config import ConfigError, load

    try:
        return load(path)
    except ConfigError as exc:
        raise SystemExit(f"meridian: {exc}") from None


def _shard_arg(text: str) -> int | str:
    """``--shard``: a number (with workers, a unit), or SHARD.WORKER (resolved by ``_unit``
    once the cluster file is read)."""
    if "." in text:
        parts = text.split(".")
        if len(parts) == 2 and all(part.isdigit() for part in parts):
            return text
    else:
        try:
            return int(text)
        except ValueError:
            pass
    raise argparse.ArgumentTypeError(f"a number or SHARD.WORKER, not {text!r}")


def _unit(config: ClusterConfig, value: int | str) -> int:
    """A ``--shard`` value as a unit: SHARD.WORKER is shard * workers + worker."""
    if isinstance(value, int):
        return value
    shard, worker = (int(part) for part in value.split("."))
    text = value
    if not 0 <= worker < config.workers or not 0 <= shard < config.shard_count:
        raise SystemExit(
            f"meridian: the cluster has no worker {text} ({config.shard_count} shard(s) of "
            f"{config.workers} worker(s))"
        )
    return shard * config.workers + worker


def cmd_serve(args: argparse.Namespace) -> int:
    from store.config import ConfigError
    from store.node.server import serve
    from store.node.snapshot import SnapshotCorrupt
    from store.node.wal import WalCorrupt

    config = _config(args.config)
    if args.shard is not None:
        args.shard = _unit(config, args.shard)
    if (args.role == "cm" and args.region is None) or (
        args.role != "cm" and (args.shard is None or (args.role == "follower" and args.region is None))
    ):
        _pick_local_node(config, args)
    if args.role == "cm":
        args.shard = -1
    elif args.shard is None or not 0 <= args.shard < len(config.shards):
        raise SystemExit(f"meridian: the cluster has no shard {args.shard}")
    _transport_usable(config)
    try:
        breaks = frozenset({args.break_step}) if args.break_step else frozenset()
        serve(config, args.shard, args.role, args.region, rejoin=args.rejoin, breaks=breaks)
    except ConfigError as exc:
        raise SystemExit(f"meridian: {exc}") from None
    except (WalCorrupt, SnapshotCorrupt) as exc:
        # Not a torn write: the operator decides (docs/durability.md).
        raise SystemExit(f"meridian: corrupt data, not starting: {exc}") from None
    return 0


def _pick_local_node(config, args: argparse.Namespace) -> None:  # type: ignore[no-untyped-def]
    """``meridian serve --role ROLE`` without the shard or region: the one process of that
    role (and of the shard or region given, if one is) whose address is this machine's."""
    from store.node.up import is_local

    candidates = [
        node for node in config.nodes()
        if node.role == args.role
        and (args.shard is None or node.shard == args.shard)
        and (args.region is None or node.region == args.region)
    ]
    local = [node for node in candidates if is_local(node.rpc[0])]
    if len(local) != 1:
        named = ", ".join(f"{n.name} ({n.address})" for n in (local or candidates)) or "none"
        where = "on this machine" if local else "in the cluster file, none on this machine"
        raise SystemExit(
            f"meridian: serve --role {args.role}: {len(local or candidates)} processes of that "
            f"role {where}: {named}; name one with --shard and --region"
        )
    args.shard, args.region = local[0].shard, local[0].region


def _transport_usable(config) -> None:  # type: ignore[no-untyped-def]
    """Stops at once, saying why, where the cluster file's transport cannot run."""
    if config.transport == "rdma":
        from store.rpc.rdma import RdmaUnavailable, require_rdma

        try:
            require_rdma()
        except RdmaUnavailable as exc:
            raise SystemExit(f"meridian: {exc}") from None


def cmd_up(args: argparse.Namespace) -> int:
    from store.node.up import run_up

    config = _config(args.config)
    _transport_usable(config)
    return run_up(config, restart=not args.no_restart, fresh=args.fresh)


def cmd_status(args: argparse.Namespace) -> int:
    from store.node.up import run_status

    return run_status(_config(args.config))


def cmd_truncate(args: argparse.Namespace) -> int:
    from store.client import BlockingClient
    from store.core.errors import MeridianError

    try:
        with BlockingClient.connect(_config(args.config)) as client:
            deleted = client.truncate(args.table)
    except MeridianError as exc:
        raise SystemExit(f"meridian: truncate {args.table}: {type(exc).__name__}: {exc}") from None
    print(f"deleted {deleted} keys of {args.table}")
    return 0


def cmd_certs(args: argparse.Namespace) -> int:
    from store.config import ConfigError
    from store.node.certs import write_cluster_certs

    config = _config(args.config)
    if args.days < 1:
        raise SystemExit("meridian: --days must be at least 1")
    try:
        written = write_cluster_certs(config, args.days)
    except ConfigError as exc:
        raise SystemExit(f"meridian: {exc}") from None
    for path in written:
        print(path)
    return 0


def cmd_config_reference(args: argparse.Namespace) -> int:
    from store.config_reference import reference

    sys.stdout.write(reference())
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job: Mako's microbenchmark, then TPC-C, each on a local cluster it starts
    and stops, with live progress and a report."""
    import subprocess

    bench = Path(__file__).resolve().parent.parent / "bench"
    if not (bench / "micro.py").exists():
        raise SystemExit("meridian demo runs bench/ from a source checkout")
    seconds = str(args.duration)
    code = subprocess.call(
        [sys.executable, str(bench / "micro.py"), "--shards", "2", "--duration", seconds]
    )
    print(flush=True)
    return code | subprocess.call(
        [sys.executable, str(bench / "tpcc.py"), "--shards", "2", "--warehouses-per-shard", "1",
         "--duration", seconds]
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "wan-proxy":  # its own parser, options and help
        from store.wan import main as wan_main

        return int(wan_main(argv[1:]))
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
