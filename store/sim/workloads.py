"""Workloads for simulated (and later real) clients: list-append and bank.

A workload hands each client its next operation: the transaction to submit (a procedure
name and arguments), the Jepsen ``:f`` and ``:value`` to record at invocation, and how to turn
the transaction's result into the ``:value`` of the completion. Key choice follows Elle's
advice for list-append: a small pool of active keys, each retired after a bounded number of
appends, so version orders stay short and every read is informative.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from store.core.txn import OPS_PROCEDURE, Procedures, Tx


@dataclass
class Operation:
    procedure: str
    args: list[Any]
    f: str
    value: Any
    complete: Callable[[Any], Any]
    keys: list[str]


def list_append_key(k: int) -> str:
    # Zero-padded, so that key order is number order and a range of keys is a range of k.
    return f"la/{k:06d}"


class ListAppend:
    """Transactions of 1..max_ops micro-operations: append a unique value, read a list, or
    (with ``scan_fraction``) scan a range of keys, from its end with ``reverse_fraction``.

    A scan's result enters the history as a read of every key of its range that the
    workload has ever handed out — absent keys read as empty lists — up to the last key
    returned when the scan was cut short by its limit, so the list-append checker sees
    phantoms: a key inserted into a scanned range is a read the scan must agree with.
    """

    name = "list-append"

    def __init__(
        self,
        rng: random.Random,
        active_keys: int = 6,
        max_ops: int = 4,
        appends_per_key_max: int = 24,
        read_fraction: float = 0.5,
        scan_fraction: float = 0.0,
        scan_span_max: int = 5,
        reverse_fraction: float = 0.0,
    ) -> None:
        self.rng = rng
        self.max_ops = max_ops
        self.appends_per_key_max = appends_per_key_max
        self.read_fraction = read_fraction
        self.scan_fraction = scan_fraction
        self.scan_span_max = scan_span_max
        self.reverse_fraction = reverse_fraction
        self.active = list(range(active_keys))
        self.next_key = active_keys
        self.appends: dict[int, int] = {}
        self.next_value = 1

    def next(self) -> Operation:
        rng = self.rng
        micro: list[list[Any]] = []
        ops: list[list[Any]] = []
        keys: list[str] = []
        for _ in range(rng.randint(1, self.max_ops)):
            slot = rng.randrange(len(self.active))
            k = self.active[slot]
            roll = rng.random()
            if roll < self.scan_fraction:
                lo = max(0, k - rng.randrange(self.scan_span_max))
                hi = lo + rng.randint(2, self.scan_span_max)
                limit = rng.randint(1, hi - lo)  # often short of the range: cut by its limit
                if self.reverse_fraction and rng.random() < self.reverse_fraction:
                    limit = -limit  # from the range's end, highest key first
                micro.append(["scan", lo, hi, limit])
                ops.append(["scan", list_append_key(lo), list_append_key(hi), limit])
                keys.append(list_append_key(lo))
            elif roll < self.scan_fraction + (1 - self.scan_fraction) * self.read_fraction:
                micro.append(["r", k, None])
                ops.append(["get", list_append_key(k)])
                keys.append(list_append_key(k))
            else:
                value = self.next_value
                self.next_value += 1
                micro.append(["append", k, value])
                ops.append(["append", list_append_key(k), value])
                keys.append(list_append_key(k))
                self.appends[k] = self.appends.get(k, 0) + 1
                if self.appends[k] >= self.appends_per_key_max:
                    self.active[slot] = self.next_key
                    self.next_key += 1

        def complete(results: Any) -> Any:
            done = []
            for mop, result in zip(micro, results, strict=True):
                if mop[0] == "scan":
                    done.extend(self._scan_reads(mop, result))
                elif mop[0] == "r":
                    done.append(["r", mop[1], list(result) if result is not None else []])
                else:
                    done.append(mop)
            return done

        return Operation(OPS_PROCEDURE, [ops], "txn", self._invoked(micro), complete, keys)

    def _invoked(self, micro: list[list[Any]]) -> list[list[Any]]:
        """The invocation's value: a scan is a read of every key of its range handed out."""
        value: list[list[Any]] = []
        for mop in micro:
            if mop[0] == "scan":
                value.extend(["r", k, None] for k in range(mop[1], min(mop[2], self.next_key)))
            else:
                value.append(mop)
        return value

    def _scan_reads(self, mop: list[Any], found: list[Any]) -> list[list[Any]]:
        _, lo, hi, limit = mop
        seen = {int(key.split("/", 1)[1]): list(value) for key, value in found}
        if len(found) >= abs(limit):  # cut short: nothing is known past the last key returned
            last = int(found[-1][0].split("/", 1)[1])
            if limit < 0:
                lo = last  # a reverse scan ends at its lowest key
            else:
                hi = last + 1
        return [["r", k, seen.get(k, [])] for k in range(lo, min(hi, self.next_key))]

    def snapshot_keys(self) -> list[str]:
        """Keys worth a follower snapshot read: the active ones."""
        return [list_append_key(k) for k in self.active]


def bank_key(account: int) -> str:
    return f"bank/{account}"


async def bank_transfer(tx: Tx, source: int, target: int, amount: int) -> int:
    balances = await tx.get_many([bank_key(source), bank_key(target)])
    if balances[0] < amount:
        tx.abort("insufficient funds")
    tx.put(bank_key(source), balances[0] - amount)
    tx.put(bank_key(target), balances[1] + amount)
    return int(balances[0] - amount)


async def bank_read(tx: Tx, accounts: int) -> dict[str, int]:
    balances = await tx.get_many([bank_key(a) for a in range(accounts)])
    return {str(a): b for a, b in enumerate(balances)}


def register_bank(procedures: Procedures) -> None:
    procedures.register("bank_transfer", bank_transfer)
    procedures.register("bank_read", bank_read)


class Bank:
    """Transfers between accounts and reads of all balances; the total never changes."""

    name = "bank"

    def __init__(
        self, rng: random.Random, accounts: int = 8, total: int = 100, read_fraction: float = 0.4
    ) -> None:
        self.rng = rng
        self.accounts = accounts
        self.total = total
        self.read_fraction = read_fraction

    def snapshot_keys(self) -> list[str]:
        return [bank_key(a) for a in range(self.accounts)]

    def initial_data(self) -> dict[str, int]:
        base, extra = divmod(self.total, self.accounts)
        return {bank_key(a): base + (1 if a < extra else 0) for a in range(self.accounts)}

    def next(self) -> Operation:
        rng = self.rng
        if rng.random() < self.read_fraction:
            keys = [bank_key(a) for a in range(self.accounts)]
            return Operation(
                "bank_read",
                [self.accounts],
                "read",
                None,
                lambda result: {int(a): b for a, b in result.items()},
                keys,
            )
        source, target = rng.sample(range(self.accounts), 2)
        amount = rng.randint(1, 5)
        value = {"from": source, "to": target, "amount": amount}

        def complete(_result: Any) -> Any:
            return value

        return Operation(
            "bank_transfer",
            [source, target, amount],
            "transfer",
            value,
            complete,
            [bank_key(source), bank_key(target)],
        )


WORKLOADS = {"list-append": ListAppend, "bank": Bank}
