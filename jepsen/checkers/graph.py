"""Dependency graphs over transactions, strongly connected components, and cycle search.

Vertices are small ints (transaction ids). Each vertex keeps a dict from successor to a bit
set of relationship kinds, so an edge that is both a write-write and a real-time dependency
is one entry with two bits. Everything here is iterative: histories of tens of thousands of
transactions must not hit Python's recursion limit.

Cycle search follows Elle (Kingsbury and Alvaro, VLDB 2020, section 4.3): first split the
graph into strongly connected components (Tarjan), since every cycle lies within one, then
look in each component for a cycle of a particular shape. Every shape we look for is "a
cycle through one edge of kind A (the anchor) closed by a path of kinds P", and the shortest
such path comes from a breadth-first search. Whether the path exists at all is decided
first with components of the P-subgraph, so a failed search costs one Tarjan pass rather than
one BFS per anchor.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence

__all__ = [
    "PROCESS",
    "REALTIME",
    "RW",
    "WR",
    "WW",
    "DependencyGraph",
    "edge_label",
    "strongly_connected_components",
]

WW = 1
WR = 2
RW = 4
PROCESS = 8
REALTIME = 16

LABELS = {WW: "ww", WR: "wr", RW: "rw", PROCESS: "process", REALTIME: "realtime"}
# When an edge carries several kinds, name it by the first kind here that the search may use:
# data dependencies before time-order edges, and the weakest data dependency first.
_LABEL_PREFERENCE = (WW, WR, RW, PROCESS, REALTIME)

# Above this many components of a subgraph we stop building reachability bit sets (their
# size grows with the square) and answer reachability with bounded searches instead.
REACHABILITY_COMPONENTS_MAX = 20_000
# The most edge visits one bounded reachability search may spend, over all its anchors.
BOUNDED_SEARCH_VISITS_MAX = 2_000_000


def edge_label(bits: int, allowed: int) -> int:
    """The one kind (a bit) that names an edge with kinds `bits`, among `allowed` kinds."""
    for kind in _LABEL_PREFERENCE:
        if bits & allowed & kind:
            return kind
    raise AssertionError(f"edge kinds {bits} share nothing with {allowed}")


class DependencyGraph:
    """A directed graph with kind bits on edges. Vertices are ``0 .. size-1``."""

    def __init__(self, size: int) -> None:
        self.successors: list[dict[int, int]] = [{} for _ in range(size)]

    def __len__(self) -> int:
        return len(self.successors)

    def link(self, source: int, target: int, kind: int) -> bool:
        """Add `kind` to the edge source -> target; True if it was not there already.

        Self-edges are dropped: a transaction depending on itself is not a cycle between
        transactions (internal inconsistencies are checked separately).
        """
        if source == target:
            return False
        edges = self.successors[source]
        bits = edges.get(target, 0)
        if bits & kind:
            return False
        edges[target] = bits | kind
        return True

    def edge_count(self) -> int:
        return sum(len(edges) for edges in self.successors)

    def kinds(self, source: int, target: int) -> int:
        return self.successors[source].get(target, 0)

    def find_cycle(
        self, vertices: set[int], anchor: int, path: int
    ) -> tuple[list[int], list[int]] | None:
        """A cycle within `vertices` made of one `anchor`-kind edge and a `path`-kind path.

        Returns ``(cycle, labels)``: cycle ``[t0, t1, ..., tn]`` means edges t0->t1, ...,
        tn->t0, the first being the anchor; ``labels[i]`` is the kind naming edge i. The
        closing path is a shortest one. None if there is no such cycle (or, in a subgraph
        too large for exact reachability, none was found within the search bound).
        """
        successors = self.successors

        def path_successors(vertex: int) -> Iterable[int]:
            return [
                target
                for target, bits in successors[vertex].items()
                if bits & path and target in vertices
            ]

        components = strongly_connected_components(sorted(vertices), path_successors)
        component_of: dict[int, int] = {}
        for number, component in enumerate(components):
            for vertex in component:
                component_of[vertex] = number
        anchors = [
            (source, target)
            for source in sorted(vertices)
            for target, bits in successors[source].items()
            if bits & anchor and target in vertices
        ]
        # An anchor whose ends share a component of the path subgraph closes a cycle.
        for source, target in anchors:
            if component_of[source] == component_of[target]:
                members = set(components[component_of[target]])
                closing = self._shortest_path(target, source, path, members)
                assert closing is not None, "vertices of one component reach each other"
                return self._labelled(source, closing, anchor, path)
        if anchor & path:
            # The anchor kind is itself allowed on the path: a cycle through an anchor would
            # put both its ends in one component, and none did.
            return None
        reach = _component_reachability(components, component_of, path_successors)
        if reach is not None:
            for source, target in anchors:
                if reach[component_of[target]] >> component_of[source] & 1:
                    closing = self._shortest_path(target, source, path, vertices)
                    assert closing is not None
                    return self._labelled(source, closing, anchor, path)
            return None
        visits_left = BOUNDED_SEARCH_VISITS_MAX
        for source, target in anchors:
            closing, visits_left = self._bounded_shortest_path(
                target, source, path, vertices, visits_left
            )
            if closing is not None:
                return self._labelled(source, closing, anchor, path)
            if visits_left <= 0:
                return None
        return None

    def _labelled(
        self, source: int, closing: list[int], anchor: int, path: int
    ) -> tuple[list[int], list[int]]:
        # closing runs target ... source; the cycle is source -> target -> ... -> source.
        cycle = [source, *closing[:-1]]
        labels = [anchor]
        for i in range(1, len(cycle)):
            labels.append(edge_label(self.kinds(cycle[i], cycle[(i + 1) % len(cycle)]), path))
        return cycle, labels

    def _shortest_path(
        self, start: int, goal: int, kinds: int, within: set[int]
    ) -> list[int] | None:
        """Shortest `kinds` path start..goal inside `within` (BFS)."""
        found, _ = self._bounded_shortest_path(start, goal, kinds, within, None)
        return found

    def _bounded_shortest_path(
        self, start: int, goal: int, kinds: int, within: set[int], visits_max: int | None
    ) -> tuple[list[int] | None, int]:
        """Like _shortest_path, giving up after `visits_max` edge visits (None: never).

        Returns the path or None, and the visits left, so that a caller can spread one
        budget over many searches.
        """
        if start == goal:
            return [start], visits_max or 0
        parent = {start: start}
        queue = deque([start])
        visits = 0
        successors = self.successors
        while queue:
            vertex = queue.popleft()
            for target, bits in successors[vertex].items():
                visits += 1
                if not bits & kinds or target in parent or target not in within:
                    continue
                parent[target] = vertex
                if target == goal:
                    found = [goal]
                    while found[-1] != start:
                        found.append(parent[found[-1]])
                    found.reverse()
                    return found, 0 if visits_max is None else visits_max - visits
                queue.append(target)
            if visits_max is not None and visits >= visits_max:
                return None, 0
        return None, 0 if visits_max is None else visits_max - visits


def strongly_connected_components(
    vertices: Sequence[int], successors_of: Callable[[int], Iterable[int]]
) -> list[list[int]]:
    """Tarjan's algorithm without recursion.

    `successors_of(vertex)` gives the successors to follow. Components come out in reverse
    topological order of the condensation: a component is emitted after every component it
    reaches.
    """
    successors = successors_of
    index_of: dict[int, int] = {}
    lowlink: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    components: list[list[int]] = []
    counter = 0
    for root in vertices:
        if root in index_of:
            continue
        index_of[root] = lowlink[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(successors(root)))]
        while work:
            vertex, pending = work[-1]
            advanced = False
            for target in pending:
                if target not in index_of:
                    index_of[target] = lowlink[target] = counter
                    counter += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(successors(target))))
                    advanced = True
                    break
                if target in on_stack and index_of[target] < lowlink[vertex]:
                    lowlink[vertex] = index_of[target]
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                lowlink[parent] = min(lowlink[parent], lowlink[vertex])
            if lowlink[vertex] == index_of[vertex]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == vertex:
                        break
                components.append(component)
    return components


def _component_reachability(
    components: list[list[int]],
    component_of: dict[int, int],
    successors_of: Callable[[int], Iterable[int]],
) -> list[int] | None:
    """For each component, a bit set (an int) of the components it reaches, itself included.

    None when there are too many components for bit sets of this size.
    """
    if len(components) > REACHABILITY_COMPONENTS_MAX:
        return None
    reach = [0] * len(components)
    # Tarjan emits sinks first, so every successor component is complete before it is used.
    for number, component in enumerate(components):
        bits = 1 << number
        for vertex in component:
            for target in successors_of(vertex):
                other = component_of[target]
                if other != number:
                    bits |= reach[other]
        reach[number] = bits
    return reach
