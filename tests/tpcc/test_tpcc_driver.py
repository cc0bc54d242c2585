"""The TPC-C driver: input rules of clauses 2.4.1-2.8.1, the mix and rollback accounting,
heavy contention, and the command's JSON report."""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from bench.tpcc import consistency, loader, rand
from bench.tpcc.driver import Completed, Driver, DriverConfig, Inputs
from bench.tpcc.local import SimulatedTarget
from bench.tpcc.schema import Layout
from store.core.errors import Aborted, UserAborted
from tests.tpcc.conftest import TINY, Tiny

DATE = loader.LOAD_DATE


def inputs(warehouses: list[int], shard_count: int, seed: int = 1) -> Inputs:
    rng = random.Random(seed)
    constants = rand.load_constants(rng)
    deck = rand.rollback_deck(rng)
    return Inputs(rng, constants, TINY, warehouses, Layout(shard_count), warehouses[0], 1, deck, "test")


def test_new_order_inputs_have_1_percent_remote_lines_and_1_percent_rollbacks() -> None:
    generator = inputs([1, 2, 3, 4], 2)
    requests = [generator.new_order(DATE) for _ in range(3000)]
    lines = [line for request in requests for line in request.args[3]]
    remote = sum(supply_w_id != 1 for _, supply_w_id, _ in lines) / len(lines)
    assert 0.005 < remote < 0.015
    assert all(5 <= len(request.args[3]) <= 15 for request in requests)
    assert all(1 <= quantity <= 10 for _, _, quantity in lines)
    assert sum(request.rollback for request in requests) == 30
    for request in requests:
        item_ids = [i_id for i_id, _, _ in request.args[3]]
        assert (TINY.unused_item_id in item_ids) == request.rollback
        assert TINY.unused_item_id not in item_ids[:-1]  # only ever the last line
    # Warehouse 1 is on shard 1; 3 shares it, 2 and 4 do not.
    for request in requests:
        suppliers = {w for _, w, _ in request.args[3]}
        assert request.cross_shard == bool(suppliers & {2, 4})


def test_payment_inputs_have_15_percent_remote_and_60_percent_by_name() -> None:
    generator = inputs([1, 2], 2)
    requests = [generator.payment(DATE) for _ in range(4000)]
    remote = sum(request.args[2] != 1 for request in requests) / len(requests)
    by_name = sum(request.args[5] is not None for request in requests) / len(requests)
    assert 0.12 < remote < 0.18 and 0.56 < by_name < 0.64
    assert all((request.args[4] is None) != (request.args[5] is None) for request in requests)
    assert all(Decimal("1.00") <= request.args[6] <= Decimal("5000.00") for request in requests)
    assert all(request.args[6].as_tuple().exponent == -2 for request in requests)
    assert len({request.args[8] for request in requests}) == len(requests)  # history ids
    assert all(request.cross_shard == (request.args[2] == 2) for request in requests)


def test_one_warehouse_means_no_remote_lines_or_payments() -> None:
    generator = inputs([1], 1)
    assert not any(generator.payment(DATE).cross_shard for _ in range(500))
    assert all(w == 1 for _ in range(200) for _, w, _ in generator.new_order(DATE).args[3])


