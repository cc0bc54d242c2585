"""``python -m jepsen run``: a Jepsen test of real Meridian processes under faults.

One test, start to end (docs/jepsen.md):

1. **Hosts.** Each of three regions (``us``, ``eu``, ``ap``) gets a network namespace of its
   own, joined through a router namespace, and the clients one more (``jepsen.hosts``); a
   partition then drops packets between regions as a real network does. Without root the
   regions share loopback and partitions are off (the run says so).
2. **Cluster.** A cluster file in the run directory: ``--shards`` shards, each led from
   ``us`` with followers in ``eu`` and ``ap``, a configuration-manager member per region,
   every process started in its region's namespace by ``store.node.up.ProcessCluster``.
   ``--workers W`` runs each shard leader as W worker processes (units with streams and
   followers of their own; the kill nemesis then kills single workers).
   With ``--break STEP`` every shard replica runs with that safety step switched off.
3. **Load.** ``--concurrency`` clients, each a ``store.client.Client`` in the client
   namespace, run the workload (the simulator's, ``store.sim.workloads``) for
   ``--time-limit`` seconds, at most ``--rate`` operations a second in all. Outcomes:
   committed → ``:ok``; aborted, unavailable or rolled back → ``:fail`` (with ``:error``);
   ``OutcomeUnknown`` → ``:info`` and the client continues as a new process.
4. **Faults** on the schedule ``jepsen.nemesis.plan_schedule`` draws from ``--seed``, each
   written to the history as a ``:nemesis`` operation.
5. **Heal and recover**: every fault undone, killed processes started again; then each shard
   must commit again (within ``RECOVERY_S``), and final reads of every key are added to the
   history.
6. **Check** (``jepsen.checks``) and **write** the run directory:
   ``runs/jepsen/<test-name>/<timestamp>/`` (``latest`` points at the newest) with
   ``history.edn``, ``results.edn``, ``latency-raw.png``, ``rate.png``, ``timeline.html``,
   the cluster file and every process's log. The end of the run prints a one-screen summary;
   the exit status is 0 when valid, 1 when not, 2 when the test could not run.

Everything the harness made (namespaces, processes) is removed at the end, also on Ctrl-C or
SIGTERM; the run directory stays.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import random
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jepsen.history import Op, write_history
from jepsen.hosts import Hosts, make_hosts, sweep
from jepsen.nemesis import KINDS, Nemesis, Planned, plan_schedule
from jepsen.runner import History, error_name, run_workload

__all__ = ["Options", "main", "run_test"]

REGIONS = ("us", "eu", "ap")
WORKLOADS = ("list-append", "bank", "tpcc")
SHARD_PORT = 7200
CM_PORT = 7300
# After the last fault is healed, each shard must commit again within this.
RECOVERY_S = 60.0
# Cluster start (processes answering) may take this long.
START_S = 90.0
# The first fault comes this long after the load starts (a baseline to compare with).
FIRST_FAULT_S = 5.0
BANK_ACCOUNTS = 8
BANK_TOTAL = 800


@dataclass
class Options:
    workload: str = "list-append"
    nemeses: tuple[str, ...] = ("kill", "partition")
    time_limit_s: float = 60.0
    concurrency: int = 16
    rate: float | None = None
    seed: int = 0
    break_step: str | None = None
    shards: int = 2
    workers: int = 1  # worker processes per shard leader (docs/design.md, "Workers")
    leader_timeout_ms: int = 1000
    client_timeout_s: float = 5.0
    fault_s: float = 4.0
    quiet_s: float = 4.0
    runs_dir: Path = Path("runs/jepsen")
    netns: bool = True
    name: str | None = None
    clear_fraction: float = 0.0  # list-append: share of operations that clear retired keys

    def test_name(self) -> str:
        if self.name:
            return self.name
        name = f"{self.workload}-{'+'.join(self.nemeses) or 'none'}"
        return name + (f"-break-{self.break_step}" if self.break_step else "")


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGINT while a test ran (a KeyboardInterrupt, so that no event loop
    swallows it on its way out)."""


def _on_signal(signum: int, frame: Any) -> None:
    raise Interrupted(signal.Signals(signum).name)


