"""Table tests of the Paxos stream roles (store/core/paxos), one behaviour per test.

References: "Paxos Made Simple" (Lamport, 2001) §2.2 (phase 1 and 2 rules of the acceptor),
§2.3 (learning a chosen value), §3 (Multi-Paxos: one phase 1 for all slots, no-ops for
gaps); DESIGN.md §4 (streams of batches, heartbeats, watermarks) and §5 (takeover by a
higher ballot, no-ops, INF markers, finalized watermark).
"""

from __future__ import annotations

from typing import Any

import pytest

from store.core.paxos import (
    INF,
    NOOP,
    Accept,
    Accepted,
    Acceptor,
    Ballot,
    Chosen,
    Commit,
    Entry,
    EntryKind,
    Fetch,
    Learner,
    Phase,
    Prepare,
    Promise,
    Reject,
    StreamFollower,
    StreamLeader,
    StreamSettings,
    finalized_watermark,
)
from store.core.vclock import VectorClock

S = 7  # the stream id used throughout
B1 = Ballot(1, "us")
B2 = Ballot(2, "eu")
MS = 1_000_000
PEERS = ["eu", "ap"]


def batch(*counters: int, watermark: int = 0) -> Entry:
    return Entry(EntryKind.BATCH, [[f"t{c}"] for c in counters], list(counters), watermark)


def settings(**overrides: Any) -> StreamSettings:
    return StreamSettings().with_overrides(**overrides)


def promise_all(leader: StreamLeader, now_ns: int = 0) -> None:
    """Both peers promise with nothing accepted (phase 1 of a fresh stream)."""
    for peer in leader.peers:
        leader.handle(now_ns, peer, Promise(S, leader.ballot, leader.first_slot, [], True))


def accepts(messages: list[tuple[str, Any]]) -> list[tuple[str, Accept]]:
    return [(dst, m) for dst, m in messages if isinstance(m, Accept)]


# ---- acceptor ("Paxos Made Simple" §2.2) ---------------------------------------------


def test_acceptor_promises_and_reports_what_it_accepted_from_a_slot_on() -> None:
    acceptor = Acceptor(S)
    for slot in (0, 1, 3):
        assert isinstance(acceptor.accept(Accept(S, B1, slot, batch(slot + 1), 0)), Accepted)
    reply = acceptor.prepare(Prepare(S, B2, 1))
    assert isinstance(reply, Promise)
    assert reply.complete
    assert [(slot, b) for slot, b, _ in reply.accepted] == [(1, B1), (3, B1)]
    assert acceptor.promised == B2


@pytest.mark.parametrize(
    ("promised", "message", "rejected"),
    [
        (B2, Prepare(S, B1, 0), True),  # phase 1a below the promise
        (B2, Accept(S, B1, 0, batch(1), 0), True),  # phase 2a below the promise
        (B1, Accept(S, B1, 0, batch(1), 0), False),  # equal ballot: accepted
        (B1, Prepare(S, B1, 0), False),  # equal ballot: a repeated Prepare is answered
        (B1, Accept(S, B2, 0, batch(1), 0), False),  # higher: accepted, and promised
    ],
)
def test_acceptor_refuses_exactly_what_is_below_its_promise(
    promised: Ballot, message: Prepare | Accept, rejected: bool
) -> None:
    acceptor = Acceptor(S)
    acceptor.prepare(Prepare(S, promised, 0))
    acceptor.handle(0, "leader", message)
    [(dst, reply)] = acceptor.ready().messages
    assert dst == "leader"
    assert isinstance(reply, Reject) is rejected
    if rejected:
        assert reply == Reject(S, message.ballot, promised)
    assert acceptor.promised == max(promised, message.ballot)


def test_acceptor_keeps_the_highest_ballot_value_per_slot() -> None:
    acceptor = Acceptor(S)
    acceptor.accept(Accept(S, B1, 0, batch(1), 0))
    acceptor.accept(Accept(S, B2, 0, NOOP, 0))
    assert acceptor.accepted(0) == (B2, NOOP)


