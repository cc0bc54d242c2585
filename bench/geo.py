"""The microbenchmark on a 3-region cluster: what speculation buys across the wide area.

Two shards; every shard leader in region ``us``, a follower of each in ``eu`` and ``ap``;
replication between regions goes through ``meridian wan-proxy``. Three configurations are
run in one invocation with the same clients and workload (Mako's microbenchmark, as
``bench/micro.py``): round trip 0 ms, 50 ms, and 50 ms with speculation off (Mako's
"OCC+OR": participants keep locks and hide writes until commit, so certification itself
waits for replication).

Clients run closed loops as Mako's workers do: each issues its next transaction as soon as
the previous one is certified (``Client.run_pipelined``), and records the committed latency
when that answer arrives.

    python bench/geo.py [--clients 12] [--duration 15] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hdrh.histogram import HdrHistogram  # noqa: E402
from tqdm import tqdm  # noqa: E402

from store import config as config_module  # noqa: E402
from store.client import Client, MeridianError  # noqa: E402
from store.node.up import ProcessCluster  # noqa: E402
from store.rpc.aio import new_event_loop  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))
from micro import KeyChooser, keys_per_shard, preload  # noqa: E402


def cluster_file(directory: Path, rtt_ms: float, speculation: bool, port: int) -> Path:
    lines = [
        "[cluster]", 'name = "geo-bench"', f'run_dir = "{directory / "run"}"',
        "[settings]", "peer_retry_ns = 200_000_000", "peer_attempts_max = 15",
        f"speculation = {'true' if speculation else 'false'}",
        "[client]", "timeout_s = 10.0",
        '[[regions]]\nname = "us"', '[[regions]]\nname = "eu"', '[[regions]]\nname = "ap"',
    ]
    for shard in range(2):
        lines += [
            "[[shards]]",
            f'leader = "127.0.0.1:{port + shard}"',
            'region = "us"',
            f'followers = [{{ region = "eu", address = "127.0.0.2:{port + shard}" }}, '
            f'{{ region = "ap", address = "127.0.0.3:{port + shard}" }}]',
        ]
    lines += [
        "[wan]", f"rtt_ms = {rtt_ms}", "jitter_ms = 0.5", f"port_base = {port + 500}",
        f'control = "127.0.0.1:{port + 499}"',
    ]
    path = directory / f"geo-{int(rtt_ms)}-{int(speculation)}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


async def drive(config: Any, args: argparse.Namespace, label: str, quiet: bool) -> dict[str, Any]:
    client = await Client.connect(config, in_flight_max=max(256, args.clients * 4))
    try:
        keys = keys_per_shard(client.partitioner, 2, args.keys_per_shard)
        await preload(client, keys, quiet=True)
        rng = random.Random(args.seed)
        chooser = KeyChooser(keys, 0.0, rng)
        certified = HdrHistogram(1, 60_000_000, 3)
        committed = HdrHistogram(1, 60_000_000, 3)
        counts = {"certified": 0, "committed": 0, "errors": 0, "commit_errors": 0}
        commits: set[asyncio.Future[Any]] = set()
        started = time.monotonic()
        stop_at = started + args.duration

        def on_commit(future: asyncio.Future[Any]) -> None:
            commits.discard(future)
            if future.cancelled() or future.exception() is not None:
                counts["commit_errors"] += 1
                return
            result = future.result()
            committed.record_value(max(1, int(result.committed_s * 1e6)))
            counts["committed"] += 1

        async def worker() -> None:
            while time.monotonic() < stop_at:
                home = rng.randrange(2)
                chosen = [
                    chooser.pick(home if rng.random() >= args.remote else 1 - home)
                    for _ in range(4)
                ]
                if rng.random() < 0.5:
                    ops = [["get", key] for key in chosen]
                else:
                    ops = [["increment", key, 1] for key in chosen]
                try:
                    result, commit = await client.run_pipelined("", ops, route=home)
                except MeridianError:
                    counts["errors"] += 1
                    continue
                certified.record_value(max(1, int(result.certified_s * 1e6)))
                counts["certified"] += 1
                commits.add(commit)
                commit.add_done_callback(on_commit)

        with tqdm(total=int(args.duration), desc=label, unit="s", disable=quiet, file=sys.stderr) as bar:

            async def progress() -> None:
                while time.monotonic() < stop_at:
                    await asyncio.sleep(1.0)
                    bar.update(1)
                    bar.set_postfix_str(f"{counts['certified']:,} certified")

            await asyncio.gather(progress(), *(worker() for _ in range(args.clients)))
        elapsed = time.monotonic() - started
        if commits:
            await asyncio.wait(list(commits), timeout=15)
        return {
            "txn_per_s": round(counts["certified"] / elapsed, 1),
            "certified_p50_ms": round(certified.get_value_at_percentile(50) / 1000, 3),
            "committed_p50_ms": round(committed.get_value_at_percentile(50) / 1000, 3),
            "committed_p99_ms": round(committed.get_value_at_percentile(99) / 1000, 3),
            "errors": counts["errors"] + counts["commit_errors"],
            "committed": counts["committed"],
        }
    finally:
        await client.close()


def run_configuration(
    scratch: Path, rtt_ms: float, speculation: bool, port: int, args: argparse.Namespace, quiet: bool
) -> dict[str, Any]:
    label = f"rtt {rtt_ms:g} ms" + ("" if speculation else ", no speculation")
    config = config_module.load(cluster_file(scratch, rtt_ms, speculation, port))
    cluster = ProcessCluster(config)
    cluster.start()
    try:
        cluster.wait_ready(timeout_s=60)
        loop = new_event_loop()
        try:
            return loop.run_until_complete(drive(config, args, label, quiet))
        finally:
            loop.close()
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=12, help="closed-loop clients, every run")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per configuration")
    parser.add_argument("--keys-per-shard", type=int, default=10_000)
    parser.add_argument("--remote", type=float, default=0.05)
    parser.add_argument("--base-port", type=int, default=7600)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    quiet = args.json and not sys.stderr.isatty()
    with tempfile.TemporaryDirectory(prefix="meridian-geo-") as scratch:
        runs = {}
        for index, (name, rtt, speculation) in enumerate(
            (("rtt0", 0.0, True), ("rtt50", 50.0, True), ("nospec_rtt50", 50.0, False))
        ):
            runs[name] = run_configuration(
                Path(scratch), rtt, speculation, args.base_port + 1000 * index, args, quiet
            )
    result = {
        "clients": args.clients,
        "duration_s": args.duration,
        "shards": 2,
        "regions": 3,
        "txn_per_s_rtt0": runs["rtt0"]["txn_per_s"],
        "txn_per_s_rtt50": runs["rtt50"]["txn_per_s"],
        "wan_ratio": round(runs["rtt50"]["txn_per_s"] / max(runs["rtt0"]["txn_per_s"], 1e-9), 3),
        "txn_per_s_nospec_rtt50": runs["nospec_rtt50"]["txn_per_s"],
        "speculation_gain": round(
            runs["rtt50"]["txn_per_s"] / max(runs["nospec_rtt50"]["txn_per_s"], 1e-9), 2
        ),
        "committed_p50_ms": runs["rtt50"]["committed_p50_ms"],
        "committed_p99_ms": runs["rtt50"]["committed_p99_ms"],
        "certified_p50_ms": runs["rtt50"]["certified_p50_ms"],
        "runs": runs,
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"geo microbenchmark: 2 shards, 3 regions, {args.clients} closed-loop clients per run")
    for name, run in runs.items():
        print(
            f"  {name:13} {run['txn_per_s']:>8,.0f} txn/s  certified p50 {run['certified_p50_ms']:.1f} ms"
            f"  committed p50 {run['committed_p50_ms']:.1f} ms p99 {run['committed_p99_ms']:.1f} ms"
            f"  errors {run['errors']}"
        )
    print(f"  wan_ratio {result['wan_ratio']}  speculation_gain {result['speculation_gain']}")


if __name__ == "__main__":
    main()
