"""The five TPC-C transactions (rev. 5.11 clause 2) as Meridian one-shot procedures.

Each procedure gets every input the terminal generated (clause 2.x.1) as arguments, reads
what it needs in as few rounds as its data dependencies allow (``tx.read_many`` reads keys
and ranges of several shards in one round), and buffers its writes; Meridian certifies it
as one transaction. Dates are arguments (procedures read no clock), as are ids a SQL
database would invent (HISTORY's row id), so a procedure is a pure function of the
database and its arguments. Keys are the tuples of ``schema``; no procedure keeps a
pointer to "the latest" or "the oldest" row, it scans for it.

Rounds per transaction (a round reads from every shard involved in parallel):

* New-Order: 1 (warehouse, district, customer, items, stocks, all known up front; ITEM is
  replicated, so it is read on the home shard).
* Payment: 1 by customer id; 2 by last name (the name index scan first).
* Order-Status: 2 by id (the customer with a reverse scan of its orders, newest first;
  then the order with a scan of its lines), 3 by name.
* Delivery: 3 (the first NEW-ORDER key of each of the ten districts; their ORDER rows with
  a scan of each order's lines; the customers), each round one ``read_many``.
* Stock-Level: 3 (district; order lines of the last 20 orders; their stocks).

Procedure names and arguments (what a client passes to ``run``):

* ``tpcc_new_order(w_id, d_id, c_id, lines, entry_d)``: ``lines`` is a list of
  ``[i_id, supply_w_id, quantity]``. Rolls back with ``tx.abort`` on an unused item id.
* ``tpcc_payment(w_id, d_id, c_w_id, c_d_id, c_id, c_last, h_amount, h_date, history_id)``:
  exactly one of ``c_id`` and ``c_last`` is not None; ``h_amount`` a ``Decimal``.
* ``tpcc_order_status(w_id, d_id, c_id, c_last)``.
* ``tpcc_delivery(w_id, o_carrier_id, delivery_d)``.
* ``tpcc_stock_level(w_id, d_id, threshold)``.
* ``tpcc_load(rows)``: puts ``[[key, value], ...]`` (the loader's batches).
* ``tpcc_scan(lo, hi, limit)``: one page of a stored key range, for consistency snapshots.
"""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

from bench.tpcc import schema
from store.core.txn import Procedure, Procedures, Range

C_DATA_LENGTH_MAX = 500  # clause 2.5.2.2: C_DATA keeps its first 500 characters
STOCK_LEVEL_ORDERS = 20  # clause 2.8.2.2: the last 20 orders of the district
ORDER_LINES_MAX = 15
# The largest page a consistency snapshot reads in one transaction.
SCAN_PAGE_MAX = 10_000
# Customers with one last name in one district: about 3 at full scale; a generous limit.
CUSTOMERS_PER_NAME_MAX = 1000
CENT = Decimal("0.01")