def test_acceptor_cuts_long_promises_into_pieces() -> None:
    acceptor = Acceptor(S, settings(promise_entries_max=2))
    for slot in range(5):
        acceptor.accept(Accept(S, B1, slot, batch(slot + 1), 0))
    first = acceptor.prepare(Prepare(S, B2, 0))
    assert isinstance(first, Promise)
    assert [s for s, _, _ in first.accepted] == [0, 1]
    assert not first.complete
    last = acceptor.prepare(Prepare(S, B2, 4))
    assert isinstance(last, Promise)
    assert last.complete


# ---- leader: batching, pipelining, choosing (Multi-Paxos, DESIGN.md §4) --------------


def test_fresh_leader_runs_phase1_then_proposes_batches() -> None:
    leader = StreamLeader(S, "us", PEERS, B1, settings(batch_size_max=3))
    out = leader.ready().messages
    assert out == [("eu", Prepare(S, B1, 0)), ("ap", Prepare(S, B1, 0))]
    for counter in (1, 2, 3, 4):
        leader.append(0, [f"t{counter}"], counter)
    assert accepts(leader.ready().messages) == []  # held until phase 1 completes
    leader.handle(0, "eu", Promise(S, B1, 0, [], True))
    assert leader.phase is Phase.LEADING  # us + eu are a majority of three regions
    sent = accepts(leader.ready().messages)
    assert [(dst, m.slot) for dst, m in sent] == [("eu", 0), ("ap", 0)]
    entry = sent[0][1].entry
    assert entry.counters == (1, 2, 3)
    assert entry.counter_max == 3


def test_a_quiet_streams_batch_closes_when_the_step_ends_then_one_per_batch_delay() -> None:
    """A record on a stream that has sent no batch for batch_delay_ns does not wait for it:
    its batch closes as soon as the step that appended it ends (with everything that step
    appended). After that, batches close batch_delay_ns after the previous one."""
    leader = StreamLeader(S, "us", PEERS, B1, settings(batch_delay_ns=2 * MS))
    promise_all(leader)
    leader.ready()
    leader.append(10, ["a"], 1)
    leader.append(10, ["b"], 2)  # the same step
    ready = leader.ready()
    assert accepts(ready.messages) == []  # not within the step
    assert ready.wake_at == 11
    leader.tick(11)
    [(_, accept), _] = accepts(leader.ready().messages)
    assert accept.entry.records == (["a"], ["b"])
    # Busy now: the next batch waits until batch_delay_ns after that one closed.
    leader.append(20, ["c"], 3)
    leader.append(30, ["d"], 4)
    ready = leader.ready()
    assert accepts(ready.messages) == [] and ready.wake_at == 11 + 2 * MS
    leader.tick(11 + 2 * MS - 1)
    assert accepts(leader.ready().messages) == []
    leader.tick(11 + 2 * MS)
    [(_, accept), _] = accepts(leader.ready().messages)
    assert accept.entry.records == (["c"], ["d"])


def test_hurried_batches_of_streams_close_at_the_same_instants() -> None:
    """Two streams whose batches closed at different times close their hurried ones
    together, on the ticks of batch_delay_awaited_ns: a transaction with records on both
    commits once both entries are chosen, so it waits for neither batch longer than for
    the other. Batches closed by the ordinary delay keep each stream's own rhythm."""
    ordinary, hurried = [], []
    for first in (2 * MS + 5, 3 * MS + 17):
        leader = StreamLeader(
            S, "us", PEERS, B1, settings(batch_delay_ns=10 * MS, batch_delay_awaited_ns=4 * MS),
        )
        promise_all(leader)
        leader.ready()
        leader.append(first, ["quiet"], 1)  # quiet: closes when its step ends
        leader.tick(first + 1)
        leader.ready()
        leader.append(first + 2, ["busy"], 2)
        ordinary.append(leader.ready().wake_at)
        closes = []
        for i, at in enumerate((first + 2, 5 * MS), start=3):
            if i > 3:
                leader.append(at, ["awaited"], i)
            leader.hurry(at)
            wake = leader.ready().wake_at
            assert wake is not None
            closes.append(wake)
            leader.tick(wake)
            assert len(accepts(leader.ready().messages)) == len(PEERS)  # one entry
        hurried.append(closes)
    assert ordinary == [12 * MS + 6, 13 * MS + 18]  # a delay after each one's own close
    assert hurried == [[4 * MS, 8 * MS], [4 * MS, 8 * MS]]


