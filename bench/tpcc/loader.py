"""The initial TPC-C database (clause 4.3.3.1), generated per warehouse from a seed.

``warehouse_rows(w_id, ...)`` returns every row of one warehouse (its eight tables' rows
and the two index tables' entries) and ``item_rows(...)`` the one ITEM table. Keys are the
tuples of ``schema``. The rows of a warehouse depend only on (seed, w_id), so warehouses
are generated in parallel by worker processes and any subset can be regenerated
identically. ``initial_rows`` groups them per shard, with ITEM apart (it is on every
shard); ``load_through_transactions`` writes them through the ``tpcc_load`` procedure in
batches that each stay on one shard (an ITEM batch is certified on all of them), and
``bench.tpcc.local.load`` preloads an in-process cluster.

Sizes follow a ``Scale``: the full specification, or shrunk like py-tpcc's ``--scalefactor``.
To keep consistency conditions 8 and 9 (W_YTD and D_YTD equal the sum of HISTORY amounts)
true at any scale, D_YTD starts at 10.00 per customer of the district rather than the
fixed 30,000.00 (which is the same at full scale).
"""

from __future__ import annotations

import asyncio
import datetime
import random
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from bench.tpcc import rand, schema
from bench.tpcc.schema import DISTRICTS_PER_WAREHOUSE, Key, Scale
from store.core.keys import pack

# A fixed load date keeps a seed's database identical between runs; the driver passes later
# dates to the transactions.
LOAD_DATE = datetime.datetime(2027, 1, 15, 8, 0, tzinfo=datetime.UTC)
HISTORY_AMOUNT = Decimal("10.00")  # H_AMOUNT of the initial HISTORY rows
YTD_PER_CUSTOMER = HISTORY_AMOUNT
CREDIT_LIMIT = Decimal("50000.00")
# Batches written by one tpcc_load transaction (each stays on one shard): the number of rows
# and the approximate encoded bytes, both well under the core's per-transaction limits.
LOAD_BATCH_ROWS_MAX = 500
LOAD_BATCH_BYTES_MAX = 1 << 20


def constants_for_seed(seed: int) -> rand.NURandConstants:
    """The load's NURand constants; the driver derives its run constants from these."""
    return rand.load_constants(random.Random(f"tpcc-constants/{seed}"))


def _address(rng: random.Random, prefix: str) -> dict[str, str]:
    return {
        f"{prefix}_street_1": rand.a_string(rng, 10, 20),
        f"{prefix}_street_2": rand.a_string(rng, 10, 20),
        f"{prefix}_city": rand.a_string(rng, 10, 20),
        f"{prefix}_state": rand.letters(rng, 2, 2).upper(),
        f"{prefix}_zip": rand.zip_code(rng),
    }


def money(cents: int) -> Decimal:
    """An amount of money: ``cents`` hundredths, two places kept (``money(0)`` is 0.00)."""
    return Decimal(cents).scaleb(-2)


def rate(basis_points: int) -> Decimal:
    """A tax or discount rate: ``basis_points`` ten-thousandths, four places kept."""
    return Decimal(basis_points).scaleb(-4)


def item_rows(scale: Scale, seed: int) -> dict[Key, Any]:
    """The ITEM table (one copy: the table is replicated to every shard)."""
    rng = random.Random(f"tpcc-items/{seed}")
    rows: dict[Key, Any] = {}
    for i_id in range(1, scale.items + 1):
        rows[schema.item_key(i_id)] = {
            "i_id": i_id,
            "i_im_id": rng.randint(1, 10_000),
            "i_name": rand.a_string(rng, 14, 24),
            "i_price": money(rng.randint(100, 10_000)),
            "i_data": rand.data_field(rng, 26, 50),
        }
    return rows


