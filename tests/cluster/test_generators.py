"""In-server load generators (bench/micro.py --generators in-server, store/node/generator.py):
the load Mako measures, made inside each shard leader. What a user of the benchmark relies on:
the transactions are real (every committed increment is in the store exactly once, nothing
aborted left a trace), remote accesses happen, and a server not started for it
refuses, saying how."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from store import wire
from store.client import Client
from store.client.protocol import Call, Connect
from store.node.generator import GENERATORS_ENV, GenerateSpec, micro_keys
from store.node.up import ProcessCluster
from tests.cluster.conftest import run

KEYS_PER_SHARD = 50


@pytest.fixture
def generators_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GENERATORS_ENV, "1")  # the servers the cluster fixture starts inherit it


@pytest.fixture
def generating_cluster(generators_on: None, cluster: ProcessCluster) -> ProcessCluster:
    return cluster  # conftest's two-shard cluster, started after generators_on


async def _generate(client: Client, payload: bytes) -> list[dict[str, Any]]:
    answers = []
    for address in client.protocol.leaders:
        await client._carry_out(Connect(address, 3.0))
        answers.append(msgpack.unpackb(await client._carry_out(Call(address, wire.GENERATE, payload, 60.0))))
    return answers


def test_generated_transactions_are_real_and_counted(generating_cluster: ProcessCluster) -> None:
    async def scenario() -> tuple[list[dict[str, Any]], int, list[int]]:
        client = await Client.connect(generating_cluster.config)
        try:
            keys = micro_keys(client.partitioner, 2, KEYS_PER_SHARD)
            for shard, shard_keys in enumerate(keys):
                await client.run_ops([["put", key, 0] for key in shard_keys], route=shard)
            before = [int(s["counters"]["submits"]) for s in await client.status() if s]
            # Few keys and 8 in flight per shard: conflicts happen, and retries with them.
            spec = GenerateSpec(1.0, 8, KEYS_PER_SHARD, 0.3, 7)
            answers = await _generate(client, spec.to_wire())
            after = [int(s["counters"]["submits"]) for s in await client.status() if s]
            total = 0
            for shard_keys in keys:
                values = await client.run_ops([["get", key] for key in shard_keys])
                total += sum(values)
            return answers, total, [a - b for a, b in zip(after, before, strict=True)]
        finally:
            await client.close()

    answers, total, submits = run(scenario())
    assert [a["shard"] for a in answers] == [0, 1]
    for answer in answers:
        counts = answer["counts"]
        assert counts["read_only"] > 50 and counts["rmw"] > 50, counts
        assert counts["cross_shard"] > 0 and counts["errors"] == 0, (counts, answer["errors_by_status"])
        # Each transaction's attempts are aborted ones but its last (committed, or an error).
        committed = counts["read_only"] + counts["rmw"]
        assert counts["attempts"] - counts["aborted_attempts"] == committed + counts["errors"]
        assert counts["aborted_attempts"] > 0  # contention on 50 keys: retries ran
    # Every committed read-modify-write incremented its 4 keys once; nothing aborted or
    # failed left a trace.
    assert total == 4 * sum(a["counts"]["rmw"] for a in answers)
    # No client request carried them: no SUBMIT arrived while they ran.
    assert submits == [0, 0]


def test_a_workload_the_cluster_has_not_registered_is_refused_by_name(
    generating_cluster: ProcessCluster,
) -> None:
    async def scenario() -> list[dict[str, Any]]:
        client = await Client.connect(generating_cluster.config)
        try:
            spec = GenerateSpec(1.0, 8, 1, 0.0, 1, "nonesuch", {})
            return await _generate(client, spec.to_wire())
        finally:
            await client.close()

    for answer in run(scenario()):
        assert "no workload named 'nonesuch'" in answer["error"] and "micro" in answer["error"]


def test_a_spec_round_trips_with_its_workload() -> None:
    micro = GenerateSpec(2.0, 8, 100, 0.05, 3)
    assert GenerateSpec.from_wire(micro.to_wire()) == micro
    other = GenerateSpec(2.0, 8, 1, 0.0, 3, "tpcc", {"warehouses": 4})
    assert GenerateSpec.from_wire(other.to_wire()) == other


def test_a_server_not_started_for_it_refuses(cluster: ProcessCluster) -> None:
    async def scenario() -> list[dict[str, Any]]:
        client = await Client.connect(cluster.config)
        try:
            return await _generate(client, GenerateSpec(1.0, 8, 10, 0.0, 1).to_wire())
        finally:
            await client.close()

    answers = run(scenario())
    assert len(answers) == 2
    for answer in answers:
        assert GENERATORS_ENV in answer["error"] and "off" in answer["error"]


@pytest.mark.parametrize(
    ("payload", "complaint"),
    [
        (b"\xc1", "not msgpack"),
        (msgpack.packb([1, 2]), "is a map"),
        (msgpack.packb({"duration_s": 1}), "fields of workload .micro. must be"),
        (msgpack.packb({"duration_s": 0, "in_flight": 1, "keys_per_shard": 1, "remote": 0, "seed": 1}), "duration_s"),
        (msgpack.packb({"duration_s": 1, "in_flight": 10**6, "keys_per_shard": 1, "remote": 0, "seed": 1}), "in_flight"),
        (msgpack.packb({"duration_s": 1, "in_flight": 1, "keys_per_shard": 0, "remote": 0, "seed": 1}), "keys_per_shard"),
        (msgpack.packb({"duration_s": 1, "in_flight": 1, "keys_per_shard": 1, "remote": 2, "seed": 1}), "remote"),
        (msgpack.packb({"duration_s": 1, "in_flight": 1, "keys_per_shard": 1, "remote": 0, "seed": "x"}), "seed"),
        # A registered workload takes params, not the micro mix's fields.
        (msgpack.packb({"duration_s": 1, "in_flight": 1, "seed": 1, "workload": "tpcc", "keys_per_shard": 1,
                        "remote": 0}), "fields of workload 'tpcc' must be"),
        (msgpack.packb({"duration_s": 1, "in_flight": 1, "seed": 1, "workload": "tpcc", "params": [1]}), "params"),
        (msgpack.packb({"duration_s": 1, "in_flight": 1, "seed": 1, "workload": "", "params": {}}), "workload"),
    ],
)
def test_bad_specs_are_refused_by_name(payload: bytes, complaint: str) -> None:
    from store.core.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match=complaint):
        GenerateSpec.from_wire(payload)
