"""Certification throughput of the pure core on the microbenchmark's mix (issues 2 and 12).

The shard leaders of ``store.core`` run in this one process, connected by an in-memory FIFO
queue (no simulator, no sockets, no replication): what is measured is the protocol's own
Python cost. The mix is ``bench/micro.py``'s: 50% read-only and 50% read-modify-write
transactions of 4 distinct keys, each access going to another shard than the transaction's
home shard with probability 5%, keys uniform over ``--keys-per-shard`` keys per shard, all
preloaded. 64 transactions are kept in flight (the micro benchmark's 64 clients). Only
committed transactions count; an aborted one is counted apart, not retried.

Each leader is handed the messages queued for it as a batch and its ``ready()`` carried out
once per batch, as the server host does. The mix runs twice: with message objects handed
over as they are (``mix_txn_per_s``), and with every message (submissions, outcomes,
messages between leaders) encoded and decoded by the wire codec as the servers and the
simulator do (``mix_codec_txn_per_s``).
``python_calls_per_rmw_txn`` is the number of Python function calls (``cProfile``) one
single-shard 4-key read-modify-write transaction costs, from submission to the COMMITTED
outcome, without the codec; ``python_calls_per_mix_txn`` the same over the mix. Both are
counted on the core's source (a child process with MERIDIAN_PURE_PYTHON=1 when the core
runs compiled, ``compiled_core``: cProfile sees a compiled function as one call). A plain-dict
baseline applies the same reads and writes in the same run, for scale.

Not measured: the RPC core, sockets, processes, the SDK, replication.

    python bench/core.py [--transactions N] [--shards S] [--json]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import random
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import store
from store.core.errors import Status
from store.core.partition import Partitioner
from store.core.replica import ShardLeader
from store.core.txn import Procedures
from store.node import server as server_module

try:
    from store.core.oplist import OPS_PROCEDURE
except ImportError:  # pragma: no cover - the code before the compiled core
    from store.core.txn import OPS_PROCEDURE  # type: ignore[attr-defined, no-redef, unused-ignore]

# The protocol module (issue 12); before it, the codec and messages lived in the core. The
# test is on the files of the ``store`` imported, since an editable install of a newer
# checkout would otherwise lend its ``store.protocol`` to an older one run back to back.
if (Path(store.__file__).parent / "protocol").is_dir():
    from store.protocol import codec
    from store.protocol.messages import Outcome, Submit
else:  # pragma: no cover - the code before issue 12, for back-to-back runs
    from store.core.messages import (  # type: ignore[import-not-found, no-redef, unused-ignore]
        Outcome,
        Submit,
    )

    from store.core import codec  # type: ignore[attr-defined, no-redef, unused-ignore]

KEYS_PER_SHARD = 10_000
WINDOW = 64  # transactions in flight, as the micro benchmark's 64 clients
REMOTE = 0.05  # chance one access goes to another shard than the home shard

Txn = tuple[int, bool, list[str]]  # (home shard, read-only, 4 keys)


def make_keys(partitioner: Partitioner, shards: int, per_shard: int) -> list[list[str]]:
    """The keys of ``store.node.generator.micro_keys`` (what bench/micro.py preloads and the
    in-server generators use), written out here so that this script still runs against
    code from before that module, for back-to-back figures; tests/bench/test_micro.py
    checks the two agree."""
    by_shard: list[list[str]] = [[] for _ in range(shards)]
    i = 0
    while min(len(keys) for keys in by_shard) < per_shard:
        key = f"micro/{i:09d}"
        shard = partitioner.shard_of(key)
        if len(by_shard[shard]) < per_shard:
            by_shard[shard].append(key)
        i += 1
    return by_shard


def make_mix(
    rng: random.Random, keys: list[list[str]], count: int, remote: float = REMOTE,
    read_only_fraction: float = 0.5,
) -> list[Txn]:
    """The micro benchmark's transactions: 4 distinct keys, each remote with ``remote``."""
    shards = len(keys)
    txns: list[Txn] = []
    for _ in range(count):
        home = rng.randrange(shards)
        chosen: list[str] = []
        while len(chosen) < 4:
            shard = home
            if shards > 1 and rng.random() < remote:
                shard = (home + rng.randrange(1, shards)) % shards
            key = keys[shard][rng.randrange(len(keys[shard]))]
            if key not in chosen:
                chosen.append(key)
        txns.append((home, rng.random() < read_only_fraction, chosen))
    return txns


def ops_of(read_only: bool, keys: list[str]) -> list[list[Any]]:
    if read_only:
        return [["get", key] for key in keys]
    return [["increment", key, 1] for key in keys]