def warehouse_rows(w_id: int, scale: Scale, seed: int) -> dict[Key, Any]:
    """Every row of warehouse ``w_id``: WAREHOUSE, STOCK, DISTRICT, CUSTOMER, HISTORY, ORDER,
    NEW-ORDER, ORDER-LINE and the index entries."""
    rng = random.Random(f"tpcc-warehouse/{seed}/{w_id}")
    constants = constants_for_seed(seed)
    customers = scale.customers_per_district
    rows: dict[Key, Any] = {}
    rows[schema.warehouse_key(w_id)] = {
        "w_id": w_id,
        "w_name": rand.a_string(rng, 6, 10),
        **_address(rng, "w"),
        "w_tax": rate(rng.randint(0, 2000)),
    }
    rows[schema.warehouse_ytd_key(w_id)] = {
        "w_ytd": DISTRICTS_PER_WAREHOUSE * customers * YTD_PER_CUSTOMER,
    }
    for i_id in range(1, scale.items + 1):
        stock: dict[str, Any] = {"s_i_id": i_id, "s_w_id": w_id, "s_quantity": rng.randint(10, 100)}
        for d_id in range(1, DISTRICTS_PER_WAREHOUSE + 1):
            stock[f"s_dist_{d_id:02d}"] = rand.a_string(rng, 24, 24)
        stock.update(
            s_ytd=0, s_order_cnt=0, s_remote_cnt=0, s_data=rand.data_field(rng, 26, 50)
        )
        rows[schema.stock_key(w_id, i_id)] = stock
    for d_id in range(1, DISTRICTS_PER_WAREHOUSE + 1):
        rows.update(_district_rows(rng, constants, w_id, d_id, scale))
    return rows


def _district_rows(
    rng: random.Random, constants: rand.NURandConstants, w_id: int, d_id: int, scale: Scale
) -> dict[Key, Any]:
    customers = scale.customers_per_district
    rows: dict[Key, Any] = {}
    rows[schema.district_key(w_id, d_id)] = {
        "d_id": d_id,
        "d_w_id": w_id,
        "d_name": rand.a_string(rng, 6, 10),
        **_address(rng, "d"),
        "d_tax": rate(rng.randint(0, 2000)),
        "d_next_o_id": scale.orders_per_district + 1,
    }
    rows[schema.district_ytd_key(w_id, d_id)] = {"d_ytd": customers * YTD_PER_CUSTOMER}
    name_bound = rand.last_name_bound(customers)
    for c_id in range(1, customers + 1):
        if c_id <= 1000:
            c_last = rand.last_name(c_id - 1)
        else:
            c_last = rand.last_name(rand.nurand(rng, rand.A_C_LAST, 0, name_bound, constants.c_last))
        c_first = rand.letters(rng, 8, 16)
        rows[schema.customer_key(w_id, d_id, c_id)] = {
            "c_id": c_id,
            "c_d_id": d_id,
            "c_w_id": w_id,
            "c_last": c_last,
            "c_middle": "OE",
            "c_first": c_first,
            **_address(rng, "c"),
            "c_phone": rand.n_string(rng, 16, 16),
            "c_since": LOAD_DATE,
            "c_credit": "BC" if rng.random() < 0.10 else "GC",
            "c_credit_lim": CREDIT_LIMIT,
            "c_discount": rate(rng.randint(0, 5000)),
            "c_balance": -HISTORY_AMOUNT,
            "c_ytd_payment": HISTORY_AMOUNT,
            "c_payment_cnt": 1,
            "c_delivery_cnt": 0,
            "c_data": rand.a_string(rng, 300, 500),
        }
        rows[schema.customer_name_key(w_id, d_id, c_last, c_first, c_id)] = None
        rows[schema.history_key(w_id, d_id, f"load-{c_id:05d}")] = {
            "h_c_id": c_id,
            "h_c_d_id": d_id,
            "h_c_w_id": w_id,
            "h_d_id": d_id,
            "h_w_id": w_id,
            "h_date": LOAD_DATE,
            "h_amount": HISTORY_AMOUNT,
            "h_data": rand.a_string(rng, 12, 24),
        }
    order_customers = list(range(1, customers + 1))
    rng.shuffle(order_customers)
    delivered_max = scale.delivered_per_district
    for o_id, c_id in enumerate(order_customers, start=1):
        delivered = o_id <= delivered_max
        ol_cnt = rng.randint(5, 15)
        rows[schema.order_key(w_id, d_id, o_id)] = {
            "o_id": o_id,
            "o_d_id": d_id,
            "o_w_id": w_id,
            "o_c_id": c_id,
            "o_entry_d": LOAD_DATE,
            "o_carrier_id": rng.randint(1, 10) if delivered else None,
            "o_ol_cnt": ol_cnt,
            "o_all_local": 1,
        }
        rows[schema.order_by_customer_key(w_id, d_id, c_id, o_id)] = None
        if not delivered:
            rows[schema.new_order_key(w_id, d_id, o_id)] = {"no_o_id": o_id}
        for number in range(1, ol_cnt + 1):
            rows[schema.order_line_key(w_id, d_id, o_id, number)] = {
                "ol_o_id": o_id,
                "ol_d_id": d_id,
                "ol_w_id": w_id,
                "ol_number": number,
                "ol_i_id": rng.randint(1, scale.items),
                "ol_supply_w_id": w_id,
                "ol_delivery_d": LOAD_DATE if delivered else None,
                "ol_quantity": 5,
                "ol_amount": money(0 if delivered else rng.randint(1, 999_999)),
                "ol_dist_info": rand.a_string(rng, 24, 24),
            }
    return rows


