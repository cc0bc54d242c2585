"""The simulated datagram network of ``store.rpc.sim``: datagrams between named addresses
with a latency, jitter, loss, duplication, reordering and partitions, all drawn from one
seeded ``random.Random``, so a run is a pure function of its seed (see ``store/rpc/sim.py``
for how endpoints use it). Interpreted, unlike the endpoint (setup.py): tests wrap its
methods to lose, delay or watch datagrams."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from store.rpc.sim import SimRpc

SIM_MTU_BYTES = 65507


class SimNetwork:
    """In-memory datagram network with virtual time and seeded faults."""

    def __init__(
        self,
        rng: random.Random,
        *,
        latency_ns: int = 5_000,
        jitter_ns: int = 1_000,
        loss: float = 0.0,
        duplicate: float = 0.0,
        reorder: float = 0.0,
        reorder_delay_ns: int = 50_000,
        mtu_bytes: int = SIM_MTU_BYTES,
    ) -> None:
        self.rng = rng
        self.now_ns = 0
        self.latency_ns = latency_ns
        self.jitter_ns = jitter_ns
        self.loss = loss
        self.duplicate = duplicate
        self.reorder = reorder
        self.reorder_delay_ns = reorder_delay_ns
        self.mtu_bytes = mtu_bytes
        self._queues: dict[str, list[tuple[int, int, str, bytes]]] = {}
        self._endpoints: dict[str, SimRpc] = {}
        self._blocked: set[tuple[str, str]] = set()
        self._link_last_at: dict[tuple[str, str], int] = {}
        self._seq = 0
        self.delivered = 0
        self.dropped = 0

    # --- topology ------------------------------------------------------------------------------

    def attach(self, address: str, endpoint: SimRpc) -> None:
        if address in self._endpoints:
            raise ValueError(f"address {address!r} is in use")
        self._endpoints[address] = endpoint
        self._queues.setdefault(address, [])

    def detach(self, address: str) -> None:
        """Forget the endpoint at `address` and every datagram queued for it (a crash)."""
        self._endpoints.pop(address, None)
        self._queues.pop(address, None)

    def partition(self, a: str, b: str) -> None:
        """Drop datagrams between a and b, both ways, until heal()."""
        self._blocked.add((a, b))
        self._blocked.add((b, a))

    def heal(self) -> None:
        self._blocked.clear()

    # --- datagrams -----------------------------------------------------------------------------

    def send(self, src: str, dst: str, datagram: bytes) -> None:
        if len(datagram) > self.mtu_bytes or (src, dst) in self._blocked:
            self.dropped += 1
            return
        rng = self.rng
        if self.loss and rng.random() < self.loss:
            self.dropped += 1
            return
        copies = 2 if self.duplicate and rng.random() < self.duplicate else 1
        queue = self._queues.get(dst)
        if queue is None:
            self.dropped += 1  # nobody there
            return
        link = (src, dst)
        for _ in range(copies):
            at = self.now_ns + self.latency_ns
            if self.jitter_ns:
                at += rng.randrange(self.jitter_ns + 1)
            # Jitter alone keeps a link first-in first-out, like a real path; only the
            # reorder fault lets a datagram overtake another.
            at = max(at, self._link_last_at.get(link, 0))
            self._link_last_at[link] = at
            if self.reorder and rng.random() < self.reorder:
                at += rng.randrange(1, self.reorder_delay_ns + 1)
            self._seq += 1
            heapq.heappush(queue, (at, self._seq, src, datagram))

    def take_due(self, address: str, now_ns: int) -> list[tuple[str, bytes]]:
        """Datagrams for `address` whose delivery time has come, in delivery order."""
        queue = self._queues.get(address)
        out: list[tuple[str, bytes]] = []
        while queue and queue[0][0] <= now_ns:
            _, _, src, data = heapq.heappop(queue)
            out.append((src, data))
        self.delivered += len(out)
        return out

    def next_delivery_at(self, address: str) -> int | None:
        queue = self._queues.get(address)
        return queue[0][0] if queue else None

    # --- driver --------------------------------------------------------------------------------

    def next_event_at(self) -> int | None:
        """Earliest time at which some endpoint has a delivery or a timer due."""
        best: int | None = None
        for address, endpoint in self._endpoints.items():
            for at in (self.next_delivery_at(address), endpoint.next_wake_at()):
                if at is not None and (best is None or at < best):
                    best = at
        return best

    def step(self, until_ns: int | None = None) -> bool:
        """Advance to the next event (not past until_ns) and poll the endpoints it concerns.
        Returns False if nothing is scheduled (or the next event is after until_ns)."""
        at = self.next_event_at()
        if at is None or (until_ns is not None and at > until_ns):
            if until_ns is not None:
                self.now_ns = max(self.now_ns, until_ns)
            return False
        self.now_ns = max(self.now_ns, at)
        for address, endpoint in list(self._endpoints.items()):
            delivery = self.next_delivery_at(address)
            wake = endpoint.next_wake_at()
            if (delivery is not None and delivery <= self.now_ns) or (
                wake is not None and wake <= self.now_ns
            ):
                endpoint.poll(self.now_ns)
        return True

    def run_until(self, predicate: Callable[[], bool], *, steps_max: int = 10_000_000,
                  until_ns: int | None = None) -> bool:
        """Step until predicate() holds; False if time ran out or nothing is left to do."""
        for _ in range(steps_max):
            if predicate():
                return True
            if not self.step(until_ns):
                return predicate()
        raise AssertionError(f"simulation did not settle in {steps_max} steps")

    def run_for(self, duration_ns: int, *, steps_max: int = 10_000_000) -> None:
        end = self.now_ns + duration_ns
        for _ in range(steps_max):
            if not self.step(end):
                return
        raise AssertionError(f"simulation did not settle in {steps_max} steps")
