"""TPC-C consistency conditions 1 to 12 (clause 3.3.2), checked on a snapshot of key/values.

The snapshot is a ``{key: value}`` dict of the TPC-C tables, keys as tuples (``snapshot``
reads one through the ``tpcc_scan`` procedure; a test may pass a replica's store). Money is
``Decimal``, so every sum is exact. Every condition is checked
for each warehouse (or district, customer, order) present. Conditions 8 to 10 relate rows
of different warehouses when payments are remote (HISTORY rows live with the paying
warehouse, the customer may be another's), so a snapshot should hold every warehouse for
them to be meaningful.

Condition 11, as written, holds on the initial database only: each Delivery removes a
NEW-ORDER row and keeps the ORDER row, so count(ORDER) - count(NEW-ORDER) grows from 2100.
We check the relation it expresses on a live database: the difference equals the initially
delivered orders (2100, or the shrunk scale's count) plus the orders delivered since, i.e.
the orders past those with an O_CARRIER_ID. On the initial database this is exactly the
specification's condition.
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bench.tpcc import schema
from bench.tpcc.schema import Key, Scale
from store.core.keys import tuple_of

CONDITIONS = tuple(range(1, 13))
# Explanations kept per failed condition; a broken run could otherwise print thousands.
EXPLANATIONS_MAX = 5


@dataclass
class Report:
    """The verdict per condition number and, for each failed one, a few example violations."""

    conditions: dict[int, bool] = field(default_factory=dict)
    failures: dict[int, list[str]] = field(default_factory=dict)

    @property
    def all_true(self) -> bool:
        return all(self.conditions.values())

    def fail(self, condition: int, explanation: str) -> None:
        self.conditions[condition] = False
        shown = self.failures.setdefault(condition, [])
        if len(shown) < EXPLANATIONS_MAX:
            shown.append(explanation)

    def summary(self) -> str:
        if self.all_true:
            return f"consistency: all {len(self.conditions)} conditions hold"
        lines = ["consistency: FAILED conditions " + ", ".join(map(str, sorted(self.failures)))]
        for number in sorted(self.failures):
            lines += [f"  {number}: {text}" for text in self.failures[number]]
        return "\n".join(lines)


class _Tables:
    """The snapshot's rows grouped by table and by the ids the conditions join on."""

    def __init__(self, snapshot: Mapping[Key, Any]) -> None:
        self.warehouses: dict[int, dict[str, Any]] = {}
        self.districts: dict[tuple[int, int], dict[str, Any]] = {}
        self.customers: dict[tuple[int, int, int], dict[str, Any]] = {}
        self.history: list[dict[str, Any]] = []
        self.orders: dict[tuple[int, int, int], dict[str, Any]] = {}
        self.new_orders: dict[tuple[int, int], set[int]] = collections.defaultdict(set)
        self.order_lines: dict[tuple[int, int, int], list[dict[str, Any]]] = (
            collections.defaultdict(list)
        )
        # W_YTD and D_YTD are rows of their own (bench/tpcc/schema.py): joined back below.
        warehouse_ytd: dict[int, Any] = {}
        district_ytd: dict[tuple[int, int], Any] = {}
        for key, value in snapshot.items():
            table = key[0]
            if table == "warehouse":
                self.warehouses[key[1]] = value
            elif table == "warehouse_ytd":
                warehouse_ytd[key[1]] = value["w_ytd"]
            elif table == "district":
                self.districts[key[1], key[2]] = value
            elif table == "district_ytd":
                district_ytd[key[1], key[2]] = value["d_ytd"]
            elif table == "customer":
                self.customers[key[1], key[2], key[3]] = value
            elif table == "history":
                self.history.append(value)
            elif table == "order":
                self.orders[key[1], key[2], key[3]] = value
            elif table == "new_order":
                self.new_orders[key[1], key[2]].add(key[3])
            elif table == "order_line":
                self.order_lines[key[1], key[2], key[3]].append(value)
        self.warehouses = {
            w_id: {**row, "w_ytd": warehouse_ytd.get(w_id)} for w_id, row in self.warehouses.items()
        }
        self.districts = {
            ids: {**row, "d_ytd": district_ytd.get(ids)} for ids, row in self.districts.items()
        }
        self.orders_by_district: dict[tuple[int, int], list[int]] = collections.defaultdict(list)
        for w_id, d_id, o_id in self.orders:
            self.orders_by_district[w_id, d_id].append(o_id)


