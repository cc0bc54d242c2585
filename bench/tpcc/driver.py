"""The TPC-C terminals: closed loops issuing the 45/43/4/4/4 mix with no think time.

The driver is written against a small ``Target`` interface, ``await target.run_detailed(
name, *args, shard=s)``, which returns a ``Completed`` (the result and the certified and
committed latencies) or raises the typed errors of ``store.core.errors``. The in-process
cluster implements it (``bench.tpcc.local.SimulatedTarget``) and so will an adapter of
the client SDK; the driver itself starts nothing.

Each terminal has a home warehouse and, for Stock-Level, a home district (clause 2.8.1.1).
Terminal i is bound to warehouse ``warehouses[i mod W]``. The mix and New-Order's 1%
rollback come from decks shared by the driver's terminals (``rand.Deck``), so the measured
mix and rollback rate are exact over every 100 draws of the process.

Accounting:
* A conflict abort (``Aborted``) is retried with the same inputs and counted in
  ``aborts``; a rolled-back New-Order (``UserAborted`` on the unused item) is a completed
  New-Order, counted in ``rolled_back`` as well (clause 2.4.2.3 counts it in the mix).
  A transaction undone by failure recovery (``RolledBack``) or refused (``Unavailable``)
  is retried and counted apart; any other error is counted in ``errors`` and not retried.
* A transaction is cross-shard when the warehouses it touches live on different shards:
  a New-Order with a line supplied from a warehouse of another shard, a Payment of a
  customer of another shard's warehouse.
"""

from __future__ import annotations

import asyncio
import datetime
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from bench.tpcc import loader, rand, schema
from bench.tpcc.schema import DISTRICTS_PER_WAREHOUSE, Scale
from store.core.errors import Aborted, MeridianError, RolledBack, Unavailable, UserAborted

TRANSACTION_TYPES = ("new_order", "payment", "order_status", "delivery", "stock_level")
PROCEDURE_OF = {kind: f"tpcc_{kind}" for kind in TRANSACTION_TYPES}
# Clause 2.4.1.5: 1% of order lines are supplied by a remote warehouse; clause 2.5.1.2:
# 15% of payments are for a customer of a remote warehouse, 60% select it by last name.
REMOTE_ORDER_LINE_PERCENT = 1
REMOTE_PAYMENT_PERCENT = 15
BY_LAST_NAME_PERCENT = 60
# Attempts of one transaction before the terminal gives up on it (counted in ``gave_up``).
ATTEMPTS_MAX = 100
# Latencies kept per transaction type for the percentiles (a long run keeps a sample).
LATENCIES_KEPT_MAX = 200_000


@dataclass(frozen=True, slots=True)
class Completed:
    """A committed transaction's result; latencies in seconds (None when not measured).

    ``conflict_retries`` counts conflict aborts a client retried by itself before this
    success (the SDK's ``run`` does), so that the driver still counts them.
    """

    result: Any
    certified_latency_s: float | None = None
    committed_latency_s: float | None = None
    conflict_retries: int = 0


class Target(Protocol):
    async def run_detailed(self, name: str, *args: Any, shard: int) -> Completed: ...


@dataclass(frozen=True, slots=True)
class Request:
    """One transaction's inputs, as a terminal generated them."""

    kind: str
    args: tuple[Any, ...]
    shard: int  # the home warehouse's shard, where the transaction is submitted
    cross_shard: bool
    rollback: bool = False  # a New-Order meant to roll back (unused item id)

    @property
    def procedure(self) -> str:
        return PROCEDURE_OF[self.kind]


