"""The microbenchmark on a 3-region cluster: what speculation buys across the wide area.

Two shards; every shard leader in region ``us``, a follower of each in ``eu`` and ``ap``;
replication between regions goes through ``meridian wan-proxy``. Four configurations are
run in one invocation with the same clients and workload (Mako's microbenchmark, as
``bench/micro.py``): round trip 0 ms, 50 ms, and 50 ms with speculation off (Mako's
"OCC+OR": participants keep locks and hide writes until commit, so certification itself
waits for replication), and 50 ms with fsync off.

Clients run closed loops as Mako's workers do: each issues its next transaction as soon as
the previous one is certified (``Client.run_pipelined``), and records the committed latency
when that answer arrives. A certified transaction is speculative: its COMMITTED answer
comes about a wide-area round trip later, and it may be rolled back instead (failure
recovery; no process fails in this benchmark). So two throughputs are reported, over the
same window of ``--duration`` seconds per configuration:

* ``certified_txn_per_s``: certifications answered within the window;
* ``committed_txn_per_s``: COMMITTED answers that arrived within the window (the answer is
  taken when its done callback runs, a loop step after it arrives).

With speculation off the two are the same answer. After the window the benchmark waits up
to ``--drain`` seconds for the commits of the window's certified transactions, and counts
per configuration (``runs.<name>``): ``certified``, ``committed`` (in the window),
``certified_not_committed_at_window_end``, of those ``committed_after_window``,
``rolled_back``, ``commit_errors`` (any other failure of the commit: ``OutcomeUnknown``,
``Unavailable``) and ``uncommitted_after_drain`` (no answer yet), with ``never_committed``
the sum of the last three; ``errors``: certification attempts that failed;
``certified_after_window``: certifications that arrived after the window (not counted).
Latency percentiles are of the window's certified transactions. Top-level keys:
``{certified,committed}_txn_per_s_{rtt0,rtt50,nospec_rtt50}``, ``wan_ratio_{committed,
certified}`` (rtt50 / rtt0), ``speculation_gain_{committed,certified}`` (rtt50 /
nospec_rtt50) and the rtt50 run's latency percentiles.

Durability: every run but the last syncs each acceptor's votes to its write-ahead log before
the messages that follow them (``[cluster] fsync = true``, the default); ``rtt50_nofsync``
is the rtt50 run with ``fsync = false``. ``fsync_ratio_{certified,committed}`` is rtt50
over rtt50_nofsync, and ``committed_p50_over_rtt`` the rtt50 committed p50 over the 50 ms
round trip: what durability costs.

Not measured: the load generator shares the machine with the cluster, and one client
process (12 coroutines by default) drives every run.

    python bench/geo.py [--clients 12] [--duration 15] [--drain 15] [--json]
    python bench/geo.py --fsync-pairs 4 [--duration 20]   # fsync on/off only, ABBA pairs
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
from store.client import Client, MeridianError, RolledBack  # noqa: E402
from store.node.up import ProcessCluster  # noqa: E402
from store.rpc.aio import new_event_loop  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))
from micro import KeyChooser, preload  # noqa: E402

from store.node.generator import micro_keys  # noqa: E402

# (name, round trip ms, speculation, fsync): every run of one invocation, in order. Every
# server syncs its acceptor's votes before it answers (the default) except in the last run.
CONFIGURATIONS = (
    ("rtt0", 0.0, True, True),
    ("rtt50", 50.0, True, True),
    ("nospec_rtt50", 50.0, False, True),
    ("rtt50_nofsync", 50.0, True, False),
)


def cluster_file(
    directory: Path, rtt_ms: float, speculation: bool, port: int, fsync: bool = True
) -> Path:
    lines = [
        "[cluster]", 'name = "geo-bench"', f'run_dir = "{directory / "run"}"',
        f"fsync = {'true' if fsync else 'false'}",
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
    path = directory / f"geo-{int(rtt_ms)}-{int(speculation)}-{int(fsync)}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


async def drive(config: Any, args: argparse.Namespace, label: str, quiet: bool) -> dict[str, Any]:
    client = await Client.connect(config, in_flight_max=max(256, args.clients * 4))
    try:
        keys = micro_keys(client.partitioner, 2, args.keys_per_shard)
        await preload(client, keys, quiet=True)
        rng = random.Random(args.seed)
        chooser = KeyChooser(keys, 0.0, rng)
        certified = HdrHistogram(1, 60_000_000, 3)
        committed = HdrHistogram(1, 60_000_000, 3)
        counts = dict.fromkeys(
            ("certified", "committed", "committed_after_window", "rolled_back", "commit_errors",
             "errors", "certified_after_window"),
            0,
        )
        commits: set[asyncio.Future[Any]] = set()
        late: set[asyncio.Future[Any]] = set()  # commits of certifications after the window
        started = time.monotonic()
        stop_at = started + args.duration

        def on_commit(future: asyncio.Future[Any]) -> None:
            # Runs when the COMMITTED answer (or the failure) has arrived, a loop step later.
            commits.discard(future)
            if future.cancelled():
                counts["commit_errors"] += 1
                return
            error = future.exception()
            if isinstance(error, RolledBack):
                counts["rolled_back"] += 1
                return
            if error is not None:
                counts["commit_errors"] += 1
                return
            result = future.result()
            committed.record_value(max(1, int(result.committed_s * 1e6)))
            counts["committed" if time.monotonic() <= stop_at else "committed_after_window"] += 1

        def forget(future: asyncio.Future[Any]) -> None:
            late.discard(future)
            if not future.cancelled():
                future.exception()  # retrieved: not reported as never retrieved

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
                if time.monotonic() > stop_at:
                    # Certified after the window: neither it nor its commit is counted.
                    counts["certified_after_window"] += 1
                    late.add(commit)
                    commit.add_done_callback(forget)
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
                    bar.set_postfix_str(
                        f"{counts['certified']:,} certified, {counts['committed']:,} committed"
                    )

            await asyncio.gather(progress(), *(worker() for _ in range(args.clients)))
        window_s = stop_at - started
        # Let the window's certified transactions finish (their commits count apart).
        if commits or late:
            await asyncio.wait(list(commits | late), timeout=args.drain)
        await asyncio.sleep(0)  # the done callbacks of the last commits
        pending_after_drain = len(commits)
        never = counts["rolled_back"] + counts["commit_errors"] + pending_after_drain
        return {
            "certified_txn_per_s": round(counts["certified"] / window_s, 1),
            "committed_txn_per_s": round(counts["committed"] / window_s, 1),
            "certified": counts["certified"],
            "committed": counts["committed"],
            "certified_not_committed_at_window_end": counts["certified"] - counts["committed"],
            "committed_after_window": counts["committed_after_window"],
            "rolled_back": counts["rolled_back"],
            "commit_errors": counts["commit_errors"],
            "uncommitted_after_drain": pending_after_drain,
            "never_committed": never,
            "errors": counts["errors"],
            "certified_after_window": counts["certified_after_window"],
            "certified_p50_ms": round(certified.get_value_at_percentile(50) / 1000, 3),
            "committed_p50_ms": round(committed.get_value_at_percentile(50) / 1000, 3),
            "committed_p99_ms": round(committed.get_value_at_percentile(99) / 1000, 3),
        }
    finally:
        await client.close()


def run_configuration(
    scratch: Path, rtt_ms: float, speculation: bool, fsync: bool, port: int,
    args: argparse.Namespace, quiet: bool,
) -> dict[str, Any]:
    label = (
        f"rtt {rtt_ms:g} ms" + ("" if speculation else ", no speculation")
        + ("" if fsync else ", no fsync")
    )
    config = config_module.load(cluster_file(scratch, rtt_ms, speculation, port, fsync))
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


def fsync_pairs(args: argparse.Namespace, quiet: bool) -> None:
    """``--fsync-pairs N``: what durability costs, measured as like with like. Each pair runs
    rtt50 with fsync on and off back to back, in ABBA order over the pairs (on-off, off-on,
    ...) so that drift over the invocation (page cache, the machine's other load) falls on
    both sides alike; the result is the median of the pairs' ratios."""
    import statistics

    pairs = []
    with tempfile.TemporaryDirectory(prefix="meridian-geo-") as scratch:
        for index in range(args.fsync_pairs):
            order = (True, False) if index % 2 == 0 else (False, True)
            pair: dict[bool, dict[str, Any]] = {}
            for turn, fsync in enumerate(order):
                port = args.base_port + 1000 * (2 * index + turn) % 20_000
                pair[fsync] = run_configuration(
                    Path(scratch), 50.0, True, fsync, port, args, quiet
                )
            on, off = pair[True], pair[False]
            pairs.append({
                "fsync_ratio_certified": round(
                    on["certified_txn_per_s"] / max(off["certified_txn_per_s"], 1e-9), 3
                ),
                "fsync_ratio_committed": round(
                    on["committed_txn_per_s"] / max(off["committed_txn_per_s"], 1e-9), 3
                ),
                "committed_p50_over_rtt": round(on["committed_p50_ms"] / 50.0, 3),
                "certified_txn_per_s": on["certified_txn_per_s"],
                "certified_txn_per_s_nofsync": off["certified_txn_per_s"],
                "committed_p50_ms": on["committed_p50_ms"],
                "committed_p50_ms_nofsync": off["committed_p50_ms"],
            })
    result = {
        "clients": args.clients,
        "duration_s": args.duration,
        "pairs": pairs,
        **{
            f"median_{key}": statistics.median(p[key] for p in pairs)
            for key in ("fsync_ratio_certified", "fsync_ratio_committed", "committed_p50_over_rtt")
        },
    }
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"fsync on / off at 50 ms, {len(pairs)} pairs back to back, {args.clients} clients, "
        f"{args.duration:g} s window per run"
    )
    for number, pair in enumerate(pairs):
        print(
            f"  pair {number}: certified {pair['certified_txn_per_s']:,.0f}/s vs "
            f"{pair['certified_txn_per_s_nofsync']:,.0f}/s (ratio {pair['fsync_ratio_certified']}),"
            f" committed ratio {pair['fsync_ratio_committed']}, committed p50 "
            f"{pair['committed_p50_ms']:.1f} ms ({pair['committed_p50_over_rtt']} x the round trip)"
        )
    print(
        f"  median ratio: certified {result['median_fsync_ratio_certified']}, committed "
        f"{result['median_fsync_ratio_committed']}; committed p50 "
        f"{result['median_committed_p50_over_rtt']} x the round trip"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=12, help="closed-loop clients, every run")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per configuration")
    parser.add_argument("--keys-per-shard", type=int, default=10_000)
    parser.add_argument("--remote", type=float, default=0.05)
    parser.add_argument("--base-port", type=int, default=7600)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--drain", type=float, default=15.0,
        help="seconds to wait after the window for the window's commits (counted apart)",
    )
    parser.add_argument(
        "--fsync-pairs", type=int, default=0, metavar="N",
        help="only the fsync comparison: N pairs of rtt50 with fsync on and off, back to back "
        "(ABBA order), the median of the pairs' ratios",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    quiet = args.json and not sys.stderr.isatty()
    if args.fsync_pairs:
        fsync_pairs(args, quiet)
        return
    with tempfile.TemporaryDirectory(prefix="meridian-geo-") as scratch:
        runs = {}
        for index, (name, rtt, speculation, fsync) in enumerate(CONFIGURATIONS):
            runs[name] = run_configuration(
                Path(scratch), rtt, speculation, fsync, args.base_port + 1000 * index, args, quiet
            )
    rtt0, rtt50, nospec = runs["rtt0"], runs["rtt50"], runs["nospec_rtt50"]
    nofsync = runs["rtt50_nofsync"]

    def ratio(a: float, b: float, digits: int) -> float:
        return round(a / max(b, 1e-9), digits)

    result = {
        "clients": args.clients,
        "duration_s": args.duration,
        "shards": 2,
        "regions": 3,
        "certified_txn_per_s_rtt0": rtt0["certified_txn_per_s"],
        "committed_txn_per_s_rtt0": rtt0["committed_txn_per_s"],
        "certified_txn_per_s_rtt50": rtt50["certified_txn_per_s"],
        "committed_txn_per_s_rtt50": rtt50["committed_txn_per_s"],
        "certified_txn_per_s_nospec_rtt50": nospec["certified_txn_per_s"],
        "committed_txn_per_s_nospec_rtt50": nospec["committed_txn_per_s"],
        "wan_ratio_committed": ratio(rtt50["committed_txn_per_s"], rtt0["committed_txn_per_s"], 3),
        "wan_ratio_certified": ratio(rtt50["certified_txn_per_s"], rtt0["certified_txn_per_s"], 3),
        "speculation_gain_committed": ratio(
            rtt50["committed_txn_per_s"], nospec["committed_txn_per_s"], 2
        ),
        "speculation_gain_certified": ratio(
            rtt50["certified_txn_per_s"], nospec["certified_txn_per_s"], 2
        ),
        "certified_txn_per_s_rtt50_nofsync": nofsync["certified_txn_per_s"],
        "committed_txn_per_s_rtt50_nofsync": nofsync["committed_txn_per_s"],
        "fsync_ratio_certified": ratio(
            rtt50["certified_txn_per_s"], nofsync["certified_txn_per_s"], 3
        ),
        "fsync_ratio_committed": ratio(
            rtt50["committed_txn_per_s"], nofsync["committed_txn_per_s"], 3
        ),
        "committed_p50_over_rtt": ratio(rtt50["committed_p50_ms"], 50.0, 3),
        "committed_p50_ms_nofsync": nofsync["committed_p50_ms"],
        "committed_p50_ms": rtt50["committed_p50_ms"],
        "committed_p99_ms": rtt50["committed_p99_ms"],
        "certified_p50_ms": rtt50["certified_p50_ms"],
        "runs": runs,
    }
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"geo microbenchmark: 2 shards, 3 regions, {args.clients} closed-loop clients per run "
        f"(next transaction at certification), {args.duration:g} s window per run"
    )
    print(
        "  certified/s: certifications answered in the window (speculative: may still roll "
        "back); committed/s: COMMITTED answers arrived in the window"
    )
    for name, run in runs.items():
        print(
            f"  {name:13} certified {run['certified_txn_per_s']:>8,.0f}/s  committed "
            f"{run['committed_txn_per_s']:>8,.0f}/s  certified p50 {run['certified_p50_ms']:.1f} ms"
            f"  committed p50 {run['committed_p50_ms']:.1f} ms p99 {run['committed_p99_ms']:.1f} ms"
        )
        print(
            f"  {'':13} not committed at window end {run['certified_not_committed_at_window_end']:,}"
            f" (committed later {run['committed_after_window']:,}, rolled back "
            f"{run['rolled_back']}, commit errors {run['commit_errors']}, no answer "
            f"{run['uncommitted_after_drain']}); certification errors {run['errors']}"
        )
    print(
        f"  fsync on / off at 50 ms: certified {result['fsync_ratio_certified']}, committed "
        f"{result['fsync_ratio_committed']}; committed p50 {result['committed_p50_ms']:.1f} ms "
        f"= {result['committed_p50_over_rtt']} x the round trip (no fsync: "
        f"{result['committed_p50_ms_nofsync']:.1f} ms)"
    )
    print(
        f"  committed: wan_ratio {result['wan_ratio_committed']}  speculation_gain "
        f"{result['speculation_gain_committed']}   (certified: wan_ratio "
        f"{result['wan_ratio_certified']}  speculation_gain {result['speculation_gain_certified']})"
    )

if __name__ == "__main__":
    main()
