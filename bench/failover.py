"""A shard leader killed under load: how long the shard is down, what the healthy shards
keep doing, and what recovery rolls back (issue 10).

A 3-region cluster (every shard leader in ``us``, a follower of each in ``eu`` and ``ap``, a
configuration manager member in each region, replication through ``meridian wan-proxy`` at
``--rtt-ms``) runs Mako's microbenchmark mix (50% read-only, 50% read-modify-write
transactions of 4 keys; an access leaves the transaction's home shard with probability
``--remote``). Closed-loop clients are split evenly over the home shards and wait for each
transaction to commit. At ``--kill-at`` seconds the leader of shard 0 is SIGKILLed; with
``--second-kill-at`` the leader of shard 1 is killed later too.

Reported (``--json``):

* ``recovery_s``: from the kill to the first commit of a transaction on the failed shard
  that began after the kill (with a second kill, these figures are of the first; each
  kill's own ``recovery_s`` is in ``kills``);
* ``healthy_min_ratio``: the other shards' lowest one-second count of commits, from the kill
  until the failed shard is back, over their mean per second before the kill (a transaction
  counts for every shard it touched);
* ``rolled_back``: transactions rolled back by recovery (as the leaders count them;
  ``rolled_back_answers``: how many clients were told so);
* ``lost_committed``: increments a client was told COMMITTED that the final state does not
  hold (must be 0); ``epoch``: the cluster map's epoch at the end;
* ``plot``: a PNG timeline of commits per second per shard, kills marked.

The killed process is started again a second later, as ``meridian up`` does, and rejoins
as a follower. Not measured: how long that rejoin takes, failures of a follower or a
configuration manager member, and partitions (``python -m jepsen run`` injects those).

    python bench/failover.py [--duration 25] [--kill-at 10] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tqdm import tqdm  # noqa: E402

from store import config as config_module  # noqa: E402
from store.client import Client, MeridianError, OutcomeUnknown, RolledBack  # noqa: E402
from store.node.up import ProcessCluster  # noqa: E402
from store.rpc.aio import new_event_loop  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))
from micro import KeyChooser, preload  # noqa: E402

from store.node.generator import micro_keys  # noqa: E402

REGIONS = ("us", "eu", "ap")


def cluster_file(directory: Path, shards: int, rtt_ms: float, port: int, leader_timeout_ms: int) -> Path:
    lines = [
        "[cluster]", 'name = "failover-bench"', f'run_dir = "{directory / "run"}"',
        "[settings]", "peer_retry_ns = 200_000_000", "peer_attempts_max = 15",
        f"leader_timeout_ns = {leader_timeout_ms * 1_000_000}",
        "[client]", "timeout_s = 10.0",
        *(f'[[regions]]\nname = "{region}"' for region in REGIONS),
    ]
    for shard in range(shards):
        lines += [
            "[[shards]]", f'leader = "127.0.0.1:{port + shard}"', 'region = "us"',
            f'followers = [{{ region = "eu", address = "127.0.0.2:{port + shard}" }}, '
            f'{{ region = "ap", address = "127.0.0.3:{port + shard}" }}]',
        ]
    for number, region in enumerate(REGIONS, start=1):
        lines += ["[[cm]]", f'region = "{region}"', f'address = "127.0.0.{number}:{port + 50}"']
    lines += [
        "[wan]", f"rtt_ms = {rtt_ms}", "jitter_ms = 0.5", f"port_base = {port + 500}",
        f'control = "127.0.0.1:{port + 499}"',
    ]
    path = directory / "failover.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


async def leader_pid(client: Client, shard: int) -> int:
    """The process id of the shard's leader in the current cluster map."""
    await client.cluster_map()
    status = (await client.status())[shard]
    assert status is not None and status["role"] == "leader", status
    return int(status["pid"])


