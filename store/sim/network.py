"""The simulated network: bytes between addresses, with per-region-pair latency and jitter,
loss, duplication, reordering, partitions and crashes, all drawn from the simulation's one
seeded random source.

Two kinds of traffic cross it, as in production:

* **datagrams** between RPC endpoints — the real RPC core (``store.rpc.sim.SimRpc``, C
  sessions, credits, retransmission) sends and receives them. This class is the datagram
  network that ``SimRpc``'s transport expects (``attach``, ``detach``, ``send``,
  ``take_due``, ``now_ns``, ``rng``, ``mtu_bytes``), and it wakes each endpoint when a
  datagram is due or its core's timer expires;
* **stream batches** between replication transports (``send_stream``): Paxos messages as
  the protobuf bytes production sends over gRPC, delivered to ``listen``ers.

Every address belongs to a region (``add``); latency is looked up by region pair. A link is
first-in first-out, like a real path, unless the reorder fault holds a message back. A
crashed address receives nothing until it is brought back.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from store.sim.loop import Simulator

US = 1_000
MS = 1_000_000

# The largest datagram (the RPC core's packets are smaller: its MTU setting).
MTU_BYTES = 65507


class Listener(Protocol):
    def deliver(self, now_ns: int, src: str, data: bytes) -> None: ...


class Endpoint(Protocol):
    """What the network needs of an RPC endpoint (``store.rpc.sim.SimRpc``)."""

    def poll(self, now_ns: int) -> None: ...

    def next_wake_at(self) -> int | None: ...


@dataclass
class Faults:
    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0  # chance a message is held back by up to reorder_delay_ns
    reorder_delay_ns: int = 2 * MS
    # A busy server reads what reached its socket meanwhile in one batch. With a window, an
    # endpoint takes everything that arrived within it after a datagram in one poll (one
    # dispatch: a shard leader handles it as one step); 0: each datagram at once.
    receive_batch_ns: int = 0


@dataclass
class Link:
    latency_ns: int = 50 * US
    jitter_ns: int = 50 * US


class Network:
    mtu_bytes = MTU_BYTES

    def __init__(self, sim: Simulator, faults: Faults | None = None) -> None:
        self.sim = sim
        self.rng: random.Random = sim.rng
        self.faults = faults or Faults()
        self._region: dict[str, str] = {}
        self._links: dict[tuple[str, str], Link] = {}
        self.default_link = Link()
        self._blocked: set[tuple[str, str]] = set()
        self._down: set[str] = set()
        self._endpoints: dict[str, Endpoint] = {}
        self._inboxes: dict[str, list[tuple[str, bytes]]] = {}
        self._wake_at: dict[str, int] = {}
        self._batch_polls: set[str] = set()  # endpoints whose receive batch is open
        self._listeners: dict[str, Listener] = {}
        self._link_last_at: dict[tuple[str, str], int] = {}
        self.sent = 0
        self.delivered = 0
        self.dropped = 0
        self.bytes_sent = 0

    # ---- topology ------------------------------------------------------------------------

    def add(self, address: str, region: str = "local") -> None:
        """Declares an address and its region."""
        self._region[address] = region
        self._down.discard(address)

    def listen(self, address: str, listener: Listener) -> None:
        """``listener`` receives the stream batches sent to ``address``."""
        self._listeners[address] = listener

    def crash(self, address: str) -> None:
        """The process at ``address`` vanishes: what is in flight to it is lost."""
        self._down.add(address)
        self.detach(address)
        self._listeners.pop(address, None)

    def is_down(self, address: str) -> bool:
        return address in self._down

    def set_link(self, region_a: str, region_b: str, link: Link) -> None:
        self._links[(region_a, region_b)] = link
        self._links[(region_b, region_a)] = link

    def region_of(self, address: str) -> str:
        return self._region[address]

    def addresses(self) -> list[str]:
        return list(self._region)

    # ---- partitions ----------------------------------------------------------------------

    def partition(self, side_a: Iterable[str], side_b: Iterable[str]) -> None:
        side_b = list(side_b)
        for a in side_a:
            for b in side_b:
                self._blocked.add((a, b))
                self._blocked.add((b, a))

    def block(self, sources: Iterable[str], destinations: Iterable[str]) -> None:
        """A one-way partition: what ``sources`` send to ``destinations`` is lost; the
        other direction still works (a node that can speak but no longer hear)."""
        destinations = list(destinations)
        for a in sources:
            for b in destinations:
                self._blocked.add((a, b))

    def heal(self) -> None:
        self._blocked.clear()

    def is_partitioned(self) -> bool:
        return bool(self._blocked)

    # ---- the datagram network of store.rpc.sim.SimRpc ------------------------------------

    @property
    def now_ns(self) -> int:
        return self.sim.now_ns

    @now_ns.setter
    def now_ns(self, value: int) -> None:
        assert value == self.sim.now_ns, "endpoints are polled at the simulator's time"

    def attach(self, address: str, endpoint: Endpoint) -> None:
        if address in self._endpoints:
            raise ValueError(f"address {address!r} is in use")
        assert address in self._region, f"add({address!r}, region) first"
        self._endpoints[address] = endpoint
        self._inboxes[address] = []
        self._wake_at.pop(address, None)

    def detach(self, address: str) -> None:
        self._endpoints.pop(address, None)
        self._inboxes.pop(address, None)
        self._wake_at.pop(address, None)

    def send(self, src: str, dst: str, datagram: bytes) -> None:
        for when in self._transit(src, dst, len(datagram)):
            self.sim.at(when, self._arrive_datagram, src, dst, datagram)

    def take_due(self, address: str, now_ns: int) -> list[tuple[str, bytes]]:
        inbox = self._inboxes.get(address)
        if not inbox:
            return []
        self._inboxes[address] = []
        return inbox

    def arm(self, address: str) -> None:
        """Schedules the endpoint's next timer wake-up, if earlier than the one scheduled."""
        endpoint = self._endpoints.get(address)
        if endpoint is None:
            return
        wake = endpoint.next_wake_at()
        if wake is None:
            return
        scheduled = self._wake_at.get(address)
        if scheduled is not None and scheduled <= wake:
            return
        self._wake_at[address] = wake
        self.sim.at(wake, self._wake, address, wake)

    def _wake(self, address: str, when_ns: int) -> None:
        if self._wake_at.get(address) != when_ns:
            return  # a later (or no) wake-up is scheduled now
        del self._wake_at[address]
        self._poll(address)

    def _arrive_datagram(self, src: str, dst: str, datagram: bytes) -> None:
        if dst in self._down or (src, dst) in self._blocked or dst not in self._endpoints:
            self.dropped += 1
            return
        self.delivered += 1
        self._inboxes[dst].append((src, datagram))
        window = self.faults.receive_batch_ns
        if not window:
            self._poll(dst)
        elif dst not in self._batch_polls:
            self._batch_polls.add(dst)
            self.sim.at(self.sim.now_ns + window, self._poll_batch, dst)

    def _poll_batch(self, address: str) -> None:
        self._batch_polls.discard(address)
        self._poll(address)

    def _poll(self, address: str) -> None:
        endpoint = self._endpoints.get(address)
        if endpoint is None:
            return
        endpoint.poll(self.sim.now_ns)
        self.arm(address)

    # ---- stream batches ------------------------------------------------------------------

    def send_stream(self, src: str, dst: str, data: bytes) -> None:
        for when in self._transit(src, dst, len(data)):
            self.sim.at(when, self._arrive_stream, src, dst, data)

    def _arrive_stream(self, src: str, dst: str, data: bytes) -> None:
        listener = self._listeners.get(dst)
        if listener is None or dst in self._down or (src, dst) in self._blocked:
            self.dropped += 1
            return
        self.delivered += 1
        listener.deliver(self.sim.now_ns, src, data)

    # ---- faults and timing ---------------------------------------------------------------

    def _transit(self, src: str, dst: str, size: int) -> list[int]:
        """When each copy of a message sent now arrives (none if it is lost)."""
        self.sent += 1
        self.bytes_sent += size
        rng = self.rng
        faults = self.faults
        if (src, dst) in self._blocked or dst not in self._region:
            self.dropped += 1
            return []
        if faults.loss and rng.random() < faults.loss:
            self.dropped += 1
            return []
        copies = 2 if faults.duplicate and rng.random() < faults.duplicate else 1
        link = self._links.get((self._region[src], self._region[dst]), self.default_link)
        key = (src, dst)
        times = []
        for _ in range(copies):
            at = self.sim.now_ns + link.latency_ns
            if link.jitter_ns:
                at += rng.randrange(link.jitter_ns)
            # Jitter alone keeps a link first-in first-out; only the reorder fault lets a
            # message overtake another.
            at = max(at, self._link_last_at.get(key, 0))
            self._link_last_at[key] = at
            if faults.reorder and rng.random() < faults.reorder:
                at += rng.randrange(1, faults.reorder_delay_ns + 1)
            times.append(at)
        return times
