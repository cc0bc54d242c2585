"""Snapshot reads (``store.core.coordinator``, "snapshot reads"): a read-only operation list
reads, at every shard, the newest versions whose writers' records are durable at its
coordinator's shard. It is answered without waiting for a writer that is still being
replicated to another region, it never sees half of one, and it sees every transaction that
committed before it began. Three regions, 50 ms apart, on virtual time.
"""

from __future__ import annotations

from typing import Any

import pytest

from store.core.errors import Status
from store.core.oplist import OPS_PROCEDURE
from store.core.participant import Participant
from store.core.settings import DEFAULT_SETTINGS, MS
from store.sim.local import LocalCluster, Submission
from tests.core.test_pair_path import keys_by_shard

# Far below a round trip between regions (50 ms), far above a round trip within one.
QUICK_NS = 5 * MS


def cluster_of(snapshot_reads: bool = True) -> tuple[LocalCluster, str, str]:
    cluster = LocalCluster(
        shards=2, regions=3, settings=DEFAULT_SETTINGS.with_overrides(snapshot_reads=snapshot_reads)
    )
    keys = keys_by_shard(cluster)
    a, b = keys[0][0], keys[1][0]
    cluster.preload({a: 1, b: 2})
    cluster.run_for(200 * MS)  # the preload durable everywhere
    return cluster, a, b


def start_writer(cluster: LocalCluster, a: str, b: str) -> Submission:
    """A read-modify-write of both keys, run until both shards have installed it (its new
    versions are visible there) while its commit still waits for another region."""
    writer = cluster.start(OPS_PROCEDURE, [["increment", a, 10], ["increment", b, 10]], shard=0)
    for _ in range(40):
        cluster.run_for(MS // 4)
        if _value(cluster, 0, a) == 11 and _value(cluster, 1, b) == 12:
            break
    assert (_value(cluster, 0, a), _value(cluster, 1, b)) == (11, 12)
    assert not writer.done
    return writer


def _value(cluster: LocalCluster, shard: int, key: str) -> Any:
    version = cluster.replica(shard).store.latest(key)
    return None if version is None else version.value


def read(cluster: LocalCluster, keys: list[str], shard: int, within_ns: int) -> Submission:
    reader = cluster.start(OPS_PROCEDURE, [["get", key] for key in keys], shard=shard)
    cluster.run_for(within_ns)
    return reader


def committed_result(submission: Submission) -> Any:
    assert submission.outcome is not None and submission.outcome.status == Status.COMMITTED
    return submission.outcome.result


def finish(cluster: LocalCluster, submission: Submission) -> None:
    for _ in range(1000):
        if submission.done:
            return
        cluster.run_for(MS)
    raise AssertionError("not answered in a second")


def test_a_two_shard_read_only_list_does_not_wait_for_a_writer_being_replicated() -> None:
    cluster, a, b = cluster_of()
    writer = start_writer(cluster, a, b)
    for coordinator in (0, 1):
        reader = read(cluster, [a, b], coordinator, QUICK_NS)
        assert reader.done, f"coordinated at shard {coordinator}: waited for the writer"
        assert committed_result(reader) == [1, 2]  # the writer entirely absent, not half
    assert not writer.done
    finish(cluster, writer)
    assert committed_result(writer) == [11, 12]
    # Committed before the next readers began: every one of them sees it, at once.
    for coordinator in (0, 1):
        reader = read(cluster, [a, b], coordinator, QUICK_NS)
        assert committed_result(reader) == [11, 12]
    assert committed_result(read(cluster, [b], 1, QUICK_NS)) == [12]


def test_a_one_shard_read_only_list_does_not_wait_either() -> None:
    cluster, a, b = cluster_of()
    writer = start_writer(cluster, a, b)
    reader = read(cluster, [a], 0, QUICK_NS)
    assert committed_result(reader) == [1]
    reader = read(cluster, [b], 1, QUICK_NS)
    assert committed_result(reader) == [2]
    finish(cluster, writer)
    assert committed_result(read(cluster, [a], 0, QUICK_NS)) == [11]


def test_without_snapshot_reads_a_reader_waits_for_the_writers_commit() -> None:
    """The setting off: the newest versions are read, speculative ones included, and the
    answer waits until they are durable (the behaviour snapshot reads replace)."""
    cluster, a, b = cluster_of(snapshot_reads=False)
    writer = start_writer(cluster, a, b)
    reader = read(cluster, [a, b], 0, QUICK_NS)
    assert not reader.done
    finish(cluster, reader)
    assert writer.done
    assert committed_result(reader) == [11, 12]


def test_a_writer_that_touched_only_the_other_shard_is_still_waited_for() -> None:
    """The snapshot bounds the coordinator's entry only: a speculative version at the other
    shard whose writer never touched the coordinator's shard is read (it may be older than
    what the reader must see), and the answer waits for it as before."""
    cluster, a, b = cluster_of()
    writer = cluster.start(OPS_PROCEDURE, [["increment", b, 5]], shard=1)
    for _ in range(40):
        cluster.run_for(MS // 4)
        if _value(cluster, 1, b) == 7:
            break
    assert _value(cluster, 1, b) == 7 and not writer.done
    reader = read(cluster, [a, b], 0, QUICK_NS)
    assert not reader.done
    finish(cluster, reader)
    assert writer.done and committed_result(reader) == [1, 7]


@pytest.mark.patches_core
def test_a_snapshot_bounding_the_coordinators_shard_only_shows_half_a_writer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rule broken on purpose: the other shard reads its newest versions (the
    coordinator's bound left out of its prepare). The reader then sees the writer at one
    shard and not at the other, which the first test would refuse."""
    read_snapshot = Participant.read_snapshot

    def newest_at_the_other_shard(
        self: Participant, keys: list[str], clock: int, bound: int, sparse: bool = False
    ) -> Any:
        if sparse:  # read for another shard's transaction (Participant.prepare)
            return self.read(keys, sparse=True)
        return read_snapshot(self, keys, clock, bound, sparse)

    monkeypatch.setattr(Participant, "read_snapshot", newest_at_the_other_shard)
    cluster, a, b = cluster_of()
    writer = start_writer(cluster, a, b)
    reader = read(cluster, [a, b], 0, QUICK_NS)
    finish(cluster, reader)
    assert committed_result(reader) == [1, 12]
    finish(cluster, writer)
