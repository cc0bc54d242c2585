"""Building list-append histories by hand and at random, for tests of the checkers.

``HistoryBuilder`` writes invocations and completions in the order you call it, so a test
states concurrency explicitly: two invocations before either completion overlap in real
time. ``random_serializable_history`` produces a strictly serializable history of any size:
each transaction takes effect atomically at one moment between its invocation and its
completion, which is the definition, so the checker must find nothing in it.
"""

from __future__ import annotations

import random
from typing import Any

from jepsen.history import Op

__all__ = ["HistoryBuilder", "random_serializable_history"]


def _invocation_value(mops: list[list[Any]]) -> list[list[Any]]:
    return [[f, k, None] if f == "r" else [f, k, v] for f, k, v in mops]


class HistoryBuilder:
    """Accumulates ops; micro-ops are ``("append", k, e)`` and ``("r", k, [..])``."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self._pending: dict[int, list[list[Any]]] = {}

    def _add(self, type_: str, process: int, value: Any) -> None:
        index = len(self.ops)
        self.ops.append(Op(type_, "txn", value, process, index * 1000, index))

    def invoke(self, process: int, *mops: Any) -> HistoryBuilder:
        completed = [list(mop) for mop in mops]
        self._pending[process] = completed
        self._add("invoke", process, _invocation_value(completed))
        return self

    def complete(self, process: int, type_: str = "ok") -> HistoryBuilder:
        mops = self._pending.pop(process)
        self._add(type_, process, mops if type_ == "ok" else _invocation_value(mops))
        return self

    def txn(self, process: int, *mops: Any, type_: str = "ok") -> HistoryBuilder:
        """A transaction that nothing overlaps."""
        return self.invoke(process, *mops).complete(process, type_)


def random_serializable_history(
    rng: random.Random,
    txn_count: int,
    *,
    processes: int = 8,
    keys: int = 20,
    mops_max: int = 4,
    fail_probability: float = 0.05,
    info_probability: float = 0.02,
) -> list[Op]:
    """A strictly serializable list-append history of about ``2 * txn_count`` ops.

    Failed transactions never take effect. An ``:info`` transaction takes effect or not at
    random, and its process is then retired for a new one, as Jepsen does.
    """
    state: dict[int, list[int]] = {}
    next_element = 0
    ops: list[Op] = []
    idle = list(range(processes))
    next_process = processes
    # process -> [mops, outcome, applied?]
    running: dict[int, list[Any]] = {}
    started = 0

    def emit(type_: str, process: int, value: Any) -> None:
        ops.append(Op(type_, "txn", value, process, len(ops) * 1000, len(ops)))

    while started < txn_count or running:
        can_start = started < txn_count and idle
        if can_start and (not running or rng.random() < 0.5):
            process = idle.pop(rng.randrange(len(idle)))
            mops: list[list[Any]] = []
            for _ in range(rng.randint(1, mops_max)):
                key = rng.randrange(keys)
                if rng.random() < 0.5:
                    mops.append(["r", key, None])
                else:
                    next_element += 1
                    mops.append(["append", key, next_element])
            roll = rng.random()
            outcome = (
                "fail"
                if roll < fail_probability
                else "info"
                if roll < fail_probability + info_probability
                else "ok"
            )
            running[process] = [mops, outcome, False]
            emit("invoke", process, _invocation_value(mops))
            started += 1
            continue
        process = rng.choice(sorted(running))
        mops, outcome, applied = running[process]
        if not applied and outcome != "fail" and (outcome == "ok" or rng.random() < 0.5):
            # The transaction's moment of effect, strictly inside its interval.
            for mop in mops:
                function, key, element = mop
                if function == "append":
                    state.setdefault(key, []).append(element)
                else:
                    mop[2] = list(state.get(key, []))
            running[process][2] = True
            if outcome == "ok":
                continue
        if outcome == "ok" and not applied:
            continue
        del running[process]
        if outcome == "ok":
            emit("ok", process, mops)
            idle.append(process)
        elif outcome == "fail":
            emit("fail", process, _invocation_value(mops))
            idle.append(process)
        else:
            emit("info", process, _invocation_value(mops))
            idle.append(next_process)
            next_process += 1
    return ops
