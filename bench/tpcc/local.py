"""An asyncio face for the in-process ``LocalCluster``: many transactions in flight at once.

``LocalCluster.run`` runs one transaction to its end; TPC-C needs concurrent terminals to
produce conflicts. ``SimulatedTarget`` joins the cluster's simulated network as one more
client node: ``run`` sends a ``Submit`` to the chosen shard leader and awaits its outcome,
and a pump task advances the simulator in small steps of virtual time while anything is in
flight, yielding to the event loop between steps so terminals can submit more. Latencies
are the simulated cluster's (virtual time); throughput is the host's (wall-clock time).
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench.tpcc.driver import Completed
from store.core.errors import ERROR_OF_STATUS, Status
from store.core.messages import Outcome, Submit
from store.sim.local import LocalCluster
from store.sim.network import MS, US

NS_PER_S = 1e9
# Virtual time the pump advances per step; new submissions enter between steps.
PUMP_STEP_NS = 200 * US
# A transaction still unanswered after this much virtual time is a bug in the simulation.
OUTCOME_DEADLINE_NS = 10_000 * MS


class _Pending:
    __slots__ = ("certified_ns", "committed_ns", "future", "submitted_ns")

    def __init__(self, future: asyncio.Future[Outcome], submitted_ns: int) -> None:
        self.future = future
        self.submitted_ns = submitted_ns
        self.certified_ns: int | None = None
        self.committed_ns = 0


class SimulatedTarget:
    def __init__(self, cluster: LocalCluster, address: str = "client/tpcc") -> None:
        self.cluster = cluster
        self.address = address
        self.shard_count = len(cluster.leaders)
        cluster.network.add(address, self)
        self._seq = 0
        self._pending: dict[int, _Pending] = {}
        self._pump_task: asyncio.Task[None] | None = None

    # ---- the simulated network's side --------------------------------------------------

    def deliver(self, now_ns: int, src: str, message: Any) -> None:
        if not isinstance(message, Outcome):
            return
        pending = self._pending.get(message.seq)
        if pending is None:
            return
        if message.status == Status.CERTIFIED:
            pending.certified_ns = now_ns
            return
        del self._pending[message.seq]
        pending.committed_ns = now_ns
        if not pending.future.done():
            pending.future.set_result(message)

    async def _pump(self) -> None:
        sim = self.cluster.sim
        while self._pending:
            oldest = min(p.submitted_ns for p in self._pending.values())
            assert sim.now_ns - oldest < OUTCOME_DEADLINE_NS, (
                f"a transaction got no outcome in {OUTCOME_DEADLINE_NS // MS} ms of virtual time"
                f" (seed={sim.seed})"
            )
            sim.run_until(sim.now_ns + PUMP_STEP_NS)
            await asyncio.sleep(0)
        self._pump_task = None

    # ---- the driver's side --------------------------------------------------------------

    async def run_detailed(self, name: str, *args: Any, shard: int = 0) -> Completed:
        """Runs a procedure at ``shard``'s leader; raises the typed error unless committed."""
        self._seq += 1
        seq = self._seq
        sim = self.cluster.sim
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        pending = _Pending(future, sim.now_ns)
        self._pending[seq] = pending
        message = Submit(self.address, seq, name, list(args), True)
        self.cluster.network.send(self.address, self.cluster.leaders[shard], message)
        if self._pump_task is None:
            self._pump_task = asyncio.create_task(self._pump())
        outcome = await future
        if outcome.status != Status.COMMITTED:
            raise ERROR_OF_STATUS[Status(outcome.status)](outcome.detail)
        committed_ns = pending.committed_ns
        certified_ns = pending.certified_ns if pending.certified_ns is not None else committed_ns
        return Completed(
            outcome.result,
            (certified_ns - pending.submitted_ns) / NS_PER_S,
            (committed_ns - pending.submitted_ns) / NS_PER_S,
        )

    async def run(self, name: str, *args: Any, shard: int = 0) -> Any:
        return (await self.run_detailed(name, *args, shard=shard)).result


def replica_rows(cluster: LocalCluster) -> dict[str, Any]:
    """Every visible key/value held by the cluster's shard leaders, read from their stores.

    The in-process cluster has one replica per shard, so this is the data of "every replica
    that holds it"; use it when nothing runs (it reads the latest certified versions).
    """
    rows: dict[str, Any] = {}
    for shard in range(len(cluster.leaders)):
        store = cluster.replica(shard).store
        for key in store.all_keys():
            version = store.latest(key)
            if version is not None and not version.deleted:
                rows[key] = version.value
    return rows
