"""The consistency conditions on every replica: followers read through snapshot pages.

A real 3-region cluster (leaders in us, followers in eu and ap, a few ms between regions)
is loaded with a tiny database and driven for a moment; each region's followers must then
hold exactly the leaders' rows, and all twelve conditions must hold on every replica. The
same with shards of two workers (a warehouse on each unit).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from bench.tpcc import consistency, loader, replicas, schema
from bench.tpcc.driver import Driver, DriverConfig
from store import config as config_module
from store.core.keys import pack, unpack
from store.node.up import ProcessCluster
from store.rpc.aio import new_event_loop
from tests.tpcc.conftest import TINY

SHARDS = 2


def command_module() -> ModuleType:
    """``bench/tpcc.py`` (a script, not a module of a package)."""
    path = Path(__file__).resolve().parents[2] / "bench" / "tpcc.py"
    spec = importlib.util.spec_from_file_location("tpcc_command_replicas", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(coroutine):  # type: ignore[no-untyped-def]
    loop = new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


@pytest.fixture(scope="module", params=[1, 2], ids=["one-worker", "two-workers"])
def geo(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[ProcessCluster]:
    workers = request.param
    base_port = 27000 + (os.getpid() % 100) * 10 + 1000 * (workers - 1)
    path = command_module().cluster_file(
        tmp_path_factory.mktemp("tpcc-geo"), SHARDS, base_port, regions=3, rtt_ms=4.0,
        workers=workers,
    )
    cluster = ProcessCluster(config_module.load(path))
    cluster.start()
    try:
        cluster.wait_ready(timeout_s=60)
        yield cluster
    finally:
        cluster.stop()


def test_a_generated_three_region_file_has_followers_in_eu_and_ap(tmp_path: Path) -> None:
    command = command_module()
    config = config_module.load(command.cluster_file(tmp_path, 2, 7500, regions=3, rtt_ms=50))
    assert config.partitioner_kind == "prefix" and command.PROCEDURE_MODULE in config.procedures
    assert config.replicated_tables == ("item",)
    assert schema.placement_problem(config.partitioner(), schema.Layout(2)) is None
    assert config.regions == ("us", "eu", "ap") and config.wan is not None
    assert config.wan.rtt_ms == 50
    assert [s.region for s in config.shards] == ["us", "us"]
    assert config.shards[1].followers == (("eu", ("127.0.0.2", 7501)), ("ap", ("127.0.0.3", 7501)))
    found, notes = replicas.replicas_of(config)
    assert [(r.name, r.region) for r in found] == [("us", None), ("eu", "eu"), ("ap", "ap")]
    assert notes == []
    one = config_module.load(command.cluster_file(tmp_path / "one", 2, 7500, regions=1))
    assert one.wan is None and one.regions == ("us",)
    assert [r.name for r in replicas.replicas_of(one)[0]] == ["us"]


def test_a_region_following_only_some_shards_is_left_out_with_a_note() -> None:
    shards = [
        SimpleNamespace(shard=0, region="us", followers=(("eu", ("127.0.0.2", 1)),)),
        SimpleNamespace(shard=1, region="us", followers=()),
    ]
    config = SimpleNamespace(shards=shards, regions=("us", "eu"))
    found, notes = replicas.replicas_of(config)
    assert [r.name for r in found] == ["us"]
    assert notes == ["region eu follows 1 of 2 shards"]


class _PagedFollower:
    """A ``read_snapshot`` over a sorted dict, recording the pages asked for."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = dict(sorted(data.items()))
        self.asked: list[tuple[str, str, int]] = []

    async def read_snapshot(self, keys: Any = (), *, scans: Any = (), region: Any = None) -> Any:
        (lo, hi, limit), = scans
        self.asked.append((lo, hi, limit))
        # As the SDK gives them: tuple keys.
        found = [(unpack(k), v) for k, v in self.data.items() if lo <= k < hi][:limit]
        return SimpleNamespace(scans=[found])


@pytest.mark.parametrize("count", [0, 1, 9, 10, 11, 30])
def test_snapshot_pages_start_after_the_last_key_and_miss_nothing(count: int) -> None:
    """Every page starts at the least key above the previous page's last, a key of the same
    warehouse: the client still sends it to the warehouse's one shard."""
    keys = [schema.customer_key(1, 1, c) for c in range(1, count + 1)]
    data = {pack(key): c for c, key in enumerate(keys)}
    data[pack(schema.customer_key(2, 1, 1))] = "another warehouse"
    follower = _PagedFollower(data)
    lo, hi = schema.table_range("customer", 1)
    found = run(replicas.scan_pages(follower, lo, hi, "eu", page_rows=10))
    assert found == [(key, c) for c, key in enumerate(keys)]
    assert len(follower.asked) == count // 10 + 1
    assert all(page_lo > previous for (previous, _, _), (page_lo, _, _)
               in zip(follower.asked, follower.asked[1:], strict=False))
    placement = schema.partitioner(2)
    assert all(placement.shards_of_range(page_lo, page_hi) == (1,) for page_lo, page_hi, _ in follower.asked)


