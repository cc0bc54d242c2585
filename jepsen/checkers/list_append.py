"""An Elle-style checker for list-append histories.

Theory of operation (Kingsbury and Alvaro, "Elle: Inferring Isolation Anomalies from
Experimental Observations", VLDB 2020; Adya's dependency graphs, MIT 1999).

Every transaction is a list of micro-operations on keys whose values are lists:
``["append", k, e]`` adds element e to the end of k, ``["r", k, [e1, e2, ...]]`` reads it.
Every element is appended at most once per key (the workload guarantees it), so a read
names exactly the writes it saw, in the order they took effect.

1. *Pairing.* Each process runs one operation at a time, so an invocation pairs with the
   next completion of its process. A completion is ``:ok`` (committed), ``:fail`` (certainly
   aborted) or ``:info`` (unknown). Only ``:ok`` transactions' reads are evidence. ``:info``
   transactions may have committed: their appends may show up in reads, and they take part
   in the graph, but since they returned no reads and never completed they only ever gain
   edges from what others observed of them, so they cannot manufacture a cycle.
2. *Version order.* For each key, the committed reads must all be prefixes of one another
   (sorted by length, each a prefix of the next); otherwise the history has an
   ``incompatible-order``. The longest read is then the key's version order.
3. *Dependencies* between committed-or-maybe transactions, per key, from that order:
   ``ww``: T1 appended the element just before T2's; ``wr``: T2 read a list whose last
   element T1 appended; ``rw``: T1 read a list whose next element T2 appended. An append
   that no read ever shows took effect after every element that reads show (had it come
   earlier, the longest read would contain it), so it gets a ``ww`` edge from the last
   shown element's writer and ``rw`` edges from the readers of the longest state. This is
   the sound inference that a committed read which lacks a committed append's element
   precedes that append; along the ``ww`` chain it relates every such reader to every such
   appender with a linear number of edges. A read that ends at another transaction's
   intermediate append (G1b, below) gives no ``wr`` edge: as in Adya's graphs, only a
   transaction's final version of a key is a version others depend on.
4. *Time.* For strict serializability, T1 -> T2 (``realtime``) when T1 completed before T2
   was invoked, in history order; we keep only the transitive reduction (edges from the
   "frontier" of latest completions), a few per transaction. Optionally ``process`` edges
   instead: consecutive transactions of one process.
5. *Cycles.* Tarjan's algorithm splits the graph into strongly connected components; in each
   we look, strongest anomaly first, for a cycle of each class and report the shortest found:

   - ``G0``: only ww edges; ``G1c``: ww and wr, at least one wr;
   - ``G-single``: exactly one rw edge; ``G2-item``: two or more rw edges;
   - ``<class>-realtime`` (or ``-process``): the class needs at least one time-order edge.

   A class implied by one already found in the component is not searched (a G0 cycle is
   also a G1c cycle), as in Elle.
6. *Non-cyclic anomalies*, read straight off the history: ``G1a`` (a committed read shows an
   element appended by a ``:fail`` transaction), ``G1b`` (a committed read ends at an
   element that its writer followed with another append to the same key), ``internal`` (a
   read disagrees with the transaction's own earlier reads and appends, or shows an element
   the transaction appends only later), ``duplicate-elements`` (a read shows an element
   twice), ``incompatible-order`` (above) and ``lost-update`` (two committed transactions
   read the same state of a key and both appended to it).

The result names the weakest consistency models the anomalies rule out (``not``), after
Elle's hierarchy; see ``jepsen.checkers.consistency``.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jepsen.checkers import consistency
from jepsen.checkers.graph import (
    LABELS,
    PROCESS,
    REALTIME,
    RW,
    WR,
    WW,
    DependencyGraph,
    strongly_connected_components,
)
from jepsen.history import Op

__all__ = ["InvalidHistory", "Txn", "check_list_append", "transactions"]

EXAMPLES_PER_TYPE_DEFAULT = 8
UNKNOWN_PREFIX = "..."

# Cycle classes in search order (strongest first), as (name, anchor kind, closing path kinds).
# Each is "a cycle through one anchor edge, closed by a path of the given kinds"; see
# DependencyGraph.find_cycle and the notes in _cycle_specs on why each search is exact.
_DATA_SPECS = (
    ("G0", WW, WW),
    ("G1c", WR, WW | WR),
    ("G-single", RW, WW | WR),
    ("G2-item", RW, WW | WR | RW),
)


class InvalidHistory(ValueError):
    """The history breaks the list-append workload's rules, so it cannot be checked."""


