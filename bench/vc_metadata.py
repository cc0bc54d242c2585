"""Bytes of dependency metadata per transaction against the number of shards (issue 5).

Runs, in the deterministic simulator, one region of S shard leaders under a uniform
cross-shard workload (each transaction reads two random keys and read-modify-writes two
more, anywhere in the cluster) and records, for every certified transaction, the size of
its vector clock as Meridian encodes it (``VectorClock.encode``: varints, absent shards
cost nothing):

* ``sparse``: the clock as certified — entries at or below the known vector watermark
  dropped (DESIGN.md §4);
* ``unsparse``: the same run with dropping switched off (``sparse_clocks=False``): every
  dependency's entry is kept, transitively, as a clock that only ever merges would;
* ``dense``: a Mako-style vector with one 8-byte counter per shard, for reference.

    python bench/vc_metadata.py [--shards 8 32 128 512] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from store.core.partition import Partitioner
from store.core.replica import ShardLeader
from store.core.settings import DEFAULT_SETTINGS
from store.core.txn import OPS_PROCEDURE, Procedures
from store.core.vclock import VectorClock
from store.sim.client import History, SimClient
from store.sim.host import ReplicaHost
from store.sim.loop import Simulator
from store.sim.network import MS, Network
from store.sim.workloads import Operation

KEYS_PER_SHARD = 8  # few keys per shard: dependencies spread quickly, the worst case


class UniformWorkload:
    def __init__(self, rng: random.Random, keys: list[str]) -> None:
        self.rng = rng
        self.keys = keys

    def next(self) -> Operation:
        chosen = self.rng.sample(self.keys, 4)
        ops = [["get", chosen[0]], ["get", chosen[1]], ["increment", chosen[2], 1],
               ["increment", chosen[3], 1]]
        return Operation(OPS_PROCEDURE, [ops], "txn", None, lambda result: result, chosen)


def measure(
    shards: int, seed: int, duration_ms: int, clients: int, sparse_clocks: bool
) -> dict[str, Any]:
    sim = Simulator(seed)
    network = Network(sim)
    partitioner = Partitioner(shards)
    leaders = [f"leader/{s}" for s in range(shards)]
    sizes: list[int] = []
    entries: list[int] = []

    def observe(txn_id: int, vc: VectorClock, full_vc: VectorClock, read_from: list[int]) -> None:
        sizes.append(len(vc.encode()))
        entries.append(len(vc))

    procedures = Procedures()
    for shard in range(shards):
        settings = DEFAULT_SETTINGS.with_overrides(sparse_clocks=sparse_clocks)
        replica = ShardLeader(shard, leaders, partitioner, procedures, settings, observer=observe)
        host = ReplicaHost(sim, network, replica)
        network.add(replica.address, host)
        host.start()
    keys = [f"k/{i}" for i in range(KEYS_PER_SHARD * shards)]
    workload = UniformWorkload(sim.rng, keys)
    history = History()
    for i in range(clients):
        SimClient(sim, network, history, i, clients, workload, partitioner, leaders,
                  duration_ms * MS).start()
    sim.run_until(duration_ms * MS)
    # Skip the warm-up: the first transactions depend on nothing.
    skip = len(sizes) // 5
    return {
        "transactions": len(sizes) - skip,
        "bytes": round(statistics.mean(sizes[skip:]), 2),
        "entries": round(statistics.mean(entries[skip:]), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[8, 32, 128, 512])
    parser.add_argument("--duration-ms", type=int, default=300, help="virtual time per run")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    for shards in args.shards:
        started = time.perf_counter()
        sparse = measure(shards, args.seed, args.duration_ms, args.clients, True)
        unsparse = measure(shards, args.seed, args.duration_ms, args.clients, False)
        row = {
            "shards": shards,
            "sparse_bytes": sparse["bytes"],
            "sparse_entries": sparse["entries"],
            "unsparse_bytes": unsparse["bytes"],
            "unsparse_entries": unsparse["entries"],
            "dense_bytes": 8 * shards,
            "transactions": sparse["transactions"],
            "wall_s": round(time.perf_counter() - started, 1),
        }
        rows.append(row)
        if not args.json:
            print(
                f"{shards:>4} shards: sparse {row['sparse_bytes']:>6.1f} B "
                f"({row['sparse_entries']:.1f} entries)  unsparse {row['unsparse_bytes']:>7.1f} B "
                f"({row['unsparse_entries']:.1f} entries)  dense {row['dense_bytes']:>5} B  "
                f"({row['transactions']} transactions)",
                flush=True,
            )
    if args.json:
        print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