def test_a_full_batch_does_not_move_the_busy_streams_delay() -> None:
    """A batch that closes because it holds batch_size_max records leaves the delay's rhythm
    alone: the next batch still closes batch_delay_ns after the last one that closed by its
    delay, not batch_delay_ns after the full one."""
    leader = StreamLeader(S, "us", PEERS, B1, settings(batch_delay_ns=2 * MS, batch_size_max=2))
    promise_all(leader)
    leader.ready()
    leader.append(10, ["a"], 1)  # quiet: closes when the step ends, at 11, by its delay
    leader.tick(11)
    leader.ready()
    leader.append(20, ["b"], 2)
    leader.append(30, ["c"], 3)  # full: closes at once
    [(_, full), _] = accepts(leader.ready().messages)
    assert full.entry.records == (["b"], ["c"])
    leader.append(40, ["d"], 4)
    assert leader.ready().wake_at == 11 + 2 * MS


def test_a_batch_a_client_waits_on_closes_after_the_shorter_delay() -> None:
    """``hurry`` (a client waits for the commit of a record appended so far): the open batch
    closes at the next tick of batch_delay_awaited_ns after the previous close instead of
    batch_delay_ns after it; never later than it would have; with no open batch it changes
    nothing, and the batch after a hurried one keeps the ordinary delay."""
    leader = StreamLeader(
        S, "us", PEERS, B1, settings(batch_delay_ns=10 * MS, batch_delay_awaited_ns=4 * MS),
    )
    promise_all(leader)
    leader.ready()
    leader.hurry(5)  # nothing open: nothing to hurry
    assert leader.hurried == 0
    leader.append(10, ["a"], 1)  # quiet: closes at the end of the step, at 11
    leader.hurry(10)  # already sooner than the shorter delay: unchanged
    assert leader.ready().wake_at == 11 and leader.hurried == 0
    leader.tick(11)
    leader.ready()
    leader.append(1 * MS, ["b"], 2)  # busy: would close at 11 + 10 ms
    assert leader.ready().wake_at == 11 + 10 * MS
    leader.hurry(2 * MS)  # the shorter delay's next tick after 11: 4 ms
    assert leader.ready().wake_at == 4 * MS and leader.hurried == 1
    leader.tick(4 * MS)
    [(_, accept), _] = accepts(leader.ready().messages)
    assert accept.entry.records == (["b"],)
    leader.append(5 * MS, ["c"], 3)  # the next batch: the ordinary delay again
    assert leader.ready().wake_at == 14 * MS
    leader.hurry(13 * MS)  # late: the shorter delay's tick (8 ms) is past: the step's end
    assert leader.ready().wake_at == 13 * MS + 1


