"""A tiny TPC-C database on the in-process cluster, shared by the TPC-C tests."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

from bench.tpcc import loader, procedures, schema
from bench.tpcc.local import load, replica_rows
from bench.tpcc.schema import Key
from store.core.keys import pack
from store.core.txn import Procedures
from store.sim.local import LocalCluster

# Small enough that loading takes milliseconds, large enough for every code path: several
# districts' worth of undelivered orders and more items than a New-Order asks for.
TINY = schema.Scale(items=200, customers_per_district=30, new_orders_per_district=9)


@functools.cache
def _generated(
    warehouses: tuple[int, ...], shard_count: int, scale: schema.Scale, seed: int
) -> loader.InitialRows:
    return loader.initial_rows(warehouses, schema.Layout(shard_count), scale, seed=seed)


def _copy(rows: dict[Key, Any]) -> dict[Key, Any]:
    """Rows are flat dicts: copying each keeps the cached generation pristine."""
    return {key: dict(value) if isinstance(value, dict) else value for key, value in rows.items()}


class Tiny:
    """A loaded cluster plus the helpers the tests use."""

    def __init__(
        self,
        warehouses: list[int],
        shard_count: int,
        scale: schema.Scale = TINY,
        seed: int = 7,
        edit: Callable[[dict[Key, Any]], None] | None = None,
    ) -> None:
        self.warehouses = warehouses
        self.shard_count = shard_count
        self.layout = schema.Layout(shard_count)
        self.scale = scale
        registry = Procedures()
        procedures.register(registry)
        self.cluster = LocalCluster(shard_count, registry, schema.partitioner(shard_count))
        self.initial = _copy(_generated(tuple(warehouses), shard_count, scale, seed).all())
        if edit is not None:
            edit(self.initial)
        initial = loader.InitialRows([{} for _ in range(shard_count)], {})
        for key, value in self.initial.items():
            if key[0] in schema.REPLICATED_TABLES:
                initial.items[key] = value
            else:
                initial.by_shard[self.layout.unit_of(key[1])][key] = value
        load(self.cluster, initial)

    def run(self, name: str, w_id: int, *args: Any) -> Any:
        """Runs a TPC-C procedure at its home warehouse's shard."""
        shard = self.layout.unit_of(w_id)
        return self.cluster.run(name, w_id, *args, shard=shard)

    def rows(self) -> dict[Key, Any]:
        return replica_rows(self.cluster)

    def get(self, key: Key) -> Any:
        return self.cluster.get(pack(key))


@pytest.fixture
def tiny() -> Tiny:
    """Warehouses 1 and 2 on two shards (1 on shard 1, 2 on shard 0)."""
    return Tiny([1, 2], 2)
