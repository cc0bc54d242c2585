"""TPC-C generated inside the shard leaders (``bench/tpcc.py --generators in-server``,
bench/tpcc/inserver.py), on a real cluster whose shards have two workers: every leader runs
terminals bound to its own warehouses, and the database keeps all twelve consistency
conditions (clause 3.3.2) after the run, as through the SDK."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from store.node.generator import GENERATORS_ENV
from tests.tpcc.test_tpcc_replicas import command_module


def test_in_server_terminals_keep_every_condition_on_shards_of_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(GENERATORS_ENV, "0")  # the command turns it on for its own servers
    base_port = 31000 + (os.getpid() % 100) * 10
    code = command_module().main([
        "--regions", "1", "--shards", "2", "--workers", "2", "--warehouses-per-shard", "1",
        "--duration", "2", "--scale-factor", "100", "--generators", "in-server",
        "--base-port", str(base_port), "--run-dir", str(tmp_path), "--json", "--no-progress",
    ])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report["consistency_failures"]
    assert report["setup"]["generators"] == "in-server" and report["setup"]["workers"] == 2
    assert report["setup"]["terminals"] == 8  # 2 per warehouse, 2 on each of the 4 leaders
    per_type = report["per_type"]
    assert per_type["new_order"]["completed"] > 20 and per_type["payment"]["completed"] > 20, per_type
    assert not report["errors"], report["errors"]
    assert report["cross_shard_fraction"] > 0  # remote warehouses are on other units
    assert report["latency_ms"]["new_order"]["committed_p50"] is not None
    assert all(report["consistency"].values())