def test_a_connected_cluster_must_replicate_item_and_place_warehouses(tmp_path: Path) -> None:
    """--connect refuses a cluster file whose placement would copy ITEM to one shard or
    scatter a warehouse: the benchmark would run, but not as designed."""
    command = command_module()
    good = command.cluster_file(tmp_path, 2, 7500, regions=1)
    text = good.read_text()
    for broken, problem in (
        (text.replace('replicated = ["item"]', ""), "ITEM is not replicated"),
        (text.replace('partitioner = "prefix"', 'partitioner = "hash"'), "not on shard w mod 2"),
    ):
        path = tmp_path / "broken.toml"
        path.write_text(broken)
        with pytest.raises(SystemExit, match=problem):
            command.prepare_cluster(command.parse_args(["--connect", str(path)]), tmp_path)
    # With workers: warehouse w on worker (w // S) mod W of shard w mod S.
    workers = command.cluster_file(tmp_path / "workers", 2, 7500, regions=1, workers=2)
    config, processes = command.prepare_cluster(command.parse_args(["--connect", str(workers)]), tmp_path)
    assert processes is None and config.workers == 2
    placement = config.partitioner()
    assert [placement.shard_of(pack(("stock", w, 1))) for w in range(1, 9)] == [2, 1, 3, 0, 2, 1, 3, 0]
    hashed = tmp_path / "hashed.toml"
    hashed.write_text(workers.read_text().replace('partitioner = "prefix"', 'partitioner = "hash"'))
    with pytest.raises(SystemExit, match="not on unit"):
        command.prepare_cluster(command.parse_args(["--connect", str(hashed)]), tmp_path)


def test_every_replica_holds_the_leaders_rows_and_all_conditions_after_load_and_run(
    geo: ProcessCluster,
) -> None:
    command = command_module()
    layout = schema.Layout(SHARDS, geo.config.workers)
    warehouses = list(range(1, layout.units + 1))  # one on every unit

    async def scenario() -> dict[str, Any]:
        from store.client import Client

        client = await Client.connect(geo.config)
        try:
            target = command._SdkTarget(client)
            initial = loader.initial_rows(warehouses, layout, TINY, seed=3)
            await loader.load_through_transactions(target.run, initial)
            outcome: dict[str, Any] = {"load": await replica_views(client, target)}
            config = DriverConfig(
                warehouses, layout, TINY, terminals=4, seed=3, transactions_per_terminal=25,
                run_id="replicas",
            )
            outcome["stats"] = (await Driver(target, config).run()).report()
            outcome["run"] = await replica_views(client, target)
            return outcome
        finally:
            await client.close()

    async def replica_views(client: Any, target: Any) -> dict[str, Any]:
        caught_up = await replicas.wait_caught_up(client, geo.config)
        assert caught_up["behind"] == {"eu": 0, "ap": 0}, caught_up
        # Nothing runs: every follower is as far as its shard's leaders (with workers, the
        # least of their claims against the follower's entry of the shard).
        for w_id in warehouses:
            for region in ("eu", "ap"):
                seen = await client.read_snapshot([schema.warehouse_key(w_id)], region=region, with_lag=True)
                assert seen.lag == 0, (w_id, region, seen.lag, seen.vw)
        views = {"us": await consistency.snapshot(target.run, warehouses, layout, page_rows=50)}
        for region in ("eu", "ap"):
            # 13 rows a page: every table of a warehouse takes several pages.
            views[region] = await replicas.follower_rows(client, warehouses, region, page_rows=13)
        return views

    outcome = run(scenario())
    assert outcome["stats"]["transactions"] == 100 and not outcome["stats"]["errors"]
    assert outcome["stats"]["per_type"]["new_order"]["completed"] > 0
    assert outcome["run"]["us"] != outcome["load"]["us"]
    for when in ("load", "run"):
        views = outcome[when]
        leaders = views["us"]
        for name, rows in views.items():
            assert rows == leaders, f"{name} after the {when} differs from the leaders"
            report = consistency.check(rows, TINY)
            assert report.all_true, f"{name} after the {when}: {report.summary()}"