def test_a_busy_streams_accepts_carry_the_commit_index_without_commits_of_their_own() -> None:
    """With the default settings, a stream busy at one record per millisecond (an entry per
    batch_delay_ns) sends no ``Commit``: every moved commit index rides on the next Accept,
    which goes before commit_announce_delay_ns is up (a Commit is a message of its own to
    every follower). The answers come back at offsets spread over the batch delay, so an
    announce delay shorter than it would send Commits. The followers still learn every
    chosen slot from the Accepts."""
    leader = StreamLeader(S, "us", PEERS, B1, StreamSettings())
    promise_all(leader)
    leader.ready()
    proposed: dict[int, int] = {}  # slot -> when its Accept went out
    commits = 0
    announced = 0
    chosen_then: dict[int, int] = {}  # when -> chosen_through then
    for counter, now in enumerate(range(1, 600 * MS, MS), start=1):  # on the close times
        leader.append(now, [f"t{counter}"], counter)
        leader.tick(now)
        for peer in PEERS:  # a majority (with our own vote) answers 50-66 ms after each Accept
            for slot in [s for s, at in proposed.items() if at == now - (50 + s * 7 % 17) * MS]:
                leader.handle(now, peer, Accepted(S, B1, slot))
        for _, message in leader.ready().messages:
            if isinstance(message, Commit):
                commits += 1
            elif isinstance(message, Accept):
                proposed.setdefault(message.slot, now)
                announced = max(announced, message.chosen_through)
        chosen_then[now] = leader.chosen_through
    assert commits == 0
    # Every slot chosen a batch delay before the end rode on an Accept by the end.
    delay = StreamSettings().batch_delay_ns
    assert leader.chosen_through > 20 and announced >= chosen_then[now - delay - MS]


def test_a_leader_measures_the_batch_delay_and_the_round_to_a_majority() -> None:
    """What a record's commit waits for, in the leader's histograms: its batch's wait from
    the first record to the close (the batch delay of a busy stream), and each batch
    entry's time from proposal to choice. Heartbeats are not counted as batches."""
    leader = StreamLeader(S, "us", PEERS, B1, settings(batch_delay_ns=10 * MS))
    promise_all(leader)
    leader.ready()
    leader.append(0, ["a"], 1)  # quiet: closes when the step ends
    leader.tick(1)
    leader.ready()
    leader.append(2 * MS, ["b"], 2)  # busy: waits for 10 ms after the last close
    leader.append(3 * MS, ["c"], 3)
    leader.tick(1 + 10 * MS)
    leader.ready()
    assert leader.batch_wait.observations == 2
    assert leader.batch_wait.sum_ns == 1 + (1 + 10 * MS - 2 * MS)
    assert leader.choose_latency.observations == 0
    leader.handle(51 * MS, "eu", Accepted(S, B1, 0))  # proposed at 1 ns
    leader.handle(65 * MS, "ap", Accepted(S, B1, 1))  # proposed at 10 ms + 1 ns
    leader.ready()
    assert leader.choose_latency.observations == 2
    assert leader.choose_latency.sum_ns == (51 * MS - 1) + (65 * MS - 1 - 10 * MS)
    # A heartbeat chosen later is no batch: nothing more observed.
    leader.tick(200 * MS)
    [(_, heartbeat), _] = accepts(leader.ready().messages)
    assert heartbeat.entry.kind is EntryKind.BATCH and heartbeat.entry.records == ()
    leader.handle(250 * MS, "eu", Accepted(S, B1, heartbeat.slot))
    leader.ready()
    assert leader.choose_latency.observations == 2


def test_a_slot_is_chosen_by_a_majority_and_reported_in_slot_order() -> None:
    leader = StreamLeader(S, "us", PEERS, B1, settings(batch_size_max=1))
    promise_all(leader)
    for counter in (1, 2, 3):
        leader.append(0, [counter], counter)
    leader.ready()
    leader.handle(1, "eu", Accepted(S, B1, 2))
    leader.handle(1, "eu", Accepted(S, B1, 1))
    assert leader.ready().chosen == []  # slot 0 not yet chosen: nothing out of order
    leader.handle(2, "ap", Accepted(S, B1, 0))
    chosen = leader.ready().chosen
    assert [slot for slot, _ in chosen] == [0, 1, 2]
    assert [entry.counters for _, entry in chosen] == [(1,), (2,), (3,)]
    leader.handle(3, "eu", Accepted(S, B1, 0))  # late duplicate: nothing more
    assert leader.ready().chosen == []


