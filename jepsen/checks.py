"""The checkers a Jepsen run applies to its history, and their results as ``results.edn``
keeps them: one map per checker, each with ``valid?``, and for the ones that find anomalies
``anomaly-types`` and ``anomalies`` (type -> examples).

list-append:

- ``elle``: the Elle-style checker (``jepsen.checkers.list_append``) for strict
  serializability, real-time edges included: G0, G1a/b/c, G-single, G2-item, lost updates...;
- ``committed-kept``: every element an ``:ok`` transaction appended is in the final read of
  its key (nothing a client was told COMMITTED is lost; type ``lost-committed``); for a key
  the workload cleared, in what the clear read of it before it cleared it;
- ``rolled-back``: no ``:ok`` read, final reads included, ever shows an element appended by a
  transaction answered ``RolledBack`` (a rolled-back transaction was never committed; type
  ``rolled-back-visible``). Elle sees those transactions as failed, so their elements read
  by an ``:ok`` transaction are also its G1a.

bank: ``bank`` (every ``:ok`` read sums to the total, no negative balance) and
``final-read`` (the final read exists: the cluster answered after healing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jepsen.checkers.bank import check_bank
from jepsen.checkers.list_append import check_list_append
from jepsen.history import Op

__all__ = ["check", "committed_kept", "rolled_back_invisible"]

EXAMPLES_MAX = 8
# The history's key for "key k was cleared" (store.sim.workloads.cleared_key).
CLEARED_PREFIX = "cleared/"


def check(workload: str, ops: Sequence[Op], total: int | None = None) -> dict[str, dict[str, Any]]:
    if workload == "list-append":
        elle = check_list_append(ops)
        return {
            "elle": {
                "valid?": elle["valid"],
                "anomaly-types": elle["anomaly_types"],
                "anomalies": elle["anomalies"],
                "anomaly-counts": elle["anomaly_counts"],
                "not": elle["not"],
                "also-not": elle["also_not"],
                "txn-count": elle["txn_count"],
            },
            "committed-kept": committed_kept(ops),
            "rolled-back": rolled_back_invisible(ops),
        }
    if workload == "bank":
        bank = check_bank(ops, total=total)
        finals = [op for op in ops if op.type == "ok" and op.extra.get("final")]
        result = {"valid?": bank["valid"], **{k.replace("_", "-"): v for k, v in bank.items() if k != "valid"}}
        if not bank["valid"]:
            result["anomaly-types"] = ["bank-total"]
            result["anomalies"] = {"bank-total": [bank.get("first_error")]}
        return {
            "bank": result,
            "final-read": {"valid?": bool(finals), "balances": finals[-1].value if finals else None},
        }
    raise ValueError(f"no checkers for workload {workload!r}")


def _appends(op: Op) -> list[tuple[Any, Any]]:
    if not isinstance(op.value, list):
        return []
    return [(m[1], m[2]) for m in op.value if isinstance(m, list) and m and m[0] == "append"]


def _reads(op: Op) -> list[tuple[Any, list[Any]]]:
    if not isinstance(op.value, list):
        return []
    return [
        (m[1], list(m[2] or []))
        for m in op.value if isinstance(m, list) and m and m[0] == "r" and m[2] is not None
    ]


def committed_kept(ops: Sequence[Op]) -> dict[str, Any]:
    final: dict[Any, list[Any]] = {}
    for op in ops:
        if op.type == "ok" and op.extra.get("final"):
            for key, shown in _reads(op):
                final[key] = shown
    # A key the workload cleared (store.sim.workloads.ListAppend): its final read is one of
    # ``cleared/k`` showing the clear's marker, and what the key held when it was cleared is
    # the clear's own read of it (an :ok clear), where every committed element must be.
    cleared: dict[Any, list[Any] | None] = {}
    for op in ops:
        if op.process == "nemesis" or op.type == "invoke":
            continue
        for marker_key, marker in _appends(op):
            if not (isinstance(marker_key, str) and marker_key.startswith(CLEARED_PREFIX)):
                continue
            key = int(marker_key[len(CLEARED_PREFIX):])
            if key in final or marker not in final.get(marker_key, ()):
                continue
            held = dict(_reads(op)).get(key) if op.type == "ok" else None
            cleared[key] = held  # None: the clear's outcome is unknown, so is what it held
    lost = []
    unread: set[Any] = set()
    unchecked: set[Any] = set()
    for op in ops:
        if op.type != "ok" or op.process == "nemesis":
            continue
        for key, element in _appends(op):
            values: list[Any] | None = final.get(key)
            if values is None and key in cleared:
                values = cleared[key]
                if values is None:
                    unchecked.add(key)
                    continue
            if values is None:
                unread.add(key)
            elif element not in values:
                lost.append({"key": key, "element": element, "op-index": op.index})
    result: dict[str, Any] = {
        "valid?": not lost and not unread,
        "keys-read": len(final),
        "lost-count": len(lost),
    }
    if cleared:
        result["keys-cleared"] = len(cleared)
    if unchecked:  # cleared by a clear whose outcome is unknown: what they held is unknown
        result["keys-cleared-unchecked"] = len(unchecked)
    if lost:
        result["anomaly-types"] = ["lost-committed"]
        result["anomalies"] = {"lost-committed": lost[:EXAMPLES_MAX]}
    if unread:
        result["keys-without-final-read"] = sorted(unread, key=str)[:EXAMPLES_MAX]
    return result


def rolled_back_invisible(ops: Sequence[Op]) -> dict[str, Any]:
    # An invocation carries the appends; the completion says it was rolled back.
    invoked: dict[Any, Op] = {}
    rolled: dict[tuple[Any, Any], int] = {}
    for op in ops:
        if op.process == "nemesis":
            continue
        if op.type == "invoke":
            invoked[op.process] = op
        elif op.type == "fail" and op.extra.get("error") == "rolled-back":
            source = invoked.get(op.process, op)
            for key, element in _appends(source):
                rolled[(key, element)] = op.index if op.index is not None else -1
    seen = []
    for op in ops:
        if op.type != "ok":
            continue
        for key, values in _reads(op):
            for element in values:
                if (key, element) in rolled:
                    seen.append({
                        "key": key, "element": element, "rolled-back-op": rolled[(key, element)],
                        "read-by-op": op.index,
                    })
    result: dict[str, Any] = {"valid?": not seen, "rolled-back-count": len(rolled)}
    if seen:
        result["anomaly-types"] = ["rolled-back-visible"]
        result["anomalies"] = {"rolled-back-visible": seen[:EXAMPLES_MAX]}
    return result