class Inputs:
    """Input generation of clauses 2.4.1 to 2.8.1 for one terminal."""

    def __init__(
        self,
        rng: random.Random,
        constants: rand.NURandConstants,
        scale: Scale,
        warehouses: list[int],
        layout: schema.Layout,
        home_w_id: int,
        home_d_id: int,
        rollbacks: rand.Deck[bool],
        history_prefix: str,
    ) -> None:
        assert home_w_id in warehouses
        self.rng = rng
        self.constants = constants
        self.scale = scale
        self.warehouses = warehouses
        self.layout = layout
        self.w_id = home_w_id
        self.d_id = home_d_id
        self.rollbacks = rollbacks
        self.history_prefix = history_prefix
        self._history_seq = 0

    def shard_of(self, w_id: int) -> int:
        return self.layout.unit_of(w_id)

    def _remote_warehouse(self) -> int:
        others = [w for w in self.warehouses if w != self.w_id]
        return self.rng.choice(others) if others else self.w_id

    def _district(self) -> int:
        return self.rng.randint(1, DISTRICTS_PER_WAREHOUSE)

    def _customer(self) -> tuple[int | None, str | None]:
        if self.rng.randint(1, 100) <= BY_LAST_NAME_PERCENT:
            return None, rand.random_last_name(
                self.rng, self.constants, self.scale.customers_per_district
            )
        return rand.customer_id(self.rng, self.constants, self.scale.customers_per_district), None

    def make(self, kind: str, date: datetime.datetime) -> Request:
        home = self.shard_of(self.w_id)
        if kind == "new_order":
            return self.new_order(date)
        if kind == "payment":
            return self.payment(date)
        if kind == "order_status":
            c_id, c_last = self._customer()
            return Request(kind, (self.w_id, self._district(), c_id, c_last), home, False)
        if kind == "delivery":
            return Request(kind, (self.w_id, self.rng.randint(1, 10), date), home, False)
        assert kind == "stock_level", kind
        return Request(kind, (self.w_id, self.d_id, self.rng.randint(10, 20)), home, False)

    def new_order(self, date: datetime.datetime) -> Request:
        rng = self.rng
        d_id = self._district()
        c_id = rand.customer_id(rng, self.constants, self.scale.customers_per_district)
        line_count = rng.randint(5, 15)
        rollback = self.rollbacks.draw()
        lines = []
        for number in range(1, line_count + 1):
            i_id = rand.item_id(rng, self.constants, self.scale.items)
            if rollback and number == line_count:
                i_id = self.scale.unused_item_id
            supply_w_id = self.w_id
            if len(self.warehouses) > 1 and rng.randint(1, 100) <= REMOTE_ORDER_LINE_PERCENT:
                supply_w_id = self._remote_warehouse()
            lines.append([i_id, supply_w_id, rng.randint(1, 10)])
        home = self.shard_of(self.w_id)
        cross = any(self.shard_of(w) != home for _, w, _ in lines)
        args = (self.w_id, d_id, c_id, lines, date)
        return Request("new_order", args, home, cross, rollback)

    def payment(self, date: datetime.datetime) -> Request:
        rng = self.rng
        d_id = self._district()
        c_w_id, c_d_id = self.w_id, d_id
        if len(self.warehouses) > 1 and rng.randint(1, 100) <= REMOTE_PAYMENT_PERCENT:
            c_w_id, c_d_id = self._remote_warehouse(), self._district()
        c_id, c_last = self._customer()
        h_amount = loader.money(rng.randint(100, 500_000))
        self._history_seq += 1
        history_id = f"{self.history_prefix}-{self._history_seq}"
        home = self.shard_of(self.w_id)
        args = (self.w_id, d_id, c_w_id, c_d_id, c_id, c_last, h_amount, date, history_id)
        return Request("payment", args, home, self.shard_of(c_w_id) != home)


@dataclass
class TypeStats:
    completed: int = 0
    rolled_back: int = 0
    aborts: int = 0
    # Speculatively certified, then undone by failure recovery (DESIGN.md §5): retried.
    recovery_rollbacks: int = 0
    unavailable: int = 0
    errors: int = 0
    gave_up: int = 0
    cross_shard: int = 0
    certified_latencies_s: list[float] = field(default_factory=list)
    committed_latencies_s: list[float] = field(default_factory=list)


