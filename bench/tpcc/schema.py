"""TPC-C's nine tables on Meridian's typed keys (TPC-C rev. 5.11 clause 1).

Theory of operation:

* Every key is a tuple ``(table, w_id, ...)`` of the row's primary key, integers as they
  are: tuple order is the order transactions scan in (the order lines of an order are
  ``scan_prefix(("order_line", w, d, o))``, the oldest undelivered order of a district is
  the first key of ``("new_order", w, d)``). The warehouse id is element 1, which
  ``PrefixPartitioner(shard_count, field=1)`` uses to place warehouse w on shard w mod S.
* ITEM is read-only and read by every New-Order, so it is a *replicated* table: one copy
  of ``("item", i_id)``, held whole by every shard. New-Order reads it on its home
  warehouse's shard and never crosses shards for items; loading it certifies each write on
  every shard.
* Two index tables give the secondary access paths a SQL schema would have an index for
  (their entries are keys, with None for value), and the transactions that add the base
  rows add their entries in the same transaction:
  ``customer_name`` (customers of a district by C_LAST, then C_FIRST) and
  ``order_by_customer`` (a customer's orders by O_ID: the newest is the last key, read by
  a reverse scan). Nothing points at "the latest" or "the oldest" row: scans find them.
* The year-to-date totals W_YTD and D_YTD, which every Payment updates, are rows of their
  own (``("warehouse_ytd", w)``, ``("district_ytd", w, d)``): the warehouse and district
  rows New-Order reads (W_TAX, D_TAX) are then written by nobody but New-Order itself
  (D_NEXT_O_ID), so the two commonest transactions do not conflict on them. In one row, a
  Payment committing between a New-Order's read of the warehouse and its certification
  aborted the New-Order; the retry chains made the longest New-Orders 16 times their p99.
  The consistency checker joins them back (``consistency._Tables``).
* Money is ``Decimal`` with two places and rates (taxes, discounts) ``Decimal`` with four,
  so the sums of the consistency conditions are exact; dates are UTC ``datetime``.

Ids are 1-based as in the specification; there are always ten districts per warehouse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from store.core.keys import pack, prefix_range
from store.core.partition import Partitioner, PrefixPartitioner

DISTRICTS_PER_WAREHOUSE = 10

# The table names, in the order the consistency checker and the snapshot read them.
TABLES = (
    "warehouse",
    "warehouse_ytd",
    "district",
    "district_ytd",
    "customer",
    "customer_name",
    "history",
    "order",
    "order_by_customer",
    "new_order",
    "order_line",
    "item",
    "stock",
)
# On every shard (the cluster file's ``[placement] replicated``).
REPLICATED_TABLES = ("item",)
# Tables keyed by warehouse: element 1 of every key is its W_ID.
WAREHOUSE_TABLES = tuple(table for table in TABLES if table not in REPLICATED_TABLES)

Key = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Scale:
    """Cardinalities of the initial database (clause 4.3.3.1), possibly shrunk.

    ``shrunk(f)`` divides items, customers and initial orders by ``f`` as py-tpcc's
    ``--scalefactor`` does; ``Scale()`` is the full specification.
    """

    items: int = 100_000
    customers_per_district: int = 3000
    # Initial orders per district: one per customer (O_C_ID is a permutation of C_ID).
    # The last ``new_orders_per_district`` of them are undelivered (rows in NEW-ORDER).
    new_orders_per_district: int = 900

    def __post_init__(self) -> None:
        assert self.items >= 1 and self.customers_per_district >= 1
        assert 0 <= self.new_orders_per_district <= self.customers_per_district

    @property
    def orders_per_district(self) -> int:
        return self.customers_per_district

    @property
    def delivered_per_district(self) -> int:
        """Initial orders already delivered (2100 at full scale; consistency condition 11)."""
        return self.orders_per_district - self.new_orders_per_district

    @property
    def unused_item_id(self) -> int:
        """An item id no ITEM row has: New-Order's 1% rollback asks for it (clause 2.4.1.4)."""
        return self.items + 1

    @classmethod
    def shrunk(cls, scale_factor: float) -> Scale:
        assert scale_factor >= 1, "the scale factor divides the specification's sizes"
        full = cls()
        customers = max(1, int(full.customers_per_district / scale_factor))
        return cls(
            items=max(100, int(full.items / scale_factor)),
            customers_per_district=customers,
            new_orders_per_district=min(customers, int(full.new_orders_per_district / scale_factor)),
        )


def _d(d_id: int) -> int:
    assert 1 <= d_id <= DISTRICTS_PER_WAREHOUSE, f"district id {d_id} out of range"
    return d_id


def warehouse_key(w_id: int) -> Key:
    return ("warehouse", w_id)


def district_key(w_id: int, d_id: int) -> Key:
    return ("district", w_id, _d(d_id))


def warehouse_ytd_key(w_id: int) -> Key:
    """W_YTD, apart from the warehouse row (see the module doc)."""
    return ("warehouse_ytd", w_id)


def district_ytd_key(w_id: int, d_id: int) -> Key:
    """D_YTD, apart from the district row (see the module doc)."""
    return ("district_ytd", w_id, _d(d_id))


def customer_key(w_id: int, d_id: int, c_id: int) -> Key:
    return ("customer", w_id, _d(d_id), c_id)


def customer_name_key(w_id: int, d_id: int, c_last: str, c_first: str, c_id: int) -> Key:
    """Index entry: customers of a district by (C_LAST, C_FIRST), the key ending with C_ID
    (the value is None: the key is the entry, read keys only)."""
    return ("customer_name", w_id, _d(d_id), c_last, c_first, c_id)


