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
        ({"shards": [{"leader": "h:1"}], "settings": {"no_such_setting": 1}}, "unknown settings"),
        ({**_GEO, "cm": [{"region": "mars", "address": "h:9"}]}, "not a declared region"),
        ({**_GEO, "cm": [{"region": "us", "address": "h:9"}, {"region": "us", "address": "h:8"}]},
         "one member per region"),
        ({**_GEO, "cm": [{"region": "us", "address": "h:2"}]}, "also a replica"),
        ({**_GEO, "cm": [{"region": "us"}]}, "host:port"),
        ({**_GEO, "cm": "h:9"}, "tables"),
        ({"shards": [{"leader": "h:1"}], "cm": [{"region": "local", "address": "h:9"}]},
         "needs followers"),
    ],
)
def test_bad_cluster_files_name_the_problem(data: dict, complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint):
        from_dict(data)
