"""Table tests of recovery's pure pieces (docs/recovery.md): epoch-carrying counters, a
stream's finalized watermarks, the cluster map's commands, the configuration manager's
failover decision, a participant's epoch change."""

from __future__ import annotations

import pytest

from store.core.cm import ConfigMember
from store.core.epoch import EPOCH_SHIFT, StreamEpochs, counter_base, epoch_of
from store.core.follower import ShardFollower
from store.core.participant import Participant
from store.core.partition import Partitioner
from store.core.paxos import Entry, EntryKind
from store.core.settings import DEFAULT_SETTINGS, MS
from store.core.storage import VersionedStore
from store.core.txn import Procedures
from store.core.vclock import VectorClock
from store.core.watermark import ShardWatermark, VectorWatermark
from store.protocol.cluster_map import ClusterMap
from store.protocol.messages import FOLLOWER, LEADER, REJOINING, Heartbeat


def test_counters_carry_their_epoch() -> None:
    assert counter_base(0) == 0 and counter_base(3) == 3 << EPOCH_SHIFT
    assert epoch_of(1) == 0 and epoch_of(counter_base(2) + 1) == 2
    assert counter_base(1) + 1 > counter_base(0) + 10**9  # a later epoch counts above
    watermark = ShardWatermark()
    assert watermark.draw() == 1
    watermark.settle(1)
    watermark.start_epoch(2)
    assert watermark.draw() == counter_base(2) + 1


def test_a_watermark_of_a_later_epoch_waits_until_the_node_enters_it() -> None:
    vw = VectorWatermark()
    assert vw.learn(0, 7)
    assert not vw.learn(1, counter_base(1) + 3)  # the node is still in epoch 0
    assert vw[1] == 0
    assert vw.enter_epoch(1) and vw[1] == counter_base(1) + 3


def entry(kind: EntryKind, epoch: int, watermark: int = 0) -> Entry:
    return Entry(kind, watermark=watermark, epoch=epoch)


def test_finalized_watermarks_stop_at_the_first_marker_of_an_epoch() -> None:
    """DESIGN.md §5 step 4: everything after a no-op or INF of its epoch is void."""
    epochs = StreamEpochs()
    added = [
        epochs.add(entry(EntryKind.BATCH, 0, 5)),
        epochs.add(entry(EntryKind.BATCH, 0, 9)),
        epochs.add(entry(EntryKind.NOOP, 0)),
        epochs.add(entry(EntryKind.BATCH, 0, 12)),  # void: after its epoch's no-op
        epochs.add(entry(EntryKind.INF, 0)),
        epochs.add(entry(EntryKind.BATCH, 1, counter_base(1) + 4)),
    ]
    assert added == [True, True, False, False, False, True]
    assert epochs.finalized_watermark(0) == 9
    assert epochs.finalized_watermark(1) is None  # epoch 1 has not ended


def test_a_marker_of_a_later_epoch_ends_the_epochs_the_stream_skipped() -> None:
    """A leader that never heard of epoch 1 is taken over in epoch 2: the new leader's
    markers are of epoch 1, and they end epochs 0 and 1 alike."""
    epochs = StreamEpochs()
    epochs.add(entry(EntryKind.BATCH, 0, 30))
    epochs.add(entry(EntryKind.NOOP, 1))
    assert epochs.finalized == {0: 30, 1: 30}


def test_the_cluster_map_applies_each_command_once_and_only_in_order() -> None:
    cluster_map = ClusterMap(0, ["l0", "l1"], [["a0", "b0"], ["a1", "b1"]])
    assert cluster_map.apply(["failover", 0, "l0", "a0", 1])
    assert cluster_map.leaders == ["a0", "l1"]
    assert cluster_map.followers[0] == ["l0", "b0"]  # the old leader stays a stream member
    assert not cluster_map.apply(["failover", 0, "l0", "a0", 1])  # stale: applied once
    assert not cluster_map.apply(["failover", 1, "l1", "a1", 3])  # not the next epoch
    assert cluster_map.apply(["finalized", 0, 1, 40])
    assert cluster_map.fvw == {}
    assert not cluster_map.apply(["finalized", 1, 1, 50])  # epoch 1 has not ended
    assert cluster_map.apply(["finalized", 0, 0, 33])
    assert cluster_map.fvw == {0: {0: 33, 1: 40}}


def test_the_cm_replaces_a_silent_leader_with_its_most_advanced_follower() -> None:
    initial = ClusterMap(0, ["l0"], [["a0", "b0"]])
    member = ConfigMember("cm", ["cm"], initial, DEFAULT_SETTINGS)
    now = 0
    timeout = DEFAULT_SETTINGS.leader_timeout_ns

    def beat(address: str, role: int, delivered: int) -> None:
        member.handle(now, address, Heartbeat(address, 0, role, 0, delivered, -1, []))

    for _ in range(5):
        now += 200 * MS
        beat("l0", LEADER, 10)
        beat("a0", FOLLOWER, 7)
        beat("b0", FOLLOWER, 9)
        member.tick(now)
        member.ready()
    assert member.map.epoch == 0  # the leader is alive
    for _ in range(12):
        now += 100 * MS
        beat("a0", FOLLOWER, 7)
        beat("b0", FOLLOWER, 9)
        member.tick(now)
        member.ready()
    assert now > timeout
    assert member.map.epoch == 1 and member.map.leaders == ["b0"]  # b0 delivered the most
    assert member.failovers == 1