def test_pipeline_is_bounded_by_slots_in_flight_max() -> None:
    leader = StreamLeader(S, "us", PEERS, B1, settings(batch_size_max=1, slots_in_flight_max=2))
    promise_all(leader)
    for counter in range(1, 6):
        leader.append(0, [counter], counter)
    assert sorted({m.slot for _, m in accepts(leader.ready().messages)}) == [0, 1]
    leader.handle(1, "eu", Accepted(S, B1, 0))
    assert sorted({m.slot for _, m in accepts(leader.ready().messages)}) == [2]
    assert leader.pending_records() == 2


def test_can_append_says_no_past_pending_records_max() -> None:
    leader = StreamLeader(S, "us", PEERS, B1, settings(pending_records_max=3))
    for counter in (1, 2, 3):
        assert leader.can_append()
        leader.append(0, [counter], counter)
    assert not leader.can_append()


def test_unacknowledged_accepts_are_retransmitted_to_silent_acceptors_only() -> None:
    leader = StreamLeader(S, "us", ["eu", "ap", "sa", "af"], B1,
                          settings(batch_size_max=1, accept_retry_ns=100 * MS,
                                   heartbeat_interval_ns=10**12,
                                   heartbeat_idle_interval_ns=10**12))
    for peer in leader.peers:
        leader.handle(0, peer, Promise(S, B1, 0, [], True))
    leader.append(0, ["x"], 1)
    leader.ready()
    leader.handle(1, "eu", Accepted(S, B1, 0))  # us + eu: 2 of 5, not a majority
    assert leader.ready().wake_at == 100 * MS
    leader.tick(100 * MS)
    assert sorted(dst for dst, _ in accepts(leader.ready().messages)) == ["af", "ap", "sa"]


def test_idle_stream_proposes_heartbeats_carrying_the_watermark() -> None:
    leader = StreamLeader(S, "us", PEERS, B1, settings(heartbeat_interval_ns=5 * MS))
    promise_all(leader)
    # A new leader's first heartbeat goes at once: its lease evidence (test_lease.py).
    assert leader.ready().wake_at == 0
    leader.tick(0)
    [(_, first), _] = accepts(leader.ready().messages)
    assert first.entry.is_heartbeat
    leader.advance_watermark(42)
    assert leader.ready().wake_at == 5 * MS
    leader.tick(5 * MS)
    [(_, accept), _] = accepts(leader.ready().messages)
    assert accept.entry.is_heartbeat
    assert accept.entry.watermark == 42


def test_a_heartbeat_with_nothing_new_waits_the_idle_interval() -> None:
    """A heartbeat that would carry the watermarks of the last entry again is proposed only
    every heartbeat_idle_interval_ns (it keeps followers and the lease fresh); one that
    carries a risen watermark or vector watermark goes after heartbeat_interval_ns."""
    leader = StreamLeader(S, "us", PEERS, B1, settings(
        heartbeat_interval_ns=5 * MS, heartbeat_idle_interval_ns=100 * MS,
        commit_announce_delay_ns=1 * MS,
    ))
    promise_all(leader)
    leader.advance_watermark(42)
    leader.tick(5 * MS)
    assert accepts(leader.ready().messages)  # news: the watermark rose to 42
    for peer in PEERS:
        leader.handle(6 * MS, peer, Accepted(S, B1, 0))
    leader.tick(7 * MS)  # the commit index is announced
    leader.ready()
    assert leader.ready().wake_at == 105 * MS  # nothing new: the idle interval
    leader.tick(50 * MS)
    assert not accepts(leader.ready().messages)
    leader.advance_vector_watermark(VectorClock({1: 7}))
    assert leader.ready().wake_at == 10 * MS  # news again: due at once
    leader.tick(50 * MS)
    [(_, accept), _] = accepts(leader.ready().messages)
    assert accept.entry.is_heartbeat and accept.entry.vw == VectorClock({1: 7})
    leader.tick(120 * MS)
    assert not accepts(leader.ready().messages)  # the last one carried it: idle again
    leader.tick(150 * MS)
    assert accepts(leader.ready().messages)


