"""An in-process cluster for tests and examples: run transactions to completion, no faults.

``LocalCluster`` is a simulated cluster (``store.sim.cluster``: the servers' own host, RPC
core and codecs on virtual time, a fault-free network) with one client process running the
SDK's protocol, so unit tests of procedures (TPC-C's, for example) run against exactly the
code a server and a client run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from store.client.protocol import ClientSettings, PendingTxn, Steps
from store.core.errors import MeridianError
from store.core.oplist import OPS_PROCEDURE
from store.core.partition import Partitioner
from store.core.replica import ShardLeader
from store.core.settings import DEFAULT_SETTINGS, Settings
from store.core.txn import Procedures
from store.protocol.messages import Outcome, Submit
from store.sim.client import SdkProcess
from store.sim.cluster import REGIONS, SimCluster
from store.sim.loop import Simulator
from store.sim.network import MS, Network

CLIENT_ID = "local"
# Virtual time a call may take before it is a bug of the test (no faults here).
CALL_DEADLINE_NS = 30_000 * MS


@dataclass
class Submission:
    """One submission started with ``LocalCluster.start``: its outcome once answered."""

    outcome: Outcome | None = None
    error: MeridianError | None = None

    @property
    def done(self) -> bool:
        return self.outcome is not None or self.error is not None


class LocalCluster:
    def __init__(
        self,
        shards: int = 1,
        procedures: Procedures | None = None,
        partitioner: Partitioner | None = None,
        settings: Settings = DEFAULT_SETTINGS,
        seed: int = 0,
        regions: int = 1,
    ) -> None:
        """``regions``: 1 (every write durable once installed), or up to 3 (a follower of
        every shard in each other region, 50 ms of round trip away: a write is speculative
        until a majority of regions has it)."""
        self.sim = Simulator(seed)
        self.network = Network(self.sim)
        self.partitioner = partitioner or Partitioner(shards)
        self.procedures = procedures or Procedures()
        self.cluster = SimCluster(
            self.sim, self.network, shards, self.procedures,
            partitioner=self.partitioner, settings=settings, regions=REGIONS[:regions],
        )
        self.leaders = self.cluster.leader_addresses
        self.cluster.start()
        self.client = SdkProcess(
            self.sim, self.network, "client/local", REGIONS[0], self.leaders, self.partitioner,
            ClientSettings(timeout_s=CALL_DEADLINE_NS / 1e9), self.cluster.rpc_settings,
            client_id=CLIENT_ID,
        )
        self.protocol = self.client.protocol

    def preload(self, data: dict[str, Any]) -> None:
        for key, value in data.items():
            self.cluster.preload(key, value)

    def replica(self, shard: int) -> ShardLeader:
        return self.cluster.leaders[shard]

    def run_for(self, duration_ns: int) -> None:
        self.sim.run_until(self.sim.now_ns + duration_ns)

    def call(self, steps: Steps[Any]) -> Any:
        """Drives one SDK call to its end on virtual time; its result, or its typed error."""
        done: list[tuple[Any, MeridianError | None]] = []
        self.client.drive(steps, lambda result, error: done.append((result, error)))
        deadline = self.sim.now_ns + CALL_DEADLINE_NS
        while not done:
            assert self.sim.now_ns < deadline, "the call did not finish"
            self.sim.run_until(self.sim.now_ns + 1 * MS)
        result, error = done[0]
        if error is not None:
            raise error
        return result

    def start(self, procedure: str, *args: Any, shard: int = 0, seq: int | None = None) -> Submission:
        """Submits a transaction once (one id, no conflict retry) without waiting for it;
        ``seq`` reuses a sequence number, as a client retrying after a timeout does."""
        if seq is None:
            pending = self.protocol.new_pending(shard, procedure, list(args))
        else:
            submit = Submit(CLIENT_ID, seq, procedure, list(args), True)
            pending = PendingTxn(shard, submit, self.sim.now_ns / 1e9)
        submission = Submission()

        def done(outcome: Outcome | None, error: MeridianError | None) -> None:
            submission.outcome = outcome
            submission.error = error

        self.client.drive(self.protocol.exchange(pending, want_certified=False), done)
        return submission

    def submit(self, procedure: str, *args: Any, shard: int = 0) -> Outcome:
        """Runs one submission at ``shard``'s leader to its final outcome."""
        return self.wait(self.start(procedure, *args, shard=shard))

    def wait(self, submission: Submission) -> Outcome:
        """Runs until a started submission has its final outcome; that outcome."""
        deadline = self.sim.now_ns + CALL_DEADLINE_NS
        while not submission.done:
            assert self.sim.now_ns < deadline, "transaction did not finish"
            self.sim.run_until(self.sim.now_ns + 1 * MS)
        if submission.error is not None:
            raise submission.error
        assert submission.outcome is not None
        return submission.outcome

    def run(self, procedure: str, *args: Any, shard: int = 0) -> Any:
        """Runs a procedure as the SDK's ``run`` does (conflicts retried); its result when
        committed, else its typed error."""
        return self.call(self.protocol.run(shard, procedure, list(args), False, False)).result

    def ops(self, ops: list[list[Any]], shard: int = 0) -> list[Any]:
        result: list[Any] = self.run(OPS_PROCEDURE, ops, shard=shard)
        return result

    def get(self, key: str) -> Any:
        return self.ops([["get", key]], shard=self.partitioner.shard_of(key))[0]
