"""A real local cluster: separate server processes on loopback, the SDK, the checkers.

Issue 4's "Done when": list-append with 16 concurrent clients checked by the Elle-style
checker; the bank total across both shards; a SIGKILLed leader gives its clients
``Unavailable`` or ``OutcomeUnknown`` within the timeout while other shards keep serving;
bad input gets typed errors and changes nothing; random payloads crash nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time

import msgpack
import pytest

from store import wire
from store.client import (
    Client,
    InvalidRequest,
    OutcomeUnknown,
    ProcedureFailed,
    Unavailable,
    UnknownProcedure,
)
from store.core.errors import Status
from store.node.up import ProcessCluster
from store.protocol import codec
from store.protocol.messages import Outcome, Submit
from store.rpc import Nexus, RpcError
from store.rpc.aio import Rpc
from tests.cluster.conftest import bank_is_clean, list_append_is_clean, run


def test_list_append_with_16_clients_has_no_anomalies(cluster: ProcessCluster) -> None:
    list_append_is_clean(cluster.config, clients=16, seconds=20.0, seed=4, ok_min=500)


def test_bank_total_never_changes_across_both_shards(cluster: ProcessCluster) -> None:
    bank_is_clean(cluster.config, clients=8, seconds=8.0, seed=5, ok_min=200, reads_min=50)


def _key_on(client: Client, shard: int) -> str:
    return next(f"t/{i}" for i in range(1000) if client.partitioner.shard_of(f"t/{i}") == shard)


def test_a_killed_leader_gives_typed_errors_in_time_and_other_shards_keep_serving(
    cluster: ProcessCluster,
) -> None:
    async def scenario():  # type: ignore[no-untyped-def]
        client = await Client.connect(cluster.config, timeout_s=3.0)
        dead_key, live_key = _key_on(client, 1), _key_on(client, 0)
        await client.put(dead_key, 1)
        await client.put(live_key, 1)
        os.kill(cluster.pids()[1], signal.SIGKILL)
        cluster.children[1].wait()
        outcomes = []
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises((Unavailable, OutcomeUnknown)):
                await client.run_ops([["increment", dead_key, 1]])
            outcomes.append(time.monotonic() - started)
        for _ in range(20):
            await client.run_ops([["increment", live_key, 1]])
        assert await client.get(live_key) == 21
        await client.close()
        return outcomes

    waits = run(scenario())
    assert all(wait < 3.0 + 2.0 for wait in waits), waits


def test_bad_input_gets_typed_errors_and_changes_nothing(cluster: ProcessCluster) -> None:
    async def scenario() -> None:
        client = await Client.connect(cluster.config)
        key = _key_on(client, 0)
        await client.put(key, 1)
        with pytest.raises(UnknownProcedure):
            await client.run("no_such_procedure", key)
        with pytest.raises(InvalidRequest):
            await client.run("typed", key, "not an int")
        with pytest.raises(InvalidRequest):
            await client.run("typed", key)
        with pytest.raises(ProcedureFailed, match="a bug in a procedure"):
            await client.run("raises", key)
        with pytest.raises(InvalidRequest):
            await client.put(key, "x" * (2 << 20))
        with pytest.raises(InvalidRequest):
            await client.run_ops([["put", "k" * 5000, 1]])
        # The same oversized value sent raw, past the SDK's own checks: the server refuses it.
        rpc = Rpc.udp(Nexus(), "127.0.0.1", 0)
        session = await rpc.connect(cluster.config.shards[0].leader, timeout=2)
        big = Submit("raw", 1, "", [[["put", key, "x" * (2 << 20)]]], False)
        answer = codec.decode(await rpc.call(session, wire.SUBMIT, codec.encode(big), timeout=3))
        assert isinstance(answer, Outcome) and answer.status == Status.INVALID
        garbage = codec.decode(await rpc.call(session, wire.SUBMIT, b"\x93\x01\x02", timeout=3))
        assert isinstance(garbage, Outcome) and garbage.status == Status.INVALID
        rpc.close()
        assert await client.get(key) == 1
        assert await client.run("typed", key, 2) == 3
        await client.close()

    run(scenario())


def test_random_payloads_to_every_request_type_crash_no_server(cluster: ProcessCluster) -> None:
    async def scenario() -> None:
        rng = random.Random(9)
        rpc = Rpc.udp(Nexus(), "127.0.0.1", 0)
        sessions = [await rpc.connect(s.leader, timeout=2) for s in cluster.config.shards]
        stop_at = time.monotonic() + 10.0
        sent = 0
        while time.monotonic() < stop_at:
            batch = []
            for _ in range(32):
                req_type = rng.choice([wire.SUBMIT, wire.PEER, wire.STATUS, rng.randrange(256)])
                kind = rng.random()
                if kind < 0.4:
                    payload = rng.randbytes(rng.randrange(0, 300))
                elif kind < 0.8:
                    payload = msgpack.packb([rng.randrange(20), *[rng.choice([None, -1, "x", [1], {"a": 2}, 2**70 // 2**10, 1.5]) for _ in range(rng.randrange(8))]])
                else:
                    payload = msgpack.packb([rng.randrange(1, 16), rng.randrange(2**40), ["t/1"], [[1, 2, 3]]])
                batch.append(rpc.enqueue_request(rng.choice(sessions), req_type, payload))
                sent += 1
            for future in batch:
                with contextlib.suppress(RpcError, TimeoutError):
                    await asyncio.wait_for(future, 2)
        rpc.close()
        assert sent > 1000
        client = await Client.connect(cluster.config)
        statuses = await client.status()
        assert all(statuses), statuses
        await client.run_ops([["put", "t/after", 1], ["put", "t/after2", 2]])
        assert await client.get("t/after2") == 2
        await client.close()

    run(scenario())
    for child in cluster.children:
        assert child.poll() is None, "a server exited"


def test_resuming_after_outcome_unknown_never_runs_twice(cluster: ProcessCluster) -> None:
    async def scenario() -> None:
        client = await Client.connect(cluster.config, timeout_s=1.0, attempt_timeout_s=0.3)
        key = _key_on(client, 0)
        await client.put(key, 0)
        pid = cluster.pids()[0]
        os.kill(pid, signal.SIGSTOP)  # the leader hangs: the request may or may not run
        try:
            with pytest.raises(OutcomeUnknown) as caught:
                await client.run_ops([["increment", key, 1]])
        finally:
            os.kill(pid, signal.SIGCONT)
        pending = caught.value.txn  # type: ignore[attr-defined]
        for _ in range(3):  # asking again, any number of times, runs it at most once
            result = await client.resume(pending)
            assert result.result == [1]
        assert await client.get(key) == 1
        await client.close()

    run(scenario())
