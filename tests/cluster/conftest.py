"""A real local cluster (separate server processes on loopback) for the tests in this folder."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from store import config as config_module
from store.node.up import ProcessCluster
from tests.conftest import REPO

_ports = itertools.count(17000 + (os.getpid() % 200) * 20, 10)


PROCEDURES = ["store.sim.workloads:register_bank", "tests.cluster.procedures:register"]


def write_cluster_file(
    directory: Path, shards: int = 2, procedures: list[str] = PROCEDURES, workers: int = 1,
    **settings: int,
) -> Path:
    base = next(_ports)
    lines = [
        "[cluster]",
        'name = "test"',
        f"workers = {workers}",
        f'run_dir = "{directory / "run"}"',
        f'python_path = ["{REPO}"]',
        "procedures = [" + ", ".join(f'"{p}"' for p in procedures) + "]",
        "[settings]",
        "peer_retry_ns = 200_000_000",
        "peer_attempts_max = 10",
        *(f"{name} = {value}" for name, value in settings.items()),
        "[client]",
        "timeout_s = 3.0",
        "[[regions]]",
        'name = "us"',
    ]
    for shard in range(shards):
        lines += ["[[shards]]", f'leader = "127.0.0.1:{base + shard}"']
    path = directory / "cluster.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    path = write_cluster_file(tmp_path)
    running = ProcessCluster(config_module.load(path))
    running.start()
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


def run(coroutine):  # type: ignore[no-untyped-def]
    """Runs a coroutine on a fresh uvloop loop (the SDK's loop of choice)."""
    from store.rpc.aio import new_event_loop

    loop = new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


def list_append_is_clean(config, clients: int, seconds: float, seed: int, ok_min: int) -> None:  # type: ignore[no-untyped-def]
    """The list-append workload against a real cluster, checked by the Elle-style checker."""
    import random

    from jepsen.checkers.list_append import check_list_append
    from jepsen.runner import run_workload
    from store.client import Client
    from store.sim.workloads import ListAppend

    workload = ListAppend(random.Random(seed), active_keys=10)
    result = run(run_workload(lambda: Client.connect(config), workload, clients, seconds))
    verdict = check_list_append(result.ops)
    assert verdict["valid"], {k: verdict["anomalies"][k][:2] for k in verdict["anomaly_types"]}
    assert result.counts["ok"] > ok_min, result.counts
    assert result.counts["info"] == 0, result.errors


def bank_is_clean(config, clients: int, seconds: float, seed: int, ok_min: int, reads_min: int) -> None:  # type: ignore[no-untyped-def]
    """The bank workload against a real cluster: the total never changes in any read."""
    import random

    from jepsen.checkers.bank import check_bank
    from jepsen.runner import run_workload
    from store.client import Client
    from store.sim.workloads import Bank

    workload = Bank(random.Random(seed), accounts=8, total=800)

    async def scenario():  # type: ignore[no-untyped-def]
        async with await Client.connect(config) as client:
            shards = set()
            for key, balance in workload.initial_data().items():
                await client.put(key, balance)
                shards.add(client.partitioner.shard_of(key))
            assert len(shards) > 1  # transfers cross shards
        return await run_workload(lambda: Client.connect(config), workload, clients, seconds)

    result = run(scenario())
    verdict = check_bank(result.ops, total=800)
    assert verdict["valid"], verdict["first_error"]
    assert verdict["read_count"] > reads_min
    assert result.counts["ok"] > ok_min


@pytest.fixture
def geo_cm(tmp_path: Path) -> Iterator[ProcessCluster]:
    """A 3-region cluster with a configuration manager member per region and a 500 ms
    leader timeout, on server processes (test_failover, test_durability)."""
    from tests.cluster.test_geo import geo_cluster_file

    path = geo_cluster_file(tmp_path, cm=True, leader_timeout_ns=500_000_000)
    running = ProcessCluster(config_module.load(path))
    running.start()
    try:
        running.wait_ready(timeout_s=60)
        yield running
    finally:
        running.stop()
