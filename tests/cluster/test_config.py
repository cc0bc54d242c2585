"""Cluster files parse, and bad ones fail with ConfigError naming what is wrong."""

from __future__ import annotations

import pytest

from store.config import ConfigError, from_dict, load
from tests.conftest import REPO


def test_the_shipped_cluster_files_parse() -> None:
    local = load(REPO / "cluster" / "local.toml")
    assert [s.leader_address for s in local.shards] == ["127.0.0.1:7100", "127.0.0.1:7101"]
    geo = load(REPO / "cluster" / "geo3.toml")
    assert geo.regions == ("us", "eu", "ap")
    assert [region for region, _ in geo.shards[0].followers] == ["eu", "ap"]
    assert [node.region for node in geo.cm_nodes()] == ["us", "eu", "ap"]


def test_with_a_cm_every_replica_of_a_shard_reaches_every_other() -> None:
    """Any follower may lead its shard after a failover: the wan proxy has a link for each
    ordered pair in different regions, of every shard's replicas and of the CM members."""
    geo = load(REPO / "cluster" / "geo3.toml")
    eu0 = geo.node("follower", 0, "eu")
    routes = geo.replication_routes(eu0)
    assert sorted(routes) == ["127.0.0.1:7200", "127.0.0.3:7200"]
    links = geo.wan_links()
    assert len(links) == 3 * 6  # two shards and the CM, 6 ordered pairs each
    assert len({listen for _, listen, _, _, _, _ in links}) == len(links)


_GEO = {
    "regions": [{"name": "us"}, {"name": "eu"}],
    "shards": [{"leader": "h:1", "followers": [{"region": "eu", "address": "h:2"}]}],
}


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        ({}, "at least one"),
        ({"shards": [{"leader": "nohost"}]}, "host:port"),
        ({"shards": [{"leader": "h:99999"}]}, "bad port"),
        ({"shards": [{"leader": "h:1", "region": "mars"}]}, "not a declared region"),
        ({"shards": [{"leader": "h:1"}], "cluster": {"partitioner": "magic"}}, "partitioner"),
        ({"shards": [{"leader": "h:1"}], "cluster": {"procedures": ["nocolon"]}}, "module:function"),
        ({"shards": [{"leader": "h:1"}], "settings": {"no_such_setting": 1}}, "unknown setting"),
        ({**_GEO, "cm": [{"region": "mars", "address": "h:9"}]}, "not a declared region"),
        ({**_GEO, "cm": [{"region": "us", "address": "h:9"}, {"region": "us", "address": "h:8"}]},
         "one member per region"),
        ({**_GEO, "cm": [{"region": "us", "address": "h:2"}]}, "also a replica"),
        ({**_GEO, "cm": [{"region": "us"}]}, "host:port"),
        ({**_GEO, "cm": "h:9"}, "tables"),
        ({"shards": [{"leader": "h:1"}], "cm": [{"region": "local", "address": "h:9"}]},
         "needs followers"),
        # Issue 13: every key of every section is checked, and named with its section.
        ({"shards": [{"leader": "h:1"}], "client": {"timeout": 3}}, r"\[client\] timeout: unknown setting"),
        ({"shards": [{"leader": "h:1"}], "client": {"timeout_s": "3"}}, r"\[client\] timeout_s: expected float"),
        ({"shards": [{"leader": "h:1"}], "client": {"region": "mars"}}, "not a declared region"),
        ({"shards": [{"leader": "h:1"}], "settings": {"peer_retry_ns": "fast"}}, r"\[settings\] peer_retry_ns: expected int"),
        ({"shards": [{"leader": "h:1"}], "settings": {"speculation": 1}}, "expected bool"),
        ({"shards": [{"leader": "h:1"}], "settings": {"peer_retry_ns": True}}, "expected int"),
        ({"shards": [{"leader": "h:1"}], "settings": {"lock_timeout_ns": -1}}, "must not be negative"),
        ({"shards": [{"leader": "h:1"}], "stream": {"batch_size_max": 0}}, r"\[stream\]: batch_size_max must be positive"),
        ({"shards": [{"leader": "h:1"}], "stream": {"batch_sizemax": 5}}, r"\[stream\] batch_sizemax: unknown"),
        ({"shards": [{"leader": "h:1"}], "rpc": {"mtu": 1500}}, r"\[rpc\] mtu: unknown"),
        ({"shards": [{"leader": "h:1"}], "rpc": "fast"}, r"\[rpc\] must be a table"),
        ({"shards": [{"leader": "h:1"}], "sharding": {}}, r"unknown section \[sharding\]"),
        ({"shards": [{"leader": "h:1", "leeder": "h:2"}]}, r"shards\[0\]: unknown key 'leeder'"),
        ({"shards": [{"leader": "h:1"}], "cluster": {"nmae": "x"}}, r"\[cluster\]: unknown key 'nmae'"),
        ({"shards": [{"leader": "h:1"}], "cluster": {"name": 5}}, "cluster.name: expected a non-empty string"),
        # The bound became one on the whole directory (issue 14): the old key says so.
        ({"shards": [{"leader": "h:1"}], "cluster": {"log_bytes_max": 1 << 20}},
         "'log_bytes_max' is now data_bytes_max"),
        ({"shards": [{"leader": "h:1"}], "cluster": {"python_path": ".."}}, "python_path is a list"),
        ({**_GEO, "shards": [{"leader": "h:1", "followers": [{"region": "eu", "adress": "h:2"}]}]},
         r"followers\[0\]: unknown key 'adress'"),
        ({**_GEO, "shards": [{"leader": "h:1", "followers": "h:2"}]}, "followers must be a list"),
        ({"shards": [{"leader": "h:1"}], "wan": {"rtt": 50}}, r"\[wan\]: unknown key 'rtt'"),
        ({"shards": [{"leader": "h:1"}], "wan": {"rtt_ms": "far"}}, "wan.rtt_ms: expected a non-negative number"),
        ({"shards": [{"leader": "h:1"}], "regions": [{"name": "a"}, {"name": "a"}]}, "each name once"),
        ({"shards": [{"leader": "h:1"}], "cm": [{"region": "local", "address": "h:9", "port": 1}]},
         r"cm\[0\]: unknown key 'port'"),
        # geo3 once had its wan-proxy's first link on shard 0's metrics port (7200 + 2000)
        ({**_GEO, "shards": [{"leader": "h:7200", "followers": [{"region": "eu", "address": "h:7300"}]}],
          "wan": {"port_base": 9200}},
         "h:9200 is both shard-0's metrics port and the wan-proxy's link us-eu/0"),
        ({"shards": [{"leader": "h:1"}, {"leader": "h:1001"}]},
         "h:2001 is both shard-0's metrics port and shard-1's replication port"),
    ],
)
def test_bad_cluster_files_name_the_problem(data: dict, complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint):
        from_dict(data)


