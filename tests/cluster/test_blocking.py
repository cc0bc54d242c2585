"""``BlockingClient`` offers every call of ``Client``, with the same arguments (issue 13: it
lacked transaction, read_snapshot, run_pipelined, resume and run_ops_detailed although the
README said it offered the same calls), and each works against a real cluster."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from store import config as config_module
from store.cli import main
from store.client import BlockingClient, Client
from store.node.up import ProcessCluster
from tests.cluster.conftest import write_cluster_file


def _public(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and callable(member)
    }


def test_every_call_of_client_is_on_blocking_client_with_the_same_arguments() -> None:
    asynchronous, blocking = _public(Client), _public(BlockingClient)
    assert set(asynchronous) <= set(blocking), sorted(set(asynchronous) - set(blocking))
    for name, signature in asynchronous.items():
        ours = blocking[name]
        # The same parameters, by name, kind and default (the return types differ: a
        # blocking call returns what the coroutine would).
        assert [
            (p.name, p.kind, p.default) for p in signature.parameters.values()
        ] == [(p.name, p.kind, p.default) for p in ours.parameters.values()], name
    properties = {"partitioner", "settings", "client_id"}
    assert properties <= {n for n, _ in inspect.getmembers(BlockingClient) if not n.startswith("_")}


def test_the_blocking_calls_work_against_a_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_cluster_file(tmp_path)
    cluster = ProcessCluster(config_module.load(path))
    cluster.start()
    try:
        cluster.wait_ready()
        with BlockingClient.connect(path, timeout_s=3.0) as client:
            assert client.transaction().put("t/a", 1).increment("t/a", 2).commit() == [None, 3]
            detailed = client.run_ops_detailed([["get", "t/a"]])
            assert detailed.result == [3] and detailed.status == "committed"
            certified, commit = client.run_pipelined("", [["increment", "t/a", 1]], route="t/a")
            assert certified.result == [4]
            assert commit.result(timeout=5).status == "committed"
            assert client.run_ops([["get", "t/a"]], route=0) == [4]
            epoch, leaders = client.cluster_map()
            assert epoch == -1 and len(leaders) == 2  # no configuration manager: the file's
            assert all(status is not None for status in client.status(replicas=True))
            assert client.client_id and client.partitioner.shard_of("t/a") in (0, 1)
            # Tuple keys through the SDK: packed by the client, tuples again in results.
            for order in range(1, 6):
                client.put(("order", 7, order), {"n": order})
            assert client.get(("order", 7, 3)) == {"n": 3}
            assert client.scan_prefix(("order", 7), 2, reverse=True) == [
                (("order", 7, 5), {"n": 5}), (("order", 7, 4), {"n": 4}),
            ]
            assert client.scan(("order", 7, 2), ("order", 7, 4)) == [
                (("order", 7, 2), {"n": 2}), (("order", 7, 3), {"n": 3}),
            ]
            assert client.keys(("order", 7), ("order", 8), 2, reverse=True) == [
                ("order", 7, 5), ("order", 7, 4),
            ]
            assert client.count(("order", 7), ("order", 8)) == 5
            assert client.transaction().count(("order", 7, 2), ("order", 8), 2).keys(
                ("order", 7, 4), ("order", 8)
            ).commit() == [2, [("order", 7, 4), ("order", 7, 5)]]
            built = client.transaction().scan_prefix(("order", 7), 1).clear_range(
                ("order", 7, 1), ("order", 7, 3)
            ).commit()
            assert built == [[[("order", 7, 1), {"n": 1}]], 2]  # pairs as lists, as ever
            assert client.clear_range(("order", 7), ("order", 8)) == 3
            assert client.scan_prefix(("order", 7)) == []
            # truncate: more keys than one transaction may delete, string and tuple keys.
            for start in range(0, 2500, 500):
                client.run_ops([["put", ("big", i), i] for i in range(start, start + 500)])
            client.run_ops([["put", f"big/{i:03d}", i] for i in range(30)] + [["put", "bigger/1", 1]])
            assert client.truncate("big") == 2530
            assert client.scan_prefix(("big",)) == [] and client.scan("big/", "big0") == []
            assert client.get("bigger/1") == 1
            client.put(("big", 1), 1)
            assert main(["truncate", "--config", str(path), "big"]) == 0
            assert capsys.readouterr().out == "deleted 1 keys of big\n"
    finally:
        cluster.stop()
