"""Bytes of dependency metadata on the wire per certified transaction, against the number of
shards, in one region and in three (issue 5; issue 12 item 4).

Runs, in the deterministic simulator (``store/sim``: the servers' own host, RPC core and
codecs, every message crossing the simulated network as the bytes production sends), S
shard leaders under a uniform cross-shard workload (each transaction reads two random keys
and read-modify-writes two more, anywhere in the cluster; 8 keys per shard, so dependencies
spread quickly: the worst case), clients in the leaders' region, in two topologies:

* ``1r``: one region, leaders only (no replication stream);
* ``3r``: three regions, a follower of every shard in each of the two others, 50 ms round
  trips between regions, configuration manager members (as ``meridian sim --regions 3``).

and two clock policies:

* ``sparse``: as certified, entries at or below the coordinator's vector watermark dropped
  (DESIGN.md §4); the dropped entries travel to participants as ``InstallRequest.durable``,
  which is counted;
* ``unsparse``: the same run with dropping switched off (``sparse_clocks=False``).

Clients are the simulator's (``store/sim/client.py``): closed loops, half of the calls
waiting for COMMITTED, the others also asking for the CERTIFIED answer.

What is measured, over a window that skips the first fifth of each run (warm-up: the first
transactions depend on nothing) and divided by the transactions certified in that window.
Everything sent counts, including the messages of attempts that aborted and the peer
requests a coordinator sent again:

* **msgpack** (``store/protocol/codec.py``): every payload a server process hands its RPC
  endpoint (``enqueue_request``: peer requests such as ``InstallRequest``,
  ``ValidateRequest``; ``enqueue_response``: ``Outcome`` to clients, ``LockReply``,
  ``ReadReply``, ...) is decoded and encoded again with every vector clock in it replaced by
  an empty one; the clocks' share is (bytes as sent) - (bytes with empty clocks). A clock
  costs its msgpack array ``[shard, counter, ...]``.
* **protobuf** (``store/proto/convert.py``): every ``ReplicationBatch`` a shard leader or
  follower puts on the stream between regions is parsed and serialized again with the
  dependency clocks emptied: each transaction record's clock (``record[2]`` of the msgpack
  record in ``Entry.records``; entries carry no batch clock of their own). Counted on every
  link: the leader's stream to each of its two followers carries every record, so a
  record's clock counts twice. 0 in one region.

JSON keys (``--json`` prints ``{"rows": [...]}``, one row per shard count and topology):

* ``shards``, ``regions``;
* ``{sparse,unsparse}_msgpack_clock_bytes``: the clocks' share of the server msgpack
  messages, bytes per certified transaction; ``..._msgpack_bytes``: the whole of those
  messages, watermark gossip and heartbeats included (context); ``..._msgpack_clocks``:
  clock fields sent per transaction (empty ones included); ``..._msgpack_bytes_per_clock``:
  the clocks' bytes per clock field, the size of a clock apart from how many messages carry
  one (with workers a uniform transaction has more participants, each message carrying its
  clocks); ``..._msgpack_clock_bytes_by_field``: the share by ``Message.field``, each
  field emptied alone (each clock is an element of its own msgpack array, so the fields
  add up to the total);
* ``{sparse,unsparse}_stream_clock_bytes``: the dependency clocks' share of the replication
  batches (the records' clocks), bytes per certified transaction; ``..._stream_bytes``: the
  whole batches of the shard streams (context);
* ``{sparse,unsparse}_watermark_bytes``: NOT dependency metadata, shown for context: the
  vector watermarks sent per transaction (``Entry.vw`` on the stream, ``Gossip`` messages,
  ``SnapshotReply.vw``), measured the same way, and ``..._watermark_bytes_by_field``.
  Gossip is sent on a timer whatever the load, so this per-transaction figure falls as
  throughput rises;
* ``{sparse,unsparse}_entries``: mean entries of the clock a transaction is certified with
  (``Certification.vc``);
* ``dense_bytes_per_clock``: reference only, a Mako-style vector of one 8-byte counter per
  shard: the size of ONE such clock, not a per-transaction wire figure (multiply by
  ``..._msgpack_clocks`` for what dense clocks in the same fields would weigh);
* ``transactions``: certified in the sparse run's window; ``wall_s``.

Counters start at 2^20 (``COUNTER_START``): a counter's msgpack size depends on its
magnitude, and from 0 a run's bytes per entry would depend on its throughput.

Not measured: the clients' requests (``Submit`` carries no clock); the payloads a request
handler returns synchronously (error outcomes with empty clocks, empty acknowledgements of
one-way messages); RPC packet headers and the RPC core's retransmissions of packets; gRPC
and HTTP/2 framing on the stream; the configuration manager's own stream; crashes,
failovers and state transfer (none happen in these runs). Messages of transactions
certified just before the window are counted in it and those of the last ones are not:
equal in a steady state.

    python bench/vc_metadata.py [--shards 8 32 128 512] [--shards-3r 8 32 128] [--regions 1 3]
        [--duration-ms 300] [--duration-ms-3r 2000] [--clients 32] [--seed 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgpack

import store.core
from store import wire
from store.client.protocol import ClientSettings
from store.config import MERIDIAN_RPC_SETTINGS
from store.core.coordinator import Certification
from store.core.errors import InvalidRequest
from store.core.oplist import OPS_PROCEDURE
from store.core.partition import Partitioner, WorkerPartitioner
from store.core.settings import DEFAULT_SETTINGS
from store.core.txn import Procedures
from store.core.vclock import EMPTY, VectorClock
from store.proto import replication_pb2 as pb
from store.protocol import codec
from store.protocol.messages import Gossip, Message, Write, field_names
from store.sim.client import History, SdkProcess, WorkloadClient
from store.sim.cluster import REGIONS, SimCluster
from store.sim.loop import Simulator
from store.sim.network import MS, Network
from store.sim.workloads import Operation

KEYS_PER_SHARD = 8  # few keys per shard: dependencies spread quickly, the worst case
# Where every shard's counter starts (as if 2^20 counters had been drawn: a cluster that has
# run for a while). msgpack spends 1 byte on a counter below 128, 3 below 2^16, 5 below 2^32
# (9 from epoch 1 on: counters of epoch e start at e << 40): from a cold start, a run's
# bytes per entry would depend on how many transactions it managed (a slower run has smaller
# counters), which is not the metadata's size.
COUNTER_START = 1 << 20
WAN_RTT_MS = 50.0
# Vector watermarks, not dependency clocks: counted apart (``watermark_bytes``).
WATERMARK_FIELDS = frozenset({"Gossip.watermarks", "SnapshotReply.vw"})

_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack
GOSSIP_TAG = codec.encode(Gossip(0, {}))[1]


class UniformWorkload:
    def __init__(self, rng: random.Random, keys: list[str]) -> None:
        self.rng = rng
        self.keys = keys

    def next(self) -> Operation:
        chosen = self.rng.sample(self.keys, 4)
        ops = [["get", chosen[0]], ["get", chosen[1]], ["increment", chosen[2], 1],
               ["increment", chosen[3], 1]]
        return Operation(OPS_PROCEDURE, [ops], "txn", None, lambda result: result, chosen)


# ---- the clocks' share of a message --------------------------------------------------------


def _without_clocks(value: Any) -> tuple[Any, int]:
    """``value`` with every vector clock in it (nested in lists and tuples too) replaced by
    an empty one, and how many clocks there were."""
    if isinstance(value, VectorClock):
        return EMPTY, 1
    if isinstance(value, list | tuple):
        count = 0
        out = []
        for item in value:
            stripped, found = _without_clocks(item)
            count += found
            out.append(stripped)
        return (out if isinstance(value, list) else tuple(out)), count
    return value, 0


def clock_fields(message: Message) -> dict[str, tuple[Any, int]]:
    """The fields of ``message`` that hold vector clocks (or a Gossip's watermarks), by
    ``Type.field``: (the field's value with those clocks emptied, how many clocks)."""
    kind = type(message).__name__
    found: dict[str, tuple[Any, int]] = {}
    for name in field_names(message):
        value = getattr(message, name)
        if isinstance(message, Gossip) and name == "watermarks":
            found[f"{kind}.{name}"] = ({}, 1)
            continue
        stripped, count = _without_clocks(value)
        if count:
            found[f"{kind}.{name}"] = (stripped, count)
    return found


def _with_fields(message: Message, values: Mapping[str, Any]) -> Message:
    """A copy of ``message`` with the fields named in ``values`` replaced (built by its
    constructor, whose parameters are its fields: a compiled message has no other way)."""
    fields = {name: getattr(message, name) for name in field_names(message)}
    clone: Message = type(message)(**(fields | dict(values)))
    return clone


def clock_share(data: bytes) -> tuple[int, dict[str, int], int]:
    """Of one msgpack message as sent: its dependency clocks' share (its bytes minus the
    bytes of the same message with every dependency clock empty), the share of each field
    emptied alone (watermark fields included), and how many dependency clocks it holds."""
    message = codec.decode(data)
    fields = clock_fields(message)
    by_field = {
        label: len(data) - len(codec.encode(_with_fields(message, {label.split(".")[1]: value})))
        for label, (value, _) in fields.items()
    }
    dependency = {
        label.split(".")[1]: value
        for label, (value, _) in fields.items() if label not in WATERMARK_FIELDS
    }
    share = len(data) - len(codec.encode(_with_fields(message, dependency))) if dependency else 0
    clocks = sum(count for label, (_, count) in fields.items() if label not in WATERMARK_FIELDS)
    return share, by_field, clocks


# ---- counting what servers send ------------------------------------------------------------


class WireMeter:
    """Counts what the server processes send while ``active``: bytes, and the clocks' share."""

    def __init__(self) -> None:
        self.active = False
        self.certified = 0
        self.msgpack_bytes = 0
        self.msgpack_clock_bytes = 0
        self.msgpack_clocks = 0
        self.by_field: Counter[str] = Counter()
        self.stream_bytes = 0
        self.stream_record_clocks = 0
        self.stream_vw = 0
        self.undecodable = 0

    # msgpack, at the RPC endpoint of a server process

    def payload(self, payload: Any) -> None:
        if not self.active or not payload:
            return
        data = bytes(payload)
        self.msgpack_bytes += len(data)
        if data[0] == 0x93 and data[1] == GOSSIP_TAG:
            # [15, shard, watermarks]: a Gossip is all watermark (context, not dependency
            # metadata); the strict decoder's check of every pair would double the run time.
            tag, shard, _ = msgpack.unpackb(data)
            self.by_field["Gossip.watermarks"] += len(data) - len(_packb([tag, shard, []]))
            return
        try:
            share, by_field, clocks = clock_share(data)
        except InvalidRequest:
            self.undecodable += 1
            return
        self.msgpack_clock_bytes += share
        self.msgpack_clocks += clocks
        self.by_field.update(by_field)

    def peer_batch(self, payload: Any) -> None:
        """A PEER_MANY request or response: each message measured as if alone, the array's
        framing counted as bytes without clocks."""
        if not self.active or not payload:
            return
        items = codec.decode_batch(bytes(payload))
        self.msgpack_bytes += len(payload) - sum(len(item) for item in items)
        for item in items:
            self.payload(item)

    def wrap_endpoint(self, rpc: Any) -> None:
        if store.core.compiled():
            raise RuntimeError("the meter needs the source build: MERIDIAN_PURE_PYTHON=1")
        enqueue_request = rpc.enqueue_request
        enqueue_response = rpc.enqueue_response

        def request(session: Any, req_type: int, payload: Any, cont: Any = None) -> Any:
            (self.peer_batch if req_type == wire.PEER_MANY else self.payload)(payload)
            return enqueue_request(session, req_type, payload, cont)

        def response(handle: Any, payload: Any) -> None:
            (self.peer_batch if handle.req_type == wire.PEER_MANY else self.payload)(payload)
            enqueue_response(handle, payload)

        rpc.enqueue_request = request
        rpc.enqueue_response = response

    # protobuf, on the stream between regions

    def batch(self, data: bytes) -> None:
        if not self.active:
            return
        batch = pb.ReplicationBatch()
        batch.ParseFromString(data)
        entries: list[Any] = []
        for message in batch.messages:
            which = message.WhichOneof("body")
            if which == "accept":
                entries.append(message.accept.entry)
            elif which == "promise":
                entries.extend(item.entry for item in message.promise.accepted)
            elif which == "chosen":
                entries.extend(message.chosen.entries)
        full = len(data)
        self.stream_bytes += full
        if not entries:
            return
        for entry in entries:
            records = [_record_without_clock(record) for record in entry.records]
            del entry.records[:]
            entry.records.extend(records)
        without_clocks = batch.ByteSize()
        for entry in entries:
            del entry.vw[:]
        self.stream_record_clocks += full - without_clocks
        self.stream_vw += without_clocks - batch.ByteSize()

    def wrap_stream(self, network: Network, sources: set[str]) -> None:
        send_stream = network.send_stream

        def send(src: str, dst: str, data: bytes) -> None:
            if src in sources:
                self.batch(data)
            send_stream(src, dst, data)

        network.send_stream = send  # type: ignore[method-assign]

    # per certified transaction

    def per_txn(self) -> dict[str, Any]:
        n = max(self.certified, 1)

        def per(value: float) -> float:
            return round(value / n, 2)

        dependency = {k: v for k, v in self.by_field.items() if k not in WATERMARK_FIELDS}
        watermark = sum(v for k, v in self.by_field.items() if k in WATERMARK_FIELDS)
        return {
            "msgpack_clock_bytes": per(self.msgpack_clock_bytes),
            "msgpack_bytes": per(self.msgpack_bytes),
            "msgpack_clocks": per(self.msgpack_clocks),
            "msgpack_bytes_per_clock": round(
                self.msgpack_clock_bytes / max(self.msgpack_clocks, 1), 2
            ),
            "msgpack_clock_bytes_by_field": {k: per(v) for k, v in sorted(dependency.items())},
            "stream_clock_bytes": per(self.stream_record_clocks),
            "stream_bytes": per(self.stream_bytes),
            "watermark_bytes": per(watermark + self.stream_vw),
            "watermark_bytes_by_field": {
                **{k: per(v) for k, v in sorted(self.by_field.items()) if k in WATERMARK_FIELDS},
                "Entry.vw": per(self.stream_vw),
            },
        }


def _record_without_clock(record: bytes) -> bytes:
    """A transaction record (msgpack ``[txn_id, writes, clock]``) with an empty clock."""
    value = msgpack.unpackb(record, raw=False, strict_map_key=False)
    assert isinstance(value, list) and len(value) == 3 and isinstance(value[2], list), value
    value[2] = []
    packed: bytes = _packb(value)
    return packed


# ---- one run -------------------------------------------------------------------------------


def measure(
    shards: int, regions: int, seed: int, duration_ms: int, clients: int, sparse_clocks: bool,
    workers: int = 1,
) -> dict[str, Any]:
    sim = Simulator(seed)
    network = Network(sim)
    partitioner: Partitioner = Partitioner(shards)
    if workers > 1:  # a unit per worker; clocks keep one entry per shard
        partitioner = WorkerPartitioner(partitioner, workers)
    units = partitioner.shard_count
    meter = WireMeter()
    entries: list[int] = []

    class Probe:
        def certified(self, certification: Certification) -> None:
            if meter.active:
                meter.certified += 1
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

        def drew(self, clock: int, unit: int, counter: int) -> None:
            pass

    settings = DEFAULT_SETTINGS.with_overrides(sparse_clocks=sparse_clocks)
    # Every leader may talk to every other one, every replica to every CM member.
    sessions = (regions + 1) * units + clients + 16
    rpc_settings = MERIDIAN_RPC_SETTINGS.replace(
        sessions_max=sessions,
        server_credits_max=sessions * MERIDIAN_RPC_SETTINGS.session_credits,
    )
    cluster = SimCluster(
        sim, network, units, Procedures(), partitioner=partitioner, settings=settings,
        regions=REGIONS[:regions], wan_rtt_ms=WAN_RTT_MS, probe=Probe(),
        rpc_settings=rpc_settings,
    )
    for server in cluster.servers:
        meter.wrap_endpoint(server.rpc)
    cm = set(cluster.cm_members)
    meter.wrap_stream(network, {s.address for s in cluster.servers if s.address not in cm})
    for leader in cluster.leaders:
        leader.watermark.raise_floor(COUNTER_START)
    cluster.start()
    keys = [f"k/{i}" for i in range(KEYS_PER_SHARD * shards)]
    workload = UniformWorkload(sim.rng, keys)
    history = History()
    for i in range(clients):
        process = SdkProcess(
            sim, network, f"client/{i}", cluster.regions[0], cluster.leader_addresses,
            partitioner, ClientSettings(), rpc_settings, cm_members=cluster.cm_members,
        )
        WorkloadClient(process, history, i, clients, workload, duration_ms * MS).start()
    sim.run_until(duration_ms * MS // 5)
    meter.active = True
    sim.run_until(duration_ms * MS)
    meter.active = False
    problems = [address for address, _, _ in cluster.fatal]
    if problems or meter.undecodable:
        raise RuntimeError(f"run failed: fatal {problems}, undecodable {meter.undecodable}")
    result = meter.per_txn()
    result["transactions"] = meter.certified
    result["entries"] = round(sum(entries) / max(len(entries), 1), 2)
    return result


def row(
    shards: int, regions: int, seed: int, duration_ms: int, clients: int, workers: int = 1
) -> dict[str, Any]:
    started = time.perf_counter()
    out: dict[str, Any] = {"shards": shards, "workers": workers, "regions": regions}
    for name, sparse in (("sparse", True), ("unsparse", False)):
        result = measure(shards, regions, seed, duration_ms, clients, sparse, workers)
        if name == "sparse":
            out["transactions"] = result["transactions"]
        del result["transactions"]
        out.update({f"{name}_{key}": value for key, value in result.items()})
    out["dense_bytes_per_clock"] = 8 * shards
    out["wall_s"] = round(time.perf_counter() - started, 1)
    return out


def main() -> None:
    if store.core.compiled():
        # The meter wraps each simulated server's RPC endpoint to see what it hands the RPC
        # core, which the compiled build's endpoint does not allow: run the source (this
        # counts bytes, not time; docs/performance.md).
        env = {**os.environ, "MERIDIAN_PURE_PYTHON": "1"}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shards", type=int, nargs="+", default=[8, 32, 128, 512], help="shard counts, one region"
    )
    parser.add_argument(
        "--shards-3r", type=int, nargs="+", default=[8, 32, 128],
        help="shard counts, three regions (3S replicas; the simulator's cost grows about as S^2 "
        "with the leaders' watermark gossip: the 128-shard pair of runs took 6 minutes on a "
        "shared 2-core machine; 512 was not run)",
    )
    parser.add_argument("--regions", type=int, nargs="+", default=[1, 3], choices=[1, 3])
    parser.add_argument(
        "--duration-ms", type=int, default=300, help="virtual time per run, one region"
    )
    parser.add_argument(
        "--duration-ms-3r", type=int, default=2000,
        help="virtual time per run, three regions (clients that wait for COMMITTED wait a "
        "wide-area round trip: fewer transactions per virtual second)",
    )
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[1],
        help="worker processes per shard, each run once (e.g. 1 4: clocks keep one entry per "
        "shard however many workers)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    if not args.json:
        print(
            "Dependency clocks on the wire, bytes per certified transaction (server msgpack "
            "messages; the protobuf replication stream, both follower links). Dense: ONE "
            "clock of 8 bytes per shard, for reference.",
            flush=True,
        )
    for regions in args.regions:
        for shards, workers in [
            (s, w) for s in (args.shards if regions == 1 else args.shards_3r) for w in args.workers
        ]:
            duration_ms = args.duration_ms if regions == 1 else args.duration_ms_3r
            r = row(shards, regions, args.seed, duration_ms, args.clients, workers)
            rows.append(r)
            if not args.json:
                print(
                    f"{regions}r {shards:>4} shards x {workers} workers: msgpack sparse "
                    f"{r['sparse_msgpack_clock_bytes']:>7.1f} B unsparse "
                    f"{r['unsparse_msgpack_clock_bytes']:>7.1f} B | stream sparse "
                    f"{r['sparse_stream_clock_bytes']:>7.1f} B unsparse "
                    f"{r['unsparse_stream_clock_bytes']:>7.1f} B | certified clock "
                    f"{r['sparse_entries']:.1f} vs {r['unsparse_entries']:.1f} entries | "
                    f"dense clock {r['dense_bytes_per_clock']} B | "
                    f"{r['transactions']} txns, {r['wall_s']} s",
                    flush=True,
                )
    if args.json:
        print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
