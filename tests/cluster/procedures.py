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


TRIPWIRE_KEY = "tripwire/invariant"


def register_tripwire(procedures: Procedures) -> None:
    """Arms, in the server process that loads it, a broken invariant: installing a version of
    ``TRIPWIRE_KEY`` fails an assertion inside the replica (as a protocol bug would)."""
    from store.core.storage import VersionedStore

    install = VersionedStore.install

    def tripped(self: VersionedStore, key: str, *args: object, **kwargs: object) -> object:
        assert key != TRIPWIRE_KEY, "tripwire: an invariant broken on purpose"
        return install(self, key, *args, **kwargs)  # type: ignore[arg-type]

    VersionedStore.install = tripped  # type: ignore[assignment,method-assign]
