"""Procedures the cluster tests load on the servers (named in their cluster file)."""

from __future__ import annotations

from store.core.txn import Procedures, Tx


async def raises(tx: Tx, key: str) -> None:
    tx.put(key, "should never be written")
    raise RuntimeError("a bug in a procedure")


async def typed(tx: Tx, key: str, amount: int) -> int:
    if not isinstance(amount, int):
        raise TypeError("amount must be an integer")
    return int(await tx.increment(key, amount))


def register(procedures: Procedures) -> None:
    procedures.register("raises", raises)
    procedures.register("typed", typed)