class FakeTarget:
    """Conflicts every other attempt and rolls back New-Orders with the unused item; each
    attempt takes 3 ms of ``clock`` (the SDK's own figures say 1 and 2 ms)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def run_detailed(self, name: str, *args: Any, shard: int) -> Completed:
        self.calls[name] += 1
        self.now += 0.003
        if self.calls[name] % 2:
            raise Aborted("conflict")
        if name == "tpcc_new_order" and any(i == TINY.unused_item_id for i, _, _ in args[3]):
            raise UserAborted("item not found")
        return Completed({}, 0.001, 0.002)


def test_driver_counts_aborts_and_rollbacks_apart_and_deals_the_exact_mix() -> None:
    target = FakeTarget()
    config = DriverConfig([1, 2], Layout(2), TINY, terminals=4, seed=2, transactions_per_terminal=500)
    report = asyncio.run(Driver(target, config, clock=target.clock).run()).report()
    assert report["transactions"] == 2000
    per_type = report["per_type"]
    # 2000 draws are 20 full rounds of the 100-card deck; 900 New-Orders are 9 rounds of
    # the rollback deck.
    assert {kind: counts["completed"] for kind, counts in per_type.items()} == {
        "new_order": 900, "payment": 860, "order_status": 80, "delivery": 80, "stock_level": 80,
    }
    assert per_type["new_order"]["rolled_back"] == 9
    assert report["rollback_rate"] == pytest.approx(0.01)
    assert sum(counts["aborts"] for counts in per_type.values()) == 2000
    assert report["abort_rate"] == pytest.approx(0.5)
    # End to end: a conflicted attempt and the one that commits, 3 ms each; certified as
    # much earlier as the SDK's last attempt says (2 - 1 ms).
    assert report["latency_ms"]["payment"]["committed_p50"] == pytest.approx(6.0)
    assert report["latency_ms"]["payment"]["committed_max"] == pytest.approx(6.0)
    assert report["latency_ms"]["payment"]["certified_p50"] == pytest.approx(5.0)
    assert set(report["latency_ms"]["payment"]) == {
        f"{what}_{name}" for what in ("certified", "committed") for name in ("p50", "p99", "p999", "max")
    }
    assert not report["errors"]


def test_eight_terminals_on_one_warehouse_stay_consistent() -> None:
    """The issue's heavy-contention case: every terminal fights over one warehouse's rows."""
    tiny = Tiny([1], 1)
    target = SimulatedTarget(tiny.cluster)
    config = DriverConfig([1], Layout(1), TINY, terminals=8, seed=4, transactions_per_terminal=40)
    report = asyncio.run(Driver(target, config).run()).report()
    assert report["transactions"] == 320 and not report["errors"]
    # On one shard the leader runs each transaction's reads and certification in one step,
    # so these do not conflict; the two-shard run of test_tpcc_consistency does.
    assert sum(counts["gave_up"] for counts in report["per_type"].values()) == 0
    verdict = consistency.check(tiny.rows(), TINY)
    assert verdict.all_true, verdict.summary()


def run_command(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    """Runs ``bench/tpcc.py`` in this process (it is a script, not a module of a package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "bench" / "tpcc.py"
    spec = importlib.util.spec_from_file_location("tpcc_command", path)
    assert spec is not None and spec.loader is not None
    command = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(command)
    status = command.main(arguments)
    return status, json.loads(capsys.readouterr().out)


def assert_report_is_complete(report: dict[str, Any]) -> None:
    for field in ("txn_per_s", "new_order_per_min", "abort_rate", "rollback_rate",
                  "cross_shard_fraction", "consistency", "plot"):
        assert field in report
    assert report["consistency"] == {str(n): True for n in range(1, 13)}
    assert report["txn_per_s"] > 0 and not report["errors"]


def test_the_command_reports_json_with_the_required_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, report = run_command([
        "--local", "--shards", "2", "--warehouses-per-shard", "1", "--duration", "1",
        "--scale-factor", "100", "--json", "--no-progress", "--run-dir", str(tmp_path),
    ], capsys)
    assert status == 0
    assert_report_is_complete(report)
    assert (tmp_path / "report.json").exists() and (tmp_path / "throughput.csv").exists()


def test_the_command_runs_on_a_cluster_of_server_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's command without --local: it starts two shard leaders in us and their
    followers in eu and ap, loads through tpcc_load, drives the leaders through the SDK and
    checks the conditions on the leaders (tpcc_scan) and on each region's followers
    (snapshot reads)."""
    base_port = 21000 + (os.getpid() % 200) * 10
    status, report = run_command([
        "--shards", "2", "--warehouses-per-shard", "1", "--duration", "2", "--scale-factor", "100",
        "--rtt-ms", "5", "--json", "--no-progress", "--run-dir", str(tmp_path),
        "--base-port", str(base_port),
    ], capsys)
    assert status == 0
    assert_report_is_complete(report)
    assert report["setup"]["mode"] == "cluster"
    assert report["setup"]["regions"] == ["us", "eu", "ap"]
    every = {str(n): True for n in range(1, 13)}
    for key in ("consistency_replicas", "consistency_replicas_after_load"):
        assert report[key] == {"us": every, "eu": every, "ap": every}
    assert (tmp_path / "cluster" / "shard-0.log").exists()


def test_a_leader_killed_mid_run_leaves_every_condition_true_on_every_replica(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--kill-leader-at: shard 0's leader is SIGKILLed one second into the run; a follower
    takes over (the cluster has a configuration manager) and the run goes on. After it, the
    twelve conditions hold on the leaders of the new map, on eu (where shard 0's new leader
    is) and on ap; transactions commit on both shards after the failover."""
    base_port = 25000 + (os.getpid() % 200) * 10
    status, report = run_command([
        "--shards", "2", "--warehouses-per-shard", "1", "--duration", "6", "--scale-factor", "100",
        "--rtt-ms", "5", "--kill-leader-at", "1", "--json", "--no-progress",
        "--run-dir", str(tmp_path), "--base-port", str(base_port),
    ], capsys)
    assert status == 0, report.get("consistency_replica_failures")
    assert report["killed"]["shard"] == 0
    every = {str(n): True for n in range(1, 13)}
    assert report["consistency_replicas"] == {"us": every, "eu": every, "ap": every}
    per_second = report["throughput_per_s"]
    assert sum(per_second[4:]) > 0, per_second  # committing again after the failover


def test_the_command_still_runs_on_one_region(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base_port = 23000 + (os.getpid() % 200) * 10
    status, report = run_command([
        "--regions", "1", "--shards", "1", "--warehouses-per-shard", "1", "--duration", "1",
        "--scale-factor", "100", "--json", "--no-progress", "--run-dir", str(tmp_path),
        "--base-port", str(base_port),
    ], capsys)
    assert status == 0
    assert_report_is_complete(report)
    assert report["setup"]["regions"] == ["us"]
    assert list(report["consistency_replicas"]) == ["us"]


def test_throughput_plot_is_written_when_matplotlib_is_there(tmp_path: Path) -> None:
    from bench.tpcc.plot import write_throughput

    report = {"throughput_per_s": [10, 12, 9]}
    png = write_throughput(report, tmp_path, "test")
    assert (tmp_path / "throughput.csv").read_text() == "second,transactions\n0,10\n1,12\n2,9\n"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert png is None  # skipped with a message
        return
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
