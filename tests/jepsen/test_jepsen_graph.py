"""Strongly connected components and cycle search (jepsen.checkers.graph)."""

from __future__ import annotations

import pytest

from jepsen.checkers import graph as graph_module
from jepsen.checkers.graph import REALTIME, RW, WR, WW, DependencyGraph
from jepsen.checkers.graph import strongly_connected_components as sccs


def test_components_of_a_long_cycle_need_no_recursion() -> None:
    size = 100_000
    successors = {v: [(v + 1) % size] for v in range(size)}
    components = sccs(range(size), successors.__getitem__)
    assert len(components) == 1 and len(components[0]) == size


def test_components_come_out_sinks_first() -> None:
    successors = {0: [1], 1: [0, 2], 2: [3], 3: [2], 4: []}
    components = sccs([0, 1, 2, 3, 4], successors.__getitem__)
    assert [sorted(c) for c in components] == [[2, 3], [0, 1], [4]]


def _graph(edges: list[tuple[int, int, int]], size: int) -> DependencyGraph:
    g = DependencyGraph(size)
    for source, target, kind in edges:
        g.link(source, target, kind)
    return g


def test_shortest_cycle_through_an_anchor() -> None:
    # 0 -rw-> 1, then back to 0 by a long ww path (1..5) or a short wr one (1, 6).
    edges = [(0, 1, RW), (1, 2, WW), (2, 3, WW), (3, 4, WW), (4, 5, WW), (5, 0, WW)]
    edges += [(1, 6, WR), (6, 0, WR)]
    g = _graph(edges, 7)
    found = g.find_cycle(set(range(7)), RW, WW | WR)
    assert found == ([0, 1, 6], [RW, WR, WR])
    assert g.find_cycle(set(range(7)), RW, WW)[0] == [0, 1, 2, 3, 4, 5]  # type: ignore[index]
    assert g.find_cycle(set(range(7)), WR, WW) is None


def test_single_anchor_cycle_across_path_components() -> None:
    # The path subgraph (ww) is acyclic, so every vertex is its own component; the cycle
    # needs reachability from the anchor's target back to its source.
    edges = [(3, 0, RW), (0, 1, WW), (1, 2, WW), (2, 3, WW), (1, 3, RW)]
    g = _graph(edges, 4)
    # The anchor 1 -rw-> 3 has no ww path back (3 leaves only by rw); 3 -rw-> 0 has.
    assert g.find_cycle({0, 1, 2, 3}, RW, WW) == ([3, 0, 1, 2], [RW, WW, WW, WW])


def test_bounded_search_when_components_are_too_many(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graph_module, "REACHABILITY_COMPONENTS_MAX", 1)
    edges = [(3, 0, RW), (0, 1, WW), (1, 2, WW), (2, 3, WW)]
    g = _graph(edges, 4)
    assert g.find_cycle({0, 1, 2, 3}, RW, WW) == ([3, 0, 1, 2], [RW, WW, WW, WW])
    assert g.find_cycle({0, 1, 2, 3}, REALTIME, WW) is None


def test_an_edge_with_several_kinds_is_named_by_the_weakest_allowed() -> None:
    g = _graph([(0, 1, RW), (1, 0, WW), (1, 0, REALTIME)], 2)
    assert g.find_cycle({0, 1}, RW, WW | REALTIME) == ([0, 1], [RW, WW])
    assert g.find_cycle({0, 1}, RW, REALTIME) == ([0, 1], [RW, REALTIME])