def check(snapshot: Mapping[Key, Any], scale: Scale) -> Report:
    """Conditions 1 to 12 on ``snapshot``; ``scale`` gives condition 11's initial count."""
    tables = _Tables(snapshot)
    report = Report({number: True for number in CONDITIONS})
    if not tables.warehouses:
        for number in CONDITIONS:
            report.fail(number, "the snapshot holds no warehouse")
        return report
    _check_ytd(tables, report)
    _check_order_ids(tables, report)
    _check_order_lines(tables, report)
    _check_history(tables, report)
    _check_balances(tables, report)
    _check_delivered_count(tables, report, scale)
    return report


def _check_ytd(tables: _Tables, report: Report) -> None:
    d_ytd: dict[int, Any] = collections.Counter()
    for (w_id, _), district in tables.districts.items():
        d_ytd[w_id] += district["d_ytd"]
    for w_id, warehouse in sorted(tables.warehouses.items()):
        if warehouse["w_ytd"] != d_ytd[w_id]:
            report.fail(1, f"warehouse {w_id}: W_YTD {warehouse['w_ytd']} != sum(D_YTD) {d_ytd[w_id]}")


def _check_order_ids(tables: _Tables, report: Report) -> None:
    """Conditions 2 and 3: order ids, NEW-ORDER ids and D_NEXT_O_ID agree."""
    for (w_id, d_id), district in sorted(tables.districts.items()):
        where = f"district {w_id}/{d_id}"
        o_ids = tables.orders_by_district.get((w_id, d_id), [])
        no_ids = tables.new_orders.get((w_id, d_id), set())
        expected = district["d_next_o_id"] - 1
        max_o_id = max(o_ids, default=0)
        if max_o_id != expected:
            report.fail(2, f"{where}: D_NEXT_O_ID - 1 = {expected} but max(O_ID) = {max_o_id}")
        if no_ids and max(no_ids) != expected:
            report.fail(2, f"{where}: D_NEXT_O_ID - 1 = {expected} but max(NO_O_ID) = {max(no_ids)}")
        if no_ids and max(no_ids) - min(no_ids) + 1 != len(no_ids):
            report.fail(
                3,
                f"{where}: max(NO_O_ID) - min(NO_O_ID) + 1 = {max(no_ids) - min(no_ids) + 1}"
                f" but {len(no_ids)} NEW-ORDER rows",
            )


def _check_order_lines(tables: _Tables, report: Report) -> None:
    """Conditions 4 to 7: orders, their lines and NEW-ORDER rows agree."""
    ol_cnt_sum: dict[tuple[int, int], int] = collections.Counter()
    ol_rows: dict[tuple[int, int], int] = collections.Counter()
    for (w_id, d_id, _), lines in tables.order_lines.items():
        ol_rows[w_id, d_id] += len(lines)
    for (w_id, d_id, o_id), order in sorted(tables.orders.items()):
        where = f"order {w_id}/{d_id}/{o_id}"
        ol_cnt_sum[w_id, d_id] += order["o_ol_cnt"]
        undelivered = order["o_carrier_id"] is None
        if undelivered != (o_id in tables.new_orders.get((w_id, d_id), ())):
            report.fail(
                5,
                f"{where}: O_CARRIER_ID is {order['o_carrier_id']} and it "
                f"{'has no' if undelivered else 'has a'} NEW-ORDER row",
            )
        lines = tables.order_lines.get((w_id, d_id, o_id), [])
        if order["o_ol_cnt"] != len(lines):
            report.fail(6, f"{where}: O_OL_CNT {order['o_ol_cnt']} but {len(lines)} ORDER-LINE rows")
        for line in lines:
            if (line["ol_delivery_d"] is None) != undelivered:
                report.fail(
                    7,
                    f"{where} line {line['ol_number']}: OL_DELIVERY_D {line['ol_delivery_d']}"
                    f" but O_CARRIER_ID {order['o_carrier_id']}",
                )
    for w_id, d_id in sorted(tables.districts):
        if ol_cnt_sum[w_id, d_id] != ol_rows[w_id, d_id]:
            report.fail(
                4,
                f"district {w_id}/{d_id}: sum(O_OL_CNT) {ol_cnt_sum[w_id, d_id]}"
                f" but {ol_rows[w_id, d_id]} ORDER-LINE rows",
            )
    for w_id, d_id, o_id in sorted(tables.order_lines):
        if (w_id, d_id, o_id) not in tables.orders:
            report.fail(6, f"order lines of a missing order {w_id}/{d_id}/{o_id}")


