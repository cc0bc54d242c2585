"""A tiny TPC-C database on the in-process cluster, shared by the TPC-C tests."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

from bench.tpcc import loader, procedures, schema
from bench.tpcc.local import replica_rows
from store.core.partition import PrefixPartitioner
from store.core.txn import Procedures
from store.sim.local import LocalCluster

# Small enough that loading takes milliseconds, large enough for every code path: several
# districts' worth of undelivered orders and more items than a New-Order asks for.
TINY = schema.Scale(items=200, customers_per_district=30, new_orders_per_district=9)


@functools.cache
def _generated(warehouses: tuple[int, ...], shard_count: int, scale: schema.Scale, seed: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for shard_rows in loader.initial_rows(warehouses, shard_count, scale, seed=seed):
        rows.update(shard_rows)
    return rows


class Tiny:
    """A loaded cluster plus the helpers the tests use."""

    def __init__(
        self,
        warehouses: list[int],
        shard_count: int,
        scale: schema.Scale = TINY,
        seed: int = 7,
        edit: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.warehouses = warehouses
        self.shard_count = shard_count
        self.scale = scale
        registry = Procedures()
        procedures.register(registry)
        self.cluster = LocalCluster(shard_count, registry, PrefixPartitioner(shard_count))
        generated = _generated(tuple(warehouses), shard_count, scale, seed)
        # Rows are flat dicts: copying each keeps the cached generation pristine.
        self.initial = {
            key: dict(value) if isinstance(value, dict) else value
            for key, value in generated.items()
        }
        if edit is not None:
            edit(self.initial)
        self.cluster.preload(self.initial)

    def run(self, name: str, w_id: int, *args: Any) -> Any:
        """Runs a TPC-C procedure at its home warehouse's shard."""
        shard = schema.warehouse_shard(w_id, self.shard_count)
        return self.cluster.run(name, w_id, *args, shard=shard)

    def rows(self) -> dict[str, Any]:
        return replica_rows(self.cluster)

    def get(self, key: str) -> Any:
        return self.cluster.get(key)

    def item_copy(self, w_id: int) -> int:
        return schema.warehouse_shard(w_id, self.shard_count)


@pytest.fixture
def tiny() -> Tiny:
    """Warehouses 1 and 2 on two shards (1 on shard 1, 2 on shard 0)."""
    return Tiny([1, 2], 2)