async def drive(config: Any, args: argparse.Namespace, quiet: bool) -> dict[str, Any]:
    shards = len(config.shards)
    client = await Client.connect(config, in_flight_max=max(256, args.clients * 4))
    admin = await Client.connect(config)
    try:
        keys = micro_keys(client.partitioner, shards, args.keys_per_shard)
        await preload(client, keys, quiet=True)
        rng = random.Random(args.seed)
        chooser = KeyChooser(keys, 0.0, rng)
        commits: list[tuple[float, float, frozenset[int]]] = []  # (began, committed, shards)
        acknowledged: dict[str, int] = {}
        unknown: dict[str, int] = {}
        errors: dict[str, int] = {}
        kills: list[tuple[float, int]] = []
        started = time.monotonic()
        stop_at = started + args.duration

        async def worker(home: int) -> None:
            while time.monotonic() < stop_at:
                chosen = [
                    chooser.pick(home if rng.random() >= args.remote else rng.randrange(shards))
                    for _ in range(4)
                ]
                writes = rng.random() >= 0.5
                ops = [["increment", k, 1] for k in chosen] if writes else [["get", k] for k in chosen]
                began = time.monotonic() - started
                try:
                    await client.run_ops(ops, route=home)
                except MeridianError as exc:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    if isinstance(exc, OutcomeUnknown) and writes:
                        for key in chosen:
                            unknown[key] = unknown.get(key, 0) + 1
                    continue
                touched = frozenset(client.partitioner.shard_of(k) for k in chosen)
                commits.append((began, time.monotonic() - started, touched))
                if writes:
                    for key in chosen:
                        acknowledged[key] = acknowledged.get(key, 0) + 1

        async def nemesis() -> None:
            for at, shard in ((args.kill_at, 0), (args.second_kill_at, 1)):
                if at is None:
                    continue
                pid = await leader_pid(admin, shard)
                await asyncio.sleep(max(0.0, started + at - time.monotonic()))
                os.kill(pid, signal.SIGKILL)
                kills.append((time.monotonic() - started, shard))

        with tqdm(total=int(args.duration), desc="failover", unit="s", disable=quiet, file=sys.stderr) as bar:

            async def progress() -> None:
                while time.monotonic() < stop_at:
                    await asyncio.sleep(1.0)
                    bar.update(1)
                    bar.set_postfix_str(f"{len(commits):,} committed")

            workers = [worker(i % shards) for i in range(args.clients)]
            await asyncio.gather(progress(), nemesis(), *workers)

        # The final state: every acknowledged increment must be there.
        epoch, _ = await admin.cluster_map()
        lost = 0
        for key in sorted(acknowledged):
            value = await admin.get(key)
            lost += max(0, acknowledged[key] - (value or 0))
            assert (value or 0) <= acknowledged[key] + unknown.get(key, 0), (key, value)
        statuses = await admin.status()
        rolled_back = sum(s["counters"].get("rolled_back", 0) for s in statuses if s is not None)
        return {
            "commits": commits, "kills": kills, "errors": errors, "epoch": epoch,
            "lost_committed": lost, "rolled_back": rolled_back,
            "rolled_back_answers": errors.get(RolledBack.__name__, 0),
        }
    finally:
        await client.close()
        await admin.close()


def per_second(commits: list[tuple[float, float, frozenset[int]]], shard: int, seconds: int) -> list[int]:
    counts = [0] * seconds
    for _, done, touched in commits:
        if shard in touched and int(done) < seconds:
            counts[int(done)] += 1
    return counts


def _recovery(commits: list[tuple[float, float, frozenset[int]]], kill_s: float, shard: int) -> float | None:
    """Seconds from a kill to the first commit on its shard of a transaction begun after it."""
    back = min((done for began, done, touched in commits if shard in touched and began > kill_s), default=None)
    return None if back is None else round(back - kill_s, 3)


