"""Load generated inside a shard leader: how Mako measures its throughput per core.

``bench/micro.py --generators in-server`` asks every shard leader (a ``GENERATE`` request)
to run the microbenchmark's mix itself for a while: ``in_flight`` transactions at a time,
each homed on this shard, 50% read-only and 50% read-modify-write of 4 keys, an access going
to another shard with probability ``remote``. In a shard of several workers (docs/design.md,
"Workers") it runs in each worker, homed on the worker's own keys, and a remote access goes
to another *shard* (to any of its workers), as in Mako's benchmark, whose worker threads each
run transactions on their own partition: keys of a fellow worker are not picked, so with
one shard nothing is remote. There is no client path: a transaction is
handed to the replica as a ``Submit`` object and its ``Outcome`` comes back as an object
(no codec, no RPC), the way Mako's in-process generators call its workers. Remote accesses
still cross the RPC core to the other shard leader, and replication runs as always. The
answer is the counts and latency histograms of the run, sent when the last transaction
ended.

Off unless the server was started with ``MERIDIAN_LOAD_GENERATORS=1`` in its environment: a
production server must not run load because someone asked it to.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack
from hdrh.histogram import HdrHistogram

from store.core.errors import InvalidRequest, Status
from store.core.partition import Partitioner
from store.protocol.messages import Outcome, Submit

GENERATORS_ENV = "MERIDIAN_LOAD_GENERATORS"
# A transaction aborted this many times in a row is counted failed and replaced (the SDK's
# default retry budget).
RETRIES_MAX = 10
LATENCY_MAX_US = 60_000_000
IN_FLIGHT_MAX = 4096
# The server lists every shard's keys before it starts (1-2 s per million keys on this machine,
# with the loop blocked): a bound keeps a request from stalling a leader for minutes.
KEYS_PER_SHARD_MAX = 1_000_000
DURATION_MAX_S = 3600.0


def generators_enabled() -> bool:
    return os.environ.get(GENERATORS_ENV) == "1"


def micro_keys(partitioner: Partitioner, shards: int, count: int) -> list[list[str]]:
    """The microbenchmark's keys: ``count`` per shard, ``micro/<9 digits>`` in order, each
    on the shard the partitioner gives it (what bench/micro.py preloads)."""
    by_shard: list[list[str]] = [[] for _ in range(shards)]
    i = 0
    while min(len(keys) for keys in by_shard) < count:
        key = f"micro/{i:09d}"
        shard = partitioner.shard_of(key)
        if len(by_shard[shard]) < count:
            by_shard[shard].append(key)
        i += 1
    return by_shard


@dataclass(frozen=True)
class GenerateSpec:
    """A GENERATE request: the built-in ``micro`` workload (this module's ``Generator``,
    with ``keys_per_shard`` and ``remote``), or one a procedures module registered
    (``Procedures.register_workload``), which gets ``params`` (a msgpack map)."""

    duration_s: float
    in_flight: int
    keys_per_shard: int
    remote: float
    seed: int
    workload: str = "micro"
    params: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> bytes:
        fields: dict[str, Any] = {
            "duration_s": self.duration_s, "in_flight": self.in_flight, "seed": self.seed,
        }
        if self.workload == "micro":
            fields.update(keys_per_shard=self.keys_per_shard, remote=self.remote)
        else:
            fields.update(workload=self.workload, params=self.params)
        return bytes(msgpack.packb(fields))

    @classmethod
    def from_wire(cls, payload: bytes) -> GenerateSpec:
        """The request's spec; InvalidRequest naming what is wrong."""
        try:
            fields = msgpack.unpackb(payload)
        except Exception as exc:
            raise InvalidRequest(f"GENERATE: not msgpack ({exc})") from None
        if not isinstance(fields, dict):
            raise InvalidRequest("GENERATE: the request is a map")
        workload = fields.get("workload", "micro")
        if type(workload) is not str or not workload:
            raise InvalidRequest("GENERATE: workload must be a non-empty string")
        expected = {"duration_s", "in_flight", "seed"} | (
            {"keys_per_shard", "remote"} if workload == "micro" else {"workload", "params"}
        )
        if set(fields) - {"workload"} != expected - {"workload"}:  # "micro" may be named or not
            raise InvalidRequest(
                f"GENERATE: fields of workload {workload!r} must be {sorted(expected)}, got {sorted(fields)}"
            )
        if workload != "micro":
            params = fields["params"]
            if not isinstance(params, dict) or not all(type(k) is str for k in params):
                raise InvalidRequest("GENERATE: params must be a map with string keys")
            fields = {**fields, "keys_per_shard": 1, "remote": 0.0}
        else:
            params = {}
        duration, in_flight = fields["duration_s"], fields["in_flight"]
        keys, remote, seed = fields["keys_per_shard"], fields["remote"], fields["seed"]
        if type(duration) not in (int, float) or not 0 < duration <= DURATION_MAX_S:
            raise InvalidRequest(f"GENERATE: duration_s must be in (0, {DURATION_MAX_S}]")
        if type(in_flight) is not int or not 1 <= in_flight <= IN_FLIGHT_MAX:
            raise InvalidRequest(f"GENERATE: in_flight must be an integer in [1, {IN_FLIGHT_MAX}]")
        if type(keys) is not int or not 1 <= keys <= KEYS_PER_SHARD_MAX:
            raise InvalidRequest(f"GENERATE: keys_per_shard must be an integer in [1, {KEYS_PER_SHARD_MAX}]")
        if type(remote) not in (int, float) or not 0 <= remote <= 1 or math.isnan(remote):
            raise InvalidRequest("GENERATE: remote must be a probability in [0, 1]")
        if type(seed) is not int:
            raise InvalidRequest("GENERATE: seed must be an integer")
        return cls(float(duration), in_flight, keys, float(remote), seed, workload, params)


