"""Reading the TPC-C tables back from followers, for the consistency checks on every replica.

A follower serves read-only snapshots of its shard at its vector watermark
(``Client.read_snapshot``): only committed transactions, consistent within the shard. Every
warehouse lives on one shard, so each warehouse's tables are read from that shard's follower
in the region, in ``read_snapshot`` scans of ``page_rows`` rows, each page starting at the
least key after the previous page's last (``schema.key_after``: a key of the same warehouse,
so the page still names one shard). A snapshot read takes keys and bounds as tuples or in
their stored form (``store.core.keys.pack``; the bounds here are stored: a prefix's end has
no tuple) and gives tuple keys back, as the consistency checker takes them.

The pages are separate snapshots, each at the follower's watermark at that moment. They
agree with each other (and conditions 8 to 10, which join warehouses of different shards,
hold) when nothing commits meanwhile and the followers have caught up with the leaders,
which ``wait_caught_up`` waits for: every follower's vector watermark must cover every
leader's durable watermark as it was when the wait started, so each transaction committed
before the wait (including the cross-shard ones, whose clocks have entries of other shards)
is visible to every follower.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bench.tpcc import schema
from bench.tpcc.schema import Key
from store.core.keys import pack
from store.core.partition import clock_marks

# Rows per snapshot page: the follower's answer must cross the RPC layer in one response
# (500 customers are about 350 KB).
PAGE_ROWS = 500
# Seconds to wait for the followers to catch up before checking them anyway.
CATCH_UP_TIMEOUT_S = 60.0
CATCH_UP_POLL_S = 0.05


@dataclass(frozen=True)
class Replica:
    """A replica set holding every warehouse: the leaders (``region`` None) or the
    followers of one region. ``name`` labels it in reports."""

    name: str
    region: str | None


def replicas_of(config: Any) -> tuple[list[Replica], list[str]]:
    """(the replica sets to check, notes on regions left out).

    The leaders first, named by their region when they share one; then one set per region
    with a follower of every shard (a region following only some shards cannot be checked:
    conditions 8 to 10 need every warehouse).
    """
    leader_regions = {shard.region for shard in config.shards}
    leaders = leader_regions.pop() if len(leader_regions) == 1 else "leaders"
    replicas = [Replica(leaders, None)]
    notes = []
    for region in config.regions:
        holding = [s for s in config.shards if any(r == region for r, _ in s.followers)]
        if not holding:
            continue
        if len(holding) < len(config.shards):
            notes.append(f"region {region} follows {len(holding)} of {len(config.shards)} shards")
            continue
        name = region if region != leaders else f"{region}-followers"
        replicas.append(Replica(name, region))
    return replicas, notes


def replicas_in(shard: Any) -> list[tuple[str, tuple[str, int]]]:
    """(region, address) of every replica of a shard in the cluster file, its first leader
    first."""
    return [(shard.region, shard.leader), *shard.followers]


async def follower_rows(
    client: Any,
    warehouses: Iterable[int],
    region: str,
    page_rows: int = PAGE_ROWS,
) -> dict[Key, Any]:
    """Every row of the TPC-C tables of ``warehouses`` as the followers in ``region`` hold
    them, read through ``read_snapshot`` scans of ``page_rows`` rows."""
    rows: dict[Key, Any] = {}
    for w_id in warehouses:
        for table in schema.WAREHOUSE_TABLES:
            lo, hi = schema.table_range(table, w_id)
            rows.update(await scan_pages(client, lo, hi, region, page_rows))
    return rows


async def scan_pages(
    client: Any, lo: str, hi: str, region: str, page_rows: int = PAGE_ROWS
) -> list[tuple[Key, Any]]:
    """Every pair of ``[lo, hi)`` (stored bounds of one shard's keys) from its follower in
    ``region``."""
    found: list[tuple[Key, Any]] = []
    while True:
        snapshot = await client.read_snapshot(scans=[(lo, hi, page_rows)], region=region)
        page = snapshot.scans[0]
        found.extend(page)
        if len(page) < page_rows:
            return found
        lo = schema.stored_after(found[-1][0])


def _probe_keys(config: Any) -> list[str]:
    """A key of each shard to address its followers by (a snapshot names one shard)."""
    partitioner = config.partitioner()
    keys: dict[int, str] = {}
    shard_count = len(config.shards)
    for w_id in range(1, 4 * shard_count + 1):
        key = pack(schema.warehouse_key(w_id))
        keys.setdefault(partitioner.shard_of(key), key)
    return [keys[shard] for shard in range(shard_count)]


async def wait_caught_up(
    client: Any, config: Any, timeout_s: float = CATCH_UP_TIMEOUT_S, dead: set[str] | None = None
) -> dict[str, Any]:
    """Waits (at most ``timeout_s``) until every follower's vector watermark covers every
    shard's durable watermark of now (with workers the least of its workers' claims). The
    leaders are the cluster map's (after a failover a follower of the cluster file may lead
    its shard: it is not waited for, nor is a replica in ``dead``).

    Returns ``{"behind": {region: the greatest shortfall of its followers, in counter
    values (0: caught up)}, "waited_s": seconds}``.
    """
    from store.core.errors import Unavailable

    started = time.monotonic()
    _, leaders = await client.cluster_map()
    dead = dead or set()
    marks: dict[int, int] = {}
    for shard, status in enumerate(await client.status()):
        if status is None:
            raise RuntimeError(f"the leader of shard {shard} does not answer")
        marks[shard] = int(status["watermark"])
    target = clock_marks(marks, config.workers)  # by vector-clock entry
    probes = _probe_keys(config)
    pending = [
        (shard.shard, region) for shard in config.shards for region, (host, port) in shard.followers
        if f"{host}:{port}" not in dead and f"{host}:{port}" != leaders[shard.shard]
    ]
    behind = {region: 0 for _, region in pending}
    while True:
        shortfalls = {}
        for shard, region in pending:
            try:
                snapshot = await client.read_snapshot([probes[shard]], region=region)
            except Unavailable:
                # A restarted follower still copying its state: behind by all it lacks.
                shortfalls[shard, region] = max(target.values())
                continue
            shortfalls[shard, region] = max(max(0, target[s] - snapshot.vw[s]) for s in target)
        pending = [replica for replica, shortfall in shortfalls.items() if shortfall > 0]
        if not pending or time.monotonic() - started > timeout_s:
            break
        await asyncio.sleep(CATCH_UP_POLL_S)
    for (_, region), shortfall in shortfalls.items():
        behind[region] = max(behind[region], shortfall)
    return {"behind": behind, "waited_s": round(time.monotonic() - started, 3)}
