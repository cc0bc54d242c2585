"""Processes of a cluster file on other hosts (issue 13): names that do not resolve (yet) are
lost messages, not broken invariants; the SDK says it cannot reach them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from store import config as config_module
from store.client import Client
from store.core.errors import Unavailable
from store.node.up import ProcessCluster, pid_alive
from tests.cluster.conftest import _ports, run
from tests.conftest import REPO

UNRESOLVABLE = "meridian-no-such-host.invalid"  # RFC 6761: never resolves
DEADLINE_S = 20.0


def test_a_peer_whose_name_does_not_resolve_is_a_lost_message(tmp_path: Path) -> None:
    """Found writing deploy/ (a pod's DNS name appears after the pod starts): a leader whose
    configuration manager member had a name that did not resolve stopped itself with
    status 70 at its first heartbeat, as if an invariant had broken."""
    port = next(_ports)
    path = tmp_path / "cluster.toml"
    path.write_text(f"""
[cluster]
run_dir = "{tmp_path / 'run'}"
python_path = ["{REPO}"]
[[regions]]
name = "us"
[[regions]]
name = "eu"
[[shards]]
leader = "127.0.0.1:{port}"
followers = [{{ region = "eu", address = "{UNRESOLVABLE}:{port}" }}]
[[cm]]
region = "us"
address = "127.0.0.1:{port + 1}"
[[cm]]
region = "eu"
address = "{UNRESOLVABLE}:{port + 1}"
""")
    config = config_module.load(path)
    cluster = ProcessCluster(config)
    cluster.start()  # the processes of the unresolvable host are not this machine's
    try:
        assert {node.name for node in cluster.remote} == {"shard-0-eu", "cm-eu"}
        cluster.wait_ready()

        async def failures() -> int:
            async with await Client.connect(config, connect_timeout_s=0.5) as client:
                status = (await client.status())[0]
                assert status is not None
                return int(status["counters"].get("peer_send_failures", 0))

        deadline = time.monotonic() + DEADLINE_S
        while run(failures()) < 3:  # heartbeats to the CM member, stream messages...
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert all(pid_alive(pid) for pid in cluster.pids())
        log = (config.run_dir / "shard-0.log").read_text()
        assert log.count("peer send failed") <= 2  # once per unreachable peer

        async def snapshot() -> None:
            async with await Client.connect(config, connect_timeout_s=0.5) as client:
                with pytest.raises(Unavailable, match="cannot reach"):
                    await client.read_snapshot(["k"], region="eu")

        run(snapshot())
    finally:
        cluster.stop()
