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
# Once a cycle is found, the most edge visits spent looking for a shorter one.
SHORTEST_SEARCH_VISITS_MAX = 200_000


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
        """A short cycle within `vertices`: one `anchor`-kind edge and a `path`-kind path.

        Returns ``(cycle, labels)``: cycle ``[t0, t1, ..., tn]`` means edges t0->t1, ...,
        tn->t0, the first being the anchor; ``labels[i]`` is the kind naming edge i. Every
        anchor that can close a cycle is tried, each with a breadth-first search cut off at
        the best length so far, until ``SHORTEST_SEARCH_VISITS_MAX`` edge visits are spent:
        the result is a shortest such cycle unless the component is large. None if there is
        no such cycle (or, in a subgraph too large for exact reachability, none was found
        within ``BOUNDED_SEARCH_VISITS_MAX`` visits).
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
        # An anchor closes a cycle when its target reaches its source along the path kinds:
        # always when both ends share a component of the path subgraph; otherwise (possible
        # only when the anchor kind is not a path kind) when the condensation says so.
        closable: list[tuple[int, int, set[int] | None]] = []
        members: dict[int, set[int]] = {}
        for source, target in anchors:
            number = component_of[source]
            if number == component_of[target]:
                if number not in members:
                    members[number] = set(components[number])
                closable.append((source, target, members[number]))
        if not anchor & path:
            reach = _component_reachability(components, component_of, path_successors)
            for source, target in anchors:
                if component_of[source] == component_of[target]:
                    continue
                if reach is None or reach[component_of[target]] >> component_of[source] & 1:
                    closable.append((source, target, None))
            exact = reach is not None
        else:
            exact = True
        best: list[int] | None = None
        best_source = -1
        visits_spent = 0
        for source, target, within in closable:
            if best is not None:
                if len(best) <= 2 or visits_spent >= SHORTEST_SEARCH_VISITS_MAX:
                    break
                depth_max: int | None = len(best) - 2  # path edges that would beat it
            else:
                if not exact and visits_spent >= BOUNDED_SEARCH_VISITS_MAX:
                    return None
                depth_max = None
            closing, visits = self._breadth_first_path(
                target, source, path, within if within is not None else vertices, depth_max
            )
            visits_spent += visits
            if closing is not None:
                best, best_source = closing, source
        if best is None:
            return None
        return self._labelled(best_source, best, anchor, path)

    def _labelled(
        self, source: int, closing: list[int], anchor: int, path: int
    ) -> tuple[list[int], list[int]]:
        # closing runs target ... source; the cycle is source -> target -> ... -> source.
        cycle = [source, *closing[:-1]]
        labels = [anchor]
        for i in range(1, len(cycle)):
            labels.append(edge_label(self.kinds(cycle[i], cycle[(i + 1) % len(cycle)]), path))
        return cycle, labels

    def _breadth_first_path(
        self, start: int, goal: int, kinds: int, within: set[int], depth_max: int | None
    ) -> tuple[list[int] | None, int]:
        """A shortest `kinds` path start..goal inside `within` of at most `depth_max` edges.

        Returns the path (or None) and the number of edges visited.
        """
        parent = {start: start}
        level = [start]
        depth = 0
        visits = 0
        successors = self.successors
        while level and (depth_max is None or depth < depth_max):
            depth += 1
            following = []
            for vertex in level:
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
                        return found, visits
                    following.append(target)
            level = following
        return None, visits


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
