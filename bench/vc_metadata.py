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

from collections.abc import Mapping

from store.client.protocol import ClientSettings
from store.config import MERIDIAN_RPC_SETTINGS
from store.core.coordinator import Certification
from store.core.partition import Partitioner
from store.core.settings import DEFAULT_SETTINGS
from store.core.txn import OPS_PROCEDURE, Procedures
from store.core.vclock import VectorClock
from store.protocol.messages import Write
from store.sim.client import History, SdkProcess, WorkloadClient
from store.sim.cluster import SimCluster
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
    sizes: list[int] = []
    entries: list[int] = []

    class Probe:
        def certified(self, certification: Certification) -> None:
            sizes.append(len(certification.vc.encode()))
            entries.append(len(certification.vc))

        def installed(
            self, shard: int, txn_id: int, writes: list[Write], vc: VectorClock,
            overwritten: list[int],
        ) -> None:
            pass

        def rolled_back(self, address: str, txn_id: int) -> None:
            pass

        def watermark(self, address: str, vw: Mapping[int, int]) -> None:
            pass

    settings = DEFAULT_SETTINGS.with_overrides(sparse_clocks=sparse_clocks)
    # Every leader may talk to every other one: sessions for all of them.
    rpc_settings = MERIDIAN_RPC_SETTINGS.replace(
        sessions_max=2 * shards + clients + 16,
        server_credits_max=(2 * shards + clients + 16) * MERIDIAN_RPC_SETTINGS.session_credits,
    )
    cluster = SimCluster(
        sim, network, shards, Procedures(), partitioner=partitioner, settings=settings,
        probe=Probe(), rpc_settings=rpc_settings,
    )
    cluster.start()
    keys = [f"k/{i}" for i in range(KEYS_PER_SHARD * shards)]
    workload = UniformWorkload(sim.rng, keys)
    history = History()
    for i in range(clients):
        process = SdkProcess(
            sim, network, f"client/{i}", cluster.regions[0], cluster.leader_addresses,
            partitioner, ClientSettings(), rpc_settings,
        )
        WorkloadClient(process, history, i, clients, workload, duration_ms * MS).start()
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
