"""Counters the servers' metrics are read from (``store/node/metrics.py`` serves them): pure
values, updated on the hot path at the cost of an increment or one bisection."""

from __future__ import annotations

from bisect import bisect_left
from typing import Final

MS: Final = 1_000_000

# Upper bounds of the latency buckets, in nanoseconds: 50 us to 10 s, roughly x2.5 apart
# (a transaction committed at once is a few microseconds; across regions, tens of ms).
LATENCY_BOUNDS_NS: Final = (
    50_000, 100_000, 250_000, 500_000, 1 * MS, 2 * MS + MS // 2, 5 * MS, 10 * MS, 25 * MS,
    50 * MS, 100 * MS, 250 * MS, 500 * MS, 1000 * MS, 2500 * MS, 10_000 * MS,
)

# Why transactions abort (``abort_cause``): the label values of the aborted counter.
ABORT_CAUSES: Final = ("conflict", "validation", "unreachable", "epoch", "changed-read", "other")


class LatencyHistogram:
    """Counts of observations per bucket (``LATENCY_BOUNDS_NS``; one more for above the
    last), their number and their sum."""

    __slots__ = ("counts", "observations", "sum_ns")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BOUNDS_NS) + 1)
        self.observations = 0
        self.sum_ns = 0

    def observe(self, ns: int) -> None:
        self.counts[bisect_left(LATENCY_BOUNDS_NS, ns)] += 1
        self.observations += 1
        self.sum_ns += ns


def abort_cause(detail: str) -> str:
    """The cause of an abort, from its detail (one place, so that every path is counted
    under a stable name): a lock held by another transaction, a read no longer valid, a
    participant that did not answer, the end of an epoch, a key read twice that changed."""
    if "conflict" in detail:
        return "conflict"
    if detail.startswith("validation"):
        return "validation"
    if detail.endswith("unreachable"):
        return "unreachable"
    if "epoch" in detail:
        return "epoch"
    if "changed between" in detail:
        return "changed-read"
    return "other"