@dataclass
class Stats:
    by_type: dict[str, TypeStats] = field(
        default_factory=lambda: {kind: TypeStats() for kind in TRANSACTION_TYPES}
    )
    per_second: Counter[int] = field(default_factory=Counter)
    error_examples: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    def completed(self) -> int:
        return sum(stats.completed for stats in self.by_type.values())

    def report(self) -> dict[str, Any]:
        """The figures the issue asks for; rates are fractions (0.01 is 1%)."""
        completed = self.completed()
        new_order = self.by_type["new_order"]
        aborts = sum(s.aborts for s in self.by_type.values())
        errors = sum(s.errors for s in self.by_type.values())
        attempts = completed + aborts + errors
        elapsed = max(self.elapsed_s, 1e-9)
        # Whole seconds only: the last, partial second would look like a drop in the plot.
        seconds = int(self.elapsed_s)
        return {
            "elapsed_s": round(self.elapsed_s, 3),
            "transactions": completed,
            "txn_per_s": round(completed / elapsed, 2),
            "new_order_per_min": round(new_order.completed / elapsed * 60, 1),
            "abort_rate": round(aborts / attempts, 5) if attempts else 0.0,
            "rollback_rate": round(new_order.rolled_back / new_order.completed, 5)
            if new_order.completed
            else 0.0,
            "cross_shard_fraction": round(
                sum(s.cross_shard for s in self.by_type.values()) / completed, 5
            )
            if completed
            else 0.0,
            "mix": {
                kind: round(s.completed / completed, 5) if completed else 0.0
                for kind, s in self.by_type.items()
            },
            "latency_ms": {kind: _latency_summary(s) for kind, s in self.by_type.items()},
            "per_type": {
                kind: {
                    "completed": s.completed,
                    "rolled_back": s.rolled_back,
                    "aborts": s.aborts,
                    "recovery_rollbacks": s.recovery_rollbacks,
                    "unavailable": s.unavailable,
                    "errors": s.errors,
                    "gave_up": s.gave_up,
                    "cross_shard": s.cross_shard,
                }
                for kind, s in self.by_type.items()
            },
            "throughput_per_s": [self.per_second[second] for second in range(seconds)],
            "errors": self.error_examples,
        }


