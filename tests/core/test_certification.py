"""Certification scenarios on real shard leaders (DESIGN.md §3), fault-free.

Each test is a short script in the style of TigerBeetle's replica tests: set up data, run
transactions on one or several shards, check what a user would see.
"""

from __future__ import annotations

import pytest

from store.core.errors import (
    InvalidRequest,
    ProcedureFailed,
    Status,
    UnknownProcedure,
    UserAborted,
)
from store.core.txn import Procedures, Tx
from store.core.vclock import VectorClock
from store.sim.local import LocalCluster


def keys_on_distinct_shards(cluster: LocalCluster, table: str = "t") -> tuple[str, str]:
    by_shard: dict[int, str] = {}
    i = 0
    while len(by_shard) < 2:
        key = f"{table}/{i}"
        by_shard.setdefault(cluster.partitioner.shard_of(key), key)
        i += 1
    return by_shard[0], by_shard[1]


def test_single_shard_read_modify_write() -> None:
    cluster = LocalCluster(shards=1)
    assert cluster.ops([["put", "t/x", 1], ["increment", "t/x", 2]]) == [None, 3]
    assert cluster.ops([["append", "t/l", "a"], ["append", "t/l", "b"], ["get", "t/l"]]) == [
        None, None, ["a", "b"],
    ]
    assert cluster.ops([["cas", "t/x", 3, 4], ["cas", "t/x", 3, 5], ["get", "t/x"]]) == [
        True, False, 4,
    ]
    assert cluster.ops([["delete", "t/x"], ["get", "t/x"]]) == [None, None]
    assert cluster.get("t/x") is None


def test_cross_shard_transaction_writes_both_shards_atomically() -> None:
    cluster = LocalCluster(shards=2)
    a, b = keys_on_distinct_shards(cluster)
    cluster.preload({a: 10, b: 0})
    cluster.ops([["increment", a, -3], ["increment", b, 3]])
    assert (cluster.get(a), cluster.get(b)) == (7, 3)
    coordinator = cluster.replica(0).coordinator
    assert coordinator.counters["certified"] >= 1
    assert all(cluster.replica(s).store.locked_count() == 0 for s in range(2))


def test_committed_clock_covers_every_shard_written() -> None:
    cluster = LocalCluster(shards=2)
    a, b = keys_on_distinct_shards(cluster)
    outcome = cluster.submit("", [["put", a, 1], ["put", b, 2]])
    assert outcome.status == Status.COMMITTED
    assert outcome.vc[0] >= 1 and outcome.vc[1] >= 1
    reader = cluster.submit("", [["get", a]], shard=1)
    # The reader depends on the writer's shard-0 entry, which is durable by now: sparse
    # clocks drop entries at or below the watermark (DESIGN.md §4), so nothing is left.
    assert reader.status == Status.COMMITTED and reader.vc == VectorClock()


def test_clocks_cover_write_write_and_read_write_dependencies() -> None:
    """DESIGN.md §3's invariant, extended: a writer's clock dominates the clock of the
    version it overwrites and of transactions that validated reads of what it overwrites."""
    cluster = LocalCluster(shards=2)
    a, b = keys_on_distinct_shards(cluster)
    leader0 = cluster.replica(0)
    stamp = VectorClock({1: 10**6})  # a reader's clock, far above any watermark
    assert leader0.participant.validate(424242, [(a, 0)], [], stamp)
    ok, _counter, deps = leader0.participant.lock(434343, [a])
    assert ok and deps == stamp  # read-write: the stamp comes back with the lock
    leader0.participant.abort(434343)
    # A writer of a (and b) must now dominate the stamp. It cannot commit (shard 1 will not
    # reach 10**6), but its installed versions carry the clock.
    cluster.start("", [["put", a, 1], ["put", b, 1]], shard=0)
    cluster.run_for(50_000_000)
    written = leader0.store.latest(a)
    assert written is not None and written.vc[1] == 10**6 and written.vc[0] >= 1
    # write-write: the next writer of b dominates the version it overwrites.
    leader1 = cluster.replica(1)
    previous = leader1.store.latest(b)
    assert previous is not None and previous.vc[1] == 10**6


def test_single_shard_certification_stamps_what_it_read() -> None:
    """The one-step path stamps the reads it validates as the multi-shard path does, so a
    later writer of a key a single-shard transaction read gets that transaction's clock
    back with its lock (read-write dependencies, participant.py)."""
    cluster = LocalCluster(shards=2)
    a, _ = keys_on_distinct_shards(cluster)
    participant = cluster.replica(0).participant
    reader_clock = VectorClock({1: 10**6})  # far above any watermark: never dropped
    assert participant.certify_solo(515151, [(a, 0)], [], [], reader_clock, 0) is not None
    ok, _counter, deps = participant.lock(525252, [a])
    assert ok and deps[1] == 10**6
    participant.abort(525252)
    # A single-shard writer stamps its own (sparse) clock, which carries the entry too.
    assert participant.certify_solo(535353, [(a, 0)], [], [("t/other", 1, False)], reader_clock, 0)
    ok, _counter, deps = participant.lock(545454, [a])
    assert ok and deps[1] == 10**6
    participant.abort(545454)