@dataclass(slots=True)
class Txn:
    """One transaction: an invocation paired with its completion."""

    id: int
    type: str  # "ok", "fail" or "info"
    process: Any
    mops: list[list[Any]]
    invoke: Op | None
    complete: Op | None
    invoke_position: int  # place in the history; -1 if the invocation is missing
    complete_position: int | None  # None unless it completed (ok or fail)
    appends: dict[Any, list[Any]] = field(default_factory=dict)

    @property
    def op(self) -> Op:
        op = self.complete or self.invoke
        assert op is not None
        return op

    @property
    def name(self) -> str:
        return f"T{self.op.index}"

    def summary(self) -> dict[str, Any]:
        op = self.op
        return {"index": op.index, "process": op.process, "type": self.type, "value": self.mops}


def _is_mop_list(value: Any) -> bool:
    return isinstance(value, list | tuple) and all(
        isinstance(mop, list | tuple) and len(mop) == 3 and isinstance(mop[0], str) for mop in value
    )


def transactions(history: Sequence[Op]) -> list[Txn]:
    """Pair invocations and completions of client processes into transactions.

    Operations of non-integer processes (the nemesis) and operations whose value is not a
    list of micro-operations are skipped. An invocation that never completes is ``info``.
    """
    pending: dict[Any, tuple[Op, int]] = {}
    txns: list[Txn] = []

    def add(
        type_: str, invoke: Op | None, complete: Op | None, start: int, end: int | None
    ) -> None:
        invoke_value = invoke.value if invoke is not None else None
        complete_value = complete.value if complete is not None else None
        if type_ == "ok":
            value = complete_value
        else:
            value = complete_value if _is_mop_list(complete_value) else invoke_value
        if not _is_mop_list(value):
            return
        assert value is not None
        for mop in value:
            if mop[0] not in ("append", "r"):
                raise InvalidHistory(f"micro-op {mop!r} is neither an append nor a read")
        op = complete or invoke
        assert op is not None
        txns.append(
            Txn(
                len(txns), type_, op.process, [list(m) for m in value], invoke, complete, start, end
            )
        )

    for position, op in enumerate(history):
        if isinstance(op.process, str | bool) or op.process is None:
            continue
        if op.type == "invoke":
            if op.process in pending:
                stale, start = pending.pop(op.process)
                add("info", stale, None, start, None)
            pending[op.process] = (op, position)
            continue
        invoke, start = pending.pop(op.process, (None, -1))
        if op.type == "info":
            add("info", invoke, op, start, None)
        else:
            add(str(op.type), invoke, op, start, position)
    for invoke, start in pending.values():
        add("info", invoke, None, start, None)
    txns.sort(key=lambda txn: (txn.invoke_position, txn.op.index or 0))
    for number, txn in enumerate(txns):
        txn.id = number
    return txns


def _read_value(value: Any) -> list[Any]:
    # A committed read of an absent key may be reported as nil: the empty list.
    if value is None:
        return []
    return value if isinstance(value, list) else list(value)


