"""The simulated network: per-link latency and jitter, loss, duplication, reordering and
partitions, all drawn from the simulation's one seeded random source.

Nodes are registered by address and belong to a region; latency is looked up by region pair,
so later scenarios with several regions only add table entries. A node is anything with
``deliver(now_ns, src, message)``. A crashed node receives nothing until it is restarted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from store.sim.loop import Simulator

US = 1_000
MS = 1_000_000


class Node(Protocol):
    def deliver(self, now_ns: int, src: str, message: Any) -> None: ...


@dataclass
class Faults:
    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0  # chance a message is held back by up to reorder_delay_ns
    reorder_delay_ns: int = 2 * MS


@dataclass
class Link:
    latency_ns: int = 50 * US
    jitter_ns: int = 50 * US


class Network:
    def __init__(self, sim: Simulator, faults: Faults | None = None) -> None:
        self.sim = sim
        self.faults = faults or Faults()
        self._nodes: dict[str, Node] = {}
        self._region: dict[str, str] = {}
        self._links: dict[tuple[str, str], Link] = {}
        self.default_link = Link()
        self._blocked: set[tuple[str, str]] = set()
        self._down: set[str] = set()
        self.sent = 0
        self.delivered = 0
        self.dropped = 0

    # ---- topology ------------------------------------------------------------------------

    def add(self, address: str, node: Node, region: str = "local") -> None:
        self._nodes[address] = node
        self._region[address] = region
        self._down.discard(address)

    def replace(self, address: str, node: Node) -> None:
        """A restarted node takes the place of the crashed one."""
        self._nodes[address] = node
        self._down.discard(address)

    def crash(self, address: str) -> None:
        self._down.add(address)

    def is_down(self, address: str) -> bool:
        return address in self._down

    def set_link(self, region_a: str, region_b: str, link: Link) -> None:
        self._links[(region_a, region_b)] = link
        self._links[(region_b, region_a)] = link

    def region_of(self, address: str) -> str:
        return self._region[address]

    def addresses(self) -> list[str]:
        return list(self._nodes)

    # ---- partitions ----------------------------------------------------------------------

    def partition(self, side_a: Iterable[str], side_b: Iterable[str]) -> None:
        side_b = list(side_b)
        for a in side_a:
            for b in side_b:
                self._blocked.add((a, b))
                self._blocked.add((b, a))

    def heal(self) -> None:
        self._blocked.clear()

    def is_partitioned(self) -> bool:
        return bool(self._blocked)

    # ---- sending -------------------------------------------------------------------------

    def send(self, src: str, dst: str, message: Any) -> None:
        self.sent += 1
        rng = self.sim.rng
        faults = self.faults
        if (src, dst) in self._blocked or dst not in self._nodes:
            self.dropped += 1
            return
        if faults.loss and rng.random() < faults.loss:
            self.dropped += 1
            return
        copies = 2 if faults.duplicate and rng.random() < faults.duplicate else 1
        link = self._links.get((self._region[src], self._region[dst]), self.default_link)
        for _ in range(copies):
            delay = link.latency_ns + (rng.randrange(link.jitter_ns) if link.jitter_ns else 0)
            if faults.reorder and rng.random() < faults.reorder:
                delay += rng.randrange(faults.reorder_delay_ns)
            self.sim.after(delay, self._arrive, src, dst, message)

    def _arrive(self, src: str, dst: str, message: Any) -> None:
        if dst in self._down or (src, dst) in self._blocked:
            self.dropped += 1
            return
        self.delivered += 1
        self._nodes[dst].deliver(self.sim.now_ns, src, message)
