"""A real local cluster (separate server processes on loopback) for the tests in this folder."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from store import config as config_module
from store.node.up import LocalCluster
from tests.conftest import REPO

_ports = itertools.count(17000 + (os.getpid() % 200) * 20, 10)


def write_cluster_file(directory: Path, shards: int = 2, **settings: int) -> Path:
    base = next(_ports)
    lines = [
        "[cluster]",
        'name = "test"',
        f'run_dir = "{directory / "run"}"',
        f'python_path = ["{REPO}"]',
        'procedures = ["store.sim.workloads:register_bank", "tests.cluster.procedures:register"]',
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
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    path = write_cluster_file(tmp_path)
    running = LocalCluster(config_module.load(path))
    running.start()
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()
