"""Each TPC-C procedure's effects on a tiny database (TPC-C rev. 5.11 clause 2)."""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

import pytest

from bench.tpcc import schema
from bench.tpcc.schema import Key, Scale
from store.core.errors import UserAborted
from store.core.keys import pack
from tests.tpcc.conftest import TINY, Tiny

DATE = datetime.datetime(2030, 3, 17, 17, 46, 40, 123456, tzinfo=datetime.UTC)
SECOND = datetime.timedelta(seconds=1)


def lines_of(rows: dict[Key, Any], w_id: int, d_id: int, o_id: int) -> list[dict[str, Any]]:
    prefix = schema.order_lines_prefix(w_id, d_id, o_id)
    return [value for key, value in sorted((k, v) for k, v in rows.items() if k[:4] == prefix)]


def keys_of(rows: dict[Key, Any], prefix: Key) -> list[Key]:
    return sorted(key for key in rows if key[: len(prefix)] == prefix)


def test_new_order_enters_the_order_and_takes_stock(tiny: Tiny) -> None:
    """Clause 2.4.2.2: D_NEXT_O_ID, ORDER, NEW-ORDER, ORDER-LINE and STOCK change together."""
    before = tiny.rows()
    stock_before = before[schema.stock_key(1, 5)]
    result = tiny.run("tpcc_new_order", 1, 3, 7, [[5, 1, 4], [6, 1, 2], [5, 1, 3]], DATE)
    o_id = TINY.orders_per_district + 1
    assert result["o_id"] == o_id and result["o_ol_cnt"] == 3
    rows = tiny.rows()
    assert rows[schema.district_key(1, 3)]["d_next_o_id"] == o_id + 1
    order = rows[schema.order_key(1, 3, o_id)]
    assert (order["o_c_id"], order["o_carrier_id"], order["o_all_local"]) == (7, None, 1)
    assert order["o_entry_d"] == DATE  # a datetime, to the microsecond
    assert schema.new_order_key(1, 3, o_id) in rows
    # The customer's newest order is the last key of its index entries.
    assert keys_of(rows, schema.customer_orders_prefix(1, 3, 7))[-1][-1] == o_id
    lines = lines_of(rows, 1, 3, o_id)
    assert [line["ol_i_id"] for line in lines] == [5, 6, 5]
    price = rows[schema.item_key(5)]["i_price"]
    assert isinstance(price, Decimal) and result["total_amount"].as_tuple().exponent == -2
    assert lines[0]["ol_amount"] == 4 * price and lines[0]["ol_delivery_d"] is None
    assert lines[0]["ol_dist_info"] == stock_before["s_dist_03"]
    # Item 5 appears twice: the second line sees the first line's stock update.
    stock = rows[schema.stock_key(1, 5)]
    expected = stock_before["s_quantity"]
    for quantity in (4, 3):
        expected = expected - quantity if expected >= quantity + 10 else expected - quantity + 91
    assert stock["s_quantity"] == expected
    assert stock["s_ytd"] == 7 and stock["s_order_cnt"] == 2 and stock["s_remote_cnt"] == 0


def test_new_order_with_a_remote_supplier_updates_the_remote_stock(tiny: Tiny) -> None:
    """Clause 2.4.2.2: S_REMOTE_CNT counts lines supplied by another warehouse; 1 and 2 are
    on different shards, so this transaction is cross-shard."""
    tiny.run("tpcc_new_order", 1, 1, 1, [[9, 2, 1], [10, 1, 1]], DATE)
    rows = tiny.rows()
    o_id = TINY.orders_per_district + 1
    assert rows[schema.order_key(1, 1, o_id)]["o_all_local"] == 0
    assert rows[schema.stock_key(2, 9)]["s_remote_cnt"] == 1
    assert rows[schema.stock_key(1, 10)]["s_remote_cnt"] == 0


