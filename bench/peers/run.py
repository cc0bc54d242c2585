"""Meridian, PostgreSQL and etcd measured side by side, on the same workload and the same
emulated wide-area round trips (issue 12, item 5). docs/peers.md says what each system does
and what is and is not measured.

    python bench/peers/run.py [--json] [--duration 30] [--rtt-ms 0 50] [--clients 64]
                              [--systems meridian,postgres,etcd]
                              [--meridian-modes commit,certified] [--meridian-shards 1]
                              [--meridian-set stream.batch_delay_awaited_ns=3000000]

Each system is started at each round trip, loaded, run and stopped (every process it
started, on Ctrl-C or error too); a peer that is not installed or does not start is
reported as such and the others go on. The report goes to ``runs/peers-<time>/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# Run as a script, this folder would come first on the path, and its etcd.py would stand for
# a package named etcd.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.peers import etcd, meridian, postgres  # noqa: E402
from bench.peers.common import RunResult, Workload, busy_ports, log  # noqa: E402
from bench.peers.report import write  # noqa: E402

SYSTEMS = ("meridian", "postgres", "etcd")
WAN_HOW = (
    "every connection between regions goes through `meridian wan-proxy` (a TCP proxy that "
    "delays each direction by RTT/2, jitter ±{jitter} ms when RTT > 0); regions are "
    "loopback addresses (us 127.0.0.1, eu 127.0.0.2, ap 127.0.0.3). Meridian: every "
    "replication stream between regions (cluster/geo3.toml's wan links). PostgreSQL: the "
    "standby's (eu) replication connection to the primary (us). etcd: every peer-to-peer "
    "connection (each member advertises a proxy port in front of its peer port). Clients "
    "run in us, next to Meridian's shard leaders, PostgreSQL's primary and etcd's leader."
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the report's JSON on stdout")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per run")
    parser.add_argument("--rtt-ms", type=float, nargs="+", default=[0.0, 50.0],
                        help="round trips between regions, one run of every system at each")
    parser.add_argument("--clients", type=int, default=64, help="closed-loop clients per run")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help="comma-separated, from: " + ", ".join(SYSTEMS))
    parser.add_argument("--keys", type=int, default=100_000, help="preloaded keys")
    parser.add_argument("--jitter-ms", type=float, default=None,
                        help="wan-proxy jitter when RTT > 0 (default: cluster/geo3.toml's)")
    parser.add_argument("--postgres-isolation", default="serializable",
                        choices=["serializable", "repeatable read", "read committed"])
    parser.add_argument("--base-port", type=int, default=7800,
                        help="etcd uses BASE..BASE+3, PostgreSQL BASE+10..BASE+12")
    parser.add_argument("--meridian-port-shift", type=int, default=0,
                        help="moves every port of cluster/geo3.toml (0: its own ports)")
    parser.add_argument("--meridian-no-fsync", action="store_true",
                        help="Meridian's servers write their logs without syncing them "
                        "(fsync = false), to see what its syncs cost")
    parser.add_argument("--meridian-modes", default=",".join(meridian.MODES),
                        help="comma-separated, from: commit (clients wait for the commit), "
                        "certified (clients go on at certification)")
    parser.add_argument("--meridian-shards", type=int, default=meridian.SHARDS_DEFAULT,
                        help="how many of cluster/geo3.toml's shards Meridian runs with "
                        f"(default {meridian.SHARDS_DEFAULT}, like PostgreSQL's one primary: "
                        "docs/peers.md)")
    parser.add_argument("--meridian-set", action="append", default=[], metavar="SECTION.NAME=VALUE",
                        help="a setting of Meridian's cluster file for these runs, e.g. "
                        "stream.batch_delay_awaited_ns=3000000 (repeatable; VALUE in TOML; the "
                        "report records it)")
    parser.add_argument("--out", type=Path, default=None,
                        help="report directory (default runs/peers-<YYYYmmdd-HHMMSS>)")
    parser.add_argument("--scratch", type=Path, default=None,
                        help="where data directories go (default: a temporary directory on "
                        "/dev/shm if there is one)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown or not args.systems:
        parser.error(f"--systems: unknown {unknown}; choose from {', '.join(SYSTEMS)}")
    args.meridian_modes = tuple(m.strip() for m in args.meridian_modes.split(",") if m.strip())
    if not args.meridian_modes or not set(args.meridian_modes) <= set(meridian.MODES):
        parser.error(f"--meridian-modes: choose from {', '.join(meridian.MODES)}")
    try:
        args.meridian_set = [meridian.parse_setting(text) for text in args.meridian_set]
    except ValueError as error:
        parser.error(f"--meridian-set: {error}")
    geo3_shards = len(meridian.geo3()["shards"])
    if not 1 <= args.meridian_shards <= geo3_shards:
        parser.error(f"--meridian-shards: 1 to {geo3_shards} (the shards of cluster/geo3.toml)")
    if args.clients < 1 or args.duration <= 0 or args.keys < 8 or min(args.rtt_ms) < 0:
        parser.error("--clients >= 1, --duration > 0, --keys >= 8, --rtt-ms >= 0")
    return args


def geo3_jitter_ms() -> float:
    return float(meridian.geo3().get("wan", {}).get("jitter_ms", 1.0))


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def scratch_root(requested: Path | None) -> Path:
    if requested is not None:
        requested.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="meridian-peers-", dir=requested))
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="meridian-peers-", dir=shm))
    return Path(tempfile.mkdtemp(prefix="meridian-peers-"))


def meridian_names(args: argparse.Namespace) -> list[str]:
    return [f"meridian-{mode}" for mode in args.meridian_modes]


def run_system(
    system: str, rtt: float, args: argparse.Namespace, workload: Workload, scratch: Path,
    logs: Path, jitter: float,
) -> list[RunResult]:
    """One system at one round trip; never raises for the system's own failure."""
    names = meridian_names(args) if system == "meridian" else [system]
    log_dir = logs / f"{system}-rtt{rtt:g}"
    try:
        if system == "meridian":
            return meridian.run(
                scratch, log_dir, workload, rtt, jitter, args.meridian_port_shift,
                fsync=not args.meridian_no_fsync, modes=args.meridian_modes,
                settings=args.meridian_set, shards=args.meridian_shards,
            )
        if system == "postgres":
            port = args.base_port + 10
            busy = busy_ports([("127.0.0.1", port), ("127.0.0.2", port), ("127.0.0.2", port + 1),
                               ("127.0.0.1", port + 2)])
            if busy and postgres.unavailable_reason() is None:
                raise RuntimeError(f"ports in use: {', '.join(busy)} (see --base-port)")
            return [postgres.run(scratch, log_dir, workload, rtt, jitter, port,
                                 args.postgres_isolation)]
        busy = busy_ports([(h, args.base_port + i) for _, _, h in etcd.MEMBERS for i in range(3)]
                          + [("127.0.0.1", args.base_port + 3)])
        if busy and etcd.unavailable_reason() is None:
            raise RuntimeError(f"ports in use: {', '.join(busy)} (see --base-port)")
        return [etcd.run(scratch, log_dir, workload, rtt, jitter, args.base_port)]
    except Exception as exc:
        detail = "".join(traceback.format_exception_only(exc)).strip()
        log(f"{system} at rtt {rtt:g} ms FAILED: {detail[-2000:]}")
        (log_dir).mkdir(parents=True, exist_ok=True)
        (log_dir / "failure.txt").write_text(traceback.format_exc())
        return [
            RunResult(name, rtt, status="failed",
                      reason=f"{detail.splitlines()[0][:300]} (logs: {log_dir})")
            for name in names
        ]


