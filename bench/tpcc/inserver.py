"""TPC-C generated inside each shard leader: ``bench/tpcc.py --generators in-server``.

The way Mako measures TPC-C: no client path. Each shard leader (each worker, with workers)
runs ``in_flight`` terminals of the driver (``bench.tpcc.driver.Driver``, the same inputs,
mix, retries and accounting as through the SDK) bound to the warehouses it holds, and hands
each attempt to its replica as a ``Submit`` object (``store.node.generator.LocalRun``).
Remote warehouses (1% of order lines, 15% of payments) are any of the run's warehouses, so
those transactions still cross the RPC core to the unit holding them; replication runs as
always. ``bench.tpcc.procedures.register`` registers the workload as ``tpcc`` beside the
procedures, so a cluster that loads the procedures can run it (on servers started with
``MERIDIAN_LOAD_GENERATORS=1``).

The answer of one leader (``answer``) and their sum (``merged_report``) carry the driver's
counters per transaction type and committed latencies as HDR histograms (microseconds, from
a terminal's first attempt to the final outcome). Certified latencies are not measured
here: a generator waits for the final outcome only.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

from hdrh.histogram import HdrHistogram

from bench.tpcc import schema
from bench.tpcc.driver import TRANSACTION_TYPES, Completed, Driver, DriverConfig, Stats
from store.client.protocol import ClientSettings
from store.core.errors import ERROR_OF_STATUS, InvalidRequest, Status
from store.core.partition import Partitioner, WorkerPartitioner

WORKLOAD = "tpcc"
LATENCY_MAX_US = 600_000_000
COUNTERS = (
    "completed", "rolled_back", "aborts", "recovery_rollbacks", "unavailable", "errors",
    "gave_up", "cross_shard",
)
ERROR_EXAMPLES_MAX = 10


def params(warehouses: int, scale: schema.Scale, run_id: str) -> dict[str, Any]:
    """The GENERATE request's ``params``: warehouses 1..``warehouses`` are the run's."""
    return {
        "warehouses": warehouses,
        "scale": {
            "items": scale.items,
            "customers_per_district": scale.customers_per_district,
            "new_orders_per_district": scale.new_orders_per_district,
        },
        "run_id": run_id,
    }


def layout_of(partitioner: Partitioner) -> schema.Layout:
    if isinstance(partitioner, WorkerPartitioner):
        return schema.Layout(partitioner.shards, partitioner.workers)
    return schema.Layout(partitioner.shard_count)


class _LocalTarget:
    """The driver's ``Target`` on this leader: one ``LocalRun.submit`` per attempt, the
    final outcome turned into the SDK's result or error. Conflicts are retried here as the
    SDK's ``run`` retries them (``ClientSettings``: the same limit and backoff, reported in
    ``conflict_retries``); an immediate retry ran into the same conflict again (in-server
    abort rate 24.7% against 10.7% through the SDK, 2 shards x 2 workers)."""

    def __init__(self, run: Any, seed: int) -> None:
        self.run = run
        self.settings = ClientSettings()
        self.rng = random.Random(seed)

    async def run_detailed(self, name: str, *args: Any, shard: int = 0) -> Completed:
        assert shard == self.run.unit, "a terminal's transaction is homed on its own unit"
        settings = self.settings
        backoff = settings.backoff_initial_s
        for retries in itertools.count():
            outcome = await self.run.submit(name, list(args))
            if outcome.status == Status.COMMITTED:
                return Completed(outcome.result, conflict_retries=retries)
            status = Status(outcome.status)
            if status != Status.ABORTED or retries >= settings.retries_max:
                raise ERROR_OF_STATUS.get(status, InvalidRequest)(outcome.detail or status.name.lower())
            await asyncio.sleep(backoff * (0.5 + self.rng.random()))
            backoff = min(backoff * 2, settings.backoff_max_s)
        raise AssertionError("unreachable")


async def run(local: Any) -> dict[str, Any]:
    """The registered workload: ``local`` is a ``store.node.generator.LocalRun``."""
    try:
        count = int(local.params["warehouses"])
        scale = schema.Scale(**{k: int(v) for k, v in local.params["scale"].items()})
        run_id = str(local.params["run_id"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InvalidRequest(f"tpcc: bad params {local.params!r} ({exc})") from None
    layout = layout_of(local.partitioner)
    problem = schema.placement_problem(local.partitioner, layout)
    if problem is not None:
        raise InvalidRequest(f"tpcc: this cluster's placement does not suit TPC-C: {problem}")
    warehouses = list(range(1, count + 1))
    mine = [w for w in warehouses if layout.unit_of(w) == local.unit]
    if not mine:
        return answer(local.unit, Stats(), [])
    config = DriverConfig(
        warehouses, layout, scale, local.in_flight, seed=local.seed, duration_s=local.duration_s,
        run_id=f"{run_id}-u{local.unit}", home_warehouses=mine,
        first_terminal=local.unit * local.in_flight,
    )
    stats = await Driver(_LocalTarget(local, local.seed * 1_000_003 + local.unit), config).run()
    return answer(local.unit, stats, mine)


def answer(unit: int, stats: Stats, warehouses: list[int]) -> dict[str, Any]:
    """One leader's figures, in a form that sums (``merged_report``)."""
    histograms = {}
    for kind, typed in stats.by_type.items():
        histogram = HdrHistogram(1, LATENCY_MAX_US, 3)
        for seconds in typed.committed_latencies_s:
            histogram.record_value(min(max(1, int(seconds * 1e6)), LATENCY_MAX_US))
        histograms[kind] = histogram.encode()
    seconds = int(stats.elapsed_s)
    return {
        "unit": unit,
        "warehouses": warehouses,
        "elapsed_s": stats.elapsed_s,
        "per_type": {
            kind: {name: getattr(typed, name) for name in COUNTERS}
            for kind, typed in stats.by_type.items()
        },
        "histograms": histograms,
        "throughput_per_s": [stats.per_second[second] for second in range(seconds)],
        "errors": stats.error_examples,
    }


def merged_report(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """The leaders' answers as one report: their counters summed into a ``Stats`` (whose
    ``report`` computes the rates), latencies from the summed histograms (certified ones
    None: not measured in-server)."""
    stats = Stats()
    histograms = {kind: HdrHistogram(1, LATENCY_MAX_US, 3) for kind in TRANSACTION_TYPES}
    for one in answers:
        for kind in TRANSACTION_TYPES:
            typed = stats.by_type[kind]
            for name in COUNTERS:
                setattr(typed, name, getattr(typed, name) + one["per_type"][kind][name])
            histograms[kind].add(HdrHistogram.decode(one["histograms"][kind]))
        for second, count in enumerate(one["throughput_per_s"]):
            stats.per_second[second] += count
        stats.error_examples.extend(one["errors"][: ERROR_EXAMPLES_MAX - len(stats.error_examples)])
        stats.elapsed_s = max(stats.elapsed_s, one["elapsed_s"])
    report = stats.report()
    report["latency_ms"] = {kind: _committed_latency(histograms[kind]) for kind in TRANSACTION_TYPES}
    return report


def _committed_latency(histogram: HdrHistogram) -> dict[str, float | None]:
    summary: dict[str, float | None] = {}
    for name, percent in (("p50", 50.0), ("p99", 99.0), ("p999", 99.9), ("max", 100.0)):
        summary[f"certified_{name}"] = None
        value = histogram.get_value_at_percentile(percent) if histogram.get_total_count() else None
        summary[f"committed_{name}"] = None if value is None else round(value / 1000, 3)
    return summary