def test_counters_in_order_makes_each_counter_the_stream_watermark() -> None:
    leader = StreamLeader(S, "us", PEERS, B1, settings(batch_size_max=2), counters_in_order=True)
    promise_all(leader)
    leader.append(0, ["a"], 4)
    leader.append(0, ["b"], 9)
    [(_, accept), _] = accepts(leader.ready().messages)
    assert accept.entry.watermark == 9
    with pytest.raises(AssertionError):
        leader.append(0, ["c"], 8)


def test_commit_index_is_piggybacked_or_announced() -> None:
    leader = StreamLeader(S, "us", PEERS, B1,
                          settings(batch_size_max=1, commit_announce_delay_ns=MS))
    promise_all(leader)
    leader.append(0, ["a"], 1)
    leader.ready()
    leader.handle(10, "eu", Accepted(S, B1, 0))
    assert leader.ready().wake_at == 10 + MS
    leader.append(20, ["b"], 2)  # this Accept carries chosen_through=1
    assert {m.chosen_through for _, m in accepts(leader.ready().messages)} == {1}
    leader.tick(10 + MS)
    assert not [m for _, m in leader.ready().messages if isinstance(m, Commit)]
    leader.handle(30, "ap", Accepted(S, B1, 1))
    leader.tick(30 + MS)
    commits = [(dst, m) for dst, m in leader.ready().messages if isinstance(m, Commit)]
    assert commits == [("eu", Commit(S, B1, 2)), ("ap", Commit(S, B1, 2))]


def test_leader_serves_fetch_from_its_chosen_log() -> None:
    leader = StreamLeader(S, "us", PEERS, B1, settings(batch_size_max=1))
    promise_all(leader)
    for counter in (1, 2, 3):
        leader.append(0, [counter], counter)
    leader.ready()
    for slot in (0, 1):
        leader.handle(1, "eu", Accepted(S, B1, slot))
    leader.ready()
    leader.handle(2, "ap", Fetch(S, 0, 10))
    [(dst, reply)] = leader.ready().messages
    assert dst == "ap"
    assert isinstance(reply, Chosen)
    assert (reply.first_slot, [e.counters for e in reply.entries]) == (0, [(1,), (2,)])


# ---- takeover ("Paxos Made Simple" §3; DESIGN.md §5) --------------------------------


def test_reject_with_higher_ballot_deposes_the_leader() -> None:
    leader = StreamLeader(S, "us", PEERS, B1, settings(batch_size_max=1))
    promise_all(leader)
    leader.ready()
    leader.handle(0, "eu", Reject(S, B1, B2))
    assert leader.phase is Phase.DEPOSED
    assert leader.deposed_by == B2
    leader.append(1, ["late"], 1)
    leader.tick(10**12)
    assert leader.ready().messages == []


def test_own_acceptor_promising_a_higher_ballot_deposes_the_leader() -> None:
    leader = StreamLeader(S, "us", PEERS, B1)
    promise_all(leader)
    leader.ready()
    leader.handle(0, "eu", Prepare(S, B2, 0))
    [(dst, reply)] = leader.ready().messages
    assert dst == "eu"
    assert isinstance(reply, Promise)
    assert leader.phase is Phase.DEPOSED


def test_takeover_reproposes_highest_ballot_values_and_fills_holes_with_noops() -> None:
    """Phase 1 from slot 1 finds slots 1 and 3 (two ballots for 3): re-propose, no-op 2."""
    acceptor = Acceptor(S)
    acceptor.accept(Accept(S, B1, 1, batch(1), 0))
    leader = StreamLeader(S, "eu", ["us", "ap"], B2, first_slot=1, acceptor=acceptor)
    assert [m for _, m in leader.ready().messages] == [Prepare(S, B2, 1), Prepare(S, B2, 1)]
    older, newer = Ballot(1, "us"), Ballot(1, "zz")
    leader.handle(5, "ap", Promise(S, B2, 1, [(3, older, batch(30)), (3, newer, batch(31))],
                                   True))
    assert leader.phase is Phase.LEADING
    proposed = {m.slot: m.entry for _, m in accepts(leader.ready().messages)}
    assert proposed == {1: batch(1), 2: NOOP, 3: batch(31)}
    assert leader.noops_proposed == 1
    leader.append(6, ["new"], 40)
    leader.append_inf(6)
    after = {m.slot: m.entry for _, m in accepts(leader.ready().messages)}
    assert after[4].records == (["new"],)
    assert after[5] == INF