def system_info(system: str, args: argparse.Namespace) -> dict[str, Any]:
    if system == "meridian":
        return {"status": "available", "cluster": "cluster/geo3.toml",
                "shards": args.meridian_shards}
    module = postgres if system == "postgres" else etcd
    reason = module.unavailable_reason()
    if reason is not None:
        return {"status": "unavailable", "reason": reason}
    info: dict[str, Any] = {"status": "available", "version": module.version()}
    if system == "postgres":
        info["isolation"] = "(see --postgres-isolation; in each run's 'isolation')"
        info["durability"] = "synchronous_commit = on, synchronous_standby_names = 'standby1'"
        info["driver"] = "pgbench, -M prepared, two weighted custom scripts, --max-tries 0"
    else:
        info["driver"] = "aetcd (PyPI), asyncio gRPC, one channel shared by the clients"
    return info


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Ctrl-C and SIGTERM end the run through every finally block (each system stops what it
    # started); set explicitly, since a shell may start a background job with SIGINT ignored.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    jitter = geo3_jitter_ms() if args.jitter_ms is None else args.jitter_ms
    workload = Workload(keys=args.keys, clients=args.clients, duration_s=args.duration,
                        seed=args.seed)
    out_dir = args.out or REPO / "runs" / f"peers-{time.strftime('%Y%m%d-%H%M%S')}"
    out_dir.mkdir(parents=True, exist_ok=True)
    systems = {name: system_info(name, args) for name in args.systems}
    for name, info in systems.items():
        if info["status"] == "unavailable":
            log(f"{name} is UNAVAILABLE and is skipped: {info['reason']}")
    if "postgres" in systems:
        systems["postgres"]["isolation"] = args.postgres_isolation
    meta = {
        "generated": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": shlex.join([sys.executable, "bench/peers/run.py", *(argv or sys.argv[1:])]),
        "machine": {"cpus": os.cpu_count(), "loadavg_start": [round(x, 2) for x in os.getloadavg()]},
        "workload": workload.describe(),
        "wan": {"how": WAN_HOW.format(jitter=f"{jitter:g}"), "jitter_ms": jitter,
                "rtt_ms": args.rtt_ms},
    }
    results: list[RunResult] = []
    scratch = scratch_root(args.scratch)
    try:
        for rtt in args.rtt_ms:
            for system in args.systems:
                if systems[system]["status"] == "unavailable":
                    names = meridian_names(args) if system == "meridian" else [system]
                    results += [RunResult(n, rtt, status="unavailable",
                                          reason=systems[system]["reason"]) for n in names]
                    continue
                log(f"--- {system} at rtt {rtt:g} ms")
                load = round(os.getloadavg()[0], 2)
                for result in run_system(system, rtt, args, workload, scratch, out_dir / "logs", jitter):
                    result.extra["loadavg_1m_at_start"] = load  # other work on the machine
                    results.append(result)
                    summary = result.summary()
                    if result.status == "ok":
                        log(f"{result.system} rtt {rtt:g} ms: {summary['txn_per_s']:,.0f} txn/s, "
                            f"p50 {summary['p50_ms']} ms, p99 {summary['p99_ms']} ms, "
                            f"retries {result.retries}, errors {result.errors}")
    except KeyboardInterrupt:
        log("interrupted: every process started was stopped; writing what was measured")
        write(results, {**meta, "interrupted": True, "scratch": str(scratch)}, systems, out_dir)
        return 130
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    meta["scratch"] = str(scratch)
    report = write(results, meta, systems, out_dir)
    log(f"report: {out_dir / 'report.md'}")
    if args.json:
        print(json.dumps(report))
    else:
        print((out_dir / "report.md").read_text())
    failed = [r for r in results if r.status == "failed"]
    lost = [r for r in results if r.system == "meridian-certified" and r.status == "ok"
            and r.extra.get("not_committed")]
    for result in lost:
        log(f"meridian-certified at rtt {result.rtt_ms:g} ms: "
            f"{result.extra['not_committed']} certified transactions did NOT commit")
    return 1 if failed or lost else 0


if __name__ == "__main__":
    sys.exit(main())
