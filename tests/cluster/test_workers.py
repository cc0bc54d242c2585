"""A shard served by several worker processes (issue 16; docs/design.md, "Workers"), on real
processes: each worker holds its slice of the shard's keys, transactions across workers of
one shard commit through two-phase commit like those across shards, the shard keeps one
vector-clock entry, and the status shows each worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from store import config as config_module
from store.client import Client
from store.node.up import ProcessCluster, format_status
from tests.cluster.conftest import bank_is_clean, list_append_is_clean, run, write_cluster_file


@pytest.fixture
def workers_cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    cluster = ProcessCluster(config_module.load(write_cluster_file(tmp_path, shards=1, workers=2)))
    cluster.start()
    try:
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop()


def test_transactions_across_the_workers_of_a_shard_commit_with_one_clock_entry(
    workers_cluster: ProcessCluster,
) -> None:
    config = workers_cluster.config

    async def scenario() -> None:
        async with await Client.connect(config) as client:
            keys = [f"acct/{n}" for n in range(40)]
            units = {client.partitioner.shard_of(key) for key in keys}
            assert units == {0, 1}  # both workers hold keys
            for key in keys:
                await client.put(key, 10)
            # Each moves 1 from a key of worker 0 to one of worker 1: two processes, one shard.
            zero = [k for k in keys if client.partitioner.shard_of(k) == 0]
            one = [k for k in keys if client.partitioner.shard_of(k) == 1]
            for a, b in zip(zero, one, strict=False):
                result = await client.run_ops(
                    [["increment", a, -1], ["increment", b, 1], ["get", a], ["get", b]]
                )
                assert result[2:] == [9, 11]
            committed = await client.run_ops_detailed(
                [["increment", zero[0], 0], ["increment", one[0], 0], *(["get", k] for k in keys)]
            )
            assert committed.status == "committed"
            assert sum(committed.result[2:]) == 400
            assert set(committed.vc.entries) <= {0}  # one entry: the shard's, not a worker's
            statuses = await client.status()
            assert [s["label"] for s in statuses if s] == ["0.0", "0.1"]
            text = format_status(-1, list(client.protocol.leaders), statuses)
            assert " 0.0 " in text and " 0.1 " in text

    run(scenario())


def test_list_append_and_bank_over_two_shards_of_two_workers(tmp_path: Path) -> None:
    config = config_module.load(write_cluster_file(tmp_path, shards=2, workers=2))
    cluster = ProcessCluster(config)
    cluster.start()
    try:
        cluster.wait_ready()
        list_append_is_clean(config, clients=6, seconds=3.0, seed=5, ok_min=50)
        bank_is_clean(config, clients=4, seconds=2.0, seed=5, ok_min=20, reads_min=5)
    finally:
        cluster.stop()