class LocalSubmitter(Protocol):
    """What the generator needs of the replica's host (``ReplicaHost.submit_local``)."""

    def submit_local(self, submissions: Sequence[tuple[Submit, Callable[[Outcome], None]]]) -> None: ...


class LocalRun:
    """What a registered workload (``Procedures.register_workload``) runs with: it calls
    ``submit`` for each attempt of a transaction on this shard leader (a ``Submit`` object
    handed to the replica, no client path; everything submitted in one loop iteration goes
    in one batch) and returns its answer, a msgpack-able map, when ``duration_s`` is over
    and its transactions have ended. ``unit`` is this leader's unit (``shard * W +
    worker``), ``partitioner`` the cluster's."""

    def __init__(
        self,
        host: LocalSubmitter,
        spec: GenerateSpec,
        unit: int,
        partitioner: Partitioner,
        soon: Callable[[Callable[[], None]], object],
        future: Callable[[], Any],
    ) -> None:
        self.unit = unit
        self.partitioner = partitioner
        self.duration_s = spec.duration_s
        self.in_flight = spec.in_flight
        self.seed = spec.seed
        self.params = spec.params
        self._host = host
        self._soon = soon
        self._future = future
        self._client_id = f"generator-{spec.workload}-{unit}"
        self._seq = 0
        self._queued: list[tuple[Submit, Callable[[Outcome], None]]] = []

    def submit(self, procedure: str, args: list[Any]) -> Any:
        """One attempt of procedure ``procedure`` (``""``: an operation list, ``args`` =
        ``[ops]``); an awaitable of its final ``Outcome``. Arguments go to the procedure as
        the objects they are (no codec): they must not be changed afterwards."""
        future = self._future()
        self._seq += 1
        if not self._queued:
            self._soon(self._flush)

        def answered(outcome: Outcome) -> None:
            if not future.done():  # not cancelled with its workload (the server stopping)
                future.set_result(outcome)

        self._queued.append((Submit(self._client_id, self._seq, procedure, args, False), answered))
        return future

    def _flush(self) -> None:
        queued, self._queued = self._queued, []
        self._host.submit_local(queued)


class _Txn:
    __slots__ = ("args", "attempts", "cross_shard", "generator", "kind", "started_s")

    def __init__(self, generator: Generator, args: list[Any], kind: str, cross_shard: bool) -> None:
        self.generator = generator
        self.args = args
        self.kind = kind
        self.cross_shard = cross_shard
        self.attempts = 0
        self.started_s = 0.0

    def answered(self, outcome: Outcome) -> None:
        self.generator._answered(self, outcome)