def test_new_order_with_an_unused_item_rolls_back_without_a_trace(tiny: Tiny) -> None:
    """Clause 2.4.2.3: the unused item id rolls the whole transaction back."""
    before = tiny.rows()
    with pytest.raises(UserAborted):
        tiny.run(
            "tpcc_new_order", 1, 2, 3, [[4, 2, 1], [5, 1, 1], [TINY.unused_item_id, 1, 1]], DATE
        )
    assert tiny.rows() == before
    # The district's next order id was not consumed either.
    result = tiny.run("tpcc_new_order", 1, 2, 3, [[4, 1, 1]], DATE)
    assert result["o_id"] == TINY.orders_per_district + 1


def test_payment_by_id_updates_ytd_balance_and_history(tiny: Tiny) -> None:
    """Clause 2.5.2.2, with a customer of the other warehouse (a remote payment)."""
    before = tiny.rows()
    amount = Decimal("123.45")
    tiny.run("tpcc_payment", 1, 4, 2, 6, 11, None, amount, DATE, "test-1")
    rows = tiny.rows()
    w_ytd, d_ytd = schema.warehouse_ytd_key(1), schema.district_ytd_key(1, 4)
    assert rows[w_ytd]["w_ytd"] == before[w_ytd]["w_ytd"] + amount
    assert rows[d_ytd]["d_ytd"] == before[d_ytd]["d_ytd"] + amount
    # The rows New-Order reads are not written by a Payment (no conflict between them).
    assert rows[schema.warehouse_key(1)] == before[schema.warehouse_key(1)]
    assert rows[schema.district_key(1, 4)] == before[schema.district_key(1, 4)]
    customer_before = before[schema.customer_key(2, 6, 11)]
    customer = rows[schema.customer_key(2, 6, 11)]
    assert customer["c_balance"] == customer_before["c_balance"] - amount
    assert customer["c_ytd_payment"] == customer_before["c_ytd_payment"] + amount
    assert customer["c_payment_cnt"] == customer_before["c_payment_cnt"] + 1
    history = rows[schema.history_key(1, 4, "test-1")]
    assert (history["h_c_w_id"], history["h_c_d_id"], history["h_c_id"]) == (2, 6, 11)
    assert (history["h_w_id"], history["h_d_id"], history["h_amount"]) == (1, 4, amount)
    assert history["h_date"] == DATE
    w_name, d_name = before[schema.warehouse_key(1)]["w_name"], before[schema.district_key(1, 4)]["d_name"]
    assert history["h_data"] == f"{w_name}    {d_name}"


def rename(rows: dict[Key, Any], w_id: int, d_id: int, names: dict[int, tuple[str, str]]) -> None:
    """Gives customers new (last, first) names, keeping the name index in step."""
    for c_id, (c_last, c_first) in names.items():
        customer = rows[schema.customer_key(w_id, d_id, c_id)]
        del rows[schema.customer_name_key(w_id, d_id, customer["c_last"], customer["c_first"], c_id)]
        customer.update(c_last=c_last, c_first=c_first)
        rows[schema.customer_name_key(w_id, d_id, c_last, c_first, c_id)] = None


@pytest.mark.parametrize(
    ("firsts", "expected_c_id"),
    [
        # n = 4 sorted by first name: A(2) B(4) C(3) D(1); position ceil(4/2) = 2 is B.
        ({1: "D", 2: "A", 3: "C", 4: "B"}, 4),
        # n = 3: A(3) B(1) C(2); position ceil(3/2) = 2 is B.
        ({1: "B", 2: "C", 3: "A"}, 1),
        ({5: "Q"}, 5),
    ],
)
def test_payment_by_last_name_picks_the_middle_customer(
    firsts: dict[int, str], expected_c_id: int
) -> None:
    """Clause 2.5.2.2: of n customers with the last name, sorted by C_FIRST, ceil(n/2)."""
    # "SAMENAMEX" shares a string prefix with the name, not the name: it is not selected.
    names = {c_id: ("SAMENAME", first) for c_id, first in firsts.items()}
    names[6] = ("SAMENAMEX", "A")
    tiny = Tiny([1], 1, edit=lambda rows: rename(rows, 1, 2, names))
    result = tiny.run("tpcc_payment", 1, 2, 1, 2, None, "SAMENAME", Decimal("5.00"), DATE, "test-2")
    assert result["c_id"] == expected_c_id
    assert tiny.get(schema.customer_key(1, 2, expected_c_id))["c_payment_cnt"] == 2
    status = tiny.run("tpcc_order_status", 1, 2, None, "SAMENAME")
    assert status["c_id"] == expected_c_id


