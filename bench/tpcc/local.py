"""An asyncio face for the in-process ``LocalCluster``: many transactions in flight at once.

``LocalCluster.run`` runs one transaction to its end; TPC-C needs concurrent terminals to
produce conflicts. ``SimulatedTarget`` drives the cluster's simulated client process (the
SDK's protocol on the simulated network): ``run_detailed`` starts one attempt and awaits its
outcome, and a pump task advances the simulator in small steps of virtual time while
anything is in flight, yielding to the event loop between steps so terminals can submit
more. Latencies are the simulated cluster's (virtual time); throughput is the host's
(wall-clock time).
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench.tpcc.driver import Completed
from bench.tpcc.loader import InitialRows
from bench.tpcc.schema import Key
from store.client.protocol import TxnResult
from store.core.errors import MeridianError
from store.core.keys import pack, unpack
from store.sim.local import LocalCluster
from store.sim.network import MS, US

# Virtual time the pump advances per step; new submissions enter between steps.
PUMP_STEP_NS = 200 * US
# A transaction still unanswered after this much virtual time is a bug in the simulation.
OUTCOME_DEADLINE_NS = 10_000 * MS


class SimulatedTarget:
    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.shard_count = len(cluster.leaders)
        self._in_flight: dict[int, int] = {}  # call number -> virtual time it started
        self._calls = 0
        self._pump_task: asyncio.Task[None] | None = None

    async def _pump(self) -> None:
        sim = self.cluster.sim
        while self._in_flight:
            oldest = min(self._in_flight.values())
            assert sim.now_ns - oldest < OUTCOME_DEADLINE_NS, (
                f"a transaction got no outcome in {OUTCOME_DEADLINE_NS // MS} ms of virtual time"
                f" (seed={sim.seed})"
            )
            sim.run_until(sim.now_ns + PUMP_STEP_NS)
            await asyncio.sleep(0)
        self._pump_task = None

    async def run_detailed(self, name: str, *args: Any, shard: int = 0) -> Completed:
        """Runs a procedure at ``shard``'s leader once (one transaction id); raises the typed
        error unless committed."""
        protocol = self.cluster.protocol
        future: asyncio.Future[TxnResult] = asyncio.get_running_loop().create_future()
        self._calls += 1
        call = self._calls
        self._in_flight[call] = self.cluster.sim.now_ns

        def done(result: TxnResult | None, error: MeridianError | None) -> None:
            del self._in_flight[call]
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)  # type: ignore[arg-type]

        pending = protocol.new_pending(shard, name, list(args))
        self.cluster.client.drive(protocol.attempt(pending, False, 1, detailed=True), done)
        if self._pump_task is None:
            self._pump_task = asyncio.create_task(self._pump())
        result = await future
        return Completed(result.result, result.certified_s, result.committed_s)

    async def run(self, name: str, *args: Any, shard: int = 0) -> Any:
        return (await self.run_detailed(name, *args, shard=shard)).result


def load(cluster: LocalCluster, initial: InitialRows) -> None:
    """Puts the initial database in the cluster before it serves: each warehouse's rows on
    its shard, and ITEM on every shard (``preload`` puts a replicated table's rows on all)."""
    for rows in initial.by_shard:
        cluster.preload({pack(key): value for key, value in rows.items()})
    cluster.preload({pack(key): value for key, value in initial.items.items()})


def replica_rows(cluster: LocalCluster) -> dict[Key, Any]:
    """Every visible key/value held by the cluster's shard leaders, read from their stores,
    keyed by the tuples (ITEM, on every leader, once).

    The in-process cluster has one replica per shard, so this is the data of "every replica
    that holds it"; use it when nothing runs (it reads the latest certified versions).
    """
    rows: dict[Key, Any] = {}
    for shard in range(len(cluster.leaders)):
        store = cluster.replica(shard).store
        for key in store.all_keys():
            version = store.latest(key)
            if version is not None and not version.deleted:
                rows[unpack(key)] = version.value
    return rows
