"""Helpers of the host tests."""

from __future__ import annotations

import random

from store.rpc import Nexus
from store.rpc.sim import SimNetwork, SimRpc


def idle_endpoint() -> SimRpc:
    """A real RPC endpoint (the compiled host takes no stand-in) on a network nobody else is
    on: for tests that call the host's request handlers' bodies directly."""
    return SimRpc(Nexus(), SimNetwork(random.Random(0)), "host")