def test_payment_of_a_bad_credit_customer_prepends_to_c_data() -> None:
    """Clause 2.5.2.2: C_DATA of a BC customer gets the payment in front, kept to 500."""
    tiny = Tiny([1], 1, edit=lambda rows: rows[schema.customer_key(1, 1, 3)].update(c_credit="BC"))
    tiny.run("tpcc_payment", 1, 1, 1, 1, 3, None, Decimal("2.50"), DATE, "test-3")
    c_data = tiny.get(schema.customer_key(1, 1, 3))["c_data"]
    assert c_data.startswith("3 1 1 1 1 2.50|") and len(c_data) <= 500


def test_order_status_returns_the_latest_order(tiny: Tiny) -> None:
    """Clause 2.6.2.2: the customer's order with the largest O_ID, with its lines (a reverse
    scan of the customer's index entries); another customer's newer order is not it."""
    first = tiny.run("tpcc_new_order", 2, 5, 9, [[1, 2, 1], [2, 2, 2]], DATE)
    second = tiny.run("tpcc_new_order", 2, 5, 9, [[3, 2, 3]], DATE + SECOND)
    tiny.run("tpcc_new_order", 2, 5, 10, [[4, 2, 3]], DATE + 2 * SECOND)
    assert second["o_id"] == first["o_id"] + 1
    status = tiny.run("tpcc_order_status", 2, 5, 9, None)
    assert status["c_id"] == 9
    assert status["order"] == {"o_id": second["o_id"], "o_entry_d": DATE + SECOND, "o_carrier_id": None}
    price = tiny.get(schema.item_key(3))["i_price"]
    assert status["lines"] == [[2, 3, 3, 3 * price, None]]


def test_order_status_of_the_initial_database() -> None:
    tiny = Tiny([1], 1)
    o_id = keys_of(tiny.rows(), schema.customer_orders_prefix(1, 1, 1))[-1][-1]
    status = tiny.run("tpcc_order_status", 1, 1, 1, None)
    order = tiny.get(schema.order_key(1, 1, o_id))
    assert status["order"]["o_id"] == o_id and len(status["lines"]) == order["o_ol_cnt"]


def test_delivery_delivers_each_districts_oldest_new_order(tiny: Tiny) -> None:
    """Clause 2.7.4.2: per district, the lowest NO_O_ID goes; customer balance grows."""
    before = tiny.rows()
    oldest = TINY.delivered_per_district + 1
    result = tiny.run("tpcc_delivery", 1, 7, DATE)
    assert result == {"delivered": [[d_id, oldest] for d_id in range(1, 11)], "skipped": []}
    rows = tiny.rows()
    for d_id in range(1, 11):
        assert schema.new_order_key(1, d_id, oldest) not in rows
        assert keys_of(rows, schema.new_orders_prefix(1, d_id))[0][-1] == oldest + 1
        order = rows[schema.order_key(1, d_id, oldest)]
        assert order["o_carrier_id"] == 7
        lines = lines_of(rows, 1, d_id, oldest)
        assert all(line["ol_delivery_d"] == DATE for line in lines)
        customer_key = schema.customer_key(1, d_id, order["o_c_id"])
        amount = sum(line["ol_amount"] for line in lines)
        assert rows[customer_key]["c_balance"] == before[customer_key]["c_balance"] + amount
        assert rows[customer_key]["c_delivery_cnt"] == 1
    assert rows[schema.warehouse_key(2)] == before[schema.warehouse_key(2)]