class CoreRun:
    """Shard leaders of one region in this process, keys preloaded, a FIFO between them."""

    def __init__(self, shards: int, keys: list[list[str]], encode: bool) -> None:
        partitioner = Partitioner(shards)
        self.addresses = [f"leader/{s}" for s in range(shards)]
        self.leaders = {
            a: ShardLeader(s, self.addresses, partitioner, Procedures())
            for s, a in enumerate(self.addresses)
        }
        for shard, shard_keys in enumerate(keys):
            leader = self.leaders[self.addresses[shard]]
            for key in shard_keys:
                leader.preload(key, 0)
        # The collector as a server sets it (store.node.server): thresholds raised, and what
        # survived the load frozen.
        thresholds = getattr(server_module, "GC_THRESHOLDS", None)
        if thresholds is not None:
            gc.set_threshold(*thresholds)
        gc.collect()
        gc.freeze()
        self.encode = encode
        self.queue: deque[tuple[str, str, Any]] = deque()
        self.counts = {"committed": 0, "aborted": 0, "other": 0, "submits": 0}
        self.now = 0

    def wire(self, message: Any) -> Any:
        return codec.decode(codec.encode(message)) if self.encode else message

    def pump(self, leader: ShardLeader) -> None:
        counts = self.counts
        for dst, message in leader.ready().messages:
            message = self.wire(message)
            if isinstance(message, Outcome):
                if message.status == Status.COMMITTED:
                    counts["committed"] += 1
                elif message.status == Status.ABORTED:
                    counts["aborted"] += 1
                elif message.status != Status.CERTIFIED:
                    counts["other"] += 1
            else:
                self.queue.append((leader.address, dst, message))

    def run(self, txns: list[Txn], window: int = WINDOW) -> float:
        """Runs ``txns`` to their end; returns the seconds it took."""
        counts = self.counts
        leaders, addresses, queue = self.leaders, self.addresses, self.queue
        started = time.perf_counter()
        submitted = 0
        total = len(txns)
        first = counts["committed"] + counts["aborted"] + counts["other"]
        # As the server's host does, each leader is handed a whole batch of messages and its
        # ready() is carried out once after the batch, not after every message; the batch is
        # one step (ShardLeader.receive; the code before it had handle only).
        while counts["committed"] + counts["aborted"] + counts["other"] - first < total:
            done = counts["committed"] + counts["aborted"] + counts["other"] - first
            touched: dict[str, ShardLeader] = {}
            while submitted < total and submitted - done < window:
                home, read_only, keys = txns[submitted]
                submitted += 1
                counts["submits"] += 1
                leader = leaders[addresses[home]]
                submit = Submit("bench", counts["submits"], OPS_PROCEDURE, [ops_of(read_only, keys)], False)
                deliver(leader, self.now, "client", self.wire(submit))
                touched[leader.address] = leader
            for leader in touched.values():
                self.pump(leader)
            progressed = bool(queue) or bool(touched)
            while queue:
                batch, self.queue = queue, deque()
                queue = self.queue
                touched = {}
                for src, dst, message in batch:
                    leader = leaders[dst]
                    deliver(leader, self.now, src, message)
                    touched[dst] = leader
                for leader in touched.values():
                    self.pump(leader)
            if not progressed:  # nothing in flight moves without time: let timers run
                self.now += 100_000
                for leader in leaders.values():
                    leader.tick(self.now)
                    self.pump(leader)
        return time.perf_counter() - started


# A message into a leader's open step (ready() ends it), as the host hands a batch over.
deliver = ShardLeader.receive if hasattr(ShardLeader, "receive") else ShardLeader.handle


def run_mix(shards: int, keys: list[list[str]], txns: list[Txn], encode: bool) -> dict[str, float]:
    run = CoreRun(shards, keys, encode)
    elapsed = run.run(txns)
    counts = run.counts
    return {
        "txn_per_s": counts["committed"] / elapsed,
        "elapsed_s": elapsed,
        "committed": counts["committed"],
        "aborted": counts["aborted"],
        "other": counts["other"],
        "submits_per_txn": counts["submits"] / len(txns),
    }