async def _customer_id_by_name(tx: Any, w_id: int, d_id: int, c_last: str) -> int:
    """Clause 2.5.2.2: of the n customers with the last name, sorted by C_FIRST, the one at
    position ceil(n / 2); the index keys end with C_ID."""
    (_, (entries,)) = await tx.read_many(scans=[Range.prefix(
        schema.customer_name_prefix(w_id, d_id, c_last), CUSTOMERS_PER_NAME_MAX, keys_only=True,
    )])
    if not entries:
        tx.abort(f"no customer named {c_last} in warehouse {w_id} district {d_id}")
    c_id: int = entries[(len(entries) - 1) // 2][-1]
    return c_id


async def new_order(
    tx: Any,
    w_id: int,
    d_id: int,
    c_id: int,
    lines: list[list[int]],
    entry_d: datetime.datetime,
) -> dict[str, Any]:
    """Clause 2.4.2: enter an order of 5 to 15 lines and take the items from stock."""
    assert 1 <= len(lines) <= ORDER_LINES_MAX, "an order has 5 to 15 lines (clause 2.4.1.3)"
    warehouse, district, customer = (
        schema.warehouse_key(w_id),
        schema.district_key(w_id, d_id),
        schema.customer_key(w_id, d_id, c_id),
    )
    item_keys = [schema.item_key(i_id) for i_id, _, _ in lines]
    stock_keys = [schema.stock_key(supply_w_id, i_id) for i_id, supply_w_id, _ in lines]
    values = await tx.get_many([warehouse, district, customer, *item_keys, *stock_keys])
    w_row, d_row, c_row = values[0], values[1], values[2]
    items = values[3 : 3 + len(lines)]
    stocks = dict(zip(stock_keys, values[3 + len(lines) :], strict=True))
    assert w_row is not None and d_row is not None and c_row is not None, "missing rows"
    for (i_id, _, _), item in zip(lines, items, strict=True):
        if item is None:
            # Clause 2.4.2.3: an unused item id rolls the whole transaction back.
            tx.abort(f"item {i_id} not found")

    o_id = d_row["d_next_o_id"]
    tx.put(district, {**d_row, "d_next_o_id": o_id + 1})
    all_local = all(supply_w_id == w_id for _, supply_w_id, _ in lines)
    tx.put(
        schema.order_key(w_id, d_id, o_id),
        {
            "o_id": o_id,
            "o_d_id": d_id,
            "o_w_id": w_id,
            "o_c_id": c_id,
            "o_entry_d": entry_d,
            "o_carrier_id": None,
            "o_ol_cnt": len(lines),
            "o_all_local": int(all_local),
        },
    )
    tx.put(schema.new_order_key(w_id, d_id, o_id), {"no_o_id": o_id})
    tx.put(schema.order_by_customer_key(w_id, d_id, c_id, o_id), None)

    dist_info_field = f"s_dist_{d_id:02d}"
    amount = Decimal("0.00")
    shown_lines = []
    for number, ((i_id, supply_w_id, quantity), item) in enumerate(
        zip(lines, items, strict=True), start=1
    ):
        key = schema.stock_key(supply_w_id, i_id)
        # The same item may appear twice in an order: the second line sees the first's update.
        stock = stocks[key]
        assert stock is not None, f"no stock row {key}"
        s_quantity = stock["s_quantity"]
        if s_quantity >= quantity + 10:
            s_quantity -= quantity
        else:
            s_quantity = s_quantity - quantity + 91
        stock = {
            **stock,
            "s_quantity": s_quantity,
            "s_ytd": stock["s_ytd"] + quantity,
            "s_order_cnt": stock["s_order_cnt"] + 1,
            "s_remote_cnt": stock["s_remote_cnt"] + (supply_w_id != w_id),
        }
        stocks[key] = stock
        tx.put(key, stock)
        ol_amount = quantity * item["i_price"]
        amount += ol_amount
        original = "ORIGINAL" in item["i_data"] and "ORIGINAL" in stock["s_data"]
        tx.put(
            schema.order_line_key(w_id, d_id, o_id, number),
            {
                "ol_o_id": o_id,
                "ol_d_id": d_id,
                "ol_w_id": w_id,
                "ol_number": number,
                "ol_i_id": i_id,
                "ol_supply_w_id": supply_w_id,
                "ol_delivery_d": None,
                "ol_quantity": quantity,
                "ol_amount": ol_amount,
                "ol_dist_info": stock[dist_info_field],
            },
        )
        shown_lines.append(
            [supply_w_id, i_id, item["i_name"], quantity, s_quantity,
             "B" if original else "G", item["i_price"], ol_amount]
        )
    total = amount * (1 - c_row["c_discount"]) * (1 + w_row["w_tax"] + d_row["d_tax"])
    return {
        "o_id": o_id,
        "o_ol_cnt": len(lines),
        "c_last": c_row["c_last"],
        "c_credit": c_row["c_credit"],
        "c_discount": c_row["c_discount"],
        "w_tax": w_row["w_tax"],
        "d_tax": d_row["d_tax"],
        "total_amount": total.quantize(CENT),
        "lines": shown_lines,
    }


async def payment(
    tx: Any,
    w_id: int,
    d_id: int,
    c_w_id: int,
    c_d_id: int,
    c_id: int | None,
    c_last: str | None,
    h_amount: Decimal,
    h_date: datetime.datetime,
    history_id: str,
) -> dict[str, Any]:
    """Clause 2.5.2: record a customer's payment in warehouse, district, customer and history."""
    assert (c_id is None) != (c_last is None), "select the customer by id or by last name"
    if c_id is None:
        assert c_last is not None
        c_id = await _customer_id_by_name(tx, c_w_id, c_d_id, c_last)
    warehouse_ytd = schema.warehouse_ytd_key(w_id)
    district_ytd = schema.district_ytd_key(w_id, d_id)
    customer = schema.customer_key(c_w_id, c_d_id, c_id)
    w_row, d_row, w_ytd, d_ytd, c_row = await tx.get_many([
        schema.warehouse_key(w_id), schema.district_key(w_id, d_id), warehouse_ytd,
        district_ytd, customer,
    ])
    assert w_row is not None and d_row is not None, "missing warehouse or district"
    assert w_ytd is not None and d_ytd is not None, "missing warehouse or district totals"
    if c_row is None:
        tx.abort(f"no customer {c_id} in warehouse {c_w_id} district {c_d_id}")
    # The totals are rows of their own (schema's module doc): the warehouse and district
    # rows New-Order reads are only read here.
    tx.put(warehouse_ytd, {"w_ytd": w_ytd["w_ytd"] + h_amount})
    tx.put(district_ytd, {"d_ytd": d_ytd["d_ytd"] + h_amount})
    c_row = {
        **c_row,
        "c_balance": c_row["c_balance"] - h_amount,
        "c_ytd_payment": c_row["c_ytd_payment"] + h_amount,
        "c_payment_cnt": c_row["c_payment_cnt"] + 1,
    }
    if c_row["c_credit"] == "BC":
        entry = f"{c_id} {c_d_id} {c_w_id} {d_id} {w_id} {h_amount}|"
        c_row["c_data"] = (entry + c_row["c_data"])[:C_DATA_LENGTH_MAX]
    tx.put(customer, c_row)
    tx.put(
        schema.history_key(w_id, d_id, history_id),
        {
            "h_c_id": c_id,
            "h_c_d_id": c_d_id,
            "h_c_w_id": c_w_id,
            "h_d_id": d_id,
            "h_w_id": w_id,
            "h_date": h_date,
            "h_amount": h_amount,
            "h_data": f"{w_row['w_name']}    {d_row['d_name']}",
        },
    )
    shown = {name: c_row[name] for name in _CUSTOMER_SHOWN}
    if c_row["c_credit"] == "BC":
        shown["c_data"] = c_row["c_data"][:200]
    return {"c_id": c_id, "customer": shown, "h_amount": h_amount, "h_date": h_date}


_CUSTOMER_SHOWN = (
    "c_first", "c_middle", "c_last", "c_street_1", "c_street_2", "c_city", "c_state", "c_zip",
    "c_phone", "c_since", "c_credit", "c_credit_lim", "c_discount", "c_balance",
)


async def order_status(
    tx: Any, w_id: int, d_id: int, c_id: int | None, c_last: str | None
) -> dict[str, Any]:
    """Clause 2.6.2: a customer's balance and their latest order with its lines (read-only).

    The latest order is the last key of the customer's ``order_by_customer`` entries: a
    reverse scan of one key, read with the customer row."""
    assert (c_id is None) != (c_last is None), "select the customer by id or by last name"
    if c_id is None:
        assert c_last is not None
        c_id = await _customer_id_by_name(tx, w_id, d_id, c_last)
    (c_row,), (newest,) = await tx.read_many(
        gets=[schema.customer_key(w_id, d_id, c_id)],
        scans=[Range.prefix(
            schema.customer_orders_prefix(w_id, d_id, c_id), 1, reverse=True, keys_only=True
        )],
    )
    if c_row is None:
        tx.abort(f"no customer {c_id} in warehouse {w_id} district {d_id}")
    result: dict[str, Any] = {
        "c_id": c_id,
        "c_first": c_row["c_first"],
        "c_middle": c_row["c_middle"],
        "c_last": c_row["c_last"],
        "c_balance": c_row["c_balance"],
        "order": None,
        "lines": [],
    }
    if not newest:
        return result  # a customer with no order yet (not in the initial database)
    o_id = newest[0][-1]
    (order,), (line_rows,) = await tx.read_many(
        gets=[schema.order_key(w_id, d_id, o_id)],
        scans=[Range.prefix(schema.order_lines_prefix(w_id, d_id, o_id), ORDER_LINES_MAX)],
    )
    assert order is not None, f"the customer index names a missing order {o_id}"
    result["order"] = {
        "o_id": o_id,
        "o_entry_d": order["o_entry_d"],
        "o_carrier_id": order["o_carrier_id"],
    }
    result["lines"] = [
        [line["ol_supply_w_id"], line["ol_i_id"], line["ol_quantity"], line["ol_amount"],
         line["ol_delivery_d"]]
        for _, line in line_rows
    ]
    return result


async def delivery(
    tx: Any, w_id: int, o_carrier_id: int, delivery_d: datetime.datetime
) -> dict[str, Any]:
    """Clause 2.7.4: deliver the oldest undelivered order of each of the ten districts.

    A district with no undelivered order is skipped (clause 2.7.4.2) and reported in the
    result, as the specification asks the deferred execution to record it. Each of the
    three rounds reads all ten districts at once.
    """
    districts = range(1, schema.DISTRICTS_PER_WAREHOUSE + 1)
    _, oldest = await tx.read_many(scans=[
        Range.prefix(schema.new_orders_prefix(w_id, d_id), 1, keys_only=True)
        for d_id in districts
    ])
    skipped = [d_id for d_id, found in zip(districts, oldest, strict=True) if not found]
    to_deliver = [(key[2], key[3]) for found in oldest for key in found]  # (d_id, o_id)
    if not to_deliver:
        return {"delivered": [], "skipped": skipped}
    orders, lines_of = await tx.read_many(
        gets=[schema.order_key(w_id, d_id, o_id) for d_id, o_id in to_deliver],
        scans=[
            Range.prefix(schema.order_lines_prefix(w_id, d_id, o_id), ORDER_LINES_MAX)
            for d_id, o_id in to_deliver
        ],
    )
    for (d_id, o_id), order in zip(to_deliver, orders, strict=True):
        assert order is not None, f"new order {w_id}/{d_id}/{o_id} has no ORDER row"
    customer_keys = [
        schema.customer_key(w_id, d_id, order["o_c_id"])
        for (d_id, _), order in zip(to_deliver, orders, strict=True)
    ]
    customers = await tx.get_many(customer_keys)
    delivered = []
    for (d_id, o_id), order, lines, customer_key, customer in zip(
        to_deliver, orders, lines_of, customer_keys, customers, strict=True
    ):
        assert len(lines) == order["o_ol_cnt"], f"order {w_id}/{d_id}/{o_id} misses lines"
        tx.delete(schema.new_order_key(w_id, d_id, o_id))
        tx.put(schema.order_key(w_id, d_id, o_id), {**order, "o_carrier_id": o_carrier_id})
        amount = Decimal("0.00")
        for key, line in lines:
            amount += line["ol_amount"]
            tx.put(key, {**line, "ol_delivery_d": delivery_d})
        assert customer is not None, f"order {w_id}/{d_id}/{o_id} names a missing customer"
        tx.put(
            customer_key,
            {
                **customer,
                "c_balance": customer["c_balance"] + amount,
                "c_delivery_cnt": customer["c_delivery_cnt"] + 1,
            },
        )
        delivered.append([d_id, o_id])
    return {"delivered": delivered, "skipped": skipped}


async def stock_level(tx: Any, w_id: int, d_id: int, threshold: int) -> int:
    """Clause 2.8.2: distinct items of the district's last 20 orders with stock below threshold."""
    district = await tx.get(schema.district_key(w_id, d_id))
    assert district is not None, f"no district {w_id}/{d_id}"
    next_o_id = district["d_next_o_id"]
    lo, hi = schema.order_lines_range(w_id, d_id, max(1, next_o_id - STOCK_LEVEL_ORDERS), next_o_id)
    lines = await tx.scan(lo, hi, STOCK_LEVEL_ORDERS * ORDER_LINES_MAX)
    item_ids = sorted({line["ol_i_id"] for _, line in lines})
    stocks = await tx.get_many([schema.stock_key(w_id, i_id) for i_id in item_ids])
    return sum(1 for stock in stocks if stock is not None and stock["s_quantity"] < threshold)


async def load(tx: Any, rows: list[list[Any]]) -> int:
    """Puts a batch of initial rows; the loader keeps each batch on one shard (an ITEM
    batch is written on every shard: the table is replicated)."""
    for key, value in rows:
        tx.put(key, value)
    return len(rows)


async def scan(tx: Any, lo: str, hi: str, limit: int) -> list[list[Any]]:
    """One page of ``[lo, hi)`` (stored bounds: ``schema.table_range``, ``stored_after``);
    the snapshot for the consistency checks pages through tables."""
    assert 0 < limit <= SCAN_PAGE_MAX
    return [[key, value] for key, value in await tx.scan(lo, hi, limit)]


PROCEDURES: dict[str, Procedure] = {
    "tpcc_new_order": new_order,
    "tpcc_payment": payment,
    "tpcc_order_status": order_status,
    "tpcc_delivery": delivery,
    "tpcc_stock_level": stock_level,
    "tpcc_load": load,
    "tpcc_scan": scan,
}


def register(procedures: Procedures) -> None:
    """Installs the TPC-C procedures: the registration function the cluster TOML names. It
    also registers the in-server TPC-C generator (``bench.tpcc.inserver``, workload
    ``tpcc``), which servers run only when started with load generators enabled."""
    from bench.tpcc import inserver  # the driver, which this module's users need not load

    for name, function in PROCEDURES.items():
        procedures.register(name, function)
    procedures.register_workload(inserver.WORKLOAD, inserver.run)