def test_takeover_asks_again_for_the_rest_of_a_cut_promise() -> None:
    leader = StreamLeader(S, "eu", ["us", "ap"], B2)
    leader.ready()
    leader.handle(1, "us", Promise(S, B2, 0, [(0, B1, batch(1)), (1, B1, batch(2))], False))
    assert leader.phase is Phase.PREPARING
    assert leader.ready().messages == [("us", Prepare(S, B2, 2))]
    leader.handle(2, "us", Promise(S, B2, 2, [(2, B1, batch(3))], True))
    assert leader.phase is Phase.LEADING
    assert sorted({m.slot for _, m in accepts(leader.ready().messages)}) == [0, 1, 2]


def test_prepare_is_retried_until_a_majority_promised() -> None:
    leader = StreamLeader(S, "us", PEERS, B1, settings(prepare_retry_ns=50 * MS))
    assert leader.ready().wake_at == 50 * MS
    leader.tick(50 * MS)
    assert [dst for dst, _ in leader.ready().messages] == ["eu", "ap"]


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        ([], (0, None)),
        ([batch(1, watermark=3), batch(2, watermark=5)], (5, None)),
        ([batch(1, watermark=3), NOOP, batch(9, watermark=9)], (3, 1)),  # void after no-op
        ([batch(1, watermark=4), batch(watermark=6), INF, batch(watermark=99)], (6, 2)),
    ],
)
def test_finalized_watermark_stops_at_the_first_noop_or_inf(
    entries: list[Entry], expected: tuple[int, int | None]
) -> None:
    result = finalized_watermark(enumerate(entries))
    assert (result.watermark, result.end_slot) == expected
    assert result.final is (expected[1] is not None)


# ---- learner ("Paxos Made Simple" §2.3) -----------------------------------------------


def test_learner_delivers_proposals_once_the_same_ballot_says_chosen() -> None:
    learner = Learner(S)
    learner.handle(0, "us", Accept(S, B1, 0, batch(1), 0))
    learner.handle(0, "us", Accept(S, B1, 1, batch(2), 0))
    assert learner.ready().chosen == []
    learner.handle(1, "us", Commit(S, B1, 1))
    assert [slot for slot, _ in learner.ready().chosen] == [0]
    learner.handle(2, "us", Accept(S, B1, 2, batch(3), 3))  # piggybacked commit index
    assert [slot for slot, _ in learner.ready().chosen] == [1, 2]
    learner.handle(3, "us", Commit(S, B1, 3))  # duplicate: delivered exactly once
    assert learner.ready().chosen == []


def test_learner_trusts_no_proposal_from_another_ballot_and_fetches_it() -> None:
    learner = Learner(S, StreamSettings(fetch_retry_ns=10 * MS))
    learner.handle(0, "us", Accept(S, B1, 0, batch(1), 0))
    learner.handle(1, "eu", Commit(S, B2, 1))  # chosen, but by B2's value: unknown here
    ready = learner.ready()
    assert ready.chosen == []
    assert ready.wake_at == 1 + 10 * MS
    learner.tick(1 + 10 * MS)
    assert learner.ready().messages == [("eu", Fetch(S, 0, 1))]
    learner.handle(2, "eu", Chosen(S, 0, [NOOP]))
    assert learner.ready().chosen == [(0, NOOP)]


def test_learner_recognises_a_proposal_arriving_after_its_commit() -> None:
    learner = Learner(S)
    learner.handle(0, "us", Commit(S, B1, 2))
    learner.handle(1, "us", Accept(S, B1, 1, batch(2), 0))
    learner.handle(1, "us", Accept(S, B1, 0, batch(1), 0))
    assert [slot for slot, _ in learner.ready().chosen] == [0, 1]