def calls_per_txn(shards: int, keys: list[list[str]], txns: list[Txn]) -> float:
    """Python function calls per transaction, counted by cProfile over ``txns``."""
    run = CoreRun(shards, keys, encode=False)
    run.run(txns[: len(txns) // 10])  # warm up: first-time paths are not the steady state
    profiler = cProfile.Profile()
    profiler.enable()
    run.run(txns)
    profiler.disable()
    stats = pstats.Stats(profiler)
    return stats.total_calls / len(txns)  # type: ignore[attr-defined]


def run_baseline(shards: int, txns: list[Txn]) -> float:
    """The same reads and writes on plain dicts, one dict per shard."""
    partitioner = Partitioner(shards)
    stores: list[dict[str, int]] = [{} for _ in range(shards)]
    started = time.perf_counter()
    for _, read_only, keys in txns:
        for key in keys:
            store = stores[partitioner.shard_of(key)]
            if read_only:
                store.get(key, 0)
            else:
                store[key] = store.get(key, 0) + 1
    return len(txns) / (time.perf_counter() - started)


def core_compiled() -> bool:
    """Whether the core runs compiled here (docs/performance.md; False for code before it)."""
    import store.core

    return bool(getattr(store.core, "compiled", lambda: False)())


def call_counts(
    transactions: int, shards: int, keys_per_shard: int = KEYS_PER_SHARD, seed: int = 1
) -> tuple[float, float]:
    """Python function calls per single-shard read-modify-write and per mix transaction.
    cProfile sees a compiled function as one call, so with the compiled core they are
    counted in a child process that runs the core's source (MERIDIAN_PURE_PYTHON=1)."""
    if core_compiled():
        child = subprocess.run(
            [sys.executable, __file__, "--calls-only", "--transactions", str(transactions),
             "--shards", str(shards), "--keys-per-shard", str(keys_per_shard)],
            env={**os.environ, "MERIDIAN_PURE_PYTHON": "1"}, capture_output=True, text=True,
            check=True,
        )
        rmw_calls, mix_calls = json.loads(child.stdout)
        return rmw_calls, mix_calls
    rng = random.Random(seed)
    keys = make_keys(Partitioner(shards), shards, keys_per_shard)
    mix = make_mix(rng, keys, transactions)
    profiled = min(transactions, 5_000)
    rmw = make_mix(rng, keys, profiled, remote=0.0, read_only_fraction=0.0)
    return calls_per_txn(shards, keys, rmw), calls_per_txn(shards, keys, mix[:profiled])


def measure(transactions: int, shards: int, keys_per_shard: int = KEYS_PER_SHARD, seed: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    keys = make_keys(Partitioner(shards), shards, keys_per_shard)
    mix = make_mix(rng, keys, transactions)
    plain = run_mix(shards, keys, mix, encode=False)
    encoded = run_mix(shards, keys, mix, encode=True)
    baseline = run_baseline(shards, mix)
    rmw_calls, mix_calls = call_counts(transactions, shards, keys_per_shard, seed)
    return {
        "compiled_core": core_compiled(),
        "transactions": transactions,
        "shards": shards,
        "in_flight": WINDOW,
        "mix_txn_per_s": round(plain["txn_per_s"]),
        "mix_committed": plain["committed"],
        "mix_aborted": plain["aborted"],
        "mix_other_outcomes": plain["other"],
        "mix_codec_txn_per_s": round(encoded["txn_per_s"]),
        "codec_cost": round(1 - encoded["txn_per_s"] / plain["txn_per_s"], 3),
        "submits_per_txn": plain["submits_per_txn"],
        "python_calls_per_rmw_txn": round(rmw_calls, 1),
        "python_calls_per_mix_txn": round(mix_calls, 1),
        "dict_baseline_txn_per_s": round(baseline),
        "ratio_to_dict": round(plain["txn_per_s"] / baseline, 5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=20_000)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--keys-per-shard", type=int, default=KEYS_PER_SHARD)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--calls-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.calls_only:  # the child of call_counts
        print(json.dumps(call_counts(args.transactions, args.shards, args.keys_per_shard)))
        return
    result = measure(args.transactions, args.shards, args.keys_per_shard)
    if args.json:
        print(json.dumps(result))
        return
    build = "compiled" if result["compiled_core"] else "run from source"
    print(
        f"pure core ({build}), {args.shards} shards, {args.transactions} transactions of the micro mix "
        f"(50% read-only, 50% 4-key read-modify-write, 5% remote accesses), {WINDOW} in flight"
    )
    print(
        f"  committed {result['mix_txn_per_s']:>9,} txn/s   with the codec "
        f"{result['mix_codec_txn_per_s']:>9,} txn/s (codec {result['codec_cost']:.0%} of the time)"
    )
    print(
        f"  aborted {result['mix_aborted']}, other outcomes {result['mix_other_outcomes']}; "
        f"{result['submits_per_txn']} submissions per transaction"
    )
    print(
        f"  Python calls per single-shard read-modify-write transaction "
        f"{result['python_calls_per_rmw_txn']}, per mix transaction {result['python_calls_per_mix_txn']}"
    )
    print(f"  plain-dict baseline {result['dict_baseline_txn_per_s']:,} txn/s (ratio {result['ratio_to_dict']})")
    print("  not measured: the RPC core, sockets, processes, the SDK, replication")


if __name__ == "__main__":
    main()