class Generator:
    """One run of in-server load on one shard leader (module doc)."""

    def __init__(
        self,
        host: LocalSubmitter,
        shard: int,
        keys: list[list[str]],
        spec: GenerateSpec,
        *,
        workers: int = 1,
        now_s: Callable[[], float],
        soon: Callable[[Callable[[], None]], object],
        done: Callable[[dict[str, Any]], None],
    ) -> None:
        self._host = host
        self._shard = shard
        self._keys = keys  # per unit (a shard's worker; one worker: per shard)
        self._workers = workers
        self._spec = spec
        self._now_s = now_s
        self._soon = soon
        self._done = done
        self._rng = random.Random(spec.seed * 1_000_003 + shard)
        self._client_id = f"generator-{shard}"
        self._seq = 0
        self._queued: list[_Txn] = []
        self._submit_scheduled = False
        self._active = 0
        self._started_s = 0.0
        self._stop_s = 0.0
        self.histograms = {kind: HdrHistogram(1, LATENCY_MAX_US, 3) for kind in ("read_only", "rmw")}
        self.counts = {
            "read_only": 0, "rmw": 0, "attempts": 0, "aborted_attempts": 0, "failed": 0,
            "errors": 0, "cross_shard": 0,
        }
        self.error_details: dict[str, int] = {}

    def start(self) -> None:
        self._started_s = self._now_s()
        self._stop_s = self._started_s + self._spec.duration_s
        for _ in range(self._spec.in_flight):
            self._queue(self._new_txn())
        self._active = self._spec.in_flight

    def _new_txn(self) -> _Txn:
        rng, keys, home, workers = self._rng, self._keys, self._shard, self._workers
        shards = len(keys) // workers
        chosen = []
        cross_shard = False
        for _ in range(4):
            unit = home
            if shards > 1 and rng.random() < self._spec.remote:
                other = (home // workers + rng.randrange(1, shards)) % shards
                unit = other * workers + (rng.randrange(workers) if workers > 1 else 0)
                cross_shard = True
            shard_keys = keys[unit]
            chosen.append(shard_keys[rng.randrange(len(shard_keys))])
        if rng.random() < 0.5:
            return _Txn(self, [[["get", key] for key in chosen]], "read_only", cross_shard)
        return _Txn(self, [[["increment", key, 1] for key in chosen]], "rmw", cross_shard)

    def _queue(self, txn: _Txn) -> None:
        self._queued.append(txn)
        if not self._submit_scheduled:
            self._submit_scheduled = True
            self._soon(self._submit_queued)

    def _submit_queued(self) -> None:
        # Everything started since the last call goes to the replica in one batch: one
        # ready() for all of it, as a batch of client requests would.
        self._submit_scheduled = False
        queued, self._queued = self._queued, []
        now = self._now_s()
        submissions = []
        for txn in queued:
            if txn.attempts == 0:
                txn.started_s = now
            txn.attempts += 1
            self._seq += 1
            submissions.append((Submit(self._client_id, self._seq, "", txn.args, False), txn.answered))
        self._host.submit_local(submissions)

    def _answered(self, txn: _Txn, outcome: Outcome) -> None:
        counts = self.counts
        status = outcome.status
        if status == Status.COMMITTED:
            counts["attempts"] += txn.attempts
            counts["aborted_attempts"] += txn.attempts - 1
            counts[txn.kind] += 1
            if txn.cross_shard:
                counts["cross_shard"] += 1
            latency_us = int((self._now_s() - txn.started_s) * 1e6)
            self.histograms[txn.kind].record_value(min(max(1, latency_us), LATENCY_MAX_US))
        elif status == Status.ABORTED and txn.attempts <= RETRIES_MAX:
            self._queue(txn)  # retried, as the SDK would
            return
        else:
            counts["attempts"] += txn.attempts
            counts["aborted_attempts"] += txn.attempts - (status != Status.ABORTED)
            counts["failed" if status == Status.ABORTED else "errors"] += 1
            if status != Status.ABORTED:
                name = Status(status).name
                self.error_details[name] = self.error_details.get(name, 0) + 1
        if self._now_s() < self._stop_s:
            self._queue(self._new_txn())
            return
        self._active -= 1
        if self._active == 0:
            self._done(self.result())

    def result(self) -> dict[str, Any]:
        return {
            "shard": self._shard,
            "elapsed_s": self._now_s() - self._started_s,
            "counts": dict(self.counts),
            "errors_by_status": dict(self.error_details),
            "histograms": {kind: h.encode() for kind, h in self.histograms.items()},
        }
