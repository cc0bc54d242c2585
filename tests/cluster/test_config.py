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
    ],
)
def test_bad_cluster_files_name_the_problem(data: dict, complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint):
        from_dict(data)
