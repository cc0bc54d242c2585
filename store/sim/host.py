"""Hosts a pure replica in the simulation: the simulator's twin of ``store/node``.

It feeds the replica the messages the network delivers and its timer firings, then carries
out its ``Ready``: messages go to the network, the wake-up time becomes one timer event.
A timer event that finds the replica already woken later is ignored (a stale generation).
"""

from __future__ import annotations

from typing import Any

from store.core.replica import ShardLeader
from store.sim.loop import Simulator
from store.sim.network import Network


class ReplicaHost:
    def __init__(self, sim: Simulator, network: Network, replica: ShardLeader) -> None:
        self.sim = sim
        self.network = network
        self.replica = replica
        self.address = replica.address
        self._timer_at: int | None = None
        self.crashed = False

    def start(self) -> None:
        self._flush()

    def deliver(self, now_ns: int, src: str, message: Any) -> None:
        if self.crashed:
            return
        self.replica.handle(now_ns, src, message)
        self._flush()

    def _wake(self, when_ns: int) -> None:
        if self.crashed or self._timer_at != when_ns:
            return
        self._timer_at = None
        self.replica.tick(self.sim.now_ns)
        self._flush()

    def _flush(self) -> None:
        ready = self.replica.ready()
        send = self.network.send
        for dst, message in ready.messages:
            send(self.address, dst, message)
        wake_at = ready.wake_at
        if wake_at is not None and (self._timer_at is None or wake_at < self._timer_at):
            self._timer_at = wake_at
            self.sim.at(wake_at, self._wake, wake_at)
