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
    return f"la/{k}"


class ListAppend:
    """Transactions of 1..max_ops micro-operations: append a unique value, or read a list."""

    name = "list-append"

    def __init__(
        self,
        rng: random.Random,
        active_keys: int = 6,
        max_ops: int = 4,
        appends_per_key_max: int = 24,
        read_fraction: float = 0.5,
    ) -> None:
        self.rng = rng
        self.max_ops = max_ops
        self.appends_per_key_max = appends_per_key_max
        self.read_fraction = read_fraction
        self.active = list(range(active_keys))
        self.next_key = active_keys
        self.appends: dict[int, int] = {}
        self.next_value = 1

    def next(self) -> Operation:
        rng = self.rng
        micro: list[list[Any]] = []
        ops: list[list[Any]] = []
        for _ in range(rng.randint(1, self.max_ops)):
            slot = rng.randrange(len(self.active))
            k = self.active[slot]
            if rng.random() < self.read_fraction:
                micro.append(["r", k, None])
                ops.append(["get", list_append_key(k)])
            else:
                value = self.next_value
                self.next_value += 1
                micro.append(["append", k, value])
                ops.append(["append", list_append_key(k), value])
                self.appends[k] = self.appends.get(k, 0) + 1
                if self.appends[k] >= self.appends_per_key_max:
                    self.active[slot] = self.next_key
                    self.next_key += 1

        def complete(results: Any) -> Any:
            done = []
            for (f, k, v), result in zip(micro, results, strict=True):
                if f == "r":
                    done.append(["r", k, list(result) if result is not None else []])
                else:
                    done.append([f, k, v])
            return done

        keys = [op[1] for op in ops]
        return Operation(OPS_PROCEDURE, [ops], "txn", micro, complete, keys)


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
        return Operation(
            "bank_transfer",
            [source, target, amount],
            "transfer",
            value,
            lambda _result, value=value: value,
            [bank_key(source), bank_key(target)],
        )


WORKLOADS = {"list-append": ListAppend, "bank": Bank}
