"""State transfer to a restarted replica (docs/recovery.md "Rejoining"), as pure objects:
the state's encoding round-trips and rejects garbage; a source serves a fixed state in
pieces; a restarted acceptor keeps the rules that make its lost memory harmless."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store.core.epoch import StreamEpochs
from store.core.errors import InvalidRequest
from store.core.paxos import (
    INF,
    Accept,
    Accepted,
    Acceptor,
    Ballot,
    Entry,
    EntryKind,
    Prepare,
    Promise,
)
from store.core.storage import VersionedStore
from store.core.transfer import (
    FollowerState,
    StateDecoder,
    StateServer,
    StoreSnapshot,
    decode_state,
    encode_state,
    encode_state_steps,
    version_chains,
)
from store.core.vclock import VectorClock
from store.protocol.cluster_map import ClusterMap
from store.protocol.messages import SnapshotRead, StateRequest

VC = VectorClock({0: 5, 1: 2})
BATCH = Entry(EntryKind.BATCH, [[7, [["t/a", 1, False]], VC.to_wire()]], [5], 5, VC, 0)


def sample_epochs() -> StreamEpochs:
    epochs = StreamEpochs()
    epochs.add(BATCH)
    epochs.add(INF)  # ends epoch 0 at watermark 5
    return epochs


def sample_state() -> FollowerState:
    store = VersionedStore()
    store.install("t/a", [1, 2], False, VC, 0, 7)
    store.install("t/a", None, True, VectorClock({0: 6}), 1, 8)
    store.install("t/b", {"x": b"y"}, False, VectorClock({1: 2}), 0, 9)
    store.roll_back("t/b", 9)  # rolled back versions are not copied
    store.install("t/c", 3, False, VectorClock({0: 1}), 0, 10)
    return FollowerState(
        shard=0, slot=12, epoch=1, fvw_applied=0, promised=Ballot(2, "127.0.0.2:7100"),
        vw=VC, epochs=sample_epochs(),
        cluster_map=ClusterMap(1, ["b", "x"], [["a", "c"], ["y", "z"]], {0: {0: 5, 1: 2}}),
        chains=version_chains(store),
        speculative={1: [(8, VectorClock({0: 6}), ["t/a"])]},
        held_visibility=[(1, 6, VC)],
        recent={10: BATCH, 11: INF},
        applied_slots=12, applied_records=30,
    )


def test_a_state_round_trips() -> None:
    state = sample_state()
    decoded = decode_state(encode_state(state))
    assert decoded == state
    assert [key for key, _ in decoded.chains] == ["t/a", "t/b", "t/c"]
    assert len(dict(decoded.chains)["t/a"]) == 2
    assert dict(decoded.chains)["t/b"] == []  # its only version was rolled back


def test_a_state_without_a_map_or_fvw_round_trips() -> None:
    state = sample_state()
    state.cluster_map = None
    state.fvw_applied = -1
    state.epochs = StreamEpochs()
    assert decode_state(encode_state(state)) == state


@given(st.binary(max_size=200))
def test_garbage_is_an_invalid_request(data: bytes) -> None:
    with contextlib.suppress(InvalidRequest):
        decode_state(data)


@given(st.lists(st.integers(min_value=1, max_value=200), max_size=40))
def test_a_state_decoded_piece_by_piece_is_the_state(cuts: list[int]) -> None:
    """The rejoiner decodes pieces as they come: however the bytes are cut, the result is
    the state."""
    state = sample_state()
    data = encode_state(state)
    decoder = StateDecoder()
    at = 0
    for cut in cuts:
        decoder.feed(data[at : at + cut])
        at += cut
    decoder.feed(data[at:])
    assert decoder.finish() == state


def test_trailing_bytes_or_a_wrong_tag_are_invalid() -> None:
    data = encode_state(sample_state())
    with pytest.raises(InvalidRequest, match="trailing"):
        decode_state(data + b"\x01")
    with pytest.raises(InvalidRequest, match="tag"):
        decode_state(data[:3] + b"\x02" + data[4:])  # after the 17-field array16 header


def test_a_truncated_state_is_an_invalid_request() -> None:
    data = encode_state(sample_state())
    for cut in (1, len(data) // 2, len(data) - 1):
        with pytest.raises(InvalidRequest):
            decode_state(data[:cut])


def test_a_source_serves_one_fixed_state_in_pieces() -> None:
    server = StateServer(0, piece_bytes=64, idle_ns=1000)
    captured = []

    def capture() -> FollowerState:
        state = sample_state()
        state.slot += len(captured)  # a later capture would differ
        captured.append(state)
        return state

    data = b""
    while True:
        piece = server.serve(StateRequest("r", 1, 0, len(data), 1000), capture, 0)
        assert piece.total > 0 and piece.offset == len(data) and len(piece.data) <= 64
        data += piece.data
        if not piece.more:
            assert len(data) == piece.total
            break
    assert len(captured) == 1  # the state was taken once, when the first piece was asked
    assert decode_state(data) == captured[0]
    # A piece of a transfer the source does not know, or from a source with no state, or
    # for another shard: refused (total 0), never a piece of something else.
    assert server.serve(StateRequest("r", 2, 64, 64, 64), capture, 0).total == 0
    assert server.serve(StateRequest("s", 1, 0, 64, 64), None, 0).total == 0
    assert server.serve(StateRequest("s", 3, 0, 1, 64), capture, 0).total == 0


def test_a_store_that_changes_while_it_is_sent_gives_the_state_it_had_when_taken() -> None:
    """The source encodes its store piece by piece as the rejoiner asks (it never stops to
    copy it all); what happens meanwhile does not leak into the copy: later versions are
    left out (the rejoiner replays them), a later rollback leaves its version out (the
    rejoiner's own FVW would roll it back), and garbage collection waits for the copy."""
    store = VersionedStore()
    for n in range(600):
        store.install(f"t/{n:04}", n, False, VectorClock({0: n + 1}), 0, n + 1)
    store.install("t/0599", "newer", False, VectorClock({0: 700}), 0, 700)
    expected = dict(version_chains(store))
    state = sample_state()
    state.chains = StoreSnapshot(store)
    server = StateServer(0, piece_bytes=512, idle_ns=1000)
    data = b""
    for step in range(10_000):
        piece = server.serve(StateRequest("r", 1, 0, len(data), 512), lambda: state, step)
        data += piece.data
        if not piece.more:
            break
        assert server.holding(step)  # the store must keep its garbage meanwhile
        # Keys the copy has not reached yet (it goes in key order) change.
        store.install(f"t/{599 - step:04}", "later", False, VectorClock({0: 1000 + step}), 0, 9000)
        store.install(f"u/{step:04}", "new key", False, VectorClock({0: 1000 + step}), 0, 9000)
        if step == 1:
            store.roll_back("t/0590", 591)
            expected["t/0590"] = []
    assert step > 10  # it took many pieces
    assert not server.holding(step)  # encoded: the store may collect again
    assert dict(decode_state(data).chains) == expected
    # The rejoiner puts the versions straight into its store as the pieces come.
    copy = VersionedStore()
    decoder = StateDecoder(into=copy)
    for at in range(0, len(data), 512):
        decoder.feed(data[at : at + 512])
    assert decoder.finish().chains == []
    assert dict(version_chains(copy)) == {key: chain for key, chain in expected.items() if chain}


def test_a_piece_that_ends_where_the_encoding_has_got_to_says_more_follows() -> None:
    """The source encodes as far as each piece needs: a piece may end exactly at the bytes
    encoded so far (its ``total``) while more are still to come; ``more`` says so, and the
    rejoiner asks again rather than take a prefix for the state."""
    store = VersionedStore()
    for n in range(100):  # several steps of encoding
        store.install(f"t/{n:04}", n, False, VectorClock({0: n + 1}), 0, n + 1)
    state = sample_state()
    state.chains = version_chains(store)
    first_step = len(next(encode_state_steps(state)))
    assert first_step < len(encode_state(state))
    server = StateServer(0, piece_bytes=first_step, idle_ns=1000)
    piece = server.serve(StateRequest("r", 1, 0, 0, first_step), lambda: state, 0)
    assert len(piece.data) == piece.total == first_step
    assert piece.more
    data = piece.data
    while piece.more:
        piece = server.serve(StateRequest("r", 1, 0, len(data), first_step), lambda: state, 0)
        data += piece.data
    assert decode_state(data) == state


def test_a_transfer_nobody_asks_for_stops_holding_the_store() -> None:
    state = sample_state()
    store = VersionedStore()
    for n in range(600):
        store.install(f"t/{n:04}", n, False, VectorClock({0: n + 1}), 0, n + 1)
    state.chains = StoreSnapshot(store)
    server = StateServer(0, piece_bytes=512, idle_ns=1000)
    assert server.serve(StateRequest("r", 1, 0, 0, 512), lambda: state, 0).more
    assert server.holding(999)
    assert not server.holding(1001)  # the rejoiner gave up (or died): forgotten
    assert server.serve(StateRequest("r", 1, 512, 512, 512), lambda: state, 1002).total == 0


def test_a_restarted_acceptor_answers_no_older_leader_and_no_prepare_until_voting() -> None:
    current = Ballot(2, "leader")
    acceptor = Acceptor(0, restarted_round=2, leader="leader", promised=current)
    # An older leader (or one of the same round) gets no answer at all: a Reject would be
    # an answer too, and a promise it forgot might have been to that leader.
    for ballot in (Ballot(1, "old"), Ballot(2, "other")):
        acceptor.handle(0, "old", Accept(0, ballot, 3, BATCH, 0))
        acceptor.handle(0, "old", Prepare(0, ballot, 0))
    assert acceptor.ready().messages == [] and acceptor.silenced == 4
    # The current leader's proposals are accepted.
    acceptor.handle(0, "leader", Accept(0, current, 3, BATCH, 0))
    assert [type(m) for _, m in acceptor.ready().messages] == [Accepted]
    # Not voting yet: a later leader's Prepare is not answered either.
    later = Ballot(3, "next")
    acceptor.handle(0, "next", Prepare(0, later, 0))
    assert acceptor.ready().messages == []
    # What its learner knows chosen is reported, at the top of round R, once it votes.
    acceptor.learned(1, INF)
    acceptor.voting = True
    acceptor.handle(0, "next", Prepare(0, later, 0))
    [(_, promise)] = acceptor.ready().messages
    assert isinstance(promise, Promise)
    reported = {slot: (ballot, entry) for slot, ballot, entry in promise.accepted}
    assert reported[1][1] == INF and reported[1][0].round == 2 and reported[1][0] > current
    assert reported[3] == (current, BATCH)


def test_an_acceptor_holds_what_its_learner_delivered_and_logs_only_what_is_new() -> None:
    """A follower's acceptor holds the chosen value of every slot its learner delivered (a
    restarted follower rebuilds its recent entries from its log so): a vote for the chosen
    value is left alone and logs nothing; a slot it never voted in gets the chosen value
    below every real ballot; a vote that lost keeps its ballot and takes the chosen value;
    a forgotten slot is not brought back."""
    acceptor = Acceptor(0)
    assert acceptor.voting
    first = Ballot(1, "old")
    acceptor.handle(0, "old", Accept(0, first, 2, BATCH, 0))
    acceptor.handle(0, "old", Accept(0, first, 3, BATCH, 0))
    acceptor.take_persist()
    acceptor.learned(2, BATCH)  # it voted for what was chosen
    assert acceptor.take_persist() == []
    acceptor.learned(1, INF)  # never voted in slot 1
    ballot, entry = acceptor.accepted(1)  # type: ignore[misc]
    assert entry == INF and ballot < first and ballot.round == 0
    acceptor.learned(3, INF)  # its vote in slot 3 lost
    assert acceptor.accepted(3) == (first, INF)
    logged = acceptor.take_persist()
    assert [(r.slot, r.entry) for r in logged] == [(1, INF), (3, INF)]  # type: ignore[union-attr]
    assert Acceptor.recover(0, [Accept(0, first, 2, BATCH, 0), Accept(0, first, 3, BATCH, 0),
                                *logged]).accepted(3) == (first, INF)
    assert acceptor.promised == first  # learning promises nothing
    acceptor.forget_before(2)
    acceptor.learned(1, INF)
    assert acceptor.accepted(1) is None and acceptor.take_persist() == []


def test_a_copy_given_up_half_way_leaves_nothing_in_the_rejoiners_store() -> None:
    """The rejoiner puts versions into its store as pieces come; when a copy stalls and it
    asks the next source, what the first copy had put there goes: the store ends up holding
    exactly the state it installed."""
    from store.core.follower import ShardFollower
    from store.core.settings import DEFAULT_SETTINGS
    from store.protocol.messages import ConfigReply

    settings = DEFAULT_SETTINGS.with_overrides(transfer_piece_bytes=512)
    rejoiner = ShardFollower(0, "a", settings=settings, rejoining=True)
    # While it rejoins it answers no snapshot read and no state request (it has no state).
    assert rejoiner.ANSWERS == ()
    state = sample_state()  # its map: shard 0 led by "b", followers "a" and "c"
    assert state.cluster_map is not None
    rejoiner.handle(0, "cm", ConfigReply(0, state.cluster_map, "cm"))

    def asked() -> StateRequest:
        ((_, request),) = rejoiner.ready().messages
        assert isinstance(request, StateRequest)
        return request

    # The first source, "c", sends one piece of a state with 100 keys, then nothing.
    stalled = sample_state()
    big = VersionedStore()
    for n in range(100):
        big.install(f"u/{n:04}", n, False, VectorClock({0: n + 1}), 0, n + 1)
    stalled.chains = version_chains(big)
    first = asked()
    piece = StateServer(0, 512, 1000).serve(first, lambda: stalled, 0)
    assert piece.more
    rejoiner.handle(0, "c", piece)
    assert rejoiner.store.key_count() > 0  # decoded as it came
    asked()  # the next piece, never answered
    rejoiner.tick(settings.transfer_retry_ns + 1)  # so it asks the leader, "b"
    request, server = asked(), StateServer(0, 512, 1000)
    while True:
        piece = server.serve(request, lambda: state, 0)
        rejoiner.handle(0, "b", piece)
        if not piece.more:
            break
        request = asked()
    assert not rejoiner.rejoining
    assert dict(version_chains(rejoiner.store)) == {k: c for k, c in state.chains if c}
    # Rejoined, it answers both again (what the host asks before it hands one over).
    assert isinstance(SnapshotRead(1, ["k"], []), rejoiner.ANSWERS)
    assert isinstance(StateRequest("r", 1, 0, 0, 512), rejoiner.ANSWERS)


def test_a_followers_state_leaves_out_versions_no_read_can_reach() -> None:
    """Reads at a follower are at its vector watermark or a later one: a version older than
    a key's newest one at or below the watermark is never read again, and its state (for a
    rejoiner, or its own snapshot on disk) leaves it out; versions above the watermark (not
    yet visible, perhaps rolled back later) stay."""
    from store.core.follower import ShardFollower

    follower = ShardFollower(0, "a")
    store = follower.store
    for counter in (1, 2, 3, 4):
        store.install("t/a", counter, False, VectorClock({0: counter}), 0, counter)
    store.install("t/b", "only", False, VectorClock({0: 9}), 0, 9)
    follower.vw = VectorClock({0: 2})
    chains = dict(list(follower.capture_state().chains))
    assert [value for value, *_ in chains["t/a"]] == [2, 3, 4]
    assert [value for value, *_ in chains["t/b"]] == ["only"]  # none visible: all kept
    assert [value for value, *_ in dict(version_chains(store))["t/a"]] == [1, 2, 3, 4]
