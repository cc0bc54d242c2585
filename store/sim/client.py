"""Simulated client processes: closed loops over a workload, recording a Jepsen history.

Each client submits its next transaction to the leader of the shard that owns the
transaction's first key, waits for the final outcome, records it, and moves on. It speaks
the same wire messages as the SDK: a lost request or answer is retried with the same client
transaction id, so the coordinator's exactly-once table returns the first outcome instead of
running the transaction twice. A client that gets no answer before its deadline records
``:info`` (it may or may not have happened) and, as in Jepsen, continues as a new process.
"""

from __future__ import annotations

from typing import Any

from jepsen.history import Op
from store.core.errors import Status
from store.core.messages import Outcome, Submit
from store.core.partition import Partitioner
from store.sim.loop import Simulator
from store.sim.network import MS, Network
from store.sim.workloads import Operation

FAIL_STATUSES = {Status.ABORTED, Status.USER_ABORTED, Status.INVALID, Status.PROCEDURE_FAILED,
                 Status.UNAVAILABLE}


class History:
    """The history of one run, shared by every client of it."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def record(self, op_type: str, f: str, value: Any, process: int, time_ns: int) -> None:
        self.ops.append(Op(op_type, f, value, process, time_ns, len(self.ops)))


class SimClient:
    def __init__(
        self,
        sim: Simulator,
        network: Network,
        history: History,
        index: int,
        client_count: int,
        workload: Any,
        partitioner: Partitioner,
        leaders: list[str],
        stop_at_ns: int,
        retry_ns: int = 60 * MS,
        deadline_ns: int = 3000 * MS,
        on_committed: Any = None,
    ) -> None:
        self.sim = sim
        self.network = network
        self.history = history
        self.address = f"client/{index}"
        self.process = index
        self.client_count = client_count
        self.workload = workload
        self.partitioner = partitioner
        self.leaders = leaders
        self.stop_at_ns = stop_at_ns
        self.retry_ns = retry_ns
        self.deadline_ns = deadline_ns
        self.seq = 0
        self.current: Operation | None = None
        self.target = ""
        self.submitted_at = 0
        self.counts = {"ok": 0, "fail": 0, "info": 0, "cross_shard": 0, "single_shard": 0}
        self.statuses: dict[int, int] = {}
        self.on_committed = on_committed
        network.add(self.address, self)

    def start(self) -> None:
        self.sim.after(self.sim.rng.randrange(1 * MS), self._next)

    def _next(self) -> None:
        if self.sim.now_ns >= self.stop_at_ns:
            self.current = None
            return
        operation = self.workload.next()
        self.current = operation
        self.seq += 1
        shards = {self.partitioner.shard_of(key) for key in operation.keys}
        self.counts["cross_shard" if len(shards) > 1 else "single_shard"] += 1
        self.target = self.leaders[self.partitioner.shard_of(operation.keys[0])]
        self.submitted_at = self.sim.now_ns
        self.history.record("invoke", operation.f, operation.value, self.process, self.sim.now_ns)
        self._send(self.seq)

    def _send(self, seq: int) -> None:
        if self.current is None or seq != self.seq:
            return
        if self.sim.now_ns - self.submitted_at >= self.deadline_ns:
            self._complete("info", self.current.value)
            self.process += self.client_count  # Jepsen: a process whose op is :info is done
            return
        operation = self.current
        message = Submit(self.address, seq, operation.procedure, operation.args, False)
        self.network.send(self.address, self.target, message)
        self.sim.after(self.retry_ns, self._send, seq)

    def deliver(self, now_ns: int, src: str, message: Any) -> None:
        if not isinstance(message, Outcome) or self.current is None or message.seq != self.seq:
            return
        status = Status(message.status)
        if status == Status.CERTIFIED:
            return  # this client waits for the durable answer
        self.statuses[status] = self.statuses.get(status, 0) + 1
        operation = self.current
        if status == Status.COMMITTED:
            if self.on_committed is not None:
                self.on_committed(f"{self.address}#{self.seq}", message.vc)
            self._complete("ok", operation.complete(message.result))
        elif status in FAIL_STATUSES:
            self._complete("fail", operation.value)
        else:
            self._complete("info", operation.value)
            self.process += self.client_count

    def _complete(self, op_type: str, value: Any) -> None:
        assert self.current is not None
        self.counts[op_type] += 1
        self.history.record(op_type, self.current.f, value, self.process, self.sim.now_ns)
        self.current = None
        self.seq += 1  # late answers to the finished transaction are ignored
        self.sim.after(self.sim.rng.randrange(200_000), self._next)