def percentile(values: list[float], fraction: float) -> float | None:
    """The nearest-rank percentile (``fraction`` 0.5 is the median)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def _latency_summary(stats: TypeStats) -> dict[str, float | None]:
    """p50, p99, p99.9 and the maximum (of the latencies kept), certified and committed."""
    summary: dict[str, float | None] = {}
    for what, values in (
        ("certified", stats.certified_latencies_s),
        ("committed", stats.committed_latencies_s),
    ):
        for name, fraction in (("p50", 0.50), ("p99", 0.99), ("p999", 0.999), ("max", 1.0)):
            value = percentile(values, fraction)
            summary[f"{what}_{name}"] = None if value is None else round(value * 1000, 3)
    return summary


@dataclass
class DriverConfig:
    warehouses: list[int]
    layout: schema.Layout
    scale: Scale
    terminals: int
    seed: int = 0
    # Stop after this many seconds of ``clock``, or after this many transactions per
    # terminal, whichever comes first; at least one must be set.
    duration_s: float | None = None
    transactions_per_terminal: int | None = None
    # Distinguishes HISTORY row ids of several runs on one database (inputs depend on the
    # seed alone, so a seed replays the same inputs).
    run_id: str = ""
    attempts_max: int = ATTEMPTS_MAX
    # The warehouses terminals are bound to (None: all of ``warehouses``); remote
    # warehouses are still drawn from all. An in-server generator binds its own unit's.
    home_warehouses: list[int] | None = None
    # Terminal i draws its inputs as terminal ``first_terminal + i`` (its random stream and
    # HISTORY ids): in-server generators on several units each start at their own.
    first_terminal: int = 0


class Driver:
    def __init__(
        self,
        target: Target,
        config: DriverConfig,
        clock: Callable[[], float] = time.monotonic,
        on_second: Callable[[int, Stats], None] | None = None,
    ) -> None:
        assert config.duration_s is not None or config.transactions_per_terminal is not None
        assert config.terminals >= 1 and config.warehouses
        self.target = target
        self.config = config
        self.clock = clock
        self.on_second = on_second
        self.stats = Stats()
        self.constants = rand.run_constants(
            loader.constants_for_seed(config.seed), random.Random(f"tpcc-run/{config.seed}")
        )
        deck_rng = random.Random(f"tpcc-decks/{config.seed}")
        self.mix = rand.mix_deck(deck_rng)
        self.rollbacks = rand.rollback_deck(deck_rng)
        self._start = 0.0
        self._stop_at = math.inf

    def _terminal_inputs(self, index: int) -> Inputs:
        config = self.config
        warehouses = sorted(config.warehouses)
        homes = sorted(config.home_warehouses) if config.home_warehouses is not None else warehouses
        home_w_id = homes[index % len(homes)]
        home_d_id = (index // len(homes)) % DISTRICTS_PER_WAREHOUSE + 1
        terminal = config.first_terminal + index
        rng = random.Random(f"tpcc-terminal/{config.seed}/{terminal}")
        prefix = f"{config.run_id or f's{config.seed}'}-t{terminal}"
        return Inputs(
            rng, self.constants, config.scale, warehouses, config.layout,
            home_w_id, home_d_id, self.rollbacks, prefix,
        )

    async def run(self) -> Stats:
        self._start = self.clock()
        if self.config.duration_s is not None:
            self._stop_at = self._start + self.config.duration_s
        terminals = [
            asyncio.create_task(self._terminal(self._terminal_inputs(index)))
            for index in range(self.config.terminals)
        ]
        ticker = asyncio.create_task(self._tick()) if self.on_second else None
        try:
            await asyncio.gather(*terminals)
        finally:
            if ticker is not None:
                ticker.cancel()
        self.stats.elapsed_s = self.clock() - self._start
        return self.stats

    async def _tick(self) -> None:
        assert self.on_second is not None
        second = 0
        while True:
            await asyncio.sleep(1.0)
            second += 1
            self.on_second(second, self.stats)

    def _date(self) -> datetime.datetime:
        """The run's dates start a second after the load's and advance with ``clock``."""
        return loader.LOAD_DATE + datetime.timedelta(seconds=1 + self.clock() - self._start)

    async def _terminal(self, inputs: Inputs) -> None:
        limit = self.config.transactions_per_terminal
        done = 0
        while self.clock() < self._stop_at and (limit is None or done < limit):
            request = inputs.make(self.mix.draw(), self._date())
            await self._execute(request)
            done += 1

    async def _execute(self, request: Request) -> None:
        stats = self.stats.by_type[request.kind]
        first = self.clock()  # latencies are the terminal's: from its first attempt
        for _ in range(self.config.attempts_max):
            try:
                completed = await self.target.run_detailed(
                    request.procedure, *request.args, shard=request.shard
                )
            except Aborted:
                stats.aborts += 1
                continue
            except RolledBack:
                stats.recovery_rollbacks += 1
                continue
            except Unavailable:
                stats.unavailable += 1
                await asyncio.sleep(0.001)
                continue
            except UserAborted as exc:
                if request.rollback:
                    stats.rolled_back += 1
                    self._record(request, stats, Completed(None), self.clock() - first)
                else:
                    self._error(request, stats, exc)
                return
            except MeridianError as exc:
                self._error(request, stats, exc)
                return
            if request.rollback:
                self._error(request, stats, AssertionError("a New-Order with an unused item committed"))
                return
            self._record(request, stats, completed, self.clock() - first)
            return
        stats.gave_up += 1

    def _record(self, request: Request, stats: TypeStats, completed: Completed, wall_s: float) -> None:
        stats.completed += 1
        stats.aborts += completed.conflict_retries
        stats.cross_shard += request.cross_shard
        self.stats.per_second[int(self.clock() - self._start)] += 1
        if completed.result is None and request.rollback:
            return  # a rollback has no certified or committed moment
        if len(stats.committed_latencies_s) < LATENCIES_KEPT_MAX:
            # End to end, as the terminal waited (``wall_s``: since its first attempt, every
            # conflict retry included, the SDK's and ours): committed when the call returned,
            # certified as much earlier as the SDK's last attempt says.
            certified = completed.certified_latency_s
            committed = completed.committed_latency_s
            stats.committed_latencies_s.append(wall_s)
            if certified is None or committed is None:
                stats.certified_latencies_s.append(wall_s)
            else:
                stats.certified_latencies_s.append(max(0.0, wall_s - (committed - certified)))

    def _error(self, request: Request, stats: TypeStats, exc: BaseException) -> None:
        stats.errors += 1
        if len(self.stats.error_examples) < 10:
            self.stats.error_examples.append(
                f"{request.procedure}{request.args!r}: {type(exc).__name__}: {exc}"
            )