class _Checker:
    def __init__(self, txns: list[Txn], variant: int | None, examples_max: int) -> None:
        self.txns = txns
        self.variant = variant
        self.examples_max = examples_max
        self.anomalies: dict[str, list[dict[str, Any]]] = {}
        self.counts: Counter[str] = Counter()
        self.graph = DependencyGraph(len(txns))
        self.reasons: dict[tuple[int, int, int], tuple[Any, Any, Any]] = {}
        self.in_graph = [txn.type in ("ok", "info") for txn in txns]
        self.writer: dict[tuple[Any, Any], Txn] = {}
        self.intermediate: set[tuple[Any, Any]] = set()
        self._committed_reads: list[tuple[Txn, int, Any, list[Any]]] | None = None
        self.duplicate_reads: set[tuple[int, int]] = set()

    def wants(self, kind: str) -> bool:
        """Count one anomaly of `kind`; True if its explanation should be kept.

        Explanations are capped per type, and building them is the costly part in a badly
        broken history, so callers build one only when it is wanted.
        """
        self.counts[kind] += 1
        self.anomalies.setdefault(kind, [])
        return len(self.anomalies[kind]) < self.examples_max

    def report(self, kind: str, explanation: dict[str, Any]) -> None:
        """Keep an explanation; only after wants(kind) returned True."""
        self.anomalies[kind].append(explanation)

    # -- Indexes ---------------------------------------------------------------------------

    def index_writes(self) -> None:
        for txn in self.txns:
            last_element: dict[Any, Any] = {}
            for function, key, element in txn.mops:
                if function != "append":
                    continue
                if (key, element) in self.writer:
                    other = self.writer[(key, element)]
                    raise InvalidHistory(
                        f"element {element!r} appended to key {key!r} by both {other.name} "
                        f"and {txn.name}; list-append needs unique elements per key"
                    )
                self.writer[(key, element)] = txn
                txn.appends.setdefault(key, []).append(element)
                if key in last_element:
                    self.intermediate.add((key, last_element[key]))
                last_element[key] = element

    def committed_reads(self) -> list[tuple[Txn, int, Any, list[Any]]]:
        if self._committed_reads is None:
            self._committed_reads = [
                (txn, position, key, _read_value(value))
                for txn in self.txns
                if txn.type == "ok"
                for position, (function, key, value) in enumerate(txn.mops)
                if function == "r"
            ]
        return self._committed_reads

    # -- Anomalies read straight off the history ------------------------------------------

    def check_internal(self) -> None:
        for txn in self.txns:
            if txn.type != "ok":
                continue
            # key -> (whole list known?, the list, or its known suffix)
            state: dict[Any, tuple[bool, list[Any]]] = {}
            for position, (function, key, value) in enumerate(txn.mops):
                if function == "append":
                    known, elements = state.get(key, (False, []))
                    state[key] = (known, [*elements, value])
                    continue
                observed = _read_value(value)
                later = set(txn.appends.get(key, ())) - {
                    m[2] for m in txn.mops[:position] if m[0] == "append" and m[1] == key
                }
                future = [element for element in observed if element in later] if later else []
                if future:
                    if self.wants("internal"):
                        self.report(
                            "internal",
                            {
                                "op": txn.summary(),
                                "mop": txn.mops[position],
                                "future": future,
                                "explanation": f"{txn.name} read {future!r} of key {key!r} "
                                "before appending them itself",
                            },
                        )
                    break
                if key in state:
                    known, elements = state[key]
                    if known:
                        bad = observed != elements
                    else:
                        start = len(observed) - len(elements)
                        bad = start < 0 or observed[start:] != elements
                    if bad:
                        expected = elements if known else [UNKNOWN_PREFIX, *elements]
                        if self.wants("internal"):
                            self.report(
                                "internal",
                                {
                                    "op": txn.summary(),
                                    "mop": txn.mops[position],
                                    "expected": expected,
                                    "explanation": f"{txn.name} read {observed!r} of key "
                                    f"{key!r}, but its own earlier operations imply {expected!r}",
                                },
                            )
                        break
                state[key] = (True, observed)

    def check_reads(self) -> None:
        """G1a, G1b and duplicate elements, read by read."""
        # Reads can be long; test whole reads against per-key sets rather than element by
        # element through the writer index.
        failed_elements: dict[Any, set[Any]] = defaultdict(set)
        for (key, element), writer in self.writer.items():
            if writer.type == "fail":
                failed_elements[key].add(element)
        for txn, position, key, observed in self.committed_reads():
            mop = txn.mops[position]
            if len(set(observed)) != len(observed):
                self.duplicate_reads.add((txn.id, position))
                counts = Counter(observed)
                if self.wants("duplicate-elements"):
                    self.report(
                        "duplicate-elements",
                        {
                            "op": txn.summary(),
                            "mop": mop,
                            "duplicates": {e: n for e, n in counts.items() if n > 1},
                        },
                    )
            failed = failed_elements.get(key)
            hits = failed.intersection(observed) if failed else None
            if hits:
                self.counts["G1a"] += len(hits) - 1  # wants() below counts the first
                if self.wants("G1a"):
                    for element in [e for e in observed if e in hits][: self.examples_max]:
                        writer = self.writer[(key, element)]
                        if len(self.anomalies["G1a"]) >= self.examples_max:
                            break
                        self.report(
                            "G1a",
                            {
                                "op": txn.summary(),
                                "mop": mop,
                                "writer": writer.summary(),
                                "element": element,
                                "explanation": f"{txn.name} read element {element!r} of key "
                                f"{key!r}, appended by {writer.name}, which failed",
                            },
                        )
            if observed:
                last = observed[-1]
                last_writer = self.writer.get((key, last))
                intermediate = last_writer is not None and (key, last) in self.intermediate
                if intermediate and last_writer is not txn and self.wants("G1b"):
                    assert last_writer is not None
                    self.report(
                        "G1b",
                        {
                            "op": txn.summary(),
                            "mop": mop,
                            "writer": last_writer.summary(),
                            "element": last,
                            "explanation": f"{txn.name} read key {key!r} ending at "
                            f"{last!r}, an intermediate append of {last_writer.name}, which "
                            "appended to that key again",
                        },
                    )

    def check_lost_updates(self) -> None:
        # key -> first external read value -> transactions that then appended to the key
        readers: dict[Any, dict[tuple[Any, ...], list[Txn]]] = defaultdict(
            lambda: defaultdict(list)
        )
        for txn in self.txns:
            if txn.type != "ok":
                continue
            first_read: dict[Any, tuple[Any, ...]] = {}
            written: set[Any] = set()
            for function, key, value in txn.mops:
                if function == "r":
                    if key not in first_read and key not in written:
                        first_read[key] = tuple(_read_value(value))
                elif key not in written:
                    written.add(key)
                    if key in first_read:
                        readers[key][first_read[key]].append(txn)
        for key, by_value in readers.items():
            for value, txns in by_value.items():
                if len(txns) > 1 and self.wants("lost-update"):
                    self.report(
                        "lost-update",
                        {
                            "key": key,
                            "value": list(value),
                            "txns": [txn.summary() for txn in txns],
                            "explanation": f"{', '.join(t.name for t in txns)} all read key "
                            f"{key!r} as {list(value)!r} and all appended to it",
                        },
                    )

    def version_orders(self) -> dict[Any, list[Any]]:
        """Per key, the longest committed read (deduplicated); reports incompatible orders."""
        values: dict[Any, set[tuple[Any, ...]]] = defaultdict(set)
        for _txn, _position, key, observed in self.committed_reads():
            if observed:
                values[key].add(tuple(observed))
        orders: dict[Any, list[Any]] = {}
        for key, seen in values.items():
            ordered = _by_length(seen)
            for shorter, longer in itertools.pairwise(ordered):
                if longer[: len(shorter)] != shorter:
                    if self.wants("incompatible-order"):
                        self.report(
                            "incompatible-order",
                            {
                                "key": key,
                                "values": [list(shorter), list(longer)],
                                "explanation": f"key {key!r} was read as {list(shorter)!r} and "
                                f"as {list(longer)!r}; neither is a prefix of the other",
                            },
                        )
                    break
            orders[key] = list(dict.fromkeys(ordered[-1]))
        return orders

    # -- The dependency graph --------------------------------------------------------------

    def link(self, source: Txn, target: Txn, kind: int, reason: tuple[Any, Any, Any]) -> None:
        if not (self.in_graph[source.id] and self.in_graph[target.id]):
            return
        if self.graph.link(source.id, target.id, kind):
            self.reasons[(source.id, target.id, kind)] = reason

    def add_data_edges(self, orders: dict[Any, list[Any]]) -> None:
        writer = self.writer
        position_of = {key: {e: i for i, e in enumerate(order)} for key, order in orders.items()}
        unobserved: dict[Any, list[tuple[Txn, Any]]] = defaultdict(list)
        for txn in self.txns:
            if not self.in_graph[txn.id]:
                continue
            for key, elements in txn.appends.items():
                positions = position_of.get(key, {})
                unobserved[key].extend((txn, e) for e in elements if e not in positions)
        for key, order in orders.items():
            for before, after in itertools.pairwise(order):
                if (key, before) in writer and (key, after) in writer:
                    self.link(writer[(key, before)], writer[(key, after)], WW, (key, before, after))
        for key, appends in unobserved.items():
            order = orders.get(key, [])
            if order and (key, order[-1]) in writer:
                last_writer = writer[(key, order[-1])]
                for txn, element in appends:
                    self.link(last_writer, txn, WW, (key, order[-1], element))
        for reader, position, key, observed in self.committed_reads():
            order = orders.get(key, [])
            if observed:
                # A read with duplicates (reported already) counts as its first occurrences,
                # like the version order.
                if (reader.id, position) in self.duplicate_reads:
                    observed = list(dict.fromkeys(observed))
                last = observed[-1]
                source = writer.get((key, last))
                # Adya's graphs relate only a transaction's final versions: reading an
                # intermediate one is G1b, reported on its own, and makes no wr edge.
                if source is not None and (key, last) not in self.intermediate:
                    self.link(source, reader, WR, (key, last, None))
                following = position_of.get(key, {}).get(last)
                if following is None:
                    continue  # not in the version order: an incompatible read
                following += 1
            else:
                last, following = None, 0
            if following < len(order):
                element = order[following]
                if (key, element) in writer:
                    self.link(reader, writer[(key, element)], RW, (key, last, element))
            else:
                for txn, element in unobserved.get(key, ()):
                    self.link(reader, txn, RW, (key, last, element))

    def add_time_edges(self) -> None:
        if self.variant == REALTIME:
            self._add_realtime_edges()
        elif self.variant == PROCESS:
            previous: dict[Any, Txn] = {}
            for txn in self.txns:
                if not self.in_graph[txn.id]:
                    continue
                if txn.process in previous:
                    self.link(previous[txn.process], txn, PROCESS, (None, None, None))
                # An indeterminate transaction may take effect after its process moved on (a
                # harness may reuse the process), so it precedes nothing.
                if txn.type == "ok":
                    previous[txn.process] = txn

    def _add_realtime_edges(self) -> None:
        # T1 -> T2 when T1 completed before T2 was invoked. The frontier holds completed
        # transactions not yet known to precede another completed one; an edge from an older
        # transaction follows from the path through the newer, so we leave it out.
        events: list[tuple[int, int, Txn]] = []
        for txn in self.txns:
            if not self.in_graph[txn.id]:
                continue
            events.append((txn.invoke_position, 1, txn))
            if txn.type == "ok" and txn.complete_position is not None:
                events.append((txn.complete_position, 0, txn))
        events.sort(key=lambda event: (event[0], event[1], event[2].id))
        frontier: dict[int, Txn] = {}
        predecessors: dict[int, list[int]] = {}
        for _position, is_invoke, txn in events:
            if is_invoke:
                predecessors[txn.id] = list(frontier)
                for earlier in frontier.values():
                    self.link(earlier, txn, REALTIME, (None, None, None))
            else:
                for earlier_id in predecessors.get(txn.id, ()):
                    frontier.pop(earlier_id, None)
                frontier[txn.id] = txn

    # -- Cycles ----------------------------------------------------------------------------

    def _cycle_specs(self) -> list[tuple[str, int, int]]:
        specs = list(_DATA_SPECS)
        if self.variant is not None:
            suffix = "-realtime" if self.variant == REALTIME else "-process"
            time = self.variant
            # Each variant is searched only when the classes it would follow from are absent
            # from the component (see find_cycles), so any cycle found needs a time edge:
            # G1c-<t> runs only without G0, G1c and G0-<t>, so its cycle has both wr and a time
            # edge; G-single-<t> only without G-single; G2-item-<t> only without any data
            # cycle through an rw edge and without a single-rw cycle.
            specs += [
                ("G0" + suffix, time, WW | time),
                ("G1c" + suffix, time, WW | WR | time),
                ("G-single" + suffix, RW, WW | WR | time),
                ("G2-item" + suffix, RW, WW | WR | RW | time),
            ]
        return specs

    def find_cycles(self) -> None:
        graph = self.graph
        vertices = [txn.id for txn in self.txns if self.in_graph[txn.id]]
        components = strongly_connected_components(
            vertices, lambda vertex: graph.successors[vertex].keys()
        )
        specs = self._cycle_specs()
        for component in sorted((c for c in components if len(c) > 1), key=min):
            members = set(component)
            implied: set[str] = set()
            for name, anchor, path in specs:
                if name in implied:
                    continue
                found = graph.find_cycle(members, anchor, path)
                if found is None:
                    continue
                cycle, labels = found
                kind = _classify(labels)
                if self.wants(kind):
                    self.report(kind, self.explain_cycle(kind, cycle, labels))
                implied |= _implied_by(kind)

    def explain_cycle(self, kind: str, cycle: list[int], labels: list[int]) -> dict[str, Any]:
        txns = [self.txns[vertex] for vertex in cycle]
        steps = []
        for i, label in enumerate(labels):
            source, target = txns[i], txns[(i + 1) % len(txns)]
            key, value, value_after = self.reasons[(source.id, target.id, label)]
            step: dict[str, Any] = {
                "type": LABELS[label],
                "from": source.op.index,
                "to": target.op.index,
            }
            if label in (WW, WR, RW):
                step["key"] = key
                step["value"] = value
                if label != WR:
                    step["value'"] = value_after
            step["explanation"] = _explain_step(label, source, target, key, value, value_after)
            steps.append(step)
        return {"type": kind, "cycle": [txn.summary() for txn in txns], "steps": steps}