def test_scan_sees_own_writes_and_is_validated() -> None:
    cluster = LocalCluster(shards=2)
    cluster.ops([["put", "t/1", 1], ["put", "t/3", 3]], shard=0)
    result = cluster.ops([["put", "t/2", 2], ["delete", "t/3"], ["scan", "t/", "t0", 10]])
    assert result[2] == [["t/1", 1], ["t/2", 2]]
    with pytest.raises(InvalidRequest):
        cluster.ops([["scan", "t/", "u/", 10]])


def test_a_retried_submission_returns_the_first_outcome_and_runs_once() -> None:
    cluster = LocalCluster(shards=1)
    first = cluster.submit("", [["increment", "t/n", 1]])
    leader = cluster.replica(0)
    # The same client id and sequence number again, as a client retrying after a timeout.
    retry = cluster.start("", [["increment", "t/n", 1]], seq=first.seq)
    cluster.run_for(10_000_000)
    assert retry.outcome == first
    assert cluster.get("t/n") == 1
    assert leader.coordinator.counters["committed"] == 2  # the retry ran nothing new


def test_lock_conflict_aborts_without_waiting_and_releases_everything() -> None:
    cluster = LocalCluster(shards=2)
    a, b = keys_on_distinct_shards(cluster)
    cluster.preload({a: 0, b: 0})
    # Hold a lock on b as a stuck transaction would, then try to write a and b.
    blocker = cluster.replica(1)
    assert blocker.store.try_lock_all([b], owner=999)
    outcome = cluster.submit("", [["increment", a, 1], ["increment", b, 1]])
    assert outcome.status == Status.ABORTED
    blocker.store.unlock_all([b], owner=999)
    cluster.sim.run_until(cluster.sim.now_ns + 100_000_000)
    assert all(cluster.replica(s).store.locked_count() == 0 for s in range(2))
    assert (cluster.get(a), cluster.get(b)) == (0, 0)


def test_stale_read_fails_validation() -> None:
    procedures = Procedures()
    cluster = LocalCluster(shards=2, procedures=procedures)
    a, b = keys_on_distinct_shards(cluster)
    cluster.preload({a: 0, b: 0})

    async def read_then_write(tx: Tx) -> None:
        value = await tx.get(b)  # remote read: the coroutine parks here
        tx.put(a, value + 1)

    procedures.register("read_then_write", read_then_write)
    reader = cluster.start("read_then_write", shard=0)
    writer = cluster.start("", [["put", b, 5]], shard=1)
    cluster.run_for(50_000_000)
    assert reader.outcome is not None and writer.outcome is not None
    outcomes = {100: reader.outcome.status, 101: writer.outcome.status}
    assert outcomes[101] == Status.COMMITTED
    # Either the reader ran first (and saw 0) or it was aborted; never a write based on a
    # read that another committed transaction had already overwritten when it certified.
    if outcomes[100] == Status.COMMITTED:
        assert cluster.get(a) in (1, 6)
    else:
        assert outcomes[100] == Status.ABORTED and cluster.get(a) == 0


def test_bad_requests_get_typed_errors_and_change_nothing() -> None:
    procedures = Procedures()

    async def boom(tx: Tx, key: str) -> None:
        tx.put(key, 1)
        raise RuntimeError("bug in procedure")

    async def give_up(tx: Tx, key: str) -> None:
        tx.put(key, 1)
        tx.abort("not today")

    procedures.register("boom", boom)
    procedures.register("give_up", give_up)
    cluster = LocalCluster(shards=1, procedures=procedures)
    with pytest.raises(UnknownProcedure):
        cluster.run("nope")
    with pytest.raises(InvalidRequest):
        cluster.run("boom")  # wrong arity
    with pytest.raises(ProcedureFailed, match="bug in procedure"):
        cluster.run("boom", "t/a")
    with pytest.raises(UserAborted, match="not today"):
        cluster.run("give_up", "t/a")
    with pytest.raises(InvalidRequest):
        cluster.ops([["put", "t/a", "x" * (2 << 20)]])
    with pytest.raises(InvalidRequest):
        cluster.ops([["put", "", 1]])
    with pytest.raises(InvalidRequest):
        cluster.ops([["frobnicate", "t/a"]])
    with pytest.raises(InvalidRequest):
        cluster.ops([["put", "t/a", {1: 2}]])
    with pytest.raises(InvalidRequest):
        cluster.ops([["increment", "t/a", "1"]])
    assert cluster.get("t/a") is None
    assert cluster.replica(0).store.key_count() == 0