def customer_name_prefix(w_id: int, d_id: int, c_last: str) -> Key:
    """The index entries of one last name, in C_FIRST order (a string element matches
    whole: ``"BAR"`` does not take in ``"BARBAR"``)."""
    return ("customer_name", w_id, _d(d_id), c_last)


def history_key(w_id: int, d_id: int, history_id: str) -> Key:
    """HISTORY has no primary key; the terminal that pays supplies a unique ``history_id``."""
    return ("history", w_id, _d(d_id), history_id)


def order_key(w_id: int, d_id: int, o_id: int) -> Key:
    return ("order", w_id, _d(d_id), o_id)


def order_by_customer_key(w_id: int, d_id: int, c_id: int, o_id: int) -> Key:
    """Index entry: one order of a customer, the key ending with O_ID (the value is None)."""
    return ("order_by_customer", w_id, _d(d_id), c_id, o_id)


def customer_orders_prefix(w_id: int, d_id: int, c_id: int) -> Key:
    """A customer's index entries, oldest order first (the newest: reverse, limit 1)."""
    return ("order_by_customer", w_id, _d(d_id), c_id)


def new_order_key(w_id: int, d_id: int, o_id: int) -> Key:
    return ("new_order", w_id, _d(d_id), o_id)


def new_orders_prefix(w_id: int, d_id: int) -> Key:
    """A district's undelivered orders, oldest first."""
    return ("new_order", w_id, _d(d_id))


def order_line_key(w_id: int, d_id: int, o_id: int, ol_number: int) -> Key:
    return ("order_line", w_id, _d(d_id), o_id, ol_number)


def order_lines_prefix(w_id: int, d_id: int, o_id: int) -> Key:
    """The lines of one order, by OL_NUMBER."""
    return ("order_line", w_id, _d(d_id), o_id)


def order_lines_range(w_id: int, d_id: int, o_id_lo: int, o_id_hi: int) -> tuple[Key, Key]:
    """The order lines of orders o_id_lo <= O_ID < o_id_hi of a district: every line of
    order o sorts after ``(..., o)`` (a prefix sorts before its extensions)."""
    return ("order_line", w_id, _d(d_id), o_id_lo), ("order_line", w_id, _d(d_id), o_id_hi)


def item_key(i_id: int) -> Key:
    return ("item", i_id)


def stock_key(w_id: int, i_id: int) -> Key:
    return ("stock", w_id, i_id)


def table_range(table: str, w_id: int) -> tuple[str, str]:
    """The stored bounds (``store.core.keys``) of one warehouse's keys of ``table``, as a
    snapshot read and the ``tpcc_scan`` pages take them."""
    assert table in WAREHOUSE_TABLES, f"{table} is not keyed by warehouse"
    return prefix_range((table, w_id))


def key_after(key: Key) -> Key:
    """The least key above ``key``: ``key`` extended by the least element there is (empty
    bytes: bytes < strings < tuples < integers, and a prefix sorts before its extensions).
    A page of a scan starts there, right after the previous page's last key: a tuple key
    of the same warehouse, which the partitioner places on the warehouse's shard, so a
    follower's one-shard snapshot takes the page."""
    return (*key, b"")


def stored_after(key: Key) -> str:
    return pack(key_after(key))


@dataclass(frozen=True)
class Layout:
    """Where the warehouses are: ``shards`` shards of ``workers`` worker processes each
    (docs/design.md, "Workers"). The benchmark addresses **units** (``shard * workers +
    worker``; without workers a unit is a shard): the cluster file's ``partitioner =
    "prefix"`` puts warehouse w on shard w mod S, and its worker is (w // S) mod W
    (``PrefixPartitioner.worker_of``), so that consecutive warehouses go round every unit
    and a warehouse's rows stay on one worker."""

    shards: int
    workers: int = 1

    def __post_init__(self) -> None:
        if self.shards < 1 or self.workers < 1:
            raise ValueError(f"a layout needs shards and workers >= 1, not {self}")

    @property
    def units(self) -> int:
        return self.shards * self.workers

    def unit_of(self, w_id: int) -> int:
        """The unit holding warehouse ``w_id``."""
        return (w_id % self.shards) * self.workers + (w_id // self.shards) % self.workers

    def describe(self) -> str:
        shards = f"{self.shards} shard{'s' if self.shards != 1 else ''}"
        return shards if self.workers == 1 else f"{shards} of {self.workers} workers"


def partitioner(shard_count: int) -> PrefixPartitioner:
    """The placement the benchmark needs: warehouse w on shard w mod S, ITEM on every shard
    (what the cluster file's ``partitioner = "prefix"`` and ``[placement] replicated =
    ["item"]`` build)."""
    return PrefixPartitioner(shard_count, field=1, replicated_tables=REPLICATED_TABLES)


def placement_problem(placement: Partitioner, layout: Layout) -> str | None:
    """What is wrong with a cluster's placement for TPC-C, or None: every warehouse table
    must put warehouse w on ``layout.unit_of(w)``, and ITEM must be replicated."""
    if not placement.is_replicated(pack(item_key(1))):
        return 'ITEM is not replicated ([placement] replicated = ["item"])'
    for table in WAREHOUSE_TABLES:
        for w_id in range(1, 2 * layout.units + 1):
            unit = layout.unit_of(w_id)
            if placement.shard_of(pack((table, w_id, 1))) != unit:
                where = f"unit {unit} (shard w mod S, worker (w // S) mod W)" if layout.workers > 1 else (
                    f"shard w mod {layout.shards}"
                )
                return f"{table} keys of warehouse {w_id} are not on {where}"
    return None
