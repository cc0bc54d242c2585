"""Exactly one response per request, at most one handler run, under loss, duplication and
reordering (DESIGN.md section 6: retransmission with go-back-N, cached responses give
at-most-once execution; eRPC NSDI '19 section 5.2). The simulated network makes each seed a
deterministic replay: a failure message names its seed."""

from __future__ import annotations

import random
import struct
from collections import Counter

import pytest

from store.rpc import Nexus, ReqHandle, RpcSettings
from store.rpc.sim import SimNetwork, SimRpc

FAULTS = [
    {"loss": 0.3},
    {"duplicate": 0.3},
    {"reorder": 0.3},
    {"loss": 0.3, "duplicate": 0.3, "reorder": 0.3},
]
SEEDS = range(4)
CLIENTS = 3
REQUESTS_PER_CLIENT = 40
SETTINGS = RpcSettings(rto_ns=300_000, session_credits=8, session_req_window=4)


def _run(seed: int, faults: dict[str, float]) -> None:
    rng = random.Random(seed)
    net = SimNetwork(rng, latency_ns=10_000, reorder_delay_ns=100_000, **faults)
    runs: Counter[bytes] = Counter()

    def handler(_handle: ReqHandle, payload: bytes) -> bytes:
        runs[payload[:8]] += 1
        return payload[:8] + payload[8:][::-1]

    nexus = Nexus()
    nexus.register_req_func(7, handler)
    SimRpc(nexus, net, "server", SETTINGS)
    responses: dict[bytes, list[bytes | None]] = {}
    errors: list[object] = []
    for c in range(CLIENTS):
        client = SimRpc(Nexus(), net, f"client-{c}", SETTINGS)
        session = client.create_session("server")
        for r in range(REQUESTS_PER_CLIENT):
            key = struct.pack("<II", c, r)
            body = rng.randbytes(rng.choice([0, 1, 100, 1456, 1457, 5000]))
            responses[key] = []

            def cont(payload: bytes | None, error: object, key: bytes = key, body: bytes = body) -> None:
                if error is not None:
                    errors.append(error)
                responses[key].append(payload)
                assert payload is None or payload == key + body[::-1], f"seed={seed}: bad payload"

            client.enqueue_request(session, 7, key + body, cont)
    done = net.run_until(lambda: all(responses.values()), until_ns=60 * 10**9)
    assert done, f"seed={seed} faults={faults}: requests left unanswered"
    assert not errors, f"seed={seed} faults={faults}: {errors[:3]}"
    assert all(len(v) == 1 for v in responses.values()), f"seed={seed}: a request got two answers"
    # Let every retransmitted and duplicated datagram drain: still no second run.
    net.run_for(10**9)
    assert all(len(v) == 1 for v in responses.values()), f"seed={seed}: late second answer"
    assert max(runs.values()) == 1, f"seed={seed} faults={faults}: a handler ran twice"
    assert len(runs) == len(responses), f"seed={seed}: a handler never ran"


@pytest.mark.parametrize("faults", FAULTS, ids="+".join)
@pytest.mark.parametrize("seed", SEEDS)
def test_every_request_gets_exactly_one_response(seed: int, faults: dict[str, float]) -> None:
    _run(seed, faults)


def test_same_seed_replays_exactly() -> None:
    """Determinism: the same seed gives the same packet counts and the same virtual time."""

    def trace(seed: int) -> tuple[int, int, int]:
        rng = random.Random(seed)
        net = SimNetwork(rng, loss=0.2, duplicate=0.2, reorder=0.2)
        nexus = Nexus()
        nexus.register_req_func(1, lambda _h, p: p)
        SimRpc(nexus, net, "s", SETTINGS)
        client = SimRpc(Nexus(), net, "c", SETTINGS)
        session = client.create_session("s")
        pendings = [client.enqueue_request(session, 1, bytes(3000)) for _ in range(20)]
        assert net.run_until(lambda: all(p.done() for p in pendings))
        return net.now_ns, net.delivered, client.stats()["retransmits"]

    assert trace(11) == trace(11)
    assert trace(11) != trace(12)