def summarize(run: dict[str, Any], args: argparse.Namespace, shards: int) -> dict[str, Any]:
    commits = run["commits"]
    kill_s, failed = run["kills"][0]  # the figures below are of the first kill
    recovery_s = _recovery(commits, kill_s, failed)
    healthy = [s for s in range(shards) if s != failed]
    before = [(d, t) for _, d, t in commits if 1.0 <= d < kill_s]  # skip the first second
    span_before = max(kill_s - 1.0, 1e-9)
    end = kill_s + (recovery_s if recovery_s is not None else args.duration - kill_s)
    windows = max(1, math.ceil(end - kill_s))
    ratios = []
    for shard in healthy:
        mean = sum(1 for _, t in before if shard in t) / span_before
        for w in range(windows):
            lo = kill_s + w
            count = sum(1 for _, d, t in commits if shard in t and lo <= d < lo + 1.0)
            ratios.append(count / mean if mean else 0.0)
    return {
        "recovery_s": recovery_s,
        "healthy_min_ratio": round(min(ratios), 3) if ratios else None,
        "rolled_back": run["rolled_back"],
        "rolled_back_answers": run["rolled_back_answers"],
        "lost_committed": run["lost_committed"],
        "epoch": run["epoch"],
        "kills": [
            {"at_s": round(at, 3), "shard": shard, "recovery_s": _recovery(commits, at, shard)}
            for at, shard in run["kills"]
        ],
        "committed": len(commits),
        "errors": run["errors"],
        "leader_timeout_ms": args.leader_timeout_ms,
        "clients": args.clients,
        "shards": shards,
        "rtt_ms": args.rtt_ms,
        "not_measured": "how long the restarted process takes to rejoin; follower or CM failures; partitions",
    }


def plot(run: dict[str, Any], shards: int, args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seconds = math.ceil(args.duration)
    figure, axes = plt.subplots(figsize=(9, 4))
    for shard in range(shards):
        axes.plot(range(seconds), per_second(run["commits"], shard, seconds), label=f"shard {shard}")
    for at, shard in run["kills"]:
        axes.axvline(at, color="red", linestyle="--")
        axes.annotate(f"kill shard {shard} leader", (at, 0), rotation=90, va="bottom", ha="right", color="red")
    axes.set_xlabel("seconds")
    axes.set_ylabel("committed transactions per second")
    axes.set_title(f"Failover: {args.clients} clients, 3 regions, {args.rtt_ms:g} ms round trips")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16, help="closed-loop clients")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--duration", type=float, default=25.0, help="seconds of load")
    parser.add_argument("--kill-at", type=float, default=10.0, help="SIGKILL shard 0's leader then")
    parser.add_argument("--second-kill-at", type=float, help="SIGKILL shard 1's leader then too")
    parser.add_argument("--leader-timeout-ms", type=int, default=1000)
    parser.add_argument("--rtt-ms", type=float, default=50.0)
    parser.add_argument("--keys-per-shard", type=int, default=10_000)
    parser.add_argument("--remote", type=float, default=0.05)
    parser.add_argument("--base-port", type=int, default=7800)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "failover", help="where the plot goes")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.second_kill_at is not None and args.shards < 2:
        parser.error("--second-kill-at needs a second shard")
    quiet = args.json and not sys.stderr.isatty()
    with tempfile.TemporaryDirectory(prefix="meridian-failover-") as scratch:
        path = cluster_file(Path(scratch), args.shards, args.rtt_ms, args.base_port, args.leader_timeout_ms)
        config = config_module.load(path)
        cluster = ProcessCluster(config)
        cluster.start()
        try:
            cluster.wait_ready(timeout_s=60)
            loop = new_event_loop()
            try:
                run = loop.run_until_complete(drive(config, args, quiet))
            finally:
                loop.close()
        finally:
            cluster.stop()
    result = summarize(run, args, args.shards)
    args.out.mkdir(parents=True, exist_ok=True)
    png = args.out / "failover.png"
    plot(run, args.shards, args, png)
    result["plot"] = str(png)
    if args.json:
        print(json.dumps(result))
        return
    print(f"failover: {args.clients} clients, {args.shards} shards, 3 regions, rtt {args.rtt_ms:g} ms")
    for key in ("recovery_s", "healthy_min_ratio", "rolled_back", "rolled_back_answers",
                "lost_committed", "epoch", "committed", "errors", "plot"):
        print(f"  {key:20} {result[key]}")
    print(f"  not measured: {result['not_measured']}")


if __name__ == "__main__":
    main()
