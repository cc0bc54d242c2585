"""The list-append checker never reports an anomaly that is not there.

Random small histories come from a deliberately sloppy store (stale snapshots, lost, torn
and leaked appends, indeterminate and failed transactions). Whenever the checker calls one
invalid under strict serializability, a brute-force search must confirm that no order of
the transactions explains it: an order of all committed transactions and any subset of the
indeterminate ones, respecting real time (a transaction that completed before another was
invoked comes first), in which every committed read sees exactly the appends before it
(Papadimitriou's definition of serializability, with Herlihy and Wing's real-time order).
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jepsen.checkers.list_append import Txn, check_list_append, transactions
from jepsen.history import Op


def _sloppy_history(rng: random.Random, txn_count: int, processes: int = 3) -> list[Op]:
    keys = ["x", "y", "z"]
    state: dict[str, list[int]] = {k: [] for k in keys}
    snapshots: list[dict[str, list[int]]] = [{k: [] for k in keys}]
    ops: list[Op] = []
    running: dict[int, list[Any]] = {}
    element = 0
    started = 0
    deferred: list[tuple[str, list[int]]] = []

    def emit(type_: str, process: int, value: Any) -> None:
        ops.append(Op(type_, "txn", value, process, None, len(ops)))

    while started < txn_count or running:
        idle = [p for p in range(processes) if p not in running]
        if started < txn_count and idle and (not running or rng.random() < 0.5):
            process = rng.choice(idle)
            mops: list[list[Any]] = []
            for _ in range(rng.randint(1, 3)):
                key = rng.choice(keys)
                if rng.random() < 0.5:
                    mops.append(["r", key, None])
                else:
                    element += 1
                    mops.append(["append", key, element])
            running[process] = mops
            emit("invoke", process, [list(m) for m in mops])
            started += 1
            continue
        process = rng.choice(sorted(running))
        mops = running.pop(process)
        outcome = rng.choices(["ok", "fail", "info"], [0.8, 0.1, 0.1])[0]
        # Reads come from the current state or, sometimes, a stale snapshot.
        view = snapshots[rng.randrange(len(snapshots))] if rng.random() < 0.3 else state
        own: dict[str, list[int]] = {}
        completed = []
        for function, key, value in mops:
            if function == "r":
                completed.append(["r", key, [*view[key], *own.get(key, [])]])
            else:
                own.setdefault(key, []).append(value)
                completed.append(["append", key, value])
        applies = outcome == "ok" or (outcome == "info" and rng.random() < 0.5)
        if outcome == "fail" and rng.random() < 0.2:
            applies = True  # a failed transaction whose writes leak
        for key, elements in deferred:
            state[key] = [*state[key], *elements]
        deferred.clear()
        if applies:
            for key, elements in own.items():
                roll = rng.random()
                if roll < 0.1:
                    continue  # an append lost
                if roll < 0.2:
                    deferred.append((key, elements))  # torn: takes effect later
                else:
                    state[key] = [*state[key], *elements]
            snapshots.append({k: list(v) for k, v in state.items()})
        if outcome == "ok":
            emit("ok", process, completed)
        else:
            emit(outcome, process, [list(m) for m in mops])
    return ops


def _apply(txn: Txn, state: dict[str, tuple[int, ...]], check_reads: bool) -> Any:
    state = dict(state)
    for function, key, value in txn.mops:
        current = state.get(key, ())
        if function == "append":
            state[key] = (*current, value)
        elif check_reads and tuple(value or ()) != current:
            return None
    return state


def _serializable(history: list[Op], *, realtime: bool) -> bool:
    txns = [t for t in transactions(history) if t.type in ("ok", "info")]
    must_follow: dict[int, set[int]] = {t.id: set() for t in txns}
    for a in txns:
        for b in txns:
            if (
                realtime
                and a.complete_position is not None
                and a.complete_position < b.invoke_position
            ):
                must_follow[b.id].add(a.id)
    oks = {t.id for t in txns if t.type == "ok"}
    seen: set[tuple[frozenset[int], tuple[Any, ...]]] = set()

    def search(placed: frozenset[int], state: dict[str, tuple[int, ...]]) -> bool:
        if oks <= placed:
            return True
        memo = (placed, tuple(sorted(state.items())))
        if memo in seen:
            return False
        seen.add(memo)
        for txn in txns:
            if txn.id in placed or not must_follow[txn.id] <= placed:
                continue
            after = _apply(txn, state, check_reads=txn.type == "ok")
            if after is not None and search(placed | {txn.id}, after):
                return True
        # An indeterminate transaction need not take effect at all: it is never required.
        return False

    return search(frozenset(), {})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(min_value=0, max_value=2**32 - 1),
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=2, max_value=4),
    st.sampled_from(["strict-serializable", "serializable"]),
)
def test_reported_anomalies_are_real(seed: int, txn_count: int, processes: int, model: str) -> None:
    history = _sloppy_history(random.Random(seed), txn_count, processes)
    result = check_list_append(history, consistency_models=[model])
    if not result["valid"]:
        realtime = model == "strict-serializable"
        assert not _serializable(history, realtime=realtime), result["anomalies"]


def test_sloppy_store_is_caught_sometimes() -> None:
    # Guard against the test above passing vacuously.
    verdicts = [
        check_list_append(_sloppy_history(random.Random(seed), 6))["valid"] for seed in range(200)
    ]
    assert 20 < verdicts.count(False) < 180