def test_a_directory_or_an_unreadable_file_is_a_config_error(tmp_path) -> None:
    from store import config as config_module

    with pytest.raises(ConfigError, match="is a directory"):
        config_module.load(tmp_path)
    binary = tmp_path / "cluster.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="cannot read"):
        config_module.load(binary)


def test_checked_overrides_arrive_with_their_types() -> None:
    config = from_dict({
        "shards": [{"leader": "h:1"}],
        "client": {"timeout_s": 3, "region": "local"},
        "stream": {"batch_delay_ns": 2_000_000},
        "rpc": {"rto_ns": 4_000_000},
        "settings": {"speculation": False},
    })
    assert config.client == {"timeout_s": 3.0, "region": "local"}
    assert type(config.client["timeout_s"]) is float
    assert config.stream == {"batch_delay_ns": 2_000_000}
    assert config.rpc.rto_ns == 4_000_000 and config.rpc.session_req_window == 64
    assert config.settings.speculation is False


def test_rdma_is_selectable_and_refused_with_the_reason_where_it_cannot_run(tmp_path) -> None:
    """Issue 13: ``transport = "rdma"`` in [cluster]. This machine has no RDMA subsystem:
    the servers, ``meridian up`` and the SDK each refuse at once, saying why."""
    import subprocess
    import sys

    from store.client import Client
    from store.core.errors import Unavailable
    from store.rpc.rdma import rdma_unavailable_reason
    from tests.cluster.conftest import run
    from tests.conftest import REPO

    reason = rdma_unavailable_reason()
    if reason is None:
        pytest.skip("an RDMA device is present: the refusal below is for machines without one")
    assert from_dict({"shards": [{"leader": "h:1"}], "cluster": {"transport": "rdma"}}).transport == "rdma"
    with pytest.raises(ConfigError, match="'udp' or 'rdma'"):
        from_dict({"shards": [{"leader": "h:1"}], "cluster": {"transport": "tcp"}})
    path = tmp_path / "rdma.toml"
    path.write_text('[cluster]\ntransport = "rdma"\n[[shards]]\nleader = "127.0.0.1:7999"\n')
    for command in (["up", "--config", str(path)], ["serve", "--config", str(path), "--shard", "0"]):
        done = subprocess.run(
            [sys.executable, "-m", "store.cli", *command], cwd=REPO, capture_output=True,
            text=True, timeout=60, check=False,
        )
        assert done.returncode != 0 and done.stdout == "", command
        assert "needs an RDMA device on this machine" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    with pytest.raises(Unavailable, match="needs an RDMA device"):
        run(Client.connect(path))


def test_workers_make_one_unit_per_worker_at_the_shards_ports_plus_a_stride() -> None:
    data = {
        "cluster": {"workers": 2},
        "regions": [{"name": "us"}, {"name": "eu"}],
        "shards": [
            {"leader": "h:7000", "followers": [{"region": "eu", "address": "g:7000"}]},
            {"leader": "h:7001", "followers": [{"region": "eu", "address": "g:7001"}]},
        ],
    }
    config = from_dict(data)
    assert config.workers == 2 and config.shard_count == 2
    assert [s.leader_address for s in config.shards] == ["h:7000", "h:7010", "h:7001", "h:7011"]
    assert [s.followers for s in config.shards][1] == (("eu", ("g", 7010)),)
    assert [n.name for n in config.nodes()][:4] == [
        "shard-0.0", "shard-0.1", "shard-1.0", "shard-1.1",
    ]
    partitioner = config.partitioner()
    assert partitioner.shard_count == 4 and partitioner.clock_of(3) == 1
    assert {partitioner.shard_of(f"k{n}") for n in range(100)} == {0, 1, 2, 3}


@pytest.mark.parametrize(
    ("cluster", "complaint"),
    [
        ({"workers": 0}, "cluster.workers must be in"),
        ({"workers": 2, "worker_port_stride": 1}, "is both"),  # worker 1 of shard 0 on shard 1's port
        ({"workers": 2, "worker_port_stride": 0}, "worker_port_stride must be at least 1"),
        ({"workers": "2"}, "cluster.workers"),
    ],
)
def test_bad_workers_settings_are_refused(cluster: dict[str, object], complaint: str) -> None:
    data = {
        "cluster": cluster, "regions": [{"name": "us"}],
        "shards": [{"leader": "h:7000"}, {"leader": "h:7001"}],
    }
    with pytest.raises(ConfigError, match=complaint):
        from_dict(data)
