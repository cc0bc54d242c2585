"""TPC-C's nine tables on Meridian's ordered string keys (TPC-C rev. 5.11 clause 1).

Theory of operation:

* Every key is ``table/<warehouse>/...`` with zero-padded decimal ids, so string order is
  numeric order and a range of keys is the range a transaction scans (the order lines of
  the last 20 orders of a district are one scan). The warehouse id is path field 1, which
  ``PrefixPartitioner(shard_count, field=1)`` uses to place warehouse w on shard w mod S.
* ITEM is read-only and read by every New-Order, so it is copied to every shard:
  ``item/<copy>/<i_id>`` with copy s placed on shard s. New-Order reads copy w mod S, the
  one on its home warehouse's shard, and never crosses shards for items.
* Three index tables replace the secondary access paths a SQL schema would scan for, and
  the transactions that change the base rows maintain them in the same transaction:
  ``customer_name`` (customer by last name, sorted by first name), ``customer_order`` (a
  customer's latest order id) and ``new_order_oldest`` (a district's oldest undelivered
  order id: NEW-ORDER rows are exactly the ids from it up to D_NEXT_O_ID - 1).
* Money is integer cents and rates are integer basis points (1/10000), so the sums of the
  consistency conditions are exact.

Ids are 1-based as in the specification; there are always ten districts per warehouse.
"""

from __future__ import annotations

from dataclasses import dataclass

DISTRICTS_PER_WAREHOUSE = 10
# Widths of the zero-padded ids; the limits are the specification's (and ours, asserted).
WAREHOUSE_DIGITS = 4
CUSTOMER_DIGITS = 5
ORDER_DIGITS = 8
ITEM_DIGITS = 6

# The table names, in the order the consistency checker and the snapshot read them.
TABLES = (
    "warehouse",
    "district",
    "customer",
    "customer_name",
    "history",
    "order",
    "customer_order",
    "new_order",
    "new_order_oldest",
    "order_line",
    "item",
    "stock",
)
# Tables keyed by warehouse (ITEM is keyed by its per-shard copy instead).
WAREHOUSE_TABLES = tuple(table for table in TABLES if table != "item")


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
        assert 1 <= self.items < 10**ITEM_DIGITS - 1, "item ids must leave room for the unused id"
        assert 1 <= self.customers_per_district < 10**CUSTOMER_DIGITS
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


def _w(w_id: int) -> str:
    assert 0 <= w_id < 10**WAREHOUSE_DIGITS, f"warehouse id {w_id} out of range"
    return f"{w_id:0{WAREHOUSE_DIGITS}d}"


def _d(d_id: int) -> str:
    assert 1 <= d_id <= DISTRICTS_PER_WAREHOUSE, f"district id {d_id} out of range"
    return f"{d_id:02d}"


def _c(c_id: int) -> str:
    return f"{c_id:0{CUSTOMER_DIGITS}d}"


def _o(o_id: int) -> str:
    assert 0 <= o_id < 10**ORDER_DIGITS
    return f"{o_id:0{ORDER_DIGITS}d}"


def _i(i_id: int) -> str:
    return f"{i_id:0{ITEM_DIGITS}d}"


def warehouse_key(w_id: int) -> str:
    return f"warehouse/{_w(w_id)}"


def district_key(w_id: int, d_id: int) -> str:
    return f"district/{_w(w_id)}/{_d(d_id)}"


def customer_key(w_id: int, d_id: int, c_id: int) -> str:
    return f"customer/{_w(w_id)}/{_d(d_id)}/{_c(c_id)}"


def customer_name_key(w_id: int, d_id: int, c_last: str, c_first: str, c_id: int) -> str:
    """Index entry: customers of a district by (C_LAST, C_FIRST); the value is C_ID."""
    assert "/" not in c_last and "/" not in c_first
    return f"customer_name/{_w(w_id)}/{_d(d_id)}/{c_last}/{c_first}/{_c(c_id)}"


def customer_name_range(w_id: int, d_id: int, c_last: str) -> tuple[str, str]:
    """The index entries of one last name, in C_FIRST order ('0' sorts right after '/')."""
    prefix = f"customer_name/{_w(w_id)}/{_d(d_id)}/{c_last}/"
    return prefix, prefix[:-1] + "0"


def history_key(w_id: int, d_id: int, history_id: str) -> str:
    """HISTORY has no primary key; the terminal that pays supplies a unique ``history_id``."""
    assert "/" not in history_id
    return f"history/{_w(w_id)}/{_d(d_id)}/{history_id}"


def order_key(w_id: int, d_id: int, o_id: int) -> str:
    return f"order/{_w(w_id)}/{_d(d_id)}/{_o(o_id)}"


def customer_order_key(w_id: int, d_id: int, c_id: int) -> str:
    """Index entry: the id of the customer's latest order."""
    return f"customer_order/{_w(w_id)}/{_d(d_id)}/{_c(c_id)}"


def new_order_key(w_id: int, d_id: int, o_id: int) -> str:
    return f"new_order/{_w(w_id)}/{_d(d_id)}/{_o(o_id)}"


def oldest_new_order_key(w_id: int, d_id: int) -> str:
    """Index entry: the district's oldest undelivered order id (D_NEXT_O_ID if none)."""
    return f"new_order_oldest/{_w(w_id)}/{_d(d_id)}"


def order_line_key(w_id: int, d_id: int, o_id: int, ol_number: int) -> str:
    return f"order_line/{_w(w_id)}/{_d(d_id)}/{_o(o_id)}/{ol_number:02d}"


def order_lines_range(w_id: int, d_id: int, o_id_lo: int, o_id_hi: int) -> tuple[str, str]:
    """The order lines of orders o_id_lo <= O_ID < o_id_hi of a district."""
    base = f"order_line/{_w(w_id)}/{_d(d_id)}/"
    return base + _o(o_id_lo), base + _o(o_id_hi)


def item_key(copy: int, i_id: int) -> str:
    return f"item/{_w(copy)}/{_i(i_id)}"


def stock_key(w_id: int, i_id: int) -> str:
    return f"stock/{_w(w_id)}/{_i(i_id)}"


def table_range(table: str, w_id: int) -> tuple[str, str]:
    """All keys of ``table`` for one warehouse (or one ITEM copy)."""
    # The upper bounds keep the warehouse field intact, so the partitioner sends the scan to
    # one shard: "~" sorts after every character our keys use (digits, letters, "/", "-").
    if table == "warehouse":
        return warehouse_key(w_id), warehouse_key(w_id) + "/"
    prefix = f"{table}/{_w(w_id)}/"
    return prefix, prefix + "~"


def warehouse_shard(w_id: int, shard_count: int) -> int:
    """The shard of a warehouse under ``PrefixPartitioner(shard_count, field=1)``."""
    return w_id % shard_count


def parse_key(key: str) -> tuple[str, list[str]]:
    """(table, the path fields after the table) of a TPC-C key."""
    table, _, rest = key.partition("/")
    return table, rest.split("/")
