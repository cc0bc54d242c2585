"""Shared helpers of the RPC tests."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from store.rpc import Nexus, RpcSettings
from store.rpc.aio import new_event_loop
from store.rpc.sim import SimNetwork, SimRpc

T = TypeVar("T")
TEST_TIMEOUT_S = 60.0


def run(main: Callable[[], Awaitable[T]], timeout_s: float = TEST_TIMEOUT_S) -> T:
    """Run an async test body on a fresh uvloop loop (the loop production uses)."""
    loop = new_event_loop()
    try:
        return loop.run_until_complete(asyncio.wait_for(main(), timeout_s))
    finally:
        loop.close()


def echo_nexus(*, reverse: bool = False) -> Nexus:
    nexus = Nexus()
    nexus.register_req_func(1, (lambda _h, p: p[::-1]) if reverse else (lambda _h, p: p))
    return nexus


def pattern(size: int, salt: int = 0) -> bytes:
    """Deterministic, position-dependent bytes, so a misplaced packet cannot go unnoticed."""
    rng = random.Random(size * 1_000_003 + salt)
    return rng.randbytes(size)


def sim_pair(
    seed: int,
    settings: RpcSettings | None = None,
    server_nexus: Nexus | None = None,
    **network: Any,
) -> tuple[SimNetwork, SimRpc, SimRpc]:
    net = SimNetwork(random.Random(seed), **network)
    server = SimRpc(server_nexus or echo_nexus(), net, "server", settings)
    client = SimRpc(Nexus(), net, "client", settings)
    return net, server, client
