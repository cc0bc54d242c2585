"""Runs a workload against a real cluster through the SDK and records a Jepsen history.

The workloads are the simulator's (``store.sim.workloads``): the same operations, the same
history format, the same checkers — only the clients are real processes' coroutines and the
times are wall-clock nanoseconds since the run began. A client whose outcome is unknown
records ``:info`` and continues as a new process, as Jepsen's do.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jepsen.history import Op
from store.client import Client
from store.core.errors import MeridianError, OutcomeUnknown
from store.core.txn import OPS_PROCEDURE


@dataclass
class RunResult:
    ops: list[Op]
    counts: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)


async def run_workload(
    connect: Callable[[], Any],
    workload: Any,
    clients: int,
    duration_s: float,
    nemesis: Callable[[float], Any] | None = None,
) -> RunResult:
    """``connect()`` returns a connected ``Client``; ``workload.next()`` gives operations."""
    history: list[Op] = []
    counts = {"ok": 0, "fail": 0, "info": 0}
    errors: dict[str, int] = {}
    started = time.monotonic_ns()
    stop_at = time.monotonic() + duration_s

    def record(op_type: str, f: str, value: Any, process: int) -> None:
        history.append(Op(op_type, f, value, process, time.monotonic_ns() - started, len(history)))

    async def client_loop(index: int) -> None:
        client: Client = await connect()
        process = index
        try:
            while time.monotonic() < stop_at:
                operation = workload.next()
                record("invoke", operation.f, operation.value, process)
                try:
                    if operation.procedure == OPS_PROCEDURE:
                        result = await client.run_ops(operation.args[0], route=operation.keys[0])
                    else:
                        result = await client.run(
                            operation.procedure, *operation.args, route=operation.keys[0]
                        )
                except OutcomeUnknown:
                    counts["info"] += 1
                    errors["OutcomeUnknown"] = errors.get("OutcomeUnknown", 0) + 1
                    record("info", operation.f, operation.value, process)
                    process += clients
                    continue
                except MeridianError as exc:
                    counts["fail"] += 1
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    record("fail", operation.f, operation.value, process)
                    continue
                counts["ok"] += 1
                record("ok", operation.f, operation.complete(result), process)
        finally:
            await client.close()

    tasks = [asyncio.create_task(client_loop(i)) for i in range(clients)]
    if nemesis is not None:
        tasks.append(asyncio.create_task(nemesis(duration_s)))
    await asyncio.gather(*tasks)
    return RunResult(history, counts, errors)


def make_rng(seed: int | None = None) -> random.Random:
    return random.Random(seed)