def test_a_rejoining_replica_neither_keeps_its_leader_alive_nor_is_a_candidate() -> None:
    """A REJOINING heartbeat says the process restarted with its memory gone: what it said
    in its previous life no longer holds. A leader that restarts is replaced at once (not a
    leader_timeout later), by a follower that is alive and not itself rejoining; the
    rejoining ones are sent the map."""
    initial = ClusterMap(0, ["l0"], [["a0", "b0"]])
    member = ConfigMember("cm", ["cm"], initial, DEFAULT_SETTINGS)
    now = 0
    pushed: list[str] = []

    def step(beats: list[tuple[str, int, int]]) -> None:
        nonlocal now
        now += 100 * MS
        for address, role, delivered in beats:
            member.handle(now, address, Heartbeat(address, 0, role, 0, delivered, -1, []))
        member.tick(now)
        pushed.extend(dst for dst, _ in member.ready().messages)

    for _ in range(12):  # past the CM leader's first leader_timeout
        step([("l0", LEADER, 10), ("a0", FOLLOWER, 7), ("b0", FOLLOWER, 9)])
    assert member.map.epoch == 0
    for _ in range(2):  # failure detection runs once per heartbeat interval
        step([("l0", REJOINING, 0), ("a0", FOLLOWER, 7), ("b0", FOLLOWER, 9)])
    assert member.map.epoch == 1 and member.map.leaders == ["b0"]  # at once, the most advanced
    # The new leader restarts too, just after: its earlier heartbeat was recent and said it
    # was the most advanced, but it no longer holds; a0 takes over, never a rejoining one.
    step([("l0", REJOINING, 0), ("a0", FOLLOWER, 7), ("b0", REJOINING, 0)])
    step([("l0", REJOINING, 0), ("a0", FOLLOWER, 7), ("b0", REJOINING, 0)])
    assert member.map.epoch == 2 and member.map.leaders == ["a0"]
    assert "l0" in pushed and "b0" in pushed  # a rejoining replica is sent the map


def test_a_participant_entering_an_epoch_aborts_what_still_holds_locks() -> None:
    store = VersionedStore()
    settled: list[int] = []
    participant = Participant(
        0, store, ShardWatermark(), DEFAULT_SETTINGS, lambda *args: settled.append(args[1])
    )
    ok, counter, _ = participant.lock(11, ["t/a"], 0)
    assert ok and store.lock_owner("t/a") == 11
    store.install("t/b", 1, False, VectorClock({0: 7}), 0, 12)  # above the frozen watermark
    abandoned = participant.begin_epoch(1, {0: 5})
    assert abandoned == [counter] and store.lock_owner("t/a") is None
    assert participant.lock(13, ["t/c"], 0) == (False, 0, VectorClock())  # an old epoch's
    assert not participant.lock(14, ["t/b"], 1)[0]  # t/b's newest version is in doubt
    assert participant.lock(15, ["t/c"], 1)[0]
    participant.install(11, [("t/a", 1, False)], VectorClock({0: counter}), 0)  # ignored
    assert store.latest("t/a") is None
    participant.end_doubt(0, {0: 9})
    assert participant.lock(16, ["t/b"], 1)[0]  # resolved by the FVW


@pytest.mark.parametrize("breaks", [frozenset(), frozenset({"stamps"})])
def test_a_promoted_leaders_writers_dominate_the_epoch_base_of_every_shard(
    breaks: frozenset[str],
) -> None:
    """docs/recovery.md rule 9: a leader that took a stream over rebuilt its store by replay,
    which carries no read stamps, so every writer there dominates ``counter_base(epoch)`` on
    every shard until the vector watermark passes it. ``--break stamps`` drops the rule,
    and this is the deterministic check that catches it (the end-to-end seed is in
    tests/sim/test_recovery.py)."""
    follower = ShardFollower(
        0, "us/0", partitioner=Partitioner(3), procedures=Procedures(), breaks=breaks
    )
    cluster_map = ClusterMap(1, ["us/0", "us/1", "us/2"], [["eu/0"], ["eu/1"], ["eu/2"]])
    leader = follower.promote(0, cluster_map)
    deps = leader.participant.dependencies(["la/000001"])
    base = VectorClock({shard: counter_base(1) for shard in range(3)})
    if breaks:
        assert not base <= deps, "--break stamps no longer removes rule 9"
    else:
        assert base <= deps