@dataclass
class InitialRows:
    """The initial database: each shard's warehouse rows, and ITEM, which is on every shard."""

    by_shard: list[dict[Key, Any]]
    items: dict[Key, Any]

    def all(self) -> dict[Key, Any]:
        """Every row once (what each shard holds, ITEM being on all of them)."""
        rows = dict(self.items)
        for shard_rows in self.by_shard:
            rows.update(shard_rows)
        return rows


def _generate(job: tuple[str, int, Scale, int]) -> tuple[str, int, dict[Key, Any]]:
    kind, ident, scale, seed = job
    if kind == "items":
        return kind, ident, item_rows(scale, seed)
    return kind, ident, warehouse_rows(ident, scale, seed)


def initial_rows(
    warehouses: Sequence[int],
    layout: schema.Layout,
    scale: Scale,
    seed: int = 0,
    processes: int = 1,
    progress: bool = False,
) -> InitialRows:
    """The initial database: one {key: value} dict per unit (a shard, or a worker of one:
    ``layout.unit_of``), and ITEM.

    ``processes`` > 1 generates warehouses in that many processes; ``progress`` shows a
    tqdm bar of warehouses (and ITEM) generated.
    """
    jobs = [("items", 0, scale, seed)]
    jobs += [("warehouse", w_id, scale, seed) for w_id in warehouses]
    initial = InitialRows([{} for _ in range(layout.units)], {})
    results: Iterable[tuple[str, int, dict[Key, Any]]]
    if processes > 1:
        pool = ProcessPoolExecutor(max_workers=processes)
        results = pool.map(_generate, jobs)
    else:
        pool = None
        results = map(_generate, jobs)
    try:
        for kind, ident, rows in _with_progress(results, len(jobs), progress, "generate"):
            if kind == "items":
                initial.items = rows
            else:
                initial.by_shard[layout.unit_of(ident)].update(rows)
    finally:
        if pool is not None:
            pool.shutdown()
    return initial


def _with_progress(items: Iterable[Any], total: int, progress: bool, what: str) -> Iterable[Any]:
    if not progress:
        return items
    from tqdm import tqdm

    bar: Iterable[Any] = tqdm(items, total=total, desc=f"tpcc {what}", unit=" part")
    return bar


def load_batches(rows: dict[Key, Any]) -> list[list[list[Any]]]:
    """Splits one shard's rows into ``tpcc_load`` argument lists within the batch limits,
    in key order."""
    from store.core.oplist import value_size

    batches: list[list[list[Any]]] = []
    batch: list[list[Any]] = []
    batch_bytes = 0
    for stored, key, value in sorted((pack(key), key, value) for key, value in rows.items()):
        size = len(stored) + value_size(value)
        if batch and (len(batch) >= LOAD_BATCH_ROWS_MAX or batch_bytes + size > LOAD_BATCH_BYTES_MAX):
            batches.append(batch)
            batch, batch_bytes = [], 0
        batch.append([key, value])
        batch_bytes += size
    if batch:
        batches.append(batch)
    return batches


async def load_through_transactions(
    run: Callable[..., Awaitable[Any]],
    initial: InitialRows,
    concurrency: int = 8,
    progress: bool = False,
) -> int:
    """Writes the initial rows through ``tpcc_load`` transactions; returns the rows written.

    ``run(name, *args, shard=s)`` runs a procedure with shard s's leader as coordinator, so
    each batch is written where it lives; ITEM's batches are coordinated by shard 0 and
    certified on every shard. Batches are independent (they write disjoint keys), so
    ``concurrency`` of them run at once.
    """
    batches = [(0, batch) for batch in load_batches(initial.items)]
    batches += [
        (shard, batch)
        for shard, rows in enumerate(initial.by_shard)
        for batch in load_batches(rows)
    ]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(len(batch) for _, batch in batches), desc="tpcc load", unit=" row")
    semaphore = asyncio.Semaphore(concurrency)
    written = 0

    async def write(shard: int, batch: list[list[Any]]) -> None:
        nonlocal written
        async with semaphore:
            count = await run("tpcc_load", batch, shard=shard)
        written += count
        if bar is not None:
            bar.update(count)

    try:
        await asyncio.gather(*(write(shard, batch) for shard, batch in batches))
    finally:
        if bar is not None:
            bar.close()
    return written