def cluster_file(directory: Path, hosts: Hosts, options: Options) -> Path:
    """The test's cluster: see the module doc. Addresses are the hosts' (one per region)."""
    address = {region: hosts.address(region) for region in REGIONS}
    repo = Path(__file__).resolve().parent.parent
    # TPC-C places warehouse w on shard w mod S by its keys' prefix (bench/tpcc.py).
    procedures, partitioner = (
        ("bench.tpcc.procedures:register", "prefix") if options.workload == "tpcc"
        else ("store.sim.workloads:register_bank", "hash")
    )
    lines = [
        "# Written by python -m jepsen run: one region per host (network namespace).",
        "[cluster]", f'name = "{options.test_name()}"', f'run_dir = "{directory / "logs"}"',
        f'python_path = ["{repo}"]', f'procedures = ["{procedures}"]',
        f'partitioner = "{partitioner}"', f"workers = {options.workers}",
        "[settings]", "peer_retry_ns = 200_000_000", "peer_attempts_max = 15",
        f"leader_timeout_ns = {options.leader_timeout_ms * 1_000_000}",
        "[client]", f"timeout_s = {options.client_timeout_s}",
        *(f'[[regions]]\nname = "{region}"' for region in REGIONS),
    ]
    for shard in range(options.shards):
        port = SHARD_PORT + shard
        followers = ", ".join(
            f'{{ region = "{region}", address = "{address[region]}:{port}" }}'
            for region in REGIONS[1:]
        )
        lines += [
            "[[shards]]", f'leader = "{address[REGIONS[0]]}:{port}"', f'region = "{REGIONS[0]}"',
            f"followers = [{followers}]",
        ]
    for region in REGIONS:
        lines += ["[[cm]]", f'region = "{region}"', f'address = "{address[region]}:{CM_PORT}"']
    if options.workload == "tpcc":  # one copy of ITEM, on every shard (bench/tpcc/schema.py)
        lines += ["[placement]", 'replicated = ["item"]']
    # On, as in every cluster file Meridian writes: mutual TLS between regions and the
    # cluster secret on every RPC session (the certificates are made next, beside it).
    lines += [
        "[security]", "tls = true", 'ca = "certs/ca.pem"', 'cert_dir = "certs"',
        'secret_file = "certs/cluster.secret"',
    ]
    path = directory / "cluster.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _run_directory(options: Options) -> Path:
    base = options.runs_dir / options.test_name()
    stamp = datetime.datetime.now().strftime("%Y%m%dT%H%M%S.%f")[:-3]
    directory = base / stamp
    directory.mkdir(parents=True)
    latest = base / "latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(stamp)
    return directory