def test_learner_holds_no_proposal_beyond_its_window() -> None:
    learner = Learner(S, StreamSettings(learner_window_slots=4))
    learner.handle(0, "us", Accept(S, B1, 9, batch(1), 0))
    learner.handle(0, "us", Commit(S, B1, 10))
    assert learner.ready().chosen == []
    assert learner.chosen_through == 10  # a gap: it will fetch from slot 0


def test_follower_routes_accept_to_acceptor_and_learner() -> None:
    follower = StreamFollower(S)
    follower.handle(0, "us", Accept(S, B1, 0, batch(1), 0))
    follower.handle(0, "us", Commit(S, B1, 1))
    ready = follower.ready()
    assert ready.messages == [("us", Accepted(S, B1, 0))]
    assert ready.chosen == [(0, batch(1))]


# ---- durability (issue 14): what the acceptor hands out to be persisted --------------------


def test_an_acceptor_hands_out_every_change_of_its_state_to_persist() -> None:
    acceptor = Acceptor(S)
    entry = Entry(EntryKind.BATCH, [["x"]], [1], 1)
    acceptor.handle(0, "us", Prepare(S, B1, 0))
    acceptor.handle(0, "us", Prepare(S, B1, 0))  # the same promise again: nothing new
    acceptor.handle(0, "us", Accept(S, B1, 0, entry, 0))
    acceptor.handle(0, "us", Accept(S, B1, 0, entry, 0))  # a duplicate: nothing new
    acceptor.handle(0, "us", Accept(S, B1, 1, NOOP, 0))
    ready = acceptor.ready()
    assert ready.persist == [Prepare(S, B1, 0), Accept(S, B1, 0, entry, 0), Accept(S, B1, 1, NOOP, 0)]
    assert [type(m).__name__ for _, m in ready.messages] == ["Promise", "Promise", "Accepted", "Accepted", "Accepted"]
    acceptor.handle(0, "us", Prepare(S, Ballot(0, "zz"), 0))  # refused: nothing to persist
    assert acceptor.ready().persist == []


def test_an_acceptor_recovered_from_its_records_promises_and_answers_as_before() -> None:
    acceptor = Acceptor(S)
    records = []
    entry = Entry(EntryKind.BATCH, [["x"]], [1], 1)
    for message in (Prepare(S, B1, 0), Accept(S, B1, 0, entry, 0), Accept(S, B1, 1, NOOP, 0),
                    Prepare(S, B2, 0), Accept(S, B2, 1, INF, 0)):
        acceptor.handle(0, "x", message)
        records += acceptor.ready().persist
    recovered = Acceptor.recover(S, records)
    assert recovered.promised == acceptor.promised == B2
    assert recovered.voting  # it remembers every promise: it may vote at once
    for later in (Prepare(S, Ballot(3, "ap"), 0), Prepare(S, Ballot(1, "us"), 0)):
        assert recovered.prepare(later) == acceptor.prepare(later)
    assert recovered.accepted(1) == (B2, INF) and recovered.accepted(0) == (B1, entry)


def test_a_leader_hands_out_its_own_acceptors_records_with_its_accepts() -> None:
    """The leader votes through its region's acceptor directly: its promise must be
    durable before its Prepares leave, its vote before the Accepts that count on it
    (StreamReady.persist)."""
    leader = StreamLeader(S, "us", PEERS, B1, settings(batch_size_max=1))
    first = leader.ready()
    assert first.persist == [Prepare(S, B1, 0)]
    assert any(isinstance(m, Prepare) for _, m in first.messages)
    promise_all(leader)
    leader.append(0, ["a"], 1)
    ready = leader.ready()
    accepts_sent = [m for _, m in ready.messages if isinstance(m, Accept)]
    assert accepts_sent
    assert [r.slot for r in ready.persist] == [accepts_sent[0].slot]
    assert ready.persist[0].entry == accepts_sent[0].entry