def _check_history(tables: _Tables, report: Report) -> None:
    """Conditions 8 and 9: W_YTD and D_YTD equal the HISTORY amounts paid there."""
    by_warehouse: dict[int, Any] = collections.Counter()
    by_district: dict[tuple[int, int], Any] = collections.Counter()
    for row in tables.history:
        by_warehouse[row["h_w_id"]] += row["h_amount"]
        by_district[row["h_w_id"], row["h_d_id"]] += row["h_amount"]
    for w_id, warehouse in sorted(tables.warehouses.items()):
        if warehouse["w_ytd"] != by_warehouse[w_id]:
            report.fail(
                8, f"warehouse {w_id}: W_YTD {warehouse['w_ytd']} != sum(H_AMOUNT) {by_warehouse[w_id]}"
            )
    for (w_id, d_id), district in sorted(tables.districts.items()):
        if district["d_ytd"] != by_district[w_id, d_id]:
            report.fail(
                9,
                f"district {w_id}/{d_id}: D_YTD {district['d_ytd']}"
                f" != sum(H_AMOUNT) {by_district[w_id, d_id]}",
            )


def _check_balances(tables: _Tables, report: Report) -> None:
    """Conditions 10 and 12: C_BALANCE against delivered order lines and payments."""
    delivered: dict[tuple[int, int, int], Any] = collections.Counter()
    for (w_id, d_id, o_id), lines in tables.order_lines.items():
        order = tables.orders.get((w_id, d_id, o_id))
        if order is None:
            continue  # reported under condition 6
        amount = sum(line["ol_amount"] for line in lines if line["ol_delivery_d"] is not None)
        delivered[w_id, d_id, order["o_c_id"]] += amount
    paid: dict[tuple[int, int, int], Any] = collections.Counter()
    for row in tables.history:
        paid[row["h_c_w_id"], row["h_c_d_id"], row["h_c_id"]] += row["h_amount"]
    for ids, customer in sorted(tables.customers.items()):
        where = "customer {}/{}/{}".format(*ids)
        balance = customer["c_balance"]
        if balance != delivered[ids] - paid[ids]:
            report.fail(
                10,
                f"{where}: C_BALANCE {balance} != delivered OL_AMOUNT {delivered[ids]}"
                f" - H_AMOUNT {paid[ids]}",
            )
        if balance + customer["c_ytd_payment"] != delivered[ids]:
            report.fail(
                12,
                f"{where}: C_BALANCE + C_YTD_PAYMENT {balance + customer['c_ytd_payment']}"
                f" != delivered OL_AMOUNT {delivered[ids]}",
            )


def _check_delivered_count(tables: _Tables, report: Report, scale: Scale) -> None:
    """Condition 11 (see the module's docstring for why it counts later deliveries)."""
    initial = scale.delivered_per_district
    for w_id, d_id in sorted(tables.districts):
        o_ids = tables.orders_by_district.get((w_id, d_id), [])
        no_count = len(tables.new_orders.get((w_id, d_id), ()))
        delivered_since = sum(
            1
            for o_id in o_ids
            if o_id > initial and tables.orders[w_id, d_id, o_id]["o_carrier_id"] is not None
        )
        if len(o_ids) - no_count != initial + delivered_since:
            report.fail(
                11,
                f"district {w_id}/{d_id}: count(ORDER) - count(NEW-ORDER) = {len(o_ids) - no_count}"
                f" but {initial} initially delivered + {delivered_since} delivered since",
            )


Run = Callable[..., Awaitable[Any]]


async def snapshot(
    run: Run, warehouses: Iterable[int], layout: schema.Layout, page_rows: int = 5000
) -> dict[Key, Any]:
    """Reads every TPC-C table of ``warehouses`` through ``tpcc_scan`` pages.

    Each page is its own transaction, so the result is a consistent snapshot only when no
    other transaction runs meanwhile (after a run, as clause 3.3.2 checks are made).
    ``run(name, *args, shard=s)`` must accept the shard (the unit, with workers) to submit
    to, so each page is read where it lives.
    """
    rows: dict[Key, Any] = {}
    for w_id in warehouses:
        shard = layout.unit_of(w_id)
        for table in schema.WAREHOUSE_TABLES:
            lo, hi = schema.table_range(table, w_id)
            while True:
                page = await run("tpcc_scan", lo, hi, page_rows, shard=shard)
                # A procedure's tuples arrive as arrays.
                found = [(tuple_of(key), value) for key, value in page]
                rows.update(found)
                if len(found) < page_rows:
                    break
                lo = schema.stored_after(found[-1][0])
    return rows

