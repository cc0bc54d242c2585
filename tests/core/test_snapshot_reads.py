"""Snapshot reads (``store.core.coordinator``, "snapshot reads"): a read-only operation list
whose keys are all on one shard reads the newest versions whose writers' records are durable
there. It is answered without waiting for a writer still being replicated to another
region, it never sees half of one, and it sees every transaction that committed before it
began. Three regions, 50 ms apart, on virtual time.
"""

from __future__ import annotations

from typing import Any

import pytest

from store.core import coordinator as coordinator_module
from store.core.errors import Status
from store.core.oplist import OPS_PROCEDURE
from store.core.settings import DEFAULT_SETTINGS, MS
from store.sim.local import LocalCluster, Submission
from tests.core.test_pair_path import keys_by_shard

# Far below a round trip between regions (50 ms), far above a round trip within one.
QUICK_NS = 5 * MS


def cluster_of(snapshot_reads: bool = True) -> tuple[LocalCluster, list[str], str]:
    """Two shards, three regions; two keys of shard 0 (1 and 2) and one of shard 1 (3)."""
    cluster = LocalCluster(
        shards=2, regions=3, settings=DEFAULT_SETTINGS.with_overrides(snapshot_reads=snapshot_reads)
    )
    keys = keys_by_shard(cluster)
    mine, other = keys[0][:2], keys[1][0]
    cluster.preload({mine[0]: 1, mine[1]: 2, other: 3})
    cluster.run_for(200 * MS)  # the preload durable everywhere
    return cluster, mine, other


def start_writer(cluster: LocalCluster, ops: list[list[Any]], shard: int, shows: dict[str, Any]) -> Submission:
    """Starts a read-modify-write and runs until its new versions are visible at their
    shards (``shows``: key -> value) while its commit still waits for another region."""
    writer = cluster.start(OPS_PROCEDURE, ops, shard=shard)
    for _ in range(40):
        cluster.run_for(MS // 4)
        if all(_value(cluster, key) == value for key, value in shows.items()):
            break
    assert {key: _value(cluster, key) for key in shows} == shows
    assert not writer.done
    return writer


def _value(cluster: LocalCluster, key: str) -> Any:
    version = cluster.replica(cluster.partitioner.shard_of(key)).store.latest(key)
    return None if version is None else version.value


def read(cluster: LocalCluster, keys: list[str], shard: int, within_ns: int = QUICK_NS) -> Submission:
    reader = cluster.start(OPS_PROCEDURE, [["get", key] for key in keys], shard=shard)
    cluster.run_for(within_ns)
    return reader


def committed_result(submission: Submission) -> Any:
    assert submission.outcome is not None and submission.outcome.status == Status.COMMITTED
    return submission.outcome.result


def snapshot_one_low(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule broken on purpose: the snapshot taken one counter below the durable
    watermark (here and in tests/sim/test_mutants.py)."""
    snapshot = coordinator_module.Coordinator._snapshot

    def one_low(self: coordinator_module.Coordinator) -> int:
        taken: int = snapshot(self)
        return taken - 1 if taken > 0 else taken

    monkeypatch.setattr(coordinator_module.Coordinator, "_snapshot", one_low)


def test_a_one_shard_read_only_list_does_not_wait_for_a_writer_being_replicated() -> None:
    cluster, (a, b), c = cluster_of()
    # A writer of both keys of shard 0 and of shard 1's key: never seen in part.
    writer = start_writer(
        cluster, [["increment", a, 10], ["increment", b, 10], ["increment", c, 10]], 0,
        {a: 11, b: 12, c: 13},
    )
    reader = read(cluster, [a, b], 0)
    assert committed_result(reader) == [1, 2]
    assert committed_result(read(cluster, [c], 1)) == [3]
    assert not writer.done
    cluster.wait(writer)
    assert committed_result(writer) == [11, 12, 13]
    # Committed before the next readers began: they see it, at once.
    assert committed_result(read(cluster, [a, b], 0)) == [11, 12]
    assert committed_result(read(cluster, [c], 1)) == [13]


def test_without_snapshot_reads_a_reader_waits_for_the_writers_commit() -> None:
    """The setting off: the newest versions are read, speculative ones included, and the
    answer waits until they are durable (what snapshot reads replace)."""
    cluster, (a, b), _ = cluster_of(snapshot_reads=False)
    writer = start_writer(cluster, [["increment", a, 10], ["increment", b, 10]], 0, {a: 11, b: 12})
    reader = read(cluster, [a, b], 0)
    assert not reader.done
    cluster.wait(reader)
    assert writer.done
    assert committed_result(reader) == [11, 12]


def test_a_read_only_list_on_two_shards_still_waits() -> None:
    """Not taken on two shards (module doc: the other shard's reads come later than the
    snapshot and its versions' clocks are sparse): the newest versions, and the wait."""
    cluster, (a, _), c = cluster_of()
    writer = start_writer(cluster, [["increment", a, 10], ["increment", c, 10]], 0, {a: 11, c: 13})
    reader = read(cluster, [a, c], 0)
    assert not reader.done
    cluster.wait(reader)
    assert writer.done and committed_result(reader) == [11, 13]


@pytest.mark.patches_core
def test_a_snapshot_one_counter_low_misses_a_committed_writer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read that begins after the writer was answered COMMITTED misses it (the first
    test would refuse that)."""
    snapshot_one_low(monkeypatch)
    cluster, (a, b), _ = cluster_of()
    writer = start_writer(cluster, [["increment", a, 10], ["increment", b, 10]], 0, {a: 11, b: 12})
    cluster.wait(writer)
    assert committed_result(read(cluster, [a, b], 0)) == [1, 2]
