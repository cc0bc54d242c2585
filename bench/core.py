"""Certification throughput of the pure core, next to a plain-dict baseline (issue 2).

The shard leaders of ``store.core`` run in this one process, connected by an in-memory
FIFO queue (no simulator, no sockets): what is measured is the protocol's own Python cost.
Each transaction reads and writes 4 keys (read-modify-write); the single-shard mix keeps
all 4 keys on one shard, the cross-shard mix puts 30% of transactions on two shards. The
baseline applies the same reads and writes to plain dicts in the same run; the ratio says
what certification costs relative to doing the work with no concurrency control at all.

Each mix runs twice: with message objects handed over as they are, and with every message
(submissions, outcomes, messages between leaders) encoded and decoded by the wire codec
(``store/protocol/codec.py``), as the servers and the simulator do; ``codec_cost`` is the share
of the time the codec takes. Not measured: the RPC core, sockets, replication.

    python bench/core.py [--transactions N] [--shards S] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from store.core.errors import Status
from store.core.partition import Partitioner
from store.core.replica import ShardLeader
from store.core.txn import OPS_PROCEDURE, Procedures
from store.protocol import codec
from store.protocol.messages import Outcome, Submit

KEYS_PER_SHARD = 10_000


def make_keys(partitioner: Partitioner, shards: int) -> list[list[str]]:
    by_shard: list[list[str]] = [[] for _ in range(shards)]
    i = 0
    while min(len(keys) for keys in by_shard) < KEYS_PER_SHARD:
        key = f"k/{i}"
        by_shard[partitioner.shard_of(key)].append(key)
        i += 1
    return by_shard


def make_transactions(
    rng: random.Random, keys: list[list[str]], count: int, cross_fraction: float
) -> list[tuple[int, list[str]]]:
    """(home shard, 4 keys): all on the home shard, or 2 + 2 across two shards."""
    shards = len(keys)
    txns = []
    for _ in range(count):
        home = rng.randrange(shards)
        if shards > 1 and rng.random() < cross_fraction:
            other = (home + rng.randrange(1, shards)) % shards
            chosen = rng.sample(keys[home], 2) + rng.sample(keys[other], 2)
        else:
            chosen = rng.sample(keys[home], 4)
        txns.append((home, chosen))
    return txns


def run_core(
    shards: int, txns: list[tuple[int, list[str]]], window: int = 64, encode: bool = False
) -> dict[str, float]:
    partitioner = Partitioner(shards)
    addresses = [f"leader/{s}" for s in range(shards)]
    leaders = {a: ShardLeader(s, addresses, partitioner, Procedures()) for s, a in enumerate(addresses)}
    queue: deque = deque()
    done = {"committed": 0, "aborted": 0}
    now = 0

    def wire(message: Any) -> Any:
        return codec.decode(codec.encode(message)) if encode else message

    def pump(leader: ShardLeader) -> None:
        for dst, message in leader.ready().messages:
            message = wire(message)
            if isinstance(message, Outcome):
                if message.status == Status.COMMITTED:
                    done["committed"] += 1
                elif message.status != Status.CERTIFIED:
                    done["aborted"] += 1
            else:
                queue.append((leader.address, dst, message))

    started = time.perf_counter()
    submitted = 0
    total = len(txns)
    while done["committed"] + done["aborted"] < total:
        while submitted < total and submitted - done["committed"] - done["aborted"] < window:
            home, keys = txns[submitted]
            ops = [["increment", key, 1] for key in keys]
            submitted += 1
            leader = leaders[addresses[home]]
            leader.handle(now, "client", wire(Submit("bench", submitted, OPS_PROCEDURE, [ops], False)))
            pump(leader)
        while queue:
            src, dst, message = queue.popleft()
            leader = leaders[dst]
            leader.handle(now, src, message)
            pump(leader)
        now += 100_000
        for leader in leaders.values():
            leader.tick(now)
            pump(leader)
    elapsed = time.perf_counter() - started
    return {
        "txn_per_s": total / elapsed,
        "abort_rate": done["aborted"] / total,
    }


def run_baseline(shards: int, txns: list[tuple[int, list[str]]]) -> float:
    """The same reads and writes on plain dicts, one dict per shard."""
    partitioner = Partitioner(shards)
    stores: list[dict[str, int]] = [{} for _ in range(shards)]
    started = time.perf_counter()
    for _, keys in txns:
        for key in keys:
            store = stores[partitioner.shard_of(key)]
            store[key] = store.get(key, 0) + 1
    return len(txns) / (time.perf_counter() - started)


def measure(transactions: int, shards: int, seed: int = 1) -> dict[str, float]:
    rng = random.Random(seed)
    keys = make_keys(Partitioner(shards), shards)
    result: dict[str, float] = {"transactions": transactions, "shards": shards}
    for name, cross in (("single_shard", 0.0), ("cross_shard_30", 0.3)):
        txns = make_transactions(rng, keys, transactions, cross)
        core = run_core(shards, txns)
        encoded = run_core(shards, txns, encode=True)
        baseline = run_baseline(shards, txns)
        result[f"{name}_txn_per_s"] = round(core["txn_per_s"])
        result[f"{name}_abort_rate"] = round(core["abort_rate"], 4)
        result[f"{name}_codec_txn_per_s"] = round(encoded["txn_per_s"])
        result[f"{name}_codec_cost"] = round(1 - encoded["txn_per_s"] / core["txn_per_s"], 3)
        result[f"{name}_baseline_txn_per_s"] = round(baseline)
        result[f"{name}_ratio"] = round(core["txn_per_s"] / baseline, 5)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=20_000)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.transactions, args.shards)
    if args.json:
        print(json.dumps(result))
        return
    print(f"pure-core certification, {args.shards} shards, {args.transactions} 4-key RMW transactions")
    for name, label in (("single_shard", "single-shard"), ("cross_shard_30", "30% cross-shard")):
        print(
            f"  {label:16} core {result[f'{name}_txn_per_s']:>9,.0f} txn/s   "
            f"dict baseline {result[f'{name}_baseline_txn_per_s']:>11,.0f} txn/s   "
            f"ratio {result[f'{name}_ratio']:.4f}   aborts {result[f'{name}_abort_rate']:.2%}"
        )
        print(
            f"  {'':16} with the codec {result[f'{name}_codec_txn_per_s']:>9,.0f} txn/s   "
            f"the codec's share of the time {result[f'{name}_codec_cost']:.0%}"
        )
    print("  not measured: the RPC core, sockets, replication")


if __name__ == "__main__":
    main()