def _by_length(values: set[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Sorted by length; equal lengths (only in incompatible orders) by their text, so the
    result does not depend on per-process string hashing."""
    by_length: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for value in values:
        by_length[len(value)].append(value)
    ordered: list[tuple[Any, ...]] = []
    for length in sorted(by_length):
        group = by_length[length]
        ordered.extend(group if len(group) == 1 else sorted(group, key=repr))
    return ordered


def _explain_step(label: int, a: Txn, b: Txn, key: Any, value: Any, value_after: Any) -> str:
    if label == WW:
        return f"{b.name} appended {value_after!r} after {a.name} appended {value!r} to {key!r}"
    if label == WR:
        return f"{b.name} observed {a.name}'s append of {value!r} to {key!r}"
    if label == RW:
        if value is None:
            return (
                f"{a.name} observed the initial (empty) state of {key!r}, which {b.name} "
                f"changed by appending {value_after!r}"
            )
        return f"{a.name} did not observe {b.name}'s append of {value_after!r} to {key!r}"
    if label == PROCESS:
        return f"process {a.process} ran {a.name} before {b.name}"
    return f"{a.name} completed before {b.name} was invoked"


def _classify(labels: list[int]) -> str:
    counts = Counter(labels)
    if counts[RW] == 1:
        base = "G-single"
    elif counts[RW] > 1:
        base = "G2-item"
    elif counts[WR]:
        base = "G1c"
    else:
        base = "G0"
    if counts[REALTIME]:
        return base + "-realtime"
    if counts[PROCESS]:
        return base + "-process"
    return base


_CYCLE_NAMES = tuple(
    name + suffix
    for name in ("G0", "G1c", "G-single", "G2-item")
    for suffix in ("", "-process", "-realtime")
)


def _implied_by(kind: str) -> set[str]:
    """Our cycle classes that a found `kind` already implies (Elle's implied anomalies)."""
    return {name for name in _CYCLE_NAMES if consistency.implies(kind, name)}


def check_list_append(
    history: Sequence[Op],
    *,
    consistency_models: Iterable[str] = ("strict-serializable",),
    realtime: bool | None = None,
    process: bool = False,
    examples_max: int = EXAMPLES_PER_TYPE_DEFAULT,
) -> dict[str, Any]:
    """Check a list-append history. See the module docstring for what is checked.

    `consistency_models` decides ``valid``: the history is valid when it shows no anomaly
    those models prohibit. `realtime` adds real-time edges (default: when a model needs
    them, as strict serializability does); `process` adds per-process order edges instead
    when real-time edges are off. At most `examples_max` explanations are kept per type.

    Returns a dict:

    - ``valid`` (bool);
    - ``anomaly_types``: sorted list of the anomaly types found;
    - ``anomalies``: type -> list of explanations (dicts). Cycle explanations have ``type``,
      ``cycle`` (the transactions, each ``{index, process, type, value}``) and ``steps``
      (one per edge, cycle[i] -> cycle[i+1] and the last back to the first: ``type`` of
      ``ww wr rw realtime process``, ``from``/``to`` op indexes, ``key``, ``value`` and for
      ww/rw ``value'`` (the element appended at the target), and ``explanation``). Other
      anomalies carry the ``op`` and ``mop`` (or ``key``/``values``/``txns``) showing them;
    - ``anomaly_counts``: type -> number found (explanations are capped, counts are not);
    - ``not``: the weakest consistency models these anomalies rule out; ``also_not``: the
      stronger ones also ruled out (both sorted);
    - ``txn_count``, ``ok_count``, ``info_count``, ``fail_count``, ``edge_count``.

    Raises InvalidHistory when the history breaks the workload's rules (micro-ops other
    than append and read; an element appended twice to one key).
    """
    models = list(consistency_models)
    prohibited = consistency.anomalies_prohibited_by(models)
    if realtime is None:
        realtime = any(name.endswith("-realtime") for name in prohibited)
    variant = REALTIME if realtime else PROCESS if process else None
    txns = transactions(history)
    checker = _Checker(txns, variant, examples_max)
    checker.index_writes()
    checker.check_internal()
    checker.check_reads()
    checker.check_lost_updates()
    orders = checker.version_orders()
    checker.add_data_edges(orders)
    checker.add_time_edges()
    checker.find_cycles()
    types = sorted(checker.anomalies)
    not_models, also_not = consistency.boundary(types)
    types_counts = Counter(txn.type for txn in txns)
    return {
        "valid": not any(kind in prohibited for kind in types),
        "anomaly_types": types,
        "anomalies": {kind: checker.anomalies[kind] for kind in types},
        "anomaly_counts": {kind: checker.counts[kind] for kind in types},
        "not": not_models,
        "also_not": also_not,
        "txn_count": len(txns),
        "ok_count": types_counts["ok"],
        "info_count": types_counts["info"],
        "fail_count": types_counts["fail"],
        "edge_count": checker.graph.edge_count(),
    }
