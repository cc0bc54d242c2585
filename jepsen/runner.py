"""Runs a workload against a real cluster through the SDK and records a Jepsen history.

The workloads are the simulator's (``store.sim.workloads``): the same operations, the same
history format, the same checkers — only the clients are real processes' coroutines and the
times are wall-clock nanoseconds since the run began. Outcomes: committed → ``:ok``;
aborted, unavailable or rolled back → ``:fail`` with ``:error`` (``:rolled-back`` for
``RolledBack``); ``OutcomeUnknown`` → ``:info``, and the client continues as a new process,
as Jepsen's do. ``python -m jepsen run`` and the cluster tests both drive clients here.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from jepsen.history import Op
from store.core.errors import MeridianError, OutcomeUnknown
from store.core.oplist import OPS_PROCEDURE

if TYPE_CHECKING:  # the harness imports this before it may open sockets
    from store.client import Client


class History:
    """The operations of a run, in order, timed from when it was made."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.started_ns = time.monotonic_ns()

    def record(self, op_type: str, f: str, value: Any, process: int | str, **extra: Any) -> None:
        op = Op(op_type, f, value, process, time.monotonic_ns() - self.started_ns, len(self.ops))
        op.extra.update(extra)
        self.ops.append(op)


@dataclass
class RunResult:
    ops: list[Op]
    counts: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)


def error_name(exc: BaseException) -> str:
    """An SDK error as a history's ``:error``: ``RolledBack`` → ``rolled-back``."""
    name = type(exc).__name__
    return "".join(f"-{c.lower()}" if c.isupper() else c for c in name).lstrip("-")


async def run_workload(
    connect: Callable[[], Any],
    workload: Any,
    clients: int,
    duration_s: float,
    nemesis: Callable[[float], Any] | None = None,
    *,
    rate: float | None = None,
    history: History | None = None,
) -> RunResult:
    """``connect()`` returns a connected ``Client``; ``workload.next()`` gives operations.
    ``rate``: at most that many operations a second in all. ``history``: record into it
    (a nemesis records its own operations there too)."""
    history = history if history is not None else History()
    record = history.record
    counts = {"ok": 0, "fail": 0, "info": 0}
    errors: dict[str, int] = {}
    stop_at = time.monotonic() + duration_s
    interval = clients / rate if rate else 0.0

    async def client_loop(index: int) -> None:
        client: Client = await connect()
        process = index
        next_at = time.monotonic() + random.random() * interval
        try:
            while time.monotonic() < stop_at:
                if interval:
                    await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                    next_at += interval
                    if time.monotonic() >= stop_at:
                        break
                operation = workload.next()
                record("invoke", operation.f, operation.value, process)
                try:
                    if operation.procedure == OPS_PROCEDURE:
                        result = await client.run_ops(operation.args[0], route=operation.keys[0])
                    else:
                        result = await client.run(
                            operation.procedure, *operation.args, route=operation.keys[0]
                        )
                except OutcomeUnknown as exc:
                    _settled(operation, "info")
                    counts["info"] += 1
                    errors["OutcomeUnknown"] = errors.get("OutcomeUnknown", 0) + 1
                    record("info", operation.f, operation.value, process, error=error_name(exc))
                    process += clients
                    continue
                except MeridianError as exc:
                    _settled(operation, "fail")
                    counts["fail"] += 1
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    record("fail", operation.f, operation.value, process, error=error_name(exc))
                    continue
                counts["ok"] += 1
                value = operation.complete(result)
                _settled(operation, "ok")
                record("ok", operation.f, value, process)
        finally:
            await client.close()

    tasks = [asyncio.create_task(client_loop(i)) for i in range(clients)]
    if nemesis is not None:
        tasks.append(asyncio.create_task(nemesis(duration_s)))
    await asyncio.gather(*tasks)
    return RunResult(history.ops, counts, errors)


def _settled(operation: Any, outcome: str) -> None:
    """Tells the workload how an operation ended (list-append's clears need it)."""
    settled = getattr(operation, "settled", None)
    if settled is not None:
        settled(outcome)