def run_test(options: Options, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Runs one test (see the module doc); returns the results (as in ``results.edn``)."""
    directory = _run_directory(options)
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    hosts: Hosts | None = None
    cluster: Any = None
    try:
        stale = sweep()
        if stale:
            log(f"jepsen: removed {len(stale)} namespaces left by earlier runs: {stale}")
        hosts = make_hosts(list(REGIONS), want_netns=options.netns)
        nemeses = options.nemeses
        if not hosts.partitions and "partition" in nemeses:
            log(f"jepsen: {hosts.reason}; the partition nemesis is off")
            nemeses = tuple(k for k in nemeses if k != "partition")
        # From here on this process's sockets are the client host's.
        hosts.enter_client()
        from store import config as config_module
        from store.node.certs import write_cluster_certs
        from store.node.up import ProcessCluster

        config = config_module.load(cluster_file(directory, hosts, options))
        write_cluster_certs(config, days=2)
        server_args = ["--break", options.break_step] if options.break_step else []
        cluster = ProcessCluster(
            config, restart=False, on_host=hosts.command, server_args=server_args
        )
        log(f"jepsen: starting {len(config.nodes())} processes in {directory}")
        cluster.start()
        cluster.wait_ready(timeout_s=START_S)
        rng = random.Random(options.seed)
        schedule = plan_schedule(
            nemeses, options.time_limit_s, rng, options.fault_s, options.quiet_s,
            min(FIRST_FAULT_S, options.time_limit_s / 4),
        )
        from store.rpc.aio import new_event_loop

        loop = new_event_loop()
        try:
            outcome = loop.run_until_complete(
                _drive(options, config, cluster, hosts, schedule, rng, log)
            )
        finally:
            loop.close()
        results = _check_and_write(options, directory, outcome, schedule, hosts)
        return results
    finally:
        if cluster is not None:
            cluster.stop()
        if hosts is not None:
            hosts.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass
class Outcome:
    ops: list[Op]
    counts: dict[str, int]
    errors: dict[str, int]
    nemesis: dict[str, Any]
    recovered_s: dict[int, float | None]
    supervisor: list[str]
    started_at: float
    checked: dict[str, Any] = field(default_factory=dict)  # checkers run before the end


async def _drive(
    options: Options,
    config: Any,
    cluster: Any,
    hosts: Hosts,
    schedule: list[Planned],
    rng: random.Random,
    log: Callable[[str], None],
) -> Outcome:
    from store.client import Client
    from store.sim.workloads import Bank, ListAppend

    workload: Any = None
    tpcc: TpccRun | None = None
    if options.workload == "list-append":
        workload = ListAppend(
            random.Random(rng.random()), active_keys=10, clear_fraction=options.clear_fraction,
        )
    elif options.workload == "bank":
        workload = Bank(random.Random(rng.random()), accounts=BANK_ACCOUNTS, total=BANK_TOTAL)
        async with await Client.connect(config) as client:
            for key, balance in workload.initial_data().items():
                await client.put(key, balance)
    else:
        tpcc = TpccRun(config, options)
        await tpcc.load(log)

    history = History()
    record = history.record
    counts = {"ok": 0, "fail": 0, "info": 0}  # TPC-C's; list-append and bank: run_workload's
    errors: dict[str, int] = {}
    supervisor: list[str] = []
    started = history.started_ns
    stop_at = time.monotonic() + options.time_limit_s

    async def nemesis_loop() -> dict[str, Any]:
        nemesis = Nemesis(cluster, hosts, rng)
        done: list[dict[str, Any]] = []
        async with await Client.connect(config) as client:
            for planned in schedule:
                await asyncio.sleep(max(0.0, started / 1e9 + planned.at_s - time.monotonic()))
                _, leaders = await client.cluster_map()
                down = await _not_voting(client, config)
                f = "restart" if planned.kind == "restart" else f"start-{planned.kind}"
                record("invoke", f, planned.aim, "nemesis")
                what = nemesis.start(planned, leaders, down)
                begun = (time.monotonic_ns() - started) / 1e9
                record("info", f, what, "nemesis")
                log(f"jepsen: {begun:6.1f} s  {what}")
                await asyncio.sleep(planned.for_s)
                supervisor.extend(cluster.supervise())
                if planned.kind != "restart":
                    record("invoke", f"stop-{planned.kind}", None, "nemesis")
                    undone = nemesis.stop()
                    record("info", f"stop-{planned.kind}", undone, "nemesis")
                    log(f"jepsen: {(time.monotonic_ns() - started) / 1e9:6.1f} s  {undone}")
                done.append({**planned.edn(), "did": what, "began-s": round(begun, 3)})
            await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
            leftover = nemesis.stop()
            if leftover:
                record("info", "stop-all", leftover, "nemesis")
        supervisor.extend(cluster.supervise())
        return {
            "schedule": done, "counts": dict(nemesis.counts), "leader-kills": nemesis.leader_kills,
        }

    async def supervise_loop() -> None:
        while time.monotonic() < stop_at:
            await asyncio.sleep(0.5)
            supervisor.extend(cluster.supervise())

    nemesis_task = asyncio.create_task(nemesis_loop())
    supervise_task = asyncio.create_task(supervise_loop())
    if tpcc is not None:
        await tpcc.drive(record, counts, errors)
    else:
        result = await run_workload(
            lambda: Client.connect(config), workload, options.concurrency,
            options.time_limit_s, rate=options.rate, history=history,
        )
        counts, errors = result.counts, result.errors
    await supervise_task
    nemesis_report = await nemesis_task
    log(f"jepsen: load over ({counts}); waiting for every shard to commit again")
    recovered_s = await _wait_recovered(config, len(config.shards))  # units
    checked: dict[str, Any] = {}
    if tpcc is not None:
        checked = await tpcc.check_and_close(log)
    else:
        await _final_reads(config, workload, record, options)
    return Outcome(
        history.ops, counts, errors, nemesis_report, recovered_s, supervisor, started / 1e9, checked
    )


def _tpcc_script() -> Any:
    """bench/tpcc.py, the TPC-C command (its name is also its package's, bench/tpcc/, so it
    is loaded by path): its cluster session and replica checks."""
    import importlib.util

    name = "meridian_bench_tpcc"
    if name in sys.modules:
        return sys.modules[name]
    path = Path(__file__).resolve().parent.parent / "bench" / "tpcc.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class TpccRun:
    """``--workload tpcc``: bench/tpcc.py's load, terminals and twelve consistency
    conditions, checked on every replica set after the load and after the run. Each
    terminal transaction enters the history (``f`` its type, ``value`` its home warehouse)."""

    WAREHOUSES_PER_SHARD = 1

    def __init__(self, config: Any, options: Options) -> None:
        from bench.tpcc.schema import Layout, Scale

        self.config = config
        self.options = options
        # With workers a shard's units each hold warehouses (bench/tpcc/schema.py, Layout).
        self.layout = Layout(config.shard_count, config.workers)
        self.warehouses = list(range(1, self.layout.units * self.WAREHOUSES_PER_SHARD + 1))
        self.scale = Scale.shrunk(10.0)
        self.session: Any = None
        self.after_load: dict[str, Any] = {}

    async def load(self, log: Callable[[str], None]) -> None:
        from bench.tpcc import loader

        tpcc_bench = _tpcc_script()

        self.session = await tpcc_bench.connect_cluster(self.config, self.options.concurrency)
        rows = loader.initial_rows(
            self.warehouses, self.layout, self.scale, seed=self.options.seed,
            progress=False,
        )
        await self.session.load(rows, False)
        log(f"jepsen: loaded {len(self.warehouses)} TPC-C warehouses ({self.scale})")
        self.after_load, _ = await tpcc_bench.check_replicas(
            self.session, self.warehouses, self.scale, "after the load"
        )

    async def drive(
        self, record: Callable[..., None], counts: dict[str, int], errors: dict[str, int]
    ) -> None:
        from bench.tpcc.driver import Driver, DriverConfig
        from store.core.errors import MeridianError, OutcomeUnknown

        target = self.session.target
        processes = iter(range(1 << 30))

        class Recording:
            async def run_detailed(self, name: str, *args: Any, shard: int = 0) -> Any:
                process = next(processes)
                record("invoke", name, args[0] if args else None, process)
                try:
                    done = await target.run_detailed(name, *args, shard=shard)
                except OutcomeUnknown as exc:
                    counts["info"] += 1
                    errors["OutcomeUnknown"] = errors.get("OutcomeUnknown", 0) + 1
                    record("info", name, args[0] if args else None, process, error=error_name(exc))
                    raise
                except MeridianError as exc:
                    counts["fail"] += 1
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    record("fail", name, args[0] if args else None, process, error=error_name(exc))
                    raise
                counts["ok"] += 1
                record("ok", name, args[0] if args else None, process)
                return done

        config = DriverConfig(
            self.warehouses, self.layout, self.scale, self.options.concurrency,
            seed=self.options.seed, duration_s=self.options.time_limit_s, run_id="jepsen",
        )
        await Driver(Recording(), config).run()

    async def check_and_close(self, log: Callable[[str], None]) -> dict[str, Any]:
        tpcc_bench = _tpcc_script()
        try:
            after_run, catch_up = await tpcc_bench.check_replicas(
                self.session, self.warehouses, self.scale, "after the run"
            )
        finally:
            await self.session.close()
        replicas: dict[str, dict[str, Any]] = {}
        for when, reports in (("after-load", self.after_load), ("after-run", after_run)):
            for name, report in reports.items():
                entry = replicas.setdefault(name, {})
                entry[when] = {str(n): holds for n, holds in sorted(report.conditions.items())}
                if report.failures:
                    entry[f"{when}-failures"] = {
                        str(n): texts[:3] for n, texts in report.failures.items()
                    }
        valid = all(
            all(report.conditions.values()) and len(report.conditions) == 12
            for reports in (self.after_load, after_run) for report in reports.values()
        )
        return {"tpcc": {"valid?": valid, "replica-sets": replicas, "catch-up": catch_up}}


async def _not_voting(client: Any, config: Any) -> set[str]:
    """Shard replicas that do not vote now: rejoining, or not answering a status request."""
    from store.node.server import log_name

    statuses = await client.status(replicas=True)
    return {
        log_name(node) for node, status in zip(config.nodes(), statuses, strict=True)
        if node.role != "cm"
        and (status is None or status.get("rejoining") or status.get("voting") is False)
    }


async def _wait_recovered(config: Any, shards: int) -> dict[int, float | None]:
    """Seconds until each shard (each worker of one, with workers) committed a probe write
    after the faults ended (None: not within RECOVERY_S)."""
    from store.client import Client
    from store.core.errors import MeridianError

    began = time.monotonic()
    recovered: dict[int, float | None] = {}
    async with await Client.connect(config) as client:
        for shard in range(shards):
            recovered[shard] = None
            attempt = 0
            while time.monotonic() - began < RECOVERY_S:
                attempt += 1
                try:
                    await client.run_ops(
                        [["put", f"jepsen/probe/{shard}/{attempt}", attempt]], route=shard
                    )
                except MeridianError:
                    await asyncio.sleep(0.2)
                    continue
                recovered[shard] = round(time.monotonic() - began, 3)
                break
    return recovered


async def _final_reads(
    config: Any, workload: Any, record: Callable[..., None], options: Options
) -> None:
    """Reads every key the workload touched, once the cluster is whole again; each read
    enters the history (Jepsen's final generator)."""
    from store.client import Client
    from store.core.errors import MeridianError, OutcomeUnknown
    from store.sim.workloads import bank_key, list_append_key

    process = 10_000_000  # above every client process number
    deadline = time.monotonic() + RECOVERY_S
    async with await Client.connect(config) as client:
        if options.workload == "list-append":
            keys = range(workload.next_key)
            for k in keys:
                began = workload.begin()
                while time.monotonic() < deadline:
                    record("invoke", "txn", [["r", k, None]], process)
                    try:
                        (found,) = await client.run_ops([["get", list_append_key(k)]])
                    except OutcomeUnknown:
                        record("info", "txn", [["r", k, None]], process, error="outcome-unknown")
                        process += 1
                        continue
                    except MeridianError as exc:
                        record("fail", "txn", [["r", k, None]], process, error=error_name(exc))
                        continue
                    # A cleared key's read is a read of its clear's marker (the workload's).
                    reads = workload.reads_of(k, list(found or []), began)
                    if reads:
                        record("ok", "txn", reads, process, final=True)
                    else:
                        record("fail", "txn", [["r", k, None]], process, error="not-evidence")
                    break
        else:
            keys_read = [bank_key(a) for a in range(workload.accounts)]
            while time.monotonic() < deadline:
                record("invoke", "read", None, process)
                try:
                    balances = await client.run("bank_read", workload.accounts, route=keys_read[0])
                except MeridianError as exc:
                    record("fail", "read", None, process, error=error_name(exc))
                    process += 1
                    continue
                record("ok", "read", {int(a): b for a, b in balances.items()}, process, final=True)
                break


def _check_and_write(
    options: Options, directory: Path, outcome: Outcome, schedule: list[Planned], hosts: Hosts
) -> dict[str, Any]:
    from jepsen import checks, report

    ops = outcome.ops
    write_history(directory / "history.edn", ops)
    faults = report.faults_from_history(ops)
    if options.workload == "tpcc":
        checkers = dict(outcome.checked)
    else:
        checkers = checks.check(options.workload, ops, total=BANK_TOTAL)
    checkers["recovery"] = {
        "valid?": all(s is not None for s in outcome.recovered_s.values()),
        "seconds-to-commit-again": {str(k): v for k, v in outcome.recovered_s.items()},
    }
    crashes = [line for line in outcome.supervisor if "restarted" not in line]
    checkers["servers"] = {"valid?": not crashes, "unexpected-deaths": crashes}
    valid = all(result["valid?"] for result in checkers.values())
    anomaly_types = sorted({t for r in checkers.values() for t in r.get("anomaly-types", [])})
    anomalies = {
        t: r["anomalies"][t] for r in checkers.values() for t in r.get("anomaly-types", [])
    }
    client_ops = outcome.counts
    total = sum(client_ops.values())
    results: dict[str, Any] = {
        "valid?": valid,
        "test": options.test_name(),
        "workload": options.workload,
        "seed": options.seed,
        "time-limit-s": options.time_limit_s,
        "concurrency": options.concurrency,
        "break": options.break_step,
        "hosts": "netns" if hosts.partitions else f"loopback ({hosts.reason})",
        "ops": {**client_ops, "completed-share": round((total - client_ops["info"]) / total, 4) if total else 0.0},
        "errors": outcome.errors,
        "anomaly-types": anomaly_types,
        "anomalies": anomalies,
        "checkers": checkers,
        "nemesis": {
            **outcome.nemesis,
            "faults": [fault.as_map() for fault in faults],
            "planned": [p.edn() for p in schedule],
        },
        "dir": str(directory),
    }
    report.write_results(directory / "results.edn", results)
    title = f"{options.test_name()} (seed {options.seed})"
    report.plot_latency(ops, faults, directory / "latency-raw.png", title)
    report.plot_rate(ops, faults, directory / "rate.png", title)
    report.write_timeline(ops, faults, directory / "timeline.html", title)
    return results


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jepsen", description="Jepsen tests of Meridian's real processes."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a test (docs/jepsen.md)")
    run.add_argument("--workload", choices=WORKLOADS, default="list-append")
    run.add_argument(
        "--nemesis", default="kill,partition",
        help=f"comma-separated faults, of {','.join(KINDS)}; 'none' for none",
    )
    run.add_argument("--time-limit", type=float, default=60.0, help="seconds of load")
    run.add_argument("--concurrency", type=int, default=16, help="client count")
    run.add_argument("--rate", type=float, help="operations per second in all (default: as fast as they go)")
    run.add_argument("--test-count", type=int, default=1, help="tests to run, seeds S, S+1, ...")
    run.add_argument("--seed", type=int, default=0, help="the nemesis's and workload's seed")
    run.add_argument("--shards", type=int, default=2)
    run.add_argument(
        "--workers", type=int, default=1,
        help="worker processes per shard leader (each its own unit, stream and followers)",
    )
    run.add_argument("--leader-timeout-ms", type=int, default=1000)
    run.add_argument("--fault-s", type=float, default=4.0, help="how long a fault lasts")
    run.add_argument("--quiet-s", type=float, default=4.0, help="calm between faults")
    run.add_argument("--runs-dir", type=Path, default=Path("runs/jepsen"))
    run.add_argument("--name", help="the test's name (default: workload and nemeses)")
    run.add_argument(
        "--no-netns", action="store_true", help="run every region on loopback (no partitions)"
    )
    run.add_argument(
        "--clear-fraction", type=float, default=0.0,
        help="list-append: share of operations that clear a range of retired keys",
    )
    from store.core.settings import BREAKABLE_STEPS

    run.add_argument(
        "--break", dest="break_step", choices=list(BREAKABLE_STEPS),
        help="servers with one safety step switched off: the run must come out invalid",
    )
    return parser


def options_from(args: argparse.Namespace) -> Options:
    nemeses = tuple(n for n in args.nemesis.split(",") if n and n != "none")
    unknown = [n for n in nemeses if n not in KINDS]
    if unknown:
        raise SystemExit(f"jepsen: no such nemesis {unknown}; choose from {','.join(KINDS)}")
    if args.time_limit <= 0 or args.concurrency <= 0 or args.shards <= 0 or args.workers <= 0:
        raise SystemExit(
            "jepsen: --time-limit, --concurrency, --shards and --workers must be positive"
        )
    if args.rate is not None and args.rate <= 0:
        raise SystemExit("jepsen: --rate must be positive")
    return Options(
        workload=args.workload, nemeses=nemeses, time_limit_s=args.time_limit,
        concurrency=args.concurrency, rate=args.rate, seed=args.seed,
        break_step=args.break_step, shards=args.shards, workers=args.workers,
        leader_timeout_ms=args.leader_timeout_ms, fault_s=args.fault_s, quiet_s=args.quiet_s,
        runs_dir=args.runs_dir, netns=not args.no_netns, name=args.name,
        clear_fraction=args.clear_fraction,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    options = options_from(args)
    if args.test_count > 1:
        # Each test in a process of its own: a test moves its process into its client
        # namespace, which the next test's hosts replace.
        worst = 0
        for k in range(args.test_count):
            command = [sys.executable, "-m", "jepsen", *_argv_for(argv, options.seed + k)]
            worst = max(worst, subprocess.run(command, check=False).returncode)
        return worst
    from jepsen import report

    try:
        results = run_test(options)
    except Interrupted as exc:
        print(f"jepsen: interrupted ({exc}); everything the test made is removed", file=sys.stderr)
        return 130
    except Exception as exc:
        traceback.print_exc()
        print(f"jepsen: the test could not run: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(report.summary(results))
    return 0 if results["valid?"] else 1


def _argv_for(argv: Sequence[str] | None, seed: int) -> list[str]:
    """This run's arguments for one test of a ``--test-count`` series."""
    args = list(sys.argv[1:] if argv is None else argv)
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in ("--test-count", "--seed"):
            skip = True
            continue
        if arg.startswith(("--test-count=", "--seed=")):
            continue
        out.append(arg)
    return [*out, "--seed", str(seed)]

