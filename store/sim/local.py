"""An in-process cluster for tests and examples: run transactions to completion, no faults.

``LocalCluster`` builds shard leaders on a simulator with a fault-free network and runs
each submitted transaction until its final outcome, so unit tests of procedures (TPC-C's,
for example) run against exactly the code a server runs.
"""

from __future__ import annotations

from typing import Any

from store.core.errors import ERROR_OF_STATUS, Status
from store.core.messages import Outcome, Submit
from store.core.partition import Partitioner
from store.core.replica import ShardLeader
from store.core.settings import DEFAULT_SETTINGS, Settings
from store.core.txn import OPS_PROCEDURE, Procedures
from store.sim.host import ReplicaHost
from store.sim.loop import Simulator
from store.sim.network import MS, Network


class LocalCluster:
    def __init__(
        self,
        shards: int = 1,
        procedures: Procedures | None = None,
        partitioner: Partitioner | None = None,
        settings: Settings = DEFAULT_SETTINGS,
        seed: int = 0,
    ) -> None:
        self.sim = Simulator(seed)
        self.network = Network(self.sim)
        self.partitioner = partitioner or Partitioner(shards)
        self.procedures = procedures or Procedures()
        self.leaders = [f"leader/{s}" for s in range(shards)]
        self.hosts = []
        for shard in range(shards):
            replica = ShardLeader(shard, self.leaders, self.partitioner, self.procedures, settings)
            host = ReplicaHost(self.sim, self.network, replica)
            self.network.add(replica.address, host)
            self.hosts.append(host)
            host.start()
        self.address = "client/local"
        self.network.add(self.address, self)
        self._seq = 0
        self._outcomes: dict[int, Outcome] = {}

    def deliver(self, now_ns: int, src: str, message: Any) -> None:
        if isinstance(message, Outcome) and message.status != Status.CERTIFIED:
            self._outcomes[message.seq] = message

    def preload(self, data: dict[str, Any]) -> None:
        for key, value in data.items():
            self.hosts[self.partitioner.shard_of(key)].replica.preload(key, value)

    def submit(self, procedure: str, *args: Any, shard: int = 0) -> Outcome:
        """Runs one transaction at ``shard``'s leader to its final outcome."""
        self._seq += 1
        seq = self._seq
        message = Submit("local", seq, procedure, list(args), False)
        self.network.send(self.address, self.leaders[shard], message)
        deadline = self.sim.now_ns + 10_000 * MS
        while seq not in self._outcomes:
            assert self.sim.now_ns < deadline, "transaction did not finish"
            self.sim.run_until(self.sim.now_ns + 1 * MS)
        return self._outcomes.pop(seq)

    def run(self, procedure: str, *args: Any, shard: int = 0) -> Any:
        """Runs a procedure; its result when committed, else raises the typed error."""
        outcome = self.submit(procedure, *args, shard=shard)
        if outcome.status == Status.COMMITTED:
            return outcome.result
        raise ERROR_OF_STATUS[Status(outcome.status)](outcome.detail)

    def ops(self, ops: list[list[Any]], shard: int = 0) -> list[Any]:
        result: list[Any] = self.run(OPS_PROCEDURE, ops, shard=shard)
        return result

    def get(self, key: str) -> Any:
        return self.ops([["get", key]], shard=self.partitioner.shard_of(key))[0]

    def replica(self, shard: int) -> ShardLeader:
        return self.hosts[shard].replica
