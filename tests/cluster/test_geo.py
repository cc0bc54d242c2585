"""A real 3-region cluster: leader processes in us, followers in eu and ap, Paxos over gRPC
through the wan-proxy at 50 ms round trips (issue 5's "Done when").

The list-append and bank checks of the one-region cluster pass here too, and a follower's
snapshot shows exactly the committed transactions at or below its vector watermark.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from jepsen.checkers.bank import check_bank
from jepsen.checkers.list_append import check_list_append
from jepsen.runner import run_workload
from store import config as config_module
from store.client import Client
from store.node.up import LocalCluster
from store.rpc.aio import new_event_loop
from store.sim.workloads import Bank, ListAppend
from tests.conftest import REPO

_ports = itertools.count(21000 + (os.getpid() % 100) * 40, 20)


def geo_cluster_file(directory: Path, rtt_ms: float = 50.0) -> Path:
    port = next(_ports)
    lines = [
        "[cluster]", 'name = "geo-test"', f'run_dir = "{directory / "run"}"',
        f'python_path = ["{REPO}"]', 'procedures = ["store.sim.workloads:register_bank"]',
        "[settings]", "peer_retry_ns = 200_000_000", "peer_attempts_max = 10",
        "[client]", "timeout_s = 5.0",
        '[[regions]]\nname = "us"', '[[regions]]\nname = "eu"', '[[regions]]\nname = "ap"',
    ]
    for shard in range(2):
        lines += [
            "[[shards]]", f'leader = "127.0.0.1:{port + shard}"', 'region = "us"',
            f'followers = [{{ region = "eu", address = "127.0.0.2:{port + shard}" }}, '
            f'{{ region = "ap", address = "127.0.0.3:{port + shard}" }}]',
        ]
    lines += [
        "[wan]", f"rtt_ms = {rtt_ms}", "jitter_ms = 1", f"port_base = {port + 5000}",
        f'control = "127.0.0.1:{port + 4999}"',
    ]
    path = directory / "geo.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def geo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    path = geo_cluster_file(tmp_path_factory.mktemp("geo"))
    running = LocalCluster(config_module.load(path))
    running.start()
    try:
        running.wait_ready(timeout_s=60)
        yield running
    finally:
        running.stop()


def run(coroutine):  # type: ignore[no-untyped-def]
    loop = new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


def test_list_append_across_three_regions_has_no_anomalies(geo: LocalCluster) -> None:
    workload = ListAppend(random.Random(11), active_keys=10)
    result = run(run_workload(lambda: Client.connect(geo.config), workload, 8, 10.0))
    verdict = check_list_append(result.ops)
    assert verdict["valid"], {k: verdict["anomalies"][k][:2] for k in verdict["anomaly_types"]}
    assert result.counts["ok"] > 200, result.counts
    assert result.counts["info"] == 0, result.errors


def test_bank_across_three_regions_keeps_the_total(geo: LocalCluster) -> None:
    workload = Bank(random.Random(12), accounts=8, total=800)

    async def scenario():  # type: ignore[no-untyped-def]
        async with await Client.connect(geo.config) as client:
            for key, balance in workload.initial_data().items():
                await client.put(key, balance)
        return await run_workload(lambda: Client.connect(geo.config), workload, 8, 8.0)

    result = run(scenario())
    verdict = check_bank(result.ops, total=800)
    assert verdict["valid"], verdict["first_error"]
    assert verdict["read_count"] > 20 and result.counts["ok"] > 100


def test_a_follower_snapshot_shows_exactly_the_committed_transactions_under_its_watermark(
    geo: LocalCluster,
) -> None:
    async def scenario() -> None:
        client = await Client.connect(geo.config)
        key = "snap/1"
        clocks = {}
        done = asyncio.Event()

        async def writer() -> None:
            for element in range(60):
                result = await client.run_ops_detailed([["append", key, element]])
                clocks[element] = result.vc
            done.set()

        snapshots = []

        async def reader(region: str) -> None:
            while not done.is_set():
                snapshot = await client.read_snapshot([key], region=region)
                snapshots.append((snapshot.values[key] or [], snapshot.vw, region))
                await asyncio.sleep(0.005)

        await asyncio.gather(writer(), reader("eu"), reader("ap"))
        final = await client.get(key)
        assert final == list(range(60))
        assert len(snapshots) > 50
        seen_growth = set()
        for shown, vw, region in snapshots:
            expected = [e for e in final if clocks[e].le_watermark(dict(vw.items()))]
            assert shown == expected, (region, vw, shown[-3:], expected[-3:])
            seen_growth.add(len(shown))
        assert len(seen_growth) > 10  # the followers really moved during the run
        # Eventually each follower holds everything the leader committed.
        for region in ("eu", "ap"):
            for _ in range(200):
                snapshot = await client.read_snapshot([key], region=region)
                if snapshot.values[key] == final:
                    break
                await asyncio.sleep(0.02)
            assert snapshot.values[key] == final
        await client.close()

    run(scenario())
