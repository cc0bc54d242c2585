"""The shard watermark (DESIGN.md §4) checked against its definition: the largest counter c
such that every value at or below c that anyone drew is settled (aborted or durable). With a
shard of several workers drawing from one shared counter, the shard's watermark is the
minimum of the workers' claims; that rule must equal the definition in every interleaving."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.core.epoch import counter_base
from store.core.participant import PREPARED, Participant
from store.core.settings import DEFAULT_SETTINGS
from store.core.storage import VersionedStore
from store.core.vclock import VectorClock
from store.core.watermark import LocalCounter, ShardWatermark, VectorWatermark, clock_watermark


def _definition(unsettled: set[int], counter: LocalCounter) -> int:
    # Values never drawn (skipped by an epoch's start) have nothing to wait for.
    return min(unsettled) - 1 if unsettled else counter.value()


# An operation: (worker, what, choice): draw a value, settle one of the worker's unsettled
# values (chosen by `choice`), or start the next epoch on every worker.
operations = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from(["draw", "draw", "settle", "epoch"]),
              st.integers(0, 1 << 16)),
    max_size=200,
)


@given(workers=st.integers(1, 4), ops=operations)
@settings(max_examples=300, deadline=None)
def test_minimum_over_workers_is_the_shards_watermark(workers: int, ops: list[tuple[int, str, int]]) -> None:
    counter = LocalCounter()
    marks = [ShardWatermark(counter=counter) for _ in range(workers)]
    mine: list[list[int]] = [[] for _ in range(workers)]  # each worker's unsettled values
    unsettled: set[int] = set()
    epoch = 0
    for worker, what, choice in ops:
        worker %= workers
        if what == "draw":
            value = marks[worker].draw()
            assert value not in unsettled and value == counter.value()
            mine[worker].append(value)
            unsettled.add(value)
        elif what == "settle" and mine[worker]:
            value = mine[worker].pop(choice % len(mine[worker]))
            marks[worker].settle(value)
            unsettled.discard(value)
        elif what == "epoch" and epoch < 3:
            epoch += 1
            for mark in marks:
                mark.start_epoch(epoch)
            assert counter.value() >= counter_base(epoch)
        assert min(mark.watermark for mark in marks) == _definition(unsettled, counter)


def test_an_idle_worker_claims_the_shared_counter_and_a_busy_one_holds_below_its_oldest() -> None:
    counter = LocalCounter()
    busy, idle = ShardWatermark(counter=counter), ShardWatermark(counter=counter)
    first = busy.draw()
    second = busy.draw()
    assert idle.watermark == second  # idle: drew nothing, vouches for everything so far
    assert busy.watermark == first - 1
    busy.settle(second)
    assert busy.watermark == first - 1  # out of order: still held by the first
    busy.settle(first)
    assert busy.watermark == second
    own = idle.draw()
    assert busy.watermark == own  # busy is idle now: its claim follows the shared counter
    assert idle.watermark == own - 1


def test_one_worker_without_a_shared_counter_is_unchanged() -> None:
    alone = ShardWatermark(start=5)
    assert alone.watermark == 5
    assert alone.draw() == 6
    assert alone.watermark == 5
    alone.settle(6)
    assert alone.watermark == 6
    alone.start_epoch(1)
    assert alone.draw() == counter_base(1) + 1


def test_a_shards_entry_is_the_least_claim_of_its_workers() -> None:
    vw = VectorWatermark(workers=2)  # units 0, 1: shard 0; units 2, 3: shard 1
    assert not vw.learn(0, 10)  # worker 1 of shard 0 has claimed nothing yet
    assert vw[0] == 0
    assert vw.learn(1, 7)
    assert vw[0] == 7
    assert vw.learn(1, 12)
    assert vw[0] == 10
    assert vw.shard_top(0) == 12
    assert vw[1] == 0
    # A whole shard's watermark vouches for every worker of it.
    assert vw.learn_clocks({1: 5})
    assert vw.claims[2] == vw.claims[3] == 5 and vw[1] == 5
    assert not vw.learn_clocks({0: 9})  # below both claims: nothing moves
    assert vw[0] == 10
    # Only a rise of the least claim moves the entry; the top follows every rise.
    assert not vw.learn(1, 13)
    assert vw[0] == 10 and vw.shard_top(0) == 13
    assert vw.learn(0, 20)
    assert vw[0] == 13 and vw.shard_top(0) == 20
    assert vw.learn(1, 25)
    assert vw[0] == 20 and vw.shard_top(0) == 25


def test_a_workers_claim_of_a_later_epoch_waits_for_the_epoch() -> None:
    vw = VectorWatermark(workers=2)
    later = counter_base(1) + 3
    assert not vw.learn(0, later) and not vw.learn(1, later)
    assert vw[0] == 0
    assert vw.enter_epoch(1)
    assert vw[0] == later


def test_entries_gossiped_in_a_later_epoch_wait_until_the_node_is_in_it() -> None:
    # A peer in epoch 1 knows shard 0's units at 0:11 (a worker still in epoch 0) and at
    # 1:0 (a failed-over worker's first claim): the entry's value, 0:11, is of epoch 0,
    # but it rests on the rollback that 1:0 vouches for.
    peer = VectorWatermark(workers=2)
    peer.enter_epoch(1)
    peer.learn(0, counter_base(1))
    peer.learn(1, 11)
    assert peer[0] == 11
    behind = VectorWatermark(workers=2)
    assert not behind.learn_entries(peer.entries, 1) and behind[0] == 0
    behind.enter_epoch(1)
    assert behind.learn_entries(peer.entries, 1) and behind[0] == 11
    # One worker: entries are claims, each held back by its own epoch.
    one = VectorWatermark()
    assert one.learn_entries({0: 11}, 1) and one[0] == 11


def test_a_finalized_watermark_of_units_is_the_least_per_shard() -> None:
    assert clock_watermark({0: 5, 1: 3, 2: 9, 3: 20}, 2) == {0: 3, 1: 9}
    assert clock_watermark({0: 5, 1: 3}, 1) == {0: 5, 1: 3}
    with pytest.raises(AssertionError):
        clock_watermark({0: 5, 1: 3, 2: 9}, 2)  # shard 1's second worker is missing


def test_a_worker_counting_alone_jumps_to_its_fellows_claim_and_claims_it_idle() -> None:
    alone = ShardWatermark()
    alone.draw()
    alone.raise_floor(40)
    assert alone.watermark == 0  # its draw 1 is not settled yet
    alone.settle(1)
    assert alone.watermark == 40
    assert alone.draw() == 41
    shared = LocalCounter()
    worker = ShardWatermark(counter=shared)
    worker.raise_floor(40)
    assert shared.value() == 40 and worker.watermark == 40


def test_a_worker_counting_alone_draws_above_what_its_writes_depend_on() -> None:
    """A worker promoted alone counts on its own counter, which can be behind the values
    a fellow drew into the clocks of versions it holds (a transaction across the two):
    its next write of such a key must still be above the version it overwrites on the
    shard's entry, or a follower's replay (Thomas's write rule on that entry) keeps the
    older one. With ``floor_on_deps`` it draws above; without, it would draw 2 here."""
    store = VersionedStore()
    store.install("t/k", 1, False, VectorClock({0: 100}), 0, 7)  # a fellow's 100 in its clock
    watermark = ShardWatermark()
    watermark.draw()  # this worker's own counter is at 1
    watermark.settle(1)
    participant = Participant(0, store, watermark, DEFAULT_SETTINGS, lambda *args: None)
    participant.floor_on_deps = True
    ok, counter, deps = participant.lock(11, ["t/k"], 0)
    assert ok and deps[0] == 100 and counter > 100


def test_a_worker_tells_its_fellows_at_once_of_another_shards_entry_heard_in_a_reply() -> None:
    """A shard's transactions are spread over its workers, so each hears from other shards
    1/W as often as one leader would; what one hears in a reply goes to its fellows at once
    (at most once per ``fellow_gossip_spacing_ns``), not at the next round of gossip."""
    from store.core.partition import Partitioner, WorkerPartitioner
    from store.core.replica import ShardLeader
    from store.core.txn import Procedures
    from store.protocol.messages import Gossip, ValidateReply

    peers = [f"unit/{unit}" for unit in range(4)]  # units 0, 1: shard 0; 2, 3: shard 1
    leader = ShardLeader(
        0, peers, WorkerPartitioner(Partitioner(2), 2), Procedures(), counter=LocalCounter()
    )
    spacing = DEFAULT_SETTINGS.fellow_gossip_spacing_ns
    assert 4 * spacing < DEFAULT_SETTINGS.gossip_interval_ns
    leader.ready()
    now = spacing  # the regular gossip is due at gossip_interval_ns only
    leader.handle(now, peers[2], ValidateReply(1, 2, True, 7))
    sent = [(to, m) for to, m in leader.ready().messages if isinstance(m, Gossip)]
    assert [to for to, _ in sent] == [peers[1]] and sent[0][1].watermarks[1] == 7
    # Within the spacing: nothing yet, but a wake-up when it has passed.
    leader.handle(now + 1, peers[3], ValidateReply(2, 3, True, 9))
    ready = leader.ready()
    assert not [m for _, m in ready.messages if isinstance(m, Gossip)]
    assert ready.wake_at <= now + spacing
    leader.tick(now + spacing)
    sent = [(to, m) for to, m in leader.ready().messages if isinstance(m, Gossip)]
    assert [to for to, _ in sent] == [peers[1]] and sent[0][1].watermarks[1] == 9
    # Its own shard's entry is not news for the fellows (they read the shared counter).
    leader.handle(now + 3 * spacing, peers[1], ValidateReply(3, 1, True, 5))
    assert not [m for _, m in leader.ready().messages if isinstance(m, Gossip)]


def test_fellows_know_at_once_what_one_heard_through_their_board() -> None:
    """Workers of a shard that share a watermark board (``SharedWatermarks``: a file in
    shared memory on their machine) need no gossip between them: what one hears of another
    shard's entry, its fellow knows at its next step."""
    from store.core.partition import Partitioner, WorkerPartitioner
    from store.core.replica import ShardLeader
    from store.core.txn import Procedures
    from store.core.watermark import LocalWatermarks
    from store.protocol.messages import Gossip, ValidateReply

    peers = [f"unit/{unit}" for unit in range(4)]  # units 0, 1: shard 0; 2, 3: shard 1
    partitioner = WorkerPartitioner(Partitioner(2), 2)
    counter, board = LocalCounter(), LocalWatermarks(2, 2)
    first, second = (
        ShardLeader(unit, peers, partitioner, Procedures(), counter=counter, board=board)
        for unit in (0, 1)
    )
    first.ready()
    second.ready()
    now = DEFAULT_SETTINGS.fellow_gossip_spacing_ns  # the regular gossip is not due yet
    first.handle(now, peers[2], ValidateReply(1, 2, True, 7))
    assert first.vw[1] == 7
    assert not [m for _, m in first.ready().messages if isinstance(m, Gossip)]
    assert second.vw[1] == 0
    second.tick(now + 1)
    assert second.vw[1] == 7
    # And back: what the second hears, the first reads at its next step.
    second.handle(now + 2, peers[3], ValidateReply(2, 3, True, 9))
    first.tick(now + 3)
    assert first.vw[1] == 9


def test_a_participant_answers_without_the_entries_it_knows_durable() -> None:
    """The versions a participant holds keep the clocks they were certified with; by the time
    another transaction reads or overwrites them most entries are durable, and carry nothing
    (DESIGN.md §4). Its answers (a lock's dependencies, a prepared transaction's, the items
    it reads for another shard) leave out every entry at or below the vector watermark it
    knows, and keep the rest."""
    store = VersionedStore()
    store.install("t/a", 1, False, VectorClock({1: 5, 2: 30}), 0, 7)
    store.install("t/b", 2, False, VectorClock({1: 12, 2: 3}), 0, 8)
    store.install("t/c", 3, False, VectorClock({1: 4, 2: 25}), 0, 9)
    known = {1: 10, 2: 20}  # shard 1 durable up to 10, shard 2 up to 20
    participant = Participant(
        0, store, ShardWatermark(), DEFAULT_SETTINGS, lambda *args: None,
        vector_watermark=known,
    )
    ok, _, deps = participant.lock(11, ["t/a"], 0)
    assert ok and deps == VectorClock({2: 30})
    status, _, items, deps = participant.prepare(12, ["t/c"], ["t/b"], VectorClock({}), 0)
    assert status == PREPARED and deps == VectorClock({1: 12})
    assert [item[4] for item in items] == [VectorClock({2: 25})]
    [(_, _, _, _, vc, _)] = participant.read(["t/b"], sparse=True)
    assert vc == VectorClock({1: 12})
    # Its own reads (the coordinator's, in its process) keep the whole clock.
    [(_, _, _, _, vc, _)] = participant.read(["t/b"])
    assert vc == VectorClock({1: 12, 2: 3})


def test_with_a_board_gossip_goes_to_one_worker_of_each_shard_in_turn() -> None:
    """What one worker hears its fellows read from their board, so a leader's gossip goes to
    shards, not units: each round reaches one worker of every other shard (up to the
    fanout), and the rounds take the shard's workers in turn."""
    from store.core.partition import Partitioner, WorkerPartitioner
    from store.core.replica import ShardLeader
    from store.core.txn import Procedures
    from store.core.watermark import LocalWatermarks
    from store.protocol.messages import Gossip

    peers = [f"unit/{unit}" for unit in range(6)]  # shard s: units 2s, 2s + 1
    leader = ShardLeader(
        0, peers, WorkerPartitioner(Partitioner(3), 2), Procedures(), counter=LocalCounter(),
        board=LocalWatermarks(3, 2),
    )
    leader.ready()
    interval = DEFAULT_SETTINGS.gossip_idle_interval_ns  # nothing moves: idle refreshes
    rounds = []
    for n in range(1, 4):
        leader.tick(n * interval)
        sent = {to for to, m in leader.ready().messages if isinstance(m, Gossip)}
        rounds.append(sent - {peers[1]})  # its fellow hears every round
    assert rounds == [
        {peers[2], peers[4]}, {peers[3], peers[5]}, {peers[2], peers[4]},
    ]


def test_a_worker_takes_from_the_board_neither_a_later_epochs_entries_nor_its_own_shards() -> None:
    """What a fellow already in a later epoch knows may rest on claims of that epoch (the
    rollback of what was drawn above the ended epoch's finalized watermark): a worker still
    in the earlier epoch takes nothing from it, as with gossip. And a fellow's entry for the
    worker's own shard is not taken at all: it rests on the fellow's own claim, which after a
    failover of the fellow's unit says nothing of its new leader's draws (seed 386 of the
    simulator's worker faults); the fellows' claims come from the shared counter instead."""
    from store.core.partition import Partitioner, WorkerPartitioner
    from store.core.replica import ShardLeader
    from store.core.txn import Procedures
    from store.core.watermark import LocalWatermarks

    peers = [f"unit/{unit}" for unit in range(4)]  # units 0, 1: shard 0; 2, 3: shard 1
    board = LocalWatermarks(2, 2)
    leader = ShardLeader(
        0, peers, WorkerPartitioner(Partitioner(2), 2), Procedures(), counter=LocalCounter(),
        board=board,
    )
    leader.ready()
    assert leader.vw.epoch == 0
    board.publish(1, 1, {0: 50, 1: 40})  # the fellow (slot 1) is in epoch 1 already
    leader.tick(1)
    assert leader.vw[1] == 0 and leader.vw[0] == 0
    board.publish(1, 0, {0: 50, 1: 40})  # in the worker's epoch: shard 1's entry is taken
    leader.tick(2)
    assert leader.vw[1] == 40
    assert leader.vw.claims.get(0, 0) < 50  # its own unit's claim not raised by the fellow