def test_delivery_skips_a_district_without_new_orders() -> None:
    """Clause 2.7.4.2: a district with no undelivered order is skipped, the others go on."""
    scale = Scale(items=200, customers_per_district=30, new_orders_per_district=0)
    tiny = Tiny([1], 1, scale=scale)
    assert tiny.run("tpcc_delivery", 1, 3, DATE) == {"delivered": [], "skipped": list(range(1, 11))}
    before = tiny.rows()
    o_id = tiny.run("tpcc_new_order", 1, 4, 2, [[7, 1, 1]], DATE)["o_id"]
    result = tiny.run("tpcc_delivery", 1, 3, DATE + SECOND)
    assert result == {"delivered": [[4, o_id]], "skipped": [1, 2, 3, 5, 6, 7, 8, 9, 10]}
    rows = tiny.rows()
    for d_id in (1, 2, 3, 5):
        assert rows[schema.district_key(1, d_id)] == before[schema.district_key(1, d_id)]
    assert rows[schema.order_key(1, 4, o_id)]["o_carrier_id"] == 3
    assert tiny.run("tpcc_delivery", 1, 3, DATE + 2 * SECOND)["delivered"] == []


def expected_stock_level(rows: dict[Key, Any], w_id: int, d_id: int, threshold: int) -> int:
    next_o_id = rows[schema.district_key(w_id, d_id)]["d_next_o_id"]
    items = {
        line["ol_i_id"]
        for o_id in range(max(1, next_o_id - 20), next_o_id)
        for line in lines_of(rows, w_id, d_id, o_id)
    }
    return sum(1 for i_id in items if rows[schema.stock_key(w_id, i_id)]["s_quantity"] < threshold)


def test_stock_level_counts_distinct_low_stock_items_of_the_last_20_orders(tiny: Tiny) -> None:
    """Clause 2.8.2.2: distinct items, orders D_NEXT_O_ID - 20 .. D_NEXT_O_ID - 1 only."""
    for c_id in (1, 2, 3):
        tiny.run("tpcc_new_order", 2, 8, c_id, [[11, 2, 5], [11, 2, 5], [12, 2, 9]], DATE)
    rows = tiny.rows()
    for threshold in (10, 15, 20, 60, 101):
        assert tiny.run("tpcc_stock_level", 2, 8, threshold) == expected_stock_level(rows, 2, 8, threshold)
    # Every stock is below 101, so the count is the number of distinct items.
    next_o_id = rows[schema.district_key(2, 8)]["d_next_o_id"]
    distinct = {
        line["ol_i_id"]
        for o_id in range(next_o_id - 20, next_o_id)
        for line in lines_of(rows, 2, 8, o_id)
    }
    assert tiny.run("tpcc_stock_level", 2, 8, 101) == len(distinct)


def test_stock_level_looks_at_exactly_the_last_20_orders(tiny: Tiny) -> None:
    """The 21st order from the end is out of the window: its item is not counted."""
    tiny.run("tpcc_new_order", 1, 6, 1, [[200, 1, 1]], DATE)
    for c_id in range(1, 21):
        item = 1 + c_id % 5
        tiny.run("tpcc_new_order", 1, 6, c_id, [[item, 1, 1]], DATE)
    assert tiny.run("tpcc_stock_level", 1, 6, 101) == 5


def test_load_and_scan_procedures_round_trip() -> None:
    tiny = Tiny([1], 1)
    assert tiny.cluster.run("tpcc_load", [[("stock", 1, 999_998), {"x": 1}]]) == 1
    assert tiny.get(("stock", 1, 999_998)) == {"x": 1}
    lo, hi = schema.table_range("warehouse", 1)
    # A procedure's tuples come back as arrays.
    assert tiny.cluster.run("tpcc_scan", lo, hi, 10) == [[["warehouse", 1], tiny.initial[("warehouse", 1)]]]


def test_item_is_one_copy_held_by_every_shard(tiny: Tiny) -> None:
    """ITEM is replicated: each shard leader holds every row of it, and a New-Order reads it
    on its home shard (warehouse 1 is on shard 1, 2 on shard 0)."""
    items = {key: value for key, value in tiny.initial.items() if key[0] == "item"}
    assert len(items) == TINY.items
    for shard in range(2):
        store = tiny.cluster.replica(shard).store
        held = {key: store.latest(key).value for key in store.all_keys() if key.startswith("\x02item\x00")}
        assert held == {pack(key): value for key, value in items.items()}
    for w_id in (1, 2):
        result = tiny.run("tpcc_new_order", w_id, 1, 1, [[5, w_id, 1]], DATE)
        assert result["lines"][0][2] == items[schema.item_key(5)]["i_name"]
